//! The OpenAPI document against an OpenAPI client no one here wrote: schemathesis runs all
//! its checks against `atasira dev` and a cluster, in each once with the admin's token and
//! once with an agent's, and must find nothing: every status documented, no server error, valid requests
//! accepted, invalid ones refused, response bodies as described.
//!
//! Every route gets real ids (drafts and Boxes seeded for it), so the fuzzer reaches the
//! services, not just the 404 of an unknown id; the test checks that each route answered
//! 2xx at least once for the caller who may use it.
//!
//! Needs what `scripts/test` provides: `ATASIRA_TEST_PYTHON` (the Python of the venv it
//! installs schemathesis into), nats-server and PostgreSQL.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System, TempDir};
use atasira_tests::workspace_root;
use serde_json::{Value, json};

/// Test cases per operation and phase; enough for every route to see valid and invalid
/// requests of every documented kind, small enough for a run of a minute or so.
const MAX_EXAMPLES: &str = "25";

fn python() -> PathBuf {
    PathBuf::from(
        std::env::var("ATASIRA_TEST_PYTHON")
            .unwrap_or_else(|_| panic!("ATASIRA_TEST_PYTHON is not set: run the suite with scripts/test, which installs schemathesis into its venv")),
    )
}

/// Which id each path operation gets, and which operations must answer 2xx at least once.
struct Plan {
    ids: BTreeMap<&'static str, Vec<(&'static str, String)>>,
    /// Query parameters fixed for a path (whose tokens a revocation may take).
    query: BTreeMap<&'static str, (&'static str, String)>,
    must_succeed: Vec<&'static str>,
    /// The box_type valid feasibility requests name (see `hooks.py`).
    box_type: String,
}

/// A token of a throwaway user; its public id.
fn token_id(sys: &System, user: &str) -> String {
    sys.token(user, "member", "agent");
    let mut args = vec!["tokens", "list", "--user", user, "--json"];
    let target = sys.target_args();
    args.extend(target.iter().map(String::as_str));
    let (code, out, err) = sys.cli(&args);
    assert_eq!(code, 0, "{err}");
    let list: Value = serde_json::from_str(out.trim()).expect("JSON");
    list["tokens"][0]["token_id"].as_str().expect("token id").to_owned()
}

fn draft(sys: &System, token: &str, box_type: &str) -> String {
    let a = sys.post("/api/v1/boxes/box-drafts", token, &json!({"box_type": box_type, "purpose": "fuzzed"}));
    assert_eq!(a.status, 201, "{}", a.raw);
    a.body["draft_id"].as_str().expect("draft_id").to_owned()
}

/// An active Box (drafted by the agent, approved by the admin); its id.
fn active_box(sys: &System, box_type: &str) -> String {
    let a = sys.approve(&draft(sys, &sys.agent, box_type), &sys.admin, false);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["box_id"].as_str().expect("box_id").to_owned()
}

fn box_action(sys: &System, box_id: &str, action: &str) {
    let a = sys.post(&format!("/api/v1/boxes/{box_id}/{action}"), &sys.admin, &json!({}));
    assert_eq!(a.status, 200, "{}", a.raw);
}

