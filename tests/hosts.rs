//! Execution hosts end to end (R-HOST-1, R-HOST-2, R-DECIDE-1), in embedded mode (the host
//! `atasira dev --runner` runs in-process) and as a cluster (`atasira serve host` processes
//! with their own NATS credentials and no database), with the example runner the
//! repository ships: a launched Worker is claimed once, runs in its workspace, logs and
//! returns a result; its Box is `running` meanwhile; every tool call is decided against the
//! approved grant and every denial is a ledger row; kill, stop and more input reach it; a
//! host that dies loses its Workers and nobody runs them twice.

use std::time::{Duration, Instant};

use atasira_contracts::{Named, envelope, subjects, v1};
use atasira_tests::fixtures::{block_on, eventually};
use atasira_tests::harness::{Mode, System, http, reporting_server_errors};
use prost::Message as _;
use serde_json::{Value, json};

/// How long a host's heartbeat holds its Workers in these tests.
const LEASE: &str = "2s";

/// The system in `mode` with one execution host (`h1`) running the example runner.
fn start(mode: Mode) -> System {
    start_running(mode, &atasira_tests::harness::example_runner())
}

fn start_running(mode: Mode, runner: &str) -> System {
    // Embedded: the host `dev` runs in-process, named as the cluster's first.
    let env = [
        ("ATASIRA_HOST_LEASE", LEASE.to_owned()),
        ("ATASIRA_RUNNER", runner.to_owned()),
        ("ATASIRA_STOP_GRACE", "1s".to_owned()),
        ("ATASIRA_HOST_NAME", "h1".to_owned()),
    ];
    let mut sys = System::start_with(mode, &env);
    sys.start_host("h1", &host_env(runner));
    sys
}

fn host_env(runner: &str) -> Vec<(&'static str, String)> {
    vec![("ATASIRA_RUNNER", runner.to_owned()), ("ATASIRA_STOP_GRACE", "1s".to_owned())]
}

/// A Box whose grant the tests probe: files read under /data, written in the workspace;
/// the network filtered to example.com; a shell that may run git only (no approval asked
/// outside it). Its id.
fn activate(sys: &System, box_type: &str) -> String {
    let draft = json!({
        "box_type": box_type,
        "name": box_type,
        "purpose": "Write release notes.",
        "os_operations": ["file:read", "file:write", "shell:exec", "browser:navigate"],
        "file_access": ["read:/data/*"],
        "url_allowlist": ["example.com"],
        "allow_network": true,
    });
    let id = sys.draft(&draft);
    let a = sys.approve(&id, &sys.admin, true);
    assert_eq!(a.status, 200, "{:?}: {}", sys.mode, a.raw);
    let box_id = a.body["box_id"].as_str().expect("box_id").to_owned();
    // Its shell's commands are part of its grant: a change request another admin approves.
    let shell = json!({"shell": {"allowed_commands": ["git"], "require_approval_outside_allowlist": false}});
    let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &shell);
    assert_eq!(asked.status, 201, "{}", asked.raw);
    let bob = sys.token("bob", "admin", "human");
    let approved = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
    assert_eq!(approved.body["status"], json!("active"), "{}", approved.raw);
    box_id
}

/// Launches a Worker whose input is `lines` for the example runner; its id.
fn launch(sys: &System, box_id: &str, launch_id: &str, lines: &[&str]) -> String {
    let body = json!({"launch_id": launch_id, "input": [{"kind": "text", "value": lines.join("\n")}]});
    let a = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &body);
    assert_eq!(a.status, 201, "{:?}: {}", sys.mode, a.raw);
    a.body["worker_id"].as_str().expect("worker_id").to_owned()
}

