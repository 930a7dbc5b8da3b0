//! The Worker catalog and transcripts (R-WORKER-7): a projection of the `worker` streams.
//! It holds what `GET /workers/{id}` and `GET /boxes/{id}/workers` show and the bundle
//! digest each Worker pins; where each Worker is in its life (R-HOST-2: state, host, stop
//! asked, result), its later input and its log; never the binding handle, cwd, workspace
//! or tool scope.

use std::collections::BTreeMap;

use atasira_contracts::{convert, v1};
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::worker::WorkerEvent;
use atasira_domain::worker::{Segment, WorkerState};
use atasira_platform::projection::{DecodedPage, Projection};
use atasira_platform::store::{Db, EventRef, StoredEvent, TextEvent};
use chrono::{DateTime, Utc};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

pub const WORKERS: &str = "registry_workers";
pub const WORKERS_READS: &[&str] = &[types::WORKER];
/// The Worker catalog as a read-your-writes wait waits for it.
pub const READ_MODEL: atasira_platform::projection::ReadModel = atasira_platform::projection::ReadModel::new(WORKERS, WORKERS_READS);

/// A Worker's catalog entry.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRow {
    pub worker_id: String,
    pub launch_id: String,
    pub box_id: String,
    pub box_type: String,
    pub role: String,
    pub labels: BTreeMap<String, String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// The bundle the Worker runs (kept for provenance; not in the Worker's answer).
    pub bundle_digest: String,
    /// The store position of its creation: the list order and the page cursor.
    pub position: i64,
}

/// One entry of a Worker's transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptRow {
    pub seq: u32,
    pub author: String,
    pub at: DateTime<Utc>,
    pub segments: Vec<Segment>,
}

impl WorkerRow {
    /// The catalog entry and the initial transcript entry (seq 0, by the creator) of a
    /// creation; nothing for any other event.
    pub fn created(event: &WorkerEvent, position: i64) -> Option<(WorkerRow, TranscriptRow)> {
        let WorkerEvent::WorkerCreated { worker_id, launch_id, box_id, box_type, role, labels, initial_input, bundle_digest, created_by, at, .. } = event
        else {
            return None;
        };
        let row = WorkerRow {
            worker_id: worker_id.clone(),
            launch_id: launch_id.clone(),
            box_id: box_id.clone(),
            box_type: box_type.clone(),
            role: role.clone(),
            labels: labels.clone(),
            created_by: created_by.clone(),
            created_at: *at,
            bundle_digest: bundle_digest.clone(),
            position,
        };
        Some((row, TranscriptRow { seq: 0, author: created_by.clone(), at: *at, segments: initial_input.clone() }))
    }

