//! `/mcp`: the MCP server of `atasira-mcp` over streamable HTTP (R-MCP-1), for agents that
//! speak MCP to the gateway instead of running `atasira mcp`.
//!
//! Every request needs `Authorization: Bearer <PAT>` (401 JSON like the API without a
//! known token), and every tool call is one request to the gateway's own API router,
//! in-process, with that request's `Authorization` header: the token's role decides
//! exactly as over REST. `/mcp` is outside `/api/v1`, so it is not in the OpenAPI document.

use std::sync::Arc;

use atasira_mcp::{ApiAnswer, ApiCall, AtasiraMcp, Backend};
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::Response;
use rmcp::model::Extensions;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use tower::ServiceExt as _;

use crate::extract::Caller;
use crate::{AppState, MAX_BODY_BYTES};

/// The largest API answer a tool hands on (a page of drafts is far smaller).
const MAX_ANSWER_BYTES: usize = 16 * MAX_BODY_BYTES;

/// Ends the MCP sessions (their event streams), so that a graceful shutdown of the
/// gateway does not wait for clients that keep a stream open.
pub(crate) type Stop = Box<dyn FnOnce() + Send>;

/// The `/mcp` route; `api` is the router of `/api/v1` (with its state), which the tools call.
pub(crate) fn router(api: Router, state: AppState) -> (Router, Stop) {
    let backend: Arc<dyn Backend> = Arc::new(InProcess { api });
    // No Host check: it guards a server on localhost against DNS rebinding from a browser,
    // and here every request must carry a PAT that such a page cannot have. The gateway is
    // reached under whatever name it is deployed at.
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts().with_max_request_body_bytes(MAX_BODY_BYTES);
    let cancel = config.cancellation_token.clone();
    let service = StreamableHttpService::new(move || Ok(AtasiraMcp::new(backend.clone())), Arc::new(LocalSessionManager::default()), config);
    let sessions = Arc::new(Sessions::default());
    let gate = middleware::from_fn_with_state(state, move |caller: Caller, request: Request, next: Next| {
        let sessions = sessions.clone();
        async move { authenticated(&sessions, caller, request, next).await }
    });
    let router = Router::new().route_service("/mcp", service).layer(gate);
    (router, Box::new(move || cancel.cancel()))
}

/// MCP sessions one user may hold open at once (R-ARCH-15).
pub const SESSIONS_PER_USER: usize = 8;

/// How long a session counts without a request: the MCP server ends an idle session then
/// (rmcp's default keep-alive).
const SESSION_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// The sessions each user opened, with when each was last used.
#[derive(Debug, Default)]
struct Sessions {
    by_user: std::sync::Mutex<std::collections::HashMap<String, std::collections::HashMap<String, std::time::Instant>>>,
}

impl Sessions {
    /// The user's sessions still alive at `now` (and forgets the others).
    fn alive(&self, user: &str, now: std::time::Instant) -> usize {
        let mut by_user = self.by_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(sessions) = by_user.get_mut(user) else { return 0 };
        sessions.retain(|_, used| now.duration_since(*used) < SESSION_IDLE);
        let alive = sessions.len();
        if alive == 0 {
            by_user.remove(user);
        }
        alive
    }

    fn used(&self, user: &str, session: &str, now: std::time::Instant) {
        let mut by_user = self.by_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        by_user.entry(user.to_owned()).or_default().insert(session.to_owned(), now);
    }

    fn closed(&self, user: &str, session: &str) {
        let mut by_user = self.by_user.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(sessions) = by_user.get_mut(user) {
            sessions.remove(session);
        }
    }
}

/// Lets only requests with a known, live PAT through (the API's 401 otherwise), and at
/// most [`SESSIONS_PER_USER`] sessions of one user at once (429 for one more).
async fn authenticated(sessions: &Sessions, Caller(principal): Caller, request: Request, next: Next) -> Response {
    use axum::response::IntoResponse as _;
    let user = principal.user_id;
    let now = std::time::Instant::now();
    let session = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    match &session {
        Some(id) if request.method() == axum::http::Method::DELETE => sessions.closed(&user, id),
        Some(id) => sessions.used(&user, id, now),
        None if sessions.alive(&user, now) >= SESSIONS_PER_USER => {
            return crate::ApiError::new(
                atasira_domain::ErrorCode::RateLimited,
                format!("{user} holds as many MCP sessions open as it may ({SESSIONS_PER_USER}); end one (DELETE /mcp) or let one go idle"),
            )
            .with_details(Some(serde_json::json!({"retry_after_seconds": 1})))
            .into_response();
        }
        None => {}
    }
    let response = next.run(request).await;
    if session.is_none()
        && let Some(id) = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok())
    {
        sessions.used(&user, id, now);
    }
    response
}

/// The tools' backend: the API router, called in-process as the MCP request's caller.
struct InProcess {
    api: Router,
}

#[async_trait::async_trait]
impl Backend for InProcess {
    async fn call(&self, call: ApiCall, extensions: &Extensions) -> Result<ApiAnswer, String> {
        let mut request = Request::builder().method(call.method.as_str()).uri(&call.path);
        if let Some(authorization) = extensions.get::<Parts>().and_then(|parts| parts.headers.get(AUTHORIZATION)) {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let body = match call.body {
            Some(body) => {
                request = request.header(CONTENT_TYPE, "application/json");
                Body::from(serde_json::to_vec(&body).map_err(|e| e.to_string())?)
            }
            None => Body::empty(),
        };
        let request = request.body(body).map_err(|e| e.to_string())?;
        let response = match self.api.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await.map_err(|e| format!("the API's answer could not be read: {e}"))?;
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(ApiAnswer { status, body })
    }
}
