//! NATS is hostile ground (R-ARCH-10): on a real nats-server started with the configuration
//! `atasira nats-config` writes, nobody connects anonymously and each process identity may
//! publish and subscribe only where the permission table (contracts::subjects) says.

use std::path::Path;
use std::time::Duration;

use atasira_contracts::subjects;
use atasira_tests::fixtures::runtime;
use atasira_tests::harness::{Mode, Nats, OutputWithin, SUBPROCESS_LIMIT, System, TempDir, atasira_bin, creds_seed, nats_tls, reporting_server_errors};
use futures::StreamExt as _;
use serde_json::json;
use tokio::sync::mpsc;

/// The user seed in a credentials file `atasira nats-config` wrote.
fn seed(dir: &Path, identity: &str) -> String {
    creds_seed(&dir.join(format!("{identity}.creds")))
}

/// A connection as `identity`, with the server errors it receives (permission violations).
async fn connect_as(nats: &Nats, dir: &Path, identity: &str) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
    let (options, rx) =
        reporting_server_errors(nats_tls(async_nats::ConnectOptions::with_nkey(seed(dir, identity)).custom_inbox_prefix(subjects::inbox_prefix(identity))));
    let client = options.connect(nats.url()).await.unwrap_or_else(|e| panic!("{identity} connects with its own credentials: {e}"));
    (client, rx)
}

/// A bound on waiting for what must come (a message, an error); never reached when all is well.
const ARRIVES: Duration = Duration::from_secs(30);

/// The next permission violation the server reports on this connection.
async fn violation(errors: &mut mpsc::UnboundedReceiver<String>) -> Option<String> {
    tokio::time::timeout(ARRIVES, errors.recv()).await.ok().flatten().filter(|e| e.to_lowercase().contains("permissions violation"))
}

/// A subject no identity may publish to: its refusal marks a place in a connection's
/// errors.
const MARKER: &str = "atasira.marker.nobody";

/// Whether the server reported an error on this connection for anything `client` sent so
/// far. The server reads a connection's commands in order and reports a violation as soon
/// as it reads the offending one, so `client` sends a publish every identity is refused
/// (the marker) and the next error must be the marker's: an earlier error would come
/// before it. No waiting for a silence that proves nothing.
async fn no_error(client: &async_nats::Client, errors: &mut mpsc::UnboundedReceiver<String>) -> Result<(), String> {
    client.publish(MARKER, "marker".into()).await.expect("sent");
    client.flush().await.expect("flush");
    match tokio::time::timeout(ARRIVES, errors.recv()).await {
        Ok(Some(error)) if error.contains(MARKER) => Ok(()),
        Ok(Some(error)) => Err(error),
        _ => Err("the server reported no violation for the marker".into()),
    }
}

/// Returns once `subscription` (on another connection) is live on the server. async-nats's
/// `flush` only empties the client's socket buffer and the server handles each connection
/// in its own order, so a message another connection publishes right after a SUB may
/// arrive before it. `sender`, allowed to publish on `subject`, sends numbered probes until
/// one arrives, then a last one, read up to so that no probe is left in the subscription.
async fn until_listening(sender: &async_nats::Client, subject: &'static str, subscription: &mut async_nats::Subscriber) {
    for probe in 0.. {
        assert!(probe < 300, "the subscription to {subject} never became live");
        sender.publish(subject, format!("probe {probe}").into()).await.expect("sent");
        sender.flush().await.expect("flush");
        if tokio::time::timeout(Duration::from_millis(100), subscription.next()).await.is_ok() {
            break;
        }
    }
    sender.publish(subject, "last probe".into()).await.expect("sent");
    sender.flush().await.expect("flush");
    while let Some(message) = tokio::time::timeout(ARRIVES, subscription.next()).await.expect("the last probe").map(|m| m.payload) {
        if &message[..] == b"last probe" {
            return;
        }
        assert!(message.starts_with(b"probe "), "only probes arrive while waiting: {message:?}");
    }
}

/// Asserts that the server refused `what` on `subject` (its error names both).
#[track_caller]
fn assert_refused(error: Option<String>, what: &str, subject: &str) {
    let error = error.unwrap_or_else(|| panic!("no permissions violation for {what} to {subject}"));
    assert!(error.contains(what) && error.contains(subject), "{error}");
}

fn authenticated_nats() -> (TempDir, Nats) {
    let dir = TempDir::new("atasira-nats-auth");
    let creds = dir.0.join("nats");
    let nats = Nats::start_authenticated(&creds);
    (dir, nats)
}

