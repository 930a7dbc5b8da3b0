//! The HTTP gateway (R-ARCH-1): authenticates callers by PAT (R-AUTH-1), vouches for them
//! to services with a signed assertion (R-ARCH-3), forwards over the bus, waits for the
//! projections a write affects (R-BOX-9), and maps every refusal to its status in one
//! place (`error.rs`). It is the only crate that knows HTTP.

mod error;
mod idempotency;
mod openapi;
mod routes;
mod wire_json;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::subjects;
use atasira_contracts::v1;
use atasira_contracts::{Named, decode_reply, envelope};
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::auth;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use prost::Message as _;
use serde::Deserialize;
use serde_json::{Value, json};

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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            consistency_wait: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            read_models: vec![subjects::DRAFTS, subjects::RUNTIME_REGISTRY, subjects::AUDIT],
        }
    }
}

#[derive(Clone)]
struct AppState {
    rt: Runtime,
    config: Arc<Config>,
}

/// The router; `rt.db` holds the gateway's own tables (tokens, idempotency).
pub async fn router(rt: Runtime, config: Config) -> anyhow::Result<Router> {
    rt.db.ensure_tables(auth::TOKENS_SCHEMA).await?;
    rt.db.ensure_tables(idempotency::SCHEMA).await?;
    let state = AppState { rt, config: Arc::new(config) };
    let api = Router::new()
        .route("/auth/nats-assertion", post(nats_assertion))
        .route("/boxes/box-drafts", post(submit_draft).get(list_drafts))
        .route("/boxes/box-drafts/pending", get(pending_drafts))
        .route("/boxes/box-drafts/{draft_id}", get(get_draft))
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
        .route("/openapi.json", get(openapi::serve))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found);
    Ok(Router::new().route("/healthz", get(healthz)).nest("/api/v1", api).fallback(not_found).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)).with_state(state))
}

/// Serves until `shutdown` resolves (the same code drives tests and production).
pub async fn serve(listener: tokio::net::TcpListener, rt: Runtime, config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    // Registered with the NATS services API like every other process (R-ARCH-8), so that
    // `$SRV.PING` finds the gateway too. It has no read models of its own.
    let endpoint = atasira_platform::service::serve(&rt, subjects::GATEWAY, |env| async move {
        if env.message_type == v1::WaitForPosition::NAME {
            Ok(atasira_contracts::reply_ok(&v1::WaitForPositionReply { lagging: vec![] }))
        } else {
            Err(atasira_platform::service::Refusal::new(ErrorCode::InvalidRequest, "the gateway serves HTTP; over NATS it only answers WaitForPosition"))
        }
    })
    .await?;
    let app = router(rt, config).await?;
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown).await;
    endpoint.stop();
    served?;
    Ok(())
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "this route does not take that method")
}

impl AppState {
    /// R-AUTH-1: the principal of the bearer token, or 401.
    async fn principal(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let value = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")).map(str::trim).unwrap_or_default();
        if token.is_empty() {
            return Err(ApiError::new(ErrorCode::Unauthenticated, "send Authorization: Bearer <PAT>"));
        }
        auth::lookup_token(&self.rt.db, token)
            .await
            .map_err(ApiError::internal)?
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthenticated, "unknown, revoked or expired token"))
    }

    /// Sends `request` to `service` on behalf of `principal`; the reply and its position.
    async fn call<Req: Named, Resp: prost::Message + Default>(&self, service: &str, principal: &Principal, request: &Req) -> Result<(Resp, i64), ApiError> {
        self.call_written(service, principal, request).await.map(|(r, p, _)| (r, p))
    }

    /// Like `call`, with the ids of the events the request produced.
    async fn call_written<Req: Named, Resp: prost::Message + Default>(
        &self,
        service: &str,
        principal: &Principal,
        request: &Req,
    ) -> Result<(Resp, i64, Vec<String>), ApiError> {
        let correlation_id = uuid::Uuid::new_v4().to_string();
        let assertion = self.rt.assertion_keys.sign(principal, &correlation_id, chrono::Utc::now());
        let env = envelope(request, &correlation_id, "", Some(&assertion));
        let mut headers = BTreeMap::new();
        headers.insert("traceparent".to_owned(), traceparent(&correlation_id));
        let bytes = self
            .rt
            .bus
            .request(&subjects::request(subjects::GATEWAY, service), headers, env.encode_to_vec().into(), self.config.request_timeout)
            .await
            .map_err(|e| ApiError::new(ErrorCode::ServiceUnavailable, format!("the {service} service did not answer: {e}")))?;
        match atasira_contracts::decode_written::<Resp>(&bytes) {
            Ok(Ok(ok)) => Ok(ok),
            Ok(Err(refusal)) => Err(ApiError::from_reply(refusal)),
            Err(e) => Err(ApiError::internal(e)),
        }
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
        let request = v1::WaitForPosition {
            position,
            timeout_ms: u32::try_from(self.config.consistency_wait.as_millis()).unwrap_or(u32::MAX),
            event_ids: event_ids.to_vec(),
        };
        let env = envelope(&request, &uuid::Uuid::new_v4().to_string(), "", None);
        let timeout = self.config.consistency_wait + Duration::from_secs(1);
        let subject = subjects::request(subjects::GATEWAY, service);
        match self.rt.bus.request(&subject, BTreeMap::new(), env.encode_to_vec().into(), timeout).await {
            Ok(bytes) => match decode_reply::<v1::WaitForPositionReply>(&bytes) {
                Ok(Ok((reply, _))) => reply.lagging,
                _ => vec![service.to_owned()],
            },
            Err(_) => vec![service.to_owned()],
        }
    }
}

