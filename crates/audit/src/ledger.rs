//! The ledger table and everything that reads or writes it: appending one row per
//! auditable event (R-AUDIT-1), pages (R-AUDIT-3), checkpoints and verification
//! (R-AUDIT-2), and the completeness check `atasira projections rebuild` runs instead of a
//! rebuild (R-ARCH-5).
//!
//! Architecture Invariant: rows are only ever appended, by [`append`]; nothing here
//! updates or deletes them, and the database refuses to (triggers on UPDATE and DELETE, and
//! on TRUNCATE in PostgreSQL). The ledger is never rebuilt: a rebuild would re-MAC rows and
//! so launder any tampering.

use std::collections::HashMap;

use anyhow::Context;
use atasira_domain::aggregates::audit_ledger::{AuditCommand, AuditEvent, AuditLedger, LEDGER_ID};
use atasira_domain::aggregates::types;
use atasira_domain::audit::export::{self, CheckpointProof, CheckpointSignature};
use atasira_domain::audit::{
    AuditKeys, LedgerCheckpoint, LedgerRow, UnsignedRow, Verification, action_of, actor_and_target, canonical_time, checkpoint_mac, detail_of, payload_digest,
    verify_chain,
};
use atasira_platform::projection::{for_connection, for_sqlite, rows_per_statement, values_list_from};
use atasira_platform::store::{Db, DbKind, StoredEvent};
use chrono::{DateTime, Utc};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

/// The writer's durable feed name and its checkpoint in `projection_checkpoints` (the same
/// table the projection runner uses, so read-your-writes waits work unchanged).
pub const NAME: &str = "audit_ledger";

/// Aggregate types whose events may be audited (R-AUDIT-1, R-AUDIT-5). Not
/// `box_type_namespace` (bookkeeping behind Box events that are audited themselves), not
/// `audit_ledger` (the ledger's own checkpoints) and not `approval_keys` (public keys the
/// approval service publishes at start; no principal's action).
pub const AUDITABLE_TYPES: &[&str] = &[
    types::DRAFT,
    types::BOX,
    types::ACCESS,
    types::APPROVAL_SECURITY,
    types::REGISTRY_SECURITY,
    types::DRAFTS_SECURITY,
    types::AUDIT_SECURITY,
    types::PROVISIONER_SECURITY,
    types::PAT,
    types::WORKER,
    types::CONFIG_BUNDLE,
    types::EXECUTION_BINDING,
    types::WEBHOOK,
    types::NOTIFICATION,
    types::ORG_POLICY,
];

/// The ledger table. TEXT and BIGINT only, so the same DDL and SQL run on SQLite and
/// PostgreSQL. `event_id UNIQUE` makes a second row for one event impossible even if two
/// writers raced past the existence check.
pub const LEDGER_SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS audit_ledger_rows (
    seq BIGINT PRIMARY KEY,
    time TEXT NOT NULL,
    action TEXT NOT NULL,
    actor TEXT NOT NULL,
    target TEXT NOT NULL,
    event_id TEXT NOT NULL UNIQUE,
    payload_digest TEXT NOT NULL,
    key_id TEXT NOT NULL,
    mac TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
)"];

/// SQLite: the ledger refuses UPDATE and DELETE (SQLite has no TRUNCATE; `DELETE FROM`
/// without a filter fires the DELETE trigger).
pub const SQLITE_LEDGER_TRIGGERS: &[&str] = &[
    "CREATE TRIGGER IF NOT EXISTS audit_ledger_rows_append_only_update BEFORE UPDATE ON audit_ledger_rows
        BEGIN SELECT RAISE(ABORT, 'audit ledger rows are append-only'); END",
    "CREATE TRIGGER IF NOT EXISTS audit_ledger_rows_append_only_delete BEFORE DELETE ON audit_ledger_rows
        BEGIN SELECT RAISE(ABORT, 'audit ledger rows are append-only'); END",
];

