//! The drafts view and the Box view apply a batch of events (a rebuild applies a page of
//! thousands at a time, decoded from the stored text) with each row read and written once;
//! the rows must be exactly what applying the same events one at a time gives (R-ARCH-5),
//! on PostgreSQL and on SQLite, whatever the page size, including the orders relays of
//! different services produce and redeliveries.

use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::{BoxEvent, BoxRole};
use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::aggregates::{EVENT_VERSION, types};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::token::ApprovalSigner;
use atasira_domain::{BoxManifest, Kind, Principal, Role};
use atasira_platform::projection::{self, Projection};
use atasira_platform::store::{Cursor, Db, DbKind};
use atasira_tests::fixtures::runtime;
use atasira_tests::harness::{Database, TempDir};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::Row;
use std::time::Duration;

fn t(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000 + s, 0).expect("time")
}

fn manifest(box_type: &str, purpose: &str) -> (BoxManifest, atasira_domain::os_operation::OverLimit) {
    let plan = BoxDraftCreateRequest::from_value(json!({"box_type": box_type, "purpose": purpose, "tools": ["Read"]})).and_then(|r| r.plan()).expect("plan");
    (plan.manifest, plan.over_limit)
}

fn submitted(draft_id: &str, box_type: &str, purpose: &str, at: i64) -> DraftEvent {
    let (manifest, over_limit) = manifest(box_type, purpose);
    DraftEvent::DraftSubmitted {
        draft_id: draft_id.into(),
        box_type: box_type.into(),
        manifest,
        over_limit,
        warnings: vec![],
        requested_by: Principal::new("agent", Role::Member, Kind::Agent),
        submitted_at: t(at),
        change: None,
        approvals_required: 1,
        revision: None,
        policy: None,
    }
}

fn activated(box_id: &str, draft_id: &str, box_type: &str, at: i64) -> BoxEvent {
    let (manifest, _) = manifest(box_type, "the approved purpose");
    BoxEvent::BoxActivated {
        box_id: box_id.into(),
        box_type: box_type.into(),
        draft_id: draft_id.into(),
        manifest_digest: manifest.digest(),
        manifest,
        approved_by: "admin".into(),
        approval_key_id: "approval-1".into(),
        activated_at: t(at),
    }
}

fn access(box_id: &str, ok: bool, at: i64) -> AccessEvent {
    let (index, access, attempts) = (0, "git_remote https://git.example.com/r.git".to_owned(), if ok { 2 } else { 1 });
    if ok {
        AccessEvent::AccessProvisioned { box_id: box_id.into(), box_type: "ops-bot".into(), index, access, detail: "cloned".into(), attempts, at: t(at) }
    } else {
        AccessEvent::AccessProvisionFailed {
            box_id: box_id.into(),
            box_type: "ops-bot".into(),
            index,
            access,
            reason: "unreachable".into(),
            attempts,
            at: t(at),
        }
    }
}

/// One stored event: aggregate type, id, sequence, name, payload.
type Stored = (&'static str, String, i64, &'static str, serde_json::Value);

fn draft(id: &str, sequence: i64, e: DraftEvent) -> Stored {
    (types::DRAFT, id.into(), sequence, e.name(), serde_json::to_value(&e).expect("json"))
}

fn boxed(id: &str, sequence: i64, e: BoxEvent) -> Stored {
    (types::BOX, id.into(), sequence, e.name(), serde_json::to_value(&e).expect("json"))
}

fn accessed(id: &str, sequence: i64, e: AccessEvent) -> Stored {
    (types::ACCESS, id.into(), sequence, e.name(), serde_json::to_value(&e).expect("json"))
}

