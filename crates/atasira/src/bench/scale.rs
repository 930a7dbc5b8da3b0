//! `atasira bench scale`: how the cost of a request grows with the store. In one run, on
//! one PostgreSQL database and NATS:
//!
//! 1. seeds the store to the small size (drafts as agents leave them: each 5 events are a
//!    draft submitted and rejected, one submitted and withdrawn, one left pending), starts
//!    the cluster as processes (`atasira serve`: the five services and the gateway; the
//!    seeded events count as published on the bus long ago), waits
//!    until every process has applied the store and is idle, and measures REST submit with
//!    read-your-writes and the first page of pending drafts at c=1;
//! 2. stops the processes, seeds the store to the large size, starts them again, waits the
//!    same way (saying how long catching up took) and measures the same two figures;
//!
//! then prints the ratios against their target. It asserts nothing. Each size also measures
//! a floor (`GET /healthz`, which reads nothing), whose ratio shows how much the host
//! itself changed speed between the two measurements, minutes apart.

use std::time::Instant;

use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::aggregates::types;
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{Kind, Principal, Role};
use atasira_gateway::Config;
use atasira_platform::auth;
use atasira_platform::store::Db;

use super::drafts::{ClusterOptions, catch_up, rest_get, rest_submit};
use super::processes::{ClusterKeys, Processes};
use super::rebuild::{Row, seed_with, stored};
use super::{Figures, TempDir, measure, thousands};

/// What `atasira bench scale` is told.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    pub cluster: ClusterOptions,
    /// Stored events of the first measurement.
    pub small: usize,
    /// Stored events of the second.
    pub large: usize,
    /// Requests per measured figure.
    pub count: usize,
}

/// The target: each figure at the large size within this factor of the small size's.
const TARGET_RATIO: f64 = 1.2;

/// Events per seeding cycle (see [`drafts_cycle`]).
const PER_CYCLE: usize = 5;