/// A W3C traceparent derived from the correlation id (R-OPS-1), so one call is one trace.
fn traceparent(correlation_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(correlation_id.as_bytes());
    format!("00-{}-{}-01", hex::encode(&h[..16]), hex::encode(&h[16..24]))
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

/// The body, or 413/400 as JSON.
fn body_or_error(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(ErrorCode::PayloadTooLarge, format!("request bodies are limited to {MAX_BODY_BYTES} bytes"))
        } else {
            ApiError::new(ErrorCode::InvalidJson, format!("unreadable body: {rejection}"))
        }
    })
}

/// R-DRAFT-14: bad JSON is 400 here, before the service sees it.
fn require_json(body: &[u8]) -> Result<(), ApiError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map(|_| ())
        .map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("request body is not valid JSON: {e}")))
}

/// `POST /api/v1/boxes/box-drafts` (R-DRAFT-1..10): any authenticated principal; the
/// draft is always `pending_approval`.
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts", tag = "drafts",
    request_body(content = openapi::BoxDraftCreateRequest, description = "The draft"),
    params(("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key get the first answer (24 h)")),
    responses(
        (status = 201, description = "Draft stored, pending approval", body = openapi::BoxDraftCreateResponse),
        (status = 400, description = "invalid_json", body = openapi::ErrorBody),
        (status = 401, description = "unauthenticated", body = openapi::ErrorBody),
        (status = 403, description = "self_privilege_forbidden", body = openapi::ErrorBody),
        (status = 413, description = "payload_too_large", body = openapi::ErrorBody),
        (status = 422, description = "box_manifest_validation, invalid_request, idempotency_key_reuse", body = openapi::ErrorBody),
    ),
    security(("pat" = [])))]
async fn submit_draft(State(state): State<AppState>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let principal = state.principal(&headers).await?;
    let body = body_or_error(body)?;
    idempotency::run(&state.rt.db, &principal, &headers, "POST /boxes/box-drafts", &body, async {
        require_json(&body)?;
        let request = v1::SubmitDraft { request: Some(wire_json::draft_request(&body)?) };
        let (reply, position, event_ids): (v1::SubmitDraftReply, i64, Vec<String>) = state.call_written(subjects::DRAFTS, &principal, &request).await?;
        let lagging = state.wait_for(position, &event_ids).await;
        let mut response = (
            StatusCode::CREATED,
            Json(json!({
                "draft_id": reply.draft_id,
                "box_type": reply.box_type,
                "status": "pending_approval",
                "over_limit": reply.over_limit,
                "warnings": reply.warnings,
            })),
        )
            .into_response();
        consistency_headers(&mut response, position, &lagging);
        Ok(response)
    })
    .await
}

#[derive(Debug, Deserialize)]
struct PageQuery {
    limit: Option<u32>,
    cursor: Option<String>,
    mine: Option<bool>,
}