    /// The Worker as the wire shows it, with `transcript` (empty in lists).
    pub fn to_wire(&self, transcript: &[TranscriptRow]) -> v1::WorkerView {
        v1::WorkerView {
            worker_id: self.worker_id.clone(),
            launch_id: self.launch_id.clone(),
            box_id: self.box_id.clone(),
            box_type: self.box_type.clone(),
            role: self.role.clone(),
            labels: self.labels.clone(),
            created_by: self.created_by.clone(),
            created_at: Some(convert::timestamp(self.created_at)),
            transcript: transcript
                .iter()
                .map(|t| v1::TranscriptEntry {
                    seq: t.seq,
                    author: t.author.clone(),
                    at: Some(convert::timestamp(t.at)),
                    segments: t.segments.iter().map(segment_to_wire).collect(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn from_sql(row: &AnyRow) -> anyhow::Result<WorkerRow> {
        Ok(WorkerRow {
            worker_id: row.try_get(0)?,
            launch_id: row.try_get(1)?,
            box_id: row.try_get(2)?,
            box_type: row.try_get(3)?,
            role: row.try_get(4)?,
            labels: serde_json::from_str(&row.try_get::<String, _>(5)?)?,
            created_by: row.try_get(6)?,
            created_at: DateTime::from_timestamp_nanos(row.try_get(7)?),
            bundle_digest: row.try_get(8)?,
            position: row.try_get(9)?,
        })
    }
}

pub fn segment_to_wire(segment: &Segment) -> v1::Segment {
    use v1::segment::Kind;
    let kind = match segment {
        Segment::Text(v) => Kind::Text(v.clone()),
        Segment::TicketRef(v) => Kind::TicketRef(v.clone()),
        Segment::ObjectiveRef(v) => Kind::ObjectiveRef(v.clone()),
    };
    v1::Segment { kind: Some(kind) }
}

/// A segment from the wire; `None` when it has no kind set.
pub fn segment_from_wire(segment: &v1::Segment) -> Option<Segment> {
    use v1::segment::Kind;
    Some(match segment.kind.as_ref()? {
        Kind::Text(v) => Segment::Text(v.clone()),
        Kind::TicketRef(v) => Segment::TicketRef(v.clone()),
        Kind::ObjectiveRef(v) => Segment::ObjectiveRef(v.clone()),
    })
}

fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(i64::MAX)
}

const COLUMNS: &str = "worker_id, launch_id, box_id, box_type, role, labels_json, created_by, created_at_ns, bundle_digest, position";

/// The catalog.
#[derive(Debug)]
pub struct WorkersView;

impl WorkersView {
    async fn apply_event(tx: &mut Transaction<'static, Any>, event: EventRef<'_>) -> anyhow::Result<()> {
        let parsed: WorkerEvent = event.decode()?;
        if !matches!(parsed, WorkerEvent::WorkerCreated { .. }) {
            return apply_life(tx, &parsed, event.position).await;
        }
        let Some((row, entry)) = WorkerRow::created(&parsed, event.position) else { return Ok(()) };
        // A redelivered creation leaves the rows as they are.
        sqlx::query(&format!("INSERT INTO worker_rows ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (worker_id) DO NOTHING"))
            .bind(row.worker_id.clone())
            .bind(row.launch_id)
            .bind(row.box_id)
            .bind(row.box_type)
            .bind(row.role)
            .bind(serde_json::to_string(&row.labels)?)
            .bind(row.created_by)
            .bind(nanos(row.created_at))
            .bind(row.bundle_digest)
            .bind(row.position)
            .execute(&mut **tx)
            .await?;
        sqlx::query(
            "INSERT INTO worker_transcript (worker_id, seq, author, at_ns, segments_json) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (worker_id, seq) DO NOTHING",
        )
        .bind(row.worker_id)
        .bind(i64::from(entry.seq))
        .bind(entry.author)
        .bind(nanos(entry.at))
        .bind(serde_json::to_string(&entry.segments)?)
        .execute(&mut **tx)
        .await?;
        let WorkerEvent::WorkerCreated { worker_id, box_id, box_type, .. } = &parsed else { return Ok(()) };
        sqlx::query(
            "INSERT INTO worker_life (worker_id, box_id, box_type, state, host, stop, result, exit_code, ended_at_ns, inputs, log_lines)
             VALUES ($1, $2, $3, 'created', '', '', '', NULL, NULL, 0, 0) ON CONFLICT (worker_id) DO NOTHING",
        )
        .bind(worker_id.clone())
        .bind(box_id.clone())
        .bind(box_type.clone())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

/// The life of a Worker after its creation. Idempotent under redelivery: states are set,
/// not counted; input and log entries are keyed by their sequence.
async fn apply_life(tx: &mut Transaction<'static, Any>, event: &WorkerEvent, position: i64) -> anyhow::Result<()> {
    let set = |sql: &'static str| sqlx::query(sql);
    match event {
        WorkerEvent::WorkerCreated { .. }
        | WorkerEvent::WorkerLaunchRefused { .. }
        | WorkerEvent::WorkerToolDenied { .. }
        | WorkerEvent::WorkerNotificationRequested { .. }
        | WorkerEvent::WorkerPauseRequested { .. } => {}
        WorkerEvent::WorkerToolUseRequested { request_id, worker_id, box_id, tool, rule, reason, input, expires_at, at, .. } => {
            sqlx::query(
                "INSERT INTO tool_requests (request_id, worker_id, box_id, box_type, tool, rule, reason, input_json, state, requested_at_ns, expires_at_ns,
                    decided_by, decided_at_ns, decision_reason, launched_by, position)
                 SELECT $1, $2, $3, w.box_type, $4, $5, $6, $7, 'pending', $8, $9, '', NULL, '', w.created_by, $10 FROM worker_rows w WHERE w.worker_id = $2
                 ON CONFLICT (request_id) DO NOTHING",
            )
            .bind(request_id.clone())
            .bind(worker_id.clone())
            .bind(box_id.clone())
            .bind(tool.clone())
            .bind(rule.clone())
            .bind(reason.clone())
            .bind(input.clone())
            .bind(nanos(*at))
            .bind(nanos(*expires_at))
            .bind(position)
            .execute(&mut **tx)
            .await?;
        }
        WorkerEvent::WorkerToolUseApproved { request_id, by, at, .. } => settle(tx, request_id, "approved", by, "", *at).await?,
        WorkerEvent::WorkerToolUseRejected { request_id, by, reason, at, .. } => settle(tx, request_id, "rejected", by, reason, *at).await?,
        WorkerEvent::WorkerToolUseExpired { request_id, at, .. } => settle(tx, request_id, "expired", "", "", *at).await?,
        WorkerEvent::WorkerClaimed { worker_id, host, .. } => {
            set("UPDATE worker_life SET state = 'starting', host = $2 WHERE worker_id = $1 AND state = 'created'")
                .bind(worker_id.clone())
                .bind(host.clone())
                .execute(&mut **tx)
                .await?;
        }
        WorkerEvent::WorkerRunning { worker_id, .. } | WorkerEvent::WorkerPaused { worker_id, .. } => {
            let state = event.state().map(WorkerState::as_str).unwrap_or_default();
            set("UPDATE worker_life SET state = $2 WHERE worker_id = $1 AND ended_at_ns IS NULL")
                .bind(worker_id.clone())
                .bind(state)
                .execute(&mut **tx)
                .await?;
        }
        WorkerEvent::WorkerFinished { worker_id, state, exit_code, result, at, .. } => {
            set("UPDATE worker_life SET state = $2, result = $3, exit_code = $4, ended_at_ns = $5 WHERE worker_id = $1")
                .bind(worker_id.clone())
                .bind(state.as_str())
                .bind(result.clone())
                .bind(exit_code.map(i64::from))
                .bind(nanos(*at))
                .execute(&mut **tx)
                .await?;
        }
        WorkerEvent::WorkerLost { worker_id, at, .. } => {
            set("UPDATE worker_life SET state = 'lost', ended_at_ns = $2 WHERE worker_id = $1")
                .bind(worker_id.clone())
                .bind(nanos(*at))
                .execute(&mut **tx)
                .await?;
        }
        WorkerEvent::WorkerStopRequested { worker_id, kill, .. } => {
            let stop = if *kill { "kill" } else { "stop" };
            set("UPDATE worker_life SET stop = CASE WHEN stop = 'kill' THEN 'kill' ELSE $2 END WHERE worker_id = $1")
                .bind(worker_id.clone())
                .bind(stop)
                .execute(&mut **tx)
                .await?;
        }
        WorkerEvent::WorkerInputAdded { worker_id, by, input, at } => {
            let seen: i64 =
                sqlx::query("SELECT COUNT(*) FROM worker_transcript WHERE worker_id = $1").bind(worker_id.clone()).fetch_one(&mut **tx).await?.try_get(0)?;
            sqlx::query(
                "INSERT INTO worker_transcript (worker_id, seq, author, at_ns, segments_json) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (worker_id, seq) DO NOTHING",
            )
            .bind(worker_id.clone())
            .bind(seen)
            .bind(by.clone())
            .bind(nanos(*at))
            .bind(serde_json::to_string(input)?)
            .execute(&mut **tx)
            .await?;
            set("UPDATE worker_life SET inputs = $2 WHERE worker_id = $1").bind(worker_id.clone()).bind(seen).execute(&mut **tx).await?;
        }
        WorkerEvent::WorkerLogged { worker_id, lines, at, .. } => {
            let first: i64 = sqlx::query("SELECT log_lines FROM worker_life WHERE worker_id = $1")
                .bind(worker_id.clone())
                .fetch_optional(&mut **tx)
                .await?
                .map(|r| r.try_get(0))
                .transpose()?
                .unwrap_or(0);
            for (i, line) in lines.iter().enumerate() {
                sqlx::query("INSERT INTO worker_log (worker_id, seq, at_ns, line) VALUES ($1, $2, $3, $4) ON CONFLICT (worker_id, seq) DO NOTHING")
                    .bind(worker_id.clone())
                    .bind(first + i64::try_from(i)?)
                    .bind(nanos(*at))
                    .bind(line.clone())
                    .execute(&mut **tx)
                    .await?;
            }
            set("UPDATE worker_life SET log_lines = $2 WHERE worker_id = $1")
                .bind(worker_id.clone())
                .bind(first + i64::try_from(lines.len())?)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

async fn settle(tx: &mut Transaction<'static, Any>, request_id: &str, state: &str, by: &str, reason: &str, at: DateTime<Utc>) -> anyhow::Result<()> {
    sqlx::query("UPDATE tool_requests SET state = $2, decided_by = $3, decision_reason = $4, decided_at_ns = $5 WHERE request_id = $1")
        .bind(request_id)
        .bind(state)
        .bind(by)
        .bind(reason)
        .bind(nanos(at))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

const TOOL_REQUEST_COLUMNS: &str = "request_id, worker_id, box_id, box_type, tool, rule, reason, input_json, state, requested_at_ns, expires_at_ns, decided_by, \
     decided_at_ns, decision_reason, launched_by, position";

fn tool_request_from_sql(row: &AnyRow) -> anyhow::Result<(v1::ToolRequestView, i64)> {
    let input: serde_json::Value = serde_json::from_str(&row.try_get::<String, _>(7)?).unwrap_or(serde_json::Value::Null);
    let time = |i: usize| -> anyhow::Result<Option<prost_types::Timestamp>> {
        Ok(row.try_get::<Option<i64>, _>(i)?.map(|ns| convert::timestamp(DateTime::from_timestamp_nanos(ns))))
    };
    Ok((
        v1::ToolRequestView {
            request_id: row.try_get(0)?,
            worker_id: row.try_get(1)?,
            box_id: row.try_get(2)?,
            box_type: row.try_get(3)?,
            tool: row.try_get(4)?,
            rule: row.try_get(5)?,
            reason: row.try_get(6)?,
            input: Some(atasira_contracts::manifest::value_to_proto(&input)),
            state: row.try_get(8)?,
            requested_at: time(9)?,
            expires_at: time(10)?,
            decided_by: row.try_get(11)?,
            decided_at: time(12)?,
            decision_reason: row.try_get(13)?,
            launched_by: row.try_get(14)?,
        },
        row.try_get(15)?,
    ))
}

/// One tool-use request.
pub async fn tool_request(db: &Db, request_id: &str) -> anyhow::Result<Option<v1::ToolRequestView>> {
    let row = sqlx::query(&format!("SELECT {TOOL_REQUEST_COLUMNS} FROM tool_requests WHERE request_id = $1")).bind(request_id).fetch_optional(db.any()).await?;
    row.as_ref().map(|r| tool_request_from_sql(r).map(|(v, _)| v)).transpose()
}

/// A page of tool-use requests in `state` (`all`: any), newest first, after the cursor
/// `after` (0: from the newest); the next cursor (0 on the last page).
pub async fn tool_requests(db: &Db, state: &str, limit: u32, after: u64) -> anyhow::Result<(Vec<v1::ToolRequestView>, u64)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) };
    let after = if after == 0 { i64::MAX } else { i64::try_from(after).unwrap_or(i64::MAX) };
    let filter = if state == "all" { "state <> $2" } else { "state = $2" };
    let sql = format!("SELECT {TOOL_REQUEST_COLUMNS} FROM tool_requests WHERE position < $1 AND {filter} ORDER BY position DESC LIMIT $3");
    let state = if state == "all" { "" } else { state };
    let rows = sqlx::query(&sql).bind(after).bind(state).bind(i64::from(limit) + 1).fetch_all(db.any()).await?;
    let more = rows.len() > limit as usize;
    let page = rows.iter().take(limit as usize).map(tool_request_from_sql).collect::<anyhow::Result<Vec<_>>>()?;
    let next = if more { page.last().map_or(0, |(_, p)| u64::try_from(*p).unwrap_or(0)) } else { 0 };
    Ok((page.into_iter().map(|(v, _)| v).collect(), next))
}

/// Where a Worker is in its life, as the view holds it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Life {
    pub worker_id: String,
    pub box_id: String,
    pub box_type: String,
    pub state: WorkerState,
    pub host: String,
    /// `""`, `stop` or `kill`.
    pub stop: String,
    pub result: String,
    pub exit_code: Option<i32>,
    pub ended_at: Option<DateTime<Utc>>,
    /// Later inputs (transcript entries after the first).
    pub inputs: u32,
}

const LIFE_COLUMNS: &str = "worker_id, box_id, box_type, state, host, stop, result, exit_code, ended_at_ns, inputs";

impl Life {
    fn from_sql(row: &AnyRow) -> anyhow::Result<Life> {
        let state: String = row.try_get(3)?;
        Ok(Life {
            worker_id: row.try_get(0)?,
            box_id: row.try_get(1)?,
            box_type: row.try_get(2)?,
            state: WorkerState::parse(&state).ok_or_else(|| anyhow::anyhow!("unknown worker state {state:?}"))?,
            host: row.try_get(4)?,
            stop: row.try_get(5)?,
            result: row.try_get(6)?,
            exit_code: row.try_get::<Option<i64>, _>(7)?.map(i32::try_from).transpose()?,
            ended_at: row.try_get::<Option<i64>, _>(8)?.map(DateTime::from_timestamp_nanos),
            inputs: u32::try_from(row.try_get::<i64, _>(9)?)?,
        })
    }

    /// Adds what the Worker's life says to its answer.
    pub fn fill(&self, view: &mut v1::WorkerView) {
        view.state = self.state.as_str().to_owned();
        view.host = self.host.clone();
        view.stop_requested = self.stop.clone();
        view.result = self.result.clone();
        view.exit_code = self.exit_code;
        view.ended_at = self.ended_at.map(convert::timestamp);
    }
}

/// A Worker as its events up to some point leave it (R-HIST): its catalog entry,
/// transcript, life and log lines, by the same rules the view applies them (a state
/// after an end is not taken, a kill is not undone by a later stop).
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    pub row: WorkerRow,
    pub transcript: Vec<TranscriptRow>,
    pub life: Life,
    pub log: Vec<String>,
}

impl Replayed {
    /// From a Worker's events in order, each with its position; `None` before its creation.
    pub fn fold<'a>(events: impl IntoIterator<Item = (&'a WorkerEvent, i64)>) -> Option<Replayed> {
        let mut worker: Option<Replayed> = None;
        for (event, position) in events {
            if let (None, Some((row, entry))) = (&worker, WorkerRow::created(event, position)) {
                let life = Life { worker_id: row.worker_id.clone(), box_id: row.box_id.clone(), box_type: row.box_type.clone(), ..Life::default() };
                worker = Some(Replayed { row, transcript: vec![entry], life, log: Vec::new() });
                continue;
            }
            let Some(w) = worker.as_mut() else { continue };
            let life = &mut w.life;
            match event {
                WorkerEvent::WorkerClaimed { host, .. } if life.state == WorkerState::Created => {
                    life.state = WorkerState::Starting;
                    life.host = host.clone();
                }
                WorkerEvent::WorkerRunning { .. } | WorkerEvent::WorkerPaused { .. } if life.ended_at.is_none() => {
                    life.state = event.state().unwrap_or(life.state);
                }
                WorkerEvent::WorkerFinished { state, exit_code, result, at, .. } => {
                    life.state = *state;
                    life.result = result.clone();
                    life.exit_code = *exit_code;
                    life.ended_at = Some(*at);
                }
                WorkerEvent::WorkerLost { at, .. } => {
                    life.state = WorkerState::Lost;
                    life.ended_at = Some(*at);
                }
                WorkerEvent::WorkerStopRequested { kill, .. } if life.stop != "kill" => life.stop = if *kill { "kill" } else { "stop" }.to_owned(),
                WorkerEvent::WorkerInputAdded { by, input, at, .. } => {
                    let seq = u32::try_from(w.transcript.len()).unwrap_or(u32::MAX);
                    w.transcript.push(TranscriptRow { seq, author: by.clone(), at: *at, segments: input.clone() });
                    life.inputs = seq;
                }
                WorkerEvent::WorkerLogged { lines, .. } => w.log.extend(lines.iter().cloned()),
                _ => {}
            }
        }
        worker
    }
}

/// The Worker as it was `as_of`, replayed from its stream.
pub async fn at(db: &Db, worker_id: &str, as_of: atasira_platform::store::AsOf) -> anyhow::Result<Option<Replayed>> {
    let stored = db.stream_as_of(types::WORKER, worker_id, as_of).await?;
    let events: Vec<(WorkerEvent, i64)> = stored.iter().map(|e| e.decode().map(|d| (d, e.position))).collect::<Result<_, _>>()?;
    Ok(Replayed::fold(events.iter().map(|(e, p)| (e, *p))))
}

/// The life of one Worker (`None` for one created before Workers ran on hosts, or unknown).
pub async fn life(db: &Db, worker_id: &str) -> anyhow::Result<Option<Life>> {
    let row = sqlx::query(&format!("SELECT {LIFE_COLUMNS} FROM worker_life WHERE worker_id = $1")).bind(worker_id).fetch_optional(db.any()).await?;
    row.as_ref().map(Life::from_sql).transpose()
}

/// The lives of the Workers `where_sql` selects (a condition on `worker_life`'s columns,
/// with `$1` bound to `arg`), at most `limit`, oldest first.
pub async fn lives(db: &Db, where_sql: &str, arg: &str, limit: i64) -> anyhow::Result<Vec<Life>> {
    let sql = format!("SELECT {LIFE_COLUMNS} FROM worker_life WHERE {where_sql} ORDER BY worker_id LIMIT {limit}");
    let rows = sqlx::query(&sql).bind(arg).fetch_all(db.any()).await?;
    rows.iter().map(Life::from_sql).collect()
}

/// The lives of the Workers `worker_ids` (a page's: at most [`PAGE_MAX`]), by id.
pub async fn lives_of(db: &Db, worker_ids: &[String]) -> anyhow::Result<std::collections::HashMap<String, Life>> {
    if worker_ids.is_empty() {
        return Ok(Default::default());
    }
    let sql = format!("SELECT {LIFE_COLUMNS} FROM worker_life WHERE worker_id IN ({})", atasira_platform::projection::placeholders(worker_ids.len()));
    let rows = worker_ids.iter().fold(sqlx::query(&sql), |q, id| q.bind(id.clone())).fetch_all(db.any()).await?;
    rows.iter().map(|r| Life::from_sql(r).map(|l| (l.worker_id.clone(), l))).collect()
}

/// Workers waiting for a host, oldest first, at most `limit`.
pub async fn waiting(db: &Db, limit: u32) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query(
        "SELECT l.worker_id FROM worker_life l JOIN worker_rows w ON w.worker_id = l.worker_id WHERE l.state = 'created' ORDER BY w.position LIMIT $1",
    )
    .bind(i64::from(limit))
    .fetch_all(db.any())
    .await?;
    rows.iter().map(|r| r.try_get(0).map_err(anyhow::Error::from)).collect()
}

/// The last `limit` lines the Worker wrote, oldest first.
pub async fn log(db: &Db, worker_id: &str, limit: i64) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query("SELECT line FROM (SELECT seq, line FROM worker_log WHERE worker_id = $1 ORDER BY seq DESC LIMIT $2) t ORDER BY seq")
        .bind(worker_id)
        .bind(limit)
        .fetch_all(db.any())
        .await?;
    rows.iter().map(|r| r.try_get(0).map_err(anyhow::Error::from)).collect()
}

