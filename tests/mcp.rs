//! The MCP server (R-MCP-1, issue 12 item 2) against an MCP client no one here wrote: the
//! official Python SDK (`tests/mcp/client.py`) over stdio (`atasira mcp` with
//! ATASIRA_BFF_URL/ATASIRA_PAT) and over streamable HTTP (the gateway's `/mcp` with the
//! PAT as bearer). Both list exactly the six tools (no approve, no reject); a draft made
//! through MCP is pending and visible over REST; the REST refusals (an agent listing
//! pending drafts) come back as tool errors with the REST error code; feasibility and
//! get_draft answer; `/mcp` refuses a missing or unknown token.
//!
//! Needs what `scripts/test` provides: `ATASIRA_TEST_PYTHON` (its venv, with `mcp` from
//! PyPI); the cluster run also nats-server and PostgreSQL.

use std::path::PathBuf;
use std::process::Command;

use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System, atasira_bin, http};
use atasira_tests::workspace_root;
use serde_json::{Value, json};

const TOOLS: [&str; 8] = [
    "atasira_create_box_draft",
    "atasira_feasibility",
    "atasira_get_draft",
    "atasira_list_boxes",
    "atasira_pending_drafts",
    "atasira_pending_tool_requests",
    "atasira_request_change",
    "atasira_stop_worker",
];

fn python() -> PathBuf {
    PathBuf::from(
        std::env::var("ATASIRA_TEST_PYTHON")
            .unwrap_or_else(|_| panic!("ATASIRA_TEST_PYTHON is not set: run the suite with scripts/test, which installs mcp into its venv")),
    )
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    Stdio,
    Http,
}

/// One MCP session of the Python client as `token`, making `calls` ([tool, arguments]);
/// its report (see client.py).
fn session(sys: &System, transport: Transport, token: &str, calls: &Value) -> Value {
    let script = workspace_root().join("tests/mcp/client.py");
    let mut cmd = Command::new(python());
    cmd.arg(&script);
    match transport {
        Transport::Stdio => cmd.args(["stdio", "--bin"]).arg(atasira_bin()).args(["--url", &sys.base_url]),
        Transport::Http => cmd.args(["http", "--url", &sys.url("/mcp")]),
    };
    let out = cmd.args(["--token", token, "--calls", &calls.to_string()]).output_within(SUBPROCESS_LIMIT).expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client.py failed ({:?}):\n{stdout}\n{stderr}", out.status);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("client.py printed no report ({e}):\n{stdout}\n{stderr}"))
}

/// The report of a session that must have worked; its calls.
fn calls(report: &Value) -> Vec<Value> {
    assert!(report.get("error").is_none(), "no session: {report}");
    report["calls"].as_array().cloned().unwrap_or_default()
}

fn ok(call: &Value) -> &Value {
    assert_eq!(call["is_error"], json!(false), "{} failed: {}", call["tool"], call["text"]);
    // The API's JSON, as text and as structured content.
    let text: Value = serde_json::from_str(call["text"].as_str().unwrap_or_default()).expect("the text is the API's JSON");
    assert_eq!(&text, &call["structured"]);
    &call["structured"]
}

/// A tool error that starts with the REST error code.
fn refused(call: &Value, code: &str) {
    assert_eq!(call["is_error"], json!(true), "{} was not refused: {}", call["tool"], call["text"]);
    let text = call["text"].as_str().unwrap_or_default();
    assert!(text.starts_with(&format!("{code}: ")), "{} refused otherwise: {text}", call["tool"]);
    assert_eq!(call["structured"]["error"], json!(code));
}

