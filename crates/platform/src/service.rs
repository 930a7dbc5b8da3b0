//! The shape every service endpoint shares: decode the envelope, carry the caller's trace
//! context into a span, register on `atasira.box.*.<service>` with the NATS services API,
//! verify the principal assertion, stop on shutdown. Services only write `dispatch`.

use std::future::Future;
use std::sync::Arc;

use atasira_contracts::subjects::{self, Origin};
use atasira_contracts::{Envelope, Reply, reply_error};
use atasira_domain::{ErrorCode, FieldError, Principal, Refusing};
use prost::Message as _;

use crate::Runtime;
use crate::bus::{Endpoint, Handler, Message};

/// A typed refusal on its way to the wire (the spec's code, a message, the keys at fault).
#[derive(Debug)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
    pub field_errors: Vec<FieldError>,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), field_errors: Vec::new() }
    }

    /// A failure of ours: logged with its cause, answered without it.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "service failure");
        Self::new(ErrorCode::Internal, "internal failure; retry")
    }

    pub fn into_reply(self) -> Reply {
        reply_error(self.code, self.message, &self.field_errors)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Every coded domain or wire error converts with `?`.
impl<E: Refusing> From<E> for Refusal {
    fn from(e: E) -> Self {
        Self { code: e.error_code(), message: e.to_string(), field_errors: e.field_errors() }
    }
}

/// One request as a service sees it: the envelope, and who sent it.
#[derive(Debug, Clone)]
pub struct Call {
    pub subject: String,
    pub origin: Origin,
    pub env: Envelope,
}

impl Call {
    /// The principal this call acts for. A NATS publisher is the owner of the PAT its
    /// subject names, looked up in the store on every request (a revoked or expired token
    /// stops working at once); a call from one of atasira's processes carries a principal
    /// assertion (R-ARCH-3).
    pub async fn principal(&self, rt: &Runtime) -> Result<Principal, Refusal> {
        match &self.origin {
            Origin::Client { token_hash } => crate::auth::lookup_token_hash(&rt.db, token_hash)
                .await
                .map_err(Refusal::internal)?
                .ok_or_else(|| Refusal::new(ErrorCode::Unauthenticated, "the token is unknown, expired or revoked")),
            Origin::Service(_) => verify_principal(rt, &self.env),
        }
    }

    /// Refuses a NATS publisher: `what` is for atasira's own processes only.
    pub fn only_services(&self, what: &str) -> Result<(), Refusal> {
        match self.origin {
            Origin::Service(_) => Ok(()),
            Origin::Client { .. } => Err(Refusal::new(ErrorCode::Forbidden, format!("{what} is not open to NATS publishers"))),
        }
    }

    /// Refuses every sender but the services named: `what` is their business only.
    pub fn only_from(&self, services: &[&str], what: &str) -> Result<(), Refusal> {
        match self.origin {
            Origin::Service(name) if services.contains(&name) => Ok(()),
            _ => Err(Refusal::new(ErrorCode::Forbidden, format!("{what} is only accepted from the {} service", services.join(" or ")))),
        }
    }
}

/// Serves `service`'s requests with `dispatch`, from atasira's processes and from NATS
/// publishers; an undecodable envelope or a subject with no origin is answered with a
/// typed error before `dispatch` sees it, and refusals become error replies.
pub async fn serve<F, Fut>(rt: &Runtime, service: &'static str, dispatch: F) -> anyhow::Result<Endpoint>
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Reply, Refusal>> + Send + 'static,
{
    let dispatch = Arc::new(dispatch);
    let handler: Handler = Arc::new(move |msg: Message| {
        let dispatch = dispatch.clone();
        // W3C trace context from the caller (R-OPS-1): one API call is one trace.
        let span = tracing::info_span!("request", service, traceparent = msg.headers.get("traceparent").map(String::as_str).unwrap_or(""));
        Box::pin(tracing::Instrument::instrument(
            async move {
                let reply = match (atasira_contracts::decode_envelope(&msg.payload), subjects::origin(&msg.subject, service)) {
                    (Ok(env), Some(origin)) => dispatch(Call { subject: msg.subject, origin, env }).await.unwrap_or_else(Refusal::into_reply),
                    (Err(e), _) => Refusal::from(e).into_reply(),
                    (Ok(_), None) => Refusal::new(ErrorCode::Unauthenticated, format!("{} names no sender atasira knows", msg.subject)).into_reply(),
                };
                reply.encode_to_vec().into()
            },
            span,
        ))
    });
    let subjects = vec![format!("atasira.box.*.{service}"), subjects::client_requests(service)];
    let endpoint = rt.bus.serve(service, &subjects, handler).await?;
    tracing::info!("{service}: serving on {}", subjects.join(" and "));
    Ok(endpoint)
}

/// R-ARCH-3: the principal only counts with a valid assertion bound to this request's
/// correlation id; anything else is `unauthenticated`.
fn verify_principal(rt: &Runtime, env: &Envelope) -> Result<Principal, Refusal> {
    let unauthenticated = |m: String| Refusal::new(ErrorCode::Unauthenticated, m);
    let wire = env.assertion.as_ref().ok_or_else(|| unauthenticated("the request carries no principal assertion".to_owned()))?;
    let assertion = atasira_contracts::assertion_from_wire(wire).map_err(|e| unauthenticated(e.to_string()))?;
    rt.assertion_keys
        .verify(&assertion, &env.correlation_id, chrono::Utc::now())
        .map_err(|e| unauthenticated(format!("invalid principal assertion: {}", e.reason())))
}

/// The answer to a read-your-writes wait: which of `read_models` (name, aggregate types
/// read) are still behind once the wait ends.
pub async fn wait_reply(
    rt: &Runtime,
    read_models: &[(&'static str, &'static [&'static str])],
    wait: &atasira_contracts::v1::WaitForPosition,
) -> Result<Reply, Refusal> {
    let lagging = crate::projection::answer_wait(&rt.db, read_models, wait).await.map_err(Refusal::internal)?;
    Ok(atasira_contracts::reply_ok(&atasira_contracts::v1::WaitForPositionReply { lagging }))
}

/// Resolves once `shutdown` is true (or its sender is gone, which means the same).
pub async fn until_shutdown(mut shutdown: tokio::sync::watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}