/// `GET /api/v1/boxes/box-drafts/pending` (R-APPROVE-1): admins only.
#[utoipa::path(get, path = "/api/v1/boxes/box-drafts/pending", tag = "drafts",
    params(("limit" = Option<u32>, Query, description = "Page size (default 50, at most 200)"), ("cursor" = Option<String>, Query, description = "next_cursor of the previous page")),
    responses((status = 200, description = "Pending drafts", body = openapi::DraftPage), (status = 401, body = openapi::ErrorBody), (status = 403, body = openapi::ErrorBody)),
    security(("pat" = [])))]
async fn pending_drafts(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let Query(q) = query.map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.body_text()))?;
    let request = v1::ListPendingDrafts { limit: q.limit.unwrap_or(0), after: wire_json::parse_cursor(q.cursor.as_deref())? };
    let (reply, _): (v1::DraftPage, i64) = state.call(subjects::DRAFTS, &principal, &request).await?;
    Ok(Json(wire_json::draft_page(reply)?))
}

/// `GET /api/v1/boxes/box-drafts?mine=true` (R-DRAFT-12): the caller's drafts.
#[utoipa::path(get, path = "/api/v1/boxes/box-drafts", tag = "drafts",
    params(("mine" = bool, Query, description = "Must be true: lists the caller's drafts"), ("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, description = "The caller's drafts", body = openapi::DraftPage), (status = 401, body = openapi::ErrorBody), (status = 422, body = openapi::ErrorBody)),
    security(("pat" = [])))]
async fn list_drafts(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let Query(q) = query.map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.body_text()))?;
    if q.mine != Some(true) {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "use ?mine=true for your drafts, or /box-drafts/pending (admin)"));
    }
    let request = v1::ListMyDrafts { limit: q.limit.unwrap_or(0), after: wire_json::parse_cursor(q.cursor.as_deref())? };
    let (reply, _): (v1::DraftPage, i64) = state.call(subjects::DRAFTS, &principal, &request).await?;
    Ok(Json(wire_json::draft_page(reply)?))
}

/// `GET /api/v1/boxes/box-drafts/{draft_id}` (R-DRAFT-12): the requester or an admin.
#[utoipa::path(get, path = "/api/v1/boxes/box-drafts/{draft_id}", tag = "drafts",
    params(("draft_id" = String, Path)),
    responses((status = 200, description = "The draft with status and decision", body = Object), (status = 401, body = openapi::ErrorBody), (status = 404, body = openapi::ErrorBody)),
    security(("pat" = [])))]
async fn get_draft(State(state): State<AppState>, headers: HeaderMap, Path(draft_id): Path<String>) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let (reply, _): (v1::DraftReply, i64) = state.call(subjects::DRAFTS, &principal, &v1::GetDraft { draft_id }).await?;
    Ok(Json(wire_json::draft(reply.draft.ok_or_else(|| ApiError::internal("empty draft reply"))?)?))
}

/// `POST /api/v1/auth/nats-assertion` (R-AUTH-5): a principal assertion for the caller's
/// PAT, to send in the envelope of a NATS request with the same correlation id.
#[utoipa::path(post, path = "/api/v1/auth/nats-assertion", tag = "auth",
    request_body(content = openapi::AssertionRequest, description = "Optional correlation id; one is generated when absent"),
    responses((status = 200, description = "The assertion", body = Object), (status = 401, body = openapi::ErrorBody)),
    security(("pat" = [])))]
async fn nats_assertion(State(state): State<AppState>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let body = body_or_error(body)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        correlation_id: Option<String>,
    }
    let req: Req = if body.is_empty() {
        Req { correlation_id: None }
    } else {
        require_json(&body)?;
        serde_json::from_slice(&body).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))?
    };
    let correlation_id = req.correlation_id.filter(|c| !c.is_empty()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let assertion = state.rt.assertion_keys.sign(&principal, &correlation_id, chrono::Utc::now());
    let wire = atasira_contracts::assertion_to_wire(&assertion).encode_to_vec();
    Ok(Json(json!({
        "correlation_id": correlation_id,
        "expires_at": assertion.expires_at,
        "assertion": assertion,
        "assertion_protobuf_hex": hex::encode(wire),
    })))
}
