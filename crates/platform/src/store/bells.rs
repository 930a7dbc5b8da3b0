//! What a process learns without asking the database: events were appended (rung after a
//! local commit, and in PostgreSQL after every commit anywhere, by `LISTEN`), a consumer of
//! this process made progress, a reader of this process waits for a consumer that is behind.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::{Connection as _, PgConnection, PgPool};
use tokio::sync::{mpsc, watch};

use super::Db;

/// The bells of one process.
pub(super) struct Bells {
    pub(super) appended: watch::Sender<Appended>,
    /// PostgreSQL: the pool to `LISTEN` from, until the first reader of the appended bell
    /// starts the listener (a process nobody in which reads the bell, such as a gateway
    /// without live streams, is not woken by every commit of the cluster).
    listen_from: std::sync::Mutex<Option<PgPool>>,
    /// PostgreSQL: tells the other processes of this process's commits, after them
    /// ([`ring_the_doorbell`]).
    doorbell: Option<mpsc::UnboundedSender<&'static str>>,
    /// The database backend the doorbell notifies from (0 before it connects): what it
    /// notifies was rung in this process already.
    doorbell_backend: Arc<AtomicU32>,
    progressed: watch::Sender<u64>,
    /// Rung, with the time, when a read-your-writes wait here finds a consumer behind:
    /// consumers that let events gather while nobody waits (a read model's feed lingers)
    /// apply them now.
    wanted: watch::Sender<Option<std::time::Instant>>,
}

impl Default for Bells {
    fn default() -> Bells {
        Bells {
            appended: watch::channel(Appended::default()).0,
            listen_from: std::sync::Mutex::new(None),
            doorbell: None,
            doorbell_backend: Arc::default(),
            progressed: watch::channel(0).0,
            wanted: watch::channel(None).0,
        }
    }
}

impl Bells {
    /// PostgreSQL's bells: the appended bell listens for the database's notifications from
    /// `pool` once someone reads it, and the doorbell tells the other processes of this
    /// one's commits.
    pub(super) fn postgres(pool: PgPool) -> Bells {
        let (doorbell, commits) = mpsc::unbounded_channel();
        let doorbell_backend = Arc::<AtomicU32>::default();
        tokio::spawn(ring_the_doorbell(pool.clone(), commits, doorbell_backend.clone()));
        Bells { listen_from: std::sync::Mutex::new(Some(pool)), doorbell: Some(doorbell), doorbell_backend, ..Bells::default() }
    }

    /// Rings the appended bell after a commit of this process that appended
    /// `aggregate_type`, and (PostgreSQL) the doorbell.
    pub(super) fn committed(&self, aggregate_type: &'static str) {
        self.appended.send_modify(|a| a.ring(aggregate_type));
        if let Some(doorbell) = &self.doorbell {
            // Fails only once the doorbell has stopped with the runtime.
            let _ = doorbell.send(aggregate_type);
        }
    }
}

/// The appends a process was told of, counted per aggregate type (slots in the order of
/// `types::ALL`, plus one for types it does not know), so that a reader wakes only when a
/// type it reads was appended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended([u64; APPENDED_SLOTS]);

const APPENDED_SLOTS: usize = atasira_domain::aggregates::types::ALL.len() + 1;

impl Appended {
    fn slot(aggregate_type: &str) -> usize {
        atasira_domain::aggregates::types::ALL.iter().position(|t| *t == aggregate_type).unwrap_or(APPENDED_SLOTS - 1)
    }

    /// Counts an append of `aggregate_type`.
    pub(super) fn ring(&mut self, aggregate_type: &str) {
        let slot = Self::slot(aggregate_type);
        self.0[slot] = self.0[slot].wrapping_add(1);
    }

    /// Counts an append of every type (what was appended is not known).
    pub(super) fn ring_all(&mut self) {
        for n in &mut self.0 {
            *n = n.wrapping_add(1);
        }
    }

