//! One durable-consumer abstraction (R-ARCH-6, R-ARCH-7), the same in both modes: a feed
//! reads the event store after its consumer's cursor, in commit order, with the gap-safe
//! read the relay uses (`Db::read`). A consumer never applies an event it was sent: NATS
//! (the relay's public feed) is not read at all, and what wakes a feed is a bell that
//! carries no event: the appended bell of its `Db`, rung after local commits and, in
//! PostgreSQL, by `LISTEN` on every commit anywhere. A slow poll is only a safety net.

use std::time::Duration;

use prost::Message as _;
use tokio::sync::watch;

use crate::store::{Appended, Batch, Cursor, Db, StoredEvent};

/// How feeds wait for events.
#[derive(Debug, Clone)]
pub struct FeedSource {
    /// The safety-net poll when no bell rang (a missed notification costs at most this).
    pub fallback: Duration,
    /// How long a feed woken by the bell lets commits gather before it reads, while no
    /// read-your-writes wait reached this process lately for events it is read for (zero:
    /// it reads at once). See [`FeedSource::lingering`].
    pub linger: Duration,
    /// The aggregate types whose waits end a linger; `None`: every type the feed reads.
    pub waited_for: Option<&'static [&'static str]>,
}

impl Default for FeedSource {
    fn default() -> Self {
        FeedSource { fallback: Duration::from_secs(2), linger: Duration::ZERO, waited_for: None }
    }
}

/// How long a read model's feed (and the relay, always) lets commits gather while nobody
/// waits for it: one read and one write then carry them all, where a pass per command
/// would compete with the next command for the machine (measured with `atasira bench
/// drafts`, ADR 9). A reader that looks without waiting sees an event at most this much
/// later.
pub const LINGER: Duration = Duration::from_millis(10);

pub use crate::store::bells::WANTED_LATELY;

/// One event handed to a consumer. Acknowledging is storing the consumer's checkpoint,
/// which its effect does in the same transaction; `ack` is kept for the consumer loop.
#[derive(Debug)]
pub struct Delivery {
    pub event: StoredEvent,
}

impl Delivery {
    pub async fn ack(self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// An open feed for one consumer.
pub struct Feed {
    db: Db,
    bell: watch::Receiver<Appended>,
    types: Vec<&'static str>,
    cursor: Cursor,
    /// SQLite: the position up to which the feed has looked at every event, of any type (at
    /// least its cursor's), so that it can take what follows from what this process
    /// appended (`Db::read_recent`) instead of reading the store.
    covered: i64,
    fallback: Duration,
    linger: Duration,
    waited_for: Option<&'static [&'static str]>,
    /// The pause before reading again while an older transaction holds events back.
    held_back: Pause,
    /// Set when the last read left nothing behind: the bell as it was before that read,
    /// to wait for before the next.
    drained: Option<u64>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed").field("types", &self.types).field("cursor", &self.cursor).finish_non_exhaustive()
    }
}

/// Events a feed reads at most at once.
const BATCH: i64 = 256;

/// The pause while events are held back: 1 ms, doubled up to 50 ms.
const HELD_BACK: Pause = Pause::new(Duration::from_millis(1), Duration::from_millis(50));

/// A pause that doubles each time it is taken, up to a longest one, until it is reset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pause {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Pause {
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, next: first }
    }

    /// The pause to make now; the next one is twice as long (at most `max`).
    pub(crate) fn take(&mut self) -> Duration {
        let now = self.next;
        self.next = (now * 2).min(self.max);
        now
    }

    /// Back to the first pause.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

impl FeedSource {
    /// The same source, for read models: its feeds linger ([`LINGER`]) while no
    /// read-your-writes wait of their process needs them, and a wait that finds one behind
    /// ends the linger at once (`Db::wanted`).
    #[must_use]
    pub fn lingering(&self) -> FeedSource {
        FeedSource { linger: LINGER, waited_for: None, ..self.clone() }
    }