/// The history: the Box's activation arrives before its draft's approval, a second
/// submission and a second activation of the same ids (redeliveries keep the first), a
/// failed then successful access, a user's role replaced, events for rows that do not
/// exist, and a manifest edit.
fn history() -> Vec<Stored> {
    let signer = ApprovalSigner::from_secret("approval-1".into(), [7; 32]);
    let (edited, _) = manifest("ops-bot", "an edited purpose");
    vec![
        draft("a", 1, submitted("a", "ops-bot", "first", 1)),
        draft("b", 1, submitted("b", "mailer", "second", 2)),
        boxed("X", 1, activated("X", "a", "ops-bot", 3)),
        draft(
            "a",
            2,
            DraftEvent::DraftApproved {
                draft_id: "a".into(),
                box_type: "ops-bot".into(),
                approved_by: "admin".into(),
                approved_at: t(4),
                confirm_over_limit: false,
                token: signer.issue("a", "ops-bot", "sha256:00", "admin", t(4)),
            },
        ),
        draft(
            "b",
            2,
            DraftEvent::DraftRejected { draft_id: "b".into(), box_type: "mailer".into(), rejected_by: "admin".into(), reason: "no".into(), at: t(5) },
        ),
        draft("c", 1, submitted("c", "reporter", "third", 6)),
        draft("c", 2, submitted("c", "replaced", "a redelivery must not replace the row", 7)),
        boxed("Y", 1, activated("Y", "z", "orphan", 8)),
        accessed("X/0", 1, access("X", false, 9)),
        accessed("X/0", 2, access("X", true, 10)),
        accessed("Q/0", 1, access("Q", true, 11)),
        boxed(
            "X",
            2,
            BoxEvent::BoxUserAssigned { box_id: "X".into(), user_id: "alice".into(), role_in_box: BoxRole::Primary, assigned_by: "admin".into(), at: t(12) },
        ),
        boxed(
            "X",
            3,
            BoxEvent::BoxUserAssigned { box_id: "X".into(), user_id: "alice".into(), role_in_box: BoxRole::Member, assigned_by: "admin".into(), at: t(13) },
        ),
        boxed(
            "X",
            4,
            BoxEvent::BoxUserAssigned { box_id: "X".into(), user_id: "bob".into(), role_in_box: BoxRole::Member, assigned_by: "admin".into(), at: t(13) },
        ),
        boxed(
            "X",
            5,
            BoxEvent::BoxUserUnassigned { box_id: "X".into(), user_id: "alice".into(), role_in_box: BoxRole::Member, unassigned_by: "admin".into(), at: t(13) },
        ),
        boxed("X", 6, BoxEvent::BoxStopped { box_id: "X".into(), box_type: "ops-bot".into(), by: "admin".into(), at: t(14) }),
        boxed("Y", 2, activated("Y", "z", "replaced", 15)),
        draft("c", 3, DraftEvent::DraftWithdrawn { draft_id: "c".into(), withdrawn_by: "agent".into(), at: t(16) }),
        boxed(
            "X",
            7,
            BoxEvent::BoxManifestEdited { box_id: "X".into(), manifest: edited, changed_keys: vec!["purpose".into()], edited_by: "admin".into(), at: t(17) },
        ),
    ]
}

async fn store(db: &Db, events: &[Stored]) {
    let json = if db.kind() == DbKind::Postgres { "CAST($5 AS json)" } else { "$5" };
    let meta = if db.kind() == DbKind::Postgres { "CAST('{}' AS json)" } else { "'{}'" };
    let sql = format!(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES ($1, $2, $3, $4, $6, {json}, {meta})"
    );
    for (aggregate_type, id, sequence, name, payload) in events {
        sqlx::query(&sql)
            .bind(*aggregate_type)
            .bind(id.as_str())
            .bind(*sequence)
            .bind(*name)
            .bind(payload.to_string())
            .bind(EVENT_VERSION)
            .execute(db.any())
            .await
            .expect("store an event");
    }
}

/// A view's rows, every column as text, in key order.
async fn rows(db: &Db, table: &str, columns: &[&str]) -> Vec<Vec<Option<String>>> {
    let select: Vec<String> = columns.iter().map(|c| format!("CAST({c} AS TEXT)")).collect();
    let sql = format!("SELECT {} FROM {table} ORDER BY {}", select.join(", "), columns[0]);
    let rows = sqlx::query(&sql).fetch_all(db.any()).await.expect("rows");
    rows.iter().map(|r| (0..columns.len()).map(|i| r.try_get::<Option<String>, _>(i).expect("text")).collect()).collect()
}