#[test]
fn the_generated_configuration_is_valid_and_the_credentials_are_private() {
    // R-ARCH-10: nats-server's own check of the configuration; only owners read secrets.
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("atasira-nats-config");
    let out = tmp.0.join("conf");
    let run = |args: &[&str]| std::process::Command::new(atasira_bin()).args(args).output_within(SUBPROCESS_LIMIT).expect("runs");
    let written = run(&["nats-config", "--out", out.to_str().expect("utf-8"), "--port", "4333"]);
    assert!(written.status.success(), "{}", String::from_utf8_lossy(&written.stderr));
    let stderr = String::from_utf8_lossy(&written.stderr);
    let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&out), 0o700);
    for identity in subjects::IDENTITIES {
        let path = out.join(format!("{identity}.creds"));
        assert_eq!(mode(&path), 0o600, "{identity}.creds");
        assert!(stderr.contains(&path.display().to_string()), "lists {identity}.creds: {stderr}");
        assert!(!stderr.contains(&seed(&out, identity)), "never prints a seed");
    }
    let gateway = std::fs::read_to_string(out.join("gateway.creds")).expect("gateway.creds");
    assert!(gateway.contains("-----BEGIN ACCOUNT NKEY SEED-----"), "the gateway holds the callout issuer key");
    let conf = out.join("nats-server.conf");
    let nats_server = std::env::var("ATASIRA_TEST_NATS_SERVER").expect("ATASIRA_TEST_NATS_SERVER is set by scripts/test");
    let tested =
        std::process::Command::new(nats_server).args(["-c", conf.to_str().expect("utf-8"), "-t"]).output_within(SUBPROCESS_LIMIT).expect("nats-server runs");
    assert!(tested.status.success(), "nats-server -t: {}{}", String::from_utf8_lossy(&tested.stdout), String::from_utf8_lossy(&tested.stderr));
    let text = std::fs::read_to_string(&conf).expect("conf");
    assert!(text.contains("port: 4333") && text.contains(&format!("store_dir: \"{}\"", out.join("jetstream").display())), "{text}");

    // Never silently replaced: new keys only with --force.
    let again = run(&["nats-config", "--out", out.to_str().expect("utf-8")]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"), "{}", String::from_utf8_lossy(&again.stderr));
    let before = seed(&out, "drafts");
    assert!(run(&["nats-config", "--out", out.to_str().expect("utf-8"), "--force"]).status.success());
    assert_ne!(seed(&out, "drafts"), before, "--force writes new keys");
    assert_eq!(mode(&out.join("drafts.creds")), 0o600);
}

#[test]
fn an_anonymous_connection_is_refused() {
    // R-ARCH-10: no credentials, no NATS.
    let (_dir, nats) = authenticated_nats();
    runtime().block_on(async {
        let (options, mut errors) = reporting_server_errors(nats_tls(async_nats::ConnectOptions::new()));
        match options.connection_timeout(Duration::from_secs(10)).connect(nats.url()).await {
            Err(error) => assert!(error.to_string().to_lowercase().contains("authorization"), "{error}"),
            // Over TLS, when nobody answers the auth callout, nats-server may finish the
            // handshake before it turns the client away: then it says why and disconnects.
            Ok(client) => {
                let said = tokio::time::timeout(Duration::from_secs(10), errors.recv()).await.ok().flatten().unwrap_or_default();
                assert!(said.to_lowercase().contains("authorization"), "the server refuses the anonymous client: {said:?}");
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while client.connection_state() == async_nats::connection::State::Connected && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_ne!(client.connection_state(), async_nats::connection::State::Connected, "and closes the connection");
            }
        }
    });
}