fn scenario(sys: &System, transport: Transport) {
    let tag = match transport {
        Transport::Stdio => "stdio",
        Transport::Http => "http",
    };
    // An active Box to assess.
    let existing = format!("mcp-{tag}-existing");
    let approved = sys.approve(&sys.draft(&json!({"box_type": existing, "purpose": "reads reports", "os_operations": ["file:read"]})), &sys.admin, false);
    assert_eq!(approved.status, 200, "{}", approved.raw);

    // The agent: drafts, is refused the pending list, reads its drafts, Boxes, feasibility.
    let box_type = format!("mcp-{tag}-drafted");
    let report = session(
        sys,
        transport,
        &sys.agent,
        &json!([
            ["atasira_create_box_draft", {"purpose": "Checks invoices", "box_type": box_type, "success_criteria": ["no invoice missed"],
                "os_operations": ["file:read", "shell:exec"], "tools": ["Read"], "allow_network": false}],
            ["atasira_pending_drafts", {}],
            ["atasira_get_draft", {}],
            ["atasira_list_boxes", {}],
            ["atasira_feasibility", {"task_description": "run a shell command", "box_type": existing}],
            ["atasira_feasibility", {"task_description": "read a file", "box_type": "mcp-no-such-box"}],
            ["atasira_create_box_draft", {"purpose": "x", "box_type": "audit"}],
        ]),
    );
    assert_eq!(report["server"]["name"], json!("atasira"));
    let mut names: Vec<&str> = report["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, TOOLS, "exactly these tools, no approve or reject");
    for tool in report["tools"].as_array().expect("tools") {
        assert!(tool["description"].as_str().is_some_and(|d| d.len() > 200), "{tool}");
        assert_eq!(tool["input_schema"]["type"], json!("object"), "{tool}");
    }
    let draft_tool = report["tools"].as_array().expect("tools").iter().find(|t| t["name"] == json!("atasira_create_box_draft")).expect("draft tool");
    let properties = draft_tool["input_schema"]["properties"].as_object().expect("properties");
    for arg in ["purpose", "box_type", "name", "success_criteria", "os_operations", "tools", "url_allowlist", "prohibited_actions", "allow_network"] {
        assert!(properties.contains_key(arg), "create_box_draft takes {arg}");
    }
    assert!(draft_tool["description"].as_str().unwrap_or_default().contains("human admin"));

    let calls = calls(&report);
    let created = ok(&calls[0]);
    assert_eq!(created["status"], json!("pending_approval"));
    assert_eq!(created["over_limit"], json!(true));
    let draft_id = created["draft_id"].as_str().expect("draft_id").to_owned();
    refused(&calls[1], "forbidden");
    let mine = ok(&calls[2]);
    assert!(mine["drafts"].as_array().expect("drafts").iter().any(|d| d["draft_id"] == json!(draft_id)), "{mine}");
    let boxes = ok(&calls[3]);
    assert!(boxes["boxes"].as_array().expect("boxes").iter().any(|b| b["box_type"] == json!(existing)), "{boxes}");
    let feasibility = ok(&calls[4]);
    assert_eq!(feasibility["feasible"], json!(false), "{feasibility}");
    assert_eq!(feasibility["available_operations"], json!(["file:read"]));
    assert_eq!(feasibility["missing_capabilities"], json!(["shell:exec"]));
    refused(&calls[5], "box_not_found");
    refused(&calls[6], "box_manifest_validation");

    // The draft is there over REST, pending, with the purpose and criteria it was given.
    let rest = sys.get(&format!("/api/v1/boxes/box-drafts/{draft_id}"), &sys.agent);
    assert_eq!(rest.status, 200, "{}", rest.raw);
    assert_eq!(rest.body["status"], json!("pending_approval"));
    assert_eq!(rest.body["purpose"], json!("Checks invoices\n\n## Success criteria\n- no invoice missed"));
    assert_eq!(rest.body["requested_by"], json!("agent"));

    // The agent follows its draft by id; the admin sees it pending and may read it too.
    let by_id =
        calls_of(sys, transport, &sys.agent, json!([["atasira_get_draft", {"draft_id": draft_id}], ["atasira_get_draft", {"draft_id": "mcp-unknown"}]]));
    assert_eq!(ok(&by_id[0])["status"], json!("pending_approval"));
    refused(&by_id[1], "draft_not_found");
    let admin = calls_of(
        sys,
        transport,
        &sys.admin,
        json!([["atasira_pending_drafts", {}], ["atasira_get_draft", {"draft_id": draft_id}], ["atasira_pending_tool_requests", {}], ["atasira_stop_worker", {"worker_id": "wkr_unknown"}]]),
    );
    assert_eq!(ok(&admin[2])["requests"], json!([]), "no Worker waits for a decision");
    refused(&admin[3], "worker_not_found");
    refused(&calls_of(sys, transport, &sys.agent, json!([["atasira_pending_tool_requests", {}]]))[0], "forbidden");
    let pending = ok(&admin[0]);
    let listed = pending["drafts"].as_array().expect("drafts").iter().find(|d| d["draft_id"] == json!(draft_id)).expect("the draft is pending");
    assert_eq!(listed["over_limit_ops"], json!(["shell:exec"]));
    assert_eq!(ok(&admin[1])["draft_id"], json!(draft_id));

    // R-CHANGE-1: the agent, made the existing Box's primary, asks for shell:exec; it is a
    // pending change request with its diff; without the assignment it was refused.
    let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
    let ask = json!([["atasira_request_change", {"box_id": box_id, "patch": {"os_operations": ["file:read", "shell:exec"]}}]]);
    refused(&calls_of(sys, transport, &sys.agent, ask.clone())[0], "forbidden");
    let assign = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "primary"}));
    assert_eq!(assign.status, 200, "{}", assign.raw);
    let asked = calls_of(sys, transport, &sys.agent, ask);
    let change = ok(&asked[0]);
    assert_eq!(
        (change["status"].as_str(), change["over_limit"].as_bool(), change["box_id"].as_str()),
        (Some("pending_approval"), Some(true), Some(box_id.as_str())),
        "{change}"
    );
    assert_eq!(change["added"], json!(["os_operations: shell:exec"]));
    let pending = sys.pending();
    assert!(pending.iter().any(|d| d["draft_id"] == change["draft_id"] && d["kind"] == "change"), "{pending:?}");
}