fn worker(sys: &System, worker_id: &str) -> Value {
    let a = sys.get(&format!("/api/v1/workers/{worker_id}"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body
}

/// Waits until the Worker is in `state`; its answer.
fn reaches(sys: &System, worker_id: &str, state: &str, within: Duration) -> Value {
    eventually(&format!("Worker {worker_id} {state}"), within, || {
        let w = worker(sys, worker_id);
        if w["state"] == state { Ok(w) } else { Err(format!("{}", w["state"])) }
    })
}

fn box_state(sys: &System, box_id: &str) -> String {
    let a = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.admin);
    a.body["state"].as_str().or_else(|| a.body["summary"]["state"].as_str()).unwrap_or_default().to_owned()
}

fn listed_running(sys: &System) -> Vec<String> {
    let a = sys.get("/api/v1/boxes?state=running", &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["boxes"].as_array().expect("boxes").iter().filter_map(|b| b["box_id"].as_str().map(str::to_owned)).collect()
}

fn ledger(sys: &System, action: &str) -> Vec<Value> {
    let a = sys.get(&format!("/api/v1/audit?action={action}&limit=100"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["rows"].as_array().cloned().unwrap_or_default()
}

fn lines(w: &Value) -> Vec<String> {
    w["log"].as_array().expect("log").iter().filter_map(|l| l.as_str().map(str::to_owned)).collect()
}

#[test]
fn r_host_1_r_decide_1_a_worker_runs_on_a_host_its_calls_are_decided_and_its_box_runs_meanwhile() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let mut sys = start(mode);
        let box_id = activate(&sys, "release-notes");
        let worker_id = launch(
            &sys,
            &box_id,
            "notes-1",
            &[
                "log: hello from the runner",
                r#"tool: {"tool": "file:write", "input": {"path": "/etc/cron.d/evil"}}"#,
                r#"tool: {"tool": "browser:navigate", "input": {"url": "https://evil.test/"}}"#,
                r#"tool: {"tool": "shell:exec", "input": {"command": "rm -rf /"}}"#,
                r#"tool: {"tool": "shell:exec", "input": {"command": "git status"}}"#,
                r#"tool: {"tool": "file:write", "input": {"path": "notes.md"}}"#,
                "sleep: 3",
                "result: the notes are written",
                "done",
            ],
        );
        // While it runs, its Box is running.
        let running = reaches(&sys, &worker_id, "running", Duration::from_secs(20));
        assert_eq!(running["host"], json!("h1"), "{mode:?}: {running}");
        assert_eq!(listed_running(&sys), std::slice::from_ref(&box_id), "{mode:?}");
        assert_eq!(box_state(&sys, &box_id), "running", "{mode:?}");

        let done = reaches(&sys, &worker_id, "succeeded", Duration::from_secs(30));
        assert_eq!((done["result"].as_str(), done["exit_code"].as_i64()), (Some("the notes are written\n"), Some(0)), "{mode:?}: {done}");
        let log = lines(&done);
        assert!(log.iter().any(|l| l == "hello from the runner"), "{mode:?}: {log:?}");
        let refused: Vec<&String> = log.iter().filter(|l| l.starts_with("refused: ")).collect();
        assert_eq!(refused.len(), 3, "{mode:?}: {log:?}");
        assert!(refused[0].contains("file_access") && refused[1].contains("url_allowlist") && refused[2].contains("shell.allowed_commands"), "{refused:?}");
        assert_eq!(log.iter().filter(|l| l.starts_with("allowed: ")).count(), 2, "{mode:?}: {log:?}");
        // Every denial is a ledger row naming the rule; its run too.
        let denied = eventually("three denials on the ledger", Duration::from_secs(10), || {
            let rows = ledger(&sys, "worker.tool_denied");
            if rows.len() >= 3 && !ledger(&sys, "worker.finish").is_empty() { Ok(rows) } else { Err(format!("{rows:?}")) }
        });
        let details: Vec<&str> = denied.iter().filter_map(|r| r["detail"].as_str()).collect();
        assert_eq!(details.len(), 3, "{mode:?}: {denied:?}");
        for (rule, detail) in ["file_access", "url_allowlist", "shell.allowed_commands"].iter().zip(&details) {
            assert!(detail.contains(rule), "{detail}");
        }
        for action in ["worker.claim", "worker.run", "worker.finish"] {
            assert_eq!(ledger(&sys, action).len(), 1, "{mode:?}: {action}");
        }
        eventually("the Box idle again", Duration::from_secs(10), || if box_state(&sys, &box_id) == "idle" { Ok(()) } else { Err(box_state(&sys, &box_id)) });
        assert!(listed_running(&sys).is_empty());
        // Nothing a Worker's reader sees holds its workspace or tool scope.
        let text = done.to_string();
        for internal in ["workspaces", "tool_scope", "bnd_", &sys.data_dir().display().to_string()] {
            assert!(!text.contains(internal), "{mode:?}: the Worker's answer mentions {internal:?}: {text}");
        }
        // Allows are counted where the host runs (its probe port; in-process, dev's).
        let probe = if mode == Mode::Embedded { sys.probe_url("atasira dev") } else { sys.probe_url("serve host h1") };
        let metrics = http("GET", &format!("{probe}/metrics"), None, &[], None).raw;
        let counted = |decision: &str| {
            let prefix = format!("atasira_tool_decisions_total{{decision=\"{decision}\"}} ");
            metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse::<f64>().ok())
        };
        assert_eq!((counted("allow"), counted("deny")), (Some(2.0), Some(3.0)), "{mode:?}: {metrics}");
        // A restart and a rebuild keep every state.
        sys.restart_with(&[
            ("ATASIRA_HOST_LEASE", LEASE.to_owned()),
            ("ATASIRA_RUNNER", atasira_tests::harness::example_runner()),
            ("ATASIRA_HOST_NAME", "h1".to_owned()),
        ]);
        let (code, _, err) = sys.rebuild();
        assert_eq!(code, 0, "{err}");
        let again = worker(&sys, &worker_id);
        for key in ["state", "host", "result", "exit_code", "log"] {
            assert_eq!(again[key], done[key], "{mode:?}: {key} after restart and rebuild");
        }
    }
}

#[test]
fn r_host_2_kill_stop_and_more_input_reach_a_running_worker_and_stopping_its_box_stops_it() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let sys = start(mode);
        let box_id = activate(&sys, "watcher");
        let first = launch(&sys, &box_id, "w-1", &["log: waiting", "sleep: 60", "result: never"]);
        let second = launch(&sys, &box_id, "w-2", &["log: waiting for more input"]);
        reaches(&sys, &first, "running", Duration::from_secs(20));
        reaches(&sys, &second, "running", Duration::from_secs(20));

        let asked = Instant::now();
        let killed = sys.post(&format!("/api/v1/workers/{first}/kill"), &sys.admin, &json!({}));
        // Asked, or already done by the time the answer is read.
        let asked_or_done = killed.body["stop_requested"] == "kill" || killed.body["state"] == "killed";
        assert!(killed.status == 200 && asked_or_done, "{mode:?}: {}", killed.raw);
        let ended = reaches(&sys, &first, "killed", Duration::from_secs(10));
        eprintln!("{mode:?}: kill took {:?} from request to recorded end", asked.elapsed());
        assert!(ended["result"].as_str().is_some_and(|r| !r.contains("never")), "{ended}");
        let again = sys.post(&format!("/api/v1/workers/{first}/kill"), &sys.admin, &json!({}));
        assert_eq!((again.status, again.body["error"].as_str()), (409, Some("worker_ended")), "{}", again.raw);

        // Later input reaches the Worker's stdin and its transcript.
        let more = sys.post(
            &format!("/api/v1/workers/{second}/input"),
            &sys.admin,
            &json!({"input": [{"kind": "text", "value": "result: more input arrived\ndone"}]}),
        );
        assert_eq!(more.status, 200, "{mode:?}: {}", more.raw);
        assert_eq!(more.body["transcript"].as_array().map(Vec::len), Some(2), "{}", more.raw);
        let done = reaches(&sys, &second, "succeeded", Duration::from_secs(20));
        assert_eq!(done["result"], json!("more input arrived\n"), "{mode:?}: {done}");
        let late = sys.post(&format!("/api/v1/workers/{second}/input"), &sys.admin, &json!({"input": [{"kind": "text", "value": "too late"}]}));
        assert_eq!((late.status, late.body["error"].as_str()), (409, Some("worker_ended")), "{}", late.raw);
        let system = sys.post(&format!("/api/v1/workers/{second}/input"), &sys.admin, &json!({"input": [{"kind": "system", "value": "x"}]}));
        assert_eq!((system.status, system.body["error"].as_str()), (422, Some("invalid_segment")), "{}", system.raw);

        // An agent that is not the Box's primary may not stop a Worker.
        let third = launch(&sys, &box_id, "w-3", &["sleep: 60"]);
        reaches(&sys, &third, "running", Duration::from_secs(20));
        // Pause and resume reach its runner.
        let paused = sys.post(&format!("/api/v1/workers/{third}/pause"), &sys.admin, &json!({}));
        assert_eq!(paused.status, 200, "{}", paused.raw);
        reaches(&sys, &third, "paused", Duration::from_secs(10));
        assert_eq!(sys.post(&format!("/api/v1/workers/{third}/resume"), &sys.agent, &json!({})).status, 403);
        assert_eq!(sys.post(&format!("/api/v1/workers/{third}/resume"), &sys.admin, &json!({})).status, 200);
        reaches(&sys, &third, "running", Duration::from_secs(10));
        let by_agent = sys.post(&format!("/api/v1/workers/{third}/stop"), &sys.agent, &json!({}));
        assert_eq!(by_agent.status, 403, "{}", by_agent.raw);
        // Stopping the Box stops its Workers.
        let stopped = sys.post(&format!("/api/v1/boxes/{box_id}/stop"), &sys.admin, &json!({}));
        assert_eq!(stopped.status, 200, "{}", stopped.raw);
        reaches(&sys, &third, "killed", Duration::from_secs(15));
        eventually("the kill and the Box's stop on the ledger", Duration::from_secs(10), || {
            let rows = ledger(&sys, "worker.stop");
            if rows.len() == 2 { Ok(()) } else { Err(format!("{rows:?}")) }
        });
    }
}

