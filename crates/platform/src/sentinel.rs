//! The sentinel (R-ARCH-5, R-AUDIT-5): holds every notification on the public event feed
//! (`atasira.box.*.events`) to the store. No atasira consumer applies a notification (they
//! read the store), so a forged one changes nothing; the sentinel makes it visible: a
//! notification for an event the store does not hold, or holds differently, or published
//! on another service's subject, is a `SecurityViolation` of the audit service (at most 10
//! recorded per publisher and minute, the rest counted in the log). Cluster mode only: in
//! embedded mode nothing is published.

use std::time::Duration;

use async_nats::jetstream;
use atasira_contracts::subjects;
use atasira_domain::aggregates::security::SecurityCommand;
use futures::StreamExt as _;
use prost::Message as _;

use crate::Runtime;
use crate::guard::Verdict;
use crate::store::StoredEvent;

/// The durable consumer's configuration: every notification published from now on, each
/// acknowledged. The operator creates it (`atasira nats-setup`); the audit service only
/// reads it (R-ARCH-13).
pub fn consumer_config() -> jetstream::consumer::pull::Config {
    jetstream::consumer::pull::Config {
        durable_name: Some(subjects::SENTINEL_CONSUMER.to_owned()),
        deliver_policy: jetstream::consumer::DeliverPolicy::New,
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ..Default::default()
    }
}

/// Creates the sentinel's consumer on the events stream if it is not there: the
/// operator's half of `atasira nats-setup`. Returns whether it created it.
pub async fn set_up_consumer(stream: &jetstream::stream::Stream) -> anyhow::Result<bool> {
    if stream.get_consumer::<jetstream::consumer::pull::Config>(subjects::SENTINEL_CONSUMER).await.is_ok() {
        return Ok(false);
    }
    stream.create_consumer(consumer_config()).await.map_err(|e| anyhow::anyhow!("cannot create the sentinel's consumer: {e}"))?;
    Ok(true)
}

/// Why a notification does not match the store; `None` when it does.
pub fn mismatch(subject: &str, notification: &atasira_contracts::v1::EventNotification, stored: Option<&StoredEvent>) -> Option<&'static str> {
    let Some(stored) = stored else { return Some("no such event in the store") };
    if subjects::owner_of(&stored.aggregate_type).map(subjects::events).as_deref() != Some(subject) {
        return Some("published on another service's subject");
    }
    let payload: Option<serde_json::Value> = serde_json::from_slice(&notification.payload_json).ok();
    let same = notification.event_type == stored.event_type
        && notification.event_version == stored.event_version
        && notification.position == stored.position
        && notification.recorded_at_unix_ms == stored.recorded_at_ms
        && payload.as_ref() == Some(&stored.payload);
    (!same).then_some("differs from the stored event")
}

/// Runs until shutdown; reconnects after failures.
pub async fn run(rt: Runtime, events: crate::relay::EventsStream, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let result = tokio::select! {
            r = watch(&rt, &events) => r,
            _ = shutdown.changed() => return,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "the sentinel lost the event feed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

async fn watch(rt: &Runtime, events: &crate::relay::EventsStream) -> anyhow::Result<()> {
    let stream = events.lookup().await?;
    let consumer: jetstream::consumer::PullConsumer = stream.get_consumer(subjects::SENTINEL_CONSUMER).await.map_err(|e| {
        anyhow::anyhow!("cannot find the sentinel's consumer ({e}); an operator creates it with `atasira nats-setup --nats-creds <dir>/operator.creds`")
    })?;
    let mut messages = consumer.messages().await.map_err(|e| anyhow::anyhow!("cannot read the event feed: {e}"))?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!("event feed: {e}"))?;
        check(rt, &message.subject, &message.payload).await?;
        message.ack().await.map_err(|e| anyhow::anyhow!("ack failed: {e}"))?;
    }
    Ok(())
}

async fn check(rt: &Runtime, subject: &str, payload: &[u8]) -> anyhow::Result<()> {
    let (reason, event_id) = match atasira_contracts::v1::EventNotification::decode(payload) {
        Ok(n) => {
            let stored = rt.db.event(&n.aggregate_type, &n.aggregate_id, n.sequence).await?;
            (mismatch(subject, &n, stored.as_ref()), n.event_id)
        }
        Err(_) => (Some("not an event notification"), String::new()),
    };
    let Some(reason) = reason else { return Ok(()) };
    // The publisher is the service the subject names (NATS lets only it publish there).
    let publisher = subject.strip_prefix("atasira.box.").and_then(|s| s.strip_suffix(".events")).unwrap_or("unknown").to_owned();
    tracing::warn!(subject, event_id, reason, "forged event notification");
    match rt.guards.violation(&format!("notification:{publisher}"), std::time::Instant::now()) {
        Verdict::Suppress { first } => {
            if first {
                tracing::warn!(publisher, "more forged notifications from this publisher this minute: counted, not recorded");
            }
        }
        Verdict::Record { suppressed } => {
            if suppressed > 0 {
                tracing::warn!(publisher, suppressed, "forged notifications not recorded in the last minute (rate limit)");
            }
            let command = SecurityCommand::Record {
                service: subjects::AUDIT.to_owned(),
                actor: publisher,
                target: event_id.chars().take(128).collect::<String>().escape_debug().to_string(),
                kind: "forged_event_notification".to_owned(),
                reason: format!("{reason} (on {subject})"),
                at: chrono::Utc::now(),
            };
            if let Err(e) = crate::service::record_security_violation(rt, subjects::AUDIT, command).await {
                tracing::error!(error = %e, "could not record a forged event notification");
            }
        }
    }
    Ok(())
}
