//! The registry's side of a Worker launch (R-WORKER-1..7): its small rules, and the real
//! registry in process, on an SQLite store and the in-process bus, with an approved and
//! activated Box and a stand-in provisioner that answers `ConsumeBinding` (the
//! provisioner's own rules are its tests').

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{Named, Refused, reply_ok, signed_envelope, subjects, v1};
use atasira_domain::aggregates::approval_keys::{ApprovalKeys, ApprovalKeysCommand, KEYS_ID};
use atasira_domain::aggregates::boxes::box_id_for;
use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::aggregates::types;
use atasira_domain::assertion::AssertionSigner;
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::token::ApprovalSigner;
use atasira_domain::worker::worker_id_for;
use atasira_domain::{ErrorCode, Kind, Principal, Role};
use atasira_platform::bus::InprocBus;
use atasira_platform::feed::FeedSource;
use atasira_platform::keys::AssertionKeys;
use atasira_platform::refusal::Refusal;
use atasira_platform::service::serve;
use atasira_platform::store::Db;
use prost::Message as _;
use sqlx::Row as _;

use super::*;
use crate::SERVICE;
use crate::{RegistryConfig, Runtime, WorkersView, run};

/// A data directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("atasira-registry-workers-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn alice() -> Principal {
    Principal::new("alice", Role::Admin, Kind::Human)
}
fn dave() -> Principal {
    Principal::new("dave", Role::Member, Kind::Human)
}
fn mallory() -> Principal {
    Principal::new("mallory", Role::Member, Kind::Human)
}