#[test]
fn r_host_1_a_host_that_dies_loses_its_workers_after_its_lease_and_no_host_runs_them_again() {
    let mut sys = start(Mode::Cluster);
    let box_id = activate(&sys, "long-runner");
    let worker_id = launch(&sys, &box_id, "long-1", &["log: started the long job", "sleep: 60", "result: never"]);
    reaches(&sys, &worker_id, "running", Duration::from_secs(20));
    // Its start is reported (a log line) before the host dies: what the loss keeps.
    eventually("the start in the Worker's log", Duration::from_secs(20), || {
        let w = worker(&sys, &worker_id);
        if lines(&w).iter().any(|l| l.starts_with("runner: Worker")) { Ok(()) } else { Err(w.to_string()) }
    });
    sys.kill("serve host h1");
    sys.start_host("h2", &host_env(&atasira_tests::harness::example_runner()));
    let lost = reaches(&sys, &worker_id, "lost", Duration::from_secs(20));
    assert_eq!(lost["host"], json!("h1"), "{lost}");
    eventually("the loss on the ledger", Duration::from_secs(10), || if ledger(&sys, "worker.lost").len() == 1 { Ok(()) } else { Err(String::new()) });
    // h2 takes new Workers and never the lost one.
    let next = launch(&sys, &box_id, "long-2", &["result: ran on the other host", "done"]);
    let done = reaches(&sys, &next, "succeeded", Duration::from_secs(20));
    assert_eq!(done["host"], json!("h2"));
    std::thread::sleep(Duration::from_secs(2));
    let still = worker(&sys, &worker_id);
    assert_eq!((still["state"].as_str(), still["host"].as_str()), (Some("lost"), Some("h1")), "{still}");
    assert_eq!(lines(&still).iter().filter(|l| l.starts_with("runner: Worker")).count(), 1, "it started once: {still}");
    assert_eq!(ledger(&sys, "worker.claim").len(), 2, "one claim per Worker");
}

