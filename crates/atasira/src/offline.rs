//! Offline verbs: read a file or body, call the pure domain, print JSON or XML.
//!
//! Exit codes: 0 answered (valid), 1 answered (invalid manifest), 2 could not answer
//! (unreadable, too large, not YAML/JSON) with the reason on stderr.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::manifest::{LoadError, Loaded, MAX_MANIFEST_BYTES};
use atasira_domain::{BoxManifest, feasibility};
use serde_json::{Value, json};

/// Reads at most `MAX_MANIFEST_BYTES + 1` bytes, so that a huge (or endless) input is
/// refused without being read whole.
fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let limit = MAX_MANIFEST_BYTES as u64 + 1;
    let mut buf = Vec::new();
    if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_end(&mut buf).map_err(|e| format!("cannot read standard input: {e}"))?;
    } else {
        let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(format!("cannot read {}: it is a directory", path.display()));
        }
        file.take(limit).read_to_end(&mut buf).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    }
    if buf.len() > MAX_MANIFEST_BYTES {
        return Err(format!("{} is larger than the {MAX_MANIFEST_BYTES}-byte limit; refused before parsing", path.display()));
    }
    Ok(buf)
}

fn print_json(value: &Value) {
    // A Value always serializes.
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

/// Loads a manifest; `Ok(Err(report))` is a manifest that parsed but is invalid.
fn load(path: &Path) -> Result<Result<Loaded, Value>, String> {
    let bytes = read_limited(path)?;
    match BoxManifest::from_yaml_bytes(&bytes) {
        Ok(loaded) => Ok(Ok(loaded)),
        Err(LoadError::Invalid(report)) => Ok(Err(json!({"errors": report.errors, "warnings": report.warnings}))),
        Err(other) => Err(format!("{}: {other}", path.display())),
    }
}

pub fn validate(path: &Path) -> Result<ExitCode, String> {
    match load(path)? {
        Ok(loaded) => {
            print_json(&json!({"manifest": loaded.manifest.effective(), "warnings": loaded.warnings}));
            Ok(ExitCode::SUCCESS)
        }
        Err(report) => {
            print_json(&report);
            Ok(ExitCode::from(1))
        }
    }
}

/// Commands that need a valid manifest print the validation report and exit 1 otherwise.
fn with_valid(path: &Path, f: impl FnOnce(&BoxManifest)) -> Result<ExitCode, String> {
    match load(path)? {
        Ok(loaded) => {
            f(&loaded.manifest);
            Ok(ExitCode::SUCCESS)
        }
        Err(report) => {
            print_json(&report);
            Ok(ExitCode::from(1))
        }
    }
}

pub fn context(path: &Path) -> Result<ExitCode, String> {
    with_valid(path, |m| println!("{}", m.to_agent_context_xml()))
}

pub fn feasibility(path: &Path, task: &str) -> Result<ExitCode, String> {
    with_valid(path, |m| print_json(&serde_json::to_value(feasibility::assess(m, task)).unwrap_or_default()))
}

/// The answer `POST /api/v1/boxes/box-drafts` would give (status and body), or an error
/// when the body cannot be read or is not JSON.
pub fn preview_answer(body: &[u8]) -> Result<(u16, Value), String> {
    let request = match BoxDraftCreateRequest::from_json_bytes(body) {
        Ok(r) => r,
        Err(e) if e.code().http_status() == 400 => return Err(e.to_string()),
        Err(e) => return Ok(error_answer(&e)),
    };
    match request.plan() {
        Ok(plan) => Ok((
            201,
            json!({
                "box_type": plan.manifest.box_type,
                "status": "pending_approval",
                "over_limit": plan.over_limit.over_limit,
                "over_limit_ops": plan.over_limit.over_limit_ops,
                "over_limit_tools": plan.over_limit.over_limit_tools,
                "warnings": plan.warnings,
                "manifest": plan.manifest,
            }),
        )),
        Err(e) => Ok(error_answer(&e)),
    }
}

fn error_answer(e: &atasira_domain::draft_request::DraftRequestError) -> (u16, Value) {
    let mut body = json!({"error": e.code().as_str(), "message": e.to_string()});
    let field_errors = atasira_domain::Refusing::field_errors(e);
    if !field_errors.is_empty()
        && let Some(obj) = body.as_object_mut()
    {
        obj.insert("details".into(), json!(field_errors));
    }
    (e.code().http_status(), body)
}

pub fn preview(arg: &str) -> Result<ExitCode, String> {
    let body = if arg == "-" { read_limited(Path::new("-"))? } else { arg.as_bytes().to_vec() };
    let (status, body) = preview_answer(&body)?;
    print_json(&json!({"status": status, "body": body}));
    Ok(ExitCode::SUCCESS)
}