    /// Like [`FeedSource::lingering`], for a consumer that is a read model only for events
    /// of `aggregate_types` and reads others too (the notifier: its webhook list): only a
    /// wait for those ends its linger, so its work on the others stays out of the way of
    /// the writes being waited for.
    #[must_use]
    pub fn lingering_unless_waited_for(&self, aggregate_types: &'static [&'static str]) -> FeedSource {
        FeedSource { linger: LINGER, waited_for: Some(aggregate_types), ..self.clone() }
    }

    /// Opens the feed `name` for events of `aggregate_types`, starting after `cursor` (the
    /// consumer's own checkpoint).
    pub async fn open(&self, db: &Db, name: &str, aggregate_types: &'static [&'static str], cursor: Cursor) -> anyhow::Result<Feed> {
        if let Some(unknown) = aggregate_types.iter().find(|t| atasira_contracts::subjects::owner_of(t).is_none()) {
            anyhow::bail!("feed {name}: {unknown:?} is not an aggregate type");
        }
        Ok(Feed {
            db: db.clone(),
            bell: db.on_append(),
            types: aggregate_types.to_vec(),
            cursor,
            covered: cursor.position,
            fallback: self.fallback,
            linger: self.linger,
            waited_for: self.waited_for,
            held_back: HELD_BACK,
            drained: None,
        })
    }
}

impl Feed {
    /// The next batch, or an empty one after waiting for the bell (or the fallback). A
    /// read that leaves nothing behind (shorter than a batch, nothing held back) is not
    /// followed by another: the feed waits for the bell first.
    ///
    /// SQLite: what this process appended is taken from memory when that provably holds
    /// every event after the feed's place; a feed woken by its safety-net poll (another
    /// process may have appended) reads the store.
    pub async fn next(&mut self) -> anyhow::Result<Vec<Delivery>> {
        let mut rung = true;
        if let Some(seen) = self.drained.take() {
            // Sleeps through appends of other types.
            let types = &self.types;
            rung = tokio::time::timeout(self.fallback, self.bell.wait_for(|a| a.of(types) != seen)).await.is_ok();
            if rung {
                self.linger().await;
            }
        }
        // Marked seen before reading: a commit after this point rings again.
        let seen = self.bell.borrow_and_update().of(&self.types);
        let (batch, looked_at) = match rung.then(|| self.db.read_recent(self.covered, &self.types, BATCH)).flatten() {
            Some((events, covered)) => (Batch { events, held_back: false }, Some(covered)),
            None => {
                // Asked before the read: every event up to it is committed, so a read that
                // leaves nothing behind has looked at them all.
                let recorded = self.db.recent_last();
                (self.db.read(self.cursor, &self.types, BATCH).await?, recorded)
            }
        };
        if batch.held_back {
            if batch.events.is_empty() {
                tokio::time::sleep(self.held_back.take()).await;
            }
        } else {
            self.held_back.reset();
            if (batch.events.len() as i64) < BATCH {
                self.drained = Some(seen);
                self.covered = self.covered.max(looked_at.unwrap_or(i64::MIN));
            }
        }
        if let Some(last) = batch.events.last() {
            self.cursor = last.cursor();
            self.covered = self.covered.max(last.position);
        }
        Ok(batch.events.into_iter().map(|event| Delivery { event }).collect())
    }

    /// Woken by the bell from a drained read: lets commits gather for the linger, unless a
    /// read-your-writes wait for events it is read for reached this process lately or
    /// meanwhile.
    async fn linger(&self) {
        if self.linger.is_zero() {
            return;
        }
        let waited_for = self.waited_for.unwrap_or(&self.types);
        // Looked at as subscribed, so a wait after the look ends the linger.
        let mut wanted = self.db.on_wanted();
        if wanted.borrow_and_update().within(waited_for, WANTED_LATELY) {
            return;
        }
        let end = tokio::time::sleep(self.linger);
        tokio::pin!(end);
        loop {
            tokio::select! {
                () = &mut end => return,
                changed = wanted.changed() => {
                    if changed.is_err() || wanted.borrow_and_update().within(waited_for, WANTED_LATELY) {
                        return;
                    }
                }
            }
        }
    }

