//! Wire contracts between atasira services: the prost types compiled from `proto/`, the
//! subject names (R-ARCH-2), and the one place where domain values become wire values and
//! back (R-ARCH-3).

pub mod subjects;

/// Types generated from `proto/atasira/v1/*.proto`.
#[allow(missing_debug_implementations, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/atasira.v1.rs"));
}

use atasira_domain::assertion::PrincipalAssertion as DomainAssertion;
use atasira_domain::{ErrorCode, Kind, Principal, Role};
use chrono::{DateTime, Utc};
use prost::Message;

pub use v1::{Envelope, ErrorReply, Reply};

/// A request's payload type name, carried in `Envelope.message_type`.
pub trait Named: Message + Default {
    const NAME: &'static str;
}

macro_rules! named {
    ($($t:ident),+) => { $(impl Named for v1::$t { const NAME: &'static str = concat!("atasira.v1.", stringify!($t)); })+ };
}
named!(
    SubmitDraft,
    SubmitDraftReply,
    ListPendingDrafts,
    PendingDraftsReply,
    GetDraft,
    ListMyDrafts,
    DraftReply,
    WaitForPosition,
    WaitForPositionReply,
    EventNotification
);
named!(ApproveDraft, RejectDraft, DecisionReply, GetApprovalKeys, ApprovalKeysReply, WithdrawDraft);
named!(ReserveBoxType, ReleaseReservation, Ack, AwaitActivation, ListBoxes, BoxesReply, GetBox, AssignUser, BoxAction, BoxReply);
named!(QueryAudit, AuditPage, VerifyAudit, VerifyReply);

/// Why bytes from the wire are not what they should be.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("undecodable {what}: {source}")]
    Decode { what: &'static str, source: prost::DecodeError },
    #[error("expected a {expected} payload, got {got:?}")]
    WrongType { expected: &'static str, got: String },
    #[error("malformed principal assertion: {0}")]
    Assertion(String),
}

impl WireError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::Assertion(_) => ErrorCode::Unauthenticated,
            _ => ErrorCode::InvalidRequest,
        }
    }
}

impl atasira_domain::Refusing for WireError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
}

/// Wraps `payload` into an envelope.
pub fn envelope<M: Named>(payload: &M, correlation_id: &str, idempotency_key: &str, assertion: Option<&DomainAssertion>) -> Envelope {
    Envelope {
        message_type: M::NAME.to_owned(),
        correlation_id: correlation_id.to_owned(),
        causation_id: String::new(),
        idempotency_key: idempotency_key.to_owned(),
        assertion: assertion.map(assertion_to_wire),
        payload: payload.encode_to_vec(),
    }
}

pub fn decode_envelope(bytes: &[u8]) -> Result<Envelope, WireError> {
    Envelope::decode(bytes).map_err(|source| WireError::Decode { what: "envelope", source })
}

/// Decodes the envelope's payload, checking its declared type.
pub fn payload<M: Named>(env: &Envelope) -> Result<M, WireError> {
    if env.message_type != M::NAME {
        return Err(WireError::WrongType { expected: M::NAME, got: env.message_type.clone() });
    }
    M::decode(env.payload.as_slice()).map_err(|source| WireError::Decode { what: M::NAME, source })
}

/// A successful reply carrying `message` and the position the request produced.
pub fn reply_ok<M: Message>(message: &M, position: i64) -> Reply {
    Reply { result: Some(v1::reply::Result::Ok(message.encode_to_vec())), position, event_ids: vec![] }
}

/// A successful write: the message, its position and the ids of the events it produced.
pub fn reply_written<M: Message>(message: &M, position: i64, event_ids: Vec<String>) -> Reply {
    Reply { result: Some(v1::reply::Result::Ok(message.encode_to_vec())), position, event_ids }
}

/// A typed refusal.
pub fn reply_error(code: ErrorCode, message: impl Into<String>, details: Option<&serde_json::Value>) -> Reply {
    Reply {
        result: Some(v1::reply::Result::Error(ErrorReply {
            code: code.as_str().to_owned(),
            message: message.into(),
            details_json: details.map(|d| d.to_string()).unwrap_or_default(),
        })),
        position: 0,
        event_ids: vec![],
    }
}

/// A decoded reply: the message and position, or the refusal.
pub fn decode_reply<M: Message + Default>(bytes: &[u8]) -> Result<Result<(M, i64), ErrorReply>, WireError> {
    Ok(decode_written::<M>(bytes)?.map(|(m, p, _)| (m, p)))
}

