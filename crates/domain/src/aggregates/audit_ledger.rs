//! The audit ledger's signed checkpoints (R-AUDIT-2): the audit service records the
//! latest `(seq, head MAC)` as an event every minute and on shutdown, so a removed tail of
//! ledger rows is detected against the event store. Each checkpoint names the one before it
//! (its seq and MAC, covered by its own MAC): the checkpoints form a chain, and the
//! aggregate refuses a checkpoint that does not continue it. One aggregate, id [`LEDGER_ID`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;

pub const LEDGER_ID: &str = "ledger";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditLedger {
    /// The last checkpointed sequence number (0 before the first checkpoint).
    pub last_seq: i64,
    /// The head MAC of the last checkpoint (empty before the first).
    pub last_head_mac: String,
    /// The MAC of the last checkpoint (empty before the first): the next one's `prev_mac`.
    pub last_mac: String,
}

#[derive(Debug, Clone)]
pub enum AuditCommand {
    /// `mac` is the HMAC (by key `key_id`) over the checkpoint's canonical bytes, which
    /// include `prev_seq` and `prev_mac`, the last checkpoint's seq and MAC (0 and empty for
    /// the first checkpoint).
    Checkpoint { seq: i64, head_mac: String, prev_seq: i64, prev_mac: String, key_id: String, mac: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AuditEvent {
    AuditCheckpoint { seq: i64, head_mac: String, prev_seq: i64, prev_mac: String, key_id: String, mac: String, at: DateTime<Utc> },
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
    /// A checkpoint must name the last one (its seq and MAC).
    #[error("checkpoint at seq {seq} follows seq {prev_seq}, but the last checkpoint is at seq {last}")]
    Unlinked { seq: i64, prev_seq: i64, last: i64 },
}

/// Another checkpointer went first: never a request's refusal.
impl crate::Refusing for AuditError {
    fn error_code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Conflict
    }
}

impl AuditLedger {
    pub fn decide(&self, command: AuditCommand) -> Result<Vec<AuditEvent>, AuditError> {
        let AuditCommand::Checkpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, at } = command;
        if seq < self.last_seq {
            return Err(AuditError::Backwards { seq, last: self.last_seq });
        }
        if seq == self.last_seq && seq != 0 {
            // Nothing new since the last checkpoint.
            return Ok(vec![]);
        }
        if prev_seq != self.last_seq || prev_mac != self.last_mac {
            return Err(AuditError::Unlinked { seq, prev_seq, last: self.last_seq });
        }
        Ok(vec![AuditEvent::AuditCheckpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, at }])
    }

    pub fn evolve(&mut self, event: AuditEvent) {
        let AuditEvent::AuditCheckpoint { seq, head_mac, mac, .. } = event;
        self.last_seq = seq;
        self.last_head_mac = head_mac;
        self.last_mac = mac;
    }
}

aggregate_via_decide!(AuditLedger, super::types::AUDIT_LEDGER, AuditCommand, AuditEvent, AuditError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn cp(seq: i64, prev_seq: i64, prev_mac: &str) -> AuditCommand {
        AuditCommand::Checkpoint {
            seq,
            head_mac: format!("head-{seq}"),
            prev_seq,
            prev_mac: prev_mac.into(),
            key_id: "k".into(),
            mac: format!("mac-{seq}"),
            at: Utc::now(),
        }
    }

    #[test]
    fn checkpoints_move_forward_only() {
        // R-AUDIT-2
        let first = given_when::<AuditLedger>(vec![], cp(5, 0, "")).expect("recorded");
        assert_eq!(first[0].name(), "AuditCheckpoint");
        assert_eq!(given_when::<AuditLedger>(first.clone(), cp(5, 5, "mac-5")), Ok(vec![]), "nothing new");
        assert_eq!(given_when::<AuditLedger>(first.clone(), cp(3, 5, "mac-5")), Err(AuditError::Backwards { seq: 3, last: 5 }));
        assert_eq!(given_when::<AuditLedger>(first, cp(9, 5, "mac-5")).map(|e| e.len()), Ok(1));
    }

    #[test]
    fn r_audit_2_each_checkpoint_continues_the_last_one() {
        // given no checkpoint; when the first names a previous one; then refused
        assert_eq!(given_when::<AuditLedger>(vec![], cp(5, 3, "mac-3")), Err(AuditError::Unlinked { seq: 5, prev_seq: 3, last: 0 }));
        // given a checkpoint at 5; when the next names another seq or mac, or none; then refused
        let first = given_when::<AuditLedger>(vec![], cp(5, 0, "")).expect("recorded");
        for (prev_seq, prev_mac) in [(4, "mac-5"), (5, "mac-4"), (0, "")] {
            assert_eq!(given_when::<AuditLedger>(first.clone(), cp(9, prev_seq, prev_mac)), Err(AuditError::Unlinked { seq: 9, prev_seq, last: 5 }));
        }
        // when it names the last one; then it is recorded with its link
        let next = given_when::<AuditLedger>(first.clone(), cp(9, 5, "mac-5")).expect("recorded");
        assert!(matches!(&next[0], AuditEvent::AuditCheckpoint { seq: 9, prev_seq: 5, prev_mac, .. } if prev_mac == "mac-5"));
        // and the state remembers the last checkpoint's head and mac
        let mut state = AuditLedger::default();
        for e in first.into_iter().chain(next) {
            state.evolve(e);
        }
        assert_eq!(state, AuditLedger { last_seq: 9, last_head_mac: "head-9".into(), last_mac: "mac-9".into() });
    }
}
