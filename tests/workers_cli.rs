//! `atasira workers create|show|list` (R-CLI-1, R-WORKER-1): the client verbs over REST
//! say what they take, and their exit codes tell a script what happened: 0 answered, 1
//! refused by the API (its JSON error on stdout with `--json`), 2 a usage error, 3 no
//! gateway to talk to; end to end against `atasira dev` and a cluster, --json parsed.

use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System, atasira_bin, free_port};
use serde_json::{Value, json};

fn run(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(atasira_bin())
        .args(args)
        .env_remove("ATASIRA_PAT")
        .env_remove("ATASIRA_BFF_URL")
        .output_within(SUBPROCESS_LIMIT)
        .expect("atasira runs");
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
fn r_cli_1_workers_exit_codes_usage_and_unreachable() {
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
}

#[test]
fn r_cli_1_workers_verbs_end_to_end_on_atasira_dev() {
    end_to_end(&System::start(Mode::Embedded));
}

#[test]
fn r_cli_1_workers_verbs_end_to_end_on_a_cluster() {
    end_to_end(&System::start(Mode::Cluster));
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// workers create, list and show (with --provenance) on an active Box, their refusals, the
/// same scenario in both modes.
fn end_to_end(sys: &System) {
    let url = sys.url("");
    let mode = sys.mode;
    let cli = |token: &str, args: &[&str]| run(&[args, &["--url", &url, "--token", token]].concat());
    let id = sys.draft(&json!({"box_type": "cli-workers", "purpose": "Review pull requests.", "os_operations": ["file:read"], "tools": ["Read"]}));
    let approved = sys.approve(&id, &sys.admin, false);
    assert_eq!(approved.status, 200, "{mode:?}: {}", approved.raw);
    let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();

    // create: the segments in the order given, role and labels; JSON for scripts
    let launch = ["workers", "create", "--box", &box_id, "--launch-id", "cli-1", "--ticket", "T-1", "--text", "review PR 7", "--objective", "O-7"];
    let (code, out, err) = cli(&sys.admin, &[&launch[..], &["--role", "reviewer", "--label", "team=ops", "--json"]].concat());
    assert_eq!(code, 0, "{mode:?}: {out}{err}");
    let worker = json_of(&out);
    let worker_id = worker["worker_id"].as_str().expect("worker_id").to_owned();
    assert_eq!((&worker["box_id"], &worker["launch_id"], &worker["role"]), (&json!(box_id), &json!("cli-1"), &json!("reviewer")), "{worker}");
    assert_eq!(worker["labels"], json!({"team": "ops"}));
    let kinds: Vec<&Value> = worker["transcript"][0]["segments"].as_array().expect("segments").iter().map(|s| &s["kind"]).collect();
    assert_eq!(kinds, [&json!("ticket_ref"), &json!("text"), &json!("objective_ref")], "{worker}");
    // the same launch again is the same Worker; the same launch_id with other input is refused
    let (code, out, err) = cli(&sys.admin, &[&launch[..], &["--role", "reviewer", "--label", "team=ops"]].concat());
    assert_eq!(code, 0, "{mode:?}: {err}");
    assert!(out.contains("launched before") && out.contains(&worker_id), "{out}");
    let (code, out, err) = cli(&sys.admin, &["workers", "create", "--box", &box_id, "--launch-id", "cli-1", "--text", "other", "--json"]);
    assert_eq!(code, 1, "{mode:?}: {out}{err}");
    assert_eq!(json_of(&out)["error"], "launch_id_conflict", "{out}");
    // an unassigned agent may not launch; an unknown Box is not active
    let (code, out, _) = cli(&sys.agent, &["workers", "create", "--box", &box_id, "--launch-id", "cli-agent", "--text", "hi", "--json"]);
    assert_eq!((code, json_of(&out)["error"].as_str()), (1, Some("forbidden")), "{out}");
    let (code, _, err) = cli(&sys.admin, &["workers", "create", "--box", "00000000-0000-4000-8000-000000000000", "--launch-id", "x", "--text", "x"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("box_not_active"), "{err}");
    let (code, _, err) = cli(&sys.admin, &["workers", "create", "--box", &box_id, "--launch-id", "cli-2", "--text", "second"]);
    assert_eq!(code, 0, "{err}");

    // list: oldest first, paged
    let (code, out, err) = cli(&sys.admin, &["workers", "list", "--box", &box_id, "--json"]);
    assert_eq!(code, 0, "{err}");
    let launches: Vec<Value> = json_of(&out)["workers"].as_array().expect("workers").iter().map(|w| w["launch_id"].clone()).collect();
    assert_eq!(launches, [json!("cli-1"), json!("cli-2")], "{out}");
    let (code, out, _) = cli(&sys.admin, &["workers", "list", "--box", &box_id, "--limit", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("WORKER_ID") && out.contains(&worker_id) && out.contains("next page: --cursor"), "{out}");
    let cursor = out.lines().find_map(|l| l.strip_prefix("next page: --cursor ")).expect("cursor").to_owned();
    let (code, out, _) = cli(&sys.admin, &["workers", "list", "--box", &box_id, "--limit", "1", "--cursor", &cursor, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(json_of(&out)["workers"][0]["launch_id"], "cli-2", "{out}");

    // show, and show --provenance: from the approval to the Worker
    let (code, out, err) = cli(&sys.admin, &["workers", "show", &worker_id, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["worker_id"], json!(worker_id));
    let (code, out, _) = cli(&sys.agent, &["workers", "show", &worker_id, "--json"]);
    assert_eq!(code, 1, "a user not assigned to the Box is refused: {out}");
    assert!(json_of(&out)["error"].is_string(), "{out}");
    let (code, out, _) = cli(&sys.admin, &["workers", "show", &worker_id]);
    assert_eq!(code, 0);
    assert!(out.contains("transcript:") && out.contains("ticket_ref") && out.contains("team=ops"), "{out}");
    let (code, out, err) = cli(&sys.admin, &["workers", "show", &worker_id, "--provenance", "--json"]);
    assert_eq!(code, 0, "{err}");
    let provenance = json_of(&out);
    assert_eq!(provenance["approval_verified"], true, "{provenance}");
    assert!(provenance["steps"].as_array().is_some_and(|s| s.len() >= 3), "{provenance}");
    let (code, out, _) = cli(&sys.admin, &["workers", "show", &worker_id, "--provenance"]);
    assert_eq!(code, 0);
    assert!(out.contains("verified now with public keys"), "{out}");

    // refused: the API answers with an error; --json prints it
    let (code, out, err) = run(&["workers", "show", "wkr_none", "--url", &url, "--token", &sys.admin, "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    let body: Value = serde_json::from_str(&out).expect("the error as JSON");
    assert!(body["error"].is_string(), "{body}");
    let (code, _, err) = run(&["workers", "list", "--box", "b", "--url", &url, "--token", "atasira_pat_unknown"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401 unauthenticated"), "{err}");
    assert!(!err.contains("waiting for the gateway"), "no progress on a pipe: {err}");
}
