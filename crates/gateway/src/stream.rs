//! Live updates (R-UI-1): `GET /api/v1/events/stream` tells a signed-in client, as
//! server-sent events, that the read models changed, so the dashboard re-reads what it
//! shows instead of polling.
//!
//! One task per gateway watches the store's appended bell (a commit in this process, or in
//! PostgreSQL any commit, by `LISTEN`). While someone listens, it reads the new events from
//! the store in commit order, waits for the read models (drafts, runtime registry, audit)
//! to apply them, exactly as a write's read-your-writes wait does, and then announces
//! `{"position", "topics"}`: a read right after the announcement sees the change. No payload travels: each client re-reads over
//! REST, where its token decides what it may see. A stream ends after [`MAX_STREAM_LIFE`]
//! (the client reconnects, so a revoked token stops being served) and when the gateway
//! shuts down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use atasira_domain::ErrorCode;
use atasira_domain::aggregates::types;
use atasira_platform::store::Cursor;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde_json::json;
use tokio::sync::{broadcast, watch};

use crate::api::{self, StreamTopic};
use crate::extract::Caller;
use crate::{ApiError, AppState};

/// How long one stream stays open before the client must reconnect (and authenticate again).
pub const MAX_STREAM_LIFE: Duration = Duration::from_secs(300);

/// How often an idle stream sends a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The announcements of one gateway: a broadcast of changes, where the announcer reads
/// the store from (`None` while no one listens) and the shutdown signal.
#[derive(Debug)]
pub(crate) struct Live {
    changes: broadcast::Sender<api::StreamChange>,
    cursor: tokio::sync::Mutex<Option<Cursor>>,
    closing: watch::Sender<bool>,
    /// Open streams, per user and in all (R-ARCH-15).
    open: Arc<atasira_platform::guard::ClientBudget>,
}

/// Streams one user may hold open at once (a dashboard holds one per tab).
pub const STREAMS_PER_USER: usize = 8;

/// Streams one gateway holds open at once.
pub const STREAMS_IN_ALL: usize = 1024;

/// How often the announcer looks at the store without a bell.
const SAFETY_NET: Duration = Duration::from_secs(2);

/// Events read (and waited for) per announcement at most.
const BATCH: i64 = 256;

impl Live {
    pub(crate) fn new() -> Arc<Live> {
        Arc::new(Live {
            changes: broadcast::channel(64).0,
            cursor: tokio::sync::Mutex::new(None),
            closing: watch::channel(false).0,
            open: Arc::new(atasira_platform::guard::ClientBudget::new(STREAMS_IN_ALL, STREAMS_PER_USER)),
        })
    }

    /// Ends every open stream (the gateway is shutting down; open streams would hold its
    /// graceful shutdown).
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    /// A new listener: its receiver and the position it starts after. Under the cursor's
    /// lock, so the announcer reads on from exactly there (nothing after it is missed).
    async fn subscribe(&self, db: &atasira_platform::store::Db) -> anyhow::Result<(broadcast::Receiver<api::StreamChange>, i64)> {
        let mut cursor = self.cursor.lock().await;
        let at = match *cursor {
            Some(c) => c,
            None => db.head_cursor().await?,
        };
        *cursor = Some(at);
        Ok((self.changes.subscribe(), at.position))
    }
}

/// The topics a commit of `aggregate_type` concerns. Every event is also an audit row.
fn topics_of(aggregate_type: &str) -> &'static [StreamTopic] {
    match aggregate_type {
        types::DRAFT => &[StreamTopic::Drafts, StreamTopic::Boxes, StreamTopic::Audit],
        types::BOX | types::ACCESS | types::BOX_TYPE_NAMESPACE | types::CONFIG_BUNDLE => &[StreamTopic::Boxes, StreamTopic::Audit],
        types::WORKER | types::EXECUTION_BINDING => &[StreamTopic::Workers, StreamTopic::Audit],
        _ => &[StreamTopic::Audit],
    }
}

