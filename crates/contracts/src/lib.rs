//! Wire contracts between atasira's processes: the prost types compiled from `proto/`, the
//! subject names, each service's closed set of requests, and the one place where domain
//! values become wire values and back (`convert`, `manifest`).

pub mod convert;
pub mod manifest;
pub mod requests;
pub mod subjects;

/// Types generated from `proto/atasira/v1/*.proto`.
#[allow(missing_debug_implementations, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/atasira.v1.rs"));
}

use atasira_domain::assertion::{AssertionSigner, Binding, PayloadDigest};
use atasira_domain::{ErrorCode, FieldError, Principal};
use chrono::{DateTime, Utc};
use prost::Message;

pub use convert::{assertion_from_wire, assertion_to_wire};
pub use v1::{Envelope, ErrorReply, Reply};

/// The largest message the bus carries, headers included: nats-server's default
/// `max_payload`, which `atasira nats-config` keeps. A request or an event must fit in it.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// A message's type name, carried in `Envelope.message_type`.
pub trait Named: Message + Default {
    const NAME: &'static str;
}

macro_rules! named {
    ($($t:ident),+ $(,)?) => { $(impl Named for v1::$t { const NAME: &'static str = concat!("atasira.v1.", stringify!($t)); })+ };
}
named!(WaitForPosition, WaitForPositionReply, EventNotification);
named!(SubmitDraft, SubmitDraftReply, ListPendingDrafts, ListMyDrafts, DraftPage, GetDraft, DraftReply, WithdrawDraft, WithdrawReply);
named!(ApproveDraft, RejectDraft, DecisionReply);
named!(ReserveBoxType, ReleaseReservation, Ack, ListBoxes, BoxList, GetBox, BoxReply, AssignUser, BoxAction);
named!(EditBoxManifest, EditBoxConfig);
named!(QueryAudit, AuditPage, VerifyAudit, VerifyReply, ExportAudit, AuditExportPage);
named!(RegisterWebhook, Webhook, WebhookRegistered, ListWebhooks, WebhookList, RemoveWebhook, ListWebhookDeliveries, WebhookDelivery, WebhookDeliveryPage);
named!(ListBoxesPage, BoxPage, GetBoxHistory, BoxHistoryPage, UnassignUser, AssessFeasibility, FeasibilityReply, ListDrafts);
named!(SyncBundle, BundleSynced, PrepareBinding, BindingLease, ConsumeBinding, CreateWorker, WorkerReply, GetWorker, ListBoxWorkers, WorkerPage);
named!(GetWorkerProvenance, WorkerProvenance, SubmitChange, SubmitChangeReply, ReviseDraft, StopWorker, AddWorkerInput, PauseWorker);
named!(HostHeartbeat, HostOrders, GetBundle, BundleBytes, ResolveBinding, ResolvedBinding, ReportWorker, Notification);
named!(AskTool, ToolAnswer, ListToolRequests, ToolRequestPage, ToolRequestView, DecideToolRequest, GetToolRequest);
named!(PublishTriggerEvent, TriggerLaunches, ListTriggerTopics, TriggerTopics);
named!(GetPolicy, PublishPolicy, PolicyReply, CheckPolicy, PolicyCheckReply);

/// A request paired with its reply's type: what a service answers it with (R-ARCH-4).
pub trait Request: Named {
    type Reply: Named;
}

macro_rules! replies {
    ($($req:ident => $reply:ident),+ $(,)?) => { $(impl Request for v1::$req { type Reply = v1::$reply; })+ };
}
replies!(WaitForPosition => WaitForPositionReply);
replies!(SubmitDraft => SubmitDraftReply, ListPendingDrafts => DraftPage, ListMyDrafts => DraftPage, ListDrafts => DraftPage, GetDraft => DraftReply, WithdrawDraft => WithdrawReply);
replies!(ApproveDraft => DecisionReply, RejectDraft => DecisionReply);
replies!(ReserveBoxType => Ack, ReleaseReservation => Ack, ListBoxes => BoxList, GetBox => BoxReply, AssignUser => BoxReply, UnassignUser => BoxReply, BoxAction => BoxReply);
replies!(EditBoxManifest => BoxReply, EditBoxConfig => BoxReply, ListBoxesPage => BoxPage, GetBoxHistory => BoxHistoryPage, AssessFeasibility => FeasibilityReply);
replies!(QueryAudit => AuditPage, VerifyAudit => VerifyReply, ExportAudit => AuditExportPage);
replies!(RegisterWebhook => WebhookRegistered, ListWebhooks => WebhookList, RemoveWebhook => Webhook, ListWebhookDeliveries => WebhookDeliveryPage);
replies!(SyncBundle => BundleSynced, PrepareBinding => BindingLease, ConsumeBinding => Ack, CreateWorker => WorkerReply, GetWorker => WorkerReply, ListBoxWorkers => WorkerPage);
replies!(GetWorkerProvenance => WorkerProvenance, SubmitChange => SubmitChangeReply, ReviseDraft => DraftReply);
replies!(StopWorker => WorkerReply, AddWorkerInput => WorkerReply, PauseWorker => WorkerReply);
replies!(HostHeartbeat => HostOrders, GetBundle => BundleBytes, ResolveBinding => ResolvedBinding, ReportWorker => Ack);
replies!(AskTool => ToolAnswer, ListToolRequests => ToolRequestPage, DecideToolRequest => ToolRequestView, GetToolRequest => ToolRequestView);
replies!(PublishTriggerEvent => TriggerLaunches, ListTriggerTopics => TriggerTopics);
replies!(GetPolicy => PolicyReply, PublishPolicy => PolicyReply, CheckPolicy => PolicyCheckReply);

/// Why bytes from the wire are not what they should be.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("undecodable {what}: {source}")]
    Decode { what: &'static str, source: prost::DecodeError },
    #[error("expected a {expected} payload, got {got:?}")]
    WrongType { expected: &'static str, got: String },
    #[error("the {service} service does not answer {got:?}")]
    UnknownRequest { service: &'static str, got: String },
    #[error("malformed principal assertion: {0}")]
    Assertion(String),
    #[error("{field}: {problem}")]
    Field { field: String, problem: String },
}

impl WireError {
    pub fn field(field: impl Into<String>, problem: impl Into<String>) -> Self {
        WireError::Field { field: field.into(), problem: problem.into() }
    }

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
    fn field_errors(&self) -> Vec<FieldError> {
        match self {
            WireError::Field { field, problem } => vec![FieldError::new(field.clone(), problem.clone())],
            _ => Vec::new(),
        }
    }
}

/// Wraps `payload` into an envelope without a principal assertion (a wait, a request that
/// acts for nobody, or a NATS publisher's request, whose principal is its PAT).
pub fn envelope<M: Named>(payload: &M, correlation_id: &str, idempotency_key: &str) -> Envelope {
    Envelope {
        message_type: M::NAME.to_owned(),
        correlation_id: correlation_id.to_owned(),
        causation_id: String::new(),
        idempotency_key: idempotency_key.to_owned(),
        assertion: None,
        payload: payload.encode_to_vec(),
    }
}

/// The one request `env` on `subject` is, as a principal assertion binds it: the subject,
/// the message type, the SHA-256 of the payload bytes, the correlation id and the
/// idempotency key. The signer and the verifier both derive it here, so nobody computes a
/// digest by hand.
pub fn binding(subject: &str, env: &Envelope) -> Binding {
    Binding {
        subject: subject.to_owned(),
        message_type: env.message_type.clone(),
        payload_sha256: PayloadDigest::of(&env.payload),
        correlation_id: env.correlation_id.clone(),
        idempotency_key: env.idempotency_key.clone(),
    }
}

/// Wraps `payload` for `subject` on behalf of `principal`, with an assertion (signed by
/// `signer` at `now`) bound to exactly this request (R-ARCH-3).
pub fn signed_envelope<M: Named>(
    signer: &AssertionSigner,
    principal: &Principal,
    subject: &str,
    payload: &M,
    correlation_id: &str,
    idempotency_key: &str,
    now: DateTime<Utc>,
) -> Envelope {
    let mut env = envelope(payload, correlation_id, idempotency_key);
    let assertion = signer.sign(principal, &binding(subject, &env), now);
    env.assertion = Some(assertion_to_wire(&assertion));
    env
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

/// A successful read: the message, no position.
pub fn reply_ok<M: Message>(message: &M) -> Reply {
    Reply { result: Some(v1::reply::Result::Ok(message.encode_to_vec())), position: 0, event_ids: vec![] }
}

/// A successful write: the message, its position and the ids of the events it produced.
pub fn reply_written<M: Message>(message: &M, position: i64, event_ids: Vec<String>) -> Reply {
    Reply { result: Some(v1::reply::Result::Ok(message.encode_to_vec())), position, event_ids }
}

/// A typed refusal.
pub fn reply_error(code: ErrorCode, message: impl Into<String>, field_errors: &[FieldError]) -> Reply {
    Reply {
        result: Some(v1::reply::Result::Error(ErrorReply {
            code: convert::error_code_to_wire(code) as i32,
            message: message.into(),
            field_errors: field_errors.iter().map(|f| v1::FieldError { key: f.key.clone(), message: f.message.clone() }).collect(),
        })),
        position: 0,
        event_ids: vec![],
    }
}

/// A refusal as it came over the wire, in domain terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: ErrorCode,
    pub message: String,
    pub field_errors: Vec<FieldError>,
    /// What the refusal recorded (a security violation, R-AUDIT-5): the position and ids of
    /// its events, so the answer can wait until reads see them; 0 and empty otherwise.
    pub position: i64,
    pub event_ids: Vec<String>,
}

impl From<ErrorReply> for Refused {
    fn from(e: ErrorReply) -> Self {
        Refused {
            code: convert::error_code_from_wire(e.code),
            message: e.message,
            field_errors: e.field_errors.into_iter().map(|f| FieldError::new(f.key, f.message)).collect(),
            position: 0,
            event_ids: vec![],
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl atasira_domain::Refusing for Refused {
    fn error_code(&self) -> ErrorCode {
        self.code
    }
    fn field_errors(&self) -> Vec<FieldError> {
        self.field_errors.clone()
    }
}

/// A reply as written: the message, the position of the last event the request produced
/// (0 for a read) and the ids of those events, which a read-your-writes wait names.
#[derive(Debug, Clone, PartialEq)]
pub struct Written<M> {
    pub reply: M,
    pub position: i64,
    pub event_ids: Vec<String>,
}

/// A decoded reply: the message and position, or the refusal.
pub fn decode_reply<M: Message + Default>(bytes: &[u8]) -> Result<Result<(M, i64), Refused>, WireError> {
    Ok(decode_written::<M>(bytes)?.map(|w| (w.reply, w.position)))
}

/// A decoded reply with the event ids the request produced.
pub fn decode_written<M: Message + Default>(bytes: &[u8]) -> Result<Result<Written<M>, Refused>, WireError> {
    let reply = Reply::decode(bytes).map_err(|source| WireError::Decode { what: "reply", source })?;
    match reply.result {
        Some(v1::reply::Result::Ok(b)) => {
            let message = M::decode(b.as_slice()).map_err(|source| WireError::Decode { what: "reply payload", source })?;
            Ok(Ok(Written { reply: message, position: reply.position, event_ids: reply.event_ids }))
        }
        Some(v1::reply::Result::Error(e)) => Ok(Err(Refused { position: reply.position, event_ids: reply.event_ids, ..e.into() })),
        None => Ok(Err(Refused { code: ErrorCode::Internal, message: "empty reply".into(), field_errors: vec![], position: 0, event_ids: vec![] })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::assertion::AssertionKeyring;
    use atasira_domain::{Kind, Role};

    #[test]
    fn an_assertion_survives_the_wire_and_still_verifies_for_its_request_only() {
        // R-ARCH-3
        let now = chrono::Utc::now();
        let signer = AssertionSigner::new("k1", subjects::GATEWAY, &[3; 32], now);
        let ring = AssertionKeyring::new([signer.public_key()]);
        let principal = Principal::new("alice", Role::Admin, Kind::Human);
        let subject = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
        let env = signed_envelope(&signer, &principal, &subject, &v1::ListPendingDrafts { limit: 5, after: 0 }, "corr-1", "", now);
        let bytes = env.encode_to_vec();
        let back = decode_envelope(&bytes).expect("decodes");
        let a = assertion_from_wire(back.assertion.as_ref().expect("has assertion")).expect("converts");
        assert_eq!(ring.verify(&a, &binding(&subject, &back), subjects::GATEWAY, now).map(|v| v.principal().clone()), Ok(principal));
        assert_eq!(payload::<v1::ListPendingDrafts>(&back).expect("payload").limit, 5);
        assert!(matches!(payload::<v1::SubmitDraft>(&back), Err(WireError::WrongType { .. })));
        // The same assertion on another subject, or with another payload, is refused.
        assert!(ring.verify(&a, &binding("atasira.box.gateway.audit", &back), subjects::GATEWAY, now).is_err());
        let mut changed = back.clone();
        changed.payload = v1::ListPendingDrafts { limit: 6, after: 0 }.encode_to_vec();
        assert!(ring.verify(&a, &binding(&subject, &changed), subjects::GATEWAY, now).is_err());
        // A digest that is not 32 bytes does not convert.
        let mut short = back.assertion.clone().expect("has assertion");
        short.payload_sha256.pop();
        assert!(matches!(assertion_from_wire(&short), Err(WireError::Assertion(_))));
    }

    #[test]
    fn replies_carry_either_a_message_or_a_typed_error() {
        // R-DRAFT-14
        let ok = reply_written(&v1::WaitForPositionReply::default(), 7, vec![]).encode_to_vec();
        assert!(matches!(decode_reply::<v1::WaitForPositionReply>(&ok), Ok(Ok((_, 7)))));
        let err = reply_error(ErrorCode::BoxManifestValidation, "no", &[FieldError::new("purpose", "missing")]).encode_to_vec();
        let e = decode_reply::<v1::WaitForPositionReply>(&err).expect("decodes").expect_err("is an error");
        assert_eq!(e.code, ErrorCode::BoxManifestValidation);
        assert_eq!(e.field_errors, vec![FieldError::new("purpose", "missing")]);
        assert!(decode_reply::<v1::WaitForPositionReply>(b"\xff\xff").is_err());
    }
}