/// PostgreSQL: the ledger refuses UPDATE, DELETE and TRUNCATE. Only the table's owner (or a
/// superuser) can disable or drop these triggers: run the services under a role that does
/// not own the tables (README, "Running with a database role that cannot rewrite history").
pub const POSTGRES_LEDGER_TRIGGERS: &[&str] = &[
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'atasira_ledger_append_only' AND pronamespace = current_schema()::regnamespace) THEN
            CREATE FUNCTION atasira_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS
                $f$ BEGIN RAISE EXCEPTION 'audit ledger rows are append-only'; END $f$;
        END IF;
    END $$",
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'audit_ledger_rows_append_only' AND tgrelid = 'audit_ledger_rows'::regclass) THEN
            CREATE TRIGGER audit_ledger_rows_append_only BEFORE UPDATE OR DELETE ON audit_ledger_rows
                FOR EACH ROW EXECUTE FUNCTION atasira_ledger_append_only();
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'audit_ledger_rows_no_truncate' AND tgrelid = 'audit_ledger_rows'::regclass) THEN
            CREATE TRIGGER audit_ledger_rows_no_truncate BEFORE TRUNCATE ON audit_ledger_rows
                FOR EACH STATEMENT EXECUTE FUNCTION atasira_ledger_append_only();
        END IF;
    END $$",
];

/// Largest page of a query (R-AUDIT-3).
pub const PAGE_MAX: u32 = 500;
/// Page size when the caller names none.
pub const PAGE_DEFAULT: u32 = 50;

const COLUMNS: &str = "seq, time, action, actor, target, event_id, payload_digest, key_id, mac, detail";

/// Creates the ledger table and its append-only triggers (idempotent).
pub async fn prepare(db: &Db) -> anyhow::Result<()> {
    let triggers = match db.kind() {
        DbKind::Sqlite => SQLITE_LEDGER_TRIGGERS,
        DbKind::Postgres => POSTGRES_LEDGER_TRIGGERS,
    };
    let all: Vec<&str> = LEDGER_SCHEMA.iter().chain(triggers).copied().collect();
    db.ensure_tables(&all).await?;
    // Ledgers from before rows had a detail (R-AUDIT-6).
    db.ensure_column("audit_ledger_rows", "detail", "TEXT NOT NULL DEFAULT ''").await
}

/// Appends the row of one event, unless it is not auditable or already has a row, and
/// advances the writer's checkpoint, all in one transaction. Returns whether a row was
/// appended. Redeliveries are harmless: the event id decides.
pub async fn append(db: &Db, keys: &AuditKeys, event: &StoredEvent) -> anyhow::Result<bool> {
    Ok(append_batch(db, keys, std::slice::from_ref(event)).await? == 1)
}

/// The ledger's head (seq, mac) as the writer that keeps it left it: that writer's next
/// batch is sealed after it without reading it first. It is only ever a guess: a row that
/// anyone appended since holds the seq the batch's first row takes (seqs follow each
/// other from 1, and rows are never removed), and a redelivered event already has its
/// row, so the batch's write fails whole on the unique key, and it is written again after
/// a read of the head. Empty at first, and after any failure.
#[derive(Debug, Default)]
pub struct KnownHead(std::sync::Mutex<Option<(i64, String)>>);

impl KnownHead {
    /// The seq of the head it knows, if any.
    pub fn seq(&self) -> Option<i64> {
        self.get().map(|(seq, _)| seq)
    }

    fn get(&self) -> Option<(i64, String)> {
        self.0.lock().ok().and_then(|h| h.clone())
    }

    /// After a write that appended `rows` (sealed after `head`) or nothing.
    fn set(&self, head: Option<(i64, String)>, rows: &[LedgerRow]) {
        if let Ok(mut known) = self.0.lock() {
            *known = rows.last().map(|r| (r.seq, r.mac.clone())).or(head);
        }
    }

    fn forget(&self) {
        if let Ok(mut known) = self.0.lock() {
            *known = None;
        }
    }
}

/// Appends the rows of a batch of events (in their order), skipping the ones that are not
/// auditable or already have a row, and advances the writer's checkpoint, under the
/// writer's turn: the head is read once and the chain sealed in memory. Both databases
/// write a batch in one write after one read ([`append_alone`], [`append_optimistic`]);
/// a batch too large for that, in one transaction. Returns how many rows were appended.
pub async fn append_batch(db: &Db, keys: &AuditKeys, events: &[StoredEvent]) -> anyhow::Result<usize> {
    append_batch_after(db, keys, events, &KnownHead::default()).await
}