#[test]
fn a_service_with_another_services_credentials_cannot_serve_or_forge_its_subjects() {
    // R-ARCH-10: drafts' key cannot answer approval requests, reserve Box types, listen on
    // everything, or publish another service's events.
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    runtime().block_on(async {
        let (drafts, mut errors) = connect_as(&nats, &creds, subjects::DRAFTS).await;
        let (registry, _) = connect_as(&nats, &creds, subjects::RUNTIME_REGISTRY).await;
        let (approval, _) = connect_as(&nats, &creds, subjects::APPROVAL).await;

        let _stolen = drafts.subscribe("atasira.box.*.approval").await.expect("sent");
        assert_refused(violation(&mut errors).await, "Subscription", "atasira.box.*.approval");
        let _everything = drafts.subscribe("atasira.box.>").await.expect("sent");
        assert_refused(violation(&mut errors).await, "Subscription", "atasira.box.>");
        let _replies = drafts.subscribe("_INBOX.gateway.>").await.expect("sent");
        assert_refused(violation(&mut errors).await, "Subscription", "_INBOX.gateway.>");

        // The registry hears reservations; drafts cannot send one, approval can.
        let mut reservations = registry.subscribe("atasira.box.approval.runtime-registry").await.expect("the registry listens");
        until_listening(&approval, "atasira.box.approval.runtime-registry", &mut reservations).await;
        drafts.publish("atasira.box.approval.runtime-registry", "forged reservation".into()).await.expect("sent");
        drafts.flush().await.expect("flush");
        assert_refused(violation(&mut errors).await, "Publish", "atasira.box.approval.runtime-registry");
        drafts.publish(subjects::events(subjects::APPROVAL), "forged event".into()).await.expect("sent");
        assert_refused(violation(&mut errors).await, "Publish", "atasira.box.approval.events");
        approval.publish("atasira.box.approval.runtime-registry", "genuine".into()).await.expect("sent");
        approval.flush().await.expect("flush");
        let first = tokio::time::timeout(ARRIVES, reservations.next()).await.expect("a message").expect("open");
        assert_eq!(&first.payload[..], b"genuine", "the forged reservation never reached the registry");

        // What drafts needs still works on the same connection: its own events, its inbox.
        let _own = drafts.subscribe("atasira.box.*.drafts").await.expect("sent");
        drafts.flush().await.expect("flush");
        assert_eq!(no_error(&drafts, &mut errors).await, Ok(()), "its own subjects are allowed");
    });
}

#[test]
fn a_process_rings_the_others_on_its_own_doorbell_and_its_commands_notify_nothing_in_the_database() {
    // R-ARCH-6, R-BOX-9, R-ARCH-10 (ADR 9): in cluster mode a command's commit rings the
    // other processes over NATS, on a doorbell only its own identity may ring; the append
    // notifies nothing in the database, where a notification made the commit signal every
    // listening session.
    use atasira_domain::aggregates::types;
    use atasira_platform::store::Db;
    use atasira_platform::store::bells::DOORBELL_GAP;
    use sqlx::Connection as _;
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    let database = atasira_tests::harness::Database::create();
    runtime().block_on(async {
        let (drafts, mut errors) = connect_as(&nats, &creds, subjects::DRAFTS).await;
        let (registry, _) = connect_as(&nats, &creds, subjects::RUNTIME_REGISTRY).await;
        let (writer, reader) = (Db::connect(&database.url).await.expect("connect"), Db::connect(&database.url).await.expect("connect"));
        writer.ring_over_nats(drafts.clone(), subjects::DRAFTS, DOORBELL_GAP);
        reader.ring_over_nats(registry, subjects::RUNTIME_REGISTRY, DOORBELL_GAP);
        let mut told = sqlx::postgres::PgListener::connect(&database.url).await.expect("a listener");
        told.listen("atasira_events").await.expect("listens");
        let mut bell = reader.on_append();
        let mut n = 0;
        let mut submit = async || {
            n += 1;
            submit_draft(&writer, &format!("rung-{n}")).await;
        };
        // The reader hears the writer's doorbell once its subscription is live on the server.
        let seen = bell.borrow_and_update().of(&[types::DRAFT]);
        for attempt in 0.. {
            assert!(attempt < 300, "the reader never heard the writer's doorbell");
            submit().await;
            if tokio::time::timeout(Duration::from_millis(100), bell.wait_for(|a| a.of(&[types::DRAFT]) != seen)).await.is_ok() {
                break;
            }
        }
        // Then every command rings it, by the doorbell alone.
        for i in 0..20 {
            let seen = bell.borrow_and_update().of(&[types::DRAFT]);
            submit().await;
            let rung = tokio::time::timeout(ARRIVES, bell.wait_for(|a| a.of(&[types::DRAFT]) != seen)).await;
            assert!(rung.is_ok(), "command {i} did not ring the reader");
        }
        assert_eq!(no_error(&drafts, &mut errors).await, Ok(()), "a process rings its own doorbell");
        // The database was told nothing: the first notification the listener gets is a
        // marker sent after every command.
        sqlx::query("SELECT pg_notify('atasira_events', 'marker')")
            .execute(&mut sqlx::PgConnection::connect(&database.url).await.expect("connect"))
            .await
            .expect("notify");
        let first = tokio::time::timeout(ARRIVES, told.recv()).await.expect("the marker arrives").expect("listening");
        assert_eq!(first.payload(), "marker", "an append notified the database");
        // Nobody rings as another process.
        drafts.publish(subjects::doorbell(subjects::APPROVAL), "1 draft".into()).await.expect("sent");
        assert_refused(violation(&mut errors).await, "Publish", "atasira.bell.approval");
    });
}