const DRAFT_COLUMNS: &[&str] = &[
    "draft_id",
    "box_type",
    "requested_by",
    "status",
    "position",
    "submitted_at_ns",
    "decided_by",
    "decided_at_ns",
    "decision_reason",
    "box_id",
    "over_limit_json",
    "warnings_json",
    "manifest_json",
];
const BOX_COLUMNS: &[&str] =
    &["box_id", "box_type", "draft_id", "state", "position", "created_at_ns", "approved_by", "manifest_json", "assignments_json", "provisioning_json"];

/// Page sizes of the rebuilds compared: the whole history in one page, a page per event,
/// and pages that cut drafts and Boxes apart.
const PAGES: &[i64] = &[projection::REBUILD_PAGE, 1, 2, 3, 7];

/// Rebuilds `view` in pages of each size in `PAGES`, then applies the same events one at a
/// time from empty; every rebuild gives the rows one at a time gives, which are returned.
async fn batch_equals_one_at_a_time(db: &Db, view: &dyn Projection, table: &str, columns: &[&str]) -> Vec<Vec<Option<String>>> {
    // A read shows only transactions below the server's oldest open one: another test of
    // this server may hold one open for a moment, so read until every stored event shows.
    let types = view.aggregate_types().iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
    let count = format!("SELECT COUNT(*) FROM events WHERE aggregate_type IN ({types})");
    let stored: i64 = sqlx::query(&count).fetch_one(db.any()).await.expect("count").try_get(0).expect("a count");
    let mut events = Vec::new();
    for _ in 0..600 {
        events = db.read(Cursor::START, view.aggregate_types(), 1000).await.expect("read").events;
        if events.len() as i64 == stored {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(events.len() as i64, stored, "{}: every stored event readable within 30 s", view.name());
    let ids: Vec<String> = events.iter().map(|e| e.event_id.clone()).collect();
    let waits_on = [projection::ReadModel::new(view.name(), view.aggregate_types())];
    // A rebuild does not read the event types the view takes nothing from.
    let read = events.iter().filter(|e| !view.ignored_event_types().contains(&e.event_type.as_str())).count();
    assert!(view.name() != "drafts_view" || read < events.len(), "the history holds Box events the drafts view ignores");
    let mut rebuilt = Vec::new();
    for page in PAGES {
        let applied = projection::rebuild_in_pages(db, view, *page).await.expect("rebuild");
        assert_eq!(applied as usize, read, "{}: every event it reads applied once (pages of {page})", view.name());
        // R-BOX-9: a rebuild leaves the processed set empty; its cursor says every event
        // was applied, so a read-your-writes wait by event id finds them all.
        let lagging = projection::wait_for_events(db, &waits_on, &ids, 0, Duration::ZERO).await.expect("wait");
        assert!(lagging.is_empty(), "{}: after a rebuild in pages of {page} a wait finds every event applied", view.name());
        // A second delivery of an applied event is skipped.
        assert!(!projection::apply_one(db, view, &events[0]).await.expect("apply"), "{}: a redelivered event is skipped", view.name());
        rebuilt.push((page, rows(db, table, columns).await));
    }

    sqlx::query(&format!("DELETE FROM {table}")).execute(db.any()).await.expect("empty the view");
    for forget in ["DELETE FROM projection_processed WHERE name = $1", "DELETE FROM projection_checkpoints WHERE name = $1"] {
        sqlx::query(forget).bind(view.name()).execute(db.any()).await.expect("empty the view");
    }
    for id in &ids {
        assert!(!projection::processed(db, view.name(), id).await.expect("processed"), "{}: {id} is not applied yet", view.name());
    }
    for event in &events {
        assert!(projection::apply_one(db, view, event).await.expect("apply"), "{}: {} is new", view.name(), event.event_id);
    }
    let lagging = projection::wait_for_events(db, &waits_on, &ids, 0, Duration::ZERO).await.expect("wait");
    assert!(lagging.is_empty(), "{}: a wait finds every event applied one at a time", view.name());
    let one_by_one = rows(db, table, columns).await;
    for (page, batched) in rebuilt {
        assert_eq!(batched, one_by_one, "{}: a rebuild in pages of {page} gives the rows one event at a time gives", view.name());
    }
    one_by_one
}

fn column<'a>(rows: &'a [Vec<Option<String>>], columns: &[&str], key: &str, name: &str) -> Option<&'a str> {
    let i = columns.iter().position(|c| *c == name).expect("column");
    rows.iter().find(|r| r[0].as_deref() == Some(key)).and_then(|r| r[i].as_deref())
}