fn urls(sys: &System) -> Vec<async_nats::ServerAddr> {
    sys.nats_urls().split(',').map(|u| u.parse().expect("a NATS address")).collect()
}

/// A request of execution host `name`, connected with its own NATS credentials.
fn as_host<M: Named>(sys: &System, name: &str, subject: &str, message: &M) -> Result<v1::Reply, String> {
    block_on(async {
        let client = sys.nats_options(&format!("host-{name}")).connect(urls(sys).as_slice()).await.map_err(|e| e.to_string())?;
        let env = envelope(message, "test", "");
        let answer = tokio::time::timeout(Duration::from_secs(5), client.request(subject.to_owned(), env.encode_to_vec().into())).await;
        match answer {
            Ok(Ok(msg)) => v1::Reply::decode(&msg.payload[..]).map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer".to_owned()),
        }
    })
}

fn error_code(reply: &v1::Reply) -> Option<v1::ErrorCode> {
    match &reply.result {
        Some(v1::reply::Result::Error(e)) => v1::ErrorCode::try_from(e.code).ok(),
        _ => None,
    }
}

#[test]
fn r_host_2_a_host_speaks_only_for_its_own_workers_and_publishes_no_channel() {
    let mut sys = start(Mode::Cluster);
    sys.start_host("h2", &host_env(&atasira_tests::harness::example_runner()));
    let box_id = activate(&sys, "guarded");
    // An admin follows the Box's channels over NATS; a member may not.
    let rt = atasira_tests::fixtures::runtime();
    let (admin_client, mut results, mut logs) = rt.block_on(async {
        let client = atasira_tests::harness::pat_options(&sys.admin).connect(urls(&sys).as_slice()).await.expect("an admin connects");
        let results = client.subscribe(subjects::channel("guarded", "heartbeat")).await.expect("subscribes");
        let logs = client.subscribe(subjects::channel("guarded", "log")).await.expect("subscribes");
        client.flush().await.expect("flush");
        (client, results, logs)
    });
    let worker_id = launch(&sys, &box_id, "g-1", &["log: guarded and running", "sleep: 60"]);
    let running = reaches(&sys, &worker_id, "running", Duration::from_secs(20));
    rt.block_on(async {
        use futures::StreamExt as _;
        for (what, sub) in [("heartbeat", &mut results), ("log", &mut logs)] {
            let msg = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.ok().flatten().unwrap_or_else(|| panic!("no {what} on the channel"));
            let body: Value = serde_json::from_slice(&msg.payload).expect("JSON");
            assert_eq!(body["worker_id"], json!(worker_id), "{what}: {body}");
        }
        let (options, mut errors) = reporting_server_errors(atasira_tests::harness::pat_options(&sys.agent));
        let member = options.connect(urls(&sys).as_slice()).await.expect("a member connects");
        let _ = member.subscribe(subjects::channel("guarded", "log")).await;
        member.flush().await.expect("flush");
        let refused = tokio::time::timeout(Duration::from_secs(5), errors.recv()).await.ok().flatten().unwrap_or_default();
        assert!(refused.to_lowercase().contains("permissions violation"), "a member may not follow channels: {refused:?}");
    });
    drop(admin_client);
    let (owner, other) = if running["host"] == "h1" { ("h1", "h2") } else { ("h2", "h1") };

    // The other host may not report on it, fetch its bundle or resolve its binding.
    let report = v1::ReportWorker {
        worker_id: worker_id.clone(),
        report: Some(v1::report_worker::Report::Finished(v1::WorkerEnd { state: "succeeded".into(), ..Default::default() })),
    };
    let reply = as_host(&sys, other, &subjects::host_request(other, subjects::RUNTIME_REGISTRY), &report).expect("an answer");
    assert_eq!(error_code(&reply), Some(v1::ErrorCode::Forbidden), "{reply:?}");
    let resolve = v1::ResolveBinding { handle: format!("bnd_{}", "0".repeat(32)), worker_id: worker_id.clone() };
    let reply = as_host(&sys, other, &subjects::host_request(other, subjects::PROVISIONER), &resolve).expect("an answer");
    assert!(error_code(&reply).is_some(), "{reply:?}");
    eventually("the refusal on the ledger", Duration::from_secs(10), || {
        let violations = ledger(&sys, "security_violation");
        if violations.iter().any(|r| r["detail"].as_str().is_some_and(|d| d.contains("host_not_running_worker"))) {
            Ok(())
        } else {
            Err(format!("{violations:?}"))
        }
    });
    assert_eq!(worker(&sys, &worker_id)["state"], json!("running"), "nothing changed");

    // Nor speak as the owner, nor publish on the Box's channels: NATS refuses.
    block_on(async {
        let (options, mut errors) = reporting_server_errors(sys.nats_options(&format!("host-{other}")));
        let client = options.connect(urls(&sys).as_slice()).await.expect("connects");
        let env = envelope(&report, "test", "");
        let _ = client.publish(subjects::host_request(owner, subjects::RUNTIME_REGISTRY), env.encode_to_vec().into()).await;
        let _ = client.publish(subjects::channel("guarded", "result"), "forged".into()).await;
        client.flush().await.expect("flush");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            match tokio::time::timeout(Duration::from_secs(5), errors.recv()).await {
                Ok(Some(e)) => seen.push(e),
                _ => break,
            }
        }
        assert_eq!(seen.len(), 2, "both refused: {seen:?}");
        assert!(seen.iter().all(|e| e.to_lowercase().contains("permissions violation")), "{seen:?}");
    });
    assert_eq!(worker(&sys, &worker_id)["state"], json!("running"));
    // A host asks nothing else of the services (it acts for no user).
    let reply =
        as_host(&sys, other, &subjects::host_request(other, subjects::RUNTIME_REGISTRY), &v1::GetWorker { worker_id: worker_id.clone(), ..Default::default() })
            .expect("answer");
    assert_eq!(error_code(&reply), Some(v1::ErrorCode::Forbidden), "{reply:?}");
}

