//! The HTTP gateway (R-ARCH-1): authenticates callers by PAT (R-AUTH-1), vouches for them
//! to services with a signed assertion (R-ARCH-3), forwards over the bus, waits for the
//! projections a write affects (R-BOX-9), and maps every refusal to its status in one
//! place (`error.rs`). It is the only crate that knows HTTP.

pub mod api;
pub mod callout;
mod dashboard;
mod error;
mod extract;
mod from_wire;
mod idempotency;
mod mcp;
mod openapi;
pub mod query;
pub use atasira_platform::ratelimit;
mod routes;
mod stream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::subjects;
use atasira_contracts::v1;
use atasira_contracts::{Request, Written};
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::auth;
use atasira_platform::client::{CallError, Client};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::{Json, Router};
use serde_json::json;

pub use error::ApiError;

/// Request bodies over this are refused with 413 (R-DRAFT-14).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// R-BOX-9: how long a write waits for its projections (`ATASIRA_CONSISTENCY_WAIT`).
    pub consistency_wait: Duration,
    /// How long a service may take to answer.
    pub request_timeout: Duration,
    /// Services whose projections a write waits for.
    pub read_models: Vec<&'static str>,
    /// How long an unfinished Idempotency-Key claim holds before a retry may take it over;
    /// `None`: [`Config::write_limit`] and a margin (tests set it short).
    pub idempotency_lease: Option<Duration>,
    /// Requests each principal may send (`ATASIRA_RATE_LIMIT`, `ATASIRA_RATE_BURST`);
    /// `None`: no limit.
    pub rate: Option<ratelimit::Rate>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            consistency_wait: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            read_models: vec![subjects::DRAFTS, subjects::RUNTIME_REGISTRY, subjects::AUDIT],
            idempotency_lease: None,
            rate: Some(ratelimit::Rate { per_second: std::num::NonZeroU32::new(50).expect("50"), burst: std::num::NonZeroU32::new(200).expect("200") }),
        }
    }
}

impl Config {
    /// The longest a write may take; the gateway gives it up (503) then. The longest one is
    /// a Worker launch: three service calls, each up to the request timeout, then the
    /// read-your-writes wait, whose calls give up a second after the consistency wait.
    pub fn write_limit(&self) -> Duration {
        self.request_timeout * 3 + self.consistency_wait + Duration::from_secs(1)
    }

    /// The lease of an Idempotency-Key claim (`idempotency.rs`): past it, an unfinished
    /// claim was left by a gateway that died, and a retry takes it over. Longer than
    /// [`Config::write_limit`] by a margin for the clocks of two gateways.
    pub fn claim_lease(&self) -> Duration {
        self.idempotency_lease.unwrap_or_else(|| self.write_limit() + Duration::from_secs(5))
    }
}

#[derive(Clone)]
struct AppState {
    rt: Runtime,
    /// Requests to the services, on behalf of the caller.
    client: Client,
    config: Arc<Config>,
    /// Live updates (`stream.rs`).
    live: Arc<stream::Live>,
    /// Requests per principal (R-ARCH-15).
    limits: Arc<ratelimit::Limits>,
}

/// Creates the gateway's own tables (tokens, idempotency); idempotent.
pub async fn prepare(db: &atasira_platform::store::Db) -> anyhow::Result<()> {
    auth::prepare(db).await?;
    db.ensure_tables(idempotency::SCHEMA).await
}

/// The router; `rt.db` holds the gateway's own tables (tokens, idempotency).
pub async fn router(rt: Runtime, config: Config) -> anyhow::Result<Router> {
    app(rt, config).await.map(|(router, _, _)| router)
}