/// Watches the appended bell; while someone listens, reads what was appended (the
/// consumers' gap-safe read), waits for the read models to apply those events, and
/// announces them. While no one listens it reads nothing.
pub(crate) async fn announce(state: AppState, live: Arc<Live>) {
    let mut bell = state.rt.db.on_append();
    let mut closing = live.closing.subscribe();
    loop {
        tokio::select! {
            changed = bell.changed() => if changed.is_err() { return },
            _ = closing.wait_for(|c| *c) => return,
            // The safety net, as the feeds have it: writes of other processes ring no bell
            // in SQLite. Reads nothing while no one listens.
            _ = tokio::time::sleep(SAFETY_NET) => {}
        }
        bell.borrow_and_update();
        loop {
            let mut cursor = live.cursor.lock().await;
            if live.changes.receiver_count() == 0 {
                *cursor = None;
                break;
            }
            let Some(after) = *cursor else { break };
            let batch = match state.rt.db.read(after, &[], BATCH).await {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "live updates: cannot read the store; trying again at the next commit");
                    break;
                }
            };
            let Some(last) = batch.events.last() else { break };
            *cursor = Some(last.cursor());
            drop(cursor);
            let mut topics: Vec<StreamTopic> = batch.events.iter().flat_map(|e| topics_of(&e.aggregate_type)).copied().collect();
            topics.sort();
            topics.dedup();
            let ids: Vec<String> = batch.events.iter().map(|e| e.event_id.clone()).collect();
            let position = last.position;
            state.wait_for(position, &ids).await;
            let _ = live.changes.send(api::StreamChange { position, topics });
            if (batch.events.len() as i64) < BATCH {
                break;
            }
        }
    }
}

/// Live updates for the dashboard: `ready` once, then `changed` whenever the read models
/// applied new events (`{"position", "topics"}`, no payloads: re-read over REST). The
/// stream closes after 5 minutes; reconnect to go on.
#[utoipa::path(get, path = "/api/v1/events/stream", tag = "live",
    responses(
        (status = 200, description = "Server-sent events, each with a `StreamChange`: `event: ready` first (every topic, as of `position`: read what you show once), then `event: changed` each time the read models changed; comments keep the connection open. Ends after 5 minutes: reconnect.",
            content_type = "text/event-stream", body = api::StreamChange),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn stream(State(state): State<AppState>, Caller(principal): Caller) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let live = state.live.clone();
    // Held as long as the stream is open.
    let slot = live.open.enter(&principal.user_id).ok_or_else(|| {
        ApiError::new(ErrorCode::RateLimited, format!("{} holds as many event streams open as it may ({STREAMS_PER_USER}); close one", principal.user_id))
            .with_details(Some(json!({"retry_after_seconds": 1})))
    })?;
    let (receiver, head) = live.subscribe(&state.rt.db).await.map_err(ApiError::internal)?;
    let closing = live.closing.subscribe();
    // The first event has the documented shape too: every view, as of `head`, for a client
    // that (re)connects may have missed anything.
    let ready = Event::default()
        .event("ready")
        .data(serde_json::to_string(&api::StreamChange { position: head, topics: StreamTopic::ALL.to_vec() }).unwrap_or_default());
    let deadline = tokio::time::Instant::now() + MAX_STREAM_LIFE;
    let changes = futures::stream::unfold((receiver, closing, slot), move |(mut receiver, mut closing, slot)| async move {
        let next = tokio::select! {
            next = receiver.recv() => next,
            _ = closing.wait_for(|c| *c) => return None,
            _ = tokio::time::sleep_until(deadline) => return None,
        };
        let change = match next {
            Ok(change) => change,
            // This client fell behind: everything may have changed.
            Err(broadcast::error::RecvError::Lagged(_)) => api::StreamChange { position: 0, topics: StreamTopic::ALL.to_vec() },
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        let event = Event::default().event("changed").data(serde_json::to_string(&change).unwrap_or_default());
        Some((Ok(event), (receiver, closing, slot)))
    });
    let events = futures::StreamExt::chain(futures::stream::once(async move { Ok(ready) }), changes);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_aggregate_type_concerns_the_audit_ledger_and_drafts_concern_the_pending_list() {
        for t in types::ALL {
            assert!(topics_of(t).contains(&StreamTopic::Audit), "{t}");
        }
        assert!(topics_of(types::DRAFT).contains(&StreamTopic::Drafts));
        // An approval activates a Box: the Boxes view refreshes on the draft's decision too.
        assert!(topics_of(types::DRAFT).contains(&StreamTopic::Boxes));
        assert!(topics_of(types::WORKER).contains(&StreamTopic::Workers));
    }
}