fn calls_of(sys: &System, transport: Transport, token: &str, calls_: Value) -> Vec<Value> {
    calls(&session(sys, transport, token, &calls_))
}

#[test]
fn r_mcp_1_embedded_stdio_and_streamable_http() {
    let sys = System::start(Mode::Embedded);
    scenario(&sys, Transport::Stdio);
    scenario(&sys, Transport::Http);
}

#[test]
fn r_mcp_1_cluster_streamable_http() {
    let sys = System::start(Mode::Cluster);
    scenario(&sys, Transport::Http);
}

#[test]
fn r_mcp_1_http_needs_a_known_token() {
    let sys = System::start(Mode::Embedded);
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let accept = [("Accept", "application/json, text/event-stream")];
    for token in [None, Some("atasira_pat_unknown")] {
        let a = http("POST", &sys.url("/mcp"), token, &accept, Some(initialize.to_string().as_bytes()));
        assert_eq!(a.status, 401, "{}", a.raw);
        assert_eq!(a.body["error"], json!("unauthenticated"), "{}", a.raw);
    }
    let a = http("POST", &sys.url("/mcp"), Some(&sys.agent), &accept, Some(initialize.to_string().as_bytes()));
    assert_eq!(a.status, 200, "{}", a.raw);
    // The Python client gets no session with an unknown token.
    for transport in [Transport::Http, Transport::Stdio] {
        let report = session(&sys, transport, "atasira_pat_unknown", &json!([["atasira_list_boxes", {}]]));
        match transport {
            Transport::Http => assert!(report["error"].as_str().is_some_and(|e| e.contains("401")), "{report}"),
            // stdio starts (the token is the gateway's to judge) and every call is refused.
            Transport::Stdio => refused(&calls(&report)[0], "unauthenticated"),
        }
    }
    // /mcp is not part of the REST API's document.
    let doc = http("GET", &sys.url("/api/v1/openapi.json"), None, &[], None);
    assert!(doc.body["paths"].as_object().expect("paths").keys().all(|p| !p.contains("mcp")));
}