/// [`append_batch`] by the writer that keeps `known`: with a known head, the batch is
/// written without reading first (one write instead of a read and a write).
pub async fn append_batch_after(db: &Db, keys: &AuditKeys, events: &[StoredEvent], known: &KnownHead) -> anyhow::Result<usize> {
    let Some(last) = events.last() else { return Ok(0) };
    let turn = db.write_turn().await;
    let one_statement = events.len() <= rows_per_statement(1);
    let alone = match db.kind() {
        DbKind::Sqlite if one_statement => Some(append_alone(db, keys, events, known).await),
        DbKind::Postgres if one_statement => append_optimistic(db, keys, events, known).await.transpose(),
        _ => None,
    };
    // After a failure, lost races (PostgreSQL) or a batch too large for one write, what the
    // head is now is not known here.
    let appended = match alone {
        Some(Ok(appended)) => appended,
        Some(Err(e)) => {
            known.forget();
            return Err(e);
        }
        None => {
            known.forget();
            append_in_transaction(db, keys, events).await?
        }
    };
    drop(turn);
    db.progressed_to(NAME, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
    Ok(appended)
}

/// [`append_batch`] in one transaction (PostgreSQL; SQLite for a large batch), under the
/// writer's turn.
async fn append_in_transaction(db: &Db, keys: &AuditKeys, events: &[StoredEvent]) -> anyhow::Result<usize> {
    // Committed like every consumer's transaction (PostgreSQL: without waiting for the WAL
    // flush), which takes a disk sync off every write's read-your-writes wait. Nothing can
    // be lost for good: a row follows from its event alone (its time is the event's), so
    // rows lost with the last moments before a database crash are appended again, the same,
    // from the writer's checkpoint (lost with them); and a signed checkpoint commits
    // durably, which flushes every row it names.
    let mut tx = db.begin_consumer().await?;
    // The checkpoint is written before the head is read: on PostgreSQL its row lock
    // serializes concurrent writers (the second reads the last row only after the first
    // committed); on SQLite the writer's turn keeps every other writer out. The events are
    // marked as handled for waits by event id (`projection::wait_for_events`).
    let fresh = atasira_platform::projection::mark_and_advance(&mut tx, NAME, events).await?;
    let auditable: Vec<(&StoredEvent, &str)> = auditable(events.iter().filter(|e| fresh.contains(&e.event_id)));
    let appended = append_rows(&mut tx, keys, &auditable).await?;
    tx.commit().await?;
    Ok(appended)
}

/// The events of `events` that have a ledger row, with its action.
fn auditable<'a>(events: impl Iterator<Item = &'a StoredEvent>) -> Vec<(&'a StoredEvent, &'static str)> {
    events.filter_map(|e| action_of(&e.aggregate_type, &e.event_type).map(|action| (e, action))).collect()
}

/// SQLite, under the writer's turn (no other writer: SQLite serves one process): one read
/// (the writer's cursor, the ledger's head, the rows the events have already) and one
/// write (the rows, then the cursor: two statements, each its own transaction; a crash
/// between them leaves the cursor behind, and the batch read again finds its rows and
/// skips them), instead of a transaction of five trips to the connection's thread, all of
/// them holding the only writer every command and read model waits for.
async fn append_alone(db: &Db, keys: &AuditKeys, events: &[StoredEvent], known: &KnownHead) -> anyhow::Result<usize> {
    let Some(last) = events.last() else { return Ok(0) };
    let candidates = auditable(events.iter());
    if let Some((seq, prev_mac)) = known.get().filter(|_| !candidates.is_empty()) {
        let rows = seal(keys, candidates.iter(), seq, prev_mac)?;
        match write_alone(db, &rows, last).await {
            Ok(()) => {
                known.set(None, &rows);
                return Ok(rows.len());
            }
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => tracing::debug!("the ledger's head moved, or an event has its row; reading them"),
            Err(e) => return Err(e.into()),
        }
    }
    let mut sql = String::from(
        "SELECT 'at', position, NULL FROM projection_checkpoints WHERE name = $1
         UNION ALL SELECT 'head', seq, mac FROM (SELECT seq, mac FROM audit_ledger_rows ORDER BY seq DESC LIMIT 1) AS head",
    );
    if !candidates.is_empty() {
        let ids = (0..candidates.len()).map(|i| format!("${}", i + 2)).collect::<Vec<_>>().join(", ");
        sql.push_str(&format!(" UNION ALL SELECT 'have', NULL, event_id FROM audit_ledger_rows WHERE event_id IN ({ids})"));
    }
    let sql = for_sqlite(sql);
    let mut query = sqlx::query(&sql).bind(NAME);
    for (event, _) in &candidates {
        query = query.bind(&event.event_id);
    }
    let (mut at, mut seq, mut prev_mac) = (0, 0, String::new());
    let mut have = std::collections::HashSet::new();
    for row in query.fetch_all(db.any()).await? {
        match row.try_get::<String, _>(0)?.as_str() {
            "at" => at = row.try_get::<i64, _>(1)?,
            "head" => (seq, prev_mac) = (row.try_get::<i64, _>(1)?, row.try_get::<String, _>(2)?),
            _ => {
                have.insert(row.try_get::<String, _>(2)?);
            }
        }
    }
    // Positions are commit order in SQLite: a cursor at or past the batch's last event has
    // seen all of it.
    if at >= last.position {
        return Ok(0);
    }
    let head = (seq > 0).then(|| (seq, prev_mac.clone()));
    let rows = seal(keys, candidates.iter().filter(|(e, _)| !have.contains(&e.event_id)), seq, prev_mac)?;
    write_alone(db, &rows, last).await?;
    known.set(head, &rows);
    Ok(rows.len())
}

