//! `atasira bench rebuild`: seeds a store with N events the drafts view and the Box view
//! read (payloads serialized from the domain's own event types, as cqrs-es stores them),
//! then times `projection::rebuild` of each view, with a profile of where the time goes
//! (reading the store, decoding payloads, and the view's own work), and of both at once as
//! `atasira projections rebuild` runs them: that is the figure held against the target.

use std::time::{Duration, Instant};

use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::{BoxEvent, BoxRole};
use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::aggregates::{EVENT_VERSION, types};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::token::ApprovalSigner;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::projection::{self, Projection};
use atasira_platform::store::{Cursor, Db, DbKind};

use super::{TempDir, process_cpu, thousands};

/// The target of the rebuild rate.
const TARGET: f64 = 60_000.0;

/// Events per seeding statement and per seeding transaction.
const ROWS_PER_INSERT: usize = 28;
const ROWS_PER_TX: usize = 10_000;

/// One event to store.
pub(super) struct Row {
    pub(super) aggregate_type: &'static str,
    pub(super) aggregate_id: String,
    pub(super) sequence: i64,
    pub(super) event_type: &'static str,
    pub(super) payload: String,
}

/// The events of cycle `k` (8 events, 3 drafts, 1 Box): a draft submitted, approved and
/// activated as a Box with a user and one provisioned access; a draft submitted and
/// rejected; a draft submitted and left pending.
fn cycle(run: &str, k: usize, signer: &ApprovalSigner) -> anyhow::Result<Vec<Row>> {
    let at = chrono::Utc::now();
    let box_type = format!("report-{k}");
    let request = BoxDraftCreateRequest {
        box_type: Some(box_type.clone()),
        name: Some(format!("Sales report {k}")),
        purpose: Some("Builds the weekly sales report from the CSV exports of the shop system and mails it to the team leads every Monday.".into()),
        success_criteria: Some(vec!["The report reaches every lead by 9:00".into(), "Numbers match the exports".into()]),
        os_operations: Some(vec!["file:read".into(), "file:write".into(), "notify:email".into()]),
        tools: Some(vec!["Read".into(), "Write".into(), "Grep".into()]),
        file_access: Some(vec!["/srv/exports".into()]),
        ..Default::default()
    };
    let plan = request.plan().map_err(|e| anyhow::anyhow!("the seeding request is invalid: {e:?}"))?;
    let agent = Principal::new("agent", Role::Member, Kind::Agent);
    let submitted = |draft_id: &str| DraftEvent::DraftSubmitted {
        draft_id: draft_id.to_owned(),
        box_type: box_type.clone(),
        manifest: plan.manifest.clone(),
        over_limit: plan.over_limit.clone(),
        warnings: plan.warnings.clone(),
        requested_by: agent.clone(),
        submitted_at: at,
        change: None,
        approvals_required: 1,
        revision: None,
        policy: None,
    };
    let (approved, rejected, pending) = (format!("{run}-a{k}"), format!("{run}-r{k}"), format!("{run}-p{k}"));
    let box_id = format!("{run}-box{k}");
    let digest = plan.manifest.digest();
    let draft = |id: &str, sequence: i64, e: DraftEvent| -> anyhow::Result<Row> {
        Ok(Row { aggregate_type: types::DRAFT, aggregate_id: id.to_owned(), sequence, event_type: e.name(), payload: serde_json::to_string(&e)? })
    };
    let boxed = |sequence: i64, e: BoxEvent| -> anyhow::Result<Row> {
        Ok(Row { aggregate_type: types::BOX, aggregate_id: box_id.clone(), sequence, event_type: e.name(), payload: serde_json::to_string(&e)? })
    };
    let access = AccessEvent::AccessProvisioned {
        box_id: box_id.clone(),
        box_type: box_type.clone(),
        index: 0,
        access: "git_remote https://git.example.com/sales/reports.git".into(),
        detail: "cloned into workspaces/reports".into(),
        attempts: 1,
        at,
    };
    Ok(vec![
        draft(&approved, 1, submitted(&approved))?,
        draft(
            &approved,
            2,
            DraftEvent::DraftApproved {
                draft_id: approved.clone(),
                box_type: box_type.clone(),
                approved_by: "admin".into(),
                approved_at: at,
                confirm_over_limit: false,
                token: signer.issue(&approved, &box_type, &digest, "admin", at),
            },
        )?,
        boxed(
            1,
            BoxEvent::BoxActivated {
                box_id: box_id.clone(),
                box_type: box_type.clone(),
                draft_id: approved.clone(),
                manifest: plan.manifest.clone(),
                manifest_digest: digest.clone(),
                approved_by: "admin".into(),
                approval_key_id: signer.public_key().key_id,
                activated_at: at,
            },
        )?,
        boxed(
            2,
            BoxEvent::BoxUserAssigned { box_id: box_id.clone(), user_id: "alice".into(), role_in_box: BoxRole::Primary, assigned_by: "admin".into(), at },
        )?,
        Row {
            aggregate_type: types::ACCESS,
            aggregate_id: format!("{box_id}/0"),
            sequence: 1,
            event_type: access.name(),
            payload: serde_json::to_string(&access)?,
        },
        draft(&rejected, 1, submitted(&rejected))?,
        draft(
            &rejected,
            2,
            DraftEvent::DraftRejected {
                draft_id: rejected.clone(),
                box_type: box_type.clone(),
                rejected_by: "admin".into(),
                reason: "covered by an active Box".into(),
                at,
            },
        )?,
        draft(&pending, 1, submitted(&pending))?,
    ])
}

