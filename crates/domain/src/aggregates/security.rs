//! Security violations (R-AUDIT-5): a refusal the spec calls a security violation is
//! recorded as an event by the service that refused, so that the audit ledger gets a row
//! like for any other event. One aggregate per violation; the aggregate type names the
//! refusing service (`approval_security`, `registry_security`, `drafts_security`,
//! `audit_security`, `provisioner_security`) so each service appends only its own
//! aggregate types. The gateway appends nothing: it verifies no assertions.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecurityViolationRecord {
    pub recorded: bool,
}

#[derive(Debug, Clone)]
pub enum SecurityCommand {
    Record { service: String, actor: String, target: String, kind: String, reason: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SecurityEvent {
    SecurityViolation {
        /// The refusing service.
        service: String,
        /// Who tried.
        actor: String,
        /// What it was aimed at (draft id, box id).
        target: String,
        /// `self_approval`, `mentor_edit_prohibited_key`, `invalid_approval_token`,
        /// `unrecorded_approval` (a `DraftApproved` the draft's stream does not hold),
        /// `invalid_assertion`.
        /// For `invalid_assertion`, `actor` is the sender its subject names, `target` the
        /// subject, and `reason` the refusal's code with the claimed principal and key id
        /// (never the MAC).
        kind: String,
        reason: String,
        at: DateTime<Utc>,
    },
}

impl SecurityEvent {
    pub fn name(&self) -> &'static str {
        "SecurityViolation"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    #[error("this violation is already recorded")]
    AlreadyRecorded,
}

impl SecurityError {
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            SecurityError::AlreadyRecorded => crate::ErrorCode::Conflict,
        }
    }
}

impl SecurityViolationRecord {
    pub fn decide(&self, command: SecurityCommand) -> Result<Vec<SecurityEvent>, SecurityError> {
        if self.recorded {
            // Redelivered: the one violation is already on record.
            return Ok(vec![]);
        }
        let SecurityCommand::Record { service, actor, target, kind, reason, at } = command;
        Ok(vec![SecurityEvent::SecurityViolation { service, actor, target, kind, reason, at }])
    }

    pub fn evolve(&mut self, _event: SecurityEvent) {
        self.recorded = true;
    }
}

/// The approval service's violations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalSecurity(pub SecurityViolationRecord);
/// The runtime registry's violations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistrySecurity(pub SecurityViolationRecord);
/// The drafts service's violations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DraftsSecurity(pub SecurityViolationRecord);
/// The audit service's violations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditSecurity(pub SecurityViolationRecord);
/// The provisioner's violations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvisionerSecurity(pub SecurityViolationRecord);

impl ApprovalSecurity {
    pub fn decide(&self, c: SecurityCommand) -> Result<Vec<SecurityEvent>, SecurityError> {
        self.0.decide(c)
    }
    pub fn evolve(&mut self, e: SecurityEvent) {
        self.0.evolve(e)
    }
}

aggregate_via_decide!(ApprovalSecurity, super::types::APPROVAL_SECURITY, SecurityCommand, SecurityEvent, SecurityError);

// The security aggregates of the other services: the same record under their own types.
crate::aggregates::record_aggregates!(SecurityCommand, SecurityEvent, SecurityError;
    RegistrySecurity => super::types::REGISTRY_SECURITY,
    DraftsSecurity => super::types::DRAFTS_SECURITY,
    AuditSecurity => super::types::AUDIT_SECURITY,
    ProvisionerSecurity => super::types::PROVISIONER_SECURITY,
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn record() -> SecurityCommand {
        SecurityCommand::Record {
            service: "approval".into(),
            actor: "alice".into(),
            target: "d1".into(),
            kind: "self_approval".into(),
            reason: "r".into(),
            at: Utc::now(),
        }
    }

    #[test]
    fn given_nothing_when_recorded_then_one_security_violation_and_a_redelivery_adds_nothing() {
        // R-AUDIT-5
        let events = given_when::<ApprovalSecurity>(vec![], record()).expect("recorded");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].name(), "SecurityViolation");
        assert_eq!(given_when::<ApprovalSecurity>(events.clone(), record()), Ok(vec![]));
        assert_eq!(given_when::<RegistrySecurity>(vec![], record()).map(|e| e.len()), Ok(1));
        assert_eq!(given_when::<DraftsSecurity>(vec![], record()).map(|e| e.len()), Ok(1));
        assert_eq!(given_when::<AuditSecurity>(vec![], record()).map(|e| e.len()), Ok(1));
        assert_eq!(given_when::<ProvisionerSecurity>(vec![], record()).map(|e| e.len()), Ok(1));
    }
}
