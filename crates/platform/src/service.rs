//! The shape every service endpoint shares: bound the requests in flight, decode the
//! envelope, carry the caller's trace context into a span, register on
//! `atasira.box.*.<service>` with the NATS services API, establish the principal (a NATS
//! publisher's PAT, or an assertion accepted once), stop on shutdown. Services only write
//! `dispatch`.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use atasira_contracts::subjects::{self, Origin};
use atasira_contracts::{Envelope, Reply};
use atasira_domain::aggregates::security::SecurityCommand;
use atasira_domain::assertion::{AssertionError, ReplayError};
use atasira_domain::{ErrorCode, Principal};
use prost::Message as _;
use tokio::sync::Semaphore;

use crate::Runtime;
use crate::admission::State;
use crate::bus::{Endpoint, Handler, Message};
use crate::guard::Verdict;
use crate::refusal::{REPLAYED, Refusal};
use crate::store::EventAt;

/// One request as a service sees it: the envelope, who sent it, and to which service.
#[derive(Debug, Clone)]
pub struct Call {
    pub subject: String,
    pub origin: Origin,
    pub env: Envelope,
    /// The service it is addressed to (the last token of the subject).
    pub service: &'static str,
    /// The principal, once established: an assertion is accepted once, so a second look
    /// must not verify it again.
    principal: OnceLock<Principal>,
}

impl Call {
    pub fn new(subject: String, origin: Origin, env: Envelope, service: &'static str) -> Self {
        Self { subject, origin, env, service, principal: OnceLock::new() }
    }

    /// The principal this call acts for. A NATS publisher is the owner of the PAT its
    /// subject names, looked up in the store on every request (a revoked or expired token
    /// stops working at once); a call from one of atasira's processes carries a principal
    /// assertion bound to this request and accepted once (R-ARCH-3). Asking again returns
    /// the same principal.
    pub async fn principal(&self, rt: &Runtime) -> Result<Principal, Refusal> {
        if let Some(p) = self.principal.get() {
            return Ok(p.clone());
        }
        let principal = match &self.origin {
            Origin::Client { token_hash } => crate::auth::lookup_token_hash(&rt.db, token_hash)
                .await
                .map_err(Refusal::internal)?
                .ok_or_else(|| Refusal::new(ErrorCode::Unauthenticated, "the token is unknown, expired or revoked"))?,
            Origin::Service(_) => verify_principal(rt, self).await?,
            Origin::Host { .. } => return Err(Refusal::new(ErrorCode::Forbidden, "an execution host acts for no user")),
        };
        Ok(self.principal.get_or_init(|| principal).clone())
    }

    /// Refuses a NATS publisher: `what` is for atasira's own processes only.
    pub fn only_services(&self, what: &str) -> Result<(), Refusal> {
        match self.origin {
            Origin::Service(_) => Ok(()),
            Origin::Client { .. } => Err(Refusal::new(ErrorCode::Forbidden, format!("{what} is not open to NATS publishers"))),
            Origin::Host { .. } => Err(Refusal::new(ErrorCode::Forbidden, format!("{what} is not open to execution hosts"))),
        }
    }

