//! The shared event store on a real PostgreSQL (R-ARCH-4, R-ARCH-6).

use std::collections::HashMap;

use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::db::Db;
use atasira_tests::harness::Database;
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn submit(id: &str) -> DraftCommand {
    let plan = BoxDraftCreateRequest::from_value(json!({"box_type": id, "purpose": "p"})).and_then(|r| r.plan()).expect("plan");
    DraftCommand::Submit { draft_id: id.into(), plan, requested_by: Principal::new("agent", Role::Member, Kind::Agent), at: chrono::Utc::now() }
}

#[test]
fn a_reader_never_skips_an_event_whose_transaction_commits_late() {
    // R-ARCH-6: positions are handed out at insert, commits may come in another order;
    // the xid8 snapshot rule hides the later position until the earlier one committed.
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        let raw = sqlx::PgPool::connect(&database.url).await.expect("raw pool");
        let insert = "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES ('probe', $1, 1, 'Probe', '1', '{}', '{}')";
        let mut slow = raw.begin().await.expect("tx");
        sqlx::query(insert).bind("slow").execute(&mut *slow).await.expect("insert slow");
        let mut fast = raw.begin().await.expect("tx");
        sqlx::query(insert).bind("fast").execute(&mut *fast).await.expect("insert fast");
        fast.commit().await.expect("commit fast");
        assert!(db.events_after(0, &["probe"], 10).await.expect("read").is_empty(), "the later position stays hidden while an earlier transaction is in flight");
        slow.commit().await.expect("commit slow");
        let mut seen: Vec<String> = Vec::new();
        for _ in 0..200 {
            seen = db.events_after(0, &["probe"], 10).await.expect("read").into_iter().map(|e| e.aggregate_id).collect();
            if seen.len() == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert_eq!(seen, vec!["slow", "fast"], "both, in position order");
    });
}

#[test]
fn events_are_append_only_and_concurrent_writers_of_one_aggregate_conflict() {
    // R-ARCH-4: never updated or deleted; optimistic concurrency on (type, id, sequence)
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        db.cqrs::<Draft>().execute("d1", submit("d1"), HashMap::new()).await.expect("first submit");
        assert!(sqlx::query("UPDATE events SET payload = '{}'").execute(db.any()).await.is_err(), "UPDATE refused");
        assert!(sqlx::query("DELETE FROM events").execute(db.any()).await.is_err(), "DELETE refused");
        // Two withdrawals race for sequence 2: exactly one commits.
        let cqrs = std::sync::Arc::new(db.cqrs::<Draft>());
        let withdraw = || DraftCommand::Withdraw { by: Principal::new("agent", Role::Member, Kind::Agent), at: chrono::Utc::now() };
        let (a, b) = tokio::join!(cqrs.execute("d1", withdraw(), HashMap::new()), cqrs.execute("d1", withdraw(), HashMap::new()));
        // Overlapping: one conflicts; one after the other: the second is an idempotent no-op.
        assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
        for r in [&a, &b] {
            assert!(matches!(r, Ok(()) | Err(cqrs_es::AggregateError::AggregateConflict)), "{r:?}");
        }
        // Transactions in flight anywhere in the PostgreSQL cluster (other tests) may hold
        // back visibility for a moment: wait for both events to be readable.
        let mut events = Vec::new();
        for _ in 0..200 {
            events = db.events_after(0, &["draft"], 10).await.expect("read");
            if events.len() >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert_eq!(events.len(), 2, "one submit and exactly one withdrawal");
        assert_eq!(events[1].event_type, "DraftWithdrawn");
        assert!(events[0].position < events[1].position);
        assert_eq!(events[1].event_id, "draft/d1/2");
    });
}

#[test]
fn the_embedded_store_gives_the_same_order_and_refusals() {
    // R-ARCH-7: SQLite embedded store, same rules
    let dir = atasira_tests::harness::TempDir::new("atasira-store");
    runtime().block_on(async {
        let db = Db::connect(&Db::sqlite_url(&dir.0)).await.expect("connect");
        for id in ["a", "b", "c"] {
            db.cqrs::<Draft>().execute(id, submit(id), HashMap::new()).await.expect("submit");
        }
        let events = db.events_after(0, &[], 10).await.expect("read");
        assert_eq!(events.iter().map(|e| e.aggregate_id.as_str()).collect::<Vec<_>>(), vec!["a", "b", "c"]);
        assert_eq!(db.events_after(events[0].position, &[], 10).await.expect("read").len(), 2);
        assert!(sqlx::query("DELETE FROM events").execute(db.any()).await.is_err());
        assert_eq!(db.last_event("draft", "c").await.expect("position").map(|(_, p)| p), Some(events[2].position));
    });
}