async fn check(db: &Db) {
    store(db, &history()).await;
    let drafts = batch_equals_one_at_a_time(db, &atasira_drafts::DraftsView, "draft_rows", DRAFT_COLUMNS).await;
    let get = |key: &str, name: &str| column(&drafts, DRAFT_COLUMNS, key, name).map(str::to_owned);
    assert_eq!(drafts.len(), 3, "drafts a, b, c; no row for the Box of an unknown draft");
    assert_eq!((get("a", "status"), get("a", "box_id"), get("a", "decided_by")), (Some("active".into()), Some("X".into()), Some("admin".into())));
    assert_eq!((get("b", "status"), get("b", "decision_reason")), (Some("rejected".into()), Some("no".into())));
    assert_eq!((get("c", "status"), get("c", "box_type")), (Some("withdrawn".into()), Some("reporter".into())), "the first submission's row, withdrawn");

    let boxes = batch_equals_one_at_a_time(db, &atasira_runtime_registry::BoxesView, "box_rows", BOX_COLUMNS).await;
    let get = |key: &str, name: &str| column(&boxes, BOX_COLUMNS, key, name).map(str::to_owned);
    assert_eq!(boxes.len(), 2, "Boxes X and Y; no row for the access of an unknown Box");
    assert_eq!(get("X", "state").as_deref(), Some("stopped"));
    let json = |s: Option<String>| serde_json::from_str::<serde_json::Value>(&s.expect("json column")).expect("json");
    assert_eq!(json(get("X", "assignments_json")), json!([{"user_id": "bob", "role_in_box": "member"}]), "alice was unassigned (R-BOX-6)");
    let provisioning = json(get("X", "provisioning_json"));
    assert_eq!((provisioning.as_array().map(Vec::len), &provisioning[0]["provisioned"]), (Some(1), &json!(true)), "the later outcome replaced the failure");
    assert_eq!(json(get("X", "manifest_json"))["purpose"], json!("an edited purpose"));
    assert_eq!(get("Y", "box_type").as_deref(), Some("orphan"), "the first activation's row");

    // R-ARCH-5: both rebuilt at once, as `atasira projections rebuild` does: the same rows,
    // each view's count in the order asked, each told as it ends.
    let views: [&dyn Projection; 2] = [&atasira_drafts::DraftsView, &atasira_runtime_registry::BoxesView];
    let told = std::sync::Mutex::new(Vec::new());
    let applied = projection::rebuild_all(db, &views, |name, applied| told.lock().expect("told").push((name.to_owned(), applied))).await.expect("rebuild both");
    let mut told = told.into_inner().expect("told");
    told.sort();
    assert_eq!(told, vec![("drafts_view".to_owned(), applied[0]), ("registry_boxes".to_owned(), applied[1])], "each view told once, with its count");
    assert!(applied.iter().all(|n| *n > 0), "both views applied events: {applied:?}");
    assert_eq!(rows(db, "draft_rows", DRAFT_COLUMNS).await, drafts, "the drafts view rebuilt beside the Box view");
    assert_eq!(rows(db, "box_rows", BOX_COLUMNS).await, boxes, "the Box view rebuilt beside the drafts view");
}

