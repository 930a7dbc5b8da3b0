//! The store is the only truth (R-ARCH-5, R-ARCH-6, R-AUDIT-5): consumers read events from
//! the store, never from NATS, so a forged event notification changes nothing (and is
//! recorded as a security violation); an event the bus cannot carry does not stop the
//! relay; an event a projection cannot apply stops only that projection, visibly.

use std::time::{Duration, Instant};

use atasira_contracts::{subjects, v1};
use atasira_tests::fixtures::{draft_body, eventually, runtime};
use atasira_tests::harness::{Mode, System, http};
use futures::StreamExt as _;
use prost::Message as _;
use serde_json::{Value, json};

/// One text value from this system's database.
fn sql_text(sys: &System, query: &str) -> String {
    let url = sys.database_url();
    runtime().block_on(async {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&url).await.expect("database");
        let row = sqlx::query(query).fetch_one(&pool).await.unwrap_or_else(|e| panic!("{query}: {e}"));
        sqlx::Row::try_get::<String, _>(&row, 0).expect("a text")
    })
}

/// How long a wait for what must come may take.
const SOON: Duration = Duration::from_secs(30);

/// `Ok` once `query` counts exactly one row (for `eventually`).
fn one_row(sys: &System, query: &str) -> Result<(), String> {
    let n = sys.sql_i64(query);
    if n == 1 { Ok(()) } else { Err(format!("{n} rows")) }
}