/// A write's reply: the message, its position and the ids of the events it produced.
pub type Written<M> = (M, i64, Vec<String>);

/// A decoded reply with the event ids the request produced.
pub fn decode_written<M: Message + Default>(bytes: &[u8]) -> Result<Result<Written<M>, ErrorReply>, WireError> {
    let reply = Reply::decode(bytes).map_err(|source| WireError::Decode { what: "reply", source })?;
    match reply.result {
        Some(v1::reply::Result::Ok(b)) => {
            Ok(Ok((M::decode(b.as_slice()).map_err(|source| WireError::Decode { what: "reply payload", source })?, reply.position, reply.event_ids)))
        }
        Some(v1::reply::Result::Error(e)) => Ok(Err(e)),
        None => Ok(Err(ErrorReply { code: "internal".into(), message: "empty reply".into(), details_json: String::new() })),
    }
}

/// Domain -> wire.
pub fn assertion_to_wire(a: &DomainAssertion) -> v1::PrincipalAssertion {
    v1::PrincipalAssertion {
        key_id: a.key_id.clone(),
        principal: Some(v1::Principal { user_id: a.principal.user_id.clone(), role: a.principal.role.to_string(), kind: a.principal.kind.to_string() }),
        correlation_id: a.correlation_id.clone(),
        expires_at_unix: a.expires_at.timestamp(),
        mac: a.mac.clone(),
    }
}

/// Wire -> domain; the MAC is checked by the receiver with its keys.
pub fn assertion_from_wire(w: &v1::PrincipalAssertion) -> Result<DomainAssertion, WireError> {
    let p = w.principal.as_ref().ok_or_else(|| WireError::Assertion("no principal".into()))?;
    let role = match p.role.as_str() {
        "admin" => Role::Admin,
        "member" => Role::Member,
        other => return Err(WireError::Assertion(format!("unknown role {other:?}"))),
    };
    let kind = match p.kind.as_str() {
        "human" => Kind::Human,
        "agent" => Kind::Agent,
        other => return Err(WireError::Assertion(format!("unknown kind {other:?}"))),
    };
    let expires_at: DateTime<Utc> = DateTime::from_timestamp(w.expires_at_unix, 0).ok_or_else(|| WireError::Assertion("expiry out of range".into()))?;
    Ok(DomainAssertion {
        key_id: w.key_id.clone(),
        principal: Principal::new(p.user_id.clone(), role, kind),
        correlation_id: w.correlation_id.clone(),
        expires_at,
        mac: w.mac.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::assertion::{AssertionKey, AssertionKeys};

    #[test]
    fn an_assertion_survives_the_wire_and_still_verifies() {
        // R-ARCH-3
        let keys = AssertionKeys::new(AssertionKey::new("k1", &[3; 32]).expect("key"), vec![]);
        let now = Utc::now();
        let principal = Principal::new("alice", Role::Admin, Kind::Human);
        let signed = keys.sign(&principal, "corr-1", now);
        let env = envelope(&v1::ListPendingDrafts { limit: 5, cursor: String::new() }, "corr-1", "", Some(&signed));
        let bytes = env.encode_to_vec();
        let back = decode_envelope(&bytes).expect("decodes");
        let a = assertion_from_wire(back.assertion.as_ref().expect("has assertion")).expect("converts");
        assert_eq!(keys.verify(&a, "corr-1", now), Ok(principal));
        assert_eq!(payload::<v1::ListPendingDrafts>(&back).expect("payload").limit, 5);
        assert!(matches!(payload::<v1::SubmitDraft>(&back), Err(WireError::WrongType { .. })));
    }

    #[test]
    fn replies_carry_either_a_message_or_a_typed_error() {
        // R-DRAFT-14
        let ok = reply_ok(&v1::WaitForPositionReply { lagging: vec![] }, 7).encode_to_vec();
        assert!(matches!(decode_reply::<v1::WaitForPositionReply>(&ok), Ok(Ok((_, 7)))));
        let err = reply_error(ErrorCode::Forbidden, "no", None).encode_to_vec();
        let e = decode_reply::<v1::WaitForPositionReply>(&err).expect("decodes").expect_err("is an error");
        assert_eq!(e.code, "forbidden");
        assert!(decode_reply::<v1::WaitForPositionReply>(b"\xff\xff").is_err());
    }
}