/// Stores `rows` in one transaction, `ROWS_PER_INSERT` to a statement.
async fn insert(db: &Db, rows: &[Row]) -> anyhow::Result<()> {
    let json = |n: usize| if db.kind() == DbKind::Postgres { format!("CAST(${n} AS json)") } else { format!("${n}") };
    let metadata = r#"{"correlation_id":"bench","principal":"agent"}"#;
    let turn = db.write_turn().await;
    let mut tx = db.any().begin().await?;
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let values: Vec<String> = (0..chunk.len())
            .map(|i| {
                let b = i * 7;
                format!("(${}, ${}, ${}, ${}, ${}, {}, {})", b + 1, b + 2, b + 3, b + 4, b + 5, json(b + 6), json(b + 7))
            })
            .collect();
        let sql =
            format!("INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES {}", values.join(", "));
        let mut query = sqlx::query(&sql);
        for row in chunk {
            query = query
                .bind(row.aggregate_type)
                .bind(row.aggregate_id.as_str())
                .bind(row.sequence)
                .bind(row.event_type)
                .bind(EVENT_VERSION)
                .bind(row.payload.as_str())
                .bind(metadata);
        }
        query.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    drop(turn);
    Ok(())
}

/// Stores about `events` events (whole cycles of 8), saying how far it got.
async fn seed(db: &Db, events: usize) -> anyhow::Result<usize> {
    let signer = ApprovalSigner::from_secret("bench-1".into(), atasira_platform::auth::random_secret());
    seed_with(db, events, 8, |run, k| cycle(run, k, &signer)).await
}

/// Stores about `events` events, whole cycles of `per_cycle` events that `cycle` makes for
/// this seeding's run id and the cycle's number, saying how far it got; then gathers the
/// planner's statistics.
pub(super) async fn seed_with(
    db: &Db,
    events: usize,
    per_cycle: usize,
    mut cycle: impl FnMut(&str, usize) -> anyhow::Result<Vec<Row>>,
) -> anyhow::Result<usize> {
    let run = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let cycles = events.div_ceil(per_cycle).max(1);
    let mut pending = Vec::with_capacity(ROWS_PER_TX + per_cycle);
    let (mut stored, mut told) = (0, Instant::now());
    for k in 0..cycles {
        pending.extend(cycle(&run, k)?);
        if pending.len() >= ROWS_PER_TX || k + 1 == cycles {
            insert(db, &pending).await?;
            stored += pending.len();
            pending.clear();
            if told.elapsed() > Duration::from_secs(5) {
                eprintln!("  ... seeded {} of {} events", thousands(stored as f64), thousands((cycles * per_cycle) as f64));
                told = Instant::now();
            }
        }
    }
    if db.kind() == DbKind::Postgres {
        // The statistics autovacuum would gather soon: without them the planner does not
        // know how many events each type has.
        sqlx::query("ANALYZE events").execute(db.any()).await?;
    }
    Ok(stored)
}

/// Events in the store.
pub(super) async fn stored(db: &Db) -> anyhow::Result<usize> {
    let n: i64 = sqlx::Row::try_get(&sqlx::query("SELECT COUNT(*) FROM events").fetch_one(db.any()).await?, 0)?;
    Ok(usize::try_from(n)?)
}

/// Where the time of a rebuild goes, measured apart: reading the events a view reads from
/// the store (a page a read, as the rebuild does), and decoding their payloads from the
/// stored text into the domain's event types.
async fn profile(db: &Db, view: &dyn Projection) -> anyhow::Result<(usize, Duration, Duration)> {
    let (mut at, mut count, mut reading, mut decoding) = (Cursor::START, 0, Duration::ZERO, Duration::ZERO);
    loop {
        let t = Instant::now();
        let batch = db.read_text(at, view.aggregate_types(), view.ignored_event_types(), projection::REBUILD_PAGE).await?;
        reading += t.elapsed();
        let Some(last) = batch.events.last() else { break };
        at = last.cursor();
        let read: Vec<_> = batch.events.iter().filter(|e| !view.ignored_event_types().contains(&e.event_type.as_str())).collect();
        count += read.len();
        let t = Instant::now();
        for e in read {
            let e = e.as_event();
            match e.aggregate_type {
                types::DRAFT => drop(e.decode::<DraftEvent>()?),
                types::BOX => drop(e.decode::<BoxEvent>()?),
                types::ACCESS => drop(e.decode::<AccessEvent>()?),
                _ => {}
            }
        }
        decoding += t.elapsed();
    }
    Ok((count, reading, decoding))
}

