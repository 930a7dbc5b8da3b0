//! Reading the store: events in commit order after a cursor (the gap-safe read every
//! consumer and relay uses), a stream, a Box's history, counts and heads.

use std::sync::Arc;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Db, DbKind, EventAt, Typed};
use crate::cursor::Cursor;

/// One read of the store: the events after a cursor, and whether committed events were
/// held back because an older transaction is still running (read again shortly).
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<StoredEvent>,
    pub held_back: bool,
}

/// One stored event with its place in the global order.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// `<aggregate_type>/<aggregate_id>/<sequence>`: stable and unique, used for dedup
    /// (JetStream `Nats-Msg-Id`, consumers' processed sets).
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub position: i64,
    /// The appending transaction (PostgreSQL `xid8`; 0 in SQLite): with `position`, the
    /// commit order readers follow (see [`Cursor`]).
    pub tx_id: i64,
    pub event_type: String,
    pub event_version: String,
    /// Shared, not copied, by the consumers a batch reaches: several feeds of a process take
    /// the same event (embedded mode hands them what it appended, `recent.rs`).
    pub payload: Arc<serde_json::Value>,
    pub metadata: Arc<serde_json::Value>,
    pub recorded_at_ms: i64,
}

impl StoredEvent {
    pub fn event_id_of(aggregate_type: &str, aggregate_id: &str, sequence: i64) -> String {
        format!("{aggregate_type}/{aggregate_id}/{sequence}")
    }

    /// The event as a projection applies it.
    pub fn as_event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, position: self.position, payload: Payload::Parsed(&self.payload) }
    }

    /// Right after this event.
    pub fn cursor(&self) -> Cursor {
        Cursor { tx_id: self.tx_id, position: self.position }
    }

    /// The payload as the aggregate's own event type (read in place, not copied).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        T::deserialize(&*self.payload)
    }
}

/// One stored event as a rebuild reads it ([`Db::read_text`]): a [`StoredEvent`] whose
/// payload and metadata are still the stored JSON text, so that a projection decodes the
/// payload straight into its own event type instead of through a `serde_json::Value`.
#[derive(Debug, Clone, PartialEq)]
pub struct TextEvent {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub position: i64,
    pub tx_id: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: String,
    pub metadata: String,
    pub recorded_at_ms: i64,
}

impl TextEvent {
    /// The event as a projection applies it.
    pub fn as_event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, position: self.position, payload: Payload::Text(&self.payload) }
    }

    /// Right after this event.
    pub fn cursor(&self) -> Cursor {
        Cursor { tx_id: self.tx_id, position: self.position }
    }

    /// The [`StoredEvent`], payload and metadata parsed.
    pub fn into_stored(self) -> anyhow::Result<StoredEvent> {
        Ok(StoredEvent {
            event_id: StoredEvent::event_id_of(&self.aggregate_type, &self.aggregate_id, self.sequence),
            payload: Arc::new(serde_json::from_str(&self.payload)?),
            metadata: Arc::new(serde_json::from_str(&self.metadata)?),
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            sequence: self.sequence,
            position: self.position,
            tx_id: self.tx_id,
            event_type: self.event_type,
            event_version: self.event_version,
            recorded_at_ms: self.recorded_at_ms,
        })
    }
}

/// An event as a projection applies it, whichever way it was read ([`StoredEvent`] or
/// [`TextEvent`]): its stream, its place, and its payload, decoded into the projection's
/// own event type.
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub position: i64,
    payload: Payload<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Payload<'a> {
    Parsed(&'a serde_json::Value),
    Text(&'a str),
}

impl EventRef<'_> {
    /// The payload as a `T` (the same value from the text as from the parsed payload).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        match self.payload {
            Payload::Parsed(value) => T::deserialize(value),
            Payload::Text(text) => serde_json::from_str(text),
        }
    }
}

/// One read of the store as text ([`Db::read_text`]); see [`Batch`].
#[derive(Debug, Default)]
pub struct TextBatch {
    pub events: Vec<TextEvent>,
    pub held_back: bool,
}

