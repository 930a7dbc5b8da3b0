//! The offline CLI as a user runs it: the real binary, real files, exit codes and output.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn atasira(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_atasira")).args(args).output().expect("the binary runs")
}

fn atasira_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_atasira"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    child.stdin.take().expect("stdin").write_all(input).expect("writes");
    child.wait_with_output().expect("finishes")
}

/// A file under the target dir's temp area, unique per test.
fn file(name: &str, content: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, content).expect("writes");
    path
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn example() -> String {
    format!("{}/../../examples/sales-report.yaml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn validate_a_valid_manifest_prints_the_effective_manifest_and_exits_0() {
    // R-MAN-2, R-MAN-3
    let out = atasira(&["manifest", "validate", &example()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    assert_eq!(v["manifest"]["box_type"], "sales-report");
    assert_eq!(v["manifest"]["tools"], serde_json::json!(["Read", "file:read", "notify:email"]));
    assert_eq!(v["manifest"]["loop_control"]["max_iterations"], 30);
    assert!(v["warnings"].is_array());
}

#[test]
fn validate_an_invalid_manifest_lists_errors_by_key_and_exits_1() {
    // R-MAN-1, R-MAN-5, R-MAN-7
    let path = file(
        "invalid.yaml",
        b"box_type: sales\npurpose: p\nnetwork: internet\ntrigger_type: schedule\ntrigger_schedule: soon\nnotify: {email: {vault: ops}}\nllm: {model: x}\n",
    );
    let out = atasira(&["manifest", "validate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    let keys: Vec<&str> = v["errors"].as_array().expect("errors").iter().map(|e| e["key"].as_str().expect("key")).collect();
    assert_eq!(keys, vec!["network", "trigger_schedule", "notify.email.vault"]);
    assert!(v["warnings"].as_array().expect("warnings").iter().any(|w| w.as_str().is_some_and(|w| w.contains("llm.model"))));
}

#[test]
fn validate_an_empty_file_names_the_required_keys() {
    // SPEC §8: box_type and purpose are required
    let path = file("empty.yaml", b"");
    let out = atasira(&["manifest", "validate", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["errors"].as_array().map(Vec::len), Some(2));
}

#[test]
fn hostile_files_exit_2_with_a_message_and_never_panic() {
    // SPEC §8: 1 MiB limit before parsing; bad input never panics or hangs
    let mut fifty_mb = Vec::with_capacity(50 * 1024 * 1024);
    fifty_mb.extend(b"box_type: big\npurpose: p\ndescription: ");
    fifty_mb.resize(50 * 1024 * 1024, b'x');
    let deep = format!("box_type: deep\npurpose: p\nconfig_defaults:\n  x: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let deep_block = format!("box_type: deep\npurpose: p\nconfig_defaults:\n  x: {}x\n", "- ".repeat(10_000));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("binary.bin", (0..=255u8).cycle().take(4096).collect(), "UTF-8"),
        ("latin1.yaml", b"box_type: caf\xe9\npurpose: p\n".to_vec(), "UTF-8"),
        ("deep-flow.yaml", deep.into_bytes(), "YAML"),
        ("deep-block.yaml", deep_block.into_bytes(), "YAML"),
        ("huge.yaml", fifty_mb, "limit"),
        ("list.yaml", b"- a\n- b\n".to_vec(), "mapping"),
        ("broken.yaml", b"box_type: [unclosed\n".to_vec(), "YAML"),
    ];
    for (name, content, needle) in cases {
        let path = file(name, &content);
        let out = atasira(&["manifest", "validate", path.to_str().expect("utf-8 path")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(needle), "{name}: stderr {stderr:?} should mention {needle}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
    }
    let missing = atasira(&["manifest", "validate", "/nonexistent/manifest.yaml"]);
    assert_eq!(missing.status.code(), Some(2));
    let dir = atasira(&["manifest", "validate", env!("CARGO_TARGET_TMPDIR")]);
    assert_eq!(dir.status.code(), Some(2));
}

#[test]
fn validate_reads_standard_input_with_a_dash() {
    // R-CLI-1
    let out = atasira_stdin(&["manifest", "validate", "-"], b"box_type: from-stdin\npurpose: p\n");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["manifest"]["box_type"], "from-stdin");
}

#[test]
fn context_prints_the_agent_context_xml_without_config_defaults() {
    // R-MAN-6
    let out = atasira(&["manifest", "context", &example()]);
    assert_eq!(out.status.code(), Some(0));
    let xml = String::from_utf8(out.stdout).expect("utf-8");
    assert!(xml.starts_with("<box_context box_type=\"sales-report\" version=\"1.0.0\">"), "{xml}");
    assert!(xml.contains("<tool>notify:email</tool>"));
    assert!(xml.contains("flag totals above 1000000"), "placeholders are substituted: {xml}");
    assert!(!xml.contains("alert_threshold:"), "config_defaults are not dumped");
}

#[test]
fn feasibility_answers_the_seven_keys() {
    // R-FEAS-1
    let out = atasira(&["manifest", "feasibility", &example(), "run a shell script every day"]);
    assert_eq!(out.status.code(), Some(0));
    let v = json(&out);
    let mut keys: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, vec!["available_operations", "available_tools", "feasible", "missing_capabilities", "notes", "required_approvals", "summary"]);
    assert_eq!(v["feasible"], false);
    assert!(v["missing_capabilities"].as_array().expect("list").iter().any(|c| c == "shell:exec"));
}

fn preview(body: &str) -> Value {
    let out = atasira(&["drafts", "preview", "--json", body]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    json(&out)
}

#[test]
fn preview_answers_like_the_rest_endpoint() {
    // R-DRAFT-1, R-DRAFT-4, R-DRAFT-8, R-DRAFT-10, R-DRAFT-14
    let ok = preview(r#"{"box_type":"sales-report","purpose":"weekly","success_criteria":["on Monday"],"os_operations":["shell:exec"],"tools":["Read"]}"#);
    assert_eq!(ok["status"], 201);
    assert_eq!(ok["body"]["status"], "pending_approval");
    assert_eq!(ok["body"]["over_limit"], true);
    assert_eq!(ok["body"]["over_limit_ops"], serde_json::json!(["shell:exec"]));
    assert_eq!(ok["body"]["manifest"]["purpose"], "weekly\n\n## Success criteria\n- on Monday");

    let forbidden = preview(r#"{"box_type":"admin-ops","purpose":"p"}"#);
    assert_eq!((forbidden["status"].as_u64(), forbidden["body"]["error"].as_str()), (Some(403), Some("self_privilege_forbidden")));

    let invalid = preview(r#"{"box_type":"kill","purpose":"p"}"#);
    assert_eq!((invalid["status"].as_u64(), invalid["body"]["error"].as_str()), (Some(422), Some("box_manifest_validation")));
    assert_eq!(invalid["body"]["details"][0]["key"], "box_type");

    let unknown = preview(r#"{"box_type":"a","purpose":"p","state":"active"}"#);
    assert_eq!((unknown["status"].as_u64(), unknown["body"]["error"].as_str()), (Some(422), Some("invalid_request")));
}

#[test]
fn preview_of_something_that_is_not_json_exits_2() {
    // R-CLI-1: exit 2 with a message when BODY is not JSON
    let out = atasira(&["drafts", "preview", "--json", "{box_type: nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("JSON"));
    let piped = atasira_stdin(&["drafts", "preview", "--json", "-"], br#"{"box_type":"a","purpose":"p"}"#);
    assert_eq!(json(&piped)["status"], 201);
}

/// `atasira <path> --help`, asserting it succeeds; the help text.
fn help(path: &[&str]) -> String {
    help_with_env(path, &[])
}

fn help_with_env(path: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_atasira"));
    command.args(path).arg("--help").envs(env.iter().copied());
    let out = command.output().expect("the binary runs");
    assert_eq!(out.status.code(), Some(0), "atasira {} --help: {}", path.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with(' '))
        .filter_map(|line| {
            // Entries are indented by two spaces; wrapped descriptions by more.
            let entry = line.strip_prefix("  ").filter(|rest| !rest.starts_with(' '))?;
            entry.split_whitespace().next().map(str::to_owned)
        })
        .filter(|name| name != "help")
        .collect()
}

/// Every command path: `[]`, `["dev"]`, `["manifest"]`, `["manifest", "validate"]`, ...
fn every_command() -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut queue = vec![Vec::<String>::new()];
    while let Some(path) = queue.pop() {
        let text = help(&path.iter().map(String::as_str).collect::<Vec<_>>());
        for sub in subcommands(&text) {
            let mut child = path.clone();
            child.push(sub);
            queue.push(child);
        }
        found.push(path);
    }
    found.sort();
    found
}

/// The option entries of a help text: each starts at a line whose first non-blank
/// character is `-` and runs until the next entry or section.
fn options(help: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    let mut in_entry = false;
    for line in help.lines() {
        if line.trim_start().starts_with('-') {
            entries.push(line.trim().to_owned());
            in_entry = true;
        } else if !line.starts_with(' ') && !line.is_empty() {
            // A section heading ("Options:", "Testing:") or the usage line.
            in_entry = false;
        } else if in_entry && let Some(entry) = entries.last_mut() {
            entry.push(' ');
            entry.push_str(line.trim());
        }
    }
    entries
}

#[test]
fn every_command_answers_help_in_words_users_know() {
    // R-CLI-1: help on every command; user-facing text names no spec ids
    let commands = every_command();
    for expected in [
        &["dev"][..],
        &["serve"],
        &["tokens", "create"],
        &["projections", "rebuild"],
        &["audit", "verify"],
        &["keys", "rotate"],
        &["bench", "drafts"],
        &["bench", "rebuild"],
        &["bench", "idle"],
        &["drafts", "preview"],
    ] {
        assert!(commands.iter().any(|c| c == expected), "`atasira {} --help` was not reached; found {commands:?}", expected.join(" "));
    }
    for command in &commands {
        let text = help(&command.iter().map(String::as_str).collect::<Vec<_>>());
        let spec_id = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).find(|word| {
            let mut parts = word.split('-');
            parts.next() == Some("R")
                && parts.next().is_some_and(|area| !area.is_empty() && area.chars().all(|c| c.is_ascii_uppercase()))
                && parts.next().is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        });
        assert_eq!(spec_id, None, "`atasira {} --help` cites a spec id:\n{text}", command.join(" "));
    }
}

#[test]
fn every_setting_of_dev_and_serve_shows_its_environment_variable() {
    // R-CLI-1: one configuration per process, each setting a flag or an ATASIRA_* variable
    for command in ["dev", "serve"] {
        let text = help(&[command]);
        let valued: Vec<String> = options(&text).into_iter().filter(|entry| entry.split_whitespace().take(3).any(|word| word.starts_with('<'))).collect();
        assert!(valued.len() >= 5, "`atasira {command} --help` lists too few settings: {valued:#?}\n{text}");
        for entry in &valued {
            assert!(entry.contains("[env: ATASIRA_"), "`atasira {command} --help`: a setting without its variable: {entry}");
        }
    }
    let serve = help(&["serve"]);
    // The test hooks are settings of test builds only.
    let hooks: &[&str] = if cfg!(feature = "failpoints") { &["ATASIRA_FAILPOINT", "ATASIRA_FAILPOINT_DELAY"] } else { &[] };
    for variable in ["ATASIRA_PROVISION_BACKOFF_MS", "ATASIRA_BINDING_TTL", "ATASIRA_REQUEST_TIMEOUT", "ATASIRA_APPROVAL_KEY", "ATASIRA_DATABASE_URL_FILE"]
        .iter()
        .chain(hooks)
    {
        assert!(serve.contains(&format!("[env: {variable}")), "`atasira serve --help` does not show {variable}");
    }
}

#[test]
fn help_never_prints_a_secret_from_the_environment() {
    let secret = "s3cr3t-value-from-the-environment";
    let url = format!("postgres://atasira:{secret}@db/atasira");
    let nats = format!("nats://atasira:{secret}@nats:4222");
    let env = [("ATASIRA_APPROVAL_KEY", secret), ("ATASIRA_AUDIT_KEY", secret), ("ATASIRA_DATABASE_URL", url.as_str()), ("ATASIRA_NATS_URL", nats.as_str())];
    for command in [
        &["serve"][..],
        &["dev"],
        &["audit", "verify"],
        &["keys", "rotate"],
        &["tokens", "create"],
        &["bench", "drafts"],
        &["bench", "rebuild"],
        &["bench", "idle"],
        &["projections", "rebuild"],
    ] {
        let text = help_with_env(command, &env);
        assert!(!text.contains(secret), "`atasira {} --help` prints a secret:\n{text}", command.join(" "));
    }
}

#[cfg(feature = "failpoints")]
#[test]
fn failpoint_settings_are_checked_before_anything_starts() {
    // In a test build, a malformed test hook is a usage error (exit 2), not a silently
    // ignored setting.
    let out = Command::new(env!("CARGO_BIN_EXE_atasira"))
        .args(["dev", "--data-dir", "/nonexistent/atasira"])
        .env("ATASIRA_FAILPOINT_DELAY", "activation:soon")
        .output()
        .expect("the binary runs");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ATASIRA_FAILPOINT_DELAY") || String::from_utf8_lossy(&out.stderr).contains("--failpoint-delay"));
}

#[cfg(not(feature = "failpoints"))]
#[test]
fn a_build_for_use_ignores_failpoint_settings_and_says_so() {
    // The settings are neither in --help nor a reason to refuse to start...
    for command in [&["dev"][..], &["serve"]] {
        let text = help_with_env(command, &[]);
        assert!(!text.contains("failpoint") && !text.contains("FAILPOINT"), "`atasira {} --help` offers a test hook:\n{text}", command.join(" "));
    }
    // ...and each one set is named on stderr, then ignored: here the process goes on to
    // fail on its data dir (a path under a file), not on the malformed pause.
    let out = Command::new(env!("CARGO_BIN_EXE_atasira"))
        .args(["dev", "--data-dir", "/dev/null/atasira", "--listen", "127.0.0.1:0", "--failpoint", "drafts-after-commit"])
        .env("ATASIRA_FAILPOINT_DELAY", "activation:soon")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("NAME:MILLISECONDS"), "the pause was not even read: {stderr}");
    for setting in ["ATASIRA_FAILPOINT (--failpoint)", "ATASIRA_FAILPOINT_DELAY (--failpoint-delay)"] {
        assert!(stderr.contains(&format!("{setting} is set, but this build has no test hooks; ignored")), "{setting}: {stderr}");
    }
    assert!(stderr.contains("/dev/null/atasira"), "{stderr}");
}

#[test]
fn keys_rotate_prints_the_next_setting_alone_and_its_secrets_nowhere_else() {
    // given today's bare audit key in the environment
    let old = "b2".repeat(32);
    let out = Command::new(env!("CARGO_BIN_EXE_atasira")).args(["keys", "rotate", "--kind", "audit"]).env("ATASIRA_AUDIT_KEY", &old).output().expect("runs");
    // then stdout is one setting: a fresh current key, the present one retired under its id
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let (current, retired) = lines[0].split_once(',').expect("two keys");
    assert_eq!(retired, format!("audit-1:{old}"));
    let (id, new) = current.split_once(':').expect("ID:HEX");
    assert_eq!((id, new.len()), ("audit-2", 64));
    // and stderr says what to do, naming ids only
    assert!(stderr.contains("audit-2") && stderr.contains("ATASIRA_AUDIT_KEY"), "{stderr}");
    assert!(!stderr.contains(&old) && !stderr.contains(new), "a secret on stderr: {stderr}");

    // given no present setting; then a fresh one with the kind's first id (or --id)
    let out = Command::new(env!("CARGO_BIN_EXE_atasira"))
        .args(["keys", "rotate", "--kind", "approval", "--id", "2026-01"])
        .env_remove("ATASIRA_APPROVAL_KEY")
        .env_remove("ATASIRA_APPROVAL_KEY_FILE")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && stdout.starts_with("2026-01:") && !stdout.contains(','), "{stdout}");

    // given a malformed present setting; then a usage error that does not quote it
    let bad = format!("k1:{}", "zq".repeat(32));
    let out = Command::new(env!("CARGO_BIN_EXE_atasira")).args(["keys", "rotate", "--kind", "audit"]).env("ATASIRA_AUDIT_KEY", &bad).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not hex") && !stderr.contains("zq"), "{stderr}");
    assert!(out.stdout.is_empty());
}
