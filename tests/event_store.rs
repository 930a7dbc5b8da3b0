//! The shared event store on a real PostgreSQL (R-ARCH-4, R-ARCH-6).

use std::collections::HashMap;

use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::feed::FeedSource;
use atasira_platform::store::{Cursor, Db, StoredEvent};
use atasira_tests::fixtures::runtime;
use atasira_tests::harness::Database;
use serde_json::json;

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
        db.cqrs::<Draft>().execute("d1", submit("d1"), HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("first submit");
        assert!(sqlx::query("UPDATE events SET payload = '{}'").execute(db.any()).await.is_err(), "UPDATE refused");
        assert!(sqlx::query("DELETE FROM events").execute(db.any()).await.is_err(), "DELETE refused");
        // Two withdrawals race for sequence 2: exactly one commits.
        let cqrs = std::sync::Arc::new(db.cqrs::<Draft>());
        let withdraw = || DraftCommand::Withdraw { by: Principal::new("agent", Role::Member, Kind::Agent), at: chrono::Utc::now() };
        let (a, b) = tokio::join!(
            cqrs.execute("d1", withdraw(), HashMap::new(), atasira_platform::store::Retry::ONCE),
            cqrs.execute("d1", withdraw(), HashMap::new(), atasira_platform::store::Retry::ONCE)
        );
        // Overlapping: one conflicts; one after the other: the second is an idempotent no-op.
        assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
        for r in [&a, &b] {
            assert!(r.is_ok() || matches!(r, Err(e) if e.code == atasira_domain::ErrorCode::Conflict), "{r:?}");
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
            db.cqrs::<Draft>().execute(id, submit(id), HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("submit");
        }
        let events = db.events_after(0, &[], 10).await.expect("read");
        assert_eq!(events.iter().map(|e| e.aggregate_id.as_str()).collect::<Vec<_>>(), vec!["a", "b", "c"]);
        assert_eq!(db.events_after(events[0].position, &[], 10).await.expect("read").len(), 2);
        assert!(sqlx::query("DELETE FROM events").execute(db.any()).await.is_err());
        assert_eq!(db.last_event("draft", "c").await.expect("position").map(|e| e.position), Some(events[2].position));
    });
}

/// An event row as cqrs-es writes it, for transactions the tests interleave by hand.
const INSERT_EVENT: &str =
    "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES ($1, $2, $3, 'Probe', '1', '{}', '{}')";

/// Reads everything after `at` until `expected` events came (or a generous bound passed),
/// following the cursor as every consumer and the relay do.
async fn read_all(db: &Db, mut at: Cursor, types: &[&str], expected: usize) -> (Vec<String>, Cursor) {
    let mut seen = Vec::new();
    for _ in 0..2000 {
        let batch = db.read(at, types, 64).await.expect("read");
        if let Some(last) = batch.events.last() {
            at = last.cursor();
        }
        seen.extend(batch.events.into_iter().map(|e| e.event_id));
        if seen.len() >= expected {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    (seen, at)
}

#[test]
fn a_transaction_that_started_first_but_took_a_later_position_is_not_skipped() {
    // R-ARCH-6: transaction A gets its id first; B inserts (an earlier position) and stays
    // open; A inserts its two events (later positions) and commits. A reader that moved
    // its checkpoint to A's last position would never see B's event. Readers follow
    // commit order (transaction id, then position) over finished transactions only.
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        let raw = sqlx::PgPool::connect(&database.url).await.expect("raw pool");
        let mut a = raw.begin().await.expect("tx a");
        sqlx::query("SELECT pg_current_xact_id()").execute(&mut *a).await.expect("a takes its transaction id");
        let mut b = raw.begin().await.expect("tx b");
        sqlx::query(INSERT_EVENT).bind("access").bind("b").bind(1).execute(&mut *b).await.expect("b inserts first");
        for sequence in [1, 2] {
            sqlx::query(INSERT_EVENT).bind("box_type_namespace").bind("box-types").bind(sequence).execute(&mut *a).await.expect("a inserts");
        }
        a.commit().await.expect("a commits");
        let (first, at) = read_all(&db, Cursor::START, &[], 2).await;
        assert_eq!(first, vec!["box_type_namespace/box-types/1", "box_type_namespace/box-types/2"], "A's events, in order");
        b.commit().await.expect("b commits");
        let (then, _) = read_all(&db, at, &[], 1).await;
        assert_eq!(then, vec!["access/b/1"], "B's event, with its earlier position, still comes after the cursor");
    });
}