impl Db {
    fn position_expr(&self) -> &'static str {
        match self.kind() {
            DbKind::Sqlite => "rowid",
            DbKind::Postgres => "global_position",
        }
    }

    /// The id and position of an aggregate's latest event.
    pub async fn last_event(&self, aggregate_type: &str, aggregate_id: &str) -> anyhow::Result<Option<EventAt>> {
        self.end_event(aggregate_type, aggregate_id, "DESC").await
    }

    /// The id and position of an aggregate's first event.
    pub async fn first_event(&self, aggregate_type: &str, aggregate_id: &str) -> anyhow::Result<Option<EventAt>> {
        self.end_event(aggregate_type, aggregate_id, "ASC").await
    }

    /// The id and position of an aggregate's event at one end of its stream (`order`: `ASC`
    /// for the first, `DESC` for the latest).
    async fn end_event(&self, aggregate_type: &str, aggregate_id: &str, order: &str) -> anyhow::Result<Option<EventAt>> {
        let sql =
            format!("SELECT sequence, {} FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence {order} LIMIT 1", self.position_expr());
        let row = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).fetch_optional(&self.any).await?;
        Ok(match row {
            Some(r) => Some(EventAt { id: StoredEvent::event_id_of(aggregate_type, aggregate_id, r.try_get(0)?), position: r.try_get(1)? }),
            None => None,
        })
    }

    /// Events after `position` in global order, of the given aggregate types (all when
    /// empty), at most `limit`.
    ///
    /// PostgreSQL: only events of transactions older than every transaction still in flight
    /// (`tx_id < pg_snapshot_xmin(pg_current_snapshot())`) are returned, so an event whose
    /// transaction commits after a later position was read is never skipped. SQLite has a
    /// single writer, so positions appear in commit order.
    pub async fn events_after(&self, position: i64, aggregate_types: &[&str], limit: i64) -> anyhow::Result<Vec<StoredEvent>> {
        let pos = self.position_expr();
        let visible = match self.kind() {
            DbKind::Sqlite => "",
            DbKind::Postgres => " AND tx_id < pg_snapshot_xmin(pg_current_snapshot())",
        };
        let types = types_clause(aggregate_types);
        let (tx_id, after) = match self.kind() {
            DbKind::Sqlite => ("0", sqlite_after(&types)),
            DbKind::Postgres => ("CAST(CAST(tx_id AS TEXT) AS BIGINT)", format!("{pos} > $1{visible}{types}")),
        };
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, sequence, {pos}, event_type, event_version, CAST(payload AS TEXT), CAST(metadata AS TEXT), recorded_at_ms, {tx_id}
               FROM events WHERE {after} ORDER BY {pos} LIMIT $2"
        );
        let rows = sqlx::query(&sql).bind(position).bind(limit).fetch_all(&self.any).await?;
        rows.iter().map(row_to_event).collect()
    }

    /// Events after `after` in commit order (see [`Cursor`]), of the given aggregate types
    /// (all when empty), at most `limit`: the gap-safe read every consumer and the relay
    /// use. PostgreSQL returns only events of transactions older than every transaction
    /// still in flight, so nothing can later appear behind the cursor; `held_back` says
    /// that committed events wait for such an older transaction (read again soon). So a
    /// batch shorter than `limit` and not held back holds everything committed so far: a
    /// reader may wait for the appended bell (marked seen before the read) instead of
    /// reading again.
    ///
    /// Both reads find their events in an index from the cursor (PostgreSQL:
    /// `events_type_commit_order` per type, see `pg_after`, or `events_commit_order` for
    /// every type, from the row `(tx_id, global_position)`, ordered by the columns, not by
    /// the selected `tx_id` cast, which shares their name; SQLite:
    /// `events_type_order`, see `sqlite_after`), so a read costs what it returns, not the
    /// size of the store.
    pub async fn read(&self, after: Cursor, aggregate_types: &[&str], limit: i64) -> anyhow::Result<Batch> {
        let types = types_clause(aggregate_types);
        // The process's feeds and relays read on a connection kept between reads (`kept`):
        // one going back to the pool is tested with a round trip of its own, which every
        // read (one per commit, at low load) would pay for. A read cut short (its caller
        // stopped) or failed gives it to the pool instead, which brings it back to a known
        // state.
        let mut conn = self.reads.take(&self.any).await?;
        let read = match self.kind() {
            DbKind::Sqlite => {
                let sql = format!(
                    "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, payload, metadata, recorded_at_ms, 0
                       FROM events WHERE {} ORDER BY rowid",
                    sqlite_after(&types)
                );
                sqlx::query(&sql).bind(after.position).bind(limit).fetch_all(&mut *conn).await
            }
            DbKind::Postgres => sqlx::query(&pg_read_statement(aggregate_types)).bind(after.tx_id).bind(after.position).bind(limit).fetch_all(&mut *conn).await,
        };
        let rows = read?;
        conn.keep();
        match self.kind() {
            DbKind::Sqlite => {
                let events = rows.iter().map(row_to_event).collect::<anyhow::Result<Vec<_>>>()?;
                Ok(Batch { events, held_back: false })
            }
            DbKind::Postgres => {
                let held_back = match rows.first() {
                    Some(row) => row.try_get::<bool, _>(10)?,
                    None => false,
                };
                let mut events = Vec::with_capacity(rows.len());
                for row in &rows {
                    if row.try_get::<Option<String>, _>(0)?.is_some() {
                        events.push(row_to_event(row)?);
                    }
                }
                Ok(Batch { events, held_back })
            }
        }
    }

    /// SQLite: the events after position `covered` of `aggregate_types` (all when empty),
    /// at most `limit`, from what this process appended lately, when that provably holds
    /// every event after `covered` (see `recent.rs`); with the position up to which every
    /// event was looked at. `None`: read the store.
    pub fn read_recent(&self, covered: i64, aggregate_types: &[&str], limit: i64) -> Option<(Vec<StoredEvent>, i64)> {
        let taken = self.writer.recent.after(covered, aggregate_types, usize::try_from(limit).unwrap_or(usize::MAX))?;
        Some((taken.events, taken.covered))
    }

    /// SQLite: the greatest position this process appended and recorded for its feeds. A read
    /// that starts after this is asked, and returns fewer events than it may, has looked at
    /// every event up to it.
    pub fn recent_last(&self) -> Option<i64> {
        self.writer.recent.last()
    }

    /// [`Db::read`] for a rebuild, which reads the whole store: the same events, read
    /// through the typed pool, payloads left as text ([`TextEvent`]); those of the
    /// `skipped` event types come without payload and metadata (empty text), for their
    /// positions only.
    pub async fn read_text(&self, after: Cursor, aggregate_types: &[&str], skipped: &[&str], limit: i64) -> anyhow::Result<TextBatch> {
        let sql = self.read_sql(aggregate_types, skipped);
        let events = match &self.typed {
            Typed::Sqlite(pool) => {
                let rows = sqlx::query(&sql).bind(after.position).bind(limit).fetch_all(pool).await?;
                rows.iter().map(text_event).collect::<anyhow::Result<Vec<_>>>()?
            }
            Typed::Postgres(pool) => {
                let rows = sqlx::query(&sql).bind(after.tx_id).bind(after.position).bind(limit).fetch_all(pool).await?;
                rows.iter().map(text_event).collect::<anyhow::Result<Vec<_>>>()?
            }
        };
        let held_back = events.is_empty() && self.held_back(aggregate_types).await?;
        Ok(TextBatch { events, held_back })
    }

    /// The statement of [`Db::read_text`]: binds the cursor (SQLite its position,
    /// PostgreSQL `tx_id` then position) and the limit. SQLite walks the table in position
    /// order, one pass over the store for the whole rebuild, rather than [`Db::read`]'s
    /// index of the types, whose entries past the cursor each page would sort again (the
    /// unary `+` keeps the planner off that index).
    fn read_sql(&self, aggregate_types: &[&str], skipped: &[&str]) -> String {
        match self.kind() {
            DbKind::Sqlite => format!(
                "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, {}, {}, recorded_at_ms, 0
                   FROM events WHERE rowid > $1{} ORDER BY rowid LIMIT $2",
                unless_skipped("payload", skipped),
                unless_skipped("metadata", skipped),
                types_clause_on("+aggregate_type", aggregate_types)
            ),
            DbKind::Postgres => {
                let columns = pg_event_columns(&unless_skipped(PG_PAYLOAD, skipped), &unless_skipped(PG_METADATA, skipped));
                pg_after(&columns, aggregate_types)
            }
        }
    }

    /// PostgreSQL: whether committed events of these types wait for an older transaction
    /// still in flight (see [`Db::read`]); SQLite: never.
    async fn held_back(&self, aggregate_types: &[&str]) -> anyhow::Result<bool> {
        if self.kind() != DbKind::Postgres {
            return Ok(false);
        }
        let sql = format!("SELECT {}", pg_held(aggregate_types));
        Ok(sqlx::query(&sql).fetch_one(&self.any).await?.try_get::<bool, _>(0)?)
    }

    /// One aggregate's history: the events of stream `(aggregate_type, aggregate_id)` and of
    /// every stream of `child_type` whose id starts with `<aggregate_id>/` (its satellites,
    /// such as a Box's `access` streams), in commit order after `after` (see [`Cursor`]),
    /// at most `limit`. Like [`Db::read`], PostgreSQL returns only events of transactions
    /// older than every transaction still in flight, so a page never passes an event that
    /// commits later. The streams are found by the primary key, then sorted: a history costs
    /// what it holds, not the size of the store.
    pub async fn history(&self, aggregate_type: &str, aggregate_id: &str, child_type: &str, after: Cursor, limit: i64) -> anyhow::Result<Vec<StoredEvent>> {
        let prefix = format!("{aggregate_id}/");
        // A literal: the length of our own text, not input.
        let chars = prefix.chars().count();
        let streams = format!("((aggregate_type = $1 AND aggregate_id = $2) OR (aggregate_type = $3 AND substr(aggregate_id, 1, {chars}) = $4))");
        let sql = match self.kind() {
            DbKind::Sqlite => format!(
                "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, payload, metadata, recorded_at_ms, 0
                   FROM events WHERE {streams} AND rowid > $6 AND $5 >= 0 ORDER BY rowid LIMIT $7"
            ),
            DbKind::Postgres => format!(
                "SELECT aggregate_type, aggregate_id, sequence, global_position, event_type, event_version, CAST(payload AS TEXT),
                        CAST(metadata AS TEXT), recorded_at_ms, CAST(CAST(tx_id AS TEXT) AS BIGINT)
                   FROM events
                  WHERE {streams}
                    AND (tx_id, global_position) > (CAST(CAST(CAST($5 AS BIGINT) AS TEXT) AS xid8), CAST($6 AS BIGINT))
                    AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
                  ORDER BY events.tx_id, events.global_position LIMIT $7"
            ),
        };
        let rows = sqlx::query(&sql)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(child_type)
            .bind(prefix)
            .bind(after.tx_id)
            .bind(after.position)
            .bind(limit)
            .fetch_all(&self.any)
            .await?;
        rows.iter().map(row_to_event).collect()
    }

    /// One stream's events as of `as_of` (R-HIST), in order.
    pub async fn stream_as_of(&self, aggregate_type: &str, aggregate_id: &str, as_of: AsOf) -> anyhow::Result<Vec<StoredEvent>> {
        Ok(self.stream(aggregate_type, aggregate_id).await?.into_iter().filter(|e| as_of.holds(e)).collect())
    }

    /// `SELECT` of every column [`row_to_event`] reads, from `events` of one stream; the
    /// caller adds its conditions after `aggregate_type = $1 AND aggregate_id = $2`.
    fn select_stream(&self) -> String {
        let (pos, tx_id) = match self.kind() {
            DbKind::Sqlite => ("rowid", "0"),
            DbKind::Postgres => ("global_position", "CAST(CAST(tx_id AS TEXT) AS BIGINT)"),
        };
        format!(
            "SELECT aggregate_type, aggregate_id, sequence, {pos}, event_type, event_version, CAST(payload AS TEXT), CAST(metadata AS TEXT), recorded_at_ms, {tx_id}
               FROM events WHERE aggregate_type = $1 AND aggregate_id = $2"
        )
    }

    /// One stored event by its stream and sequence.
    pub async fn event(&self, aggregate_type: &str, aggregate_id: &str, sequence: i64) -> anyhow::Result<Option<StoredEvent>> {
        let sql = format!("{} AND sequence = $3", self.select_stream());
        let row = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).bind(sequence).fetch_optional(&self.any).await?;
        row.as_ref().map(row_to_event).transpose()
    }

    /// Every committed event of one stream, in sequence order. Read directly (not through
    /// the commit-order feed), so an event committed a moment ago is seen whatever else is in
    /// flight.
    pub async fn stream(&self, aggregate_type: &str, aggregate_id: &str) -> anyhow::Result<Vec<StoredEvent>> {
        let sql = format!("{} ORDER BY sequence", self.select_stream());
        let rows = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).fetch_all(&self.any).await?;
        rows.iter().map(row_to_event).collect()
    }

    /// How many committed events of `aggregate_types` (all when empty) lie after `after`: how
    /// far a reader at `after` is behind (the metrics' lag).
    pub async fn count_after(&self, after: Cursor, aggregate_types: &[&str]) -> anyhow::Result<i64> {
        let types = types_clause(aggregate_types);
        let row = match self.kind() {
            DbKind::Sqlite => sqlx::query(&format!("SELECT COUNT(*) FROM events WHERE rowid > $1{types}")).bind(after.position).fetch_one(&self.any).await?,
            DbKind::Postgres => {
                let sql = format!(
                    "SELECT COUNT(*) FROM events WHERE (tx_id, global_position) > (CAST(CAST(CAST($1 AS BIGINT) AS TEXT) AS xid8), CAST($2 AS BIGINT)){types}"
                );
                sqlx::query(&sql).bind(after.tx_id).bind(after.position).fetch_one(&self.any).await?
            }
        };
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Where a reader that wants only what comes next starts: right after the last event
    /// in commit order that [`Db::read`] would return now ([`Cursor::START`] when empty).
    pub async fn head_cursor(&self) -> anyhow::Result<Cursor> {
        let sql = match self.kind() {
            DbKind::Sqlite => "SELECT 0, COALESCE(MAX(rowid), 0) FROM events",
            DbKind::Postgres => {
                "SELECT CAST(CAST(tx_id AS TEXT) AS BIGINT), global_position FROM events
                  WHERE tx_id < pg_snapshot_xmin(pg_current_snapshot())
                  ORDER BY tx_id DESC, global_position DESC LIMIT 1"
            }
        };
        Ok(match sqlx::query(sql).fetch_optional(&self.any).await? {
            Some(row) => Cursor { tx_id: row.try_get::<i64, _>(0)?, position: row.try_get::<i64, _>(1)? },
            None => Cursor::START,
        })
    }

    /// The highest committed position (0 when empty).
    pub async fn head_position(&self) -> anyhow::Result<i64> {
        let sql = format!("SELECT COALESCE(MAX({}), 0) FROM events", self.position_expr());
        Ok(sqlx::query(&sql).fetch_one(&self.any).await?.try_get::<i64, _>(0)?)
    }
}