/// Submits draft `id` in `db`: its event's id and position.
async fn submit_draft(db: &atasira_platform::store::Db, id: &str) -> (String, i64) {
    use atasira_domain::aggregates::draft::{Draft, DraftCommand};
    let request = atasira_domain::draft_request::BoxDraftCreateRequest::from_value(json!({"box_type": id, "purpose": "p"}));
    let plan = request.and_then(|r| r.plan()).expect("plan");
    let requested_by = atasira_domain::Principal::new("agent", atasira_domain::Role::Member, atasira_domain::Kind::Agent);
    let command = DraftCommand::Submit { draft_id: id.to_owned(), plan, requested_by, at: chrono::Utc::now() };
    let head = db.cqrs::<Draft>().execute_new(id, command, Default::default()).await.expect("submitted").head().expect("appended");
    (head.id, head.position)
}

#[test]
fn commits_in_a_row_ring_the_doorbell_together_and_a_read_your_writes_wait_does_not_wait_for_it() {
    // R-ARCH-6, R-BOX-9 (ADR 9): a process rings its doorbell at most once a gap, the
    // commits of the gap together, while nobody waits for its read models; a
    // read-your-writes wait in another process rings the consumers it waits for itself, so
    // it is not kept waiting by a ring held back, and waits in its own process make every
    // commit ring at once.
    use atasira_domain::aggregates::types;
    use atasira_platform::feed::FeedSource;
    use atasira_platform::projection;
    use atasira_platform::store::Db;
    const GAP: Duration = Duration::from_millis(500);
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    let database = atasira_tests::harness::Database::create();
    runtime().block_on(async {
        let (drafts, _) = connect_as(&nats, &creds, subjects::DRAFTS).await;
        let (registry, _) = connect_as(&nats, &creds, subjects::RUNTIME_REGISTRY).await;
        let (writer, reader) = (Db::connect(&database.url).await.expect("connect"), Db::connect(&database.url).await.expect("connect"));
        writer.ring_over_nats(drafts.clone(), subjects::DRAFTS, GAP);
        reader.ring_over_nats(registry.clone(), subjects::RUNTIME_REGISTRY, GAP);
        let mut rings = registry.subscribe(subjects::doorbell(subjects::DRAFTS)).await.expect("subscribed");
        registry.flush().await.expect("the subscription is in place");

        // when twenty drafts are committed one after another
        let started = std::time::Instant::now();
        let mut last = None;
        for i in 0..20 {
            last = Some(submit_draft(&writer, &format!("row-{i}")).await);
        }
        let took = started.elapsed();
        // then the doorbell rang for them at most once a gap (rather than twenty times)
        let mut rung = 0;
        while let Ok(Some(ring)) = tokio::time::timeout(GAP * 4, rings.next()).await {
            let text = String::from_utf8_lossy(&ring.payload).into_owned();
            assert!(text.ends_with(&format!(" {}", types::DRAFT)), "a ring names what was committed: {text:?}");
            rung += 1;
        }
        let most = 2 + usize::try_from(took.as_millis() / GAP.as_millis()).expect("small");
        assert!((1..=most).contains(&rung), "{rung} rings for twenty commits in {took:?}; at most {most} expected");

        // given a read model in the reader's process that reads only when rung (its
        // periodic look an hour away), caught up with the twenty
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let feeds = FeedSource { fallback: Duration::from_secs(3600), ..FeedSource::default() };
        let view = atasira_drafts::DraftsView;
        let waits_on = [projection::ReadModel::new(projection::Projection::name(&view), projection::Projection::aggregate_types(&view))];
        projection::prepare(&reader, &view).await.expect("the view's tables");
        let consumer = tokio::spawn(projection::run(reader.clone(), feeds, std::sync::Arc::new(view), shutdown));
        let (id, position) = last.expect("committed");
        assert!(projection::wait_for_events(&reader, &waits_on, &[id], position, ARRIVES).await.expect("wait").is_empty(), "the view caught up");
        // when a writer whose doorbell waits an hour between rings commits twice
        let slow = Db::connect(&database.url).await.expect("connect");
        slow.ring_over_nats(drafts, subjects::DRAFTS, Duration::from_secs(3600));
        let (first, at) = submit_draft(&slow, "rung-at-once").await;
        assert!(projection::wait_for_events(&reader, &waits_on, &[first], at, ARRIVES).await.expect("wait").is_empty(), "the first commit rang");
        let (second, at) = submit_draft(&slow, "ring-held-back").await;
        // then a wait for the second, whose ring is held back, still sees it applied
        let lagging = projection::wait_for_events(&reader, &waits_on, &[second], at, ARRIVES).await.expect("wait");
        assert!(lagging.is_empty(), "the wait was left to the held-back doorbell: {lagging:?} behind");
        // when a wait in the writer's own process wants its read models, then the ring held
        // back goes out, and while such waits come every commit rings at once
        while tokio::time::timeout(Duration::from_millis(200), rings.next()).await.is_ok() {}
        slow.wanted(&[]);
        let ring = tokio::time::timeout(ARRIVES, rings.next()).await.expect("the held-back ring went out when a wait came");
        assert!(ring.is_some());
        for i in 0..3 {
            submit_draft(&slow, &format!("waited-for-{i}")).await;
            let ring = tokio::time::timeout(ARRIVES, rings.next()).await;
            assert!(ring.is_ok(), "commit {i} did not ring at once while waits come");
        }
        let _ = stop.send(true);
        consumer.await.expect("the consumer stopped");
    });
}