/// SQLite: `rows`, then the writer's cursor at `last` (two statements, each its own
/// transaction, see [`append_alone`]).
async fn write_alone(db: &Db, rows: &[LedgerRow], last: &StoredEvent) -> Result<(), sqlx::Error> {
    use atasira_platform::projection::{Arg, advance_statement, bind_all};
    let mut statements = Vec::new();
    let mut args = Vec::with_capacity(rows.len() * 10 + 3);
    for chunk in rows.chunks(rows_per_statement(10)) {
        statements.push(format!("INSERT INTO audit_ledger_rows ({COLUMNS}) VALUES {}", values_list_from(args.len() + 1, chunk.len(), 10)));
        args.extend(chunk.iter().flat_map(row_args));
    }
    statements.push(advance_statement(args.len() + 1));
    args.extend([Arg::Text(NAME.to_owned()), Arg::Int(last.tx_id), Arg::Int(last.position)]);
    bind_all(sqlx::query(&for_sqlite(statements.join(";\n"))), &args).execute(db.any()).await?;
    Ok(())
}

/// How often [`append_optimistic`] reads again after another writer appended first.
const RACES: usize = 4;

/// PostgreSQL: one read (the ledger's head, the rows the events have already), then one
/// statement that appends the sealed rows with the writer's cursor and processed set (its
/// own transaction, committed asynchronously like every consumer's), instead of a
/// transaction of five round trips. Two writers that read the same head (two processes
/// that both believe they hold the writer's lease) cannot fork the chain: the second's
/// rows take `seq`s and event ids the first took, so its statement fails whole and it
/// reads again. `None` when it lost [`RACES`] times in a row: the caller then writes in a
/// transaction, which waits for the others.
async fn append_optimistic(db: &Db, keys: &AuditKeys, events: &[StoredEvent], known: &KnownHead) -> anyhow::Result<Option<usize>> {
    use atasira_platform::projection::{advance_and_mark, bind_all};
    let candidates = auditable(events.iter());
    // The cursor and the processed set are the same on every attempt.
    let (with, marks) = advance_and_mark(NAME, events);
    // The first attempt trusts the head this writer left, if it knows it.
    let mut guess = known.get();
    for _ in 0..RACES + usize::from(guess.is_some()) {
        let (head, have) = match guess.take() {
            // Nothing to seal: the head stays what it was.
            head if candidates.is_empty() => (head, Default::default()),
            Some(head) => (Some(head), Default::default()),
            None => head_and_rows_of(db.any(), &candidates, true).await?,
        };
        let (seq, prev_mac) = head.clone().unwrap_or_default();
        let rows = seal(keys, candidates.iter().filter(|(e, _)| !have.contains(&e.event_id)), seq, prev_mac)?;
        let mut args = marks.clone();
        let write = match rows.len() {
            0 => "SELECT 1".to_owned(),
            n => format!("INSERT INTO audit_ledger_rows ({COLUMNS}) VALUES {}", values_list_from(args.len() + 1, n, 10)),
        };
        args.extend(rows.iter().flat_map(row_args));
        match bind_all(sqlx::query(&format!("{with} {write}")), &args).execute(db.any()).await {
            Ok(_) => {
                known.set(head, &rows);
                return Ok(Some(rows.len()));
            }
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                tracing::debug!("another ledger writer appended first, or an event has its row; reading the head again")
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// The ledger's head (`with_head`; `None` while the ledger is empty) and which of `events`
/// (at most [`rows_per_statement`]`(1)`) have a row already, in one look-up.
async fn head_and_rows_of<'e>(
    executor: impl sqlx::Executor<'e, Database = Any>,
    events: &[(&StoredEvent, &'static str)],
    with_head: bool,
) -> anyhow::Result<(Option<(i64, String)>, std::collections::HashSet<String>)> {
    use atasira_platform::projection::placeholders;
    let head =
        if with_head { "SELECT * FROM (SELECT seq, mac, NULL AS event_id FROM audit_ledger_rows ORDER BY seq DESC LIMIT 1) AS head UNION ALL " } else { "" };
    let sql = format!("{head}SELECT NULL, NULL, event_id FROM audit_ledger_rows WHERE event_id IN ({})", placeholders(events.len()));
    let mut query = sqlx::query(&sql);
    for (event, _) in events {
        query = query.bind(&event.event_id);
    }
    let (mut top, mut have) = (None, std::collections::HashSet::new());
    for row in query.fetch_all(executor).await? {
        match row.try_get::<Option<String>, _>(2)? {
            Some(event_id) => {
                have.insert(event_id);
            }
            None => top = Some((row.try_get::<i64, _>(0)?, row.try_get::<String, _>(1)?)),
        }
    }
    Ok((top, have))
}

/// What a row's insert binds, in [`COLUMNS`] order.
fn row_args(row: &LedgerRow) -> [atasira_platform::projection::Arg; 10] {
    use atasira_platform::projection::Arg;
    [
        Arg::Int(row.seq),
        Arg::Text(canonical_time(row.time)),
        Arg::Text(row.action.clone()),
        Arg::Text(row.actor.clone()),
        Arg::Text(row.target.clone()),
        Arg::Text(row.event_id.clone()),
        Arg::Text(row.payload_digest.clone()),
        Arg::Text(row.key_id.clone()),
        Arg::Text(row.mac.clone()),
        Arg::Text(row.detail.clone()),
    ]
}

/// The rows of `events`, sealed in order after the ledger's head (`seq`, `prev_mac`).
fn seal<'a>(
    keys: &AuditKeys,
    events: impl Iterator<Item = &'a (&'a StoredEvent, &'static str)>,
    mut seq: i64,
    mut prev_mac: String,
) -> anyhow::Result<Vec<LedgerRow>> {
    let mut rows = Vec::new();
    for (event, action) in events {
        let time = DateTime::<Utc>::from_timestamp_millis(event.recorded_at_ms)
            .with_context(|| format!("event {} has an impossible recorded_at_ms {}", event.event_id, event.recorded_at_ms))?;
        let (actor, target) = actor_and_target(&event.event_type, &event.aggregate_id, &event.payload);
        seq += 1;
        let row = UnsignedRow {
            seq,
            time,
            action: (*action).to_owned(),
            actor,
            target,
            event_id: event.event_id.clone(),
            payload_digest: payload_digest(&serde_json::to_vec(&event.payload)?),
            detail: detail_of(&event.aggregate_type, &event.payload),
        }
        .seal(keys, &prev_mac);
        prev_mac = row.mac.clone();
        rows.push(row);
    }
    Ok(rows)
}

/// Seals and inserts the rows of `events` after the ledger's head, skipping events that
/// already have a row.
async fn append_rows(tx: &mut Transaction<'static, Any>, keys: &AuditKeys, events: &[(&StoredEvent, &'static str)]) -> anyhow::Result<usize> {
    use atasira_platform::projection::{Arg, bind_all, values_list};
    if events.is_empty() {
        return Ok(0);
    }
    // The ledger's head comes with the first look-up of rows the events may have already
    // (one round trip per `rows_per_statement(1)` events).
    let mut head = None;
    let mut have = std::collections::HashSet::new();
    for (i, chunk) in events.chunks(rows_per_statement(1)).enumerate() {
        let (top, rows) = head_and_rows_of(&mut **tx, chunk, i == 0).await?;
        head = head.or(top);
        have.extend(rows);
    }
    let (seq, prev_mac) = head.unwrap_or_default();
    let rows = seal(keys, events.iter().filter(|(e, _)| !have.contains(&e.event_id)), seq, prev_mac)?;
    for chunk in rows.chunks(rows_per_statement(10)) {
        let sql = for_connection(tx, format!("INSERT INTO audit_ledger_rows ({COLUMNS}) VALUES {}", values_list(chunk.len(), 10)));
        let args: Vec<Arg> = chunk.iter().flat_map(row_args).collect();
        bind_all(sqlx::query(&sql), &args).execute(&mut **tx).await?;
    }
    Ok(rows.len())
}

/// Catches the ledger up with the store from the writer's checkpoint, without a feed (for
/// tests and one-shot tools). Returns how many rows were appended.
pub async fn apply_pending(db: &Db, keys: &AuditKeys) -> anyhow::Result<usize> {
    prepare(db).await?;
    let mut at = atasira_platform::projection::cursor(db, NAME).await?;
    let mut appended = 0;
    loop {
        let batch = db.read(at, AUDITABLE_TYPES, 256).await?;
        let Some(last) = batch.events.last() else {
            if batch.held_back {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                continue;
            }
            return Ok(appended);
        };
        at = last.cursor();
        appended += append_batch(db, keys, &batch.events).await?;
    }
}

/// The last row's seq and MAC, if any.
pub async fn head(db: &Db) -> anyhow::Result<Option<(i64, String)>> {
    let row = sqlx::query("SELECT seq, mac FROM audit_ledger_rows ORDER BY seq DESC LIMIT 1").fetch_optional(db.any()).await?;
    Ok(match row {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?)),
        None => None,
    })
}

