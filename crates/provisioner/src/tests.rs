//! Given/when/then tests of the provisioner: the retry policy, and the whole service on an
//! SQLite store with the in-process bus (R-PROV-1).

use prost::Message as _;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::v1;
use atasira_domain::ErrorCode;
use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxCommand};
use atasira_domain::assertion::AssertionSigner;
use atasira_domain::token::{ApprovalSigner, Keyring};
use atasira_domain::{BoxManifest, Kind, Principal, Role};
use atasira_platform::bus::InprocBus;
use atasira_platform::feed::FeedSource;
use atasira_platform::keys::AssertionKeys;
use atasira_platform::store::Db;

use super::*;
use crate::setup::tests::{TempDir, bare_repo_with_a_commit};

fn fast() -> Backoff {
    Backoff { attempts: 3, initial: Duration::from_millis(10), max: Duration::from_millis(40) }
}

#[test]
fn given_no_override_when_the_backoff_is_built_then_5_attempts_1s_doubling_capped_at_30s() {
    // R-PROV-1: 5 attempts, 1 s doubling to 30 s
    let b = Backoff::default();
    assert_eq!(b, Backoff::with_initial(Duration::from_secs(1)));
    assert_eq!(b.attempts, 5);
    let delays: Vec<u64> = (1..=7).map(|n| b.delay(n).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
    assert_eq!(b.delay(u32::MAX), Duration::from_secs(30));
}

#[test]
fn given_another_first_delay_when_the_backoff_is_built_then_only_the_first_delay_changes() {
    // R-PROV-1 (tests shorten the delays with ATASIRA_PROVISION_BACKOFF_MS, via the binary)
    let b = Backoff::with_initial(Duration::from_millis(10));
    assert_eq!((b.attempts, b.initial, b.max), (5, Duration::from_millis(10), Duration::from_secs(30)));
    assert_eq!(b.delay(3), Duration::from_millis(40));
    assert_eq!(Backoff::with_initial(Duration::from_secs(60)).max, Duration::from_secs(60));
}

#[tokio::test]
async fn given_an_unreachable_remote_when_provisioned_then_failed_after_exactly_the_attempts() {
    // R-PROV-1: retries with backoff, then the failure with git's reason
    let tmp = TempDir::new("atasira-prov-retry");
    let setups = Setups::new(tmp.0.clone());
    let bt = BoxType::parse("sales").expect("bt");
    let access = RequiredAccess::GitRemote { url: "file:///nonexistent/repo.git".into() };
    let outcome = provision(&setups, &fast(), &bt, &access).await;
    assert_eq!(outcome.attempts, 3);
    let reason = outcome.result.expect_err("failed");
    assert!(reason.contains("/nonexistent/repo.git"), "{reason}");
}

#[tokio::test]
async fn given_a_refused_url_when_provisioned_then_failed_at_once_without_retries() {
    // R-PROV-1: a bad scheme fails without running git (and retrying cannot help)
    let tmp = TempDir::new("atasira-prov-retry");
    let setups = Setups::new(tmp.0.clone()).with_git(tmp.0.join("no-such-git"));
    let bt = BoxType::parse("sales").expect("bt");
    let pwned = tmp.0.join("pwned");
    let access = RequiredAccess::GitRemote { url: format!("ext::sh -c touch% {}", pwned.display()) };
    let outcome = provision(&setups, &fast(), &bt, &access).await;
    assert_eq!(outcome.attempts, 1);
    assert!(outcome.result.expect_err("refused").contains("is refused"));
    assert!(!pwned.exists());
}

/// A fixed signing key of `issuer` (the processes that call the provisioner).
fn signer(issuer: &str) -> AssertionSigner {
    AssertionSigner::new(format!("{issuer}-test"), issuer, &[issuer.len() as u8; 32], chrono::Utc::now())
}

fn runtime(db: &Db) -> Runtime {
    let known = [subjects::GATEWAY, subjects::RUNTIME_REGISTRY].map(|issuer| signer(issuer).public_key());
    Runtime {
        db: db.clone(),
        bus: Arc::new(InprocBus::default()),
        feeds: FeedSource::default(),
        assertion_keys: AssertionKeys::fixed(None, known),
        guards: Default::default(),
    }
}

/// Activates Box `box_id` from `yaml` the only way there is: with a verified token.
async fn activate(db: &Db, box_id: &str, draft_id: &str, yaml: &str) -> StoredEvent {
    let manifest: BoxManifest = BoxManifest::from_yaml_str(yaml).expect("valid manifest").manifest;
    let signer = ApprovalSigner::from_secret("k1".into(), [9; 32]);
    let now = chrono::Utc::now();
    let token = signer.issue(draft_id, manifest.box_type.as_str(), &manifest.digest(), "alice", now);
    let approval = Keyring::new(vec![signer.public_key()]).verify(&token, now).expect("verifies");
    let command = BoxCommand::Activate { box_id: box_id.into(), draft_id: draft_id.into(), manifest, approval, at: now };
    let metadata = HashMap::from([("correlation_id".to_owned(), format!("corr-{box_id}"))]);
    db.cqrs::<BoxAggregate>().execute(box_id, command, metadata, atasira_platform::store::Retry::ONCE).await.expect("activated");
    last_box_event(db, box_id).await
}

async fn last_box_event(db: &Db, box_id: &str) -> StoredEvent {
    let events = db.events_after(0, &["box"], 1000).await.expect("events");
    events.into_iter().rfind(|e| e.aggregate_id == box_id).expect("a box event")
}

async fn access_events(db: &Db) -> Vec<StoredEvent> {
    db.events_after(0, &["access"], 1000).await.expect("events")
}

async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ask_wait(rt: &Runtime, position: i64, event_ids: Vec<String>, timeout_ms: u32) -> Vec<String> {
    let request = v1::WaitForPosition { position, timeout_ms, event_ids };
    let env = atasira_contracts::envelope(&request, "corr-wait", "");
    let subject = subjects::request(subjects::GATEWAY, SERVICE);
    let bytes = rt.bus.request(&subject, BTreeMap::new(), bytes::Bytes::from(env.encode_to_vec()), Duration::from_secs(10)).await.expect("answered");
    let (reply, _) = atasira_contracts::decode_reply::<v1::WaitForPositionReply>(&bytes).expect("decodes").expect("not refused");
    reply.lagging
}

fn start(rt: &Runtime, data_dir: PathBuf) -> (watch::Sender<bool>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let (tx, rx) = watch::channel(false);
    let config = ProvisionerConfig { data_dir, backoff: fast(), binding_ttl: atasira_domain::worker::DEFAULT_BINDING_TTL };
    (tx, tokio::spawn(run(rt.clone(), config, rx)))
}

async fn stop(tx: watch::Sender<bool>, handle: tokio::task::JoinHandle<anyhow::Result<()>>) {
    tx.send(true).expect("service listening");
    tokio::time::timeout(Duration::from_secs(10), handle).await.expect("stops promptly").expect("no panic").expect("clean exit");
}

#[tokio::test]
async fn given_an_activation_with_a_good_and_a_bad_remote_when_the_service_runs_then_both_outcomes_are_events_and_the_box_is_untouched() {
    // R-PROV-1: best-effort, each outcome an event on access <box_id>/<index>, a failure
    // never touches the Box, idempotent on redelivery
    let tmp = TempDir::new("atasira-prov-e2e");
    let bare = bare_repo_with_a_commit(&tmp.0);
    let data_dir = tmp.0.join("data");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let db = Db::connect(&Db::sqlite_url(&data_dir)).await.expect("db");

    // given: b1 with two entries, a later non-activation event of b1, and b2 with none
    let yaml = format!(
        "box_type: sales\npurpose: Report sales.\nrequired_access:\n  - {{type: git_remote, url: \"{}\"}}\n  - {{type: git_remote, url: \"file:///nonexistent/repo.git\"}}\n",
        bare.display()
    );
    let activated = activate(&db, "b1", "d1", &yaml).await;
    let alice = Principal::new("alice", Role::Admin, Kind::Human);
    let assign =
        BoxCommand::AssignUser { by: alice, user_id: "dave".into(), role_in_box: atasira_domain::aggregates::boxes::BoxRole::Member, at: chrono::Utc::now() };
    db.cqrs::<BoxAggregate>().execute("b1", assign, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("assigned");
    let last = activate(&db, "b2", "d2", "box_type: support\npurpose: Answer tickets.\n").await;

    // when
    let rt = runtime(&db);
    let (tx, handle) = start(&rt, data_dir.clone());
    wait_until("two access outcomes", || async { access_events(&db).await.len() >= 2 }).await;
    wait_until("the checkpoint to pass b2", || async { proj::checkpoint(&db, CHECKPOINT).await.expect("checkpoint") >= last.position }).await;

    // then: one event per entry, on access <box_id>/<index>
    let events = access_events(&db).await;
    assert_eq!(events.iter().map(|e| e.aggregate_id.as_str()).collect::<Vec<_>>(), ["b1/0", "b1/1"]);
    let decoded: Vec<AccessEvent> = events.iter().map(|e| e.decode().expect("access event")).collect();
    let AccessEvent::AccessProvisioned { index: 0, attempts: 1, detail, box_type, .. } = &decoded[0] else {
        panic!("expected AccessProvisioned: {:?}", decoded[0])
    };
    assert_eq!((detail.as_str(), box_type.as_str()), (format!("cloned {} into workspaces/sales", bare.display()).as_str(), "sales"));
    let AccessEvent::AccessProvisionFailed { index: 1, attempts: 3, reason, access, .. } = &decoded[1] else {
        panic!("expected AccessProvisionFailed: {:?}", decoded[1])
    };
    assert!(reason.contains("/nonexistent/repo.git"), "{reason}");
    assert_eq!(access, "git_remote file:///nonexistent/repo.git");
    assert_eq!(events[1].metadata["causation_id"], activated.event_id.as_str());
    assert_eq!(events[1].metadata["correlation_id"], "corr-b1");
    assert!(data_dir.join("workspaces/sales/.git").exists());
    assert!(!data_dir.join("workspaces/support").exists());
    let b1_events = db.events_after(0, &["box"], 1000).await.expect("events").into_iter().filter(|e| e.aggregate_id == "b1").count();
    assert_eq!(b1_events, 2, "the Box has only its own events");

    // then: the gateway can wait for it, by position and by event id
    assert!(ask_wait(&rt, last.position, vec![], 5_000).await.is_empty());
    assert!(ask_wait(&rt, 0, vec![activated.event_id.clone(), "draft/d1/1".into()], 5_000).await.is_empty());
    assert_eq!(ask_wait(&rt, last.position + 1_000, vec![], 10).await, [CHECKPOINT]);
    stop(tx, handle).await;

    // when: the checkpoint is lost (a crash before it was stored) and everything comes again
    sqlx::query("DELETE FROM projection_checkpoints WHERE name = $1").bind(CHECKPOINT).execute(db.any()).await.expect("reset");
    let rt = runtime(&db);
    let (tx, handle) = start(&rt, data_dir.clone());
    wait_until("the redelivered events", || async { proj::checkpoint(&db, CHECKPOINT).await.expect("checkpoint") >= last.position }).await;
    stop(tx, handle).await;

    // then: the setups ran again and the aggregate dropped the duplicate outcomes
    assert_eq!(access_events(&db).await.len(), 2);
    assert!(data_dir.join("workspaces/sales/README.md").exists());
}

#[tokio::test]
async fn given_the_endpoint_when_asked_what_the_provisioner_does_not_answer_then_invalid_request() {
    // R-PROV-1, R-WORKER-3: the provisioner answers waits and execution bindings, nothing else
    let tmp = TempDir::new("atasira-prov-bus");
    let db = Db::connect(&Db::sqlite_url(&tmp.0)).await.expect("db");
    let rt = runtime(&db);
    let (tx, handle) = start(&rt, tmp.0.join("data"));
    let env = atasira_contracts::envelope(&v1::GetDraft { draft_id: "d1".into(), ..Default::default() }, "corr", "");
    let subject = subjects::request(subjects::GATEWAY, SERVICE);
    let mut answer = Err(atasira_platform::bus::BusError::Other("not asked yet".into()));
    // The endpoint is registered as the service starts.
    for _ in 0..500 {
        answer = rt.bus.request(&subject, BTreeMap::new(), bytes::Bytes::from(env.encode_to_vec()), Duration::from_secs(5)).await;
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refusal = atasira_contracts::decode_reply::<v1::WaitForPositionReply>(&answer.expect("answered")).expect("decodes").expect_err("refused");
    assert_eq!(refusal.code, ErrorCode::InvalidRequest);
    stop(tx, handle).await;
}

// ---- execution bindings (R-WORKER-3, R-WORKER-6) ----

use atasira_domain::aggregates::binding::{BindingCommand, BindingEvent, ExecutionBinding};
use atasira_domain::aggregates::boxes::BoxRole;
use atasira_domain::worker::worker_id_for;

fn start_with_ttl(rt: &Runtime, data_dir: PathBuf, binding_ttl: Duration) -> (watch::Sender<bool>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let (tx, rx) = watch::channel(false);
    let config = ProvisionerConfig { data_dir, backoff: fast(), binding_ttl };
    (tx, tokio::spawn(run(rt.clone(), config, rx)))
}

/// Sends `message` to the provisioner from `from`, signed for `principal` as atasira's
/// processes do; the answer, with the ids of the events it wrote.
async fn ask<M: atasira_contracts::Named, R: atasira_contracts::Named>(
    rt: &Runtime,
    from: &str,
    principal: &Principal,
    message: &M,
) -> Result<(R, Vec<String>), atasira_contracts::Refused> {
    let subject = subjects::request(from, SERVICE);
    let correlation = format!("corr-{}", uuid::Uuid::new_v4().simple());
    let env = atasira_contracts::signed_envelope(&signer(from), principal, &subject, message, &correlation, "", chrono::Utc::now());
    let mut answer = Err(atasira_platform::bus::BusError::Other("not asked yet".into()));
    // The endpoint is registered as the service starts.
    for _ in 0..500 {
        answer = rt.bus.request(&subject, BTreeMap::new(), bytes::Bytes::from(env.encode_to_vec()), Duration::from_secs(10)).await;
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    atasira_contracts::decode_written::<R>(&answer.expect("answered")).expect("decodes").map(|w| (w.reply, w.event_ids))
}

async fn prepare(rt: &Runtime, principal: &Principal, box_id: &str, launch_id: &str) -> Result<v1::BindingLease, atasira_contracts::Refused> {
    let request = v1::PrepareBinding { box_id: box_id.into(), launch_id: launch_id.into() };
    ask::<_, v1::BindingLease>(rt, subjects::GATEWAY, principal, &request).await.map(|(lease, _)| lease)
}

async fn claim(rt: &Runtime, principal: &Principal, handle: &str, box_id: &str, launch_id: &str) -> Result<Vec<String>, atasira_contracts::Refused> {
    let request = v1::ConsumeBinding { handle: handle.into(), box_id: box_id.into(), worker_id: worker_id_for(launch_id) };
    ask::<_, v1::Ack>(rt, subjects::RUNTIME_REGISTRY, principal, &request).await.map(|(_, ids)| ids)
}

async fn binding_events(db: &Db) -> Vec<(String, BindingEvent)> {
    let events = db.events_after(0, &[atasira_domain::aggregates::types::EXECUTION_BINDING], 1000).await.expect("events");
    events.into_iter().map(|e| (e.aggregate_id.clone(), e.decode().expect("binding event"))).collect()
}

fn code<T: std::fmt::Debug>(answer: Result<T, atasira_contracts::Refused>) -> ErrorCode {
    answer.expect_err("refused").code
}

#[tokio::test]
async fn r_worker_3_a_binding_is_prepared_for_who_may_launch_on_an_active_box_and_claimed_by_one_worker() {
    // given: Box b1 (sales, with tools) with erin assigned, Box b2, and the provisioner
    let tmp = TempDir::new("atasira-prov-bind");
    let data_dir = tmp.0.join("data");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let db = Db::connect(&Db::sqlite_url(&data_dir)).await.expect("db");
    activate(&db, "b1", "d1", "box_type: sales\npurpose: Report sales.\ntools: [read_file]\nos_operations: [\"browser:navigate\"]\n").await;
    activate(&db, "b2", "d2", "box_type: support\npurpose: Answer tickets.\n").await;
    let alice = Principal::new("alice", Role::Admin, Kind::Human);
    let erin = Principal::new("erin", Role::Member, Kind::Human);
    let mallory = Principal::new("mallory", Role::Member, Kind::Human);
    let assign = BoxCommand::AssignUser { by: alice.clone(), user_id: "erin".into(), role_in_box: BoxRole::Member, at: chrono::Utc::now() };
    db.cqrs::<BoxAggregate>().execute("b1", assign, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("assigned");
    let rt = runtime(&db);
    let (tx, handle) = start(&rt, data_dir.clone());

    // when erin prepares a binding for her launch; then only a handle and a lease come back
    let lease = prepare(&rt, &erin, "b1", "launch-1").await.expect("prepared");
    assert!(lease.handle.starts_with("bnd_") && lease.handle.len() == 36, "{}", lease.handle);
    let expires_at = atasira_contracts::convert::time_from_wire(lease.expires_at.as_ref()).expect("a lease");
    assert!(expires_at > chrono::Utc::now() + chrono::TimeDelta::minutes(9), "the default lease is 10 minutes");
    // and the store holds what only the execution host knows: the workspace exists
    let events = binding_events(&db).await;
    let [(id, BindingEvent::BindingPrepared { box_id, launch_id, prepared_by, workspace, tool_scope, ticket_access, execution_host, .. })] = events.as_slice()
    else {
        panic!("expected one BindingPrepared: {events:?}")
    };
    assert_eq!((id, box_id.as_str(), launch_id.as_str(), prepared_by.as_str()), (&lease.handle, "b1", "launch-1", "erin"));
    let expected = std::path::absolute(data_dir.join("workspaces/sales")).expect("absolute");
    assert_eq!(std::path::Path::new(workspace), expected);
    assert!(expected.is_dir());
    assert_eq!(
        (tool_scope.clone(), ticket_access.as_str(), execution_host.as_str()),
        (vec!["read_file".to_owned(), "browser:navigate".to_owned()], "referenced", "local")
    );

    // when the registry claims it for erin's Worker; then consumed, once
    let ids = claim(&rt, &erin, &lease.handle, "b1", "launch-1").await.expect("claimed");
    assert_eq!(ids, [format!("execution_binding/{}/2", lease.handle)]);
    assert!(claim(&rt, &erin, &lease.handle, "b1", "launch-1").await.is_ok(), "a retried claim of the same Worker");
    assert_eq!(binding_events(&db).await.len(), 2);
    assert_eq!(code(claim(&rt, &erin, &lease.handle, "b1", "launch-2").await), ErrorCode::BindingUnusable, "another Worker");
    assert_eq!(code(claim(&rt, &erin, &lease.handle, "b2", "launch-1").await), ErrorCode::BindingBoxMismatch);
    assert_eq!(code(claim(&rt, &erin, &format!("bnd_{}", "0".repeat(32)), "b1", "launch-1").await), ErrorCode::BindingNotFound);
    assert_eq!(code(claim(&rt, &erin, "../../etc/passwd", "b1", "launch-1").await), ErrorCode::BindingNotFound);

    // a binding prepared for Box A is not used for Box B, nor for another user's launch
    let other = prepare(&rt, &alice, "b1", "launch-3").await.expect("an admin may launch");
    assert_eq!(code(claim(&rt, &alice, &other.handle, "b2", "launch-3").await), ErrorCode::BindingBoxMismatch);
    assert_eq!(code(claim(&rt, &erin, &other.handle, "b1", "launch-3").await), ErrorCode::BindingUnusable);

    // each request comes from its one sender only
    let request = v1::PrepareBinding { box_id: "b1".into(), launch_id: "launch-4".into() };
    assert_eq!(code(ask::<_, v1::BindingLease>(&rt, subjects::RUNTIME_REGISTRY, &alice, &request).await), ErrorCode::Forbidden);
    let request = v1::ConsumeBinding { handle: other.handle.clone(), box_id: "b1".into(), worker_id: worker_id_for("launch-3") };
    assert_eq!(code(ask::<_, v1::Ack>(&rt, subjects::GATEWAY, &alice, &request).await), ErrorCode::Forbidden);
    // a launch_id out of bounds is refused naming it
    let refused = prepare(&rt, &alice, "b1", "a b").await.expect_err("refused");
    assert_eq!((refused.code, refused.field_errors[0].key.as_str()), (ErrorCode::InvalidRequest, "launch_id"));

    // who may not launch is refused, and it is recorded
    let refused = prepare(&rt, &mallory, "b1", "launch-5").await.expect_err("refused");
    assert_eq!(refused.code, ErrorCode::Forbidden);
    let violations = db.events_after(0, &[atasira_domain::aggregates::types::PROVISIONER_SECURITY], 100).await.expect("events");
    assert_eq!(violations.len(), 1);
    assert_eq!(refused.event_ids, [violations[0].event_id.clone()]);
    let recorded = &violations[0].payload["SecurityViolation"];
    assert_eq!((recorded["actor"].as_str(), recorded["target"].as_str(), recorded["kind"].as_str()), (Some("mallory"), Some("b1"), Some("launch_forbidden")));

    // an unknown or stopped Box is not active
    assert_eq!(code(prepare(&rt, &alice, "no-such-box", "launch-6").await), ErrorCode::BoxNotActive);
    db.cqrs::<BoxAggregate>()
        .execute("b2", BoxCommand::Stop { by: alice.clone(), at: chrono::Utc::now() }, HashMap::new(), atasira_platform::store::Retry::ONCE)
        .await
        .expect("stopped");
    assert_eq!(code(prepare(&rt, &alice, "b2", "launch-7").await), ErrorCode::BoxNotActive);
    stop(tx, handle).await;
}

#[tokio::test]
async fn r_worker_3_bindings_nobody_claimed_expire_after_their_lease_and_claimed_ones_never_do() {
    // given: the provisioner with a 1 s lease and two bindings, one of them claimed
    let tmp = TempDir::new("atasira-prov-lease");
    let data_dir = tmp.0.join("data");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let db = Db::connect(&Db::sqlite_url(&data_dir)).await.expect("db");
    activate(&db, "b1", "d1", "box_type: sales\npurpose: Report sales.\n").await;
    let alice = Principal::new("alice", Role::Admin, Kind::Human);
    let rt = runtime(&db);
    let (tx, handle) = start_with_ttl(&rt, data_dir.clone(), Duration::from_secs(1));
    let unused = prepare(&rt, &alice, "b1", "launch-1").await.expect("prepared");
    let used = prepare(&rt, &alice, "b1", "launch-2").await.expect("prepared");
    claim(&rt, &alice, &used.handle, "b1", "launch-2").await.expect("claimed in time");

    // when the lease is over; then the unused one is swept, and refused as expired
    let expired =
        |events: &[(String, BindingEvent)], handle: &str| events.iter().any(|(id, e)| id == handle && matches!(e, BindingEvent::BindingExpired { .. }));
    wait_until("the unused binding to expire", || async { expired(&binding_events(&db).await, &unused.handle) }).await;
    assert_eq!(code(claim(&rt, &alice, &unused.handle, "b1", "launch-1").await), ErrorCode::BindingExpired);
    // and the claimed one is the Worker's for good
    assert!(!expired(&binding_events(&db).await, &used.handle));
    assert!(claim(&rt, &alice, &used.handle, "b1", "launch-2").await.is_ok());
    stop(tx, handle).await;
}

#[tokio::test]
async fn r_worker_3_the_sweeper_finds_open_bindings_in_the_store_and_expires_each_once() {
    // given: bindings recorded before the sweeper ran: one past its lease, one leased for
    // an hour, one past its lease but claimed
    let tmp = TempDir::new("atasira-prov-sweep");
    let db = Db::connect(&Db::sqlite_url(&tmp.0)).await.expect("db");
    let cqrs = db.cqrs::<ExecutionBinding>();
    let now = chrono::Utc::now();
    for (handle, launch, expires_at) in [
        ("bnd_past", "l1", now - chrono::TimeDelta::seconds(5)),
        ("bnd_future", "l2", now + chrono::TimeDelta::hours(1)),
        ("bnd_claimed", "l3", now + chrono::TimeDelta::milliseconds(1)),
    ] {
        let command = BindingCommand::Prepare {
            handle: handle.into(),
            box_id: "b1".into(),
            launch_id: launch.into(),
            prepared_by: "alice".into(),
            execution_host: "local".into(),
            workspace: "/w".into(),
            tool_scope: vec![],
            ticket_access: "referenced".into(),
            expires_at,
            at: now - chrono::TimeDelta::minutes(10),
        };
        cqrs.execute(handle, command, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("prepared");
    }
    let consume = BindingCommand::Consume { box_id: "b1".into(), worker_id: worker_id_for("l3"), by: "alice".into(), now };
    cqrs.execute("bnd_claimed", consume, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("claimed");
    tokio::time::sleep(Duration::from_millis(5)).await;

    // when it sweeps, twice; then only the open binding past its lease expired, once
    let mut open = bindings::OpenBindings::default();
    assert_eq!(bindings::sweep_once(&db, &cqrs, &mut open).await.expect("swept"), 1);
    assert_eq!(bindings::sweep_once(&db, &cqrs, &mut open).await.expect("swept"), 0);
    let names: Vec<(String, &str)> = binding_events(&db).await.into_iter().map(|(id, e)| (id, e.name())).collect();
    let expired: Vec<&str> = names.iter().filter(|(_, n)| *n == "BindingExpired").map(|(id, _)| id.as_str()).collect();
    assert_eq!(expired, ["bnd_past"]);
    // and a sweeper started afresh finds nothing more to do
    assert_eq!(bindings::sweep_once(&db, &cqrs, &mut bindings::OpenBindings::default()).await.expect("swept"), 0);
}
