//! `atasira drafts|boxes|audit` client verbs over REST (R-CLI-1, issue 12 item 3): every
//! flag says what it takes; exit codes tell a script what happened (0 answered, 1 refused
//! by the API, 2 a usage error, 3 no gateway); and an end-to-end run against `atasira dev`
//! drafts, approves (an over-limit draft only once confirmed, R-APPR-*), lists Boxes and
//! audit rows with --json, and sees an agent's approval refused.

use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System, TempDir, atasira_bin, free_port};
use serde_json::{Value, json};

/// The variables that choose where a verb goes, none of them inherited.
const WHERE: [&str; 4] = ["ATASIRA_PAT", "ATASIRA_BFF_URL", "ATASIRA_DATA_DIR", "ATASIRA_DATABASE_URL"];

fn run(args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(atasira_bin());
    cmd.args(args);
    for name in WHERE {
        cmd.env_remove(name);
    }
    let out = cmd.output_within(SUBPROCESS_LIMIT).expect("atasira runs");
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
        (&["boxes", "change"], vec!["--file"]),
        (&["drafts", "revise"], vec!["--file"]),
        (&["audit", "list"], [&["--action", "--target", "--since"][..], &paging].concat()),
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
    // audit verify says both ways: the store (operator) and the gateway (client)
    let (code, out, _) = run(&["audit", "verify", "--help"]);
    assert_eq!(code, 0);
    for flag in ["--data-dir", "--database-url", "--audit-key", "--url", "--token", "--json"] {
        assert!(out.lines().any(|l| l.trim_start().starts_with(flag)), "audit verify --help lacks {flag}:\n{out}");
    }
    assert!(out.contains("On the store itself") && out.contains("Through a running gateway"), "{out}");
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
        vec!["audit", "list", "--since", "2026-13-01", "--token", "pat", "--url", &nowhere],
        vec!["audit", "verify"],
        vec!["audit", "verify", "--url", &nowhere],
        vec!["audit", "verify", "--url", &nowhere, "--data-dir", "/tmp", "--token", "pat"],
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
        vec!["audit", "verify"],
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
    end_to_end(&System::start(Mode::Embedded));
}

#[test]
fn r_cli_1_client_verbs_end_to_end_on_a_cluster() {
    end_to_end(&System::start(Mode::Cluster));
}