/// The router, and what ends the live streams and the MCP sessions at shutdown.
async fn app(rt: Runtime, config: Config) -> anyhow::Result<(Router, Arc<stream::Live>, mcp::Stop)> {
    prepare(&rt.db).await?;
    let live = stream::Live::new();
    let limits = Arc::new(ratelimit::Limits::new(config.rate));
    // The buckets of callers gone quiet are dropped now and then.
    let idle = Arc::downgrade(&limits);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            every.tick().await;
            let Some(limits) = idle.upgrade() else { return };
            limits.forget_idle();
        }
    });
    let client = Client::new(subjects::GATEWAY, rt.bus.clone(), rt.assertion_keys.clone(), config.request_timeout);
    let state = AppState { rt, client, config: Arc::new(config), live: live.clone(), limits };
    tokio::spawn(stream::announce(state.clone(), live.clone()));
    let api = Router::new()
        .route("/auth/nats-assertion", post(routes::nats_assertion))
        .route("/auth/whoami", get(routes::whoami))
        .route("/boxes/box-drafts", post(routes::submit_draft).get(routes::list_drafts))
        .route("/boxes/box-drafts/pending", get(routes::pending_drafts))
        .route("/boxes/box-drafts/{draft_id}", get(routes::get_draft))
        .route("/boxes/box-drafts/{draft_id}/approve", post(routes::approve))
        .route("/boxes/box-drafts/{draft_id}/reject", post(routes::reject))
        .route("/boxes/box-drafts/{draft_id}/withdraw", post(routes::withdraw))
        .route("/boxes", get(routes::list_boxes))
        .route("/boxes/{box_id}", get(routes::get_box))
        .route("/boxes/{box_id}/user-assignments", post(routes::assign_user))
        .route("/boxes/{box_id}/stop", post(routes::stop))
        .route("/boxes/{box_id}/resume", post(routes::resume))
        .route("/boxes/{box_id}/archive", post(routes::archive))
        .route("/audit", get(routes::audit))
        .route("/audit/verify", get(routes::audit_verify))
        .route("/audit/export", get(routes::audit_export))
        .route("/trigger-events", post(routes::publish_trigger_event))
        .route("/policies", get(routes::get_policy).put(routes::publish_policy))
        .route("/policies/check", post(routes::check_policy))
        .route("/webhooks", post(routes::register_webhook).get(routes::list_webhooks))
        .route("/webhooks/{webhook_id}", delete(routes::remove_webhook))
        .route("/webhooks/{webhook_id}/deliveries", get(routes::webhook_deliveries))
        .route("/openapi.json", get(openapi::serve))
        .route("/boxes/feasibility", post(routes::feasibility))
        .route("/boxes/{box_id}/history", get(routes::box_history))
        .route("/boxes/{box_id}/user-assignments/{user_id}", delete(routes::unassign_user))
        .route("/auth/tokens", get(routes::list_tokens).delete(routes::revoke_user_tokens))
        .route("/auth/tokens/{token_id}", axum::routing::delete(routes::revoke_token))
        .route("/boxes/{box_id}/manifest", put(routes::edit_manifest))
        .route("/boxes/{box_id}/config", patch(routes::edit_config))
        .route("/boxes/{box_id}/change-requests", post(routes::request_change))
        .route("/boxes/box-drafts/{draft_id}/revise", post(routes::revise))
        .route("/boxes/{box_id}/workers", post(routes::launch_worker).get(routes::list_workers))
        .route("/workers/{worker_id}", get(routes::get_worker))
        .route("/workers/{worker_id}/provenance", get(routes::worker_provenance))
        .route("/workers/{worker_id}/stop", post(routes::stop_worker_route))
        .route("/workers/{worker_id}/kill", post(routes::kill_worker_route))
        .route("/workers/{worker_id}/input", post(routes::worker_input))
        .route("/workers/{worker_id}/pause", post(routes::pause_worker_route))
        .route("/workers/{worker_id}/resume", post(routes::resume_worker_route))
        .route("/tool-requests", get(routes::list_tool_requests))
        .route("/tool-requests/{request_id}", get(routes::get_tool_request))
        .route("/tool-requests/{request_id}/approve", post(routes::approve_tool))
        .route("/tool-requests/{request_id}/reject", post(routes::reject_tool))
        .route("/events/stream", get(stream::stream))
        .route_layer(axum::middleware::from_fn(measure))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state.clone());
    // The MCP tools call the same API router in-process.
    let (mcp, stop_mcp) = mcp::router(api.clone(), state.clone());
    // The REST address tells the public only that the gateway runs (`/healthz`) and whether
    // the system works (`/readyz`); the details and the metrics are on each process's probe
    // port (`--metrics-listen`).
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(dashboard::routes())
        .with_state(state)
        .nest("/api/v1", api)
        .merge(mcp)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    Ok((app, live, stop_mcp))
}

/// Serves until `shutdown` resolves (the same code drives tests and production).
pub async fn serve<L>(listener: L, rt: Runtime, config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    // Registered with the NATS services API like every other process (R-ARCH-8), so that
    // `$SRV.PING` finds the gateway too. It has no read models of its own.
    let endpoint = atasira_platform::service::serve(&rt, subjects::GATEWAY, |call| async move {
        match atasira_contracts::requests::WaitOnly::decode(&call.env)? {
            atasira_contracts::requests::Incoming::Wait(_) => Ok(atasira_contracts::reply_ok(&v1::WaitForPositionReply::default())),
            atasira_contracts::requests::Incoming::Request(never) => match never {},
        }
    })
    .await?;
    let sweeper = tokio::spawn(idempotency::sweep(rt.db.clone()));
    let (app, live, stop_mcp) = app(rt, config).await?;
    // Open event streams and MCP sessions would hold a graceful shutdown open: end them first.
    let shutdown = async move {
        shutdown.await;
        live.close();
        stop_mcp();
    };
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    sweeper.abort();
    endpoint.stop();
    served?;
    Ok(())
}