/// Records a signed checkpoint of the ledger's head as an `AuditCheckpoint` event
/// (R-AUDIT-2) when the ledger grew past the last checkpoint, linked to that checkpoint.
/// Returns the checkpointed seq, or `None` when there was nothing new.
pub async fn checkpoint(db: &Db, keys: &AuditKeys) -> anyhow::Result<Option<i64>> {
    let Some((seq, head_mac)) = head(db).await? else { return Ok(None) };
    let last: AuditLedger = db.load(LEDGER_ID).await?;
    if seq <= last.last_seq {
        if seq < last.last_seq {
            // Not for the checkpointer to repair: verification reports it.
            tracing::warn!(seq, checkpointed = last.last_seq, "the audit ledger is shorter than its last checkpoint: rows were removed");
        }
        return Ok(None);
    }
    if last.last_seq > 0 && !carries(db, last.last_seq, &last.last_head_mac).await? {
        // Still checkpointed: the new checkpoint covers the rows appended since, and
        // verification names the broken one.
        tracing::warn!(checkpointed = last.last_seq, "the audit ledger no longer holds the row of its last checkpoint: rows were removed or replaced");
    }
    // Before the first checkpoint the link is (0, ""), as the first one's must be.
    let mac = checkpoint_mac(keys, seq, &head_mac, last.last_seq, &last.last_mac);
    // Signed over the rows since the last signed checkpoint (all of them, the first time).
    let rows_digest = digest_of_rows(db, last.last_signed_seq, seq, CHECKPOINT_PAGE).await?;
    let proof = export::sign_checkpoint(
        keys,
        CheckpointProof {
            checkpoint: LedgerCheckpoint { seq, head_mac, prev_seq: last.last_seq, prev_mac: last.last_mac, key_id: keys.current_key_id().to_owned(), mac },
            signed: CheckpointSignature { covers_after: last.last_signed_seq, rows_digest, ..Default::default() },
        },
    );
    let LedgerCheckpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac } = proof.checkpoint;
    let command = AuditCommand::Checkpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, signed: Some(proof.signed), at: Utc::now() };
    db.cqrs::<AuditLedger>()
        .execute(LEDGER_ID, command, HashMap::new(), atasira_platform::store::Retry::ONCE)
        .await
        .map_err(|e| anyhow::anyhow!("failed to record an audit checkpoint: {e}"))?;
    Ok(Some(seq))
}

