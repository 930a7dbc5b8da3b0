//! Approvers hear about decisions waiting for them, and Boxes notify within their grant
//! (R-NOTIFY-1), in embedded mode and as a cluster: a webhook receiver in the test gets one signed delivery per pending draft,
//! change and tool call waiting for a human; a delivery that met a 500 is tried again; one
//! that keeps failing is dead-lettered after the attempts allowed, listed as dead and
//! recorded on the audit ledger; a failed Worker escalates; a removed webhook gets nothing
//! more. As a cluster, admins subscribed on NATS hear the same announcements, and the
//! Box's `escalation` channel. A Worker's e-mail reaches an SMTP sink in the test when the
//! Box declares the recipient, and is denied, with a ledger row, when it does not.

use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::receiver::{Received, Receiver, SmtpSink};
use atasira_tests::harness::{Mode, System, TempDir, example_runner, http, pat_options};
use serde_json::{Value, json};

/// A webhook receiver: `/ok` answers 204; `/flaky` answers 500 to its first request and
/// 204 after; `/down` always 500.
fn receiver() -> Receiver {
    Receiver::start(|r, before| match r.path.as_str() {
        "/ok" => "204 No Content",
        "/flaky" if before.iter().any(|b| b.path == "/flaky") => "204 No Content",
        _ => "500 Internal Server Error",
    })
}

/// Whether `r` is signed with `secret` over its body, at a recent time.
fn signed_with(r: &Received, secret: &str) -> bool {
    let header = r.header("x-atasira-signature");
    let Some(t) = header.strip_prefix("t=").and_then(|rest| rest.split(',').next()).and_then(|t| t.parse::<i64>().ok()) else { return false };
    (chrono::Utc::now().timestamp() - t).abs() < 300 && atasira_domain::notify::signature(secret, t, &r.body) == header
}

fn register(sys: &System, body: &Value) -> Value {
    let a = sys.post("/api/v1/webhooks", &sys.admin, body);
    assert_eq!(a.status, 201, "{:?}: {}", sys.mode, a.raw);
    a.body
}

/// Waits until the receiver got `n` requests at `path`; them.
fn gets(receiver: &Receiver, path: &str, n: usize) -> Vec<Received> {
    eventually(&format!("{n} deliveries at {path}"), Duration::from_secs(30), || {
        let got = receiver.at(path);
        if got.len() >= n { Ok(got) } else { Err(format!("{} so far", got.len())) }
    })
}