#[test]
fn r_mcp_1_stdio_says_what_is_missing() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(atasira_bin())
            .args(args)
            .env_remove("ATASIRA_PAT")
            .env_remove("ATASIRA_BFF_URL")
            .envs(env.iter().copied())
            .output_within(SUBPROCESS_LIMIT)
            .expect("atasira runs");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, out, err) = run(&["mcp"], &[("ATASIRA_PAT", "x")]);
    assert_eq!((code, out.as_str()), (Some(2), ""), "{err}");
    assert!(err.contains("ATASIRA_BFF_URL") && err.contains("--url"), "{err}");
    let (code, out, err) = run(&["mcp"], &[("ATASIRA_BFF_URL", "http://127.0.0.1:9")]);
    assert_eq!((code, out.as_str()), (Some(2), ""), "{err}");
    assert!(err.contains("ATASIRA_PAT") && err.contains("--token"), "{err}");
    let (code, help, _) = run(&["mcp", "--help"], &[]);
    assert_eq!(code, Some(0));
    for needle in ["--url", "--token", "ATASIRA_BFF_URL", "ATASIRA_PAT", "atasira_create_box_draft", "approve"] {
        assert!(help.contains(needle), "mcp --help lacks {needle}:\n{help}");
    }
}

/// An MCP client that keeps its event stream open does not hold up a graceful stop.
#[test]
fn r_mcp_1_an_open_stream_does_not_hold_the_gateway() {
    let mut sys = System::start(Mode::Embedded);
    let accept = [("Accept", "application/json, text/event-stream")];
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let a = http("POST", &sys.url("/mcp"), Some(&sys.agent), &accept, Some(initialize.to_string().as_bytes()));
    assert_eq!(a.status, 200, "{}", a.raw);
    let session = a.header("mcp-session-id").expect("a session").to_owned();
    let session_header = [("Accept", "application/json, text/event-stream"), ("Mcp-Session-Id", session.as_str())];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let a = http("POST", &sys.url("/mcp"), Some(&sys.agent), &session_header, Some(initialized.to_string().as_bytes()));
    assert_eq!(a.status, 202, "{}", a.raw);
    // The server's stream: it stays open until the server ends it. Once its head has
    // arrived, the server holds it open.
    use std::io::{Read, Write};
    let host = sys.base_url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let mut stream = std::net::TcpStream::connect(&host).expect("connect");
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).expect("a read timeout");
    write!(
        stream,
        "GET /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\n\r\n",
        sys.agent
    )
    .expect("sent");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        stream.read_exact(&mut byte).expect("the stream's head");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    let dev = sys.proc("atasira dev");
    dev.interrupt();
    assert!(dev.wait_exit(std::time::Duration::ZERO).is_some(), "the gateway did not stop with an MCP stream open:\n{}", dev.stderr_text());
    // and the stream ended with it
    let mut rest = Vec::new();
    let ended = stream.read_to_end(&mut rest);
    assert!(ended.is_ok(), "the stream did not end: {ended:?}");
}

#[test]
fn r_arch_15_a_user_holds_a_bounded_number_of_mcp_sessions() {
    // given a user that opened as many MCP sessions as it may
    let sys = System::start(Mode::Embedded);
    let accept = [("Accept", "application/json, text/event-stream")];
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let open = |token: &str| http("POST", &sys.url("/mcp"), Some(token), &accept, Some(initialize.to_string().as_bytes()));
    let mut sessions = Vec::new();
    for _ in 0..8 {
        let a = open(&sys.agent);
        assert_eq!(a.status, 200, "{}", a.raw);
        sessions.push(a.header("mcp-session-id").expect("a session").to_owned());
    }
    // when it opens one more; then 429, and another user still gets one
    let refused = open(&sys.agent);
    assert_eq!((refused.status, refused.body["error"].as_str()), (429, Some("rate_limited")), "{}", refused.raw);
    assert_eq!(open(&sys.admin).status, 200);
    // and once it ends one, it may open another
    let end = http("DELETE", &sys.url("/mcp"), Some(&sys.agent), &[("Mcp-Session-Id", sessions[0].as_str())], None);
    assert!(end.status < 300, "{}", end.raw);
    assert_eq!(open(&sys.agent).status, 200);
}
