//! What a process learns without asking the database: events were appended (rung after a
//! local commit; in cluster mode by the other processes' doorbells on NATS, and in
//! PostgreSQL by `LISTEN` for appends of processes without one), a consumer of this
//! process made progress, a reader of this process waits for a consumer that is behind.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;

use super::Db;

/// The bells of one process.
pub(super) struct Bells {
    pub(super) appended: watch::Sender<Appended>,
    /// PostgreSQL: `LISTEN` is in place, so every commit that notifies (this process's
    /// too, unless it has a doorbell) rings the appended bell by notification; a local ring
    /// after such a commit would only wake readers a second time for the same events.
    listening: std::sync::atomic::AtomicBool,
    /// PostgreSQL: the pool to `LISTEN` from, until the first reader of the appended bell
    /// starts the listener (a process nobody in which reads the bell, such as a gateway
    /// without live streams, is not woken by every commit of the cluster).
    listen_from: std::sync::Mutex<Option<PgPool>>,
    progressed: watch::Sender<u64>,
    /// Rung when a read-your-writes wait for a write reaches this process, with the time,
    /// per aggregate type of the events waited for: consumers that let events gather
    /// while nobody waits for them (a read model's feed lingers) apply them now.
    wanted: watch::Sender<Wanted>,
    /// Cluster mode: tells the other processes of this one's commits over NATS
    /// ([`Db::ring_over_nats`]); its appends then notify nothing in the database.
    doorbell: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<&'static str>>,
    /// Names this `Db` on the doorbells, so it skips its own rings (it rang at the commit).
    instance: u64,
    /// The aggregate types this process committed, a bit per slot of [`Appended`]: their
    /// commits rang here at once, whatever the doorbells do.
    committed_here: std::sync::atomic::AtomicU64,
}