#[test]
fn a_request_cannot_make_a_service_answer_on_another_services_subject() {
    // R-ARCH-10: a reply subject is chosen by whoever sends the request; a service answers
    // only into its callers' inboxes, so "replying" on approval's request subject to the
    // registry is refused.
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    runtime().block_on(async {
        let (gateway, _) = connect_as(&nats, &creds, subjects::GATEWAY).await;
        let (drafts, mut errors) = connect_as(&nats, &creds, subjects::DRAFTS).await;
        let (registry, _) = connect_as(&nats, &creds, subjects::RUNTIME_REGISTRY).await;
        let (approval, _) = connect_as(&nats, &creds, subjects::APPROVAL).await;
        let mut requests = drafts.subscribe("atasira.box.*.drafts").await.expect("drafts listens");
        let mut reservations = registry.subscribe("atasira.box.approval.runtime-registry").await.expect("the registry listens");
        until_listening(&gateway, "atasira.box.gateway.drafts", &mut requests).await;
        until_listening(&approval, "atasira.box.approval.runtime-registry", &mut reservations).await;
        for reply in ["atasira.box.approval.runtime-registry", "_INBOX.gateway.genuine"] {
            gateway.publish_with_reply("atasira.box.gateway.drafts", reply, "request".into()).await.expect("sent");
            gateway.flush().await.expect("flush");
            let request = tokio::time::timeout(ARRIVES, requests.next()).await.expect("a request").expect("open");
            drafts.publish(request.reply.expect("a reply subject"), "answer".into()).await.expect("sent");
            drafts.flush().await.expect("flush");
        }
        assert_refused(violation(&mut errors).await, "Publish", "atasira.box.approval.runtime-registry");
        assert_eq!(no_error(&drafts, &mut errors).await, Ok(()), "the answer into the gateway's inbox is allowed");
        // The refused answer was dropped where the server read it, before it reported the
        // violation: what approval sends now is the first thing the registry hears.
        approval.publish("atasira.box.approval.runtime-registry", "genuine".into()).await.expect("sent");
        approval.flush().await.expect("flush");
        let first = tokio::time::timeout(ARRIVES, reservations.next()).await.expect("a message").expect("open");
        assert_eq!(&first.payload[..], b"genuine", "the registry heard nothing from drafts");
    });
}

#[test]
fn the_gateway_publishes_no_events_and_has_no_jetstream() {
    // R-ARCH-10: only each service's relay publishes its events; only services use JetStream.
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    runtime().block_on(async {
        let (gateway, mut errors) = connect_as(&nats, &creds, subjects::GATEWAY).await;
        gateway.publish(subjects::events(subjects::DRAFTS), "forged".into()).await.expect("sent");
        gateway.flush().await.expect("flush");
        assert_refused(violation(&mut errors).await, "Publish", "atasira.box.drafts.events");
        let js = async_nats::jetstream::new(gateway.clone());
        let purge = tokio::time::timeout(Duration::from_secs(10), js.delete_stream(subjects::EVENTS_STREAM)).await;
        assert!(!matches!(purge, Ok(Ok(_))), "the gateway cannot touch the events stream");
        assert_refused(violation(&mut errors).await, "Publish", "$JS.API.STREAM.DELETE.ATASIRA_EVENTS");
        let _callout = gateway.subscribe(subjects::AUTH_CALLOUT).await.expect("sent");
        let _mine = gateway.subscribe("_INBOX.gateway.x.>").await.expect("sent");
        gateway.flush().await.expect("flush");
        assert_eq!(no_error(&gateway, &mut errors).await, Ok(()), "the gateway answers the auth callout and reads its own inbox");
    });
}

