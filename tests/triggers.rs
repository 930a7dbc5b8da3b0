//! Boxes that run on their own (R-TRIG-1), in embedded mode and as a cluster with two
//! runtime registries: a `schedule` Box gets exactly one Worker per cron tick, across
//! replicas and a restart; ticks missed while everything was down run once, not in a burst;
//! a config edit of the schedule takes effect at the next tick; a stopped Box's schedule
//! stops. Time is a test clock the test moves (a file every
//! process reads in a test build), never a sleep to the next minute.
//!
//! An `event` Box gets one Worker per message on its topic (REST in both modes, and NATS
//! in the cluster), none for a repeated message id; a publisher who may not start it is
//! refused (over NATS by nats-server itself) and recorded; a flood is bounded.

use std::path::Path;
use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::{Answer, Mode, System, TempDir, creds_block_seed, http, nats_tls, pat_options, reporting_server_errors};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::{Value, json};

fn set_clock(file: &Path, at: DateTime<Utc>) {
    // Written whole, then renamed: a reader never sees half a time.
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, at.to_rfc3339()).expect("clock");
    std::fs::rename(&tmp, file).expect("clock");
}

fn clock_env(file: &Path) -> Vec<(&'static str, String)> {
    vec![("ATASIRA_TEST_CLOCK", file.display().to_string())]
}

/// An active Box whose approved change set `trigger`; its id.
fn triggered_box(sys: &System, box_type: &str, trigger: Value) -> String {
    let draft = json!({"box_type": box_type, "name": box_type, "purpose": "Summarise the day's tickets.", "tools": ["Read"]});
    let id = sys.draft(&draft);
    let a = sys.approve(&id, &sys.admin, true);
    assert_eq!(a.status, 200, "{:?}: {}", sys.mode, a.raw);
    let box_id = a.body["box_id"].as_str().expect("box_id").to_owned();
    // trigger_type changes only through an approved change.
    let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &trigger);
    assert_eq!(asked.status, 201, "{}", asked.raw);
    let bob = sys.token("bob", "admin", "human");
    let approved = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
    assert_eq!(approved.body["status"], json!("active"), "{}", approved.raw);
    box_id
}

/// An active Box whose approved change made it `schedule` with `expression`; its id.
fn scheduled_box(sys: &System, box_type: &str, expression: &str) -> String {
    triggered_box(sys, box_type, json!({"trigger_type": "schedule", "trigger_schedule": expression}))
}

/// A config edit of the Box's `trigger_schedule`.
fn schedule(sys: &System, box_id: &str, expression: &str) -> Answer {
    let body = json!({"trigger_schedule": expression}).to_string();
    let headers = [("Content-Type", "application/merge-patch+json")];
    http("PATCH", &sys.url(&format!("/api/v1/boxes/{box_id}/config")), Some(&sys.admin), &headers, Some(body.as_bytes()))
}

