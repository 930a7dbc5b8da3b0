//! What the consumers of this process did: their progress (so that a read-your-writes
//! wait looks here before asking the database), and those that are stalled or waiting
//! for the database (readiness).

use std::collections::HashMap;

use super::{Cursor, Db, DbKind};

/// What the consumers of this process did.
#[derive(Default)]
pub(super) struct Consumers {
    /// Consumers that cannot go on: name -> the error, and whether it is transient
    /// (waiting for the database) rather than an event it cannot apply.
    stalled: std::sync::Mutex<std::collections::BTreeMap<String, (String, bool)>>,
    /// What they committed, so that a read-your-writes wait looks here when the progress
    /// bell rings instead of asking the database.
    progress: std::sync::Mutex<HashMap<String, Consumed>>,
    /// SQLite: cursors of consumers that had nothing else to write, to be stored a moment
    /// later (see `projection::checkpoint`).
    unstored: std::sync::Mutex<HashMap<String, Cursor>>,
}

/// One consumer's progress as this process saw it commit: its cursor and the ids of the
/// events it processed lately (the last [`Consumed::RECENT`]).
#[derive(Default)]
struct Consumed {
    /// Where the consumer's feed opened in this process (everything after it that the
    /// consumer processed, it processed here).
    opened_at: Option<Cursor>,
    /// PostgreSQL: the highest position stored when the feed last opened here, read after
    /// its checkpoint. An event stored at a higher position was inserted after that, so no
    /// earlier runner of the consumer can have processed it: if it is processed, it is
    /// processed here.
    horizon: Option<i64>,
    cursor: Cursor,
    recent: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl Consumed {
    /// Enough for every write in flight: a wait whose event left this window (or was
    /// processed before the process started) is answered by the database instead.
    const RECENT: usize = 8192;

    fn record<'a>(&mut self, cursor: Cursor, event_ids: impl IntoIterator<Item = &'a str>) {
        if cursor > self.cursor {
            self.cursor = cursor;
        }
        for id in event_ids {
            if self.recent.insert(id.to_owned()) {
                self.order.push_back(id.to_owned());
            }
        }
        while self.order.len() > Self::RECENT {
            if let Some(old) = self.order.pop_front() {
                self.recent.remove(&old);
            }
        }
    }
}

impl Db {
    /// Whether consumer `name` runs in this process (its feed opened here), so what it
    /// commits is known here without asking the database; a replica standing by for it
    /// (`exclusive.rs`) has to ask.
    pub fn runs_here(&self, name: &str) -> bool {
        self.consumers.progress.lock().is_ok_and(|p| p.get(name).is_some_and(|c| c.opened_at.is_some()))
    }

