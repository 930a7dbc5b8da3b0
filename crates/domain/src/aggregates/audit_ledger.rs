//! The audit ledger's signed checkpoints (R-AUDIT-2): the audit service records the
//! latest `(seq, head MAC)` as an event every minute and on shutdown, so a removed tail of
//! ledger rows is detected against the event store. Each checkpoint names the one before it
//! (its seq and MAC, covered by its own MAC): the checkpoints form a chain, and the
//! aggregate refuses a checkpoint that does not continue it. One aggregate, id [`LEDGER_ID`].
//!
//! A checkpoint is also signed (Ed25519, R-AUDIT-3) over the rows since the last signed
//! one, so an export can be checked without the HMAC key (`audit::export`).

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
    /// The seq of the last signed checkpoint (0 before the first): the next one covers the
    /// rows after it.
    #[serde(default)]
    pub last_signed_seq: i64,
}

/// What a checkpoint's signature adds to it: the rows it covers and the signature.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSignature {
    /// The seq of the previous signed checkpoint (0 for the first): rows after it, up to the
    /// checkpoint's seq, are covered.
    pub covers_after: i64,
    /// Lowercase hex SHA-256 over the covered rows' digests (`audit::export::rows_digest`).
    pub rows_digest: String,
    /// Lowercase hex of the Ed25519 public key.
    pub public_key: String,
    /// Lowercase hex of the Ed25519 signature over the checkpoint's statement.
    pub signature: String,
}

#[derive(Debug, Clone)]
pub enum AuditCommand {
    /// `mac` is the HMAC (by key `key_id`) over the checkpoint's canonical bytes, which
    /// include `prev_seq` and `prev_mac`, the last checkpoint's seq and MAC (0 and empty for
    /// the first checkpoint).
    /// `signed` covers the rows after the last signed checkpoint.
    Checkpoint {
        seq: i64,
        head_mac: String,
        prev_seq: i64,
        prev_mac: String,
        key_id: String,
        mac: String,
        signed: Option<CheckpointSignature>,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AuditEvent {
    AuditCheckpoint {
        seq: i64,
        head_mac: String,
        prev_seq: i64,
        prev_mac: String,
        key_id: String,
        mac: String,
        /// Absent in checkpoints recorded before checkpoints were signed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signed: Option<CheckpointSignature>,
        at: DateTime<Utc>,
    },
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
    /// A signed checkpoint must cover the rows after the last signed one.
    #[error("checkpoint at seq {seq} covers rows after {covers_after}, but the last signed checkpoint is at seq {last}")]
    Uncovered { seq: i64, covers_after: i64, last: i64 },
}

/// Another checkpointer went first: never a request's refusal.
impl crate::Refusing for AuditError {
    fn error_code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Conflict
    }
}

impl AuditLedger {
    pub fn decide(&self, command: AuditCommand) -> Result<Vec<AuditEvent>, AuditError> {
        let AuditCommand::Checkpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, signed, at } = command;
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
        if let Some(s) = &signed
            && s.covers_after != self.last_signed_seq
        {
            return Err(AuditError::Uncovered { seq, covers_after: s.covers_after, last: self.last_signed_seq });
        }
        Ok(vec![AuditEvent::AuditCheckpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, signed, at }])
    }

    pub fn evolve(&mut self, event: AuditEvent) {
        let AuditEvent::AuditCheckpoint { seq, head_mac, mac, signed, .. } = event;
        if signed.is_some() {
            self.last_signed_seq = seq;
        }
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
            signed: None,
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
        assert_eq!(state, AuditLedger { last_seq: 9, last_head_mac: "head-9".into(), last_mac: "mac-9".into(), last_signed_seq: 0 });
    }

    #[test]
    fn r_audit_3_a_signed_checkpoint_covers_the_rows_after_the_last_signed_one() {
        let signed = |seq: i64, prev_seq: i64, prev_mac: &str, covers_after: i64| match cp(seq, prev_seq, prev_mac) {
            AuditCommand::Checkpoint { seq, head_mac, prev_seq, prev_mac, key_id, mac, at, .. } => AuditCommand::Checkpoint {
                seq,
                head_mac,
                prev_seq,
                prev_mac,
                key_id,
                mac,
                signed: Some(CheckpointSignature { covers_after, ..Default::default() }),
                at,
            },
        };
        // given an unsigned checkpoint at 5 (from before checkpoints were signed)
        let first = given_when::<AuditLedger>(vec![], cp(5, 0, "")).expect("recorded");
        // then the first signed one covers the whole ledger
        assert_eq!(given_when::<AuditLedger>(first.clone(), signed(9, 5, "mac-5", 5)), Err(AuditError::Uncovered { seq: 9, covers_after: 5, last: 0 }));
        let second = given_when::<AuditLedger>(first.clone(), signed(9, 5, "mac-5", 0)).expect("recorded");
        // and the next covers the rows after it
        let history: Vec<AuditEvent> = first.into_iter().chain(second).collect();
        assert!(given_when::<AuditLedger>(history.clone(), signed(12, 9, "mac-9", 0)).is_err());
        assert!(given_when::<AuditLedger>(history, signed(12, 9, "mac-9", 9)).is_ok());
    }
}