/// JetStream API calls that would let a process change what others read, or make the
/// server publish where that process may not: (subject, body). Creating streams (with a
/// republish onto the gateway's approval subject, on the auth callout's subject, as a
/// mirror), changing, purging or deleting the events stream or its messages, consumers
/// that push onto another identity's subject, reading another consumer, listing.
fn jetstream_attacks(identity: &str) -> Vec<(String, serde_json::Value)> {
    let victim = subjects::request(subjects::GATEWAY, subjects::APPROVAL);
    let stream = subjects::EVENTS_STREAM;
    let own = subjects::events(identity);
    let push = |name: &str| json!({"stream_name": stream, "config": {"durable_name": name, "deliver_subject": victim, "ack_policy": "none"}});
    vec![
        ("$JS.API.STREAM.CREATE.EVIL".into(), json!({"name": "EVIL", "subjects": [format!("{own}.x")], "republish": {"src": ">", "dest": victim}})),
        ("$JS.API.STREAM.CREATE.CALLOUT".into(), json!({"name": "CALLOUT", "subjects": [subjects::AUTH_CALLOUT]})),
        ("$JS.API.STREAM.CREATE.COPY".into(), json!({"name": "COPY", "mirror": {"name": stream}})),
        ("$JS.API.STREAM.CREATE.MERGED".into(), json!({"name": "MERGED", "sources": [{"name": stream}]})),
        (
            format!("$JS.API.STREAM.UPDATE.{stream}"),
            json!({"name": stream, "subjects": [subjects::EVENTS_WILDCARD], "republish": {"src": ">", "dest": victim}}),
        ),
        (format!("$JS.API.STREAM.PURGE.{stream}"), json!({})),
        (format!("$JS.API.STREAM.DELETE.{stream}"), json!({})),
        (format!("$JS.API.STREAM.MSG.DELETE.{stream}"), json!({"seq": 1})),
        (format!("$JS.API.STREAM.MSG.GET.{stream}"), json!({"seq": 1})),
        (format!("$JS.API.DIRECT.GET.{stream}"), json!({"seq": 1})),
        (format!("$JS.API.CONSUMER.CREATE.{stream}.push"), push("push")),
        (format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.push"), push("push")),
        (format!("$JS.API.CONSUMER.CREATE.{stream}"), json!({"stream_name": stream, "config": {"deliver_subject": victim}})),
        (
            format!("$JS.API.CONSUMER.CREATE.{stream}.{}", subjects::SENTINEL_CONSUMER),
            json!({"stream_name": stream, "config": {"durable_name": subjects::SENTINEL_CONSUMER, "deliver_subject": victim}}),
        ),
        (format!("$JS.API.CONSUMER.DELETE.{stream}.{}", subjects::SENTINEL_CONSUMER), json!({})),
        ("$JS.API.STREAM.NAMES".into(), json!({})),
        ("$JS.API.STREAM.LIST".into(), json!({})),
        ("$JS.API.INFO".into(), json!({})),
    ]
}

#[test]
fn no_process_may_change_jetstream_or_make_the_server_deliver_onto_another_identitys_subject() {
    // R-ARCH-13: every JetStream call that creates, changes, purges or deletes a stream or
    // consumer, or would make the server deliver (republish, mirror, sources, a push
    // consumer's deliver subject), is refused to every process identity; each may make
    // only the calls its code makes. The operator set the stream up (`atasira nats-setup`).
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    runtime().block_on(async {
        for identity in subjects::IDENTITIES {
            let (client, mut errors) = connect_as(&nats, &creds, identity).await;
            let mut attacks = jetstream_attacks(identity);
            if *identity != subjects::AUDIT {
                // Only the audit service reads the sentinel's consumer.
                for call in ["CONSUMER.INFO", "CONSUMER.MSG.NEXT"] {
                    attacks.push((format!("$JS.API.{call}.{}.{}", subjects::EVENTS_STREAM, subjects::SENTINEL_CONSUMER), json!({"batch": 1})));
                }
            }
            if *identity == subjects::GATEWAY {
                attacks.push((format!("$JS.API.STREAM.INFO.{}", subjects::EVENTS_STREAM), json!({})));
            }
            for (subject, body) in attacks {
                let inbox = format!("{}.attack", subjects::inbox_prefix(identity));
                client.publish_with_reply(subject.clone(), inbox, body.to_string().into()).await.expect("sent");
                client.flush().await.expect("flush");
                assert_refused(violation(&mut errors).await, "Publish", &subject);
            }
            // What its code does is allowed: a service looks the stream up, and the audit
            // service reads the sentinel's consumer.
            if subjects::SERVICES.contains(identity) {
                let js = async_nats::jetstream::new(client.clone());
                let stream = js.get_stream(subjects::EVENTS_STREAM).await.unwrap_or_else(|e| panic!("{identity} looks the events stream up: {e}"));
                if *identity == subjects::AUDIT {
                    let consumer = stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(subjects::SENTINEL_CONSUMER).await;
                    assert!(consumer.is_ok(), "the audit service reads the sentinel's consumer");
                }
                assert_eq!(no_error(&client, &mut errors).await, Ok(()), "{identity}: its own calls are allowed");
            }
        }

        // The operator sees the stream and consumer as `atasira nats-setup` made them.
        let (operator, mut errors) = connect_as(&nats, &creds, subjects::OPERATOR).await;
        let js = async_nats::jetstream::new(operator.clone());
        let names: Vec<String> = js.stream_names().collect::<Vec<_>>().await.into_iter().map(|n| n.expect("a name")).collect();
        assert_eq!(names, [subjects::EVENTS_STREAM], "no stream was created");
        let mut stream = js.get_stream(subjects::EVENTS_STREAM).await.expect("the events stream");
        let config = stream.info().await.expect("info").config.clone();
        assert_eq!(config.subjects, [subjects::EVENTS_WILDCARD]);
        assert!(config.republish.is_none() && config.mirror.is_none() && config.sources.as_ref().is_none_or(Vec::is_empty), "{config:?}");
        let consumers: Vec<String> = stream.consumer_names().collect::<Vec<_>>().await.into_iter().map(|n| n.expect("a name")).collect();
        assert_eq!(consumers, [subjects::SENTINEL_CONSUMER], "no consumer was created or deleted");
        let sentinel = stream.consumer_info(subjects::SENTINEL_CONSUMER).await.expect("the sentinel's consumer");
        assert!(sentinel.config.deliver_subject.is_none(), "a pull consumer");
        // The operator speaks for no process.
        operator.publish(subjects::request(subjects::GATEWAY, subjects::APPROVAL), "x".into()).await.expect("sent");
        operator.flush().await.expect("flush");
        assert_refused(violation(&mut errors).await, "Publish", "atasira.box.gateway.approval");
    });
}

#[test]
fn a_pull_or_an_acknowledgement_sent_to_another_subject_never_reads_as_a_request_there() {
    // R-ARCH-13, the residual risk of what services may call: nats-server delivers a pulled
    // message, and a publish acknowledgement, to whatever reply subject the caller names.
    // A pulled message keeps the events subject it was stored under, so the approval
    // service never takes it for a request of the gateway's.
    let (dir, nats) = authenticated_nats();
    let creds = dir.0.join("nats");
    runtime().block_on(async {
        let (approval, _) = connect_as(&nats, &creds, subjects::APPROVAL).await;
        let mut listening = approval.subscribe("atasira.box.*.approval").await.expect("subscribed");
        approval.flush().await.expect("flush");
        let (audit, mut audit_errors) = connect_as(&nats, &creds, subjects::AUDIT).await;
        // Something in the stream for the sentinel to hand out (the audit service publishes
        // its own events), then a pull whose answers go to the gateway's approval subject.
        let js = async_nats::jetstream::new(audit.clone());
        js.publish(subjects::events(subjects::AUDIT), "crafted".into()).await.expect("sent").await.expect("stored");
        let next = format!("$JS.API.CONSUMER.MSG.NEXT.{}.{}", subjects::EVENTS_STREAM, subjects::SENTINEL_CONSUMER);
        let victim = subjects::request(subjects::GATEWAY, subjects::APPROVAL);
        audit.publish_with_reply(next, victim.clone(), json!({"batch": 1, "expires": 2_000_000_000}).to_string().into()).await.expect("sent");
        audit.publish_with_reply(subjects::events(subjects::AUDIT), victim.clone(), "crafted again".into()).await.expect("sent");
        audit.flush().await.expect("flush");
        assert_eq!(no_error(&audit, &mut audit_errors).await, Ok(()));
        let mut seen = Vec::new();
        while let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(3), listening.next()).await {
            seen.push((message.subject.to_string(), message.payload.clone()));
        }
        for (subject, payload) in &seen {
            let as_request = subjects::origin(subject, subjects::APPROVAL).is_some();
            assert!(!as_request || !payload.starts_with(b"crafted"), "a crafted payload arrived as a request on {subject}");
        }
        assert!(seen.iter().any(|(s, p)| s == "atasira.box.audit.events" && &p[..] == b"crafted"), "the pull did go astray, under its own subject: {seen:?}");
    });
}