    /// A number that changes whenever one of `aggregate_types` (all types when empty) or
    /// an unknown type was appended.
    pub fn of(&self, aggregate_types: &[&str]) -> u64 {
        if aggregate_types.is_empty() {
            return self.0.iter().fold(0, |a, n| a.wrapping_add(*n));
        }
        let own = aggregate_types.iter().map(|t| Self::slot(t)).filter(|s| *s != APPENDED_SLOTS - 1);
        own.chain([APPENDED_SLOTS - 1]).fold(0, |a, s| a.wrapping_add(self.0[s]))
    }
}

impl Db {
    /// The appended bell: changes after events were committed; [`Appended::of`] says
    /// whether of the types a reader reads.
    pub fn on_append(&self) -> watch::Receiver<Appended> {
        let receiver = self.bells.appended.subscribe();
        // The first reader starts the listener; it rings every reader once it listens, for
        // what was committed elsewhere before.
        if let Some(pool) = self.bells.listen_from.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            tokio::spawn(listen_for_appends(pool, std::sync::Arc::downgrade(&self.bells)));
        }
        receiver
    }

    /// Rings the progress bell: a consumer of this process committed its checkpoint.
    pub fn progressed(&self) {
        self.bells.progressed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The progress bell (read-your-writes waits on it).
    pub fn on_progress(&self) -> watch::Receiver<u64> {
        self.bells.progressed.subscribe()
    }

    /// Rings the wanted bell: a read-your-writes wait found a consumer of this process
    /// behind, waiting for events of `aggregate_types` (every type when empty). The wait
    /// follows their commit, so it rings the appended bell for them too: a feed that has
    /// not heard of them yet (another process's doorbell may ring a little later) reads
    /// now.
    pub fn wanted(&self, aggregate_types: &[&str]) {
        self.bells.wanted.send_replace(Some(std::time::Instant::now()));
        self.bells.appended.send_modify(|a| match aggregate_types {
            [] => a.ring_all(),
            types => types.iter().for_each(|t| a.ring(t)),
        });
    }

    /// The wanted bell (a lingering feed listens to it).
    pub fn on_wanted(&self) -> watch::Receiver<Option<std::time::Instant>> {
        self.bells.wanted.subscribe()
    }

    /// Whether a wait found a consumer of this process behind within `within`.
    pub fn wanted_within(&self, within: Duration) -> bool {
        self.bells.wanted.borrow().is_some_and(|at| at.elapsed() <= within)
    }
}

