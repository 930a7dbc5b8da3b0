//! One durable-consumer abstraction (R-ARCH-7): a feed hands out events after a position,
//! each delivery acked only after its effect committed; unacked work is delivered again.
//! Embedded mode feeds from the SQLite event store by position; cluster mode from a
//! JetStream durable pull consumer (events published by the outbox relay).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use prost::Message as _;

use crate::db::{Db, StoredEvent};

/// Where feeds come from.
#[derive(Clone)]
pub enum FeedSource {
    /// Embedded: read the shared store; `wake` is notified after local commits so feeds do
    /// not wait for the next poll.
    Store { wake: Arc<tokio::sync::Notify> },
    /// Cluster: JetStream.
    JetStream { js: jetstream::Context },
}

impl std::fmt::Debug for FeedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FeedSource::Store { .. } => "FeedSource::Store",
            FeedSource::JetStream { .. } => "FeedSource::JetStream",
        })
    }
}

/// One event handed to a consumer; `ack` after the effect committed.
#[derive(Debug)]
pub struct Delivery {
    pub event: StoredEvent,
    ack: Option<jetstream::Message>,
}

impl Delivery {
    pub async fn ack(self) -> anyhow::Result<()> {
        if let Some(msg) = self.ack {
            msg.ack().await.map_err(|e| anyhow::anyhow!("ack failed: {e}"))?;
        }
        Ok(())
    }
}

/// An open feed for one consumer.
pub enum Feed {
    Store { db: Db, wake: Arc<tokio::sync::Notify>, types: Vec<String>, position: i64 },
    JetStream { consumer: jetstream::consumer::PullConsumer, types: Vec<String> },
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Feed")
    }
}

impl FeedSource {
    /// Opens the durable feed `name` for events of `aggregate_types`, starting after
    /// `position` (the consumer's own checkpoint).
    pub async fn open(&self, db: &Db, name: &str, aggregate_types: &[&str], position: i64) -> anyhow::Result<Feed> {
        let types: Vec<String> = aggregate_types.iter().map(|s| s.to_string()).collect();
        let owners = aggregate_types
            .iter()
            .map(|t| atasira_contracts::subjects::owner_of(t).ok_or_else(|| anyhow::anyhow!("feed {name}: {t:?} is not an aggregate type")))
            .collect::<anyhow::Result<std::collections::BTreeSet<_>>>()?;
        match self {
            FeedSource::Store { wake } => Ok(Feed::Store { db: db.clone(), wake: wake.clone(), types, position }),
            FeedSource::JetStream { js } => {
                let stream = ensure_stream(js).await?;
                let subjects: Vec<String> = owners.into_iter().map(atasira_contracts::subjects::events).collect();
                let consumer = stream
                    .get_or_create_consumer(
                        name,
                        jetstream::consumer::pull::Config {
                            durable_name: Some(name.to_owned()),
                            filter_subjects: subjects,
                            ack_policy: jetstream::consumer::AckPolicy::Explicit,
                            ack_wait: Duration::from_secs(30),
                            ..Default::default()
                        },
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot create consumer {name}: {e}"))?;
                Ok(Feed::JetStream { consumer, types })
            }
        }
    }
}

/// The events stream (idempotent).
pub async fn ensure_stream(js: &jetstream::Context) -> anyhow::Result<jetstream::stream::Stream> {
    js.get_or_create_stream(jetstream::stream::Config {
        name: atasira_contracts::subjects::EVENTS_STREAM.to_owned(),
        subjects: vec![atasira_contracts::subjects::EVENTS_WILDCARD.to_owned()],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("cannot create the events stream: {e}"))
}

/// Decodes a relayed event.
pub fn decode_notification(bytes: &[u8]) -> anyhow::Result<StoredEvent> {
    let n = atasira_contracts::v1::EventNotification::decode(bytes)?;
    Ok(StoredEvent {
        event_id: n.event_id,
        aggregate_type: n.aggregate_type,
        aggregate_id: n.aggregate_id,
        sequence: n.sequence,
        position: n.position,
        event_type: n.event_type,
        event_version: n.event_version,
        payload: serde_json::from_slice(&n.payload_json)?,
        metadata: serde_json::to_value(n.metadata)?,
        recorded_at_ms: n.recorded_at_unix_ms,
    })
}

/// Encodes an event for the bus.
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

impl Feed {
    /// The next batch (possibly empty after waiting a little).
    pub async fn next(&mut self) -> anyhow::Result<Vec<Delivery>> {
        match self {
            Feed::Store { db, wake, types, position } => {
                let refs: Vec<&str> = types.iter().map(String::as_str).collect();
                let events = db.events_after(*position, &refs, 256).await?;
                if events.is_empty() {
                    let _ = tokio::time::timeout(Duration::from_millis(250), wake.notified()).await;
                    return Ok(vec![]);
                }
                if let Some(last) = events.last() {
                    *position = last.position;
                }
                Ok(events.into_iter().map(|event| Delivery { event, ack: None }).collect())
            }
            Feed::JetStream { consumer, types } => {
                let mut batch = consumer
                    .fetch()
                    .max_messages(256)
                    .expires(Duration::from_millis(500))
                    .messages()
                    .await
                    .map_err(|e| anyhow::anyhow!("fetch failed: {e}"))?;
                let mut out = Vec::new();
                while let Some(msg) = batch.next().await {
                    let msg = msg.map_err(|e| anyhow::anyhow!("fetch failed: {e}"))?;
                    let event = match decode_notification(&msg.payload) {
                        Ok(e) => e,
                        Err(e) => {
                            // Not ours to understand: ack so it is not redelivered forever.
                            tracing::warn!(error = %e, "undecodable event notification");
                            let _ = msg.ack().await;
                            continue;
                        }
                    };
                    if !types.contains(&event.aggregate_type) {
                        let _ = msg.ack().await;
                        continue;
                    }
                    out.push(Delivery { event, ack: Some(msg) });
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_feed_of_a_type_that_is_no_aggregate_is_refused_not_routed_anywhere() {
        let dir = std::env::temp_dir().join(format!("atasira-feed-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let db = Db::connect(&Db::sqlite_url(&dir)).await.expect("db");
        let feeds = FeedSource::Store { wake: std::sync::Arc::new(tokio::sync::Notify::new()) };
        let Err(refused) = feeds.open(&db, "typo", &["draft", "drafts"], 0).await else { panic!("a feed of \"drafts\" was opened") };
        assert!(refused.to_string().contains("\"drafts\" is not an aggregate type"), "{refused}");
        assert!(feeds.open(&db, "fine", &["draft", "box"], 0).await.is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