/// A draft submitted by dave and approved by alice, with the approval key published: what
/// the drafts and approval services leave in the store.
async fn approved_draft(db: &Db, draft_id: &str) {
    let signer = ApprovalSigner::from_secret("k1".into(), [9; 32]);
    let publish = ApprovalKeysCommand::Publish { keys: vec![signer.public_key()], at: chrono::Utc::now() };
    db.cqrs::<ApprovalKeys>().execute(KEYS_ID, publish, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("keys published");
    let request = BoxDraftCreateRequest { box_type: Some("sales".into()), purpose: Some("Report sales.".into()), ..Default::default() };
    let plan = request.plan().expect("plan");
    let manifest = plan.manifest.clone();
    let submit = DraftCommand::Submit { draft_id: draft_id.into(), plan, requested_by: dave(), at: chrono::Utc::now() };
    db.cqrs::<Draft>().execute(draft_id, submit, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("submitted");
    let now = chrono::Utc::now();
    let token = signer.issue(draft_id, manifest.box_type.as_str(), &manifest.digest(), "alice", now);
    let approve = DraftCommand::Approve { by: alice(), confirm_over_limit: true, token, at: now, reserved: true };
    db.cqrs::<Draft>().execute(draft_id, approve, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("approved");
}

/// A stand-in provisioner: a handle starting `bnd_ok` is claimed, `bnd_expired` has
/// expired, anything else is unknown.
async fn provisioner(rt: &Runtime) -> atasira_platform::bus::Endpoint {
    serve(rt, subjects::PROVISIONER, |call| async move {
        call.only_from(&[subjects::RUNTIME_REGISTRY], "claiming a binding")?;
        let r: v1::ConsumeBinding = atasira_contracts::payload(&call.env)?;
        match r.handle.as_str() {
            h if h.starts_with("bnd_ok") => Ok(reply_ok(&v1::Ack {})),
            "bnd_expired" => Err(Refusal::new(ErrorCode::BindingExpired, "the binding's lease ran out")),
            _ => Err(Refusal::new(ErrorCode::BindingNotFound, "no such binding")),
        }
    })
    .await
    .expect("provisioner serves")
}

/// What the gateway sends, for `principal`.
async fn ask<Req: Named, Resp: prost::Message + Default>(rt: &Runtime, principal: &Principal, request: &Req) -> Result<(Resp, i64, Vec<String>), Refused> {
    let subject = subjects::request(subjects::GATEWAY, SERVICE);
    let correlation = uuid::Uuid::new_v4().to_string();
    let env = signed_envelope(&signer(subjects::GATEWAY), principal, &subject, request, &correlation, "", chrono::Utc::now());
    let bytes = rt.bus.request(&subject, BTreeMap::new(), env.encode_to_vec().into(), Duration::from_secs(30)).await.expect("answered");
    atasira_contracts::decode_written::<Resp>(&bytes).expect("decodes").map(|w| (w.reply, w.position, w.event_ids))
}

fn text(s: &str) -> v1::Segment {
    v1::Segment { kind: Some(v1::segment::Kind::Text(s.into())) }
}

fn create(launch_id: &str, box_id: &str, digest: &str, handle: &str, input: Vec<v1::Segment>) -> v1::CreateWorker {
    v1::CreateWorker {
        launch_id: launch_id.into(),
        box_id: box_id.into(),
        bundle_digest: digest.into(),
        binding_handle: handle.into(),
        role: "reviewer".into(),
        labels: BTreeMap::from([("team".to_owned(), "ops".to_owned())]),
        initial_input: input,
    }
}

async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn sync(rt: &Runtime, principal: &Principal, box_id: &str, launch_id: &str) -> Result<String, Refused> {
    ask::<_, v1::BundleSynced>(rt, principal, &v1::SyncBundle { box_id: box_id.into(), launch_id: launch_id.into() }).await.map(|(s, ..)| s.digest)
}

#[tokio::test]
async fn r_worker_a_launch_on_an_approved_box_makes_one_worker_per_launch_id_with_its_chain_of_custody() {
    let dir = TempDir::new();
    let db = Db::connect(&Db::sqlite_url(&dir.0)).await.expect("db");
    launch_scenario(db, &dir).await;
}

/// A fixed signing key of `issuer` (the test's gateway, the registry itself).
fn signer(issuer: &str) -> AssertionSigner {
    AssertionSigner::new(format!("{issuer}-test"), issuer, &[issuer.len() as u8; 32], chrono::Utc::now())
}

async fn launch_scenario(db: Db, dir: &TempDir) {
    // The registry signs its calls to the provisioner with its own key; every process here
    // knows the gateway's and the registry's public keys.
    let (gateway, registry) = (signer(subjects::GATEWAY), signer(SERVICE));
    let rt = Runtime {
        db: db.clone(),
        bus: Arc::new(InprocBus::default()),
        feeds: FeedSource::default(),
        assertion_keys: AssertionKeys::fixed(Some(registry.clone()), [gateway.public_key(), registry.public_key()]),
        guards: Default::default(),
    };
    approved_draft(&db, "d1").await;
    let box_id = box_id_for("d1");
    let _provisioner = provisioner(&rt).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let config = RegistryConfig {
        manifests_dir: dir.0.join("manifests"),
        max_boxes: 10,
        host_lease: Duration::from_secs(10),
        ask_ttl: Duration::from_secs(300),
        trigger_in_flight: 4,
        listener: None,
    };
    let registry = tokio::spawn(run(rt.clone(), config, stopped));

    // given the activated Box; then activation synced its bundle, by the system
    wait_until("the activation's bundle and the Box view", || async {
        !db.events_after(0, &[types::CONFIG_BUNDLE], 1).await.expect("events").is_empty() && views::row(&db, &box_id).await.expect("row").is_some()
    })
    .await;
    let first = sync(&rt, &alice(), &box_id, "l1").await.expect("synced");
    let synced = db.events_after(0, &[types::CONFIG_BUNDLE], 100).await.expect("events");
    assert_eq!(synced.len(), 1, "a second sync of the same manifest adds nothing");
    assert_eq!(synced[0].payload["ConfigBundleSynced"]["by"], "system");

    // R-WORKER-5: a segment of no kind is invalid_segment, recorded
    let kindless = create("l1", &box_id, &first, "bnd_ok1", vec![v1::Segment { kind: None }]);
    let refused = ask::<_, v1::WorkerReply>(&rt, &alice(), &kindless).await.expect_err("refused");
    assert_eq!((refused.code, refused.event_ids.len()), (ErrorCode::InvalidSegment, 1));
    assert_eq!(refused.field_errors[0].key, "input[0]");

    // when alice launches; then a Worker with its initial transcript
    let (reply, position, ids) =
        ask::<_, v1::WorkerReply>(&rt, &alice(), &create("l1", &box_id, &first, "bnd_ok1", vec![text("hello")])).await.expect("created");
    let worker = reply.worker.expect("worker");
    assert!(reply.created && position > 0 && ids.len() == 1);
    assert_eq!(worker.worker_id, worker_id_for("l1"));
    assert_eq!((worker.transcript.len(), worker.transcript[0].author.as_str()), (1, "alice"));

    // R-WORKER-4: the same request again (a fresh binding) is the same Worker; another is 409
    let (again, ..) = ask::<_, v1::WorkerReply>(&rt, &alice(), &create("l1", &box_id, &first, "bnd_ok2", vec![text("hello")])).await.expect("same");
    assert_eq!((again.created, again.worker.map(|w| w.worker_id)), (false, Some(worker_id_for("l1"))));
    let other = ask::<_, v1::WorkerReply>(&rt, &alice(), &create("l1", &box_id, &first, "bnd_ok3", vec![text("bye")])).await.expect_err("conflict");
    assert_eq!(other.code, ErrorCode::LaunchIdConflict);

    // R-WORKER-6: typed refusals, each recorded on the launch's stream
    let forged = format!("sha256:{}", "0".repeat(64));
    for (principal, request, code) in [
        (alice(), create("l2", &box_id, &forged, "bnd_ok4", vec![text("x")]), ErrorCode::BundleDigestMismatch),
        (alice(), create("l3", &box_id, &first, "bnd_expired", vec![text("x")]), ErrorCode::BindingExpired),
        (alice(), create("l4", &box_id, &first, "bnd_gone", vec![text("x")]), ErrorCode::BindingNotFound),
        (mallory(), create("l5", &box_id, &first, "bnd_ok5", vec![text("x")]), ErrorCode::Forbidden),
        (alice(), create("l6", "no-such-box", &first, "bnd_ok6", vec![text("x")]), ErrorCode::BoxNotActive),
    ] {
        let refused = ask::<_, v1::WorkerReply>(&rt, &principal, &request).await.expect_err("refused");
        assert_eq!(refused.code, code, "{}", refused.message);
        assert_eq!(refused.event_ids.len(), 1, "{code} is recorded");
    }
    let refusals = db.events_after(0, &[types::WORKER], 100).await.expect("events").iter().filter(|e| e.event_type == "WorkerLaunchRefused").count();
    assert_eq!(refusals, 7);

    // reads: the catalog, for admins and the Box's users only
    let (got, ..) = ask::<_, v1::WorkerReply>(&rt, &alice(), &v1::GetWorker { worker_id: worker_id_for("l1"), ..Default::default() }).await.expect("read");
    assert_eq!(got.worker.as_ref().map(|w| w.transcript.len()), Some(1));
    assert_eq!(
        ask::<_, v1::WorkerReply>(&rt, &mallory(), &v1::GetWorker { worker_id: worker_id_for("l1"), ..Default::default() }).await.expect_err("no").code,
        ErrorCode::Forbidden
    );
    assert_eq!(
        ask::<_, v1::WorkerReply>(&rt, &alice(), &v1::GetWorker { worker_id: "wkr_none".into(), ..Default::default() }).await.expect_err("no").code,
        ErrorCode::WorkerNotFound
    );
    let list = |box_id: String| v1::ListBoxWorkers { box_id, limit: 0, after: 0 };
    let (page, ..) = ask::<_, v1::WorkerPage>(&rt, &alice(), &list(box_id.clone())).await.expect("page");
    assert_eq!((page.workers.len(), page.next_cursor), (1, 0));
    assert!(page.workers[0].transcript.is_empty());
    assert_eq!(ask::<_, v1::WorkerPage>(&rt, &alice(), &list("nope".into())).await.expect_err("no").code, ErrorCode::BoxNotFound);

    // after a mentor edit: a new bundle; a new Worker pins it, the first keeps its own
    let edit = serde_json::Map::from_iter([("purpose".to_owned(), serde_json::json!("Report sales weekly."))]);
    let request = v1::EditBoxManifest { box_id: box_id.clone(), edit: Some(atasira_contracts::manifest::struct_to_proto(&edit)) };
    ask::<_, v1::BoxReply>(&rt, &alice(), &request).await.expect("edited");
    let second = sync(&rt, &alice(), &box_id, "l7").await.expect("synced");
    assert_ne!(first, second);
    assert_eq!(db.events_after(0, &[types::CONFIG_BUNDLE], 100).await.expect("events").len(), 2, "the edit synced the new bundle");
    let stale = ask::<_, v1::WorkerReply>(&rt, &alice(), &create("l7", &box_id, &first, "bnd_ok7", vec![text("x")])).await.expect_err("old digest");
    assert_eq!(stale.code, ErrorCode::BundleDigestMismatch);
    ask::<_, v1::WorkerReply>(&rt, &alice(), &create("l8", &box_id, &second, "bnd_ok8", vec![text("x")])).await.expect("created");

    // R-WORKER (chain of custody): approval -> activation -> edits -> bundle -> Worker
    use v1::provenance_step::Kind as K;
    let kinds = |p: &v1::WorkerProvenance| p.steps.iter().map(|s| s.kind).collect::<Vec<_>>();
    let (old, ..) = ask::<_, v1::WorkerProvenance>(&rt, &alice(), &v1::GetWorkerProvenance { worker_id: worker_id_for("l1") }).await.expect("provenance");
    assert!(old.approval_verified);
    assert_eq!(kinds(&old), [K::Approval as i32, K::Activation as i32, K::Bundle as i32, K::Worker as i32]);
    assert_eq!((old.bundle_digest.as_str(), old.steps[2].digest.as_str(), old.steps[3].digest.as_str()), (first.as_str(), first.as_str(), first.as_str()));
    assert_eq!(old.steps[0].actor, "alice");
    let (new, ..) = ask::<_, v1::WorkerProvenance>(&rt, &alice(), &v1::GetWorkerProvenance { worker_id: worker_id_for("l8") }).await.expect("provenance");
    assert_eq!(kinds(&new), [K::Approval as i32, K::Activation as i32, K::ManifestEdit as i32, K::Bundle as i32, K::Worker as i32]);
    assert_eq!(new.bundle_digest, second);
    assert!(new.steps.iter().all(|s| !s.event_id.is_empty() && s.position > 0));

    // R-WORKER-1, R-WORKER-3: the catalog keeps no binding handle
    for table in ["worker_rows", "worker_transcript"] {
        for row in sqlx::query(&format!("SELECT * FROM {table}")).fetch_all(db.any()).await.expect("rows") {
            for i in 0..row.len() {
                let cell: String = row.try_get::<String, _>(i).unwrap_or_default();
                assert!(!cell.contains("bnd_"), "{table}: {cell}");
            }
        }
    }

    // R-WORKER-7: a rebuild gives the same catalog and transcripts
    let before = (workers_view::get(&db, &worker_id_for("l1")).await.expect("get"), workers_view::page(&db, &box_id, 0, 0).await.expect("page"));
    atasira_platform::projection::rebuild(&db, &WorkersView).await.expect("rebuilt");
    let after = (workers_view::get(&db, &worker_id_for("l1")).await.expect("get"), workers_view::page(&db, &box_id, 0, 0).await.expect("page"));
    assert_eq!(before, after);
    assert_eq!(after.1.0.len(), 2);

    stop.send(true).expect("registry listening");
    tokio::time::timeout(Duration::from_secs(10), registry).await.expect("stops").expect("no panic").expect("clean exit");
}

#[test]
fn r_worker_4_launch_ids_box_ids_and_digests_are_checked_for_shape() {
    assert!(launch_id_errors("launch-1").is_empty());
    assert_eq!(launch_id_errors("a b").len(), 1);
    assert_eq!(launch_id_errors("").len(), 1);
    assert!(box_id_errors("b1").is_empty());
    assert_eq!(box_id_errors(&"b".repeat(ID_CHARS + 1)).len(), 1);
    assert_eq!(box_id_errors("b\u{0}").len(), 1);
    assert!(digest_shaped(&format!("sha256:{}", "ab".repeat(32))));
    assert!(!digest_shaped("sha256:AB"));
    assert!(!digest_shaped(&format!("sha256:{}", "AB".repeat(32))));
    assert!(!digest_shaped("forged"));
}

#[test]
fn r_worker_6_the_recorded_refusals_are_the_launchs_own() {
    for code in [ErrorCode::BindingExpired, ErrorCode::BoxNotActive, ErrorCode::LaunchIdConflict, ErrorCode::InvalidSegment, ErrorCode::Forbidden] {
        assert!(RECORDED.contains(&code), "{code}");
    }
    // a bound of the request or our own failure is no refusal of the launch
    for code in [ErrorCode::InvalidRequest, ErrorCode::Internal, ErrorCode::ServiceUnavailable] {
        assert!(!RECORDED.contains(&code), "{code}");
    }
}