/// SQLite: the rowids of at most `$2` events after rowid `$1` of the types in `types`,
/// found in `events_type_order` (one entry per event, type then rowid), so a read costs
/// what it returns whether its types are frequent or rare; only those rows are fetched.
/// (Without it SQLite answers a type filter from the primary key index and sorts every
/// stored event of those types, whole, on each read.)
fn sqlite_after(types: &str) -> String {
    format!("rowid IN (SELECT rowid FROM events WHERE rowid > $1{types} ORDER BY rowid LIMIT $2)")
}

/// The columns of a stored event as [`row_to_event`] and [`text_event`] read them, from
/// PostgreSQL (`tx_id` as a number), payload and metadata given as text expressions
/// ([`PG_PAYLOAD`], [`PG_METADATA`], or those blanked for skipped types).
fn pg_event_columns(payload: &str, metadata: &str) -> String {
    format!(
        "aggregate_type, aggregate_id, sequence, global_position, event_type, event_version, {payload} AS payload,
     {metadata} AS metadata, recorded_at_ms, CAST(CAST(tx_id AS TEXT) AS BIGINT) AS tx_id"
    )
}

/// A stored event's payload and metadata as text, on PostgreSQL.
const PG_PAYLOAD: &str = "CAST(payload AS TEXT)";
const PG_METADATA: &str = "CAST(metadata AS TEXT)";