/// Seeds what one run needs: a draft or Box per operation that changes it.
fn plan(sys: &System, run: &str, token: &str) -> Plan {
    let t = |what: &str| format!("fz-{run}-{what}");
    let (stop, archive, resume, other) =
        (active_box(sys, &t("stop")), active_box(sys, &t("archive")), active_box(sys, &t("resume")), active_box(sys, &t("box")));
    box_action(sys, &resume, "stop");
    // The agent may assign users to a Box it is the primary of, and unassign them.
    for (user, role) in [("agent", "primary"), ("fz-user", "member")] {
        let a = sys.post(&format!("/api/v1/boxes/{other}/user-assignments"), &sys.admin, &json!({"user_id": user, "role_in_box": role}));
        assert_eq!(a.status, 200, "{}", a.raw);
    }
    // A Worker of that Box, launched by the caller (an admin, or the agent as its primary).
    let launched =
        sys.post(&format!("/api/v1/boxes/{other}/workers"), token, &json!({"launch_id": t("launch"), "input": [{"kind": "text", "value": "fuzzed"}]}));
    assert_eq!(launched.status, 201, "{}", launched.raw);
    let worker = launched.body["worker_id"].as_str().expect("worker_id").to_owned();
    let one = |name: &'static str, id: String| vec![(name, id)];
    let ids = BTreeMap::from([
        ("/api/v1/boxes/box-drafts/{draft_id}", one("draft_id", draft(sys, token, &t("get")))),
        ("/api/v1/boxes/box-drafts/{draft_id}/approve", one("draft_id", draft(sys, &sys.agent, &t("approve")))),
        ("/api/v1/boxes/box-drafts/{draft_id}/reject", one("draft_id", draft(sys, &sys.agent, &t("reject")))),
        ("/api/v1/boxes/box-drafts/{draft_id}/withdraw", one("draft_id", draft(sys, token, &t("withdraw")))),
        ("/api/v1/boxes/{box_id}", one("box_id", other.clone())),
        ("/api/v1/boxes/{box_id}/user-assignments", one("box_id", other.clone())),
        ("/api/v1/boxes/{box_id}/user-assignments/{user_id}", vec![("box_id", other.clone()), ("user_id", "fz-user".to_owned())]),
        ("/api/v1/boxes/{box_id}/history", one("box_id", other.clone())),
        ("/api/v1/boxes/{box_id}/manifest", one("box_id", other.clone())),
        ("/api/v1/boxes/{box_id}/workers", one("box_id", other.clone())),
        ("/api/v1/workers/{worker_id}", one("worker_id", worker.clone())),
        ("/api/v1/workers/{worker_id}/provenance", one("worker_id", worker)),
        ("/api/v1/boxes/{box_id}/config", one("box_id", other)),
        ("/api/v1/boxes/{box_id}/stop", one("box_id", stop)),
        ("/api/v1/boxes/{box_id}/resume", one("box_id", resume)),
        ("/api/v1/boxes/{box_id}/archive", one("box_id", archive)),
        ("/api/v1/auth/tokens/{token_id}", one("token_id", token_id(sys, &t("revoked")))),
    ]);
    // Revoking every token of a user takes only a throwaway user's (never the caller's).
    let gone = t("gone");
    token_id(sys, &gone);
    let query = BTreeMap::from([("/api/v1/auth/tokens", ("user_id", gone))]);
    let mut must_succeed = vec![
        "POST /api/v1/boxes/box-drafts",
        "GET /api/v1/boxes/box-drafts",
        "GET /api/v1/boxes/box-drafts/{draft_id}",
        "POST /api/v1/boxes/box-drafts/{draft_id}/withdraw",
        "GET /api/v1/boxes",
        "GET /api/v1/boxes/{box_id}",
        "POST /api/v1/boxes/{box_id}/user-assignments",
        "DELETE /api/v1/boxes/{box_id}/user-assignments/{user_id}",
        "GET /api/v1/boxes/{box_id}/history",
        "POST /api/v1/boxes/feasibility",
        "POST /api/v1/auth/nats-assertion",
        "GET /api/v1/auth/whoami",
        // the agent is the Box's primary
        "PATCH /api/v1/boxes/{box_id}/config",
        // and may launch its Workers and read them
        "POST /api/v1/boxes/{box_id}/workers",
        "GET /api/v1/boxes/{box_id}/workers",
        "GET /api/v1/workers/{worker_id}",
        "GET /api/v1/workers/{worker_id}/provenance",
    ];
    if token == sys.admin {
        must_succeed.extend([
            "GET /api/v1/boxes/box-drafts/pending",
            "POST /api/v1/boxes/box-drafts/{draft_id}/approve",
            "POST /api/v1/boxes/box-drafts/{draft_id}/reject",
            "POST /api/v1/boxes/{box_id}/stop",
            "POST /api/v1/boxes/{box_id}/resume",
            "POST /api/v1/boxes/{box_id}/archive",
            "GET /api/v1/audit",
            "GET /api/v1/audit/verify",
            "GET /api/v1/auth/tokens",
            "DELETE /api/v1/auth/tokens/{token_id}",
            "DELETE /api/v1/auth/tokens",
            "PUT /api/v1/boxes/{box_id}/manifest",
        ]);
    }
    Plan { ids, query, must_succeed, box_type: t("box") }
}

