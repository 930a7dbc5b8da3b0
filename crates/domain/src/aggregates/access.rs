//! Provisioning outcomes (R-PROV-1): one aggregate per `(box_id, required_access index)`,
//! id `<box_id>/<index>`. Each attempt's final outcome is an event shown on the Box; a
//! failure never touches the Box itself.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Access {
    /// `Some(true)` once provisioned, `Some(false)` after a recorded failure.
    pub outcome: Option<bool>,
}

#[derive(Debug, Clone)]
pub enum AccessCommand {
    Provisioned { box_id: String, box_type: String, index: u32, access: String, detail: String, attempts: u32, at: DateTime<Utc> },
    Failed { box_id: String, box_type: String, index: u32, access: String, reason: String, attempts: u32, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AccessEvent {
    AccessProvisioned { box_id: String, box_type: String, index: u32, access: String, detail: String, attempts: u32, at: DateTime<Utc> },
    AccessProvisionFailed { box_id: String, box_type: String, index: u32, access: String, reason: String, attempts: u32, at: DateTime<Utc> },
}

impl AccessEvent {
    pub fn name(&self) -> &'static str {
        match self {
            AccessEvent::AccessProvisioned { .. } => "AccessProvisioned",
            AccessEvent::AccessProvisionFailed { .. } => "AccessProvisionFailed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("this access is provisioned already")]
    AlreadyProvisioned,
}

impl crate::Refusing for AccessError {
    fn error_code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Conflict
    }
}

impl Access {
    /// Idempotent: a success is final; a repeated failure after a failure adds nothing; a
    /// success after a failure (a later retry worked) is recorded.
    pub fn decide(&self, command: AccessCommand) -> Result<Vec<AccessEvent>, AccessError> {
        match (self.outcome, command) {
            (Some(true), _) => Ok(vec![]),
            (_, AccessCommand::Provisioned { box_id, box_type, index, access, detail, attempts, at }) => {
                Ok(vec![AccessEvent::AccessProvisioned { box_id, box_type, index, access, detail, attempts, at }])
            }
            (Some(false), AccessCommand::Failed { .. }) => Ok(vec![]),
            (None, AccessCommand::Failed { box_id, box_type, index, access, reason, attempts, at }) => {
                Ok(vec![AccessEvent::AccessProvisionFailed { box_id, box_type, index, access, reason, attempts, at }])
            }
        }
    }

    pub fn evolve(&mut self, event: AccessEvent) {
        self.outcome = Some(matches!(event, AccessEvent::AccessProvisioned { .. }));
    }
}

aggregate_via_decide!(Access, super::types::ACCESS, AccessCommand, AccessEvent, AccessError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn failed() -> AccessCommand {
        AccessCommand::Failed {
            box_id: "b".into(),
            box_type: "t".into(),
            index: 0,
            access: "git_remote x".into(),
            reason: "unreachable".into(),
            attempts: 5,
            at: Utc::now(),
        }
    }
    fn ok() -> AccessCommand {
        AccessCommand::Provisioned {
            box_id: "b".into(),
            box_type: "t".into(),
            index: 0,
            access: "git_remote x".into(),
            detail: "cloned".into(),
            attempts: 1,
            at: Utc::now(),
        }
    }

    #[test]
    fn outcomes_are_recorded_once_and_a_later_success_wins() {
        // R-PROV-1: each outcome an event; idempotent
        let f = given_when::<Access>(vec![], failed()).expect("failure recorded");
        assert_eq!(f[0].name(), "AccessProvisionFailed");
        assert_eq!(given_when::<Access>(f.clone(), failed()), Ok(vec![]));
        let s = given_when::<Access>(f.clone(), ok()).expect("success recorded");
        assert_eq!(s[0].name(), "AccessProvisioned");
        let all: Vec<AccessEvent> = f.into_iter().chain(s).collect();
        assert_eq!(given_when::<Access>(all, ok()), Ok(vec![]));
    }
}