/// The transcript entries of a Worker after `seen` (its later input), each its segments.
pub async fn inputs_after(db: &Db, worker_id: &str, seen: u32) -> anyhow::Result<Vec<Vec<Segment>>> {
    let rows = sqlx::query("SELECT segments_json FROM worker_transcript WHERE worker_id = $1 AND seq > $2 ORDER BY seq")
        .bind(worker_id)
        .bind(i64::from(seen))
        .fetch_all(db.any())
        .await?;
    rows.iter().map(|r| Ok(serde_json::from_str::<Vec<Segment>>(&r.try_get::<String, _>(0)?)?)).collect()
}

#[async_trait::async_trait]
impl Projection for WorkersView {
    fn name(&self) -> &'static str {
        WORKERS
    }
    fn aggregate_types(&self) -> &'static [&'static str] {
        WORKERS_READS
    }
    fn tables(&self) -> &'static [&'static str] {
        &[
            "CREATE TABLE IF NOT EXISTS worker_rows (
                worker_id TEXT PRIMARY KEY,
                launch_id TEXT NOT NULL,
                box_id TEXT NOT NULL,
                box_type TEXT NOT NULL,
                role TEXT NOT NULL,
                labels_json TEXT NOT NULL,
                created_by TEXT NOT NULL,
                created_at_ns BIGINT NOT NULL,
                bundle_digest TEXT NOT NULL,
                position BIGINT NOT NULL
            )",
            "CREATE INDEX IF NOT EXISTS worker_rows_by_box ON worker_rows (box_id, position)",
            "CREATE TABLE IF NOT EXISTS worker_transcript (
                worker_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                author TEXT NOT NULL,
                at_ns BIGINT NOT NULL,
                segments_json TEXT NOT NULL,
                PRIMARY KEY (worker_id, seq)
            )",
            "CREATE TABLE IF NOT EXISTS worker_life (
                worker_id TEXT PRIMARY KEY,
                box_id TEXT NOT NULL,
                box_type TEXT NOT NULL,
                state TEXT NOT NULL,
                host TEXT NOT NULL,
                stop TEXT NOT NULL,
                result TEXT NOT NULL,
                exit_code BIGINT,
                ended_at_ns BIGINT,
                inputs BIGINT NOT NULL,
                log_lines BIGINT NOT NULL
            )",
            "CREATE INDEX IF NOT EXISTS worker_life_by_state ON worker_life (state, host)",
            "CREATE INDEX IF NOT EXISTS worker_life_by_box ON worker_life (box_id, state)",
            "CREATE TABLE IF NOT EXISTS tool_requests (
                request_id TEXT PRIMARY KEY,
                worker_id TEXT NOT NULL,
                box_id TEXT NOT NULL,
                box_type TEXT NOT NULL,
                tool TEXT NOT NULL,
                rule TEXT NOT NULL,
                reason TEXT NOT NULL,
                input_json TEXT NOT NULL,
                state TEXT NOT NULL,
                requested_at_ns BIGINT NOT NULL,
                expires_at_ns BIGINT NOT NULL,
                decided_by TEXT NOT NULL,
                decided_at_ns BIGINT,
                decision_reason TEXT NOT NULL,
                launched_by TEXT NOT NULL,
                position BIGINT NOT NULL DEFAULT 0
            )",
            "CREATE INDEX IF NOT EXISTS tool_requests_by_state ON tool_requests (state, position)",
            "CREATE TABLE IF NOT EXISTS worker_log (
                worker_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                at_ns BIGINT NOT NULL,
                line TEXT NOT NULL,
                PRIMARY KEY (worker_id, seq)
            )",
        ]
    }
    fn table_names(&self) -> &'static [&'static str] {
        &["worker_rows", "worker_transcript", "worker_life", "worker_log", "tool_requests"]
    }

    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()> {
        Self::apply_event(tx, event.as_event()).await
    }

    /// A rebuild's page, decoded from the stored text.
    async fn apply_page(&self, tx: &mut Transaction<'static, Any>, events: &[TextEvent], _: DecodedPage) -> anyhow::Result<()> {
        for event in events {
            Self::apply_event(tx, event.as_event()).await?;
        }
        Ok(())
    }
}