fn config(plan: &Plan) -> String {
    let hooks = workspace_root().join("tests/schemathesis/hooks.py");
    let mut toml = format!("hooks = {}\n", Value::from(hooks.display().to_string()));
    for (path, params) in &plan.ids {
        let params: Vec<String> = params.iter().map(|(name, id)| format!("\"path.{name}\" = {}", Value::from(id.as_str()))).collect();
        toml.push_str(&format!("\n[[operations]]\ninclude-path = {}\nparameters = {{ {} }}\n", Value::from(*path), params.join(", ")));
        // The edits carry free-form JSON objects (`config_defaults`, a step's `args_schema`):
        // any JSON within a byte bound, which JSON Schema cannot state. The document states
        // a form the API always takes, so valid data is still held to being accepted; data
        // outside that form is not expected to be refused. The check is off for them, and
        // no such data is generated for them either: a run once applied the check to one
        // of them all the same (`{"k": null}` in a step's `args_schema`).
        if path.ends_with("/manifest") || path.ends_with("/config") {
            toml.push_str("checks.negative_data_rejection.enabled = false\ngeneration.mode = \"positive\"\n");
        }
    }
    // A change request and a revision are merge patches of a whole manifest: whether one is
    // accepted depends on the manifest it patches (a patch that changes nothing is 422, and
    // so is one that leaves the manifest invalid), which no schema of the request can
    // state. Data the document calls valid may there be refused with 422 as well (the
    // `--checks all` of the command line keeps the check itself on); the refusals are still
    // checked to be documented JSON errors.
    // A policy text the document calls valid is any text; whether it is Cedar, no schema
    // can state: it may be refused with 422 as well.
    for path in ["/api/v1/boxes/{box_id}/change-requests", "/api/v1/boxes/box-drafts/{draft_id}/revise", "/api/v1/policies", "/api/v1/policies/check"] {
        toml.push_str(&format!(
            "\n[[operations]]\ninclude-path = {}\nchecks.positive_data_acceptance.expected-statuses = [\"2XX\", \"401\", \"403\", \"404\", \"409\", \"422\", \"429\"]\n",
            Value::from(path)
        ));
    }
    // The live stream answers for minutes by design (server-sent events): a client that
    // reads whole bodies would only time out. `tests/live_stream.rs` reads it as a stream.
    toml.push_str("\n[[operations]]\ninclude-path = \"/api/v1/events/stream\"\nenabled = false\n");
    for (path, (name, value)) in &plan.query {
        toml.push_str(&format!(
            "\n[[operations]]\ninclude-path = {}\nparameters = {{ \"query.{name}\" = {} }}\n",
            Value::from(*path),
            Value::from(value.as_str())
        ));
    }
    toml
}

/// `METHOD /path/{template}` of a request schemathesis sent, from the ids of the plan.
fn operation_of(plan: &Plan, method: &str, url: &str) -> String {
    let path = url.split_once("://").map_or(url, |(_, rest)| rest.find('/').map_or("/", |i| &rest[i..]));
    let path = path.split('?').next().unwrap_or(path);
    let mut template = path.to_owned();
    for (candidate, params) in &plan.ids {
        let filled = params.iter().fold((*candidate).to_owned(), |t, (name, id)| t.replace(&format!("{{{name}}}"), id));
        if filled == path {
            template = (*candidate).to_owned();
        }
    }
    format!("{method} {template}")
}

