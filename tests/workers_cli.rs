//! `atasira workers create|show|list` (R-CLI-1, R-WORKER-1): the client verbs over REST
//! say what they take, and their exit codes tell a script what happened: 0 answered, 1
//! refused by the API (its JSON error on stdout with `--json`), 2 a usage error, 3 no
//! gateway to talk to.

use atasira_tests::harness::{Mode, System, atasira_bin, free_port};
use serde_json::Value;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(atasira_bin()).args(args).env_remove("ATASIRA_PAT").env_remove("ATASIRA_BFF_URL").output().expect("atasira runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn r_cli_1_workers_verbs_document_every_flag() {
    for (verb, flags) in [
        ("create", &["--box", "--launch-id", "--role", "--label", "--text", "--ticket", "--objective", "--url", "--token", "--json"][..]),
        ("show", &["--provenance", "--url", "--token", "--json"][..]),
        ("list", &["--box", "--limit", "--cursor", "--url", "--token", "--json"][..]),
    ] {
        let (code, out, err) = run(&["workers", verb, "--help"]);
        assert_eq!(code, 0, "{err}");
        for flag in flags {
            let line = out.lines().find(|l| l.trim_start().starts_with(flag)).unwrap_or_else(|| panic!("workers {verb} --help lacks {flag}:\n{out}"));
            assert!(line.split_once('>').map_or(line, |(_, help)| help).trim().len() > 3, "workers {verb} {flag} has no help: {line}");
        }
    }
    let (code, out, _) = run(&["workers", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Exit 0") && out.contains("3 when the gateway could not be reached"), "{out}");
}

#[test]
fn r_cli_1_workers_exit_codes_usage_unreachable_refused() {
    // usage: a required flag missing, no input, a label without '=', no token
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    for args in [
        vec!["workers", "create", "--box", "b"],
        vec!["workers", "create", "--box", "b", "--launch-id", "l", "--token", "pat", "--url", &nowhere],
        vec!["workers", "create", "--box", "b", "--launch-id", "l", "--text", "t", "--label", "team", "--token", "pat", "--url", &nowhere],
        vec!["workers", "show", "wkr_x", "--url", &nowhere],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    // unreachable: nothing listens at --url
    let (code, _, err) = run(&["workers", "list", "--box", "b", "--token", "pat", "--url", &nowhere]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot reach"), "{err}");

    // refused: the API answers with an error; --json prints it
    let sys = System::start(Mode::Embedded);
    let url = sys.url("");
    let (code, out, err) = run(&["workers", "show", "wkr_none", "--url", &url, "--token", &sys.admin, "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let body: Value = serde_json::from_str(&out).expect("the error as JSON");
    assert!(body["error"].is_string(), "{body}");
    let (code, _, err) = run(&["workers", "list", "--box", "b", "--url", &url, "--token", "atasira_pat_unknown"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401 unauthenticated"), "{err}");
}