/// ` AND aggregate_type = '<type>'` for each of `aggregate_types`, once each (none when
/// empty): the branches of a per-type read.
fn each_type(aggregate_types: &[&str]) -> Vec<String> {
    let types: std::collections::BTreeSet<&str> = aggregate_types.iter().copied().collect();
    types.iter().map(|t| format!(" AND aggregate_type = '{}'", t.replace('\'', "''"))).collect()
}

/// The statement [`Db::read`] runs on PostgreSQL (binds: the cursor's `tx_id`, its
/// position, the limit), public so that tests can look at its plan. One round trip: the
/// events, and on every row (on the one row of NULLs when there are none) whether
/// committed events of these types are held back by an older transaction still in flight
/// (the same snapshot).
pub fn pg_read_statement(aggregate_types: &[&str]) -> String {
    let events = pg_after(&pg_event_columns(PG_PAYLOAD, PG_METADATA), aggregate_types);
    let held = pg_held(aggregate_types);
    format!(
        "SELECT e.aggregate_type, e.aggregate_id, e.sequence, e.global_position, e.event_type, e.event_version, e.payload, e.metadata,
                e.recorded_at_ms, e.tx_id, h.held
           FROM (SELECT {held} AS held) h
           LEFT JOIN LATERAL ({events}) e ON true
          ORDER BY e.tx_id, e.global_position"
    )
}