#[test]
fn r_decide_1_a_workers_credential_opens_its_own_decisions_and_nothing_else() {
    // A runner that shows the test what a Worker is given, then waits.
    let runner = "env > worker.env; cat > worker.stdin";
    let sys = start_running(Mode::Embedded, runner);
    let box_id = activate(&sys, "credential");
    let worker_id = launch(&sys, &box_id, "c-1", &["hello"]);
    reaches(&sys, &worker_id, "running", Duration::from_secs(20));
    let workspace = sys.data_dir().join("workspaces").join("credential");
    let env = eventually("the runner's environment", Duration::from_secs(10), || {
        std::fs::read_to_string(workspace.join("worker.env"))
            .map_err(|e| e.to_string())
            .and_then(|t| if t.contains("ATASIRA_WORKER_TOKEN") { Ok(t) } else { Err(t) })
    });
    let var = |name: &str| env.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).unwrap_or_default().to_owned();
    assert_eq!(var("ATASIRA_WORKER_ID"), worker_id);
    let (url, token) = (var("ATASIRA_DECIDE_URL"), var("ATASIRA_WORKER_TOKEN"));
    assert!(!env.contains("ATASIRA_DATABASE_URL") && !env.contains("atasira_pat_"), "a clean environment: {env}");
    // stdin: the context, then the input (cat writes it a moment after the environment).
    let stdin = eventually("the runner's input", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(workspace.join("worker.stdin")).unwrap_or_default();
        if text.contains("</input>") { Ok(text) } else { Err(text) }
    });
    assert!(stdin.starts_with("<box_context box_type=\"credential\""), "{stdin}");
    assert!(stdin.contains("<input>\n<segment kind=\"text\">hello</segment>\n</input>"), "{stdin}");

    // Its credential gets its own decisions...
    let call = json!({"tool_name": "file:write", "tool_input": {"path": "notes.md"}});
    let a = http("POST", &url, Some(&token), &[("Content-Type", "application/json")], Some(call.to_string().as_bytes()));
    assert_eq!((a.status, a.body["decision"].as_str(), a.body["rule"].as_str()), (200, Some("allow"), Some("tools")), "{}", a.raw);
    let a = http("POST", &url, Some(&token), &[], Some(json!({"tool": "Bash", "input": {"command": "ls"}}).to_string().as_bytes()));
    assert_eq!(a.body["decision"], json!("deny"), "{}", a.raw);
    // ...and nothing else: not the REST API, not with another credential.
    for path in [format!("/api/v1/workers/{worker_id}"), "/api/v1/boxes".to_owned()] {
        assert_eq!(sys.get(&path, &token).status, 401, "{path}");
    }
    // another credential: the last character changed (to one it is not)
    let other = if token.ends_with('0') { '1' } else { '0' };
    let a = http("POST", &url, Some(&format!("{}{other}", &token[..token.len() - 1])), &[], Some(call.to_string().as_bytes()));
    assert_eq!((a.status, a.body["error"].as_str()), (401, Some("unauthenticated")), "{}", a.raw);
    assert_eq!(http("POST", &url, None, &[], Some(call.to_string().as_bytes())).status, 401);
    // `atasira decide`, as an agent CLI's hook calls it.
    let out = std::process::Command::new(atasira_tests::harness::atasira_bin())
        .arg("decide")
        .env("ATASIRA_DECIDE_URL", &url)
        .env("ATASIRA_WORKER_TOKEN", &token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().expect("stdin").write_all(br#"{"tool": "file:write", "input": {"path": "/etc/shadow"}}"#)?;
            child.wait_with_output()
        })
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "denied: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("file_access"), "{}", String::from_utf8_lossy(&out.stderr));
    // Its denials are on the ledger.
    eventually(
        "two denials on the ledger",
        Duration::from_secs(10),
        || if ledger(&sys, "worker.tool_denied").len() == 2 { Ok(()) } else { Err(String::new()) },
    );
}

