//! A Box's notifications as delivered (R-NOTIFY-1): one stream per notification (its id
//! from `WorkerNotificationRequested`), appended by the audit service, which sends them.
//! Each outcome is a ledger row: sent, failed after the attempts allowed, or refused (the
//! grant or the operator's configuration does not allow it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Its outcome is recorded (once).
    pub ended: bool,
}

#[derive(Debug, Clone)]
pub enum NotificationCommand {
    Sent { notification_id: String, worker_id: String, channel: String, to: Vec<String>, attempts: u32, at: DateTime<Utc> },
    Failed { notification_id: String, worker_id: String, channel: String, attempts: u32, last_error: String, at: DateTime<Utc> },
    Refused { notification_id: String, worker_id: String, channel: String, reason: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NotificationEvent {
    NotificationSent { notification_id: String, worker_id: String, channel: String, to: Vec<String>, attempts: u32, at: DateTime<Utc> },
    NotificationFailed { notification_id: String, worker_id: String, channel: String, attempts: u32, last_error: String, at: DateTime<Utc> },
    NotificationRefused { notification_id: String, worker_id: String, channel: String, reason: String, at: DateTime<Utc> },
}

impl NotificationEvent {
    pub fn name(&self) -> &'static str {
        match self {
            NotificationEvent::NotificationSent { .. } => "NotificationSent",
            NotificationEvent::NotificationFailed { .. } => "NotificationFailed",
            NotificationEvent::NotificationRefused { .. } => "NotificationRefused",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotificationError {}

impl crate::Refusing for NotificationError {
    fn error_code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Conflict
    }
}

impl Notification {
    /// One outcome per notification: a second (a retried sender) adds nothing.
    pub fn decide(&self, command: NotificationCommand) -> Result<Vec<NotificationEvent>, NotificationError> {
        if self.ended {
            return Ok(vec![]);
        }
        Ok(vec![match command {
            NotificationCommand::Sent { notification_id, worker_id, channel, to, attempts, at } => {
                NotificationEvent::NotificationSent { notification_id, worker_id, channel, to, attempts, at }
            }
            NotificationCommand::Failed { notification_id, worker_id, channel, attempts, last_error, at } => {
                NotificationEvent::NotificationFailed { notification_id, worker_id, channel, attempts, last_error, at }
            }
            NotificationCommand::Refused { notification_id, worker_id, channel, reason, at } => {
                NotificationEvent::NotificationRefused { notification_id, worker_id, channel, reason, at }
            }
        }])
    }

    pub fn evolve(&mut self, _event: NotificationEvent) {
        self.ended = true;
    }
}

aggregate_via_decide!(Notification, super::types::NOTIFICATION, NotificationCommand, NotificationEvent, NotificationError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    #[test]
    fn r_notify_1_a_notification_has_one_outcome() {
        let sent = NotificationCommand::Sent {
            notification_id: "ntf_1".into(),
            worker_id: "wkr_1".into(),
            channel: "email".into(),
            to: vec!["ops@example.com".into()],
            attempts: 1,
            at: Utc::now(),
        };
        let events = given_when::<Notification>(vec![], sent.clone()).expect("sent");
        assert_eq!(events[0].name(), "NotificationSent");
        assert_eq!(given_when::<Notification>(events, sent), Ok(vec![]));
    }
}
