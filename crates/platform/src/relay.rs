//! The outbox relay (R-ARCH-6): publishes a service's committed events to JetStream, the
//! public event feed for subscribers outside atasira, in commit order (the gap-safe read
//! every consumer uses), and advances its checkpoint only after JetStream acknowledged
//! (storing it at most every `SAVE_EVERY`, and only past what the NATS host has on disk:
//! `SYNCED_AFTER`). It resumes from the checkpoint after a crash, and after its NATS
//! connection was made again; JetStream drops repeats inside its window.
//!
//! `Nats-Msg-Id` is the event id plus a digest of the stored event: repeats of the same
//! stored event share it, while a message forged with a real event's id (an id is
//! predictable) cannot make JetStream drop the real event as its duplicate.
//!
//! An event the bus cannot carry (larger than the server's max payload) is recorded in
//! `relay_dead_letters`, logged as an error and counted, and the relay moves on: internal
//! consumers read the store, so only outside subscribers miss it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::store::{Cursor, Db, DbKind, StoredEvent};

/// Events the relays of this process could not publish (a metric; each is also a row of
/// `relay_dead_letters` and an error in the log).
pub static DEAD_LETTERS: AtomicU64 = AtomicU64::new(0);

/// The safety-net poll when the appended bell stays silent.
const FALLBACK: Duration = Duration::from_secs(2);

/// How long the relay lets commits gather after the appended bell woke it from idle, so that
/// one pass (one read, acknowledgements awaited together) carries them: the read models'
/// linger ([`crate::feed::LINGER`]), always, since nothing inside reads JetStream on a
/// command's path. Subscribers outside atasira see an event at most this much later.
const LINGER: Duration = crate::feed::LINGER;

/// How often the relay stores its checkpoint at most while busy: after a crash or a
/// take-over, what was published since is published again, which JetStream drops as
/// repeats (its window is minutes). Under load the checkpoint is written a few times a
/// second, not once per command.
const SAVE_EVERY: Duration = Duration::from_millis(250);

/// How often nats-server writes the events stream to disk: the `sync_interval` of the
/// configuration `atasira nats-config` writes. A message JetStream acknowledged is in the
/// server's memory at once and on its disk at the next sync, so a crash of the NATS host
/// (not of nats-server alone) can lose what was acknowledged within this long.
pub const JETSTREAM_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// How long after JetStream acknowledged an event the relay counts on it being on the NATS
/// host's disk: past the server's next sync, with room. The stored checkpoint never passes
/// an event acknowledged more recently, and the relay reads it again whenever its NATS
/// connection was made again (a restarted server may have lost the end of the stream); so
/// whatever a crash of the NATS host lost is published again, and what it kept is dropped
/// as a repeat. Far inside JetStream's duplicate window (two minutes).
pub const SYNCED_AFTER: Duration = Duration::from_secs(3 * JETSTREAM_SYNC_INTERVAL.as_secs());

/// The public events stream on JetStream, as a service sees it: created and configured by
/// the operator (`atasira nats-setup`, see [`events_stream_config`]); a service only looks
/// it up (R-ARCH-13: no process may create, change or delete a stream).
#[derive(Clone, Debug)]
pub struct EventsStream {
    pub js: jetstream::Context,
}

/// The events stream's configuration, kept in `replicas` copies (1 on a single
/// nats-server, 3 on a three-node cluster).
pub fn events_stream_config(replicas: usize) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: atasira_contracts::subjects::EVENTS_STREAM.to_owned(),
        subjects: vec![atasira_contracts::subjects::EVENTS_WILDCARD.to_owned()],
        duplicate_window: Duration::from_secs(120),
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Why a service cannot use the events stream: the operator has not created it yet.
pub const NOT_SET_UP: &str = "the events stream does not exist yet: an operator creates it once with `atasira nats-setup --nats-creds <dir>/operator.creds`";

impl EventsStream {
    pub fn new(js: jetstream::Context) -> EventsStream {
        EventsStream { js }
    }

    /// The stream, looked up (one `STREAM.INFO`).
    pub async fn lookup(&self) -> anyhow::Result<jetstream::stream::Stream> {
        match self.js.get_stream(atasira_contracts::subjects::EVENTS_STREAM).await {
            Ok(stream) => Ok(stream),
            Err(e) if stream_not_found(&e) => Err(anyhow::anyhow!("{NOT_SET_UP}")),
            Err(e) => Err(anyhow::anyhow!("cannot look up the events stream: {e}")),
        }
    }
}

fn stream_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j) if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// What [`set_up_events_stream`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamSetUp {
    Created,
    ReplicasRaised { from: usize },
    AlreadyThere,
}