/// The Box's Workers, oldest first.
fn workers(sys: &System, box_id: &str) -> Vec<Value> {
    let a = sys.get(&format!("/api/v1/boxes/{box_id}/workers?limit=100"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["workers"].as_array().cloned().unwrap_or_default()
}

fn launch_ids(workers: &[Value]) -> Vec<String> {
    workers.iter().filter_map(|w| w["launch_id"].as_str().map(str::to_owned)).collect()
}

fn tick_id(box_id: &str, tick: DateTime<Utc>) -> String {
    format!("trigger:{box_id}:tick:{}", tick.timestamp())
}

/// Waits until the Box's Workers are those of exactly `ticks`.
fn has_ticks(sys: &System, box_id: &str, ticks: &[DateTime<Utc>]) -> Vec<Value> {
    let want: Vec<String> = ticks.iter().map(|t| tick_id(box_id, *t)).collect();
    eventually(&format!("{:?}: the Workers of {} ticks", sys.mode, ticks.len()), Duration::from_secs(30), || {
        let ws = workers(sys, box_id);
        let mut have = launch_ids(&ws);
        have.sort();
        if have == want { Ok(ws) } else { Err(format!("{have:?}, want {want:?}")) }
    })
}

/// The system with the test clock; as a cluster, with a second runtime registry.
fn start(mode: Mode, clock: &Path) -> System {
    let mut sys = System::start_with(mode, &clock_env(clock));
    if mode == Mode::Cluster {
        // A second scheduler: two registries side by side.
        sys.start_service("runtime-registry", &clock_env(clock));
    }
    sys
}

#[test]
fn r_trig_1_a_schedule_box_gets_one_worker_per_tick_across_replicas_and_restarts() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let dir = TempDir::new("atasira-clock");
        let clock = dir.0.join("clock");
        // Long ago: nothing is due while the Box is set up.
        set_clock(&clock, DateTime::from_timestamp(946_684_800, 0).expect("2000"));
        let mut sys = start(mode, &clock);
        let box_id = scheduled_box(&sys, "daily-summary", "*/1 * * * *");
        // Ticks count from the approved change: the first whole minute two minutes on is
        // surely after it.
        let base = Utc::now().duration_trunc(TimeDelta::minutes(1)).expect("minute") + TimeDelta::minutes(2);
        assert!(workers(&sys, &box_id).is_empty(), "{mode:?}: nothing before the first tick");
        // Nobody else launches as the Box's trigger: a tick cannot be taken before it runs.
        let taken = json!({"launch_id": tick_id(&box_id, base), "input": [{"kind": "text", "value": "mine"}]});
        let refused = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &taken);
        assert_eq!(refused.status, 422, "{mode:?}: {}", refused.raw);
        assert!(refused.raw.contains("launch_id"), "{mode:?}: {}", refused.raw);

        // The first tick: one Worker, launched by the Box's trigger with the tick as input.
        set_clock(&clock, base + TimeDelta::seconds(5));
        let ws = has_ticks(&sys, &box_id, &[base]);
        assert_eq!(ws[0]["created_by"], json!(format!("trigger:{box_id}")), "{mode:?}: {}", ws[0]);
        assert_eq!(ws[0]["labels"]["trigger"], json!("schedule"), "{mode:?}: {}", ws[0]);
        let first = sys.get(&format!("/api/v1/workers/{}", ws[0]["worker_id"].as_str().expect("id")), &sys.admin);
        let input = first.body["transcript"][0].to_string();
        assert!(input.contains(&base.to_rfc3339()), "{mode:?}: the tick is the input: {input}");

        // Within the minute nothing more; at the next tick one more.
        set_clock(&clock, base + TimeDelta::seconds(40));
        set_clock(&clock, base + TimeDelta::seconds(65));
        has_ticks(&sys, &box_id, &[base, base + TimeDelta::minutes(1)]);

        // Everything restarts within the same minute: the tick is not run again.
        sys.restart_with(&clock_env(&clock));
        if mode == Mode::Cluster {
            sys.start_service("runtime-registry", &clock_env(&clock));
        }
        // Down for five minutes: the latest missed tick runs once, the older are skipped.
        set_clock(&clock, base + TimeDelta::seconds(6 * 60 + 10));
        let ws = has_ticks(&sys, &box_id, &[base, base + TimeDelta::minutes(1), base + TimeDelta::minutes(6)]);
        assert_eq!(ws.len(), 3, "{mode:?}: no burst");

        // A config edit of trigger_schedule takes effect at the next tick: yearly, the Box
        // misses the next minutes (a second scheduled Box shows the loop saw them) ...
        let yearly = schedule(&sys, &box_id, "0 0 1 1 *");
        assert_eq!(yearly.status, 200, "{mode:?}: {}", yearly.raw);
        set_clock(&clock, base + TimeDelta::seconds(7 * 60 + 5));
        let other = scheduled_box(&sys, "hourly-check", "*/1 * * * *");
        has_ticks(&sys, &other, &[base + TimeDelta::minutes(7)]);
        assert_eq!(workers(&sys, &box_id).len(), 3, "{mode:?}: the edited schedule has no tick now");
        // ... and back to every minute, it runs at the next tick.
        assert_eq!(schedule(&sys, &box_id, "*/1 * * * *").status, 200, "{mode:?}");
        set_clock(&clock, base + TimeDelta::seconds(8 * 60 + 5));
        let minutes = [0, 1, 6, 8].map(|m| base + TimeDelta::minutes(m));
        has_ticks(&sys, &box_id, &minutes);

        // A stopped Box's schedule stops.
        let stop = sys.post(&format!("/api/v1/boxes/{box_id}/stop"), &sys.admin, &json!({}));
        assert_eq!(stop.status, 200, "{}", stop.raw);
        set_clock(&clock, base + TimeDelta::seconds(9 * 60 + 5));
        has_ticks(&sys, &other, &[7, 8, 9].map(|m| base + TimeDelta::minutes(m)));
        assert_eq!(workers(&sys, &box_id).len(), 4, "{mode:?}: a stopped Box is not scheduled");
        drop(sys);
    }
}