    /// Consumer `name` of this process committed up to `cursor`, processing `event_ids`:
    /// remembers it, then rings the progress bell.
    pub fn progressed_to<'a>(&self, name: &str, cursor: Cursor, event_ids: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut progress) = self.consumers.progress.lock() {
            progress.entry(name.to_owned()).or_default().record(cursor, event_ids);
        }
        crate::metrics::global().reader_moved(name, cursor);
        self.progressed();
    }

    /// Consumer `name` of this process opened its feed at `cursor` (its checkpoint, just
    /// read); PostgreSQL also reads the highest position stored now (see [`Consumed`]).
    pub async fn consumer_opened(&self, name: &str, cursor: Cursor) -> anyhow::Result<()> {
        let horizon = match self.kind() {
            DbKind::Postgres => Some(self.count("SELECT COALESCE(MAX(global_position), 0) FROM events").await?),
            DbKind::Sqlite => None,
        };
        if let Ok(mut progress) = self.consumers.progress.lock() {
            let consumed = progress.entry(name.to_owned()).or_default();
            consumed.opened_at = Some(consumed.opened_at.map_or(cursor, |c| c.min(cursor)));
            // The latest opening counts: another replica may have run it in between.
            consumed.horizon = horizon;
        }
        Ok(())
    }

    /// Whether consumer `name` opened its feed in this process before the event stored at
    /// `position`, so that if it processed that event it did so here and
    /// [`Db::processed_lately`] knows (while the event is among the recent ones). SQLite:
    /// positions are commit order; PostgreSQL: the event was inserted after the feed last
    /// opened here.
    pub fn follows_here(&self, name: &str, position: i64) -> bool {
        let Ok(progress) = self.consumers.progress.lock() else { return false };
        let Some(consumed) = progress.get(name) else { return false };
        match self.kind() {
            DbKind::Sqlite => consumed.opened_at.is_some_and(|at| at.position < position),
            DbKind::Postgres => consumed.horizon.is_some_and(|horizon| horizon < position),
        }
    }

    /// SQLite: consumer `name`'s cursor is to be stored soon; whether no store of it was
    /// pending (the caller then arranges one).
    pub fn cursor_to_store(&self, name: &str, cursor: Cursor) -> bool {
        let Ok(mut unstored) = self.consumers.unstored.lock() else { return false };
        match unstored.get_mut(name) {
            Some(pending) => {
                *pending = (*pending).max(cursor);
                false
            }
            None => {
                unstored.insert(name.to_owned(), cursor);
                true
            }
        }
    }

    /// The cursor of consumer `name` that is to be stored, taken.
    pub fn take_cursor_to_store(&self, name: &str) -> Option<Cursor> {
        self.consumers.unstored.lock().ok()?.remove(name)
    }

    /// Whether consumer `name` of this process processed `event_id` lately (`false` also
    /// when it did so long ago or in another process: ask the database then).
    pub fn processed_lately(&self, name: &str, event_id: &str) -> bool {
        self.consumers.progress.lock().map(|p| p.get(name).is_some_and(|c| c.recent.contains(event_id))).unwrap_or(false)
    }

    /// Where consumer `name` of this process last committed, if it did since the start.
    pub fn progress_of(&self, name: &str) -> Option<Cursor> {
        self.consumers.progress.lock().ok()?.get(name).map(|c| c.cursor)
    }

    /// Reports consumer `name` stuck at an event it cannot handle (readiness, `/readyz`).
    pub fn stalled(&self, name: &str, error: &str) {
        self.report(name, error, false);
    }

    /// Reports consumer `name` waiting for the database to come back (readiness): cleared
    /// as soon as it reads again ([`Db::reconnected`]).
    pub fn waiting(&self, name: &str, error: &str) {
        self.report(name, error, true);
    }

    fn report(&self, name: &str, error: &str, transient: bool) {
        if let Ok(mut stalled) = self.consumers.stalled.lock() {
            stalled.insert(name.to_owned(), (error.to_owned(), transient));
        }
    }

    /// Clears a stall report; whether there was one.
    pub fn recovered(&self, name: &str) -> bool {
        self.consumers.stalled.lock().map(|mut s| s.remove(name).is_some()).unwrap_or(false)
    }

    /// Clears a report of [`Db::waiting`] (not one of an event the consumer cannot apply,
    /// which stays until it gets past the event); whether there was one.
    pub fn reconnected(&self, name: &str) -> bool {
        let Ok(mut stalled) = self.consumers.stalled.lock() else { return false };
        if stalled.get(name).is_some_and(|(_, transient)| *transient) {
            stalled.remove(name);
            return true;
        }
        false
    }

    /// The consumers of this process that are stuck or waiting, with their errors.
    pub fn stalled_consumers(&self) -> Vec<(String, String)> {
        self.consumers.stalled.lock().map(|s| s.iter().map(|(k, (e, _))| (k.clone(), e.clone())).collect()).unwrap_or_default()
    }

    /// How many events each relay and consumer of this process is behind, by name, with
    /// its kind (those whose lag the store could not tell are left out).
    pub async fn lags(&self) -> Vec<(String, &'static str, i64)> {
        let readers = crate::metrics::readers();
        let mut out = Vec::with_capacity(readers.len());
        for (name, kind, types, at) in readers {
            match self.count_after(at, types).await {
                Ok(behind) => out.push((name, kind, behind)),
                Err(e) => tracing::debug!(reader = name, error = %e, "metrics: lag unknown"),
            }
        }
        out
    }

    /// A transaction for a projection's rows and checkpoint. In PostgreSQL its commit does not wait for the disk: a crash can lose only
    /// the consumer's last steps, and it takes them again from the store, since its
    /// checkpoint is in the same transaction. Events are always committed durably.
    pub async fn begin_consumer(&self) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Any>> {
        match self.kind() {
            DbKind::Postgres => self.any.begin_with("BEGIN; SET LOCAL synchronous_commit = off").await,
            DbKind::Sqlite => self.any.begin().await,
        }
    }
}

/// PostgreSQL: a `FROM` item that makes the transaction it runs in commit without waiting
/// for the WAL flush (`synchronous_commit = off` for that transaction only), so that a
/// single statement outside a transaction block, which is its own transaction, can write a
/// consumer's or relay's checkpoint in one round trip (as [`Db::begin_consumer`] does for a
/// transaction). A crash loses at most the last such writes, which are taken again.
pub const ASYNC_COMMIT: &str = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_box_9_what_a_consumer_committed_is_remembered_within_a_window() {
        // given a consumer that processed more events than the window holds
        let mut consumed = Consumed::default();
        let ids: Vec<String> = (0..Consumed::RECENT + 10).map(|i| format!("draft/d{i}/1")).collect();
        for (i, id) in ids.iter().enumerate() {
            consumed.record(Cursor { tx_id: 0, position: i as i64 + 1 }, [id.as_str()]);
        }
        // then the latest are known, the oldest left the window (the store answers for them)
        assert!(consumed.recent.contains(ids.last().expect("ids")));
        assert!(!consumed.recent.contains(&ids[0]));
        assert_eq!(consumed.recent.len(), Consumed::RECENT);
        // and the cursor never goes back
        consumed.record(Cursor { tx_id: 0, position: 3 }, []);
        assert_eq!(consumed.cursor.position, ids.len() as i64);
    }
}