#[test]
fn the_cluster_runs_the_c9_flow_within_its_permissions() {
    // R-ARCH-10: every request the processes make is one the table allows; nats-server
    // reports no violation to any process along a whole approval.
    let mut sys = System::start(Mode::Cluster);
    let draft = sys.draft(&json!({"box_type": "perm-check", "purpose": "p", "tools": ["Read"]}));
    let approved = sys.approve(&draft, &sys.admin.clone(), false);
    assert_eq!(approved.status, 200, "{}", approved.raw);
    assert_eq!(sys.get("/api/v1/audit/verify", &sys.admin.clone()).status, 200);
    for name in ["serve gateway", "serve drafts", "serve approval", "serve runtime-registry", "serve provisioner", "serve audit"] {
        let log = sys.proc(name).stderr_text();
        assert!(!log.to_lowercase().contains("permissions violation"), "{name} met a NATS permission violation:\n{log}");
    }
}

#[test]
fn a_service_started_with_another_services_credentials_serves_nothing() {
    // R-ARCH-10: the approval process run with drafts' key cannot answer approval requests.
    let mut sys = System::start(Mode::Cluster);
    let draft = sys.draft(&json!({"box_type": "imposter", "purpose": "p", "tools": ["Read"]}));
    sys.kill("serve approval");
    let drafts_creds = sys.nats_creds(subjects::DRAFTS).display().to_string();
    sys.start_service("approval", &[("ATASIRA_NATS_CREDS", drafts_creds)]);
    sys.proc("serve approval").wait_stderr("Permissions Violation", Duration::from_secs(60));
    let refused = sys.approve(&draft, &sys.admin.clone(), false);
    assert_eq!(refused.status, 503, "nobody serves approval (no responders): {}", refused.raw);
    assert_eq!(sys.pending().len(), 1, "the draft is still pending");
}

