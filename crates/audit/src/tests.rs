//! The audit service on a real SQLite event store (R-AUDIT-1..4, R-ARCH-5): rows follow
//! the events once each, tampering with the stored ledger is named, and the service
//! answers over the in-process bus.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::v1;
use atasira_contracts::{Named, Refused, decode_reply, envelope, signed_envelope};
use atasira_domain::aggregates::audit_ledger::{AuditLedger, LEDGER_ID};
use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::aggregates::security::{ApprovalSecurity, SecurityCommand};
use atasira_domain::assertion::AssertionSigner;
use atasira_domain::audit::{AuditKey, AuditKeys, LedgerRow, Verification, export, payload_digest};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::token::ApprovalSigner;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::Runtime;
use atasira_platform::bus::{Bus, InprocBus};
use atasira_platform::feed::FeedSource;
use atasira_platform::keys::AssertionKeys;
use atasira_platform::store::Db;
use chrono::Utc;
use serde_json::json;
use sqlx::Row;

use super::*;

/// A data directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("atasira-audit-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn db(dir: &TempDir) -> Db {
    Db::connect(&Db::sqlite_url(&dir.0)).await.expect("sqlite db")
}

fn keys() -> AuditKeys {
    AuditKeys::new(AuditKey::new("audit-1", &[5; 32]).expect("key"), vec![])
}

fn agent() -> Principal {
    Principal::new("agent-1", Role::Member, Kind::Agent)
}

fn alice() -> Principal {
    Principal::new("alice", Role::Admin, Kind::Human)
}