#[test]
fn a_two_event_command_interleaved_with_concurrent_appends_skips_nothing() {
    // R-ARCH-6: namespace-like two-event transactions interleave with single-event appends
    // of other aggregates, with pauses inside transactions, while a feed reads; every event
    // arrives exactly once.
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        let raw = sqlx::PgPool::connect(&database.url).await.expect("raw pool");
        const WRITERS: usize = 6;
        const ROUNDS: i64 = 40;
        let writers = (0..WRITERS).map(|w| {
            let raw = raw.clone();
            tokio::spawn(async move {
                let mut written = 0;
                for round in 1..=ROUNDS {
                    let mut tx = raw.begin().await.expect("tx");
                    if (w + round as usize).is_multiple_of(3) {
                        sqlx::query("SELECT pg_current_xact_id()").execute(&mut *tx).await.expect("xid first");
                        tokio::time::sleep(std::time::Duration::from_micros(300 * (w as u64 % 3))).await;
                    }
                    let (aggregate_type, events) = if w.is_multiple_of(2) { ("box_type_namespace", 2) } else { ("access", 1) };
                    for e in 0..events {
                        let sequence = round * 2 + e;
                        sqlx::query(INSERT_EVENT).bind(aggregate_type).bind(format!("w{w}")).bind(sequence).execute(&mut *tx).await.expect("insert");
                        tokio::time::sleep(std::time::Duration::from_micros(200 * ((round as u64 + w as u64) % 4))).await;
                    }
                    tx.commit().await.expect("commit");
                    written += events as usize;
                }
                written
            })
        });
        let reader = {
            let db = db.clone();
            tokio::spawn(async move {
                let feeds = FeedSource::default();
                let mut feed = feeds.open(&db, "interleaving", &[], Cursor::START).await.expect("feed");
                let mut seen = Vec::new();
                let expected = (WRITERS / 2) * ROUNDS as usize * 3;
                while seen.len() < expected {
                    seen.extend(feed.next().await.expect("next").into_iter().map(|d| d.event.event_id));
                }
                seen
            })
        };
        let mut written = 0;
        for w in writers {
            written += w.await.expect("writer");
        }
        let seen = tokio::time::timeout(std::time::Duration::from_secs(60), reader).await.expect("the feed read every event").expect("reader");
        assert_eq!(seen.len(), written, "every event once");
        let unique: std::collections::BTreeSet<_> = seen.iter().collect();
        assert_eq!(unique.len(), written, "no event twice");
        let stored = db.events_after(0, &[], 10_000).await.expect("all").len();
        assert_eq!(stored, written);
    });
}