    /// The execution host that sent this call; refuses every other sender: `what` is the
    /// hosts' business only.
    pub fn only_hosts(&self, what: &str) -> Result<&str, Refusal> {
        match &self.origin {
            Origin::Host { name } => Ok(name),
            _ => Err(Refusal::new(ErrorCode::Forbidden, format!("{what} is only accepted from execution hosts"))),
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
/// publishers, at most `rt.guards.max_in_flight` at once (more are answered `busy` at
/// once, R-ARCH-4). An undecodable envelope, a subject with no origin, or a NATS
/// publisher whose token is unknown, expired or revoked (for any request, waits included)
/// is answered with a typed error before `dispatch` sees it; refusals become error replies.
pub async fn serve<F, Fut>(rt: &Runtime, service: &'static str, dispatch: F) -> anyhow::Result<Endpoint>
where
    F: Fn(Call) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Reply, Refusal>> + Send + 'static,
{
    let dispatch = Arc::new(dispatch);
    let max_in_flight = rt.guards.max_in_flight;
    let in_flight = Arc::new(Semaphore::new(max_in_flight));
    // NATS publishers have a budget of their own, a quarter of the processes', at most
    // four requests per token (R-ARCH-15).
    let clients = Arc::new(crate::guard::ClientBudget::new(max_in_flight.div_ceil(4), CLIENT_IN_FLIGHT_PER_TOKEN));
    let runtime = rt.clone();
    let handler: Handler = Arc::new(move |msg: Message| {
        let (dispatch, rt) = (dispatch.clone(), runtime.clone());
        // Taken before the task does any work, so excess requests cost nothing but the answer.
        let permit = match subjects::origin(&msg.subject, service) {
            Some(Origin::Client { token_hash }) if rt.guards.client_rate(&token_hash).is_err() => Err(Turned::OverRate),
            Some(Origin::Client { token_hash }) => clients.enter(&token_hash).map(Slot::Client).ok_or(Turned::Full("NATS publishers' ")),
            _ => in_flight.clone().try_acquire_owned().map(Slot::Process).map_err(|_| Turned::Full("")),
        };
        // W3C trace context from the caller (R-OPS-1): one API call is one trace.
        let span = tracing::info_span!("request", service, subject = msg.subject.as_str());
        crate::trace::follow_headers(&span, &msg.headers);
        Box::pin(tracing::Instrument::instrument(
            async move {
                let reply = match permit {
                    Ok(_permit) => handle(&rt, service, dispatch.as_ref(), msg).await,
                    Err(Turned::OverRate) => Refusal::new(ErrorCode::RateLimited, "too many requests from this token; retry in a second").into_reply(),
                    Err(Turned::Full(whose)) => {
                        tracing::warn!(service, max_in_flight, "request refused: too many {whose}requests in flight");
                        Refusal::new(ErrorCode::Busy, format!("the {service} service is handling as many {whose}requests as it takes; retry in a moment"))
                            .into_reply()
                    }
                };
                reply.encode_to_vec().into()
            },
            span,
        ))
    });
    let subjects = subjects::listen_subjects(service);
    let endpoint = rt.bus.serve(service, &subjects, handler).await?;
    tracing::info!("{service}: serving on {}", subjects.join(" and "));
    if rt.db.kind() == crate::store::DbKind::Postgres && subjects::SERVICES.contains(&service) {
        tokio::spawn(forget_expired_assertions(rt.db.clone()));
    }
    Ok(endpoint)
}

/// Requests one NATS publisher's token may have in one service at once.
pub const CLIENT_IN_FLIGHT_PER_TOKEN: usize = 4;

/// Why a request was turned away before it ran: its token's rate, or no slot free (whose
/// budget, for the message: the processes' is unnamed).
enum Turned {
    OverRate,
    Full(&'static str),
}

/// What a request holds while it runs: a process's slot or a NATS publisher's.
#[allow(dead_code)] // held for what dropping it gives back
enum Slot {
    Process(tokio::sync::OwnedSemaphorePermit),
    Client(crate::guard::ClientSlot),
}

/// Every minute, forgets the cluster's admitted assertions that expired (plus the replay
/// grace): they verify no more, so nobody can replay them.
async fn forget_expired_assertions(db: crate::store::Db) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
    loop {
        every.tick().await;
        let before = chrono::Utc::now() - atasira_domain::assertion::REPLAY_GRACE;
        if let Err(e) = db.forget_assertions(before.timestamp_millis()).await {
            tracing::warn!(error = %e, "could not forget expired assertions");
        }
    }
}

async fn handle<F, Fut>(rt: &Runtime, service: &'static str, dispatch: &F, msg: Message) -> Reply
where
    F: Fn(Call) -> Fut,
    Fut: Future<Output = Result<Reply, Refusal>>,
{
    let started = std::time::Instant::now();
    let (request, reply) = answer(rt, service, dispatch, msg).await;
    let outcome = match &reply.result {
        Some(atasira_contracts::v1::reply::Result::Error(e)) => atasira_contracts::v1::ErrorCode::try_from(e.code)
            .map_or_else(|_| "unknown".to_owned(), |c| c.as_str_name().trim_start_matches("ERROR_CODE_").to_lowercase()),
        _ => "ok".to_owned(),
    };
    crate::metrics::global().request(service, &request, &outcome, started.elapsed());
    reply
}

/// The request's type (short name, `-` when undecodable) and the answer to it.
async fn answer<F, Fut>(rt: &Runtime, service: &'static str, dispatch: &F, msg: Message) -> (String, Reply)
where
    F: Fn(Call) -> Fut,
    Fut: Future<Output = Result<Reply, Refusal>>,
{
    let env = match atasira_contracts::decode_envelope(&msg.payload) {
        Ok(env) => env,
        Err(e) => return ("-".to_owned(), Refusal::from(e).into_reply()),
    };
    let request = env.message_type.rsplit('.').next().unwrap_or("-").chars().take(64).collect::<String>();
    (request, dispatch_checked(rt, service, dispatch, msg.subject, env).await)
}

async fn dispatch_checked<F, Fut>(rt: &Runtime, service: &'static str, dispatch: &F, subject: String, env: atasira_contracts::v1::Envelope) -> Reply
where
    F: Fn(Call) -> Fut,
    Fut: Future<Output = Result<Reply, Refusal>>,
{
    let Some(origin) = subjects::origin(&subject, service) else {
        return Refusal::new(ErrorCode::Unauthenticated, format!("{subject} names no sender atasira knows")).into_reply();
    };
    let call = Call::new(subject, origin, env, service);
    // A NATS publisher is nobody without a valid token, whatever it asks (R-AUTH-1).
    if matches!(call.origin, Origin::Client { .. })
        && let Err(refusal) = call.principal(rt).await
    {
        return refusal.into_reply();
    }
    if !defers_admission(rt, &call) {
        return dispatch(call).await.unwrap_or_else(Refusal::into_reply);
    }
    // The assertion's admission for the cluster rides with the first append; a request that
    // appended nothing is admitted now, before its answer goes out (`admission`).
    let replay = ReplayNote::of(&call);
    let (reply, admission) = crate::admission::scope(dispatch(call)).await;
    let replayed = match admission {
        State::Pending { tag, expires_at_ms } => match rt.db.admit_assertion(&tag, expires_at_ms).await {
            Ok(admitted) => !admitted,
            Err(e) => return admission_failed(e).into_reply(),
        },
        State::Replayed => true,
        State::None | State::Admitted => false,
    };
    if replayed {
        return replay.refuse(rt).await.into_reply();
    }
    reply.unwrap_or_else(Refusal::into_reply)
}

/// Services whose requests change nothing but the store (they append events and read),
/// so a replayed request is stopped in full by its append: their admissions are deferred.
const DEFERRING_SERVICES: &[&str] = &[subjects::DRAFTS];

/// Whether `call`'s admission may wait for its first append: a process's call with an
/// assertion, to a service that only appends, on a store shared by replicas.
fn defers_admission(rt: &Runtime, call: &Call) -> bool {
    matches!(call.origin, Origin::Service(_))
        && call.env.assertion.is_some()
        && DEFERRING_SERVICES.contains(&call.service)
        && rt.db.kind() == crate::store::DbKind::Postgres
}

/// What the security violation of a replay names, kept before the call is dispatched.
struct ReplayNote {
    call: Call,
    claimed: Option<String>,
    key_id: Option<String>,
}

impl ReplayNote {
    fn of(call: &Call) -> Self {
        let wire = call.env.assertion.as_ref();
        let env = Envelope { message_type: call.env.message_type.clone(), ..Envelope::default() };
        ReplayNote {
            call: Call::new(call.subject.clone(), call.origin.clone(), env, call.service),
            claimed: wire.and_then(|w| w.principal.as_ref()).map(|p| p.user_id.clone()),
            key_id: wire.map(|w| w.key_id.clone()),
        }
    }

    async fn refuse(&self, rt: &Runtime) -> Refusal {
        refused_assertion(rt, &self.call, REPLAYED, self.claimed.as_deref(), self.key_id.as_deref()).await
    }
}

/// R-ARCH-3: a call from one of atasira's processes acts for a principal only with a valid
/// assertion bound to this request (subject, message type, payload digest, correlation
/// id), seen for the first time; anything else is `unauthenticated` and recorded as a
/// security violation (R-AUDIT-5, rate-limited per sender).
async fn verify_principal(rt: &Runtime, call: &Call) -> Result<Principal, Refusal> {
    let now = chrono::Utc::now();
    let Some(wire) = call.env.assertion.as_ref() else {
        return Err(refused_assertion(rt, call, AssertionError::Missing.reason(), None, None).await);
    };
    let claimed = wire.principal.as_ref().map(|p| p.user_id.as_str());
    let assertion = match atasira_contracts::assertion_from_wire(wire) {
        Ok(a) => a,
        Err(_) => return Err(refused_assertion(rt, call, AssertionError::Malformed.reason(), claimed, Some(&wire.key_id)).await),
    };
    let Origin::Service(issuer) = call.origin else {
        return Err(refused_assertion(rt, call, AssertionError::Missing.reason(), claimed, Some(&wire.key_id)).await);
    };
    let verified = match rt.assertion_keys.verify(&rt.db, &assertion, &atasira_contracts::binding(&call.subject, &call.env), issuer, now).await {
        Ok(v) => v,
        Err(e) => return Err(refused_assertion(rt, call, e.reason(), claimed, Some(&wire.key_id)).await),
    };
    let (tag, expires_at_ms) = (*verified.tag(), verified.expires_at().timestamp_millis());
    match rt.guards.admit(verified, now) {
        // Admitted here; by no other replica of the cluster either (R-ARCH-13)? Asked with
        // the request's first append where the service defers it (`dispatch_checked` opened
        // a scope for it), else now.
        Ok(principal) if crate::admission::defer(tag, expires_at_ms) => Ok(principal),
        Ok(principal) => match rt.db.admit_assertion(&tag, expires_at_ms).await {
            Ok(true) => Ok(principal),
            Ok(false) => Err(refused_assertion(rt, call, REPLAYED, claimed, Some(&wire.key_id)).await),
            Err(e) => Err(admission_failed(e)),
        },
        Err(ReplayError::Replayed) => Err(refused_assertion(rt, call, REPLAYED, claimed, Some(&wire.key_id)).await),
        Err(e @ ReplayError::Full { .. }) => {
            tracing::warn!(service = call.service, error = %e, "principal assertion refused: the replay cache is full");
            Err(Refusal::new(ErrorCode::Busy, "too many requests right now; retry in a moment"))
        }
    }
}

/// An admission the store could not record.
fn admission_failed(e: anyhow::Error) -> Refusal {
    Refusal::store(crate::failure::is_transient(&e), format!("cannot record an admitted assertion: {e:#}"))
}

/// Records a refused assertion (unless the sender's budget of recorded violations is spent)
/// and returns the refusal. The record names the reason, the subject, the sender, the
/// claimed user id and the key id; never the MAC.
async fn refused_assertion(rt: &Runtime, call: &Call, reason: &'static str, claimed: Option<&str>, key_id: Option<&str>) -> Refusal {
    let source = match &call.origin {
        Origin::Service(name) => *name,
        Origin::Client { .. } => subjects::CLIENT,
        Origin::Host { .. } => subjects::HOST,
    };
    tracing::warn!(service = call.service, source, subject = %call.subject, reason, "principal assertion refused");
    match rt.guards.violation(source, std::time::Instant::now()) {
        Verdict::Suppress { first } => {
            if first {
                tracing::warn!(service = call.service, source, "more refused assertions from this sender this minute: counted, not recorded");
            }
        }
        Verdict::Record { suppressed } => {
            if suppressed > 0 {
                tracing::warn!(service = call.service, source, suppressed, "refused assertions not recorded in the last minute (rate limit)");
            }
            let text = |s: Option<&str>| s.map_or_else(|| "none".to_owned(), clip);
            let command = SecurityCommand::Record {
                service: call.service.to_owned(),
                actor: source.to_owned(),
                target: clip(&call.subject),
                kind: "invalid_assertion".to_owned(),
                reason: format!("{reason}: {} claiming user {} with key {}", clip(&call.env.message_type), text(claimed), text(key_id)),
                at: chrono::Utc::now(),
            };
            if let Err(e) = record_security_violation(rt, call.service, command).await {
                tracing::error!(service = call.service, error = %e, "could not record a security violation");
            }
        }
    }
    let message = match reason {
        "missing_assertion" => "the request carries no principal assertion".to_owned(),
        _ => format!("invalid principal assertion: {reason}"),
    };
    Refusal::new(ErrorCode::Unauthenticated, message)
}

/// Caller-chosen text in a record: at most 128 characters, control characters escaped.
fn clip(text: &str) -> String {
    let short: String = text.chars().take(128).collect();
    short.escape_debug().to_string()
}

/// Appends a `SecurityViolation` (R-AUDIT-5) to `service`'s own security aggregate type,
/// a new stream each; its position and event id.
pub async fn record_security_violation(rt: &Runtime, service: &str, command: SecurityCommand) -> Result<EventAt, Refusal> {
    use atasira_domain::aggregates::security::{ApprovalSecurity, AuditSecurity, DraftsSecurity, ProvisionerSecurity, RegistrySecurity};
    let id = uuid::Uuid::new_v4().to_string();
    let metadata = std::collections::HashMap::new();
    let receipt = match service {
        subjects::DRAFTS => rt.db.cqrs::<DraftsSecurity>().execute_new(&id, command, metadata).await,
        subjects::APPROVAL => rt.db.cqrs::<ApprovalSecurity>().execute_new(&id, command, metadata).await,
        subjects::RUNTIME_REGISTRY => rt.db.cqrs::<RegistrySecurity>().execute_new(&id, command, metadata).await,
        subjects::AUDIT => rt.db.cqrs::<AuditSecurity>().execute_new(&id, command, metadata).await,
        subjects::PROVISIONER => rt.db.cqrs::<ProvisionerSecurity>().execute_new(&id, command, metadata).await,
        other => Err(Refusal::internal(format!("the {other} process has no security aggregate to record in"))),
    }?;
    receipt.head()
}

/// R-AUDIT-5: `refusal`, with the security violation `command` recorded (the answer then
/// says where); a record that fails is logged and the refusal goes out as it is.
pub async fn refuse_recorded(rt: &Runtime, service: &str, refusal: Refusal, command: SecurityCommand) -> Refusal {
    match record_security_violation(rt, service, command).await {
        Ok(recorded) => refusal.recorded(recorded.into()),
        Err(e) => {
            tracing::error!(service, error = %e, "could not record a security violation");
            refusal
        }
    }
}

/// The answer to a read-your-writes wait: which of `read_models` are still behind once the
/// wait ends.
pub async fn wait_reply(rt: &Runtime, read_models: &[crate::projection::ReadModel], wait: &atasira_contracts::v1::WaitForPosition) -> Result<Reply, Refusal> {
    let lagging = crate::projection::answer_wait(&rt.db, read_models, wait).await.map_err(Refusal::internal)?;
    let stalled = rt.db.stalled_consumers().into_iter().map(|(consumer, error)| atasira_contracts::v1::StalledConsumer { consumer, error }).collect();
    Ok(atasira_contracts::reply_ok(&atasira_contracts::v1::WaitForPositionReply { lagging, stalled }))
}

/// Resolves once `shutdown` is true (or its sender is gone, which means the same).
pub async fn until_shutdown(mut shutdown: tokio::sync::watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::keys::AssertionKeys;
    use atasira_contracts::{Named, decode_reply, envelope, signed_envelope, v1};
    use atasira_domain::assertion::AssertionSigner;
    use atasira_domain::{Kind, Role};

    use super::*;
    use crate::bus::{Bus, InprocBus};
    use crate::feed::FeedSource;
    use crate::guard::Guards;
    use crate::store::Db;

    async fn runtime(guards: Guards) -> (Runtime, Arc<InprocBus>) {
        let dir = std::env::temp_dir().join(format!("atasira-service-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let db = Db::connect(&Db::sqlite_url(&dir)).await.expect("db");
        crate::auth::prepare(&db).await.expect("tokens table");
        let bus = Arc::new(InprocBus::default());
        let signer = AssertionSigner::new("gateway-1", subjects::GATEWAY, &[5; 32], chrono::Utc::now());
        let keys = AssertionKeys::fixed(Some(signer.clone()), [signer.public_key()]);
        let rt = Runtime { db, bus: bus.clone(), feeds: FeedSource::default(), assertion_keys: keys, guards: Arc::new(guards) };
        (rt, bus)
    }

    async fn send(bus: &InprocBus, subject: &str, env: &Envelope) -> Result<v1::WaitForPositionReply, atasira_contracts::Refused> {
        let bytes = bus.request(subject, Default::default(), env.encode_to_vec().into(), Duration::from_secs(10)).await.expect("an answer");
        decode_reply::<v1::WaitForPositionReply>(&bytes).expect("a reply").map(|(r, _)| r)
    }

    /// A drafts service that answers the user id of the caller's principal.
    async fn whoami(rt: &Runtime) -> Endpoint {
        let service_rt = rt.clone();
        serve(rt, subjects::DRAFTS, move |call| {
            let rt = service_rt.clone();
            async move {
                let principal = call.principal(&rt).await?;
                // Asking again is the same principal, not a replay.
                assert_eq!(call.principal(&rt).await?.user_id, principal.user_id);
                Ok(atasira_contracts::reply_ok(&v1::WaitForPositionReply { lagging: vec![principal.user_id], stalled: vec![] }))
            }
        })
        .await
        .expect("serves")
    }

    /// Serves the drafts subject with a handler that says when a request entered and then
    /// blocks until the gate gives it a permit.
    async fn blocking(rt: &Runtime) -> (Endpoint, Arc<Semaphore>, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let gate = Arc::new(Semaphore::new(0));
        let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel();
        let handler_gate = gate.clone();
        let endpoint = serve(rt, subjects::DRAFTS, move |_call| {
            let (gate, entered_tx) = (handler_gate.clone(), entered_tx.clone());
            async move {
                let _ = entered_tx.send(());
                let _open = gate.acquire().await.map_err(Refusal::internal)?;
                Ok(atasira_contracts::reply_ok(&v1::WaitForPositionReply::default()))
            }
        })
        .await
        .expect("serves");
        (endpoint, gate, entered)
    }

    /// Sends `n` copies of `env` on `subject` and returns once each is inside the blocking
    /// handler; their answers come when the gate opens.
    async fn enter(
        bus: &Arc<InprocBus>,
        subject: &str,
        env: &Envelope,
        n: usize,
        entered: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
    ) -> Vec<tokio::task::JoinHandle<Result<v1::WaitForPositionReply, atasira_contracts::Refused>>> {
        let running: Vec<_> = (0..n)
            .map(|_| {
                let (bus, subject, env) = (bus.clone(), subject.to_owned(), env.clone());
                tokio::spawn(async move { send(&bus, &subject, &env).await })
            })
            .collect();
        for _ in 0..n {
            entered.recv().await.expect("a request entered");
        }
        running
    }

    /// The drafts subject of a NATS publisher holding a new agent's PAT.
    async fn agent_subject(rt: &Runtime) -> String {
        let token =
            crate::auth::create_token(&rt.db, &Principal::new("agent", Role::Member, Kind::Agent), None, crate::auth::OPERATOR).await.expect("token").token;
        format!("atasira.box.{}.{}.{}", subjects::CLIENT, crate::auth::hash_token(&token), subjects::DRAFTS)
    }

    async fn violations(rt: &Runtime) -> Vec<serde_json::Value> {
        let events = rt.db.events_after(0, &[atasira_domain::aggregates::types::DRAFTS_SECURITY], 100).await.expect("events");
        events.into_iter().map(|e| e.payload["SecurityViolation"].clone()).collect()
    }

    #[tokio::test]
    async fn r_arch_4_requests_beyond_the_limit_in_flight_are_answered_busy_at_once() {
        // given a service that runs at most 2 requests at once, and a handler that blocks
        let (rt, bus) = runtime(Guards::new(2, 16)).await;
        let (_endpoint, gate, mut entered) = blocking(&rt).await;
        let subject = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
        let wait = envelope(&v1::WaitForPosition::default(), "c", "");
        // when two requests are inside the handler
        let running = enter(&bus, &subject, &wait, 2, &mut entered).await;
        // then a third is answered busy without waiting for them
        let third = send(&bus, &subject, &wait).await.expect_err("busy");
        assert_eq!(third.code, ErrorCode::Busy, "{third}");
        // and once they finish, the two complete and the service takes requests again
        gate.add_permits(3);
        for r in running {
            assert!(r.await.expect("joined").is_ok());
        }
        assert!(send(&bus, &subject, &wait).await.is_ok());
    }

    #[tokio::test]
    async fn r_arch_3_an_assertion_is_accepted_once_and_only_for_its_request_and_refusals_are_recorded() {
        // given the drafts service and an admin's assertion for ListPendingDrafts
        let (rt, bus) = runtime(Guards::default()).await;
        let _endpoint = whoami(&rt).await;
        let alice = Principal::new("alice", Role::Admin, Kind::Human);
        let subject = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
        let list = v1::ListPendingDrafts { limit: 5, after: 0 };
        let env = signed_envelope(&rt.assertion_keys.signer().expect("signs"), &alice, &subject, &list, "corr-1", "", chrono::Utc::now());
        // when it is sent; then it acts for alice
        assert_eq!(send(&bus, &subject, &env).await.expect("accepted").lagging, ["alice"]);
        // when the same request is sent again; then it is a replay
        let replayed = send(&bus, &subject, &env).await.expect_err("replayed");
        assert_eq!((replayed.code, replayed.message.as_str()), (ErrorCode::Unauthenticated, "invalid principal assertion: replayed"));
        // when a fresh assertion for ListPendingDrafts rides on an ApproveDraft; then refused
        let fresh = signed_envelope(&rt.assertion_keys.signer().expect("signs"), &alice, &subject, &list, "corr-2", "", chrono::Utc::now());
        let approve =
            Envelope { assertion: fresh.assertion.clone(), ..envelope(&v1::ApproveDraft { draft_id: "d1".into(), confirm_over_limit: false }, "corr-2", "") };
        let wrong_type = send(&bus, &subject, &approve).await.expect_err("wrong type");
        assert_eq!(wrong_type.message, "invalid principal assertion: message_type_mismatch");
        // when it is sent on another sender's subject; then the gateway's key is not that
        // sender's (R-ARCH-13), and on another addressee's it is bound to the drafts subject
        let elsewhere = subjects::request(subjects::APPROVAL, subjects::DRAFTS);
        assert_eq!(send(&bus, &elsewhere, &fresh).await.expect_err("other sender").message, "invalid principal assertion: wrong_issuer");
        let mut to_audit = fresh.assertion.clone().expect("assertion");
        to_audit.subject = subjects::request(subjects::GATEWAY, subjects::AUDIT);
        let forged = Envelope { assertion: Some(to_audit), ..fresh.clone() };
        assert_eq!(send(&bus, &subject, &forged).await.expect_err("rebound").message, "invalid principal assertion: bad_signature");
        // when the payload is changed; then refused
        let changed = Envelope { payload: v1::ListPendingDrafts { limit: 6, after: 0 }.encode_to_vec(), ..fresh.clone() };
        assert_eq!(send(&bus, &subject, &changed).await.expect_err("changed").message, "invalid principal assertion: payload_mismatch");
        // when there is no assertion at all; then refused
        let bare = envelope(&list, "corr-3", "");
        assert_eq!(send(&bus, &subject, &bare).await.expect_err("bare").code, ErrorCode::Unauthenticated);
        // and the untouched fresh assertion still works once: refusals did not consume it
        assert_eq!(send(&bus, &subject, &fresh).await.expect("accepted").lagging, ["alice"]);

        // then each refusal is a SecurityViolation of the drafts service, naming reason,
        // subject, sender, claimed user and key, never the signature
        let recorded = violations(&rt).await;
        let reasons: Vec<&str> = recorded.iter().map(|v| v["reason"].as_str().expect("reason").split(':').next().expect("code")).collect();
        assert_eq!(reasons, ["replayed", "message_type_mismatch", "wrong_issuer", "bad_signature", "payload_mismatch", "missing_assertion"]);
        assert_eq!(recorded[0]["service"], "drafts");
        assert_eq!(recorded[0]["kind"], "invalid_assertion");
        assert_eq!(recorded[0]["actor"], "gateway");
        assert_eq!(recorded[0]["target"], subject.as_str());
        assert_eq!(recorded[2]["actor"], "approval");
        let reason = recorded[0]["reason"].as_str().expect("reason");
        assert_eq!(reason, format!("replayed: {} claiming user alice with key gateway-1", v1::ListPendingDrafts::NAME));
        let signature = env.assertion.as_ref().expect("assertion").signature.clone();
        assert!(recorded.iter().all(|v| !v.to_string().contains(&signature)));
    }

    #[tokio::test]
    async fn r_audit_5_refused_assertions_are_recorded_at_most_so_often_per_sender() {
        // given a budget of 3 recorded violations per sender
        let (rt, bus) = runtime(Guards::default().with_violation_limit(3, Duration::from_secs(3600))).await;
        let _endpoint = whoami(&rt).await;
        let bare = envelope(&v1::ListPendingDrafts::default(), "c", "");
        // when the gateway's subject carries 5 requests without an assertion, and the approval's 1
        for _ in 0..5 {
            assert!(send(&bus, &subjects::request(subjects::GATEWAY, subjects::DRAFTS), &bare).await.is_err());
        }
        assert!(send(&bus, &subjects::request(subjects::APPROVAL, subjects::DRAFTS), &bare).await.is_err());
        // then every one is refused, 3 of the gateway's and the approval's are recorded
        let actors: Vec<String> = violations(&rt).await.iter().map(|v| v["actor"].as_str().expect("actor").to_owned()).collect();
        assert_eq!(actors, ["gateway", "gateway", "gateway", "approval"]);
    }

    #[tokio::test]
    async fn r_arch_15_a_nats_publisher_beyond_its_rate_is_refused_and_the_gateway_is_not() {
        // given a service allowing each token one request a second, two at once
        let rate = crate::ratelimit::Rate { per_second: std::num::NonZeroU32::new(1).expect("1"), burst: std::num::NonZeroU32::new(2).expect("2") };
        let (rt, bus) = runtime(Guards::default().with_client_rate(rate)).await;
        let _endpoint =
            serve(&rt, subjects::DRAFTS, |_call| async { Ok(atasira_contracts::reply_ok(&v1::WaitForPositionReply::default())) }).await.expect("serves");
        let client = agent_subject(&rt).await;
        let wait = envelope(&v1::WaitForPosition::default(), "c", "");
        // when it sends three at once; then the third is refused as over its rate
        assert!(send(&bus, &client, &wait).await.is_ok());
        assert!(send(&bus, &client, &wait).await.is_ok());
        let third = send(&bus, &client, &wait).await.expect_err("over the rate");
        assert_eq!(third.code, ErrorCode::RateLimited, "{third}");
        // and the gateway's requests are not counted
        for _ in 0..5 {
            assert!(send(&bus, &subjects::request(subjects::GATEWAY, subjects::DRAFTS), &wait).await.is_ok());
        }
    }

    #[tokio::test]
    async fn r_arch_15_waits_of_nats_publishers_fill_only_their_own_budget_never_the_gateways() {
        // given a service taking 8 requests at once (NATS publishers: 2 of their own), a
        // handler that blocks, and an agent's PAT
        let (rt, bus) = runtime(Guards::new(8, 16)).await;
        let (_endpoint, gate, mut entered) = blocking(&rt).await;
        let client = agent_subject(&rt).await;
        let wait = envelope(&v1::WaitForPosition::default(), "c", "");
        // when the agent holds two waits inside
        let mut running = enter(&bus, &client, &wait, 2, &mut entered).await;
        // then its next one is busy at once
        let more = send(&bus, &client, &wait).await.expect_err("busy");
        assert_eq!(more.code, ErrorCode::Busy, "{more}");
        // and the gateway's requests still get in
        let gateway = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
        for _ in 0..3 {
            let (bus, subject, wait) = (bus.clone(), gateway.clone(), wait.clone());
            running.push(tokio::spawn(async move { send(&bus, &subject, &wait).await }));
            entered.recv().await.expect("the gateway's request entered");
        }
        gate.add_permits(10);
        for r in running {
            assert!(r.await.expect("joined").is_ok());
        }
    }

    #[tokio::test]
    async fn r_auth_1_a_nats_publisher_with_an_unknown_or_revoked_token_gets_nothing_not_even_a_wait() {
        // given a service that answers waits to anyone it lets through, and an agent's PAT
        let (rt, bus) = runtime(Guards::default()).await;
        let _endpoint =
            serve(&rt, subjects::DRAFTS, |_call| async { Ok(atasira_contracts::reply_ok(&v1::WaitForPositionReply::default())) }).await.expect("serves");
        let token =
            crate::auth::create_token(&rt.db, &Principal::new("agent", Role::Member, Kind::Agent), None, crate::auth::OPERATOR).await.expect("token").token;
        let wait = envelope(&v1::WaitForPosition::default(), "c", "");
        let as_client = |hash: &str| format!("atasira.box.{}.{hash}.{}", subjects::CLIENT, subjects::DRAFTS);
        // when the valid token's holder waits; then answered
        assert!(send(&bus, &as_client(&crate::auth::hash_token(&token)), &wait).await.is_ok());
        // when an unknown token's holder waits; then unauthenticated
        let unknown = send(&bus, &as_client(&"0".repeat(64)), &wait).await.expect_err("unknown token");
        assert_eq!(unknown.code, ErrorCode::Unauthenticated);
        // when the token is revoked; then unauthenticated at once
        crate::auth::revoke_token(&rt.db, &token).await.expect("revoked");
        let revoked = send(&bus, &as_client(&crate::auth::hash_token(&token)), &wait).await.expect_err("revoked");
        assert_eq!(revoked.code, ErrorCode::Unauthenticated);
    }
}
