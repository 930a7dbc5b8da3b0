//! `atasira decide`: the decision before a tool call (R-DECIDE-1), in the shape agent
//! CLIs' pre-tool-use hooks accept: `{tool, input}` (or `{tool_name, tool_input}`) JSON on
//! stdin; the decision as JSON on stdout; exit 0 when allowed, 2 otherwise with the reason
//! on stderr. Inside a Worker it asks the execution host (ATASIRA_DECIDE_URL with the
//! Worker's ATASIRA_WORKER_TOKEN), which records denials; offline it judges against a
//! manifest file (`--manifest`). Any failure to decide is a denial: a tool call never
//! proceeds because the answer could not be had.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use atasira_domain::decide::{Decision, ToolCall, Verdict};

/// The largest call read from stdin.
const CALL_BYTES: u64 = 1024 * 1024;

/// Where the decision comes from.
#[derive(Debug)]
pub enum Source {
    /// A manifest file and a workspace (offline).
    Manifest { file: PathBuf, workspace: Option<PathBuf> },
    /// The execution host running this Worker.
    Host { url: String, token: String },
}

pub fn run(source: Option<Source>, timeout: Duration) -> ExitCode {
    match decision(source, timeout) {
        Ok(d) => {
            println!("{}", serde_json::to_string(&d).unwrap_or_default());
            if d.decision == Verdict::Allow {
                ExitCode::SUCCESS
            } else {
                let how = if d.decision == Verdict::Ask { "waits for a human admin under" } else { "is denied by" };
                eprintln!("atasira: the tool call {how} {}: {}", d.rule, d.reason);
                ExitCode::from(2)
            }
        }
        Err(why) => {
            eprintln!("atasira: the tool call is denied: {why}");
            ExitCode::from(2)
        }
    }
}

fn decision(source: Option<Source>, timeout: Duration) -> Result<Decision, String> {
    let source = source.ok_or("no decision source: outside a Worker, pass --manifest FILE")?;
    let mut body = Vec::new();
    std::io::stdin().take(CALL_BYTES + 1).read_to_end(&mut body).map_err(|e| format!("cannot read the call on standard input: {e}"))?;
    if body.len() as u64 > CALL_BYTES {
        return Err(format!("the call is larger than {CALL_BYTES} bytes"));
    }
    let call: ToolCall = serde_json::from_slice(&body).map_err(|e| format!("the call is not {{\"tool\": ..., \"input\": {{...}}}} JSON: {e}"))?;
    match source {
        Source::Manifest { file, workspace } => offline(&file, workspace.as_deref(), &call),
        Source::Host { url, token } => {
            let agent = ureq::AgentBuilder::new().timeout(timeout).build();
            let answer = agent.post(&url).set("Authorization", &format!("Bearer {token}")).send_json(serde_json::to_value(&call).unwrap_or_default());
            match answer {
                Ok(response) => response.into_json::<Decision>().map_err(|e| format!("the execution host's answer does not read: {e}")),
                Err(ureq::Error::Status(status, response)) => {
                    let text = response.into_string().unwrap_or_default();
                    Err(format!("the execution host refused ({status}): {}", text.chars().take(300).collect::<String>()))
                }
                Err(e) => Err(format!("the execution host did not answer: {e}")),
            }
        }
    }
}

fn offline(file: &Path, workspace: Option<&Path>, call: &ToolCall) -> Result<Decision, String> {
    let text = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let loaded = atasira_domain::BoxManifest::from_yaml_bytes(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let workspace = match workspace {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|e| format!("cannot tell the current directory: {e}"))?,
    };
    let workspace = std::fs::canonicalize(&workspace).map_err(|e| format!("cannot resolve the workspace {}: {e}", workspace.display()))?;
    let manifest = loaded.manifest.effective();
    let tool_scope = manifest.effective_tools();
    let grant = atasira_host::Grant { manifest, workspace: workspace.to_string_lossy().into_owned(), tool_scope };
    Ok(grant.decide(call))
}

/// `atasira notify`: a Worker's notification (R-NOTIFY-1). Reads `{"channel": "email" |
/// "line", "to": [...], "broadcast": false, "subject", "body"}` JSON on stdin and hands it
/// to the execution host, which decides it like a tool call (the Box's `notify.<channel>`
/// and its recipients) and has the audit service deliver it. Prints the host's answer;
/// exits 0 when it is accepted for delivery, 2 when it is denied (the reason on stderr), 1
/// when it could not be handed over.
pub fn notify(url: Option<String>, token: Option<String>, timeout: Duration) -> ExitCode {
    let (Some(url), Some(token)) = (url, token) else {
        eprintln!("atasira: notifications are sent from inside a Worker (ATASIRA_DECIDE_URL and ATASIRA_WORKER_TOKEN are not set)");
        return ExitCode::FAILURE;
    };
    let mut body = Vec::new();
    if let Err(e) = std::io::stdin().take(CALL_BYTES + 1).read_to_end(&mut body) {
        eprintln!("atasira: cannot read the notification on standard input: {e}");
        return ExitCode::FAILURE;
    }
    let Ok(notification) = serde_json::from_slice::<serde_json::Value>(&body) else {
        eprintln!(
            "atasira: the notification is not JSON such as {{\"channel\": \"email\", \"to\": [\"ops@example.com\"], \"subject\": \"...\", \"body\": \"...\"}}"
        );
        return ExitCode::FAILURE;
    };
    // The host serves notifications beside decisions.
    let url = url.strip_suffix("/v1/decide").map_or(url.clone(), |base| format!("{base}/v1/notify"));
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    match agent.post(&url).set("Authorization", &format!("Bearer {token}")).send_json(notification) {
        Ok(response) => {
            println!("{}", response.into_string().unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(ureq::Error::Status(403, response)) => {
            let answer: serde_json::Value = response.into_json().unwrap_or_default();
            println!("{answer}");
            eprintln!("atasira: the notification is denied by {}: {}", answer["rule"].as_str().unwrap_or("?"), answer["reason"].as_str().unwrap_or("?"));
            ExitCode::from(2)
        }
        Err(ureq::Error::Status(status, response)) => {
            let text = response.into_string().unwrap_or_default();
            eprintln!("atasira: the execution host refused the notification ({status}): {}", text.chars().take(300).collect::<String>());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("atasira: the execution host did not answer: {e}");
            ExitCode::FAILURE
        }
    }
}