/// Liveness: 200 `{"status": "ok"}` while the gateway runs, whatever its dependencies do
/// (an orchestrator must not restart a gateway that only waits for the database or NATS).
async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// Whether the system works: 200 `{"status": "ready"}` when every service answers and none
/// of their consumers is stuck or waiting for the database; otherwise 503 `{"status":
/// "unavailable"}` (a stuck consumer stops alone; the rest of the process keeps serving).
/// What is wrong is logged, never told to the caller: the probe port of each process names
/// it (`/readyz` there).
async fn readyz(State(state): State<AppState>) -> Response {
    let asks = subjects::SERVICES.iter().map(|service| {
        let state = state.clone();
        async move { (*service, state.client.probe(service, Duration::from_secs(5)).await.ok()) }
    });
    let (mut stalled, mut unreachable) = (Vec::new(), Vec::new());
    for (service, reply) in futures::future::join_all(asks).await {
        match reply {
            Some(reply) => {
                stalled.extend(reply.stalled.into_iter().map(|s| json!({"service": service, "consumer": s.consumer, "error": s.error})));
            }
            None => unreachable.push(service),
        }
    }
    if stalled.is_empty() && unreachable.is_empty() {
        return Json(json!({"status": "ready"})).into_response();
    }
    tracing::warn!(stalled = %json!(stalled), unreachable = ?unreachable, "health: the system is degraded");
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "unavailable"}))).into_response()
}

/// Counts and times each request of a known route, by its template (ids stay out of the
/// labels).
async fn measure(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().to_string();
    let route = request.extensions().get::<axum::extract::MatchedPath>().map_or_else(|| "-".to_owned(), |p| p.as_str().to_owned());
    // The root of the call's trace, or a child of the caller's W3C `traceparent` (R-OPS-1).
    let span =
        tracing::info_span!("http", http.request.method = method.as_str(), http.route = route.as_str(), http.response.status_code = tracing::field::Empty);
    let headers = request
        .headers()
        .iter()
        .filter(|(k, _)| *k == "traceparent" || *k == "tracestate")
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    atasira_platform::trace::follow_headers(&span, &headers);
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    atasira_platform::metrics::global().http(&method, &route, response.status().as_u16(), started.elapsed());
    response
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "this route does not take that method")
}

impl AppState {
    /// Sends `request` to `service` on behalf of `principal`; the reply and its position.
    async fn call<R: Request>(&self, service: &str, principal: &Principal, request: &R) -> Result<(R::Reply, i64), ApiError> {
        self.call_keyed(service, principal, request, "").await.map(|w| (w.reply, w.position))
    }

    /// Like `call`, with the caller's Idempotency-Key in the envelope (bound by the
    /// assertion like the payload), so a service can make a re-run of the same request
    /// answer what the first run did (`idempotency.rs`); the reply as written.
    async fn call_keyed<R: Request>(&self, service: &str, principal: &Principal, request: &R, idempotency_key: &str) -> Result<Written<R::Reply>, ApiError> {
        let correlation_id = uuid::Uuid::new_v4().to_string();
        match self.client.call_as(service, principal, request, idempotency_key, correlation_id.clone()).await {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(refusal)) => Err(ApiError::from_reply(refusal, service, &correlation_id)),
            Err(CallError::TooLarge) => {
                Err(ApiError::new(ErrorCode::PayloadTooLarge, format!("the request is too large to forward; keep bodies well under {MAX_BODY_BYTES} bytes")))
            }
            Err(CallError::NoAnswer { correlation_id, error, .. }) => {
                tracing::warn!(service, correlation_id, error, "a service did not answer");
                Err(ApiError::failure(ErrorCode::ServiceUnavailable, &correlation_id))
            }
            Err(other) => Err(ApiError::internal(other)),
        }
    }

    /// A refusal as the answer of a write: one that recorded events (a security violation,
    /// R-AUDIT-5) waits for the read models like a write and says `X-Atasira-Position`, so
    /// the caller's next read (the audit ledger) sees them.
    async fn refusal(&self, refused: ApiError) -> Result<Response, ApiError> {
        let Some(recorded) = refused.recorded.as_deref().cloned() else { return Err(refused) };
        let (position, event_ids) = recorded;
        let lagging = self.wait_for(position, &event_ids).await;
        let mut response = refused.into_response();
        consistency_headers(&mut response, position, &lagging);
        Ok(response)
    }

    /// R-BOX-9: waits (concurrently) for every service's projections to apply the events a
    /// write produced; the names of the projections still behind.
    async fn wait_for(&self, position: i64, event_ids: &[String]) -> Vec<String> {
        if position <= 0 && event_ids.is_empty() {
            return vec![];
        }
        let waits = self.config.read_models.iter().map(|service| self.wait_one(service, position, event_ids));
        futures::future::join_all(waits).await.into_iter().flatten().collect()
    }

    async fn wait_one(&self, service: &str, position: i64, event_ids: &[String]) -> Vec<String> {
        self.client.wait(service, position, event_ids, self.config.consistency_wait).await.unwrap_or_else(|_| vec![service.to_owned()])
    }
}

/// Adds `X-Atasira-Position` and, when behind, `X-Atasira-Lagging` (R-BOX-9).
fn consistency_headers(response: &mut Response, position: i64, lagging: &[String]) {
    if let Ok(v) = HeaderValue::from_str(&position.to_string()) {
        response.headers_mut().insert(HeaderName::from_static("x-atasira-position"), v);
    }
    if !lagging.is_empty()
        && let Ok(v) = HeaderValue::from_str(&lagging.join(","))
    {
        response.headers_mut().insert(HeaderName::from_static("x-atasira-lagging"), v);
    }
}