/// Appends `DraftSubmitted` for `draft_id` (box_type = draft id).
async fn submit(db: &Db, draft_id: &str) {
    let plan = BoxDraftCreateRequest::from_value(json!({"box_type": draft_id, "purpose": "p"})).and_then(|r| r.plan()).expect("plan");
    let command = DraftCommand::Submit { draft_id: draft_id.into(), plan, requested_by: agent(), at: Utc::now() };
    db.cqrs::<Draft>().execute(draft_id, command, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("submit");
}

/// Appends `DraftApproved` by alice for a submitted draft.
async fn approve(db: &Db, draft_id: &str) {
    let draft: Draft = db.load(draft_id).await.expect("load");
    let data = draft.data.expect("submitted");
    let now = Utc::now();
    let token = ApprovalSigner::from_secret("k1".into(), [7; 32]).issue(draft_id, data.manifest.box_type.as_str(), &data.manifest.digest(), "alice", now);
    let command = DraftCommand::Approve { by: alice(), confirm_over_limit: false, token, at: now, reserved: true };
    db.cqrs::<Draft>().execute(draft_id, command, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("approve");
}

async fn rows(db: &Db) -> Vec<LedgerRow> {
    page(db, Filter::default(), PAGE_MAX, 0).await.expect("page").0
}

/// Runs `statement` as someone with full access to the database file would: with the
/// ledger's append-only triggers dropped, then created again.
async fn tamper(db: &Db, statement: &str) {
    for trigger in ["audit_ledger_rows_append_only_update", "audit_ledger_rows_append_only_delete"] {
        sqlx::query(&format!("DROP TRIGGER {trigger}")).execute(db.any()).await.expect("drop trigger");
    }
    sqlx::query(statement).execute(db.any()).await.unwrap_or_else(|e| panic!("{statement}: {e}"));
    prepare(db).await.expect("triggers again");
}

fn first_bad(v: &Verification) -> Option<i64> {
    match v {
        Verification::Broken { first_bad_seq, .. } => Some(*first_bad_seq),
        Verification::Ok { .. } => None,
    }
}

/// The ledger of d1 submitted and approved: two rows, applied.
async fn two_rows(dir: &TempDir) -> (Db, AuditKeys) {
    let db = db(dir).await;
    let ks = keys();
    submit(&db, "d1").await;
    approve(&db, "d1").await;
    apply_pending(&db, &ks).await.expect("apply");
    (db, ks)
}

#[tokio::test]
async fn r_audit_2_a_checkpoint_digests_its_rows_a_page_at_a_time_as_if_all_at_once() {
    // given a ledger of seven rows (four drafts, three of them approved)
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    for id in ["d1", "d2", "d3", "d4"] {
        submit(&db, id).await;
    }
    for id in ["d1", "d2", "d3"] {
        approve(&db, id).await;
    }
    assert_eq!(apply_pending(&db, &ks).await.expect("apply"), 7);
    // when the rows a checkpoint covers are digested in pages of one, three and all
    let all = ledger::rows_between(&db, 0, 7).await.expect("rows");
    let digests: Vec<String> = all.iter().map(export::row_digest).collect();
    let (at_once, tail) = (export::rows_digest(digests.iter().map(String::as_str)), export::rows_digest(digests[2..].iter().map(String::as_str)));
    for page in [1, 3, 7, 1_000] {
        // then every paging gives the digest of all the rows at once, and of a later range too
        assert_eq!(ledger::digest_of_rows(&db, 0, 7, page).await.expect("digest"), at_once, "pages of {page}");
        assert_eq!(ledger::digest_of_rows(&db, 2, 7, page).await.expect("digest"), tail, "the rows after 2, pages of {page}");
    }
}

#[tokio::test]
async fn r_audit_1_one_row_per_auditable_event_in_order_and_never_twice() {
    // given a submitted and an approved draft
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    submit(&db, "d1").await;
    approve(&db, "d1").await;
    // when the ledger catches up
    assert_eq!(apply_pending(&db, &ks).await.expect("apply"), 2);
    // then one row each, chained, with who and what
    let got = rows(&db).await;
    let summary: Vec<(i64, &str, &str, &str, &str)> =
        got.iter().map(|r| (r.seq, r.action.as_str(), r.actor.as_str(), r.target.as_str(), r.event_id.as_str())).collect();
    assert_eq!(summary, vec![(1, "box_draft.create", "agent-1", "d1", "draft/d1/1"), (2, "box_draft.approve", "alice", "d1", "draft/d1/2")]);
    assert!(got.iter().all(|r| r.key_id == "audit-1" && r.mac.len() == 64));
    let events = db.events_after(0, &["draft"], 10).await.expect("events");
    assert_eq!(got[0].payload_digest, payload_digest(&serde_json::to_vec(&events[0].payload).expect("json")));
    // when applied again, and again after the checkpoint is lost (a redelivery of all)
    assert_eq!(apply_pending(&db, &ks).await.expect("again"), 0);
    sqlx::query("DELETE FROM projection_checkpoints WHERE name = $1").bind(NAME).execute(db.any()).await.expect("reset");
    assert_eq!(apply_pending(&db, &ks).await.expect("redelivered"), 0);
    for event in &events {
        assert!(!append(&db, &ks, event).await.expect("append"), "{} has its row already", event.event_id);
    }
    // then nothing was added and the ledger verifies
    assert_eq!(rows(&db).await.len(), 2);
    assert_eq!(verify(&db, &ks).await.expect("verify"), Verification::Ok { rows: 2 });
    assert_eq!(check_complete(&db).await.expect("check"), json!({"ledger_rows": 2, "auditable_events": 2, "missing": [], "duplicated": []}));
}

#[tokio::test]
async fn r_audit_5_security_violations_get_rows_and_other_events_only_move_the_checkpoint() {
    // given a security violation recorded by the approval service, then a submit
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    let record = SecurityCommand::Record {
        service: "approval".into(),
        actor: "bob".into(),
        target: "d7".into(),
        kind: "self_approval".into(),
        reason: "own draft".into(),
        at: Utc::now(),
    };
    db.cqrs::<ApprovalSecurity>().execute("v1", record, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("record");
    submit(&db, "d1").await;
    // when the ledger catches up; then the violation is a row naming actor and target
    assert_eq!(apply_pending(&db, &ks).await.expect("apply"), 2);
    let got = rows(&db).await;
    assert_eq!((got[0].action.as_str(), got[0].actor.as_str(), got[0].target.as_str()), ("security_violation", "bob", "d7"));
    // and the writer's checkpoint is the last event's position
    let mut last = db.events_after(0, AUDITABLE_TYPES, 10).await.expect("events").pop().expect("events");
    assert_eq!(proj::checkpoint(&db, NAME).await.expect("checkpoint"), last.position);
    // when an event without an action arrives; then no row, but the checkpoint moves on
    last.event_type = "DraftNoted".into();
    last.event_id = "draft/d1/9".into();
    last.position += 10;
    assert!(!append(&db, &ks, &last).await.expect("append"));
    assert_eq!(rows(&db).await.len(), 2);
    assert_eq!(proj::checkpoint(&db, NAME).await.expect("checkpoint"), last.position);
    // and a checkpoint event is recorded once per growth of the ledger
    assert_eq!(checkpoint(&db, &ks).await.expect("checkpoint"), Some(2));
    assert_eq!(checkpoint(&db, &ks).await.expect("again"), None);
    assert_eq!(check_complete(&db).await.expect("check")["missing"], json!([]));
}

#[tokio::test]
async fn r_audit_2_a_modified_row_is_named() {
    // given a verified 2-row ledger
    let dir = TempDir::new();
    let (db, ks) = two_rows(&dir).await;
    assert!(verify(&db, &ks).await.expect("verify").is_ok());
    // when someone with database access rewrites the actor of row 1
    tamper(&db, "UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 1").await;
    // then verification names seq 1
    let v = verify(&db, &ks).await.expect("verify");
    assert_eq!(first_bad(&v), Some(1), "{v:?}");
    let wire = serde_json::to_value(&v).expect("json");
    assert_eq!(wire["ok"], json!(false));
    assert_eq!(wire["first_bad_seq"], json!(1));
}

#[tokio::test]
async fn r_audit_2_an_unreadable_time_is_named_after_the_rows_before_it() {
    // given a 2-row ledger; when row 2's time is no time at all; then seq 2 is named
    let dir = TempDir::new();
    let (db, ks) = two_rows(&dir).await;
    tamper(&db, "UPDATE audit_ledger_rows SET time = 'yesterday' WHERE seq = 2").await;
    assert_eq!(first_bad(&verify(&db, &ks).await.expect("verify")), Some(2));
    // and when row 1 is modified too; then row 1 comes first
    tamper(&db, "UPDATE audit_ledger_rows SET target = 'd9' WHERE seq = 1").await;
    assert_eq!(first_bad(&verify(&db, &ks).await.expect("verify")), Some(1));
}

#[tokio::test]
async fn r_audit_2_a_deleted_middle_row_is_named() {
    // given a 3-row ledger
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    submit(&db, "d1").await;
    approve(&db, "d1").await;
    submit(&db, "d2").await;
    assert_eq!(apply_pending(&db, &ks).await.expect("apply"), 3);
    // when row 2 is deleted; then seq 2 is named
    tamper(&db, "DELETE FROM audit_ledger_rows WHERE seq = 2").await;
    let v = verify(&db, &ks).await.expect("verify");
    assert_eq!(first_bad(&v), Some(2), "{v:?}");
    // and the completeness check lists the event that lost its row
    let check = check_complete(&db).await.expect("check");
    assert_eq!(check["missing"], json!(["draft/d1/2"]));
    assert_eq!(check["ledger_rows"], json!(2));
    assert_eq!(check["auditable_events"], json!(3));
}

#[tokio::test]
async fn r_audit_2_a_removed_tail_is_caught_by_the_checkpoint() {
    // given a 3-row ledger with a signed checkpoint recorded in the event store
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    submit(&db, "d1").await;
    approve(&db, "d1").await;
    submit(&db, "d2").await;
    apply_pending(&db, &ks).await.expect("apply");
    assert_eq!(checkpoint(&db, &ks).await.expect("checkpoint"), Some(3));
    let cp = latest_checkpoint(&db).await.expect("read").expect("recorded");
    assert_eq!((cp.seq, cp.key_id.as_str()), (3, "audit-1"));
    assert_eq!(verify(&db, &ks).await.expect("verify"), Verification::Ok { rows: 3 });
    // when the last row is deleted (the chain of rows 1..2 is intact)
    tamper(&db, "DELETE FROM audit_ledger_rows WHERE seq = 3").await;
    // then verification reports the removed tail at seq 3
    let v = verify(&db, &ks).await.expect("verify");
    let Verification::Broken { first_bad_seq, reason } = &v else { panic!("truncation not detected") };
    assert_eq!(*first_bad_seq, 3);
    assert!(reason.contains("tail"), "{reason}");
    // and the checkpointer does not paper over it with a shorter checkpoint
    assert_eq!(checkpoint(&db, &ks).await.expect("checkpoint"), None);
    assert_eq!(first_bad(&verify(&db, &ks).await.expect("verify")), Some(3));
}

#[tokio::test]
async fn r_audit_2_the_ledger_refuses_update_and_delete() {
    // given a 2-row ledger
    let dir = TempDir::new();
    let (db, ks) = two_rows(&dir).await;
    // when rows are updated or deleted through the service's own connection; then refused
    for statement in
        ["UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 1", "DELETE FROM audit_ledger_rows WHERE seq = 2", "DELETE FROM audit_ledger_rows"]
    {
        let err = sqlx::query(statement).execute(db.any()).await.expect_err(statement);
        assert!(err.to_string().contains("append-only"), "{statement}: {err}");
    }
    // and the ledger is untouched
    assert_eq!(verify(&db, &ks).await.expect("verify"), Verification::Ok { rows: 2 });
    // and preparing again (every start) keeps one set of triggers
    prepare(&db).await.expect("again");
    let triggers: i64 = sqlx::query("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_ledger_rows'")
        .fetch_one(db.any())
        .await
        .expect("count")
        .try_get(0)
        .expect("int");
    assert_eq!(triggers, 2);
}

#[tokio::test]
async fn r_audit_2_a_tail_removed_after_a_checkpoint_and_regrown_is_named() {
    // given 3 rows checkpointed (checkpoint K at seq 3), then 3 more checkpointed at seq 6
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    for id in ["d1", "d2", "d3"] {
        submit(&db, id).await;
    }
    apply_pending(&db, &ks).await.expect("apply");
    assert_eq!(checkpoint(&db, &ks).await.expect("checkpoint"), Some(3));
    for id in ["d4", "d5", "d6"] {
        submit(&db, id).await;
    }
    apply_pending(&db, &ks).await.expect("apply");
    assert_eq!(checkpoint(&db, &ks).await.expect("checkpoint"), Some(6));
    // then each checkpoint names the one before it
    let recorded = checkpoints(&db).await.expect("read");
    assert_eq!(recorded.iter().map(|c| (c.seq, c.prev_seq)).collect::<Vec<_>>(), vec![(3, 0), (6, 3)]);
    assert_eq!(recorded[1].prev_mac, recorded[0].mac);
    assert_eq!(verify(&db, &ks).await.expect("verify"), Verification::Ok { rows: 6 });
    // when the rows after checkpoint K are deleted behind the service's back
    tamper(&db, "DELETE FROM audit_ledger_rows WHERE seq > 3").await;
    assert_eq!(first_bad(&verify(&db, &ks).await.expect("verify")), Some(4));
    // and the ledger regrows past the last checkpoint (new rows re-use seqs 4..6), and the
    // service checkpoints the new head after checkpoint 6
    for id in ["d7", "d8", "d9", "d10"] {
        submit(&db, id).await;
    }
    assert_eq!(apply_pending(&db, &ks).await.expect("apply"), 4);
    assert_eq!(checkpoint(&db, &ks).await.expect("checkpoint"), Some(7));
    let latest = latest_checkpoint(&db).await.expect("read").expect("recorded");
    assert_eq!((latest.seq, latest.prev_seq), (7, 6));
    // then the latest checkpoint alone would pass, but checkpoint 6 lost its row: seq 6 named
    let v = verify(&db, &ks).await.expect("verify");
    let Verification::Broken { first_bad_seq, reason } = &v else { panic!("the regrown tail went unnoticed") };
    assert_eq!(*first_bad_seq, 6);
    assert!(reason.contains("checkpoint at seq 6"), "{reason}");
}

#[tokio::test]
async fn r_audit_4_rows_under_a_rotated_key_still_verify() {
    // given 1 row under the old key
    let dir = TempDir::new();
    let db = db(&dir).await;
    let old = AuditKeys::new(AuditKey::new("audit-old", &[1; 32]).expect("key"), vec![]);
    submit(&db, "d1").await;
    apply_pending(&db, &old).await.expect("apply");
    // when the key rotates and another row follows
    let rotated = AuditKeys::new(AuditKey::new("audit-new", &[2; 32]).expect("key"), vec![AuditKey::new("audit-old", &[1; 32]).expect("key")]);
    approve(&db, "d1").await;
    apply_pending(&db, &rotated).await.expect("apply");
    checkpoint(&db, &rotated).await.expect("checkpoint");
    // then both rows verify, each under its own key id; without the old key, seq 1 fails
    let key_ids: Vec<String> = rows(&db).await.into_iter().map(|r| r.key_id).collect();
    assert_eq!(key_ids, vec!["audit-old", "audit-new"]);
    assert_eq!(verify(&db, &rotated).await.expect("verify"), Verification::Ok { rows: 2 });
    let forgotten = AuditKeys::new(AuditKey::new("audit-new", &[2; 32]).expect("key"), vec![]);
    assert_eq!(first_bad(&verify(&db, &forgotten).await.expect("verify")), Some(1));
}

#[test]
fn r_audit_1_every_audited_launch_event_is_read_by_the_ledger_writer() {
    // R-WORKER (every launch and refusal audited): the writer reads each type whose events
    // have an action, or their rows would never be written
    for (aggregate_type, event_type) in [
        ("worker", "WorkerCreated"),
        ("worker", "WorkerLaunchRefused"),
        ("config_bundle", "ConfigBundleSynced"),
        ("execution_binding", "BindingPrepared"),
        ("execution_binding", "BindingConsumed"),
        ("execution_binding", "BindingExpired"),
    ] {
        assert!(atasira_domain::audit::action_of(aggregate_type, event_type).is_some(), "{event_type}");
        assert!(AUDITABLE_TYPES.contains(&aggregate_type), "{aggregate_type} is not read by the ledger writer");
    }
    for aggregate_type in atasira_domain::aggregates::types::ALL {
        let audited = ["DraftSubmitted", "BoxActivated", "AccessProvisioned", "SecurityViolation", "TokenIssued"]
            .iter()
            .any(|event_type| atasira_domain::audit::action_of(aggregate_type, event_type).is_some());
        assert!(!audited || AUDITABLE_TYPES.contains(aggregate_type), "{aggregate_type}");
    }
}

#[tokio::test]
async fn r_audit_3_pages_filter_by_action_target_and_since() {
    // given 5 rows over 3 drafts
    let dir = TempDir::new();
    let db = db(&dir).await;
    let ks = keys();
    for id in ["d1", "d2", "d3"] {
        submit(&db, id).await;
    }
    approve(&db, "d1").await;
    approve(&db, "d2").await;
    apply_pending(&db, &ks).await.expect("apply");
    // action and target filters
    let creates = page(&db, Filter { action: "box_draft.create", ..Filter::default() }, 0, 0).await.expect("page").0;
    assert_eq!(creates.iter().map(|r| r.target.as_str()).collect::<Vec<_>>(), vec!["d1", "d2", "d3"]);
    let d1 = page(&db, Filter { target: "d1", ..Filter::default() }, 0, 0).await.expect("page").0;
    assert_eq!(d1.iter().map(|r| r.action.as_str()).collect::<Vec<_>>(), vec!["box_draft.create", "box_draft.approve"]);
    // paging by cursor
    let (first, cursor) = page(&db, Filter::default(), 2, 0).await.expect("page");
    assert_eq!((first.len(), cursor.as_str()), (2, "2"));
    let (second, cursor) = page(&db, Filter::default(), 2, 2).await.expect("page");
    assert_eq!((second[0].seq, cursor.as_str()), (3, "4"));
    let (last, cursor) = page(&db, Filter::default(), 2, 4).await.expect("page");
    assert_eq!((last.len(), cursor.as_str()), (1, ""));
    // since: everything from the time of row 4 on
    let all = rows(&db).await;
    let since = page(&db, Filter { since: Some(all[3].time), ..Filter::default() }, 0, 0).await.expect("page").0;
    assert!(since.iter().all(|r| r.time >= all[3].time));
    assert!(since.iter().any(|r| r.seq == 5));
    assert!(page(&db, Filter { since: Some(all[4].time + chrono::TimeDelta::seconds(1)), ..Filter::default() }, 0, 0).await.expect("page").0.is_empty());
}

/// Sends a request to the audit service over `bus`, as `who` (unsigned when `None`).
async fn ask<M: Named, R: Named>(bus: &InprocBus, assertion_keys: &AssertionSigner, who: Option<Principal>, message: &M) -> Result<R, Refused> {
    let correlation = uuid::Uuid::new_v4().to_string();
    let subject = "atasira.box.gateway.audit";
    let env = match who {
        Some(p) => signed_envelope(assertion_keys, &p, subject, message, &correlation, "", Utc::now()),
        None => envelope(message, &correlation, ""),
    };
    let bytes = bus.request(subject, BTreeMap::new(), prost::Message::encode_to_vec(&env).into(), Duration::from_secs(10)).await.expect("bus");
    decode_reply::<R>(&bytes).expect("reply").map(|(m, _)| m)
}

/// Waits until the service's endpoint is registered (it starts on a spawned task).
async fn served(bus: &InprocBus) {
    for _ in 0..250 {
        match bus.request("atasira.box.gateway.audit", BTreeMap::new(), Vec::new().into(), Duration::from_secs(5)).await {
            Err(atasira_platform::bus::BusError::NoResponders(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => return,
        }
    }
    panic!("the audit service never served its subject");
}

#[tokio::test]
async fn r_audit_2_r_audit_3_the_service_writes_serves_admins_and_checkpoints_on_shutdown() {
    // given the service running embedded, with checkpoints far apart
    let dir = TempDir::new();
    let db = db(&dir).await;
    let bus = Arc::new(InprocBus::default());
    // The test's gateway signs; the service knows its public key only.
    let assertion_keys = AssertionSigner::new("gateway-test", "gateway", &[9; 32], Utc::now());
    let rt = Runtime {
        db: db.clone(),
        bus: bus.clone(),
        feeds: FeedSource::default(),
        assertion_keys: AssertionKeys::fixed(None, [assertion_keys.public_key()]),
        guards: Default::default(),
    };
    let (tx, rx) = watch::channel(false);
    let config = AuditConfig { checkpoint_every: Duration::from_secs(3600), ..AuditConfig::new(Arc::new(keys())) };
    let service = tokio::spawn(run(rt.clone(), config, rx));
    // when a draft is submitted and approved
    submit(&db, "d1").await;
    approve(&db, "d1").await;
    let position = db.head_position().await.expect("position");
    // then a read-your-writes wait returns once the ledger has both rows
    served(&bus).await;
    let waited: v1::WaitForPositionReply =
        ask(&bus, &assertion_keys, None, &v1::WaitForPosition { position, timeout_ms: 5000, event_ids: vec![] }).await.expect("waited");
    assert_eq!(waited.lagging, Vec::<String>::new());
    // and an admin pages the ledger
    let page: v1::AuditPage = ask(
        &bus,
        &assertion_keys,
        Some(alice()),
        &v1::QueryAudit { action: String::new(), target: "d1".into(), since: None, limit: 0, after: 0, event_id: String::new() },
    )
    .await
    .expect("page");
    let got: Vec<serde_json::Value> = page.rows.iter().map(|r| json!(atasira_contracts::convert::ledger_row_from_wire(r).expect("row"))).collect();
    assert_eq!(got.iter().map(|r| r["action"].clone()).collect::<Vec<_>>(), vec![json!("box_draft.create"), json!("box_draft.approve")]);
    for field in ["seq", "time", "action", "actor", "target", "event_id", "payload_digest", "key_id", "mac"] {
        assert!(got[0].get(field).is_some(), "{field}");
    }
    // and asks for the row of one event
    let event_id = got[1]["event_id"].as_str().expect("event id").to_owned();
    let one = |who: Principal, event_id: &str| {
        let q = v1::QueryAudit { event_id: event_id.to_owned(), ..Default::default() };
        let (bus, keys) = (bus.clone(), assertion_keys.clone());
        async move { ask::<_, v1::AuditPage>(&bus, &keys, Some(who), &q).await }
    };
    let row = one(alice(), &event_id).await.expect("one row");
    assert_eq!(row.rows.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>(), [event_id.as_str()]);
    assert_eq!(row.next_cursor, 0);
    // a member too, through the gateway (a Worker's provenance), but never a page
    assert_eq!(one(agent(), &event_id).await.expect("one row for a member").rows.len(), 1);
    assert!(one(alice(), "draft/none/1").await.expect("no such row").rows.is_empty());
    let member_page = ask::<_, v1::AuditPage>(&bus, &assertion_keys, Some(agent()), &v1::QueryAudit::default()).await.expect_err("member page");
    assert_eq!(member_page.code, ErrorCode::Forbidden);
    // and verifies it
    let verified: v1::VerifyReply = ask(&bus, &assertion_keys, Some(alice()), &v1::VerifyAudit {}).await.expect("verify");
    assert_eq!(atasira_contracts::convert::verification_from_wire(&verified), Verification::Ok { rows: 2 });
    // but nobody without an assertion, and no member
    let unsigned = ask::<_, v1::AuditPage>(&bus, &assertion_keys, None, &v1::QueryAudit::default()).await.expect_err("unsigned");
    assert_eq!(unsigned.code, ErrorCode::Unauthenticated);
    let member = ask::<_, v1::VerifyReply>(&bus, &assertion_keys, Some(agent()), &v1::VerifyAudit {}).await.expect_err("member");
    assert_eq!(member.code, ErrorCode::Forbidden);
    let mut out_of_range = atasira_contracts::convert::timestamp(Utc::now());
    out_of_range.nanos = -1;
    let bad_since = ask::<_, v1::AuditPage>(&bus, &assertion_keys, Some(alice()), &v1::QueryAudit { since: Some(out_of_range), ..Default::default() })
        .await
        .expect_err("bad since");
    assert_eq!(bad_since.code, ErrorCode::InvalidQuery);
    // when the service shuts down; then it leaves a checkpoint over the whole ledger
    let before: AuditLedger = db.load(LEDGER_ID).await.expect("load");
    assert_eq!(before.last_seq, 0, "no periodic checkpoint yet");
    tx.send(true).expect("shutdown");
    service.await.expect("joined").expect("clean exit");
    // (the refused unsigned request above is a security violation, which the writer may
    // or may not have audited before it stopped: the checkpoint covers what is there)
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_ledger_rows").fetch_one(db.any()).await.expect("rows");
    assert!(rows >= 2, "{rows} rows");
    let after: AuditLedger = db.load(LEDGER_ID).await.expect("load");
    assert_eq!(after.last_seq, rows);
    assert_eq!(latest_checkpoint(&db).await.expect("read").map(|c| c.seq), Some(rows));
}

#[tokio::test]
async fn r_audit_2_the_service_checkpoints_periodically_when_the_ledger_grew() {
    // given the service with a short checkpoint period and one auditable event
    let dir = TempDir::new();
    let db = db(&dir).await;
    let rt = Runtime {
        db: db.clone(),
        bus: Arc::new(InprocBus::default()),
        feeds: FeedSource::default(),
        assertion_keys: AssertionKeys::default(),
        guards: Default::default(),
    };
    let (tx, rx) = watch::channel(false);
    let service = tokio::spawn(run(rt.clone(), AuditConfig { checkpoint_every: Duration::from_millis(50), ..AuditConfig::new(Arc::new(keys())) }, rx));
    submit(&db, "d1").await;
    // when time passes; then a checkpoint over seq 1 appears while it runs
    let mut seen = None;
    for _ in 0..200 {
        seen = latest_checkpoint(&db).await.expect("read").map(|c| c.seq);
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen, Some(1));
    tx.send(true).expect("shutdown");
    service.await.expect("joined").expect("clean exit");
    // and shutting down with nothing new adds no second checkpoint
    let count = db.events_after(0, AGGREGATE_TYPES, 10).await.expect("events").len();
    assert_eq!(count, 1);
}