/// PostgreSQL: `LISTEN` on the channel every process's doorbell notifies after its
/// commits, ringing the appended bell; this process's own notifications are skipped (its
/// commits rang already). Reconnects after a failure (ringing once, since a notification
/// may have been missed). Ends with the `Db`.
pub(super) async fn listen_for_appends(pool: PgPool, bells: std::sync::Weak<Bells>) {
    loop {
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(APPENDED_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        match listener {
            Ok(mut listener) => {
                let Some(s) = bells.upgrade() else { return };
                s.appended.send_modify(Appended::ring_all);
                drop(s);
                loop {
                    let received = tokio::time::timeout(Duration::from_secs(5), listener.try_recv()).await;
                    let Some(s) = bells.upgrade() else { return };
                    match received {
                        Ok(Ok(Some(n))) if n.process_id() == s.doorbell_backend.load(Ordering::Acquire) => {}
                        // The payload names the types appended, comma-separated (a store's
                        // older trigger, or an older version's append, named one or none).
                        Ok(Ok(Some(n))) => s.appended.send_modify(|a| match n.payload() {
                            "" => a.ring_all(),
                            types => types.split(',').for_each(|t| a.ring(t)),
                        }),
                        // The connection was lost and is back, listening again: what was
                        // notified meanwhile is lost, so every reader looks.
                        Ok(Ok(None)) => s.appended.send_modify(Appended::ring_all),
                        Ok(Err(e)) => {
                            s.appended.send_modify(Appended::ring_all);
                            tracing::warn!(error = %e, "lost the database's event notifications; reconnecting");
                            break;
                        }
                        Err(_) => {}
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for the database's event notifications; retrying"),
        }
        if bells.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How close together a process's doorbell rings at most. The first commit after a quiet
/// spell is told at once; commits within this of the last ring are told together, one
/// notification for them all, at its end. Every notification wakes every process that
/// listens, and when it was part of the append, it cost each command's commit about
/// 45 µs on a 2-core host (ADR 9). A read-your-writes wait does not wait for it
/// ([`Db::wanted`]); a reader that nobody waits for may see an event this much later.
const DOORBELL_SPACING: Duration = Duration::from_millis(5);

/// PostgreSQL: tells the other processes of this process's commits, each after it
/// completed, so a process woken by the notification reads the events. A notification
/// names the aggregate types appended, comma-separated; its own transaction does not wait
/// for the WAL flush (it stores nothing). Notified from a connection of its own, whose
/// backend this process's listener skips. Ends when the `Db` is gone.
async fn ring_the_doorbell(pool: PgPool, mut commits: mpsc::UnboundedReceiver<&'static str>, backend: Arc<AtomicU32>) {
    let sql = format!("SELECT pg_notify($1, $2) FROM {}", super::consumers::ASYNC_COMMIT);
    let mut conn: Option<PgConnection> = None;
    let mut last: Option<tokio::time::Instant> = None;
    while let Some(first) = commits.recv().await {
        if let Some(last) = last {
            tokio::time::sleep_until(last + DOORBELL_SPACING).await;
        }
        let mut types = BTreeSet::from([first]);
        while let Ok(more) = commits.try_recv() {
            types.insert(more);
        }
        last = Some(tokio::time::Instant::now());
        let payload = types.into_iter().collect::<Vec<_>>().join(",");
        let rung = async {
            if conn.is_none() {
                let mut fresh = PgConnection::connect_with(&pool.connect_options()).await?;
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut fresh).await?;
                backend.store(u32::try_from(pid).unwrap_or_default(), Ordering::Release);
                conn = Some(fresh);
            }
            let Some(c) = conn.as_mut() else { return Ok(()) };
            sqlx::query(&sql).bind(APPENDED_CHANNEL).bind(&payload).execute(c).await.map(drop)
        }
        .await;
        if let Err(e) = rung {
            conn = None;
            tracing::warn!(error = %e, "cannot tell the other processes of this one's commits; they find them at their next periodic look");
        }
    }
}

/// The channel every process's doorbell notifies.
pub(super) const APPENDED_CHANNEL: &str = "atasira_events";

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::aggregates::types;

    #[test]
    fn r_arch_6_a_reader_wakes_for_the_types_it_reads_and_sleeps_through_the_others() {
        // given readers of drafts and of Boxes
        let mut appended = Appended::default();
        let (drafts, boxes) = (appended.of(&[types::DRAFT]), appended.of(&[types::BOX, types::ACCESS]));
        // when a draft is appended, then only the drafts reader sees a change
        appended.ring(types::DRAFT);
        assert_ne!(appended.of(&[types::DRAFT]), drafts);
        assert_eq!(appended.of(&[types::BOX, types::ACCESS]), boxes);
        // when something unknown (or everything) was appended, then every reader looks
        let boxes = appended.of(&[types::BOX, types::ACCESS]);
        appended.ring("a type from a newer version");
        assert_ne!(appended.of(&[types::BOX, types::ACCESS]), boxes);
        let (drafts, all) = (appended.of(&[types::DRAFT]), appended.of(&[]));
        appended.ring_all();
        assert_ne!(appended.of(&[types::DRAFT]), drafts);
        assert_ne!(appended.of(&[]), all);
    }
}
