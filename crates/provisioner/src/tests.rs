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
use atasira_domain::assertion::{AssertionKey, AssertionKeys};
use atasira_domain::token::{ApprovalSigner, Keyring};
use atasira_domain::{BoxManifest, Kind, Principal, Role};
use atasira_platform::bus::InprocBus;
use atasira_platform::db::Db;
use atasira_platform::feed::FeedSource;

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

fn runtime(db: &Db) -> Runtime {
    let key = AssertionKey::new("internal-1", &[7u8; 32]).expect("key");
    Runtime {
        db: db.clone(),
        bus: Arc::new(InprocBus::default()),
        feeds: FeedSource::default(),
        assertion_keys: Arc::new(AssertionKeys::new(key, vec![])),
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
    db.cqrs::<BoxAggregate>().execute(box_id, command, metadata).await.expect("activated");
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
    let config = ProvisionerConfig { data_dir, backoff: fast() };
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
    db.cqrs::<BoxAggregate>().execute("b1", assign, HashMap::new()).await.expect("assigned");
    let last = activate(&db, "b2", "d2", "box_type: support\npurpose: Answer tickets.\n").await;

    // when
    let rt = runtime(&db);
    let (tx, handle) = start(&rt, data_dir.clone());
    wait_until("two access outcomes", || async { access_events(&db).await.len() >= 2 }).await;
    wait_until("the checkpoint to pass b2", || async { proj::checkpoint(&db, CHECKPOINT).await.expect("checkpoint") >= last.position }).await;

    // then: one event per entry, on access <box_id>/<index>
    let events = access_events(&db).await;
    assert_eq!(events.iter().map(|e| e.aggregate_id.as_str()).collect::<Vec<_>>(), ["b1/0", "b1/1"]);
    let decoded: Vec<AccessEvent> = events.iter().map(|e| serde_json::from_value(e.payload.clone()).expect("access event")).collect();
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
async fn given_the_endpoint_when_asked_anything_but_a_wait_then_invalid_request() {
    // R-PROV-1: the provisioner's only request is the read-your-writes wait
    let tmp = TempDir::new("atasira-prov-bus");
    let db = Db::connect(&Db::sqlite_url(&tmp.0)).await.expect("db");
    let rt = runtime(&db);
    let (tx, handle) = start(&rt, tmp.0.join("data"));
    let env = atasira_contracts::envelope(&v1::GetDraft { draft_id: "d1".into() }, "corr", "");
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