    /// Where the feed stands.
    pub fn cursor(&self) -> Cursor {
        self.cursor
    }
}

/// An event as the relay publishes it on `atasira.box.<service>.events` (the public feed
/// for subscribers outside atasira; no atasira consumer reads it).
pub fn encode_notification(e: &StoredEvent) -> Vec<u8> {
    atasira_contracts::v1::EventNotification {
        event_id: e.event_id.clone(),
        aggregate_type: e.aggregate_type.clone(),
        aggregate_id: e.aggregate_id.clone(),
        sequence: e.sequence,
        position: e.position,
        event_type: e.event_type.clone(),
        event_version: e.event_version.clone(),
        payload_json: serde_json::to_vec(&e.payload).unwrap_or_default(),
        metadata: e
            .metadata
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned))).collect())
            .unwrap_or_default(),
        recorded_at_unix_ms: e.recorded_at_ms,
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_feed_of_a_type_that_is_no_aggregate_is_refused_not_routed_anywhere() {
        let store = crate::store::testing::TempDb::new().await;
        let db = &store.db;
        let feeds = FeedSource::default();
        let Err(refused) = feeds.open(db, "typo", &["draft", "drafts"], Cursor::START).await else { panic!("a feed of \"drafts\" was opened") };
        assert!(refused.to_string().contains("\"drafts\" is not an aggregate type"), "{refused}");
        assert!(feeds.open(db, "fine", &["draft", "box"], Cursor::START).await.is_ok());
    }

    use crate::store::testing::submit;
    use atasira_domain::aggregates::draft::Draft;
    use std::collections::HashMap;

    /// Every event `feed` delivers until it has `count` (within 10 s).
    async fn take(feed: &mut Feed, count: usize) -> Vec<StoredEvent> {
        let mut got = Vec::new();
        let all = async {
            while got.len() < count {
                got.extend(feed.next().await.expect("read").into_iter().map(|d| d.event));
            }
        };
        tokio::time::timeout(Duration::from_secs(10), all).await.expect("the feed delivers them");
        got
    }

    #[tokio::test]
    async fn r_arch_6_a_feed_gets_this_process_appends_from_memory_as_a_read_gives_them() {
        // given a feed of drafts, and drafts appended by this process (grouped and direct)
        let store = crate::store::testing::TempDb::new().await;
        let db = &store.db;
        let mut feed = FeedSource::default().open(db, "view", &["draft"], Cursor::START).await.expect("open");
        for id in ["a", "b"] {
            db.cqrs::<Draft>().execute_new(id, submit(id), HashMap::new()).await.expect("grouped append");
        }
        db.cqrs::<Draft>()
            .execute("c", submit("c"), HashMap::from([("k".to_owned(), "v".to_owned())]), crate::store::Retry::ONCE)
            .await
            .expect("direct append");
        // when the feed takes them
        assert!(db.read_recent(0, &["draft"], 10).is_some(), "what this process appended is at hand");
        let delivered = take(&mut feed, 3).await;
        // then they are the events a read of the store gives, field for field
        assert_eq!(delivered, db.read(Cursor::START, &["draft"], 10).await.expect("read").events);
        assert!(delivered.iter().all(|e| e.recorded_at_ms > 0), "the store's times, not placeholders");
    }

    #[tokio::test]
    async fn r_box_9_a_read_models_feed_lets_commits_gather_until_a_wait_asks_for_it() {
        // given a lingering feed (a minute, far longer than this test) that has read all
        let store = crate::store::testing::TempDb::new().await;
        let db = &store.db;
        let feeds = FeedSource { linger: Duration::from_secs(60), ..FeedSource::default() };
        let mut feed = feeds.open(db, "view", &["draft"], Cursor::START).await.expect("open");
        assert!(feed.next().await.expect("read").is_empty());
        // when two drafts are committed and nobody waits, then the feed holds back
        for id in ["a", "b"] {
            db.cqrs::<Draft>().execute_new(id, submit(id), HashMap::new()).await.expect("append");
        }
        let mut next = Box::pin(feed.next());
        assert!(tokio::time::timeout(Duration::from_millis(300), &mut next).await.is_err(), "the feed read while nobody waited");
        // when a read-your-writes wait starts, then it reads both at once
        db.wanted(&[]);
        let got = tokio::time::timeout(Duration::from_secs(10), next).await.expect("a wait ends the linger").expect("read");
        assert_eq!(got.iter().map(|d| d.event.aggregate_id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        // and while waits keep coming, the feed reads as soon as the bell rings
        db.cqrs::<Draft>().execute_new("c", submit("c"), HashMap::new()).await.expect("append");
        let got = tokio::time::timeout(Duration::from_secs(10), feed.next()).await.expect("no linger while wanted").expect("read");
        assert_eq!(got.len(), 1);
    }

    #[tokio::test]
    async fn r_box_9_a_feed_read_for_some_types_lingers_through_waits_for_the_others() {
        // given a feed of draft and webhook events that is waited for only on webhooks (the
        // notifier), lingering a minute, that has read all
        let store = crate::store::testing::TempDb::new().await;
        let db = &store.db;
        let feeds = FeedSource { linger: Duration::from_secs(60), waited_for: Some(&["webhook"]), ..FeedSource::default() };
        let mut feed = feeds.open(db, "notifier", &["draft", "webhook"], Cursor::START).await.expect("open");
        assert!(feed.next().await.expect("read").is_empty());
        // when a draft is committed and a wait asks for draft events, then the feed still
        // holds back
        db.cqrs::<Draft>().execute_new("a", submit("a"), HashMap::new()).await.expect("append");
        let mut next = Box::pin(feed.next());
        db.wanted(&["draft"]);
        assert!(tokio::time::timeout(Duration::from_millis(300), &mut next).await.is_err(), "a wait for drafts ended the linger");
        // when a wait asks for webhook events, then it reads at once
        db.waited_on(&["webhook"]);
        let got = tokio::time::timeout(Duration::from_secs(10), next).await.expect("a wait for webhooks ends the linger").expect("read");
        assert_eq!(got.len(), 1);
    }

    #[tokio::test]
    async fn r_arch_6_events_another_process_appends_reach_the_feed_in_order_and_none_is_skipped() {
        // given a feed in this process, and another process on the same store
        let store = crate::store::testing::TempDb::new().await;
        let db = &store.db;
        let other = Db::connect(&Db::sqlite_url(&store.dir)).await.expect("another process");
        let feeds = FeedSource { fallback: Duration::from_millis(50), ..FeedSource::default() };
        let mut feed = feeds.open(db, "view", &["draft"], Cursor::START).await.expect("open");
        // when both append in turns, this process first and last
        db.cqrs::<Draft>().execute_new("mine-1", submit("mine-1"), HashMap::new()).await.expect("append");
        assert_eq!(take(&mut feed, 1).await[0].aggregate_id, "mine-1");
        other.cqrs::<Draft>().execute_new("theirs-1", submit("theirs-1"), HashMap::new()).await.expect("append");
        db.cqrs::<Draft>().execute_new("mine-2", submit("mine-2"), HashMap::new()).await.expect("append");
        // then the feed gets the other process's event before this process's next one
        let ids: Vec<String> = take(&mut feed, 2).await.into_iter().map(|e| e.aggregate_id).collect();
        assert_eq!(ids, ["theirs-1", "mine-2"]);
        // and an event of the other process that nothing of this process follows arrives too
        other.cqrs::<Draft>().execute_new("theirs-2", submit("theirs-2"), HashMap::new()).await.expect("append");
        assert_eq!(take(&mut feed, 1).await[0].aggregate_id, "theirs-2");
        let all = db.read(Cursor::START, &["draft"], 10).await.expect("read").events;
        assert_eq!(all.len(), 4);
    }
}
