//! `atasira drafts|boxes|audit` client verbs over REST (R-CLI-1, issue 12 item 3): every
//! flag says what it takes; exit codes tell a script what happened (0 answered, 1 refused
//! by the API, 2 a usage error, 3 no gateway); and an end-to-end run against `atasira dev`
//! drafts, approves (an over-limit draft only once confirmed, R-APPR-*), lists Boxes and
//! audit rows with --json, and sees an agent's approval refused.

use atasira_tests::harness::{Mode, System, TempDir, atasira_bin, free_port};
use serde_json::{Value, json};

fn run(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(atasira_bin()).args(args).env_remove("ATASIRA_PAT").env_remove("ATASIRA_BFF_URL").output().expect("atasira runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

const CONNECTION: [&str; 3] = ["--url", "--token", "--json"];

#[test]
fn r_cli_1_client_verbs_document_every_flag() {
    let paging = ["--limit", "--cursor"];
    let cases: Vec<(&[&str], Vec<&str>)> = vec![
        (&["drafts", "pending"], paging.to_vec()),
        (&["drafts", "mine"], [&["--status"][..], &paging].concat()),
        (&["drafts", "show"], vec![]),
        (&["drafts", "create"], vec!["--file"]),
        (&["drafts", "approve"], vec!["--confirm-over-limit"]),
        (&["drafts", "reject"], vec!["--reason"]),
        (&["drafts", "withdraw"], vec![]),
        (&["boxes", "list"], [&["--state"][..], &paging].concat()),
        (&["boxes", "show"], vec![]),
        (&["boxes", "history"], paging.to_vec()),
        (&["boxes", "stop"], vec![]),
        (&["boxes", "resume"], vec![]),
        (&["boxes", "archive"], vec![]),
        (&["boxes", "assign"], vec!["--user", "--role"]),
        (&["boxes", "unassign"], vec!["--user"]),
        (&["boxes", "edit"], vec!["--file"]),
        (&["boxes", "config"], vec!["--file"]),
        (&["audit", "list"], [&["--action", "--target"][..], &paging].concat()),
    ];
    for (verb, flags) in cases {
        let (code, out, err) = run(&[verb, &["--help"]].concat());
        assert_eq!(code, 0, "{verb:?}: {err}");
        for flag in flags.iter().chain(&CONNECTION) {
            let line = out.lines().find(|l| l.trim_start().starts_with(flag)).unwrap_or_else(|| panic!("{verb:?} --help lacks {flag}:\n{out}"));
            let help = line.trim_start().trim_start_matches(flag).trim_start_matches(|c: char| c != ' ' && c != '\t').trim();
            let help = if help.is_empty() {
                // clap puts a long help on the next line
                out.lines().skip_while(|l| l != &line).nth(1).unwrap_or_default().trim()
            } else {
                help
            };
            assert!(help.len() > 3, "{verb:?} {flag} has no help: {line}");
        }
    }
    // the existing verbs are still there
    for verb in [&["drafts", "preview", "--help"][..], &["audit", "verify", "--help"][..]] {
        assert_eq!(run(verb).0, 0, "{verb:?}");
    }
    let (code, out, _) = run(&["drafts", "preview", "--json", r#"{"box_type": "cli-check", "purpose": "p"}"#]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&out).expect("JSON")["status"], 201, "{out}");
}

#[test]
fn r_cli_1_client_verbs_exit_codes_usage_and_unreachable() {
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    for args in [
        vec!["drafts", "reject", "d1", "--token", "pat", "--url", &nowhere],
        vec!["drafts", "create", "--file", "/nonexistent/draft.json", "--token", "pat", "--url", &nowhere],
        vec!["drafts", "mine", "--status", "sleeping", "--token", "pat", "--url", &nowhere],
        vec!["boxes", "list", "--state", "asleep", "--token", "pat", "--url", &nowhere],
        vec!["boxes", "assign", "b1", "--user", "u", "--role", "owner", "--token", "pat", "--url", &nowhere],
        vec!["boxes", "show", "b1", "--url", &nowhere],
        vec!["audit", "list", "--url", &nowhere],
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    for args in [
        vec!["drafts", "pending"],
        vec!["drafts", "approve", "d1"],
        vec!["boxes", "list"],
        vec!["boxes", "stop", "b1"],
        vec!["audit", "list", "--action", "box.activate"],
    ] {
        let (code, _, err) = run(&[&args[..], &["--token", "pat", "--url", &nowhere]].concat());
        assert_eq!(code, 3, "{args:?}: {err}");
        assert!(err.contains("cannot reach"), "{err}");
    }
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn r_cli_1_client_verbs_end_to_end_on_atasira_dev() {
    let sys = System::start(Mode::Embedded);
    let url = sys.url("");
    let cli = |token: &str, args: &[&str]| run(&[args, &["--url", &url, "--token", token]].concat());
    let dir = TempDir::new("clients-cli");
    let file = |name: &str, body: Value| {
        let path = dir.0.join(name);
        std::fs::write(&path, body.to_string()).expect("write");
        path.to_string_lossy().into_owned()
    };
    let plain =
        file("plain.json", json!({"box_type": "cli-report", "name": "Report", "purpose": "週次レポート", "tools": ["Read"], "os_operations": ["file:read"]}));
    let over = file("over.json", json!({"box_type": "cli-ops", "purpose": "operations", "os_operations": ["shell:exec"], "tools": ["Bash"]}));
    let other = file("other.json", json!({"box_type": "cli-other", "purpose": "p"}));
    let gone = file("gone.json", json!({"box_type": "cli-gone", "purpose": "p"}));

    // drafts create (as the agent), always pending
    let mut ids = Vec::new();
    for path in [&plain, &over, &other, &gone] {
        let (code, out, err) = cli(&sys.agent, &["drafts", "create", "--file", path, "--json"]);
        assert_eq!(code, 0, "{out}{err}");
        let created = json_of(&out);
        assert_eq!(created["status"], "pending_approval", "{created}");
        ids.push(created["draft_id"].as_str().expect("draft_id").to_owned());
    }
    let (plain_id, over_id, other_id, gone_id) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    let (code, out, err) = cli(&sys.agent, &["drafts", "create", "--file", &file("bad.json", json!({"box_type": "admin-pm", "purpose": "p"}))]);
    assert_eq!(code, 1, "a refused draft: {out}{err}");
    assert!(err.contains("self_privilege_forbidden"), "{err}");

    // drafts pending (admin) has all four; for an agent it is refused
    let (code, out, err) = cli(&sys.admin, &["drafts", "pending", "--json"]);
    assert_eq!(code, 0, "{err}");
    let pending: Vec<String> = json_of(&out)["drafts"].as_array().expect("drafts").iter().map(|d| d["draft_id"].as_str().unwrap_or("").to_owned()).collect();
    assert!(ids.iter().all(|id| pending.contains(id)), "{pending:?}");
    let (code, out, _) = cli(&sys.admin, &["drafts", "pending"]);
    assert_eq!(code, 0);
    assert!(out.contains("OVER LIMIT") && out.contains("shell:exec"), "the table marks the over-limit draft: {out}");
    let (code, _, err) = cli(&sys.agent, &["drafts", "pending"]);
    assert_eq!(code, 1, "{err}");

    // drafts show and mine
    let (code, out, err) = cli(&sys.agent, &["drafts", "show", over_id, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["over_limit"], true);
    let (code, out, _) = cli(&sys.agent, &["drafts", "show", over_id]);
    assert_eq!(code, 0);
    assert!(out.contains("over_limit") && out.contains("Bash"), "{out}");
    let (code, out, err) = cli(&sys.agent, &["drafts", "mine", "--status", "pending-approval", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["drafts"].as_array().map(Vec::len), Some(4), "{out}");

    // an agent's approval is refused by the API (exit 1)
    let (code, out, err) = cli(&sys.agent, &["drafts", "approve", plain_id, "--json"]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(json_of(&out)["error"], "forbidden", "{out}");

    // an over-limit draft: refused without a terminal unless confirmed, naming what is dangerous
    let (code, _, err) = cli(&sys.admin, &["drafts", "approve", over_id]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("shell:exec") && err.contains("--confirm-over-limit"), "{err}");
    let (code, out, err) = cli(&sys.admin, &["drafts", "approve", over_id, "--confirm-over-limit", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let over_box = json_of(&out)["box_id"].as_str().expect("box_id").to_owned();
    let (code, out, err) = cli(&sys.admin, &["drafts", "approve", plain_id, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let approved = json_of(&out);
    assert_eq!(approved["status"], "active", "{approved}");
    let plain_box = approved["box_id"].as_str().expect("box_id").to_owned();
    let (code, out, err) = cli(&sys.admin, &["drafts", "approve", plain_id, "--json"]);
    assert_eq!((code, json_of(&out)["box_id"].as_str()), (0, Some(plain_box.as_str())), "approving again answers the same Box: {err}");

    // reject with a reason, withdraw
    let (code, out, err) = cli(&sys.admin, &["drafts", "reject", other_id, "--reason", "not needed", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["status"], "rejected");
    let (code, out, err) = cli(&sys.agent, &["drafts", "withdraw", gone_id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("withdrawn"), "{out}");
    let (code, out, _) = cli(&sys.agent, &["drafts", "show", other_id]);
    assert_eq!(code, 0);
    assert!(out.contains("not needed"), "the reason is shown: {out}");

    // boxes list, show, assign, history, stop, resume, archive
    let (code, out, err) = cli(&sys.agent, &["boxes", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Vec<String> = json_of(&out)["boxes"].as_array().expect("boxes").iter().map(|b| b["box_id"].as_str().unwrap_or("").to_owned()).collect();
    assert!(listed.contains(&plain_box) && listed.contains(&over_box), "{listed:?}");
    let (code, out, _) = cli(&sys.agent, &["boxes", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains("cli-report") && out.contains("BOX_ID"), "{out}");
    let (code, out, err) = cli(&sys.admin, &["boxes", "assign", &plain_box, "--user", "bob", "--role", "member", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(json_of(&out)["assignments"].as_array().expect("assignments").iter().any(|a| a["user_id"] == "bob" && a["role_in_box"] == "member"), "{out}");
    let (code, out, _) = cli(&sys.agent, &["boxes", "show", &plain_box]);
    assert_eq!(code, 0);
    assert!(out.contains("bob (member)"), "{out}");
    // boxes edit (mentor), config (merge patch), unassign
    let edit = file("edit.json", json!({"purpose": "週次レポート（改訂）"}));
    let (code, out, err) = cli(&sys.admin, &["boxes", "edit", &plain_box, "--file", &edit, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(json_of(&out)["manifest"]["purpose"].as_str().is_some_and(|p| p.starts_with("週次レポート（改訂）")), "{out}");
    let widening = file("widening.json", json!({"tools": ["Read", "Bash"]}));
    let (code, _, err) = cli(&sys.admin, &["boxes", "edit", &plain_box, "--file", &widening]);
    assert_eq!(code, 1, "a mentor edit of tools is refused: {err}");
    assert!(err.contains("mentor_edit_prohibited_key"), "{err}");
    let patch = file("patch.json", json!({"config_defaults": {"week": "49"}}));
    let (code, out, err) = cli(&sys.admin, &["boxes", "config", &plain_box, "--file", &patch, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["manifest"]["config_defaults"]["week"], "49", "{out}");
    let (code, _, err) = cli(&sys.admin, &["boxes", "config", &plain_box, "--file", &widening]);
    assert_eq!(code, 1, "a config edit that widens tools is refused: {err}");
    assert!(err.contains("capability_change_requires_new_draft"), "{err}");
    let (code, _, err) = cli(&sys.admin, &["boxes", "config", &plain_box, "--file", "/nonexistent/patch.json"]);
    assert_eq!(code, 2, "an unreadable file is a usage error: {err}");
    let (code, _, err) = cli(&sys.admin, &["boxes", "assign", &plain_box, "--user", "carol", "--role", "member"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&sys.admin, &["boxes", "unassign", &plain_box, "--user", "carol", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(!json_of(&out)["assignments"].as_array().expect("assignments").iter().any(|a| a["user_id"] == "carol"), "{out}");
    let (code, _, err) = cli(&sys.admin, &["boxes", "unassign", &plain_box, "--user", "carol"]);
    assert_eq!(code, 1, "no such assignment any more: {err}");

    let (code, _, err) = cli(&sys.agent, &["boxes", "stop", &plain_box]);
    assert_eq!(code, 1, "an agent may not stop a Box: {err}");
    let (code, out, err) = cli(&sys.admin, &["boxes", "stop", &plain_box, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["state"], "stopped");
    let (code, out, err) = cli(&sys.admin, &["boxes", "list", "--state", "stopped", "--json"]);
    assert_eq!(code, 0, "{err}");
    let stopped: Vec<Value> = json_of(&out)["boxes"].as_array().cloned().unwrap_or_default();
    assert_eq!(stopped.iter().map(|b| b["box_id"].clone()).collect::<Vec<_>>(), vec![json!(plain_box)], "{out}");
    let (code, out, err) = cli(&sys.admin, &["boxes", "resume", &plain_box]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("idle"), "{out}");
    let (code, out, err) = cli(&sys.admin, &["boxes", "archive", &over_box, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["state"], "archived");
    let (code, out, err) = cli(&sys.agent, &["boxes", "history", &plain_box, "--json"]);
    assert_eq!(code, 0, "{err}");
    let kinds: Vec<Value> = json_of(&out)["entries"].as_array().expect("entries").iter().map(|e| e["kind"].clone()).collect();
    assert!(kinds.len() >= 4, "activation, assignment, stop, resume: {kinds:?}");
    let (code, out, _) = cli(&sys.agent, &["boxes", "history", &plain_box]);
    assert_eq!(code, 0);
    assert!(out.contains("user_id=bob"), "{out}");
    let (code, _, err) = cli(&sys.admin, &["boxes", "show", "box_nonexistent"]);
    assert_eq!(code, 1, "{err}");

    // audit list: filtered rows as JSON; an agent is refused
    let (code, out, err) = cli(&sys.admin, &["audit", "list", "--action", "box_draft.approve", "--json"]);
    assert_eq!(code, 0, "{err}");
    let rows = json_of(&out)["rows"].as_array().cloned().expect("rows");
    let targets: Vec<&str> = rows.iter().map(|r| r["target"].as_str().unwrap_or("")).collect();
    assert!(targets.contains(&plain_id.as_str()) && targets.contains(&over_id.as_str()), "{out}");
    assert!(rows.iter().all(|r| r["action"] == "box_draft.approve" && r["actor"].is_string()), "{out}");
    let (code, out, err) = cli(&sys.admin, &["audit", "list", "--target", plain_id, "--json"]);
    assert_eq!(code, 0, "{err}");
    let actions: Vec<Value> = json_of(&out)["rows"].as_array().expect("rows").iter().map(|r| r["action"].clone()).collect();
    assert!(actions.contains(&json!("box_draft.create")) && actions.contains(&json!("box_draft.approve")), "{actions:?}");
    let (code, out, _) = cli(&sys.admin, &["audit", "list", "--limit", "2"]);
    assert_eq!(code, 0);
    assert!(out.contains("SEQ") && out.contains("next page: --cursor"), "{out}");
    let (code, _, err) = cli(&sys.agent, &["audit", "list"]);
    assert_eq!(code, 1, "{err}");

    // the operator verb still verifies the ledger on the data dir
    let (code, verified) = sys.audit_verify();
    assert_eq!(code, 0, "{verified}");
}