/// PostgreSQL: whether committed events of `aggregate_types` (any when empty) wait for an
/// older transaction still in flight (see [`Db::read`]); each type looked up apart in
/// `events_type_commit_order`, as in [`pg_after`] (a list of types let the planner scan the
/// whole table).
fn pg_held(aggregate_types: &[&str]) -> String {
    let exists = |only: &str| format!("EXISTS (SELECT 1 FROM events WHERE tx_id >= pg_snapshot_xmin(pg_current_snapshot()){only})");
    let each = each_type(aggregate_types);
    if each.is_empty() {
        return exists("");
    }
    format!("({})", each.iter().map(|only| exists(only)).collect::<Vec<_>>().join(" OR "))
}

/// PostgreSQL: `columns` (which name `global_position` and a `tx_id`) of the events after
/// the cursor (`$1` its `tx_id`, `$2` its position) of `aggregate_types` (all when empty),
/// in commit order, at most `$3`; only events of transactions older than every transaction
/// still in flight (see [`Db::read`]).
///
/// Each type is read apart, from `events_type_commit_order`, which holds its events in
/// commit order: the read then costs what it returns, whatever the planner's statistics
/// say. (A single statement filtering by type let the planner answer from the primary key
/// when its statistics were stale, as in a young store: every stored event of the types,
/// on every read, a few milliseconds at 5,000 events.)
fn pg_after(columns: &str, aggregate_types: &[&str]) -> String {
    let branch = |only: &str| {
        format!(
            "SELECT {columns} FROM events
              WHERE (tx_id, global_position) > (CAST(CAST(CAST($1 AS BIGINT) AS TEXT) AS xid8), CAST($2 AS BIGINT))
                AND tx_id < pg_snapshot_xmin(pg_current_snapshot()){only}
              ORDER BY events.tx_id, events.global_position LIMIT $3"
        )
    };
    let each = each_type(aggregate_types);
    if each.is_empty() {
        return branch("");
    }
    let branches: Vec<String> = each.iter().map(|only| format!("({})", branch(only))).collect();
    format!("SELECT * FROM ({}) AS by_type ORDER BY by_type.tx_id, by_type.global_position LIMIT $3", branches.join(" UNION ALL "))
}