fn deliveries(sys: &System, webhook_id: &str, state: &str) -> Vec<Value> {
    let a = sys.get(&format!("/api/v1/webhooks/{webhook_id}/deliveries?state={state}"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["deliveries"].as_array().cloned().unwrap_or_default()
}

#[test]
fn r_notify_1_approvers_get_one_signed_delivery_per_decision_waiting_retried_and_dead_lettered() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let receiver = receiver();
        let runner = example_runner();
        let env = [
            ("ATASIRA_WEBHOOK_ATTEMPTS", "3".to_owned()),
            ("ATASIRA_WEBHOOK_BACKOFF", "100ms".to_owned()),
            ("ATASIRA_PUBLIC_URL", "https://atasira.example".to_owned()),
            ("ATASIRA_RUNNER", runner.clone()),
            ("ATASIRA_HOST_NAME", "h1".to_owned()),
        ];
        let mut sys = System::start_with(mode, &env);
        sys.start_host("h1", &[("ATASIRA_RUNNER", runner.clone())]);

        // Who may register, and what.
        let agent = sys.post("/api/v1/webhooks", &sys.agent, &json!({"url": receiver.url("/ok")}));
        assert_eq!(agent.status, 403, "{mode:?}: {}", agent.raw);
        let bad = sys.post("/api/v1/webhooks", &sys.admin, &json!({"url": "ftp://x/", "format": "xml", "kinds": ["draft.pending", "nope"]}));
        assert_eq!(bad.status, 422, "{mode:?}: {}", bad.raw);
        let named: Vec<&str> = bad.body["details"].as_array().map(|d| d.iter().filter_map(|e| e["key"].as_str()).collect()).unwrap_or_default();
        assert_eq!(named, ["url", "format", "kinds[1]"], "{mode:?}: {}", bad.raw);

        let ok = register(&sys, &json!({"url": receiver.url("/ok")}));
        let secret = ok["secret"].as_str().expect("secret").to_owned();
        assert!(secret.starts_with("whsec_"), "{mode:?}: {ok}");
        let ok_id = ok["webhook_id"].as_str().expect("id").to_owned();
        let flaky = register(&sys, &json!({"url": receiver.url("/flaky"), "kinds": ["draft.pending"]}));
        let down = register(&sys, &json!({"url": receiver.url("/down"), "format": "slack", "kinds": ["draft.pending"]}));
        let listed = sys.get("/api/v1/webhooks", &sys.admin);
        assert_eq!(listed.body["webhooks"].as_array().map(Vec::len), Some(3), "{mode:?}: {}", listed.raw);
        assert!(!listed.raw.contains(&secret), "{mode:?}: the secret is shown once");
        let stored = sys.sql_i64(&format!("SELECT COUNT(*) FROM events WHERE CAST(payload AS TEXT) LIKE '%{}%'", &secret["whsec_".len()..]));
        assert_eq!(stored, 0, "{mode:?}: the secret is in no event");

        // NATS subscribers (admins) hear the same, in a cluster (a runtime of its own keeps
        // the connection read while the test goes on).
        let nats_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let subscription = (mode == Mode::Cluster).then(|| {
            let options = pat_options(&sys.admin);
            let url = sys.nats_url();
            nats_rt.block_on(async move {
                let client = options.connect(url).await.expect("connect");
                let sub = client.subscribe(atasira_contracts::subjects::APPROVERS).await.expect("subscribe");
                let escalations = client.subscribe(atasira_contracts::subjects::channel("release-notes", "escalation")).await.expect("subscribe");
                client.flush().await.expect("flush");
                (client, sub, escalations)
            })
        });

        // A draft: one signed delivery with what an approver needs.
        let draft = json!({"box_type": "release-notes", "name": "release-notes", "purpose": "Write release notes.", "os_operations": ["shell:exec"]});
        let draft_id = sys.draft(&draft);
        let got = gets(&receiver, "/ok", 1);
        let d = &got[0];
        assert!(signed_with(d, &secret), "{mode:?}: signed with the webhook's secret: {:?}", d.headers);
        assert_eq!(d.header("x-atasira-event"), "draft.pending", "{mode:?}");
        let body = d.json();
        assert_eq!((body["kind"].as_str(), body["requested_by"].as_str()), (Some("draft.pending"), Some("agent")), "{mode:?}: {body}");
        assert_eq!(body["details"]["draft_id"], json!(draft_id), "{mode:?}: {body}");
        assert_eq!(body["details"]["over_limit"], json!(true), "{mode:?}: {body}");
        assert_eq!(body["link"], json!("https://atasira.example/#pending"), "{mode:?}: {body}");

        // The flaky receiver gets it again after its 500; the same delivery.
        let again = gets(&receiver, "/flaky", 2);
        assert_eq!(again[0].header("x-atasira-delivery"), again[1].header("x-atasira-delivery"), "{mode:?}");
        let flaky_id = flaky["webhook_id"].as_str().expect("id");
        eventually("the flaky delivery delivered", Duration::from_secs(30), || {
            let ds = deliveries(&sys, flaky_id, "delivered");
            if ds.len() == 1 && ds[0]["attempts"] == json!(2) { Ok(()) } else { Err(format!("{ds:?}")) }
        });
        // The receiver that is down: three attempts, then dead, and a ledger row.
        let down_id = down["webhook_id"].as_str().expect("id");
        let dead = eventually("the dead letter", Duration::from_secs(30), || {
            let ds = deliveries(&sys, down_id, "dead");
            if ds.len() == 1 { Ok(ds) } else { Err(format!("{ds:?}")) }
        });
        assert_eq!((dead[0]["attempts"].as_i64(), dead[0]["last_status"].as_i64()), (Some(3), Some(500)), "{mode:?}: {dead:?}");
        assert_eq!(receiver.at("/down").len(), 3, "{mode:?}");
        assert!(receiver.at("/down")[0].json()["text"].as_str().is_some_and(|t| t.contains("release-notes")), "{mode:?}: the Slack format");
        eventually("the dead letter on the ledger", Duration::from_secs(30), || {
            let a = sys.get("/api/v1/audit?action=webhook.dead_letter", &sys.admin);
            if a.body["rows"].as_array().is_some_and(|r| r.len() == 1) { Ok(()) } else { Err(a.raw) }
        });

        // Approved, then a change and a tool call waiting: one delivery each.
        let approved = sys.approve(&draft_id, &sys.admin, true);
        let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
        let change = json!({"shell": {"allowed_commands": ["git"], "require_approval_outside_allowlist": true}});
        let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &change);
        assert_eq!(asked.status, 201, "{}", asked.raw);
        let got = gets(&receiver, "/ok", 2);
        assert_eq!(got[1].json()["kind"], json!("change.pending"), "{mode:?}: {}", got[1].json());
        assert!(got[1].json()["details"]["diff"].is_object(), "{mode:?}: {}", got[1].json());
        let bob = sys.token("bob", "admin", "human");
        let changed = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
        assert_eq!(changed.status, 200, "{}", changed.raw);
        let launch =
            json!({"launch_id": "asks-1", "input": [{"kind": "text", "value": r#"tool: {"tool": "shell:exec", "input": {"command": "make deploy"}}"#}]});
        let launched = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &launch);
        assert_eq!(launched.status, 201, "{}", launched.raw);
        let got = gets(&receiver, "/ok", 3);
        let ask = got[2].json();
        assert_eq!(ask["kind"], json!("tool_request.pending"), "{mode:?}: {ask}");
        assert_eq!((ask["details"]["tool"].as_str(), ask["box_type"].as_str()), (Some("shell:exec"), Some("release-notes")), "{mode:?}: {ask}");
        // A Worker that fails escalates (a Box escalates unless its loop_control says not):
        // approvers hear it, with the Box's primaries named.
        let failing = json!({"launch_id": "fails-1", "input": [{"kind": "text", "value": "result: it broke\nfail: 3"}]});
        let launched = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &failing);
        assert_eq!(launched.status, 201, "{}", launched.raw);
        let got = gets(&receiver, "/ok", 4);
        let escalated = got[3].json();
        assert_eq!(escalated["kind"], json!("worker.escalated"), "{mode:?}: {escalated}");
        assert_eq!(escalated["details"]["exit_code"], json!(3), "{mode:?}: {escalated}");
        assert!(got.iter().all(|r| signed_with(r, &secret)), "{mode:?}");

        if let Some((_client, mut sub, mut escalations)) = subscription {
            let kinds: Vec<String> = nats_rt.block_on(async {
                let mut kinds = Vec::new();
                while kinds.len() < 4 {
                    use futures::StreamExt as _;
                    match tokio::time::timeout(Duration::from_secs(30), sub.next()).await {
                        Ok(Some(m)) => kinds
                            .push(serde_json::from_slice::<Value>(&m.payload).map(|v| v["kind"].as_str().unwrap_or_default().to_owned()).unwrap_or_default()),
                        _ => break,
                    }
                }
                kinds
            });
            assert_eq!(kinds, ["draft.pending", "change.pending", "tool_request.pending", "worker.escalated"], "{mode:?}: on NATS");
            let escalation = nats_rt.block_on(async {
                use futures::StreamExt as _;
                tokio::time::timeout(Duration::from_secs(30), escalations.next()).await.ok().flatten()
            });
            let escalation: Value = escalation.and_then(|m| serde_json::from_slice(&m.payload).ok()).unwrap_or_default();
            assert_eq!((escalation["state"].as_str(), escalation["exit_code"].as_i64()), (Some("failed"), Some(3)), "{mode:?}: the escalation channel");
        }

        // Removed: nothing more for it.
        let removed = http("DELETE", &sys.url(&format!("/api/v1/webhooks/{ok_id}")), Some(&sys.admin), &[], None);
        assert_eq!(removed.status, 200, "{mode:?}: {}", removed.raw);
        sys.draft(&json!({"box_type": "weekly-digest", "name": "weekly-digest", "purpose": "Write the weekly digest."}));
        gets(&receiver, "/flaky", 3);
        assert_eq!(receiver.at("/ok").len(), 4, "{mode:?}: a removed webhook gets nothing");
        drop(sys);
    }
}

#[test]
fn r_notify_1_a_box_notifies_only_its_recipients_and_each_delivery_and_refusal_is_a_ledger_row() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let sink = SmtpSink::start();
        // The operator's secret for vault `ops`, item `smtp` (never in the manifest).
        let secrets = TempDir::new("atasira-secrets");
        std::fs::create_dir_all(secrets.0.join("ops")).expect("dir");
        std::fs::write(secrets.0.join("ops/smtp.json"), json!({"smtp_url": sink.url(), "from": "atasira@example.com"}).to_string()).expect("secret");
        let runner = example_runner();
        let env = [
            ("ATASIRA_SECRETS_DIR", secrets.0.display().to_string()),
            ("ATASIRA_RUNNER", runner.clone()),
            ("ATASIRA_HOST_NAME", "h1".to_owned()),
            ("ATASIRA_WEBHOOK_BACKOFF", "100ms".to_owned()),
        ];
        let mut sys = System::start_with(mode, &env);
        sys.start_host("h1", &[("ATASIRA_RUNNER", runner.clone())]);

        // A Box that may e-mail ops@example.com only (its grant: an approved change).
        let draft = json!({"box_type": "price-watch", "name": "price-watch", "purpose": "Watch prices and tell ops.", "os_operations": ["notify:email"]});
        let approved = sys.approve(&sys.draft(&draft), &sys.admin, true);
        let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
        let grant =
            json!({"credentials": {"allowed_vaults": ["ops"]}, "notify": {"email": {"vault": "ops", "item": "smtp", "recipients": ["ops@example.com"]}}});
        let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &grant);
        assert_eq!(asked.status, 201, "{mode:?}: {}", asked.raw);
        let bob = sys.token("bob", "admin", "human");
        let changed = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
        assert_eq!(changed.status, 200, "{mode:?}: {}", changed.raw);

        let lines = [
            r#"notify: {"channel": "email", "to": ["ops@example.com"], "subject": "Prices", "body": "A1 fell 5%."}"#,
            r#"notify: {"channel": "email", "to": ["x@evil.test"], "subject": "Leak", "body": "the secret plan"}"#,
            "done",
        ];
        let launch = json!({"launch_id": "notes-1", "input": [{"kind": "text", "value": lines.join("\n")}]});
        let launched = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &launch);
        assert_eq!(launched.status, 201, "{mode:?}: {}", launched.raw);

        // The allowed recipient gets the mail; the other is denied, with a ledger row.
        let mails = eventually(&format!("{mode:?}: the mail"), Duration::from_secs(30), || {
            let mails = sink.mails();
            if mails.is_empty() { Err("none yet".to_owned()) } else { Ok(mails) }
        });
        assert_eq!(mails[0].to, ["ops@example.com"], "{mode:?}: {mails:?}");
        assert!(mails[0].data.contains("Subject: Prices") && mails[0].data.contains("A1 fell 5%."), "{mode:?}: {}", mails[0].data);
        let rows = |action: &str| -> Vec<Value> {
            let a = sys.get(&format!("/api/v1/audit?action={action}"), &sys.admin);
            a.body["rows"].as_array().cloned().unwrap_or_default()
        };
        eventually(&format!("{mode:?}: the sent notification on the ledger"), Duration::from_secs(30), || {
            let sent = rows("notify.send");
            if sent.len() == 1 { Ok(()) } else { Err(format!("{sent:?}")) }
        });
        let denied = eventually(&format!("{mode:?}: the denial on the ledger"), Duration::from_secs(30), || {
            let denied = rows("worker.tool_denied");
            if denied.len() == 1 { Ok(denied) } else { Err(format!("{denied:?}")) }
        });
        assert!(denied[0]["detail"].as_str().is_some_and(|d| d.contains("notify.email.recipients")), "{mode:?}: {denied:?}");
        assert_eq!(rows("worker.notify").len(), 1, "{mode:?}: one notification was asked for and allowed");
        assert_eq!(sink.mails().len(), 1, "{mode:?}: nothing to the stranger");
        assert!(!sink.mails().iter().any(|m| m.data.contains("secret plan")), "{mode:?}");
        drop(sys);
    }
}