/// Every drafts, boxes and audit verb against `sys`, with --json parsed and exit codes
/// checked; the same scenario in both modes.
fn end_to_end(sys: &System) {
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

    // audit list --since: rows at or after a time; a time to come has none; not a time is usage
    let (code, out, err) = cli(&sys.admin, &["audit", "list", "--limit", "500", "--json"]);
    assert_eq!(code, 0, "{err}");
    let all = json_of(&out)["rows"].as_array().cloned().expect("rows");
    let middle = all[all.len() / 2]["time"].as_str().expect("time").to_owned();
    let (code, out, err) = cli(&sys.admin, &["audit", "list", "--since", &middle, "--limit", "500", "--json"]);
    assert_eq!(code, 0, "{err}");
    let since = json_of(&out)["rows"].as_array().cloned().expect("rows");
    assert!(!since.is_empty() && since.len() < all.len(), "{} of {} rows since {middle}", since.len(), all.len());
    assert!(since.iter().all(|r| r["time"].as_str().is_some_and(|t| t >= middle.as_str())), "{out}");
    assert_eq!(since.last(), all.last(), "the newest row is among them");
    let (code, out, err) = cli(&sys.admin, &["audit", "list", "--since", "2999-01-01T09:00:00+09:00", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["rows"], json!([]), "{out}");
    let (code, _, err) = cli(&sys.admin, &["audit", "list", "--since", "yesterday"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("RFC 3339"), "{err}");

    // audit verify through the gateway: verified in words, or as JSON; an agent is refused
    let (code, out, err) = cli(&sys.admin, &["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("verified"), "{out}");
    let (code, out, err) = cli(&sys.admin, &["audit", "verify", "--json"]);
    assert_eq!(code, 0, "{err}");
    let rest = json_of(&out);
    assert_eq!(rest["ok"], true, "{rest}");
    let (code, _, err) = cli(&sys.agent, &["audit", "verify"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("403 forbidden"), "{err}");
    // the operator verb still verifies the ledger on the store, and agrees
    let (code, verified) = sys.audit_verify();
    assert_eq!((code, &verified), (0, &rest), "{verified}");
    // a flag on the command line picks the way over the environment
    let verify_with_env = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(atasira_bin());
        cmd.args(args).env_remove("ATASIRA_AUDIT_KEY");
        for name in WHERE {
            cmd.env_remove(name);
        }
        cmd.envs(env.iter().copied());
        let out = cmd.output_within(SUBPROCESS_LIMIT).expect("atasira runs");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, out, err) =
        verify_with_env(&["audit", "verify", "--url", &url], &[("ATASIRA_PAT", &sys.admin), ("ATASIRA_DATA_DIR", "/nonexistent/atasira-data")]);
    assert_eq!(code, 0, "--url wins over ATASIRA_DATA_DIR: {out}{err}");
    assert!(out.starts_with("verified"), "{out}");
    let (code, out, err) = verify_with_env(&["audit", "verify"], &[("ATASIRA_PAT", &sys.admin), ("ATASIRA_BFF_URL", &url)]);
    assert_eq!((code, out.starts_with("verified")), (0, true), "ATASIRA_BFF_URL alone asks the gateway: {out}{err}");
    let mut store = sys.target_args();
    store.splice(0..0, ["audit".to_owned(), "verify".to_owned()]);
    let store: Vec<&str> = store.iter().map(String::as_str).collect();
    let key = "b2".repeat(32);
    let mut env = vec![("ATASIRA_BFF_URL", "http://127.0.0.1:9")];
    if sys.mode == Mode::Cluster {
        env.push(("ATASIRA_AUDIT_KEY", &key));
    }
    let (code, out, err) = verify_with_env(&store, &env);
    assert_eq!((code, json_of(&out)), (0, rest.clone()), "--data-dir/--database-url wins over ATASIRA_BFF_URL: {err}");
    let (code, _, err) = verify_with_env(&["audit", "verify"], &[("ATASIRA_BFF_URL", &url), ("ATASIRA_DATA_DIR", "/nonexistent/atasira-data")]);
    assert_eq!(code, 2, "both ways from the environment: {err}");
    assert!(err.contains("--url") && err.contains("--data-dir"), "{err}");

    // a row changed behind the ledger's back: it does not verify (exit 1), the row is named
    sys.tamper("UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 3");
    let (code, out, err) = cli(&sys.admin, &["audit", "verify"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("DOES NOT VERIFY") && out.contains("row 3"), "{out}");
    let (code, out, _) = cli(&sys.admin, &["audit", "verify", "--json"]);
    let broken = json_of(&out);
    assert_eq!((code, &broken["ok"], &broken["first_bad_seq"]), (1, &json!(false), &json!(3)), "{broken}");
    assert_eq!(sys.audit_verify(), (1, broken), "the operator check agrees");

    // piped output never carries progress text
    assert!(!err.contains("waiting for the gateway"), "{err}");
}

#[test]
fn r_cli_1_long_waits_show_progress_on_a_terminal_only() {
    // Issue 12 item 3: an approval slowed down by 2.5 s (a pause in the activation) shows
    // "waiting for the gateway" on a terminal, cleared when the answer arrives, and nothing
    // of it on a pipe.
    let sys = System::start_with(Mode::Embedded, &[("ATASIRA_FAILPOINT_DELAY", "activation:2500".to_owned())]);
    let url = sys.url("");
    let piped = sys.draft(&json!({"box_type": "cli-slow-piped", "purpose": "p"}));
    let (code, out, err) = run(&["drafts", "approve", &piped, "--url", &url, "--token", &sys.admin]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("waiting") && !out.contains("waiting") && !err.contains('\r'), "no progress on a pipe: {out}{err}");

    // A terminal: `script` (util-linux) runs the verb on a pseudo-terminal.
    if std::process::Command::new("script").arg("--version").output_within(SUBPROCESS_LIMIT).is_err() {
        eprintln!("no `script` command: the terminal half of this test is skipped");
        return;
    }
    let on_terminal = sys.draft(&json!({"box_type": "cli-slow-terminal", "purpose": "p"}));
    let command = format!("{} drafts approve {on_terminal} --url {url} --token {}", atasira_bin().display(), sys.admin);
    let mut script = std::process::Command::new("script");
    script.args(["-qefc", &command, "/dev/null"]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    for name in WHERE {
        script.env_remove(name);
    }
    let mut child = script.spawn().expect("script runs");
    // stdin stays open until the verb is done (a closed one could end the session early).
    let stdin = child.stdin.take();
    let mut screen = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut screen).expect("the terminal's output");
    let status = child.wait().expect("script ends");
    drop(stdin);
    assert_eq!(status.code(), Some(0), "{screen}");
    let waiting = screen.rfind("waiting for the gateway").unwrap_or_else(|| panic!("no progress on a terminal: {screen:?}"));
    let approved = screen.find("approved; the Box is active").unwrap_or_else(|| panic!("{screen:?}"));
    assert!(waiting < approved, "{screen:?}");
    assert!(screen[waiting..approved].contains("\r\x1b[2K"), "the progress line is cleared before the answer: {screen:?}");
}