/// One Worker with its transcript.
pub async fn get(db: &Db, worker_id: &str) -> anyhow::Result<Option<(WorkerRow, Vec<TranscriptRow>)>> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM worker_rows WHERE worker_id = $1")).bind(worker_id).fetch_optional(db.any()).await?;
    let Some(row) = row.as_ref().map(WorkerRow::from_sql).transpose()? else { return Ok(None) };
    let entries = sqlx::query("SELECT seq, author, at_ns, segments_json FROM worker_transcript WHERE worker_id = $1 ORDER BY seq")
        .bind(worker_id)
        .fetch_all(db.any())
        .await?;
    let transcript = entries
        .iter()
        .map(|r| {
            Ok(TranscriptRow {
                seq: u32::try_from(r.try_get::<i64, _>(0)?)?,
                author: r.try_get(1)?,
                at: DateTime::from_timestamp_nanos(r.try_get(2)?),
                segments: serde_json::from_str(&r.try_get::<String, _>(3)?)?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some((row, transcript)))
}

/// Largest page of Workers, and the size of a page when none is asked for.
pub const PAGE_MAX: u32 = 200;
pub const PAGE_DEFAULT: u32 = 50;

/// A page of the Box's Workers in creation order after position `after`, and the cursor
/// of the next page (0 on the last).
pub async fn page(db: &Db, box_id: &str, limit: u32, after: u64) -> anyhow::Result<(Vec<WorkerRow>, u64)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) };
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let sql = format!("SELECT {COLUMNS} FROM worker_rows WHERE box_id = $1 AND position > $2 ORDER BY position LIMIT $3");
    let rows = sqlx::query(&sql).bind(box_id).bind(after).bind(i64::from(limit) + 1).fetch_all(db.any()).await?;
    let more = rows.len() > limit as usize;
    let page = rows.iter().take(limit as usize).map(WorkerRow::from_sql).collect::<anyhow::Result<Vec<_>>>()?;
    let next = if more { page.last().map_or(0, |r| u64::try_from(r.position).unwrap_or(0)) } else { 0 };
    Ok((page, next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::worker::worker_id_for;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 123_456_789).expect("time")
    }

    fn created() -> WorkerEvent {
        WorkerEvent::WorkerCreated {
            worker_id: worker_id_for("l1"),
            launch_id: "l1".into(),
            box_id: "b1".into(),
            box_type: "sales".into(),
            role: "reviewer".into(),
            labels: BTreeMap::from([("team".to_owned(), "ops".to_owned())]),
            initial_input: vec![Segment::Text("hi".into()), Segment::ObjectiveRef("O-1".into())],
            fingerprint: "sha256:f".into(),
            bundle_digest: "sha256:b".into(),
            binding_handle: "bnd_secret".into(),
            created_by: "erin".into(),
            approval_key_id: "k1".into(),
            chain: vec![],
            at: t(0),
            policy: None,
        }
    }

    #[test]
    fn r_worker_7_a_creation_is_a_catalog_entry_and_its_initial_transcript_without_binding() {
        let (row, entry) = WorkerRow::created(&created(), 7).expect("row");
        assert_eq!((row.position, row.created_at, entry.seq, entry.author.as_str()), (7, t(0), 0, "erin"));
        let wire = row.to_wire(&[entry]);
        assert_eq!(wire.transcript.len(), 1);
        assert_eq!(
            wire.transcript[0].segments.iter().filter_map(segment_from_wire).collect::<Vec<_>>(),
            vec![Segment::Text("hi".into()), Segment::ObjectiveRef("O-1".into())]
        );
        assert_eq!(convert::time_from_wire(wire.created_at.as_ref()), Some(t(0)));
        // R-WORKER-1: nothing of the binding in the Worker's answer
        assert!(!format!("{wire:?}").contains("bnd_secret"));
        let refused = WorkerEvent::WorkerLaunchRefused {
            worker_id: "w".into(),
            launch_id: "l".into(),
            box_id: "b".into(),
            by: "x".into(),
            code: "forbidden".into(),
            reason: "r".into(),
            at: t(1),
        };
        assert!(WorkerRow::created(&refused, 8).is_none());
    }

    #[test]
    fn r_worker_5_a_segment_without_a_kind_does_not_convert() {
        assert_eq!(segment_from_wire(&v1::Segment { kind: None }), None);
        assert_eq!(segment_from_wire(&segment_to_wire(&Segment::TicketRef("T".into()))), Some(Segment::TicketRef("T".into())));
    }

    #[test]
    fn r_hist_a_worker_replayed_up_to_a_point_is_what_its_events_said_then() {
        let id = worker_id_for("l1");
        let events = [
            created(),
            WorkerEvent::WorkerClaimed { worker_id: id.clone(), box_id: "b1".into(), host: "h1".into(), at: t(1) },
            WorkerEvent::WorkerRunning { worker_id: id.clone(), box_id: "b1".into(), host: "h1".into(), at: t(2) },
            WorkerEvent::WorkerInputAdded { worker_id: id.clone(), by: "erin".into(), input: vec![Segment::Text("more".into())], at: t(3) },
            WorkerEvent::WorkerLogged { worker_id: id.clone(), host: "h1".into(), lines: vec!["a".into(), "b".into()], at: t(4) },
            WorkerEvent::WorkerStopRequested { worker_id: id.clone(), box_id: "b1".into(), by: "erin".into(), kill: true, at: t(5) },
            WorkerEvent::WorkerStopRequested { worker_id: id.clone(), box_id: "b1".into(), by: "erin".into(), kill: false, at: t(6) },
            WorkerEvent::WorkerFinished {
                worker_id: id.clone(),
                box_id: "b1".into(),
                host: "h1".into(),
                state: WorkerState::Killed,
                exit_code: Some(137),
                result: "killed".into(),
                at: t(7),
            },
            // A late report after the end changes nothing.
            WorkerEvent::WorkerRunning { worker_id: id.clone(), box_id: "b1".into(), host: "h1".into(), at: t(8) },
        ];
        let upto = |n: usize| Replayed::fold(events.iter().take(n).zip(1..));
        assert!(upto(0).is_none(), "nothing before the creation");
        let created = upto(1).expect("created");
        assert_eq!((created.life.state, created.transcript.len(), created.log.len()), (WorkerState::Created, 1, 0));
        let running = upto(4).expect("running");
        assert_eq!((running.life.state, running.life.host.as_str(), running.transcript.len(), running.life.inputs), (WorkerState::Running, "h1", 2, 1));
        assert_eq!(running.transcript[1].segments, vec![Segment::Text("more".into())]);
        let ended = upto(events.len()).expect("ended");
        assert_eq!(
            (ended.life.state, ended.life.stop.as_str(), ended.life.exit_code, ended.life.ended_at),
            (WorkerState::Killed, "kill", Some(137), Some(t(7)))
        );
        assert_eq!(ended.log, vec!["a", "b"]);
    }
}