/// ` AND aggregate_type IN (...)` (nothing when empty).
fn types_clause(aggregate_types: &[&str]) -> String {
    types_clause_on("aggregate_type", aggregate_types)
}

/// [`types_clause`] on the expression `column` (such as `+aggregate_type`).
fn types_clause_on(column: &str, aggregate_types: &[&str]) -> String {
    if aggregate_types.is_empty() {
        return String::new();
    }
    format!(" AND {}", in_list(column, aggregate_types))
}

/// `column`, or empty text for events of the `skipped` types (`column` itself when there
/// are none).
fn unless_skipped(column: &str, skipped: &[&str]) -> String {
    if skipped.is_empty() {
        return column.to_owned();
    }
    format!("CASE WHEN {} THEN '' ELSE {column} END", in_list("event_type", skipped))
}

/// `column IN ('a', 'b')`. The values are the aggregates' own type names, quoted anyway.
fn in_list(column: &str, values: &[&str]) -> String {
    let list: Vec<String> = values.iter().map(|t| format!("'{}'", t.replace('\'', "''"))).collect();
    format!("{column} IN ({})", list.join(", "))
}

/// A row of the store's event statements (the columns of [`Db::read_sql`]).
fn text_event<R: Row>(row: &R) -> anyhow::Result<TextEvent>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(TextEvent {
        aggregate_type: row.try_get(0)?,
        aggregate_id: row.try_get(1)?,
        sequence: row.try_get(2)?,
        position: row.try_get(3)?,
        event_type: row.try_get(4)?,
        event_version: row.try_get(5)?,
        payload: row.try_get(6)?,
        metadata: row.try_get(7)?,
        recorded_at_ms: row.try_get(8)?,
        tx_id: row.try_get(9)?,
    })
}

