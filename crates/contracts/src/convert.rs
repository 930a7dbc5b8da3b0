//! Domain <-> wire for the small shared values: principals and assertions, error codes,
//! times, statuses and roles, approval public keys, audit rows and verification. The
//! manifest and the draft request have their own module (`manifest`).

use atasira_domain::aggregates::boxes::{BoxRole, BoxState};
use atasira_domain::aggregates::draft::DraftStatus;
use atasira_domain::assertion::{Binding, PayloadDigest, PrincipalAssertion as DomainAssertion};
use atasira_domain::audit::export::{CheckpointProof, CheckpointSignature};
use atasira_domain::audit::{LedgerCheckpoint, LedgerRow, Verification};
use atasira_domain::{ErrorCode, Kind, Principal, Role};
use chrono::{DateTime, Utc};

use crate::{WireError, v1};

/// Domain -> wire: `ERROR_CODE_<WIRE CODE IN CAPITALS>`, so the two names never drift apart.
pub fn error_code_to_wire(code: ErrorCode) -> v1::ErrorCode {
    v1::ErrorCode::from_str_name(&format!("ERROR_CODE_{}", code.as_str().to_ascii_uppercase())).unwrap_or(v1::ErrorCode::Internal)
}

/// Wire -> domain; a code this build does not know is our failure, not the caller's.
pub fn error_code_from_wire(code: i32) -> ErrorCode {
    v1::ErrorCode::try_from(code)
        .ok()
        .and_then(|c| c.as_str_name().strip_prefix("ERROR_CODE_").and_then(|name| ErrorCode::parse(&name.to_ascii_lowercase())))
        .unwrap_or(ErrorCode::Internal)
}

pub fn role_to_wire(role: Role) -> v1::Role {
    match role {
        Role::Admin => v1::Role::Admin,
        Role::Member => v1::Role::Member,
    }
}

pub fn kind_to_wire(kind: Kind) -> v1::Kind {
    match kind {
        Kind::Human => v1::Kind::Human,
        Kind::Agent => v1::Kind::Agent,
    }
}

pub fn principal_to_wire(p: &Principal) -> v1::Principal {
    v1::Principal { user_id: p.user_id.clone(), role: role_to_wire(p.role) as i32, kind: kind_to_wire(p.kind) as i32 }
}

pub fn principal_from_wire(p: &v1::Principal) -> Result<Principal, WireError> {
    let role = match v1::Role::try_from(p.role) {
        Ok(v1::Role::Admin) => Role::Admin,
        Ok(v1::Role::Member) => Role::Member,
        _ => return Err(WireError::Assertion(format!("unknown role {}", p.role))),
    };
    let kind = match v1::Kind::try_from(p.kind) {
        Ok(v1::Kind::Human) => Kind::Human,
        Ok(v1::Kind::Agent) => Kind::Agent,
        _ => return Err(WireError::Assertion(format!("unknown kind {}", p.kind))),
    };
    Ok(Principal::new(p.user_id.clone(), role, kind))
}

/// Domain -> wire.
pub fn assertion_to_wire(a: &DomainAssertion) -> v1::PrincipalAssertion {
    v1::PrincipalAssertion {
        key_id: a.key_id.clone(),
        principal: Some(principal_to_wire(&a.principal)),
        correlation_id: a.binding.correlation_id.clone(),
        expires_at_unix: a.expires_at.timestamp(),
        signature: a.signature.clone(),
        subject: a.binding.subject.clone(),
        message_type: a.binding.message_type.clone(),
        payload_sha256: a.binding.payload_sha256.0.to_vec(),
        idempotency_key: a.binding.idempotency_key.clone(),
    }
}