#[test]
fn a_read_costs_what_it_returns_even_when_the_planner_knows_nothing_of_the_store() {
    // R-ARCH-6: given a young store whose statistics were never gathered (autovacuum has
    // not come by yet) holding 5,000 events of one type
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        sqlx::query("ALTER TABLE events SET (autovacuum_enabled = false)").execute(db.any()).await.expect("no autovacuum");
        sqlx::query(
            "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
             SELECT 'draft', 'd' || i, 1, 'DraftSubmitted', '1', json_build_object('manifest', repeat('x', 400)), '{}' FROM generate_series(1, 5000) AS i",
        )
        .execute(db.any())
        .await
        .expect("seed");
        // A read shows only transactions below the cluster's oldest open one: another test
        // of this server may hold one open for a moment, so wait until all 5,000 show.
        let mut seeded = Vec::new();
        for _ in 0..600 {
            seeded = db.read(Cursor::START, &["draft"], 5000).await.expect("read").events;
            if seeded.len() == 5000 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let last = seeded.last().filter(|_| seeded.len() == 5000).map(StoredEvent::cursor).expect("all 5,000 seeded events readable within 30 s");
        let near_the_end = Cursor { tx_id: last.tx_id, position: last.position - 3 };
        // when a consumer of drafts and Boxes, of Boxes alone, or of many types (as the audit
        // writer) reads from near the end,
        // with the plan PostgreSQL keeps for a prepared statement; then the read touches a
        // few pages per type, not every stored event of its types (5,000 rows take about 400 pages)
        let many = [
            "draft",
            "box",
            "access",
            "namespace",
            "pat",
            "audit_ledger",
            "approval_security",
            "drafts_security",
            "worker",
            "binding",
            "launch",
            "gateway_security",
        ];
        for types in [&["draft", "box"][..], &["box"][..], &many[..]] {
            let mut conn = db.any().acquire().await.expect("connection");
            sqlx::query("SET plan_cache_mode = force_generic_plan").execute(&mut *conn).await.expect("generic plans");
            let statement = atasira_platform::store::pg_read_statement(types);
            sqlx::query(&format!("PREPARE probe(bigint, bigint, bigint) AS {statement}")).execute(&mut *conn).await.expect("prepare");
            let explain = format!("EXPLAIN (ANALYZE, BUFFERS) EXECUTE probe({}, {}, 100)", near_the_end.tx_id, near_the_end.position);
            let plan: Vec<String> = sqlx::query(&explain)
                .fetch_all(&mut *conn)
                .await
                .expect("explain")
                .iter()
                .map(|row| sqlx::Row::try_get::<String, _>(row, 0).expect("a plan line"))
                .collect();
            // The first `Buffers:` line is the whole statement's: "shared hit=N read=M".
            let total = plan.iter().find(|l| l.trim_start().starts_with("Buffers: shared")).expect("a Buffers line");
            let pages: i64 = total
                .split_whitespace()
                .filter_map(|w| w.strip_prefix("hit=").or_else(|| w.strip_prefix("read=")))
                .map(|n| n.trim_end_matches(',').parse::<i64>().expect("a number"))
                .sum();
            // (an index descent per type and look: a few pages each)
            let bound = 10 * types.len() as i64 + 20;
            assert!(pages < bound, "reading {types:?} from near the end touched {pages} pages, more than {bound}:\n{}", plan.join("\n"));
            sqlx::query("DEALLOCATE probe").execute(&mut *conn).await.expect("deallocate");
        }
        // and the read returns what is there, in order
        let batch = db.read(near_the_end, &["draft", "box"], 100).await.expect("read");
        assert_eq!(batch.events.len(), 3);
        assert!(batch.events.windows(2).all(|w| w[0].position < w[1].position));
    });
}

#[test]
fn reads_cut_short_on_postgresql_leave_the_next_read_whole() {
    // R-ARCH-6: a feed's reads share a connection kept between reads; a read whose caller
    // stopped mid-statement must not leave that connection half-way through a reply.
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        for i in 0..50 {
            let id = format!("r{i}");
            db.cqrs::<Draft>().execute_new(&id, submit(&id), HashMap::new()).await.expect("submit");
        }
        // A read may be held back while any transaction on the server is older than the
        // events (other tests share it): it is read again, as a feed does.
        async fn whole(db: &Db) -> Vec<atasira_platform::store::StoredEvent> {
            for _ in 0..400 {
                let batch = db.read(Cursor::START, &["draft"], 100).await.expect("read");
                if !batch.held_back && batch.events.len() == 50 {
                    return batch.events;
                }
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            panic!("the fifty events were never read whole");
        }
        let first = whole(&db).await;
        for micros in [0, 1, 10, 50, 100, 200, 300, 500, 800, 1200, 2000] {
            let _ = tokio::time::timeout(std::time::Duration::from_micros(micros), db.read(Cursor::START, &["draft"], 100)).await;
            assert_eq!(whole(&db).await, first, "after a read cut short at {micros} µs");
        }
    });
}