/// Creates the events stream, or raises its replicas to `replicas` (a stream created on
/// one node keeps its data when the cluster grows; replicas are never lowered): the
/// operator's half of `atasira nats-setup`. The stream, and what was done.
pub async fn set_up_events_stream(js: &jetstream::Context, replicas: usize) -> anyhow::Result<(jetstream::stream::Stream, StreamSetUp)> {
    let config = events_stream_config(replicas);
    let stream = match js.get_stream(&config.name).await {
        Ok(stream) => stream,
        Err(e) if stream_not_found(&e) => {
            let stream = js.create_stream(config).await.map_err(|e| anyhow::anyhow!("cannot create the events stream: {e}"))?;
            return Ok((stream, StreamSetUp::Created));
        }
        Err(e) => return Err(anyhow::anyhow!("cannot look up the events stream: {e}")),
    };
    let current = stream.cached_info().config.clone();
    if current.num_replicas >= config.num_replicas {
        return Ok((stream, StreamSetUp::AlreadyThere));
    }
    let from = current.num_replicas;
    let raised = jetstream::stream::Config { num_replicas: config.num_replicas, ..current };
    js.update_stream(raised).await.map_err(|e| anyhow::anyhow!("cannot raise the events stream's replicas: {e}"))?;
    Ok((stream, StreamSetUp::ReplicasRaised { from }))
}

async fn checkpoint(db: &Db, name: &str) -> anyhow::Result<Cursor> {
    let row = sqlx::query("SELECT tx_id, position FROM relay_checkpoints WHERE name = $1").bind(name).fetch_optional(db.any()).await?;
    Ok(match row {
        Some(r) => Cursor { tx_id: r.try_get(0)?, position: r.try_get(1)? },
        None => Cursor::START,
    })
}

/// Stores the checkpoint without waiting for the WAL flush (PostgreSQL
/// `synchronous_commit = off`): a checkpoint lost in a database crash only means events
/// are published again, which JetStream drops by `Nats-Msg-Id`. This saves one fsync per
/// stored checkpoint on the command path's disk.
async fn save(db: &Db, name: &str, at: Cursor) -> anyhow::Result<()> {
    const UPSERT: &str = "ON CONFLICT (name) DO UPDATE SET tx_id = excluded.tx_id, position = excluded.position";
    if db.kind() == DbKind::Postgres {
        // One statement, its own transaction, which asks for the asynchronous commit itself.
        let sql = format!("INSERT INTO relay_checkpoints (name, tx_id, position) SELECT $1, $2, $3 FROM {} {UPSERT}", crate::store::ASYNC_COMMIT);
        sqlx::query(&sql).bind(name).bind(at.tx_id).bind(at.position).execute(db.any()).await?;
        return Ok(());
    }
    let turn = db.write_turn().await;
    let mut tx = db.begin_consumer().await?;
    sqlx::query(&format!("INSERT INTO relay_checkpoints (name, tx_id, position) VALUES ($1, $2, $3) {UPSERT}"))
        .bind(name)
        .bind(at.tx_id)
        .bind(at.position)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    drop(turn);
    Ok(())
}