/// What one statement costs, the unit a view's reads and writes are made of: `SELECT 1`
/// in a transaction, many times.
async fn round_trip(db: &Db) -> anyhow::Result<Duration> {
    const N: u32 = 2000;
    let mut tx = db.any().begin().await?;
    let t = Instant::now();
    for _ in 0..N {
        sqlx::query("SELECT 1").execute(&mut *tx).await?;
    }
    let took = t.elapsed();
    tx.commit().await?;
    Ok(took / N)
}

fn rate(events: usize, time: Duration) -> f64 {
    events as f64 / time.as_secs_f64().max(1e-9)
}

/// `atasira bench rebuild`.
pub async fn rebuild(events: usize, database_url: Option<&str>) -> anyhow::Result<()> {
    let dir;
    let (db, place) = match database_url {
        Some(url) => (Db::connect(url).await?, format!("PostgreSQL {}", atasira_platform::store::redact(url))),
        None => {
            dir = TempDir::new("rebuild")?;
            (Db::connect(&Db::sqlite_url(dir.path())).await?, format!("SQLite in {}", dir.path().display()))
        }
    };
    println!(
        "atasira bench rebuild: {} events, {place}, {} CPUs",
        thousands(events as f64),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    println!("  each 8 events: a draft submitted, approved, activated as a Box with a user and an access; a draft submitted and rejected; one pending");
    let t = Instant::now();
    let seeded = seed(&db, events).await?;
    let stored = stored(&db).await?;
    println!("seeded {} events in {:.2} s; the store holds {}", thousands(seeded as f64), t.elapsed().as_secs_f64(), thousands(stored as f64));

    let drafts = atasira_drafts::DraftsView;
    let boxes = atasira_runtime_registry::BoxesView;
    let views: [&dyn Projection; 2] = [&drafts, &boxes];
    println!("one SQL statement (SELECT 1 in a transaction): {:.1} µs", round_trip(&db).await?.as_secs_f64() * 1e6);
    println!();
    // Each view alone, with where its time goes.
    let mut reads = Vec::new();
    for view in views {
        let (read, reading, decoding) = profile(&db, view).await?;
        let (t, cpu) = (Instant::now(), process_cpu());
        let applied = projection::rebuild(&db, view).await?;
        let (took, cpu) = (t.elapsed(), process_cpu().saturating_sub(cpu));
        println!(
            "rebuild {:<15} {:>8} events in {:>6.2} s = {:>8} events/s, cpu {:.2} s   (apart: reading the store {:.2} s, decoding payloads {:.2} s; the rest, {:.2} s, is the view's reads and writes)",
            view.name(),
            thousands(applied as f64),
            took.as_secs_f64(),
            thousands(rate(applied as usize, took)),
            cpu.as_secs_f64(),
            reading.as_secs_f64(),
            decoding.as_secs_f64(),
            took.saturating_sub(reading + decoding).as_secs_f64(),
        );
        anyhow::ensure!(read as u64 >= applied, "{} applied {applied} events but the store holds {read} it reads", view.name());
        reads.push(applied);
    }
    // Both at once, as `atasira projections rebuild` does: the figure against the target.
    let (t, cpu) = (Instant::now(), process_cpu());
    let applied = projection::rebuild_all(&db, &views, |name, applied| {
        println!("  ... {name} rebuilt ({} events) after {:.2} s", thousands(applied as f64), t.elapsed().as_secs_f64());
    })
    .await?;
    let (total, cpu) = (t.elapsed(), process_cpu().saturating_sub(cpu));
    anyhow::ensure!(applied == reads, "rebuilt together, the views applied {applied:?} events; one at a time {reads:?}");
    println!(
        "rebuild both at once        {:>8} events in {:>6.2} s, cpu {:.2} s",
        thousands(applied.iter().sum::<u64>() as f64),
        total.as_secs_f64(),
        cpu.as_secs_f64()
    );
    println!();
    println!("== summary (figures of this run; targets beside them)");
    println!(
        "  rebuilding the drafts view and the Box view: {} stored events in {:.2} s = {} events/s   target >= {} events/s",
        thousands(stored as f64),
        total.as_secs_f64(),
        thousands(rate(stored, total)),
        thousands(TARGET)
    );
    Ok(())
}