/// Seeded events of cycle `k`: a draft submitted and rejected, one submitted and
/// withdrawn, one submitted and left pending, each by one of 50 agents.
fn drafts_cycle(run: &str, k: usize, request: &BoxDraftCreateRequest) -> anyhow::Result<Vec<Row>> {
    let at = chrono::Utc::now();
    let box_type = format!("{run}-report-{k}");
    let plan = request.plan().map_err(|e| anyhow::anyhow!("the seeding request is invalid: {e:?}"))?;
    let agent = Principal::new(format!("agent-{}", k % 50), Role::Member, Kind::Agent);
    let row = |id: &str, sequence: i64, e: DraftEvent| -> anyhow::Result<Row> {
        Ok(Row { aggregate_type: types::DRAFT, aggregate_id: id.to_owned(), sequence, event_type: e.name(), payload: serde_json::to_string(&e)? })
    };
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
    let (rejected, withdrawn, pending) = (format!("{run}-r{k}"), format!("{run}-w{k}"), format!("{run}-p{k}"));
    Ok(vec![
        row(&rejected, 1, submitted(&rejected))?,
        row(
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
        row(&withdrawn, 1, submitted(&withdrawn))?,
        row(&withdrawn, 2, DraftEvent::DraftWithdrawn { draft_id: withdrawn.clone(), withdrawn_by: agent.user_id.clone(), at })?,
        row(&pending, 1, submitted(&pending))?,
    ])
}

/// The draft every seeded cycle submits.
fn seeding_request() -> BoxDraftCreateRequest {
    BoxDraftCreateRequest {
        name: Some("Sales report".into()),
        purpose: Some("Builds the weekly sales report from the CSV exports of the shop system and mails it to the team leads every Monday.".into()),
        success_criteria: Some(vec!["The report reaches every lead by 9:00".into()]),
        os_operations: Some(vec!["file:read".into(), "notify:email".into()]),
        tools: Some(vec!["Read".into(), "Grep".into()]),
        ..Default::default()
    }
}

/// Adds drafts until the store holds at least `events` events.
async fn seed_to(db: &Db, events: usize) -> anyhow::Result<()> {
    let have = stored(db).await?;
    if have >= events {
        return Ok(());
    }
    let t = Instant::now();
    let mut request = seeding_request();
    let seeded = seed_with(db, events - have, PER_CYCLE, |run, k| {
        request.box_type = Some(format!("{run}-report-{k}"));
        drafts_cycle(run, k, &request)
    })
    .await?;
    println!("  seeded {} events in {:.1} s", thousands(seeded as f64), t.elapsed().as_secs_f64());
    published_long_ago(db).await
}

/// Takes every stored event as published on the bus long ago: each relay's checkpoint
/// moves to the end of the store. What the benchmark measures is the store's size, not a
/// backlog of a million events for the public stream (each relayed with its own
/// acknowledgement); the read models and the audit ledger still apply every seeded event.
async fn published_long_ago(db: &Db) -> anyhow::Result<()> {
    let end = sqlx::query("SELECT CAST(CAST(tx_id AS TEXT) AS BIGINT), global_position FROM events ORDER BY tx_id DESC, global_position DESC LIMIT 1")
        .fetch_one(db.any())
        .await?;
    let (tx_id, position): (i64, i64) = (sqlx::Row::try_get(&end, 0)?, sqlx::Row::try_get(&end, 1)?);
    let sql = "INSERT INTO relay_checkpoints (name, tx_id, position) VALUES ($1, $2, $3)
               ON CONFLICT (name) DO UPDATE SET tx_id = excluded.tx_id, position = excluded.position";
    for identity in atasira_contracts::subjects::IDENTITIES {
        sqlx::query(sql).bind(format!("relay-{identity}")).bind(tx_id).bind(position).execute(db.any()).await?;
    }
    Ok(())
}

/// The figures at one store size.
struct AtSize {
    events: usize,
    submit: Figures,
    page: Figures,
    floor: Figures,
}

/// Starts the processes on the store as it is, waits until they have caught up and are
/// idle, measures, and stops them.
async fn measure_at(o: &ScaleOptions, db: &Db, keys: &ClusterKeys, dir: &std::path::Path) -> anyhow::Result<AtSize> {
    let events = stored(db).await?;
    println!("-- {} stored events", thousands(events as f64));
    let t = Instant::now();
    let mut processes = Processes::start(&o.cluster, keys, dir, true).await?;
    let bus = o.cluster.gateway_bus().await?;
    catch_up(&bus, db, &Config::default().read_models).await?;
    processes.settle().await?;
    println!("  the cluster started and caught up with the store in {:.1} s", t.elapsed().as_secs_f64());
    // A store that grew over months has been vacuumed and analyzed by PostgreSQL long ago:
    // do it now, so autovacuum does not run into the measurement.
    sqlx::query("VACUUM ANALYZE").execute(db.any()).await?;
    // ...and its pages were written out by checkpoints long ago: write them now, so the
    // checkpoint that follows a seeding (gigabytes of WAL) does not run into the
    // measurement. It needs a superuser (or pg_checkpoint); without one it is skipped.
    if let Err(e) = sqlx::query("CHECKPOINT").execute(db.any()).await {
        eprintln!("  ... no CHECKPOINT before measuring ({e}); a checkpoint of the seeding may run into the figures");
    }
    let api = processes.api.ok_or_else(|| anyhow::anyhow!("no gateway runs"))?;
    let agent = Principal::new("bench-agent", Role::Member, Kind::Agent);
    let admin = Principal::new("bench-admin", Role::Admin, Kind::Human);
    let ttl = Some(chrono::TimeDelta::hours(1));
    let agent_pat = auth::create_token(db, &agent, ttl, auth::OPERATOR).await?.token;
    let admin_pat = auth::create_token(db, &admin, ttl, auth::OPERATOR).await?.token;
    let submit = rest_submit(api, agent_pat, "scale");
    let page = rest_get(api, admin_pat, "/api/v1/boxes/box-drafts/pending");
    let floor = rest_get(api, String::new(), "/healthz");
    measure("warm-up (REST)", 4, 40, &submit).await?;
    measure("warm-up (pending page)", 4, 40, &page).await?;
    measure("warm-up (floor)", 4, 40, &floor).await?;
    let submit = measure("REST submit + read-your-writes", 1, o.count, &submit).await?;
    let page = measure("first page of pending drafts (50)", 1, o.count, &page).await?;
    let floor = measure("floor: GET /healthz (reads nothing)", 1, o.count, &floor).await?;
    processes.check()?;
    processes.stop();
    println!();
    Ok(AtSize { events, submit, page, floor })
}

/// `atasira bench scale`.
pub async fn scale(o: ScaleOptions) -> anyhow::Result<()> {
    anyhow::ensure!(o.cluster.database_url.starts_with("postgres"), "the cluster runs on PostgreSQL: pass a postgres:// URL");
    anyhow::ensure!(o.small < o.large, "--small must be below --large");
    let db = Db::connect(&o.cluster.database_url).await?;
    let have = stored(&db).await?;
    anyhow::ensure!(have <= o.small, "the database already holds {have} events, more than --small: give the benchmark a fresh database");
    println!(
        "atasira bench scale: REST submit with read-your-writes and the first page of pending drafts at {} and at {} stored events, {} requests each at c=1; the cluster as processes on {}, {} CPUs",
        thousands(o.small as f64),
        thousands(o.large as f64),
        o.count,
        o.cluster.describe(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    println!("  seeded drafts: each 5 events are a draft submitted and rejected, one submitted and withdrawn, one left pending");
    println!();
    let dir = TempDir::new("scale")?;
    let keys = ClusterKeys::fresh()?;
    seed_to(&db, o.small).await?;
    let small = measure_at(&o, &db, &keys, dir.path()).await?;
    seed_to(&db, o.large).await?;
    let large = measure_at(&o, &db, &keys, dir.path()).await?;

    println!("== summary (figures of this run; targets beside them)");
    let sizes = format!("{} / {} events", thousands(large.events as f64), thousands(small.events as f64));
    for (what, l, s) in
        [("REST submit + read-your-writes p50 at c=1", &large.submit, &small.submit), ("first page of pending drafts p50 at c=1", &large.page, &small.page)]
    {
        println!("  {what:<44} {:>6.2} x   target <= {TARGET_RATIO} x   ({:.2} ms / {:.2} ms, {sizes})", l.p50_ms() / s.p50_ms(), l.p50_ms(), s.p50_ms());
    }
    // Not a target: a floor that moved says the host, not the store, moved the figures.
    let (l, s) = (&large.floor, &small.floor);
    println!(
        "  {:<44} {:>6.2} x   (the host's own change; {:.3} ms / {:.3} ms)",
        "floor (GET /healthz) p50 at c=1",
        l.p50_ms() / s.p50_ms(),
        l.p50_ms(),
        s.p50_ms()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeding_cycle_leaves_one_draft_pending_among_three() {
        let mut request = seeding_request();
        request.box_type = Some("run-report-7".into());
        let rows = drafts_cycle("run", 7, &request).expect("a cycle");
        assert_eq!(rows.len(), PER_CYCLE);
        let ids: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
        assert_eq!(ids.len(), 3);
        let last_of = |id: &str| rows.iter().filter(|r| r.aggregate_id == id).map(|r| r.event_type).next_back().expect("an event");
        assert_eq!((last_of("run-r7"), last_of("run-w7"), last_of("run-p7")), ("DraftRejected", "DraftWithdrawn", "DraftSubmitted"));
    }
}