impl Default for Bells {
    fn default() -> Bells {
        Bells {
            appended: watch::channel(Appended::default()).0,
            listening: std::sync::atomic::AtomicBool::new(false),
            listen_from: std::sync::Mutex::new(None),
            progressed: watch::channel(0).0,
            wanted: watch::channel(Wanted::default()).0,
            doorbell: std::sync::OnceLock::new(),
            instance: uuid::Uuid::new_v4().as_u64_pair().0,
            committed_here: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Bells {
    /// PostgreSQL: the appended bell listens for the database's notifications from `pool`
    /// once someone reads it.
    pub(super) fn listen_later(&self, pool: PgPool) {
        *self.listen_from.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(pool);
    }

    /// Rings the appended bell after a commit of this process that appended
    /// `aggregate_type`, unless the database's notification will, and the doorbell.
    pub(super) fn committed(&self, aggregate_type: &'static str) {
        self.committed_here.fetch_or(1 << Appended::slot(aggregate_type), std::sync::atomic::Ordering::Relaxed);
        let doorbell = self.doorbell.get();
        if doorbell.is_some() || !self.listening.load(std::sync::atomic::Ordering::Acquire) {
            self.appended.send_modify(|a| a.ring(aggregate_type));
        }
        if let Some(doorbell) = doorbell {
            // Fails only once the doorbell has stopped with the runtime.
            let _ = doorbell.send(aggregate_type);
        }
    }

    /// Whether this process's appends notify the database at commit (no doorbell).
    pub(super) fn notifies(&self) -> bool {
        self.doorbell.get().is_none()
    }
}

/// The appends a process was told of, counted per aggregate type (slots in the order of
/// `types::ALL`, plus one for types it does not know), so that a reader wakes only when a
/// type it reads was appended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended([u64; APPENDED_SLOTS]);

const APPENDED_SLOTS: usize = atasira_domain::aggregates::types::ALL.len() + 1;
// A bit per slot in `Bells::committed_here`.
const _: () = assert!(APPENDED_SLOTS <= 64);

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

/// When read-your-writes waits last asked this process for events of each aggregate type
/// (slots as in [`Appended`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted([Option<std::time::Instant>; APPENDED_SLOTS]);

impl Wanted {
    /// Marks events of `aggregate_types` (every type when empty) as waited for now.
    fn mark(&mut self, aggregate_types: &[&str]) {
        let now = Some(std::time::Instant::now());
        if aggregate_types.is_empty() {
            self.0 = [now; APPENDED_SLOTS];
        } else {
            aggregate_types.iter().for_each(|t| self.0[Appended::slot(t)] = now);
        }
    }

    /// Whether a wait asked for events of one of `aggregate_types` (any type when empty)
    /// within `within`.
    pub fn within(&self, aggregate_types: &[&str], within: Duration) -> bool {
        let now = std::time::Instant::now();
        let recent = |slot: usize| self.0[slot].is_some_and(|at| now.saturating_duration_since(at) <= within);
        if aggregate_types.is_empty() {
            return (0..APPENDED_SLOTS).any(recent);
        }
        aggregate_types.iter().any(|t| recent(Appended::slot(t)))
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

    /// A read-your-writes wait found a consumer of this process behind on events of
    /// `aggregate_types` (every type when empty): [`Db::waited_on`] and [`Db::hurry`].
    pub fn wanted(&self, aggregate_types: &[&str]) {
        self.waited_on(aggregate_types);
        self.hurry(aggregate_types);
    }

    /// A wait that marked its types ([`Db::waited_on`]) found a consumer behind: in cluster
    /// mode, rings the appended bell for the types of `aggregate_types` (every type when
    /// empty) this process did not commit itself, since the doorbell of the process that
    /// did rings at most every [`DOORBELL_GAP`] and may not have rung yet. A forged wait
    /// costs a read.
    pub fn hurry(&self, aggregate_types: &[&str]) {
        if self.bells.doorbell.get().is_none() {
            // Every commit rang this process already: its own, or by notification.
            return;
        }
        if aggregate_types.is_empty() {
            self.bells.appended.send_modify(Appended::ring_all);
            return;
        }
        let here = self.bells.committed_here.load(std::sync::atomic::Ordering::Relaxed);
        let mut others = aggregate_types.iter().filter(|t| here & (1 << Appended::slot(t)) == 0).peekable();
        if others.peek().is_some() {
            self.bells.appended.send_modify(|a| others.for_each(|t| a.ring(t)));
        }
    }

    /// A read-your-writes wait for events of `aggregate_types` (every type when empty)
    /// reached this process: rings the wanted bell, so lingering feeds of those types read
    /// at once for [`WANTED_LATELY`] and, in cluster mode, this process's commits ring its
    /// doorbell at once (someone waits for read models, command after command), whether
    /// or not its own read models are behind.
    pub fn waited_on(&self, aggregate_types: &[&str]) {
        self.bells.wanted.send_modify(|w| w.mark(aggregate_types));
    }

    /// The wanted bell (a lingering feed listens to it).
    pub fn on_wanted(&self) -> watch::Receiver<Wanted> {
        self.bells.wanted.subscribe()
    }

    /// Whether a wait asked this process for events of `aggregate_types` (any type when
    /// empty) within `within`.
    pub fn wanted_within(&self, aggregate_types: &[&str], within: Duration) -> bool {
        self.bells.wanted.borrow().within(aggregate_types, within)
    }

    /// Cluster mode (PostgreSQL): this process's commits ring the other processes over NATS,
    /// on its own doorbell subject (`identity`'s, the only one its credentials may publish
    /// on), at most once every `gap` ([`DOORBELL_GAP`]; the commits of the gap ring
    /// together), and their doorbells ring its appended bell. Its appends then notify
    /// nothing in the database: a notification at commit made PostgreSQL signal every listening
    /// session inside the command's commit, about 45-65 µs of each command on a 2-core host
    /// (ADR 9). A ring names aggregate types, never an event: a woken reader reads the store,
    /// so a forged ring costs a read and changes nothing. A ring lost with the connection
    /// leaves a reader to its periodic look. `LISTEN` stays, for the appends of processes
    /// without a doorbell (the command line). Ends with the `Db`.
    pub fn ring_over_nats(&self, client: async_nats::Client, identity: &str, gap: Duration) {
        if self.kind() != super::DbKind::Postgres {
            return;
        }
        let (doorbell, commits) = tokio::sync::mpsc::unbounded_channel();
        if self.bells.doorbell.set(doorbell).is_err() {
            return;
        }
        let instance = self.bells.instance;
        let subject = atasira_contracts::subjects::doorbell(identity);
        tokio::spawn(ring_the_doorbell(client.clone(), subject, instance, gap, self.bells.wanted.subscribe(), commits));
        tokio::spawn(hear_the_doorbells(client, instance, std::sync::Arc::downgrade(&self.bells)));
    }
}

/// A feed reads at once, without lingering, and a process's commits ring its doorbell at
/// once, while a read-your-writes wait of the process found a consumer behind within this
/// long: someone waits for the read models, command after command.
pub const WANTED_LATELY: Duration = Duration::from_secs(1);

/// How often a process rings its doorbell at most while nobody waits for read models here.
/// A commit after a quiet moment rings at once; the commits that follow within the gap
/// ring together when it ends. A ring cost every process a message to read and the
/// committing one about 110-190 µs of a command at c=1 on a 2-core host (ADR 9). While a
/// read-your-writes wait of this process found a consumer behind lately
/// ([`WANTED_LATELY`]) or finds one during the gap, commits are being waited for: they
/// ring at once. A wait elsewhere does not wait for the gap either: it rings the consumers
/// it waits for itself (`Db::wanted`). A read model's feed lingers longer than the gap
/// anyway.
pub const DOORBELL_GAP: Duration = Duration::from_millis(5);

/// Publishes this process's commits on its doorbell, at most once every `gap` while no wait
/// of this process wants its read models (`wanted`, its wanted bell): the types of the
/// commits since the last ring go together, comma-separated, after this `Db`'s instance.
/// Ends when the `Db` is gone.
async fn ring_the_doorbell(
    client: async_nats::Client,
    subject: String,
    instance: u64,
    gap: Duration,
    mut wanted: watch::Receiver<Wanted>,
    mut commits: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
) {
    while let Some(first) = commits.recv().await {
        let mut types = vec![first];
        while let Ok(more) = commits.try_recv() {
            if !types.contains(&more) {
                types.push(more);
            }
        }
        let ring = format!("{instance} {}", types.join(","));
        if let Err(e) = client.publish(subject.clone(), ring.into()).await {
            tracing::warn!(error = %e, "cannot tell the other processes of this one's commits; they find them at their next periodic look");
        }
        if wanted.borrow_and_update().within(&[], WANTED_LATELY) {
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(gap) => {}
            // Gone with the `Db` (then the commits end too), or a wait wants what was held.
            _ = wanted.changed() => {}
        }
    }
}

/// Rings the appended bell for the types another process's doorbell names (its own rang
/// at the commit). Resubscribes after a failure, ringing every reader once, since a ring
/// may have been missed. Ends with the `Db`.
async fn hear_the_doorbells(client: async_nats::Client, instance: u64, bells: std::sync::Weak<Bells>) {
    use futures::StreamExt as _;
    let own = instance.to_string();
    loop {
        match client.subscribe(atasira_contracts::subjects::DOORBELLS).await {
            Ok(mut rings) => {
                while let Some(ring) = rings.next().await {
                    let Some(s) = bells.upgrade() else { return };
                    let text = String::from_utf8_lossy(&ring.payload);
                    match text.split_once(' ') {
                        Some((from, _)) if from == own => {}
                        Some((_, types)) => s.appended.send_modify(|a| types.split(',').for_each(|t| a.ring(t))),
                        None => s.appended.send_modify(Appended::ring_all),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot hear the other processes' doorbells; retrying"),
        }
        let Some(s) = bells.upgrade() else { return };
        s.appended.send_modify(Appended::ring_all);
        drop(s);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// PostgreSQL's notifications: `LISTEN` on the channel the append statements of processes
/// without a doorbell notify (at the commit of a transaction that appended events),
/// ringing the appended bell;
/// reconnects after a failure (ringing once, since a notification may have been missed).
/// While it listens, this process's own commits ring by notification only, unless it has
/// a doorbell (see `Bells::committed`); while it does not, they ring locally. Ends with
/// the `Db`.
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
                s.listening.store(true, std::sync::atomic::Ordering::Release);
                s.appended.send_modify(Appended::ring_all);
                drop(s);
                loop {
                    let received = tokio::time::timeout(Duration::from_secs(5), listener.try_recv()).await;
                    let Some(s) = bells.upgrade() else { return };
                    match received {
                        // The payload names a type the transaction appended (a store's
                        // older trigger named several, comma-separated).
                        Ok(Ok(Some(n))) => s.appended.send_modify(|a| match n.payload() {
                            "" => a.ring_all(),
                            types => types.split(',').for_each(|t| a.ring(t)),
                        }),
                        // The connection was lost and is back, listening again: what was
                        // notified meanwhile is lost, so every reader looks.
                        Ok(Ok(None)) => s.appended.send_modify(Appended::ring_all),
                        Ok(Err(e)) => {
                            s.listening.store(false, std::sync::atomic::Ordering::Release);
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

/// The channel an append statement notifies on commit (see `store::append`).
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
