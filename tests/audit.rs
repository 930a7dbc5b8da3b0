//! The audit ledger on a real PostgreSQL (R-AUDIT-1, R-AUDIT-2, R-ARCH-6): the same SQL as
//! embedded mode, concurrent writers never fork the chain, tampering is named.

use std::collections::HashMap;

use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::audit::{AuditKey, AuditKeys, Verification};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::db::Db;
use atasira_tests::harness::Database;
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

fn keys() -> AuditKeys {
    AuditKeys::new(AuditKey::new("audit-1", &[5; 32]).expect("key"), vec![])
}

async fn submit(db: &Db, id: &str) {
    let plan = BoxDraftCreateRequest::from_value(json!({"box_type": id, "purpose": "p"})).and_then(|r| r.plan()).expect("plan");
    let command = DraftCommand::Submit { draft_id: id.into(), plan, requested_by: Principal::new("agent", Role::Member, Kind::Agent), at: chrono::Utc::now() };
    db.cqrs::<Draft>().execute(id, command, HashMap::new()).await.expect("submit");
}

/// Waits until `n` draft events are visible: transactions in flight anywhere in the
/// PostgreSQL cluster (other tests) may hold back visibility for a moment.
async fn visible(db: &Db, n: usize) {
    for _ in 0..400 {
        if db.events_after(0, &["draft"], 1000).await.expect("read").len() >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{n} events never became visible");
}

#[test]
fn concurrent_ledger_writers_on_postgres_append_one_chain_and_tampering_is_named() {
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        let ks = keys();
        for i in 0..12 {
            submit(&db, &format!("d{i}")).await;
        }
        visible(&db, 12).await;
        // given two writers catching up at once (two audit processes, or a redelivery
        // racing the live writer); then one chain, one row per event
        atasira_audit::prepare(&db).await.expect("prepare");
        let (a, b) = tokio::join!(
            {
                let (db, ks) = (db.clone(), ks.clone());
                tokio::spawn(async move { atasira_audit::apply_pending(&db, &ks).await })
            },
            {
                let (db, ks) = (db.clone(), ks.clone());
                tokio::spawn(async move { atasira_audit::apply_pending(&db, &ks).await })
            }
        );
        let appended = a.expect("joined").expect("writer a") + b.expect("joined").expect("writer b");
        assert_eq!(appended, 12);
        assert_eq!(atasira_audit::verify(&db, &ks).await.expect("verify"), Verification::Ok { rows: 12 });
        let check = atasira_audit::check_complete(&db).await.expect("check");
        assert_eq!(check, json!({"ledger_rows": 12, "auditable_events": 12, "missing": [], "duplicated": []}));
        // and pages with filters work on PostgreSQL too
        let (page, next) = atasira_audit::page(&db, "box_draft.create", "d3", None, 0, 0).await.expect("page");
        assert_eq!((page.len(), page[0].event_id.as_str(), next.as_str()), (1, "draft/d3/1", ""));
        let since = atasira_audit::page(&db, "", "", Some(page[0].time), 0, 0).await.expect("page").0;
        assert!(!since.is_empty() && since.iter().all(|r| r.time >= page[0].time));
        // when a checkpoint is recorded and then the tail row is deleted; then the tail is named
        assert_eq!(atasira_audit::checkpoint(&db, &ks).await.expect("checkpoint"), Some(12));
        sqlx::query("DELETE FROM audit_ledger_rows WHERE seq = 12").execute(db.any()).await.expect("tamper");
        let v = atasira_audit::verify(&db, &ks).await.expect("verify");
        assert!(matches!(&v, Verification::Broken { first_bad_seq: 12, reason } if reason.contains("tail")), "{v:?}");
        // when a middle row is modified; then that row comes first
        sqlx::query("UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 5").execute(db.any()).await.expect("tamper");
        let v = atasira_audit::verify(&db, &ks).await.expect("verify");
        assert!(matches!(v, Verification::Broken { first_bad_seq: 5, .. }), "{v:?}");
    });
}