/// An active Box whose approved change made it `event` on `topic`; its id.
fn event_box(sys: &System, box_type: &str, topic: &str) -> String {
    triggered_box(sys, box_type, json!({"trigger_type": "event", "trigger_event": topic}))
}

fn publish(sys: &System, token: &str, topic: &str, message_id: &str, data: &str) -> Answer {
    sys.post("/api/v1/trigger-events", token, &json!({"topic": topic, "message_id": message_id, "data": data}))
}

/// The one launch of an event that one Box listens to.
fn launch_of(a: &Answer) -> Value {
    assert_eq!(a.status, 200, "{}", a.raw);
    let launches = a.body["launches"].as_array().expect("launches");
    assert_eq!(launches.len(), 1, "{}", a.raw);
    launches[0].clone()
}

/// The launch a NATS request on `topic` with message id `id` answers, as `token`.
fn publish_over_nats(sys: &System, token: &str, topic: &str, id: &str, data: &str) -> Value {
    let urls: Vec<async_nats::ServerAddr> = sys.nats_urls().split(',').map(|u| u.parse().expect("a NATS address")).collect();
    atasira_tests::fixtures::runtime().block_on(async {
        let client = pat_options(token).connect(urls.as_slice()).await.expect("connects");
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        // The registry hears the topic within a second of the Box's activation.
        for _ in 0..50 {
            match client.request_with_headers(topic.to_owned(), headers.clone(), data.to_owned().into()).await {
                Ok(reply) => {
                    let body: Value = serde_json::from_slice(&reply.payload).expect("JSON");
                    let launches = body["launches"].as_array().cloned().unwrap_or_default();
                    assert_eq!(launches.len(), 1, "{body}");
                    return launches[0].clone();
                }
                Err(e) => {
                    eprintln!("not yet: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!("nobody answered on {topic}");
    })
}

/// The registry's trigger listener (its NATS user, as a compromised registry would use it)
/// may not subscribe to atasira's subjects, inboxes or NATS's own; subscribed to
/// everything, it hears a publisher's topic and not the request the same publisher sent
/// just before (one connection's messages arrive in order).
fn the_trigger_listener_hears_the_topic_and_nothing_of_atasira(sys: &System, topic: &str) {
    use futures::StreamExt as _;
    let seed = creds_block_seed(&sys.nats_creds("runtime-registry"), "TRIGGER LISTENER USER NKEY SEED");
    let urls: Vec<async_nats::ServerAddr> = sys.nats_urls().split(',').map(|u| u.parse().expect("a NATS address")).collect();
    atasira_tests::fixtures::runtime().block_on(async {
        let (options, mut errors) = reporting_server_errors(nats_tls(async_nats::ConnectOptions::with_nkey(seed)));
        let listener = options.connect(urls.as_slice()).await.expect("the listener connects");
        for secret in ["atasira.box.gateway.approval", "atasira.box.*.events", "_INBOX.gateway.>", "$SYS.REQ.USER.AUTH", "$JS.API.>"] {
            let _s = listener.subscribe(secret).await.expect("sent");
            listener.flush().await.expect("flush");
            let refused = tokio::time::timeout(Duration::from_secs(10), errors.recv()).await.ok().flatten().unwrap_or_default();
            assert!(refused.to_lowercase().contains("permissions violation") && refused.contains(secret), "{secret}: {refused:?}");
        }
        let mut everything = listener.subscribe(">").await.expect("sent");
        listener.flush().await.expect("flush");
        let agent = pat_options(&sys.agent).connect(urls.as_slice()).await.expect("connects");
        let hash = atasira_platform::auth::hash_token(&sys.agent);
        let request = atasira_contracts::subjects::client_request(&hash, atasira_contracts::subjects::RUNTIME_REGISTRY);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", "n-heard");
        for _ in 0..100 {
            agent.publish(request.clone(), "not for the listener".into()).await.expect("sent");
            agent.publish_with_headers(topic.to_owned(), headers.clone(), "heard".into()).await.expect("sent");
            agent.flush().await.expect("flush");
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), everything.next()).await {
                assert_eq!(m.subject.as_str(), topic, "the listener heard {:?}", m.subject);
                return;
            }
        }
        panic!("the listener never heard the topic");
    });
}

#[test]
fn r_trig_1_an_event_box_gets_one_worker_per_message_and_only_granted_publishers_start_it() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let env = vec![("ATASIRA_TRIGGER_IN_FLIGHT", "3".to_owned())];
        let mut sys = System::start_with(mode, &env);
        if mode == Mode::Cluster {
            // Two registries hear the topic in one queue group: each message launches once.
            sys.start_service("runtime-registry", &env);
        }
        let topic = "sales.csv.arrived";
        let box_id = event_box(&sys, "csv-intake", topic);
        let assign = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "member"}));
        assert_eq!(assign.status, 200, "{mode:?}: {}", assign.raw);
        // Not a topic a Box may listen on: refused with the key named.
        let bad = publish(&sys, &sys.agent, "atasira.box.gateway.approval", "x", "");
        assert_eq!(bad.status, 422, "{mode:?}: {}", bad.raw);
        assert!(bad.raw.contains("topic"), "{mode:?}: {}", bad.raw);

        // Someone who may not start the Box is refused, and the refusal is on the ledger.
        let mallory = sys.token("mallory", "member", "agent");
        let refused = publish(&sys, &mallory, topic, "m-0", "mine");
        assert_eq!(refused.status, 403, "{mode:?}: {}", refused.raw);
        eventually(&format!("{mode:?}: the refusal on the ledger"), Duration::from_secs(10), || {
            let a = sys.get("/api/v1/audit?action=security_violation&limit=100", &sys.admin);
            let rows = a.body["rows"].as_array().cloned().unwrap_or_default();
            if rows.iter().any(|r| r.to_string().contains("trigger_event_forbidden")) { Ok(()) } else { Err(a.raw.clone()) }
        });

        // One Worker per message, launched by the Box's trigger with the data as input.
        let first = launch_of(&publish(&sys, &sys.agent, topic, "m-1", "q3-sales.csv"));
        assert_eq!(first["outcome"], json!("launched"), "{mode:?}: {first}");
        let worker = sys.get(&format!("/api/v1/workers/{}", first["worker_id"].as_str().expect("worker_id")), &sys.admin);
        assert_eq!(worker.status, 200, "{mode:?}: {}", worker.raw);
        assert_eq!(worker.body["created_by"], json!(format!("trigger:{box_id}")), "{mode:?}: {}", worker.raw);
        assert_eq!(worker.body["labels"]["trigger"], json!("event"), "{mode:?}: {}", worker.raw);
        assert!(worker.body["transcript"][0].to_string().contains("q3-sales.csv"), "{mode:?}: the message is the input: {}", worker.raw);
        // The same message again launches nothing more.
        let again = launch_of(&publish(&sys, &sys.agent, topic, "m-1", "q3-sales.csv"));
        assert_eq!((again["outcome"].clone(), again["worker_id"].clone()), (json!("existing"), first["worker_id"].clone()), "{mode:?}: {again}");
        assert_eq!(workers(&sys, &box_id).len(), 1, "{mode:?}");

        if mode == Mode::Cluster {
            // Over NATS: a publisher who may start the Box is granted its topic at connect.
            let heard = publish_over_nats(&sys, &sys.agent, topic, "n-1", "q4-sales.csv");
            assert_eq!(heard["outcome"], json!("launched"), "{heard}");
            let repeat = publish_over_nats(&sys, &sys.agent, topic, "n-1", "q4-sales.csv");
            assert_eq!((repeat["outcome"].clone(), repeat["worker_id"].clone()), (json!("existing"), heard["worker_id"].clone()), "{repeat}");
            let w = sys.get(&format!("/api/v1/workers/{}", heard["worker_id"].as_str().expect("worker_id")), &sys.admin);
            assert!(w.body["transcript"][0].to_string().contains("q4-sales.csv"), "{}", w.raw);
            // Anyone else: nats-server refuses the publish, and nothing starts.
            atasira_tests::fixtures::runtime().block_on(async {
                let urls: Vec<async_nats::ServerAddr> = sys.nats_urls().split(',').map(|u| u.parse().expect("a NATS address")).collect();
                let (options, mut errors) = reporting_server_errors(pat_options(&mallory));
                let client = options.connect(urls.as_slice()).await.expect("mallory connects");
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", "n-mallory");
                client.publish_with_headers(topic.to_owned(), headers, "mine".into()).await.expect("sent");
                client.flush().await.expect("flush");
                let refused = tokio::time::timeout(Duration::from_secs(5), errors.recv()).await.ok().flatten().unwrap_or_default();
                assert!(refused.to_lowercase().contains("permissions violation"), "mallory may not publish on the topic: {refused:?}");
            });
            assert_eq!(workers(&sys, &box_id).len(), 2, "nothing started for mallory");
            the_trigger_listener_hears_the_topic_and_nothing_of_atasira(&sys, topic);
        }

        // A flood is bounded: at most three Workers of its events in flight (none ends
        // here: no execution host runs them). Six events at once: the free slots are
        // launched, the rest refused and recorded, whichever replica takes each.
        let before = if mode == Mode::Cluster { 3 } else { 1 };
        eventually(&format!("{mode:?}: the Workers so far"), Duration::from_secs(10), || {
            let n = workers(&sys, &box_id).len();
            if n == before { Ok(()) } else { Err(format!("{n}")) }
        });
        let outcomes: Vec<Value> = std::thread::scope(|scope| {
            let sys = &sys;
            let flood: Vec<_> = (0..6).map(|n| scope.spawn(move || launch_of(&publish(sys, &sys.agent, topic, &format!("flood-{n}"), "more")))).collect();
            flood.into_iter().map(|t| t.join().expect("a publish")).collect()
        });
        let launched = outcomes.iter().filter(|o| o["outcome"] == json!("launched")).count();
        assert_eq!(launched, 3 - before, "{mode:?}: {outcomes:?}");
        for over in outcomes.iter().filter(|o| o["outcome"] != json!("launched")) {
            assert_eq!((over["outcome"].clone(), over["code"].clone()), (json!("refused"), json!("too_many_workers")), "{mode:?}: {over}");
        }
        assert_eq!(workers(&sys, &box_id).len(), 3, "{mode:?}");
        eventually(&format!("{mode:?}: the throttled event on the ledger"), Duration::from_secs(10), || {
            let a = sys.get("/api/v1/audit?action=worker.create_refused&limit=100", &sys.admin);
            if a.raw.contains("too_many_workers") { Ok(()) } else { Err(a.raw.clone()) }
        });
        drop(sys);
    }
}