fn run(sys: &System, who: &str, token: &str) {
    let plan = plan(sys, who, token);
    let dir = TempDir::new("atasira-schemathesis");
    let config_path = dir.0.join("schemathesis.toml");
    std::fs::write(&config_path, config(&plan)).expect("config");
    let har = dir.0.join("requests.har");
    let started = Instant::now();
    let schemathesis = || {
        Command::new(python())
            .args(["-m", "schemathesis.cli", "--config-file"])
            .arg(&config_path)
            .args(["run", &sys.url("/api/v1/openapi.json"), "--checks", "all", "--max-examples", MAX_EXAMPLES, "--workers", "1", "--no-color"])
            // Hypothesis's "data generation is too slow" says how busy this machine is,
            // not what the API does (seen on a loaded 2-core machine).
            .args(["--suppress-health-check", "too_slow"])
            // The same cases every run unless the suite is given another seed (scripts/test).
            .args(["--seed", &std::env::var("ATASIRA_FUZZ_SEED").unwrap_or_else(|_| "20261203".to_owned())])
            .args(["--header", &format!("Authorization: Bearer {token}"), "--report", "har", "--report-har-path"])
            .arg(&har)
            .env("ATASIRA_FUZZ_BOX_TYPE", &plan.box_type)
            .env("ATASIRA_FUZZ_RUN", who)
            .current_dir(&dir.0)
            .output_within(SUBPROCESS_LIMIT)
            .expect("schemathesis runs (is it installed in the venv of ATASIRA_TEST_PYTHON?)")
    };
    // One worker: Python 3.11's parser is not thread-safe ("AST constructor recursion depth
    // mismatch" from hypothesis describing its strategies in two threads at once).
    let mut out = schemathesis();
    // A crash of the tool itself ("Runtime Error" with no FAILURES section) says nothing
    // about the API: run again, at most twice. A finding never retries.
    let crashed = |o: &std::process::Output| {
        let text = String::from_utf8_lossy(&o.stdout);
        !o.status.success() && text.contains("Runtime Error") && !text.contains("FAILURES")
    };
    for _ in 0..2 {
        if !crashed(&out) {
            break;
        }
        eprintln!("schemathesis as {who} ({:?}) crashed, not a finding; running it again:\n{}", sys.mode, String::from_utf8_lossy(&out.stdout));
        out = schemathesis();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout.find("SUMMARY").map_or("", |at| &stdout[at..]);
    eprintln!("schemathesis as {who} ({:?}): {:?}, exit {:?}\n{summary}", sys.mode, started.elapsed(), out.status.code());
    assert!(out.status.success(), "schemathesis as {who} ({:?}) found failures:\n{stdout}\n{stderr}", sys.mode);

    // Every route was reached with ids that exist: each answered 2xx at least once.
    let har: Value = serde_json::from_slice(&std::fs::read(&har).expect("HAR report")).expect("HAR is JSON");
    let mut succeeded = std::collections::BTreeSet::new();
    for entry in har["log"]["entries"].as_array().expect("HAR entries") {
        let status = entry["response"]["status"].as_u64().unwrap_or(0);
        if (200..300).contains(&status) {
            succeeded.insert(operation_of(&plan, entry["request"]["method"].as_str().unwrap_or(""), entry["request"]["url"].as_str().unwrap_or("")));
        }
    }
    let missed: Vec<&&str> = plan.must_succeed.iter().filter(|op| !succeeded.contains(**op)).collect();
    assert!(missed.is_empty(), "as {who}, these routes never answered 2xx: {missed:?}\n{stdout}");
}

/// Both modes and both callers, each its own test so that they run side by side: PostgreSQL
/// refuses some text that SQLite stores (NUL characters), and an agent may do less than an
/// admin.
fn finds_nothing(mode: Mode, who: &str) {
    // Each run seeds four Boxes.
    let sys = System::start_with(mode, &[("ATASIRA_MAX_BOXES", "20".to_owned()), ("ATASIRA_RATE_LIMIT", "0".to_owned())]);
    let token = if who == "admin" { &sys.admin } else { &sys.agent };
    run(&sys, who, token);
}

#[test]
fn schemathesis_finds_nothing_as_admin_in_embedded_mode() {
    finds_nothing(Mode::Embedded, "admin");
}

#[test]
fn schemathesis_finds_nothing_as_agent_in_embedded_mode() {
    finds_nothing(Mode::Embedded, "agent");
}

#[test]
fn schemathesis_finds_nothing_as_admin_in_cluster_mode() {
    finds_nothing(Mode::Cluster, "admin");
}

#[test]
fn schemathesis_finds_nothing_as_agent_in_cluster_mode() {
    finds_nothing(Mode::Cluster, "agent");
}