/// A notification as a process holding `identity`'s NATS credentials can publish it on
/// its events subject, with the `Nats-Msg-Id` an attacker would guess (the event id).
async fn forge(sys: &System, identity: &str, event_id: &str, event_type: &str, payload: &Value) {
    // Connected with the leaked credentials.
    let js = sys.jetstream_as(identity).await;
    let mut parts = event_id.splitn(3, '/');
    let (aggregate_type, aggregate_id, sequence) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let notification = v1::EventNotification {
        event_id: event_id.to_owned(),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        sequence: sequence.parse().expect("sequence"),
        position: 999_999,
        event_type: event_type.to_owned(),
        event_version: "1".to_owned(),
        payload_json: serde_json::to_vec(payload).expect("json"),
        metadata: Default::default(),
        recorded_at_unix_ms: chrono::Utc::now().timestamp_millis(),
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", event_id);
    let ack = js.publish_with_headers(subjects::events(identity), headers, notification.encode_to_vec().into()).await.expect("published");
    ack.await.expect("JetStream took it");
}

/// Every notification on the public event feed for `event_id`, as (payload JSON).
async fn on_the_feed(sys: &System, event_id: &str) -> Vec<Value> {
    let js = sys.jetstream_as(subjects::OPERATOR).await;
    let stream = js.get_stream(subjects::EVENTS_STREAM).await.expect("the events stream");
    let consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.create_consumer(async_nats::jetstream::consumer::pull::Config::default()).await.expect("an ephemeral consumer");
    let pending = consumer.clone().info().await.expect("info").num_pending as usize;
    let mut messages = consumer.fetch().max_messages(pending.max(1)).expires(Duration::from_secs(2)).messages().await.expect("fetch");
    let mut found = Vec::new();
    while let Some(Ok(message)) = messages.next().await {
        let n = v1::EventNotification::decode(&message.payload[..]).expect("a notification");
        if n.event_id == event_id {
            found.push(serde_json::from_slice(&n.payload_json).expect("json"));
        }
    }
    found
}

/// [`on_the_feed`] once `event_id` is there (the relay publishes it soon), or after 30 s.
async fn once_on_the_feed(sys: &System, event_id: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let feed = on_the_feed(sys, event_id).await;
        if !feed.is_empty() || Instant::now() > deadline {
            return feed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn forged_violations(sys: &System) -> i64 {
    sys.sql_i64("SELECT COUNT(*) FROM events WHERE aggregate_type = 'audit_security' AND CAST(payload AS TEXT) LIKE '%forged_event_notification%'")
}

#[test]
fn a_forged_event_notification_changes_nothing_and_is_recorded() {
    // R-ARCH-5, R-APPROVE-4, R-AUDIT-5: someone holding a service's NATS credentials
    // publishes events that are not in the store: a new draft, a Box, and the approval
    // of a pending draft under the id its real approval will take.
    let sys = System::start(Mode::Cluster);
    let active = sys.draft(&draft_body("sales-report"));
    assert_eq!(sys.approve(&active, &sys.admin, false).status, 200);
    let pending = sys.draft(&draft_body("pending-report"));
    let submitted = sql_text(&sys, &format!("SELECT CAST(payload AS TEXT) FROM events WHERE aggregate_id = '{pending}' AND sequence = 1"));
    let activated = sql_text(&sys, "SELECT CAST(payload AS TEXT) FROM events WHERE aggregate_type = 'box' AND event_type = 'BoxActivated'");
    let forged_draft: Value = serde_json::from_str(&submitted.replace("pending-report", "forged-report")).expect("json");
    let forged_box: Value = serde_json::from_str(&activated.replace("sales-report", "forged-box")).expect("json");
    let real_approval_id = format!("draft/{pending}/2");
    runtime().block_on(async {
        forge(&sys, subjects::DRAFTS, "draft/forged-draft/1", "DraftSubmitted", &forged_draft).await;
        forge(&sys, subjects::RUNTIME_REGISTRY, "box/forged-box/1", "BoxActivated", &forged_box).await;
        forge(&sys, subjects::DRAFTS, &real_approval_id, "DraftApproved", &json!({"DraftApproved": {"forged": true}})).await;
    });

    // The sentinel records each one; nothing else happens.
    eventually("three forged notifications recorded", SOON, || {
        let n = forged_violations(&sys);
        if n >= 3 { Ok(()) } else { Err(format!("{n} recorded")) }
    });
    let listed: Vec<String> = sys.pending().iter().map(|d| d["box_type"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(listed, vec!["pending-report"], "no forged draft is pending");
    let boxes = sys.get("/api/v1/boxes", &sys.admin);
    assert_eq!(boxes.body["boxes"].as_array().map(Vec::len), Some(1), "no forged Box: {}", boxes.raw);
    assert!(!sys.data_dir().join("manifests/forged-box.yaml").exists(), "no manifest file was written for the forged Box");
    assert_eq!(sys.sql_i64("SELECT COUNT(*) FROM box_rows"), 1);

    // The real approval still happens, and its event reaches the public feed although a
    // message with its id came first.
    let approved = sys.approve(&pending, &sys.admin, false);
    assert_eq!(approved.status, 200, "{}", approved.raw);
    assert_eq!(approved.body["status"], "active");
    let feed = runtime().block_on(on_the_feed(&sys, &real_approval_id));
    assert_eq!(feed.len(), 2, "the forged and the real notification: {feed:?}");
    assert!(feed[1]["DraftApproved"]["approved_by"] == "admin" || feed[1].to_string().contains("admin"), "the real one: {}", feed[1]);

    // The ledger has rows for what the store holds, and for the violations; none for the forgeries.
    let rows = sys.get("/api/v1/audit?limit=500", &sys.admin);
    let rows = rows.body["rows"].as_array().cloned().unwrap_or_default();
    assert!(rows.iter().all(|r| r["target"] != "forged-draft" && r["target"] != "forged-box"), "{rows:?}");
    assert!(rows.iter().any(|r| r["action"].as_str().unwrap_or_default().contains("security")), "the violations are audit rows: {rows:?}");
    assert_eq!(sys.audit_verify().1["ok"], true);
}

#[test]
fn an_event_the_bus_cannot_carry_is_a_dead_letter_and_the_relay_goes_on() {
    // R-ARCH-6: a 1.5 MB event (written behind the product's back) cannot be published on
    // NATS (1 MiB); the relay records it and relays what comes after.
    let sys = System::start(Mode::Cluster);
    let reason = "a".repeat(1_500_000);
    let payload = json!({"SecurityViolation": {"service": "drafts", "actor": "x", "target": "y", "kind": "invalid_assertion", "reason": reason, "at": "2026-12-01T00:00:00Z"}});
    sys.sql(&format!(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES ('drafts_security', 'huge', 1, 'SecurityViolation', '1', '{}', '{{}}')",
        payload
    ));
    let after = sys.draft(&draft_body("after-the-big-one"));
    let after_id = format!("draft/{after}/1");
    eventually("the big event is a dead letter", SOON, || one_row(&sys, "SELECT COUNT(*) FROM relay_dead_letters WHERE event_id = 'drafts_security/huge/1'"));
    let feed = runtime().block_on(once_on_the_feed(&sys, &after_id));
    assert_eq!(feed.len(), 1, "the next event was relayed");
    // Internal consumers read the store: the ledger has the big event's row too.
    eventually("the ledger has the big event", SOON, || one_row(&sys, "SELECT COUNT(*) FROM audit_ledger_rows WHERE event_id = 'drafts_security/huge/1'"));
}

#[test]
fn an_event_a_projection_cannot_apply_stops_only_that_projection_visibly() {
    // R-ARCH-5: a draft event the drafts view cannot read (written behind the product's
    // back) stops the drafts view alone; the probe port of its process names it, the public
    // /readyz says only that something is wrong (R-ARCH-13); everything else goes on.
    for mode in [Mode::Embedded, Mode::Cluster] {
        let mut sys = System::start(mode);
        let health = sys.get("/readyz", &sys.admin);
        assert_eq!((health.status, &health.body["status"]), (200, &json!("ready")), "{}", health.raw);
        sys.sql(
            "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
             VALUES ('draft', 'broken', 1, 'DraftSubmitted', '1', '{\"DraftSubmitted\": {\"nonsense\": true}}', '{}')",
        );
        let ready = format!("{}/readyz", sys.probe_url(if mode == Mode::Embedded { "atasira dev" } else { "serve drafts" }));
        eventually("the drafts view reported stalled", SOON, || {
            let ready = http("GET", &ready, None, &[], None);
            let stalled = ready.status == 503 && ready.raw.contains("drafts_view") && ready.raw.contains("broken");
            if stalled { Ok(()) } else { Err(format!("{}: {}", ready.status, ready.raw)) }
        });
        eventually("the public readiness said unavailable", SOON, || {
            let ready = sys.get("/readyz", &sys.admin);
            if ready.status == 503 { Ok(()) } else { Err(format!("{}: {}", ready.status, ready.raw)) }
        });
        for token in [None, Some(sys.admin.as_str())] {
            let health = http("GET", &sys.url("/readyz"), token, &[], None);
            assert_eq!((health.status, &health.body), (503, &json!({"status": "unavailable"})), "{mode:?}: {}", health.raw);
        }
        // Alive all the same: the gateway runs.
        assert_eq!(http("GET", &sys.url("/healthz"), None, &[], None).status, 200);
        // The process serves on: Boxes are listed, the ledger grows.
        assert_eq!(sys.get("/api/v1/boxes", &sys.agent).status, 200, "{mode:?}");
        eventually("the ledger went past the broken event", SOON, || one_row(&sys, "SELECT COUNT(*) FROM audit_ledger_rows WHERE event_id = 'draft/broken/1'"));
    }
}

#[test]
fn what_a_crash_of_the_nats_host_lost_from_the_stream_is_published_again() {
    // R-ARCH-6: nats-server writes the events stream to disk every second, not after each
    // message. The relay stores its checkpoint only past events JetStream acknowledged
    // seconds ago, and reads it again when its NATS connection is made again; so what a
    // crash of the NATS host took from the stream (here: all of it) is published again.
    let mut sys = System::start(Mode::Cluster);
    for attempt in 0..3 {
        // given an event on the feed that the relay's stored checkpoint has not passed yet
        let id = sys.draft(&draft_body(&format!("lost-{attempt}")));
        let event_id = format!("draft/{id}/1");
        assert_eq!(runtime().block_on(once_on_the_feed(&sys, &event_id)).len(), 1, "{event_id} was published");
        let position = sys.sql_i64(&format!("SELECT global_position FROM events WHERE aggregate_type = 'draft' AND aggregate_id = '{id}'"));
        let stored = sys.sql_i64("SELECT COALESCE(MAX(position), 0) FROM relay_checkpoints WHERE name = 'relay-drafts'");
        if stored >= position {
            // Seconds went by since JetStream acknowledged it (a slow machine): again.
            eprintln!("attempt {attempt}: the relay's checkpoint ({stored}) already passed {event_id} ({position})");
            continue;
        }
        // when the NATS host crashes and its store is lost, and the operator sets the
        // stream up again
        sys.nats().lose_store();
        sys.nats().up();
        sys.nats().set_up();
        // then the event is on the new stream, once
        let feed = runtime().block_on(once_on_the_feed(&sys, &event_id));
        assert_eq!(feed.len(), 1, "{event_id} on the stream after the crash: {feed:?}");
        return;
    }
    panic!("the relay's stored checkpoint passed every event moments after JetStream acknowledged it");
}

#[test]
fn the_relay_stores_its_checkpoint_once_it_is_idle_and_a_restart_publishes_nothing_twice() {
    // R-ARCH-6: the relay stores its cursor at most every 250 ms while busy, and once it
    // goes idle, so the stored checkpoint reaches the last relayed event.
    let mut sys = System::start(Mode::Cluster);
    let drafts: Vec<String> = (0..5).map(|i| sys.draft(&draft_body(&format!("relayed-{i}")))).collect();
    let last = sys.sql_i64(&format!("SELECT global_position FROM events WHERE aggregate_type = 'draft' AND aggregate_id = '{}'", drafts[4]));
    eventually("the drafts relay stored the last draft's position", SOON, || {
        let stored = sys.sql_i64("SELECT COALESCE(MAX(position), 0) FROM relay_checkpoints WHERE name = 'relay-drafts'");
        if stored >= last { Ok(()) } else { Err(format!("it stored {stored}, the last draft is at {last}")) }
    });
    // and after a restart of every process each draft is on the public feed once
    sys.restart();
    let after = sys.draft(&draft_body("after-the-restart"));
    for id in drafts.iter().chain([&after]) {
        let event_id = format!("draft/{id}/1");
        let feed = runtime().block_on(once_on_the_feed(&sys, &event_id));
        assert_eq!(feed.len(), 1, "{event_id} on the feed: {feed:?}");
    }
}