/// Wire -> domain; the signature is checked by the receiver with its keyring.
pub fn assertion_from_wire(w: &v1::PrincipalAssertion) -> Result<DomainAssertion, WireError> {
    let p = w.principal.as_ref().ok_or_else(|| WireError::Assertion("no principal".into()))?;
    let expires_at: DateTime<Utc> = DateTime::from_timestamp(w.expires_at_unix, 0).ok_or_else(|| WireError::Assertion("expiry out of range".into()))?;
    let payload_sha256 = PayloadDigest::from_slice(&w.payload_sha256).ok_or_else(|| WireError::Assertion("payload_sha256 is not 32 bytes".into()))?;
    Ok(DomainAssertion {
        key_id: w.key_id.clone(),
        principal: principal_from_wire(p)?,
        binding: Binding {
            subject: w.subject.clone(),
            message_type: w.message_type.clone(),
            payload_sha256,
            correlation_id: w.correlation_id.clone(),
            idempotency_key: w.idempotency_key.clone(),
        },
        expires_at,
        signature: w.signature.clone(),
    })
}

pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0) }
}

/// An absent or out-of-range time is `None`.
pub fn time_from_wire(t: Option<&prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    t.and_then(|t| DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?))
}

pub fn draft_status_to_wire(status: DraftStatus) -> v1::DraftStatus {
    match status {
        DraftStatus::PendingApproval => v1::DraftStatus::PendingApproval,
        DraftStatus::Approved => v1::DraftStatus::Approved,
        DraftStatus::Active => v1::DraftStatus::Active,
        DraftStatus::Rejected => v1::DraftStatus::Rejected,
        DraftStatus::Withdrawn => v1::DraftStatus::Withdrawn,
        DraftStatus::Expired => v1::DraftStatus::Expired,
    }
}

/// The status a wire value names (`None` for an unspecified or unknown one).
pub fn draft_status_from_wire(status: i32) -> Option<DraftStatus> {
    Some(match v1::DraftStatus::try_from(status).ok()? {
        v1::DraftStatus::Unspecified => return None,
        v1::DraftStatus::PendingApproval => DraftStatus::PendingApproval,
        v1::DraftStatus::Approved => DraftStatus::Approved,
        v1::DraftStatus::Active => DraftStatus::Active,
        v1::DraftStatus::Rejected => DraftStatus::Rejected,
        v1::DraftStatus::Withdrawn => DraftStatus::Withdrawn,
        v1::DraftStatus::Expired => DraftStatus::Expired,
    })
}

pub fn box_state_to_wire(state: BoxState) -> v1::BoxState {
    match state {
        BoxState::Idle => v1::BoxState::Idle,
        BoxState::Stopped => v1::BoxState::Stopped,
        BoxState::Archived => v1::BoxState::Archived,
    }
}

pub fn box_role_to_wire(role: BoxRole) -> v1::BoxRole {
    match role {
        BoxRole::Primary => v1::BoxRole::Primary,
        BoxRole::Member => v1::BoxRole::Member,
    }
}

pub fn box_role_from_wire(role: i32) -> Result<BoxRole, WireError> {
    match v1::BoxRole::try_from(role) {
        Ok(v1::BoxRole::Primary) => Ok(BoxRole::Primary),
        Ok(v1::BoxRole::Member) => Ok(BoxRole::Member),
        _ => Err(WireError::field("role_in_box", "use primary or member")),
    }
}

pub fn ledger_row_to_wire(r: &LedgerRow) -> v1::AuditRow {
    v1::AuditRow {
        seq: r.seq,
        time: Some(timestamp(r.time)),
        action: r.action.clone(),
        actor: r.actor.clone(),
        target: r.target.clone(),
        event_id: r.event_id.clone(),
        payload_digest: r.payload_digest.clone(),
        key_id: r.key_id.clone(),
        mac: r.mac.clone(),
        detail: r.detail.clone(),
    }
}

pub fn ledger_row_from_wire(r: &v1::AuditRow) -> Result<LedgerRow, WireError> {
    Ok(LedgerRow {
        seq: r.seq,
        time: time_from_wire(r.time.as_ref()).ok_or_else(|| WireError::field("time", "missing or out of range"))?,
        action: r.action.clone(),
        actor: r.actor.clone(),
        target: r.target.clone(),
        event_id: r.event_id.clone(),
        payload_digest: r.payload_digest.clone(),
        detail: r.detail.clone(),
        key_id: r.key_id.clone(),
        mac: r.mac.clone(),
    })
}

