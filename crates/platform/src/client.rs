//! The one typed client for a request to another service: wraps the request with a
//! principal assertion bound to it (or without one, for a read-your-writes wait), sends it
//! on `atasira.box.<from>.<to>`, and decodes the reply the request's type names
//! ([`Request::Reply`]). The gateway, approval and the runtime registry call through it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{Refused, Request, Written, decode_written, envelope, signed_envelope, subjects, v1};
use atasira_domain::{ErrorCode, Principal};
use prost::Message as _;

use crate::bus::Bus;
use crate::keys::AssertionKeys;
use crate::refusal::Refusal;

/// What a request's NATS headers (traceparent) may take of a bus message, at most.
const HEADER_ROOM: usize = 1024;

/// Why a call got no answer of the callee's.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// This process signs no assertions.
    #[error("this process cannot act for a principal: {0}")]
    NoSigner(String),
    /// The request is larger than the bus carries.
    #[error("the request is too large for the bus")]
    TooLarge,
    /// The callee did not answer in time (or the bus failed).
    #[error("the {to} service did not answer ({correlation_id}): {error}")]
    NoAnswer { to: String, correlation_id: String, error: String },
    /// The answer is not a reply of the request's type.
    #[error("the {to} service answered something undecodable: {error}")]
    Undecodable { to: String, error: String },
}

impl From<CallError> for Refusal {
    fn from(e: CallError) -> Refusal {
        match e {
            CallError::NoAnswer { to, .. } => Refusal::new(ErrorCode::ServiceUnavailable, format!("the {to} service did not answer")),
            CallError::TooLarge => Refusal::new(ErrorCode::PayloadTooLarge, "the request is too large to forward"),
            other => Refusal::internal(other),
        }
    }
}

/// Calls from one process (`from`, its subject name) to the others.
#[derive(Clone)]
pub struct Client {
    from: &'static str,
    bus: Arc<dyn Bus>,
    keys: AssertionKeys,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({})", self.from)
    }
}

impl Client {
    /// A client of the process `from` (a subject name such as `gateway`), signing with the
    /// current key of `keys`; a request waits at most `timeout` for its answer.
    pub fn new(from: &'static str, bus: Arc<dyn Bus>, keys: AssertionKeys, timeout: Duration) -> Client {
        Client { from, bus, keys, timeout }
    }

    /// `request` to service `to` on behalf of `principal`, with the caller's
    /// Idempotency-Key (bound by the assertion like the payload; empty for none): the reply
    /// as written, or the callee's typed refusal.
    pub async fn call<R: Request>(
        &self,
        to: &str,
        principal: &Principal,
        request: &R,
        idempotency_key: &str,
    ) -> Result<Result<Written<R::Reply>, Refused>, CallError> {
        self.call_as(to, principal, request, idempotency_key, uuid::Uuid::new_v4().to_string()).await
    }

    /// [`Client::call`] under the caller's correlation id (which names the request in the
    /// logs of both sides, and in the answer to a failure).
    pub async fn call_as<R: Request>(
        &self,
        to: &str,
        principal: &Principal,
        request: &R,
        idempotency_key: &str,
        correlation_id: String,
    ) -> Result<Result<Written<R::Reply>, Refused>, CallError> {
        let subject = subjects::request(self.from, to);
        let signer = self.keys.signer().map_err(|e| CallError::NoSigner(e.to_string()))?;
        let env = signed_envelope(&signer, principal, &subject, request, &correlation_id, idempotency_key, chrono::Utc::now());
        send::<R::Reply>(self.bus.as_ref(), to, &subject, &env, correlation_id, self.timeout).await
    }

    /// A read-your-writes wait (no principal): until `to`'s read models hold `event_ids`
    /// (after `position`), at most `timeout`; the read models still behind then.
    pub async fn wait(&self, to: &str, position: i64, event_ids: &[String], timeout: Duration) -> Result<Vec<String>, CallError> {
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let wait = v1::WaitForPosition { position, timeout_ms, event_ids: event_ids.to_vec() };
        Ok(self.ask_wait(to, &wait, timeout + Duration::from_secs(1)).await?.lagging)
    }

    /// Whether `to` answers, and which of its consumers are stuck or waiting for the
    /// database (a wait for nothing, answered at once); at most `timeout`.
    pub async fn probe(&self, to: &str, timeout: Duration) -> Result<v1::WaitForPositionReply, CallError> {
        self.ask_wait(to, &v1::WaitForPosition { position: 0, timeout_ms: 0, event_ids: vec![] }, timeout).await
    }

    async fn ask_wait(&self, to: &str, wait: &v1::WaitForPosition, timeout: Duration) -> Result<v1::WaitForPositionReply, CallError> {
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let env = envelope(wait, &correlation_id, "");
        let subject = subjects::request(self.from, to);
        match send::<v1::WaitForPositionReply>(self.bus.as_ref(), to, &subject, &env, correlation_id, timeout).await? {
            Ok(written) => Ok(written.reply),
            Err(refused) => Err(CallError::Undecodable { to: to.to_owned(), error: refused.to_string() }),
        }
    }
}

async fn send<M: prost::Message + Default>(
    bus: &dyn Bus,
    to: &str,
    subject: &str,
    env: &atasira_contracts::Envelope,
    correlation_id: String,
    timeout: Duration,
) -> Result<Result<Written<M>, Refused>, CallError> {
    // A body under the HTTP limit can still make a request the bus cannot carry; the same
    // answer in both modes (the in-process bus has no limit).
    if env.encoded_len() + HEADER_ROOM > atasira_contracts::MAX_MESSAGE_BYTES {
        return Err(CallError::TooLarge);
    }
    // The bus adds the trace context of the current span (R-OPS-1).
    let bytes = bus.request(subject, BTreeMap::new(), env.encode_to_vec().into(), timeout).await.map_err(|e| CallError::NoAnswer {
        to: to.to_owned(),
        correlation_id,
        error: e.to_string(),
    })?;
    decode_written::<M>(&bytes).map_err(|e| CallError::Undecodable { to: to.to_owned(), error: e.to_string() })
}

/// Calls of an execution host (R-HOST-1) on `atasira.box.host.<name>.<to>`: they act for no
/// user, so they carry no assertion; NATS permissions make the subject the host's identity.
#[derive(Clone)]
pub struct HostClient {
    name: String,
    bus: Arc<dyn Bus>,
    timeout: Duration,
}

impl std::fmt::Debug for HostClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostClient({})", self.name)
    }
}

impl HostClient {
    pub fn new(name: &str, bus: Arc<dyn Bus>, timeout: Duration) -> HostClient {
        HostClient { name: name.to_owned(), bus, timeout }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `request` to `to`, waiting at most the client's timeout plus `extra` (a long poll's
    /// own wait): the reply, or the callee's typed refusal.
    pub async fn ask<R: Request>(&self, to: &str, request: &R, extra: Duration) -> Result<Result<Written<R::Reply>, Refused>, CallError> {
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let env = envelope(request, &correlation_id, "");
        send(self.bus.as_ref(), to, &subjects::host_request(&self.name, to), &env, correlation_id, self.timeout + extra).await
    }
}