/// Whether the ledger holds a row at `seq` with MAC `mac`.
async fn carries(db: &Db, seq: i64, mac: &str) -> anyhow::Result<bool> {
    let row = sqlx::query("SELECT mac FROM audit_ledger_rows WHERE seq = $1").bind(seq).fetch_optional(db.any()).await?;
    Ok(match row {
        Some(r) => r.try_get::<String, _>(0)? == mac,
        None => false,
    })
}

/// Every checkpoint in the store, in the order recorded, with its signature (none for
/// those recorded before checkpoints were signed).
async fn recorded_checkpoints(db: &Db) -> anyhow::Result<Vec<(LedgerCheckpoint, Option<CheckpointSignature>)>> {
    let rows = sqlx::query("SELECT CAST(payload AS TEXT) FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence")
        .bind(<AuditLedger as cqrs_es::Aggregate>::TYPE)
        .bind(LEDGER_ID)
        .fetch_all(db.any())
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let AuditEvent::AuditCheckpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, signed, .. } =
            serde_json::from_str(&row.try_get::<String, _>(0)?).context("unreadable AuditCheckpoint event")?;
        out.push((LedgerCheckpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac }, signed));
    }
    Ok(out)
}

/// Every `AuditCheckpoint` in the store, in the order recorded.
pub async fn checkpoints(db: &Db) -> anyhow::Result<Vec<LedgerCheckpoint>> {
    Ok(recorded_checkpoints(db).await?.into_iter().map(|(checkpoint, _)| checkpoint).collect())
}

