//! `examples/nats_publisher.py`, a NATS client that is not ours (nats-py and classes that
//! grpcio-tools generates from `proto/`), run against a real cluster with the very command
//! lines of the README's section "Publish drafts over NATS".

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System};
use atasira_tests::workspace_root;
use serde_json::Value;

const SECTION: &str = "## Publish drafts over NATS";
const SCRIPT: &str = "python examples/nats_publisher.py ";

/// The script's command lines in the README section's first `sh` block, each with its
/// `\` continuations joined.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let section = readme.split_once(SECTION).unwrap_or_else(|| panic!("README.md has no section {SECTION:?}")).1;
    let block = section.split_once("```sh\n").and_then(|(_, rest)| rest.split_once("```")).map(|(block, _)| block).expect("an sh block in the section");
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        current.push_str(line.trim_end_matches('\\'));
        if !line.ends_with('\\') {
            if current.starts_with(SCRIPT) {
                commands.push(current.clone());
            }
            current.clear();
        }
    }
    commands
}

/// Runs `command` in the workspace root through `sh`, with the README's placeholders in
/// the environment and the test venv's `python` first on PATH.
fn run(command: &str, sys: &mut System) -> Output {
    let python = std::env::var("ATASIRA_TEST_PYTHON")
        .unwrap_or_else(|_| panic!("ATASIRA_TEST_PYTHON (a python with nats-py and grpcio-tools) is not set: run the suite with scripts/test"));
    let bin = Path::new(&python).parent().expect("the venv's bin directory");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    Command::new("sh")
        .args(["-c", command])
        .current_dir(workspace_root())
        .env("PATH", path)
        .env("ATASIRA_NATS_URL", sys.nats().url())
        .env("ATASIRA_NATS_CA", sys.nats_ca())
        .env("AGENT", &sys.agent)
        .env("ADMIN", &sys.admin)
        .env_remove("ATASIRA_TOKEN")
        .output_within(SUBPROCESS_LIMIT)
        .expect("sh runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_readme_nats_publisher_submits_a_draft_and_lists_pending_over_nats() {
    // R-ARCH-3, R-AUTH-5, R-DRAFT-1, R-APPROVE-1: a foreign NATS publisher with the proto contract
    let commands = readme_commands();
    let [submit, pending] = commands.as_slice() else { panic!("expected the submit and pending command lines in the README section, found {commands:?}") };
    assert!(submit.contains(" submit ") && submit.contains("$AGENT"), "{submit}");
    assert!(pending.ends_with(" pending") && pending.contains("$ADMIN"), "{pending}");
    let mut sys = System::start(Mode::Cluster);

    // The agent submits: one JSON line with the reply.
    let out = run(submit, &mut sys);
    assert!(out.status.success(), "{submit}\nstdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line: {stdout}");
    let reply: Value = serde_json::from_str(lines[0]).expect("JSON");
    assert_eq!(reply["box_type"], "sales-report", "{reply}");
    assert_eq!(reply["status"], "DRAFT_STATUS_PENDING_APPROVAL", "{reply}");
    assert_eq!(reply["over_limit"], false, "{reply}");
    let draft_id = reply["draft_id"].as_str().expect("draft_id").to_owned();

    // The REST API sees it pending, requested by the agent whose PAT the script used.
    let listed = sys.eventually_pending(Duration::from_secs(10), |l| l.iter().any(|d| d["draft_id"] == draft_id.as_str()));
    let item = listed.iter().find(|d| d["draft_id"] == draft_id.as_str()).expect("listed");
    assert_eq!(item["requested_by"], "agent");
    let detail = sys.get(&format!("/api/v1/boxes/box-drafts/{draft_id}"), &sys.agent);
    assert_eq!((detail.status, detail.body["status"].as_str()), (200, Some("pending_approval")), "{}", detail.raw);
    assert_eq!(detail.body["tools"], serde_json::json!(["Read"]), "{}", detail.raw);

    // The admin lists pending drafts over NATS: one JSON line per draft, ours among them.
    let out = run(pending, &mut sys);
    assert!(out.status.success(), "{pending}\nstderr: {}", text(&out.stderr));
    let drafts: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let ours = drafts.iter().find(|d| d["draft_id"] == draft_id.as_str()).unwrap_or_else(|| panic!("{draft_id} not in {drafts:?}"));
    assert_eq!(ours["requested_by"], "agent");
    assert_eq!(ours["status"], "DRAFT_STATUS_PENDING_APPROVAL");
    assert_eq!(ours["os_operations"], serde_json::json!(["file:read"]));

    // Refusals: the service's (an agent may not list pending drafts) prints the code on
    // stderr; NATS's (the auth callout refuses an unknown PAT) says it cannot connect. Both
    // exit 1.
    for (command, said) in
        [(pending.replace("$ADMIN", "$AGENT"), "refused: forbidden: "), (submit.replace("$AGENT", "atasira_pat_unknown"), "NATS refused the token")]
    {
        let out = run(&command, &mut sys);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}\nstderr: {stderr}");
        assert!(stderr.contains(said), "{command}\nstderr: {stderr}");
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
    assert_eq!(sys.pending().len(), 1, "the refused submission created nothing");
}