pub fn checkpoint_proof_to_wire(p: &CheckpointProof) -> v1::AuditCheckpointProof {
    v1::AuditCheckpointProof {
        seq: p.checkpoint.seq,
        head_mac: p.checkpoint.head_mac.clone(),
        prev_seq: p.checkpoint.prev_seq,
        prev_mac: p.checkpoint.prev_mac.clone(),
        key_id: p.checkpoint.key_id.clone(),
        mac: p.checkpoint.mac.clone(),
        covers_after: p.signed.covers_after,
        rows_digest: p.signed.rows_digest.clone(),
        public_key: p.signed.public_key.clone(),
        signature: p.signed.signature.clone(),
    }
}

pub fn checkpoint_proof_from_wire(p: &v1::AuditCheckpointProof) -> CheckpointProof {
    CheckpointProof {
        checkpoint: LedgerCheckpoint {
            seq: p.seq,
            head_mac: p.head_mac.clone(),
            prev_seq: p.prev_seq,
            prev_mac: p.prev_mac.clone(),
            key_id: p.key_id.clone(),
            mac: p.mac.clone(),
        },
        signed: CheckpointSignature {
            covers_after: p.covers_after,
            rows_digest: p.rows_digest.clone(),
            public_key: p.public_key.clone(),
            signature: p.signature.clone(),
        },
    }
}

pub fn verification_to_wire(v: &Verification) -> v1::VerifyReply {
    match v {
        Verification::Ok { rows } => v1::VerifyReply { ok: true, rows: *rows, first_bad_seq: 0, reason: String::new() },
        Verification::Broken { first_bad_seq, reason } => v1::VerifyReply { ok: false, rows: 0, first_bad_seq: *first_bad_seq, reason: reason.clone() },
    }
}

pub fn verification_from_wire(v: &v1::VerifyReply) -> Verification {
    if v.ok { Verification::Ok { rows: v.rows } } else { Verification::Broken { first_bad_seq: v.first_bad_seq, reason: v.reason.clone() } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_draft_status_has_its_own_wire_value_and_comes_back() {
        let mut seen = std::collections::BTreeSet::new();
        for status in DraftStatus::ALL {
            let wire = draft_status_to_wire(status) as i32;
            assert!(seen.insert(wire), "{status:?} shares its wire value");
            assert_eq!(draft_status_from_wire(wire), Some(status));
        }
        assert_eq!(draft_status_from_wire(v1::DraftStatus::Unspecified as i32), None);
        assert_eq!(draft_status_from_wire(99), None);
    }

    #[test]
    fn every_error_code_has_its_own_wire_code_and_comes_back() {
        // R-DRAFT-14: the proto enum and the domain codes are one list.
        let mut seen = std::collections::BTreeSet::new();
        for code in ErrorCode::ALL {
            let wire = error_code_to_wire(code);
            assert_ne!(wire, v1::ErrorCode::Unspecified, "{code}");
            assert!(wire != v1::ErrorCode::Internal || code == ErrorCode::Internal, "{code} has no proto value");
            assert!(seen.insert(wire as i32), "{code} shares a proto value");
            assert_eq!(error_code_from_wire(wire as i32), code);
        }
        assert_eq!(error_code_from_wire(9999), ErrorCode::Internal);
    }

    #[test]
    fn ledger_rows_and_verification_survive_the_wire() {
        let row = LedgerRow {
            seq: 3,
            time: DateTime::from_timestamp(1_700_000_000, 123_000_000).expect("time"),
            action: "box_draft.create".into(),
            actor: "agent".into(),
            target: "d1".into(),
            event_id: "draft/d1/1".into(),
            payload_digest: "sha256:00".into(),
            detail: "submitted d1".into(),
            key_id: "k1".into(),
            mac: "ab".into(),
        };
        assert_eq!(ledger_row_from_wire(&ledger_row_to_wire(&row)).expect("row"), row);
        for v in [Verification::Ok { rows: 4 }, Verification::Broken { first_bad_seq: 2, reason: "mac".into() }] {
            assert_eq!(verification_from_wire(&verification_to_wire(&v)), v);
        }
    }
}