#[test]
fn a_batch_gives_the_rows_one_event_at_a_time_gives_on_postgresql() {
    // R-ARCH-5 (cluster store)
    let database = Database::create();
    runtime().block_on(async { check(&Db::connect(&database.url).await.expect("connect")).await });
}

#[test]
fn a_batch_gives_the_rows_one_event_at_a_time_gives_on_sqlite() {
    // R-ARCH-5, R-ARCH-7 (embedded store)
    let dir = TempDir::new("atasira-batches");
    runtime().block_on(async { check(&Db::connect(&Db::sqlite_url(&dir.0)).await.expect("connect")).await });
}

#[test]
fn a_page_of_drafts_reads_the_page_not_the_whole_view() {
    // R-DRAFT-12: given a drafts view on PostgreSQL holding 20,000 drafts (one in ten
    // pending, a hundred requesters),
    use atasira_domain::aggregates::draft::DraftStatus;
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        projection::prepare(&db, &atasira_drafts::DraftsView).await.expect("the view's tables");
        sqlx::query(
            "INSERT INTO draft_rows (draft_id, box_type, requested_by, status, position, submitted_at_ns, over_limit_json, warnings_json, manifest_json)
             SELECT 'd' || i, 'bt' || i, 'agent-' || (i % 100), CASE WHEN i % 10 = 0 THEN 'pending_approval' ELSE 'rejected' END, i, i, '{}', '[]', repeat('x', 300)
               FROM generate_series(1, 20000) AS i",
        )
        .execute(db.any())
        .await
        .expect("seed");
        sqlx::query("ANALYZE draft_rows").execute(db.any()).await.expect("analyze");
        // when the first page is read (with the plan PostgreSQL keeps for a prepared
        // statement) for the pending list, every draft, one requester's, one requester's
        // pending ones, or a status no draft has,
        let pages_of = [
            (vec![DraftStatus::PendingApproval], None),
            (vec![], None),
            (vec![], Some("agent-10")),
            (vec![DraftStatus::PendingApproval], Some("agent-10")),
            (vec![DraftStatus::Approved, DraftStatus::Active], None),
        ];
        for (statuses, requester) in pages_of {
            let mut conn = db.any().acquire().await.expect("connection");
            sqlx::query("SET plan_cache_mode = force_generic_plan").execute(&mut *conn).await.expect("generic plans");
            let statement = atasira_drafts::list_statement(&statuses, requester.is_some());
            let (types, args) = match requester {
                Some(r) => ("bigint, bigint, text", format!("0, 51, '{r}'")),
                None => ("bigint, bigint", "0, 51".to_owned()),
            };
            sqlx::query(&format!("PREPARE probe({types}) AS {statement}")).execute(&mut *conn).await.expect("prepare");
            let plan: Vec<String> = sqlx::query(&format!("EXPLAIN (ANALYZE, BUFFERS) EXECUTE probe({args})"))
                .fetch_all(&mut *conn)
                .await
                .expect("explain")
                .iter()
                .map(|row| row.try_get::<String, _>(0).expect("a plan line"))
                .collect();
            // then the read touches about the pages of the page's rows, not the view's
            // (20,000 rows take about 1,000 pages)
            let total = plan.iter().find(|l| l.trim_start().starts_with("Buffers: shared")).map_or("", |l| l.as_str());
            let pages: i64 = total
                .split_whitespace()
                .filter_map(|w| w.strip_prefix("hit=").or_else(|| w.strip_prefix("read=")))
                .map(|n| n.trim_end_matches(',').parse::<i64>().expect("a number"))
                .sum();
            assert!(pages < 150, "the first page of {statuses:?} by {requester:?} touched {pages} pages:\n{}", plan.join("\n"));
            sqlx::query("DEALLOCATE probe").execute(&mut *conn).await.expect("deallocate");
        }
    });
}