/// Every signed checkpoint in the store, in the order recorded, as an export carries it.
pub async fn signed_checkpoints(db: &Db) -> anyhow::Result<Vec<CheckpointProof>> {
    Ok(recorded_checkpoints(db).await?.into_iter().filter_map(|(checkpoint, signed)| signed.map(|signed| CheckpointProof { checkpoint, signed })).collect())
}

/// Rows a checkpoint reads at a time: after a busy minute its signature covers a hundred
/// thousand rows or more, which held at once took the audit process's memory up by as
/// many kilobytes (`atasira bench soak`).
const CHECKPOINT_PAGE: i64 = 1_000;

/// The digest a signed checkpoint covers of the rows with seq in `(after, upto]`
/// ([`export::rows_digest`]), read `page` seqs at a time.
pub(crate) async fn digest_of_rows(db: &Db, after: i64, upto: i64, page: i64) -> anyhow::Result<String> {
    let mut digest = export::RowsDigest::default();
    let mut from = after;
    while from < upto {
        let to = upto.min(from.saturating_add(page.max(1)));
        for row in rows_between(db, from, to).await? {
            digest.push(&export::row_digest(&row));
        }
        from = to;
    }
    Ok(digest.finish())
}

/// The rows with `after < seq <= upto`, in seq order.
pub async fn rows_between(db: &Db, after: i64, upto: i64) -> anyhow::Result<Vec<LedgerRow>> {
    let stored = sqlx::query(&format!("SELECT {COLUMNS} FROM audit_ledger_rows WHERE seq > $1 AND seq <= $2 ORDER BY seq"))
        .bind(after)
        .bind(upto)
        .fetch_all(db.any())
        .await?;
    stored.iter().map(|r| raw_row(r).map(|raw| raw.row)).collect()
}

/// The first and last seq of the rows whose time is in `[since, until)`, if any.
pub async fn seqs_between(db: &Db, since: Option<DateTime<Utc>>, until: Option<DateTime<Utc>>) -> anyhow::Result<Option<(i64, i64)>> {
    let since = since.map(canonical_time).unwrap_or_default();
    let until = until.map(canonical_time).unwrap_or_default();
    let row = sqlx::query("SELECT MIN(seq), MAX(seq) FROM audit_ledger_rows WHERE ($1 = '' OR time >= $1) AND ($2 = '' OR time < $2)")
        .bind(&since)
        .bind(&until)
        .fetch_one(db.any())
        .await?;
    Ok(match (row.try_get::<Option<i64>, _>(0)?, row.try_get::<Option<i64>, _>(1)?) {
        (Some(lo), Some(hi)) => Some((lo, hi)),
        _ => None,
    })
}

/// The latest `AuditCheckpoint` in the store.
pub async fn latest_checkpoint(db: &Db) -> anyhow::Result<Option<LedgerCheckpoint>> {
    Ok(checkpoints(db).await?.pop())
}

/// A stored row whose time may not parse (a tampered row must still be reportable).
struct RawRow {
    row: LedgerRow,
    time_ok: bool,
}

fn raw_row(r: &AnyRow) -> anyhow::Result<RawRow> {
    let time: String = r.try_get(1)?;
    let parsed = DateTime::parse_from_rfc3339(&time).map(|t| t.with_timezone(&Utc));
    Ok(RawRow {
        time_ok: parsed.is_ok(),
        row: LedgerRow {
            seq: r.try_get(0)?,
            time: parsed.unwrap_or(DateTime::UNIX_EPOCH),
            action: r.try_get(2)?,
            actor: r.try_get(3)?,
            target: r.try_get(4)?,
            event_id: r.try_get(5)?,
            payload_digest: r.try_get(6)?,
            key_id: r.try_get(7)?,
            mac: r.try_get(8)?,
            detail: r.try_get(9)?,
        },
    })
}