#[test]
fn r_decide_2_a_call_outside_the_allowlist_waits_for_a_human_admin_and_learns_the_decision() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let runner = atasira_tests::harness::example_runner();
        let env = [
            ("ATASIRA_HOST_LEASE", LEASE.to_owned()),
            ("ATASIRA_RUNNER", runner.clone()),
            ("ATASIRA_HOST_NAME", "h1".to_owned()),
            ("ATASIRA_ASK_TTL", "6s".to_owned()),
        ];
        let mut sys = System::start_with(mode, &env);
        sys.start_host("h1", &host_env(&runner));
        let box_id = activate(&sys, "builder");
        // Outside git, the shell asks a human admin.
        let shell = json!({"shell": {"allowed_commands": ["git"], "require_approval_outside_allowlist": true}});
        let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &shell);
        assert_eq!(asked.status, 201, "{}", asked.raw);
        let bob = sys.token("bob", "admin", "human");
        assert_eq!(sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true).body["status"], json!("active"));
        let make = r#"tool: {"tool": "shell:exec", "input": {"command": "make build"}}"#;
        let pending = |sys: &System, worker_id: &str| {
            eventually("a pending tool-use request", Duration::from_secs(20), || {
                let a = sys.get("/api/v1/tool-requests", &sys.admin);
                let found = a.body["requests"].as_array().and_then(|rs| rs.iter().find(|r| r["worker_id"] == worker_id).cloned());
                found.ok_or_else(|| a.raw.clone())
            })
        };

        // Approved: the call goes ahead.
        let first = launch(&sys, &box_id, "b-1", &[make, "result: built", "done"]);
        let request = pending(&sys, &first);
        assert_eq!(
            (request["tool"].as_str(), request["rule"].as_str(), request["state"].as_str()),
            (Some("shell:exec"), Some("shell.allowed_commands"), Some("pending")),
            "{request}"
        );
        assert_eq!((request["input"]["command"].as_str(), request["launched_by"].as_str()), (Some("make build"), Some("admin")), "{request}");
        let id = request["request_id"].as_str().expect("request_id").to_owned();
        let by_launcher = sys.post(&format!("/api/v1/tool-requests/{id}/approve"), &sys.admin, &json!({}));
        assert_eq!(by_launcher.status, 403, "the Worker's launcher may not decide: {}", by_launcher.raw);
        assert_eq!(sys.post(&format!("/api/v1/tool-requests/{id}/approve"), &sys.agent, &json!({})).status, 403, "nor an agent");
        assert_eq!(sys.post("/api/v1/tool-requests/tur_nope/approve", &bob, &json!({})).status, 404);
        let approved = sys.post(&format!("/api/v1/tool-requests/{id}/approve"), &bob, &json!({}));
        assert_eq!(
            (approved.status, approved.body["state"].as_str(), approved.body["decided_by"].as_str()),
            (200, Some("approved"), Some("bob")),
            "{}",
            approved.raw
        );
        let again = sys.post(&format!("/api/v1/tool-requests/{id}/reject"), &bob, &json!({"reason": "changed my mind"}));
        assert_eq!((again.status, again.body["error"].as_str()), (409, Some("tool_request_not_pending")), "one decision: {}", again.raw);
        let done = reaches(&sys, &first, "succeeded", Duration::from_secs(20));
        assert!(lines(&done).iter().any(|l| l.starts_with("allowed: ") && l.contains("make build")), "{mode:?}: {done}");

        // Rejected: the Worker learns why.
        let second = launch(&sys, &box_id, "b-2", &[make, "done"]);
        let id = pending(&sys, &second)["request_id"].as_str().expect("request_id").to_owned();
        let rejected = sys.post(&format!("/api/v1/tool-requests/{id}/reject"), &bob, &json!({"reason": "not on a Friday"}));
        assert_eq!(rejected.body["state"], json!("rejected"), "{}", rejected.raw);
        let done = reaches(&sys, &second, "succeeded", Duration::from_secs(20));
        assert!(lines(&done).iter().any(|l| l.starts_with("refused: ") && l.contains("rejected by bob") && l.contains("not on a Friday")), "{mode:?}: {done}");

        // Nobody decides in time: denied.
        let third = launch(&sys, &box_id, "b-3", &[make, "done"]);
        let id = pending(&sys, &third)["request_id"].as_str().expect("request_id").to_owned();
        let done = reaches(&sys, &third, "succeeded", Duration::from_secs(30));
        assert!(lines(&done).iter().any(|l| l.starts_with("refused: ") && l.contains("no human admin decided in time")), "{mode:?}: {done}");
        let late = sys.post(&format!("/api/v1/tool-requests/{id}/approve"), &bob, &json!({}));
        assert_eq!((late.status, late.body["error"].as_str()), (409, Some("tool_request_not_pending")), "{}", late.raw);
        let expired = sys.get("/api/v1/tool-requests?state=expired", &sys.admin);
        assert_eq!(expired.body["requests"].as_array().map(Vec::len), Some(1), "{}", expired.raw);

        // Every ask and every decision is a ledger row.
        eventually("the asks and decisions on the ledger", Duration::from_secs(10), || {
            let counts: Vec<usize> =
                ["worker.tool_ask", "worker.tool_approve", "worker.tool_reject", "worker.tool_expire"].iter().map(|a| ledger(&sys, a).len()).collect();
            if counts == [3, 1, 1, 1] { Ok(()) } else { Err(format!("{counts:?}")) }
        });
        let (code, out, _) = sys.cli(&["tool-requests", "list", "--state", "all", "--url", &sys.base_url.clone(), "--token", &sys.admin.clone()]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(out.lines().filter(|l| l.starts_with("tur_")).count(), 3, "{out}");
        sys.kill("serve host");
    }
}