/// Records the events of a batch the bus cannot carry, at once; the checkpoint passes them
/// as it passes every acknowledged event. Recorded again (to no effect) when the relay
/// publishes the batch again.
async fn record_dead(db: &Db, name: &str, dead: &[(&StoredEvent, String)]) -> anyhow::Result<()> {
    let turn = db.write_turn().await;
    let mut tx = db.begin_consumer().await?;
    for (event, reason) in dead {
        sqlx::query("INSERT INTO relay_dead_letters (name, event_id, position, reason, recorded_at_ms) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING")
            .bind(name)
            .bind(&event.event_id)
            .bind(event.position)
            .bind(reason)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    drop(turn);
    Ok(())
}

/// The `Nats-Msg-Id` of a published event: its id and a digest of what the store holds
/// (type, position, time, payload), the same on every attempt.
pub fn message_id(event: &StoredEvent) -> String {
    let mut h = Sha256::new();
    for part in [event.event_id.as_bytes(), event.event_type.as_bytes(), &event.position.to_be_bytes(), &event.recorded_at_ms.to_be_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(serde_json::to_vec(&event.payload).unwrap_or_default());
    format!("{}#{}", event.event_id, &hex::encode(h.finalize())[..32])
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    pub published: usize,
    pub dead: usize,
    /// Committed events wait for an older transaction: pass again soon.
    pub held_back: bool,
    /// The pass read everything committed so far (a short batch, nothing held back): the
    /// next waits for the appended bell.
    pub drained: bool,
    /// Where the relay stands after the pass (JetStream has everything up to it).
    pub cursor: Cursor,
}

/// Bytes of a NATS header block beyond its names and values (`NATS/1.0`, separators).
const HEADER_FRAMING: usize = 64;

/// Events the relay publishes at most per pass.
const BATCH: i64 = 256;

/// Publishes one batch after `from` (the relay's checkpoint).
pub async fn relay_once(db: &Db, js: &jetstream::Context, service: &str, aggregate_types: &[&str], from: Cursor) -> anyhow::Result<Relayed> {
    let name = format!("relay-{service}");
    let batch = db.read(from, aggregate_types, BATCH).await?;
    let subject = atasira_contracts::subjects::events(service);
    let max_payload = js.client().max_payload();
    let mut dead = Vec::new();
    // Published one after another, then acknowledged: JetStream stores them in order, and a
    // failed acknowledgement fails the pass (the next pass publishes again from the cursor,
    // and JetStream drops the repeats).
    let mut acks = Vec::with_capacity(batch.events.len());
    for event in &batch.events {
        let bytes = crate::feed::encode_notification(event);
        let mut headers = async_nats::HeaderMap::new();
        let id = message_id(event);
        headers.insert("Nats-Msg-Id", id.as_str());
        let mut header_bytes = "Nats-Msg-Id".len() + id.len();
        // The appending command's trace context, for subscribers that trace (R-OPS-1);
        // none longer than a caller may give (an event stored before that bound).
        for key in [crate::trace::TRACEPARENT, "tracestate"] {
            if let Some(value) = event.metadata.get(key).and_then(serde_json::Value::as_str).filter(|v| v.len() <= crate::trace::MAX_TRACE_HEADER) {
                headers.insert(key, value);
                header_bytes += key.len() + value.len();
            }
        }
        // What NATS counts against its limit: the body and the headers.
        if bytes.len() + header_bytes + HEADER_FRAMING > max_payload {
            let reason = format!("{} bytes with its headers, more than the {max_payload} bytes NATS carries", bytes.len() + header_bytes);
            tracing::error!(service, event_id = %event.event_id, reason, "event cannot be published on the bus; recorded as a dead letter");
            DEAD_LETTERS.fetch_add(1, Ordering::Relaxed);
            dead.push((event, reason));
            continue;
        }
        acks.push(js.publish_with_headers(subject.clone(), headers, bytes.into()).await.map_err(|e| anyhow::anyhow!("publish failed: {e}"))?);
    }
    for ack in acks {
        ack.await.map_err(|e| anyhow::anyhow!("JetStream did not acknowledge: {e}"))?;
    }
    let mut cursor = from;
    if let Some(last) = batch.events.last() {
        cursor = last.cursor();
    }
    // A dead letter is recorded at once; the caller stores the checkpoint when it is due.
    if !dead.is_empty() {
        record_dead(db, &name, &dead).await?;
    }
    Ok(Relayed {
        published: batch.events.len() - dead.len(),
        dead: dead.len(),
        held_back: batch.held_back,
        drained: !batch.held_back && (batch.events.len() as i64) < BATCH,
        cursor,
    })
}

/// Runs the relay until shutdown, woken by the store's appended bell; failures (NATS down)
/// are retried with a pause and no event is skipped. The checkpoint is read from the store
/// at the start and after a failure; in between the relay knows where it stands.
pub async fn run(
    db: Db,
    stream: EventsStream,
    service: &'static str,
    aggregate_types: &'static [&'static str],
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let name = format!("relay-{service}");
    loop {
        // One process of the service relays; other replicas stand by (`exclusive.rs`).
        let Some(mut lease) = crate::exclusive::acquire(&db, &name, &mut shutdown).await else { return };
        let stopped = tokio::select! {
            () = relay(&db, &stream, service, aggregate_types, &mut shutdown) => true,
            () = lease.lost() => false,
        };
        if stopped {
            return;
        }
        tracing::warn!(service, "lost the lock that makes this process the relay; competing for it again");
    }
}

/// What JetStream acknowledged that the stored checkpoint does not say yet: the cursor
/// after each pass with when it was acknowledged, oldest first (passes acknowledged close
/// together are kept as one, under the later time).
///
/// All under one NATS connection: a pass acknowledged by a server the relay has since
/// reconnected to may be lost, so it is never stored.
#[derive(Debug, Default)]
struct Acked {
    passes: std::collections::VecDeque<(Cursor, tokio::time::Instant)>,
    saved_at: Option<tokio::time::Instant>,
    /// The connection count (`Statistics::connects`) the passes were acknowledged under.
    connects: u64,
}

/// Passes acknowledged within this long of each other are kept as one.
const COALESCE: Duration = Duration::from_millis(100);

impl Acked {
    /// A pass acknowledged by `now`, published under connection count `connects` (read
    /// before it was published).
    fn push(&mut self, cursor: Cursor, now: tokio::time::Instant, connects: u64) {
        if connects != self.connects {
            self.passes.clear();
            self.connects = connects;
        }
        match self.passes.back_mut() {
            Some(back) if back.0 == cursor => {}
            // Later, never earlier: the pass counts as acknowledged when the newest was.
            Some(back) if now.saturating_duration_since(back.1) < COALESCE => *back = (cursor, now),
            _ => self.passes.push_back((cursor, now)),
        }
    }

    /// The newest cursor on the NATS host's disk by `now` ([`SYNCED_AFTER`]), taken off
    /// with those before it; none, and nothing kept, when the connection was made again
    /// since (count `connects` now).
    fn take_synced(&mut self, now: tokio::time::Instant, connects: u64) -> Option<Cursor> {
        if connects != self.connects {
            self.passes.clear();
            return None;
        }
        let mut synced = None;
        while let Some(&(cursor, at)) = self.passes.front() {
            if now.saturating_duration_since(at) < SYNCED_AFTER {
                break;
            }
            synced = Some(cursor);
            self.passes.pop_front();
        }
        synced
    }

    /// When everything acknowledged so far is on the NATS host's disk.
    fn all_synced_at(&self) -> Option<tokio::time::Instant> {
        self.passes.back().map(|&(_, at)| at + SYNCED_AFTER)
    }
}

/// Stores the newest checkpoint that is on the NATS host's disk, when one is due (`force`:
/// whatever [`SAVE_EVERY`] says); a failure only means events after the stored checkpoint
/// are published again one day.
async fn save_due(db: &Db, name: &str, acked: &mut Acked, statistics: &async_nats::Statistics, force: bool) {
    let now = tokio::time::Instant::now();
    if !force && acked.saved_at.is_some_and(|at| now.saturating_duration_since(at) < SAVE_EVERY) {
        return;
    }
    let Some(cursor) = acked.take_synced(now, statistics.connects.load(Ordering::Relaxed)) else { return };
    acked.saved_at = Some(now);
    if let Err(e) = save(db, name, cursor).await {
        tracing::warn!(relay = %name, error = %e, "could not store the relay's checkpoint; events after the stored one are published again after a restart, and JetStream drops the repeats");
    }
}

/// The relay while this process holds its lock; returns at shutdown.
async fn relay(
    db: &Db,
    stream: &EventsStream,
    service: &'static str,
    aggregate_types: &'static [&'static str],
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) {
    let (db, js) = (db.clone(), stream.js.clone());
    let name = format!("relay-{service}");
    let mut stream_ready = false;
    let mut bell = db.on_append();
    let mut at: Option<Cursor> = None;
    let mut drained: Option<u64> = None;
    // The connections made so far: a new one may be to a server that restarted.
    let statistics = js.client().statistics();
    let mut connects = statistics.connects.load(Ordering::Relaxed);
    let mut acked = Acked { connects, ..Acked::default() };
    loop {
        if *shutdown.borrow() {
            save_due(&db, &name, &mut acked, &statistics, true).await;
            return;
        }
        if let Some(seen) = drained.take() {
            // Idle: the checkpoint is stored once what was acknowledged is on the NATS
            // host's disk, then the relay sleeps.
            let now = tokio::time::Instant::now();
            let wake = acked.all_synced_at().map_or(FALLBACK, |at| at.saturating_duration_since(now));
            let woke = tokio::select! {
                r = tokio::time::timeout(wake, bell.wait_for(|a| a.of(aggregate_types) != seen)) => Some(r.is_err()),
                _ = shutdown.changed() => None,
            };
            let Some(timed_out) = woke else {
                save_due(&db, &name, &mut acked, &statistics, true).await;
                return;
            };
            if timed_out && !acked.passes.is_empty() {
                save_due(&db, &name, &mut acked, &statistics, true).await;
                drained = Some(seen);
                continue;
            }
            if !timed_out {
                tokio::select! {
                    () = tokio::time::sleep(LINGER) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        // A restarted NATS server may have lost what it acknowledged last: from the stored
        // checkpoint again, which is behind all of that (repeats are dropped).
        let now_connects = statistics.connects.load(Ordering::Relaxed);
        if now_connects != connects {
            connects = now_connects;
            if at.is_some() {
                tracing::info!(service, "NATS connection made again; publishing again from the stored checkpoint");
            }
            at = None;
        }
        // Marked seen before reading: a commit after this point rings again.
        let seen = bell.borrow_and_update().of(aggregate_types);
        let result = async {
            if !stream_ready {
                stream.lookup().await?;
                stream_ready = true;
            }
            let from = match at {
                Some(cursor) => cursor,
                None => checkpoint(&db, &name).await?,
            };
            relay_once(&db, &js, service, aggregate_types, from).await
        }
        .await;
        let wait = match result {
            Ok(r) => {
                if at != Some(r.cursor) {
                    acked.push(r.cursor, tokio::time::Instant::now(), connects);
                }
                save_due(&db, &name, &mut acked, &statistics, false).await;
                at = Some(r.cursor);
                crate::metrics::global().reader_at(&name, "relay", aggregate_types, r.cursor);
                if r.drained {
                    drained = Some(seen);
                    continue;
                }
                if !r.held_back || r.published + r.dead > 0 {
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(2))
            }
            Err(e) => {
                // What is on the NATS host's disk stays there: store it, then read the
                // checkpoint again (what came after is published again).
                save_due(&db, &name, &mut acked, &statistics, true).await;
                acked.passes.clear();
                at = None;
                tracing::warn!(service, error = %e, "relay failed; retrying");
                tokio::time::sleep(Duration::from_millis(500))
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn at(position: i64) -> Cursor {
        Cursor { tx_id: position, position }
    }

    #[test]
    fn r_arch_6_the_checkpoint_passes_only_what_jetstream_acknowledged_before_its_last_sync() {
        // given passes acknowledged at 0 s, 0.5 s and 2 s
        let t0 = Instant::now();
        let mut acked = Acked::default();
        acked.push(at(1), t0, 0);
        acked.push(at(2), t0 + Duration::from_millis(500), 0);
        acked.push(at(3), t0 + Duration::from_secs(2), 0);
        // when the relay looks before the first is surely on disk: nothing to store
        assert_eq!(acked.take_synced(t0 + SYNCED_AFTER - Duration::from_millis(1), 0), None);
        // then, later, only the passes acknowledged at least SYNCED_AFTER ago, the newest of them
        assert_eq!(acked.take_synced(t0 + SYNCED_AFTER + Duration::from_millis(600), 0), Some(at(2)));
        assert_eq!(acked.all_synced_at(), Some(t0 + Duration::from_secs(2) + SYNCED_AFTER));
        assert_eq!(acked.take_synced(t0 + Duration::from_secs(2) + SYNCED_AFTER, 0), Some(at(3)));
        assert_eq!(acked.all_synced_at(), None);
    }

    #[test]
    fn r_arch_6_passes_acknowledged_close_together_count_from_the_later_one() {
        // given a pass, and another 50 ms later
        let t0 = Instant::now();
        let mut acked = Acked::default();
        acked.push(at(1), t0, 0);
        acked.push(at(2), t0 + Duration::from_millis(50), 0);
        // then they are one, acknowledged at the later time: the earlier is not stored sooner
        // than the later could be
        assert_eq!(acked.passes.len(), 1);
        assert_eq!(acked.take_synced(t0 + SYNCED_AFTER, 0), None);
        assert_eq!(acked.take_synced(t0 + SYNCED_AFTER + Duration::from_millis(50), 0), Some(at(2)));
    }

    #[test]
    fn r_arch_6_nothing_acknowledged_before_a_reconnect_is_stored() {
        // given a pass acknowledged under the first connection
        let t0 = Instant::now();
        let mut acked = Acked { connects: 1, ..Acked::default() };
        acked.push(at(1), t0, 1);
        // when the connection was made again (the server may have restarted and lost it)
        // then it is never stored, however long ago it was acknowledged
        assert_eq!(acked.take_synced(t0 + SYNCED_AFTER * 2, 2), None);
        assert!(acked.passes.is_empty());
        // and a pass published before the reconnect but counted after it is dropped too
        acked.push(at(2), t0, 1);
        acked.push(at(3), t0 + Duration::from_secs(1), 2);
        assert_eq!(acked.take_synced(t0 + SYNCED_AFTER * 2, 2), Some(at(3)));
    }

    #[test]
    fn r_arch_6_the_stream_is_on_disk_well_inside_jetstreams_duplicate_window() {
        // A repeat published after a reconnect is dropped only inside the window.
        assert!(SYNCED_AFTER > JETSTREAM_SYNC_INTERVAL);
        assert!(SYNCED_AFTER * 10 < events_stream_config(1).duplicate_window);
    }
}