#[test]
fn cluster_mode_without_credentials_refuses_to_start_unless_told_it_is_insecure() {
    // R-ARCH-10: secure by default; --insecure-nats is explicit and keeps warning.
    let bin = atasira_bin();
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(&bin);
        cmd.args(["serve", "drafts", "--database-url", "not-a-database-url"]).args(extra);
        cmd.env_remove("ATASIRA_NATS_CREDS").env_remove("ATASIRA_INSECURE_NATS");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output_within(SUBPROCESS_LIMIT).expect("runs");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = run(&[], &[]);
    assert!(!ok && err.contains("--nats-creds") && err.contains("--insecure-nats"), "{err}");

    let tmp = TempDir::new("atasira-creds");
    let out = tmp.0.join("c");
    assert!(
        std::process::Command::new(&bin)
            .args(["nats-config", "--out", out.to_str().expect("utf-8")])
            .output_within(SUBPROCESS_LIMIT)
            .expect("runs")
            .status
            .success()
    );
    let drafts = out.join("drafts.creds");
    use std::os::unix::fs::PermissionsExt;
    let chmod = |p: &Path, mode: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    chmod(&drafts, 0o644);
    let (ok, err) = run(&["--nats-creds", drafts.to_str().expect("utf-8")], &[]);
    assert!(!ok && err.contains("chmod 600"), "a credentials file others can read is refused: {err}");
    assert!(!err.contains(&seed(&out, "drafts")), "the error never shows the seed");
    let (ok, err) = run(&["--nats-creds", out.join("gateway.creds").to_str().expect("utf-8")], &[]);
    assert!(!ok && err.contains("gateway's NATS credentials"), "{err}");
    std::fs::write(tmp.0.join("garbage.creds"), "-----BEGIN USER NKEY SEED-----\nSUNOTASEED\n------END USER NKEY SEED------\n").expect("write");
    chmod(&tmp.0.join("garbage.creds"), 0o600);
    let (ok, err) = run(&["--nats-creds", tmp.0.join("garbage.creds").to_str().expect("utf-8")], &[]);
    assert!(!ok && err.contains("no valid seed") && !err.contains("SUNOTASEED"), "{err}");

    // With --insecure-nats it goes on (and stops later, at the database URL).
    for (args, env) in [(&["--insecure-nats"][..], &[][..]), (&[], &[("ATASIRA_INSECURE_NATS", "1")]), (&[], &[("ATASIRA_INSECURE_NATS", "true")])] {
        let (ok, err) = run(args, env);
        assert!(!ok && err.contains("unsupported database URL") && !err.contains("--nats-creds FILE"), "{err}");
    }
    let (ok, err) = run(&[], &[("ATASIRA_INSECURE_NATS", "false")]);
    assert!(!ok && err.contains("--nats-creds FILE"), "false means false: {err}");
    // Credentials win over an --insecure-nats left in the environment.
    chmod(&drafts, 0o600);
    let (ok, err) = run(&["--nats-creds", drafts.to_str().expect("utf-8")], &[("ATASIRA_INSECURE_NATS", "true")]);
    assert!(!ok && err.contains("unsupported database URL"), "{err}");
}
