//! The audit ledger's signed checkpoints (R-AUDIT-2): the audit service publishes the
//! latest `(seq, head MAC)` as an event every minute and on shutdown, so a removed tail of
//! ledger rows is detected against the event store. One aggregate, id [`LEDGER_ID`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;

pub const LEDGER_ID: &str = "ledger";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditLedger {
    /// The last checkpointed sequence number.
    pub last_seq: i64,
}

#[derive(Debug, Clone)]
pub enum AuditCommand {
    /// `mac` is the HMAC (by key `key_id`) over the checkpoint's canonical bytes.
    Checkpoint { seq: i64, head_mac: String, key_id: String, mac: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AuditEvent {
    AuditCheckpoint { seq: i64, head_mac: String, key_id: String, mac: String, at: DateTime<Utc> },
}

impl AuditEvent {
    pub fn name(&self) -> &'static str {
        "AuditCheckpoint"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    /// A checkpoint may not go backwards (a shorter ledger than already checkpointed).
    #[error("checkpoint at seq {seq} is behind the last one ({last})")]
    Backwards { seq: i64, last: i64 },
}

impl AuditLedger {
    pub fn decide(&self, command: AuditCommand) -> Result<Vec<AuditEvent>, AuditError> {
        let AuditCommand::Checkpoint { seq, head_mac, key_id, mac, at } = command;
        if seq < self.last_seq {
            return Err(AuditError::Backwards { seq, last: self.last_seq });
        }
        if seq == self.last_seq && seq != 0 {
            // Nothing new since the last checkpoint.
            return Ok(vec![]);
        }
        Ok(vec![AuditEvent::AuditCheckpoint { seq, head_mac, key_id, mac, at }])
    }

    pub fn evolve(&mut self, event: AuditEvent) {
        let AuditEvent::AuditCheckpoint { seq, .. } = event;
        self.last_seq = seq;
    }
}

aggregate_via_decide!(AuditLedger, super::types::AUDIT_LEDGER, AuditCommand, AuditEvent, AuditError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn cp(seq: i64) -> AuditCommand {
        AuditCommand::Checkpoint { seq, head_mac: "m".into(), key_id: "k".into(), mac: "x".into(), at: Utc::now() }
    }

    #[test]
    fn checkpoints_move_forward_only() {
        // R-AUDIT-2
        let first = given_when::<AuditLedger>(vec![], cp(5)).expect("recorded");
        assert_eq!(first[0].name(), "AuditCheckpoint");
        assert_eq!(given_when::<AuditLedger>(first.clone(), cp(5)), Ok(vec![]), "nothing new");
        assert_eq!(given_when::<AuditLedger>(first.clone(), cp(3)), Err(AuditError::Backwards { seq: 3, last: 5 }));
        assert_eq!(given_when::<AuditLedger>(first, cp(9)).map(|e| e.len()), Ok(1));
    }
}