#[test]
fn r_box_9_a_draft_does_not_wait_for_its_announcement_but_a_new_webhook_waits_for_the_webhook_list() {
    // R-BOX-9, R-NOTIFY-1: the notifier is a read model of webhook events only (the webhook
    // list is its table); what it queues for a draft is sent after the write returns anyway.
    use atasira_tests::harness::Hold;
    for mode in [Mode::Embedded, Mode::Cluster] {
        let hold = Hold::new("notifier.batch");
        let sys = System::start_with(mode, &[hold.setting(), ("ATASIRA_CONSISTENCY_WAIT", "2".to_owned())]);
        // given the notifier held at its next batch
        hold.arm();
        // when a draft is submitted
        let submitted =
            sys.post("/api/v1/boxes/box-drafts", &sys.agent, &json!({"box_type": "held-notice", "purpose": "Summarise the week.", "tools": ["Read"]}));
        // then it answers with every read model it affects applied, its announcement not queued yet
        assert_eq!(submitted.status, 201, "{mode:?}: {}", submitted.raw);
        assert_eq!(submitted.header("x-atasira-lagging"), None, "{mode:?}: a draft does not wait for the notifier");
        hold.wait_reached(Duration::from_secs(30));
        // when a webhook is registered while the notifier is still held
        let registered = sys.post("/api/v1/webhooks", &sys.admin, &json!({"url": "http://127.0.0.1:9/hook"}));
        // then its write waits for the webhook list, and says that it is behind
        assert_eq!(registered.status, 201, "{mode:?}: {}", registered.raw);
        assert!(
            registered.header("x-atasira-lagging").is_some_and(|l| l.split(',').any(|s| s == "notifier")),
            "{mode:?}: a new webhook waits for the notifier's webhook list: {:?}",
            registered.headers
        );
        hold.release();
        eventually("the webhook is listed", Duration::from_secs(30), || {
            let listed = sys.get("/api/v1/webhooks", &sys.admin);
            if listed.body["webhooks"].as_array().map(Vec::len) == Some(1) { Ok(()) } else { Err(listed.raw) }
        });
    }
}
