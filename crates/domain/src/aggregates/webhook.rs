//! Webhooks approvers' announcements go to (R-NOTIFY-1), one stream per webhook, appended
//! by the audit service: registered and removed by human admins, and every delivery the
//! notifier gave up on (dead-lettered), so a lost announcement is a ledger row.
//!
//! The secret that signs deliveries is never in an event: it is derived from the audit key
//! named by `key_id` and the webhook id, and shown once, to the admin who registers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;

/// The format of a webhook's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The announcement as JSON, the link made absolute.
    Json,
    /// A Slack-compatible incoming-webhook body (`{"text": ...}`), which Slack, Mattermost,
    /// Rocket.Chat and Microsoft Teams' Slack-compatible hooks accept.
    Slack,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Slack => "slack",
        }
    }

    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "json" => Some(Format::Json),
            "slack" => Some(Format::Slack),
            _ => None,
        }
    }
}

/// Prefix of a webhook's id.
pub const WEBHOOK_ID_PREFIX: &str = "whk_";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    pub webhook_id: String,
    pub registered: bool,
    pub removed: bool,
}

#[derive(Debug, Clone)]
pub enum WebhookCommand {
    Register {
        webhook_id: String,
        url: String,
        format: Format,
        /// The announcement kinds it gets (`notify::KINDS`); empty for all.
        kinds: Vec<String>,
        /// The audit key its secret is derived from.
        key_id: String,
        by: String,
        at: DateTime<Utc>,
    },
    Remove {
        by: String,
        at: DateTime<Utc>,
    },
    DeadLetter {
        delivery_id: String,
        /// The announced event.
        event_id: String,
        kind: String,
        attempts: u32,
        last_error: String,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WebhookEvent {
    WebhookRegistered {
        webhook_id: String,
        url: String,
        format: Format,
        kinds: Vec<String>,
        key_id: String,
        registered_by: String,
        at: DateTime<Utc>,
    },
    WebhookRemoved {
        webhook_id: String,
        removed_by: String,
        at: DateTime<Utc>,
    },
    WebhookDeliveryDeadLettered {
        webhook_id: String,
        delivery_id: String,
        event_id: String,
        kind: String,
        attempts: u32,
        last_error: String,
        at: DateTime<Utc>,
    },
}

impl WebhookEvent {
    pub fn name(&self) -> &'static str {
        match self {
            WebhookEvent::WebhookRegistered { .. } => "WebhookRegistered",
            WebhookEvent::WebhookRemoved { .. } => "WebhookRemoved",
            WebhookEvent::WebhookDeliveryDeadLettered { .. } => "WebhookDeliveryDeadLettered",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("a webhook with this id was registered already")]
    AlreadyRegistered,
    #[error("no such webhook")]
    NotFound,
}

impl crate::Refusing for WebhookError {
    fn error_code(&self) -> crate::ErrorCode {
        match self {
            WebhookError::AlreadyRegistered => crate::ErrorCode::Conflict,
            WebhookError::NotFound => crate::ErrorCode::NotFound,
        }
    }
}

impl Webhook {
    /// Registered once; removed once (a second removal adds nothing); a dead letter only of
    /// a registered webhook (one removed since still records what it lost).
    pub fn decide(&self, command: WebhookCommand) -> Result<Vec<WebhookEvent>, WebhookError> {
        match command {
            WebhookCommand::Register { .. } if self.registered => Err(WebhookError::AlreadyRegistered),
            WebhookCommand::Register { webhook_id, url, format, kinds, key_id, by, at } => {
                Ok(vec![WebhookEvent::WebhookRegistered { webhook_id, url, format, kinds, key_id, registered_by: by, at }])
            }
            _ if !self.registered => Err(WebhookError::NotFound),
            WebhookCommand::Remove { .. } if self.removed => Ok(vec![]),
            WebhookCommand::Remove { by, at } => Ok(vec![WebhookEvent::WebhookRemoved { webhook_id: self.webhook_id.clone(), removed_by: by, at }]),
            WebhookCommand::DeadLetter { delivery_id, event_id, kind, attempts, last_error, at } => Ok(vec![WebhookEvent::WebhookDeliveryDeadLettered {
                webhook_id: self.webhook_id.clone(),
                delivery_id,
                event_id,
                kind,
                attempts,
                last_error,
                at,
            }]),
        }
    }

    pub fn evolve(&mut self, event: WebhookEvent) {
        match event {
            WebhookEvent::WebhookRegistered { webhook_id, .. } => {
                self.webhook_id = webhook_id;
                self.registered = true;
            }
            WebhookEvent::WebhookRemoved { .. } => self.removed = true,
            WebhookEvent::WebhookDeliveryDeadLettered { .. } => {}
        }
    }
}

aggregate_via_decide!(Webhook, super::types::WEBHOOK, WebhookCommand, WebhookEvent, WebhookError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn register() -> WebhookCommand {
        WebhookCommand::Register {
            webhook_id: "whk_1".into(),
            url: "https://hooks.example/a".into(),
            format: Format::Json,
            kinds: vec![],
            key_id: "k1".into(),
            by: "alice".into(),
            at: Utc::now(),
        }
    }

    #[test]
    fn r_notify_1_a_webhook_is_registered_once_removed_once_and_its_losses_recorded() {
        let registered = given_when::<Webhook>(vec![], register()).expect("registered");
        assert_eq!(registered[0].name(), "WebhookRegistered");
        assert_eq!(given_when::<Webhook>(registered.clone(), register()), Err(WebhookError::AlreadyRegistered));
        let dead = WebhookCommand::DeadLetter {
            delivery_id: "dlv_1".into(),
            event_id: "draft/d1/1".into(),
            kind: "draft.pending".into(),
            attempts: 3,
            last_error: "HTTP 500".into(),
            at: Utc::now(),
        };
        assert_eq!(given_when::<Webhook>(vec![], dead.clone()), Err(WebhookError::NotFound));
        assert_eq!(given_when::<Webhook>(registered.clone(), dead).expect("recorded")[0].name(), "WebhookDeliveryDeadLettered");
        let removed = given_when::<Webhook>(registered.clone(), WebhookCommand::Remove { by: "bob".into(), at: Utc::now() }).expect("removed");
        let all: Vec<WebhookEvent> = registered.into_iter().chain(removed).collect();
        assert_eq!(given_when::<Webhook>(all, WebhookCommand::Remove { by: "bob".into(), at: Utc::now() }), Ok(vec![]));
        assert_eq!(given_when::<Webhook>(vec![], WebhookCommand::Remove { by: "bob".into(), at: Utc::now() }), Err(WebhookError::NotFound));
    }
}