/// A row of the store's event statements, through the Any pool.
fn row_to_event(row: &AnyRow) -> anyhow::Result<StoredEvent> {
    text_event(row)?.into_stored()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;
    use atasira_domain::aggregates::types;
    use std::collections::HashMap;
    use std::time::Duration;

    #[tokio::test]
    async fn r_arch_6_reads_cut_short_leave_the_next_read_whole() {
        use atasira_domain::aggregates::draft::Draft;
        // given a store with a few drafts
        let store = testing::TempDb::new().await;
        let db = &store.db;
        for i in 0..5 {
            let id = format!("r{i}");
            db.cqrs::<Draft>().execute_new(&id, testing::submit(&id), HashMap::new()).await.expect("submit");
        }
        let whole = db.read(Cursor::START, &[types::DRAFT], 10).await.expect("read").events;
        assert_eq!(whole.len(), 5);
        // when reads are cut short at every point they can be
        for micros in [0, 1, 5, 20, 50, 100, 200, 500, 1000] {
            let _ = tokio::time::timeout(Duration::from_micros(micros), db.read(Cursor::START, &[types::DRAFT], 10)).await;
        }
        // then the next read answers as a whole one did, on the connection the reads keep
        assert_eq!(db.read(Cursor::START, &[types::DRAFT], 10).await.expect("read").events, whole);
        assert_eq!(db.read(whole[2].cursor(), &[types::DRAFT], 10).await.expect("read").events, whole[3..].to_vec());
    }
}

/// A point in the store's past (R-HIST): the events up to a store position, or those
/// recorded at or before a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsOf {
    Position(i64),
    Time(chrono::DateTime<chrono::Utc>),
}

impl AsOf {
    /// Whether `event` had happened then.
    pub fn holds(self, event: &StoredEvent) -> bool {
        match self {
            AsOf::Position(p) => event.position <= p,
            AsOf::Time(t) => event.recorded_at_ms <= t.timestamp_millis(),
        }
    }

    /// From a request's `at` (a position, 0 for none) and `at_time`: `None` for now; a
    /// refusal (`invalid_query`) for a time out of range.
    pub fn from_request(at: i64, at_time: Option<&prost_types::Timestamp>) -> Result<Option<AsOf>, crate::refusal::Refusal> {
        let time = match at_time {
            None => None,
            Some(t) => Some(
                atasira_contracts::convert::time_from_wire(Some(t))
                    .ok_or_else(|| crate::refusal::Refusal::new(atasira_domain::ErrorCode::InvalidQuery, "at is out of range"))?,
            ),
        };
        Ok(match (at, time) {
            (p, _) if p > 0 => Some(AsOf::Position(p)),
            (_, Some(t)) => Some(AsOf::Time(t)),
            _ => None,
        })
    }
}