#[test]
fn commands_on_postgresql_keep_their_connection_and_one_cut_short_leaves_the_next_whole() {
    // R-ARCH-4: a command's append gives its connection back to the store's kept ones, not
    // to the pool (which tests each returned connection with a round trip of its own); a
    // command cut short mid-statement must not leave a kept connection half-way through a
    // reply.
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        assert_eq!(db.kept_connections(), 0);
        for i in 0..20 {
            let id = format!("k{i}");
            db.cqrs::<Draft>().execute_new(&id, submit(&id), HashMap::new()).await.expect("submit");
            assert_eq!(db.kept_connections(), 1, "one after command {i}: commands one after another share it");
        }
        for micros in [0, 1, 10, 50, 100, 200, 300, 500, 800, 1200, 2000] {
            let cut = format!("cut{micros}");
            let _ = tokio::time::timeout(std::time::Duration::from_micros(micros), db.cqrs::<Draft>().execute_new(&cut, submit(&cut), HashMap::new())).await;
            assert!(db.kept_connections() <= 1);
            let next = format!("next{micros}");
            let receipt = db.cqrs::<Draft>().execute_new(&next, submit(&next), HashMap::new()).await.expect("a command after one cut short");
            assert_eq!(receipt.events.len(), 1, "after a command cut short at {micros} µs");
            let loaded: Draft = db.load(&next).await.expect("load");
            assert!(loaded.data.is_some(), "the command after one cut short at {micros} µs is stored whole");
        }
    });
}

#[test]
fn a_command_appended_if_a_condition_holds_tells_an_unmet_condition_from_a_replay_on_postgresql() {
    // R-ARCH-4, R-ARCH-13: the condition is checked in the statement that appends and admits
    // the request's assertion; when it does not hold nothing is stored and the assertion is
    // not admitted (a retry carries it again), which a replay is not mistaken for.
    use atasira_platform::admission::{self, State};
    use atasira_platform::store::Precondition;
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        let cqrs = db.cqrs::<Draft>();
        let absent = |id: &str| Precondition {
            condition: "NOT EXISTS (SELECT 1 FROM events WHERE aggregate_type = 'draft' AND aggregate_id = {0}) AND CAST({1} AS bigint) = 7".into(),
            params: vec![id.to_owned(), "7".into()],
        };
        cqrs.execute_new("other", submit("other"), HashMap::new()).await.expect("submit");
        let tag = [7u8; 32];
        let expires = chrono::Utc::now().timestamp_millis() + 60_000;
        let with_assertion = |id: &'static str, condition: Precondition| {
            let cqrs = db.cqrs::<Draft>();
            admission::scope(async move {
                assert!(admission::defer(tag, expires));
                cqrs.execute_new_if(id, submit(id), HashMap::new(), &condition).await
            })
        };
        // when the condition does not hold: nothing stored, the assertion still pending
        let (unmet, state) = with_assertion("c1", absent("other")).await;
        assert!(matches!(unmet, Ok(None)), "{unmet:?}");
        assert!(matches!(state, State::Pending { .. }), "{state:?}");
        assert!(db.stream("draft", "c1").await.expect("read").is_empty());
        // when it holds: stored and admitted in one statement
        let (met, state) = with_assertion("c1", absent("none")).await;
        assert_eq!(met.expect("met").map(|r| r.events.len()), Some(1));
        assert_eq!(state, State::Admitted);
        // when the same assertion comes again on a condition that holds: a replay, nothing stored
        let (replayed, state) = with_assertion("c2", absent("none")).await;
        assert!(matches!(&replayed, Err(r) if r.code == atasira_domain::ErrorCode::Unauthenticated), "{replayed:?}");
        assert_eq!(state, State::Replayed);
        assert!(db.stream("draft", "c2").await.expect("read").is_empty());
        // and on one that does not: told as the condition, still nothing stored
        let (unmet, _) = with_assertion("c2", absent("c1")).await;
        assert!(matches!(unmet, Ok(None)), "{unmet:?}");
        // and a stream that exists after all conflicts, the condition holding or not
        let taken = cqrs.execute_new_if("c1", submit("c1"), HashMap::new(), &absent("none")).await;
        assert!(matches!(&taken, Err(r) if r.code == atasira_domain::ErrorCode::Conflict), "{taken:?}");
        assert_eq!(db.count("SELECT COUNT(*) FROM events WHERE aggregate_type = 'draft'").await.expect("count"), 2);
    });
}