/// Verifies the stored ledger against every checkpoint (R-AUDIT-2).
pub async fn verify(db: &Db, keys: &AuditKeys) -> anyhow::Result<Verification> {
    prepare(db).await?;
    // The checkpoints are read before the rows: rows only grow, so the rows read afterwards
    // cover them unless some were removed. The other order could see a checkpoint taken
    // after the rows were read and report a removed tail that is not.
    let checkpoints = checkpoints(db).await?;
    let stored = sqlx::query(&format!("SELECT {COLUMNS} FROM audit_ledger_rows ORDER BY seq")).fetch_all(db.any()).await?;
    let mut rows = Vec::with_capacity(stored.len());
    let mut unreadable_time = None;
    for r in &stored {
        let raw = raw_row(r)?;
        if !raw.time_ok && unreadable_time.is_none() {
            // Kept (with a time its MAC cannot match) so that anything before it is named
            // first; if it is the first bad seq, the reason says why.
            unreadable_time = Some(raw.row.seq);
        }
        rows.push(raw.row);
    }
    Ok(match verify_chain(keys, &rows, &checkpoints) {
        Verification::Broken { first_bad_seq, .. } if Some(first_bad_seq) == unreadable_time => {
            Verification::Broken { first_bad_seq, reason: "the row's time is not an RFC 3339 time: modified".into() }
        }
        v => v,
    })
}

/// What a page of the ledger holds: rows matching every filter given (empty: any).
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter<'a> {
    pub action: &'a str,
    pub target: &'a str,
    pub since: Option<DateTime<Utc>>,
    /// The row of this one event.
    pub event_id: &'a str,
}

/// A page of rows in seq order (R-AUDIT-3); empty filters match everything. The cursor is
/// the seq of the last row of the previous page; the next cursor is empty on the last page.
pub async fn page(db: &Db, filter: Filter<'_>, limit: u32, after_seq: i64) -> anyhow::Result<(Vec<LedgerRow>, String)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) };
    // Stored times are fixed-width canonical text, so text order is time order.
    let since = filter.since.map(canonical_time).unwrap_or_default();
    let stored = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM audit_ledger_rows
          WHERE seq > $1 AND ($2 = '' OR action = $2) AND ($3 = '' OR target = $3) AND ($4 = '' OR time >= $4) AND ($6 = '' OR event_id = $6)
          ORDER BY seq LIMIT $5"
    ))
    .bind(after_seq)
    .bind(filter.action)
    .bind(filter.target)
    .bind(&since)
    .bind(i64::from(limit) + 1)
    .bind(filter.event_id)
    .fetch_all(db.any())
    .await?;
    let more = stored.len() > limit as usize;
    let mut rows = Vec::with_capacity(stored.len().min(limit as usize));
    for r in stored.iter().take(limit as usize) {
        let raw = raw_row(r)?;
        anyhow::ensure!(raw.time_ok, "ledger row {} has an unreadable time; run `atasira audit verify`", raw.row.seq);
        rows.push(raw.row);
    }
    let next = match rows.last() {
        Some(last) if more => last.seq.to_string(),
        _ => String::new(),
    };
    Ok((rows, next))
}

/// R-ARCH-5 for the ledger, which is never rebuilt: every auditable event in the store
/// must have exactly one row. Returns `{"ledger_rows": N, "auditable_events": M,
/// "missing": [event ids], "duplicated": [event ids]}`.
pub async fn check_complete(db: &Db) -> anyhow::Result<serde_json::Value> {
    prepare(db).await?;
    let ledger_rows: i64 = sqlx::query("SELECT COUNT(*) FROM audit_ledger_rows").fetch_one(db.any()).await?.try_get(0)?;
    let mut per_event: HashMap<String, i64> = HashMap::new();
    for r in sqlx::query("SELECT event_id, COUNT(*) FROM audit_ledger_rows GROUP BY event_id").fetch_all(db.any()).await? {
        per_event.insert(r.try_get(0)?, r.try_get(1)?);
    }
    let (mut auditable, mut missing, mut duplicated) = (0u64, Vec::new(), Vec::new());
    let mut position = 0;
    loop {
        let batch = db.events_after(position, AUDITABLE_TYPES, 1000).await?;
        let Some(last) = batch.last() else { break };
        position = last.position;
        for event in batch.iter().filter(|e| action_of(&e.aggregate_type, &e.event_type).is_some()) {
            auditable += 1;
            match per_event.get(&event.event_id).copied().unwrap_or(0) {
                0 => missing.push(event.event_id.clone()),
                1 => {}
                _ => duplicated.push(event.event_id.clone()),
            }
        }
    }
    Ok(serde_json::json!({"ledger_rows": ledger_rows, "auditable_events": auditable, "missing": missing, "duplicated": duplicated}))
}
