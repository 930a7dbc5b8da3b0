//! What every handler takes from a request, checked once, with JSON refusals: the caller
//! (401), its role (403), a path id (404), the `Idempotency-Key` (422) and the body
//! (413/400/422). The last two are refused only when looked at, so a route answers 404 for
//! an unknown id first (`routes::validated`).

use atasira_domain::{ErrorCode, Principal};
use atasira_platform::auth;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::{ApiError, AppState, MAX_BODY_BYTES};

/// The authenticated caller: the principal of the `Authorization: Bearer <PAT>` token,
/// looked up once per request. Without a known, live token the request ends here with 401.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let value = parts.headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")).map(str::trim).unwrap_or_default();
        if token.is_empty() {
            return Err(ApiError::new(ErrorCode::Unauthenticated, "send Authorization: Bearer <PAT>"));
        }
        let principal = auth::lookup_token(&state.rt.db, token)
            .await
            .map_err(ApiError::store)?
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthenticated, "unknown, revoked or expired token"))?;
        // Each principal's rate (R-ARCH-15), for REST and MCP tool calls alike.
        if let Err(wait) = state.limits.check(&principal.user_id) {
            let seconds = crate::ratelimit::retry_after_seconds(wait);
            return Err(ApiError::new(ErrorCode::RateLimited, format!("too many requests from {}; retry in {seconds} s", principal.user_id))
                .with_details(Some(serde_json::json!({"retry_after_seconds": seconds}))));
        }
        Ok(Caller(principal))
    }
}

/// A caller with role admin (any kind), else 403 before anything else of the request is
/// looked at (the check order: 401, 403, then 404 and the body).
#[derive(Debug, Clone)]
pub struct Admin(pub Principal);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(principal) = Caller::from_request_parts(parts, state).await?;
        if !principal.is_admin() {
            return Err(ApiError::new(ErrorCode::Forbidden, "this needs role admin"));
        }
        Ok(Admin(principal))
    }
}

/// A caller with role admin and kind human (R-AUTH-2), else 403 before anything else of
/// the request is looked at. Services check it again: they also serve NATS publishers.
#[derive(Debug, Clone)]
pub struct HumanAdmin(pub Principal);

impl FromRequestParts<AppState> for HumanAdmin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(principal) = Caller::from_request_parts(parts, state).await?;
        if !principal.is_human_admin() {
            return Err(ApiError::new(ErrorCode::Forbidden, "this needs a human admin"));
        }
        Ok(HumanAdmin(principal))
    }
}

/// A `{draft_id}` or `{box_id}` path segment. One that is not text names nothing: 404.
#[derive(Debug, Clone)]
pub struct Id(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, state).await.map_err(|e| ApiError::new(ErrorCode::NotFound, e.body_text()))?;
        // No id holds a NUL character (and PostgreSQL text cannot).
        if id.contains('\0') {
            return Err(ApiError::new(ErrorCode::NotFound, "no such id: ids hold no NUL characters"));
        }
        Ok(Id(id))
    }
}

/// The `{box_id}` and `{user_id}` of `/boxes/{box_id}/user-assignments/{user_id}`: 404
/// when either is not text (as [`Id`]).
#[derive(Debug, Clone)]
pub struct BoxUser {
    pub box_id: String,
    pub user_id: String,
}

impl<S: Send + Sync> FromRequestParts<S> for BoxUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path((box_id, user_id)) =
            Path::<(String, String)>::from_request_parts(parts, state).await.map_err(|e| ApiError::new(ErrorCode::NotFound, e.body_text()))?;
        if box_id.contains('\0') || user_id.contains('\0') {
            return Err(ApiError::new(ErrorCode::NotFound, "no such id: ids hold no NUL characters"));
        }
        Ok(BoxUser { box_id, user_id })
    }
}

/// The `Idempotency-Key` header: 1 to 255 visible ASCII characters, no spaces. A malformed
/// one is 422, but only once the request passed 401, 403 and 404 ([`IdempotencyKey::check`],
/// which `idempotency::run` calls too).
#[derive(Debug, Clone, Default)]
pub struct IdempotencyKey {
    pub key: Option<String>,
    malformed: bool,
}

impl IdempotencyKey {
    /// The OpenAPI document says the same (`query::IdempotencyHeader`).
    pub const MAX_LEN: usize = 255;

    /// 422 `invalid_request` when the header is malformed.
    pub fn check(&self) -> Result<(), ApiError> {
        if self.malformed {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("Idempotency-Key must be 1 to {} visible ASCII characters without spaces", Self::MAX_LEN),
            ));
        }
        Ok(())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get("idempotency-key") else { return Ok(IdempotencyKey::default()) };
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > Self::MAX_LEN || !bytes.iter().all(|b| (b'!'..=b'~').contains(b)) {
            return Ok(IdempotencyKey { key: None, malformed: true });
        }
        Ok(IdempotencyKey { key: Some(String::from_utf8_lossy(bytes).into_owned()), malformed: false })
    }
}

/// The raw request body, at most [`MAX_BODY_BYTES`]. A body that cannot be read (413
/// beyond the limit, 400 otherwise) is refused when it is looked at, after 401, 403 and 404.
#[derive(Debug, Clone)]
pub struct RawBody(Result<Bytes, (ErrorCode, String)>);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Ok(RawBody(Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                (ErrorCode::PayloadTooLarge, format!("request bodies are limited to {MAX_BODY_BYTES} bytes"))
            } else {
                (ErrorCode::InvalidJson, format!("unreadable body: {rejection}"))
            }
        })))
    }
}

impl RawBody {
    #[cfg(test)]
    pub fn new(bytes: Bytes) -> Self {
        RawBody(Ok(bytes))
    }

    /// The body's bytes: 413 over the limit, 400 when it could not be read.
    pub fn bytes(&self) -> Result<&[u8], ApiError> {
        self.0.as_ref().map(|b| b.as_ref()).map_err(|(code, message)| ApiError::new(*code, message.clone()))
    }

    /// The bytes for the Idempotency-Key's request digest (empty when unreadable; such a
    /// request is refused before it is run).
    pub fn raw(&self) -> &[u8] {
        self.0.as_ref().map(|b| b.as_ref()).unwrap_or_default()
    }

    /// The body as JSON: 400 `invalid_json` unless it is JSON, 422 `invalid_request` when
    /// its text holds a NUL character (refused at the door: PostgreSQL cannot store it, so
    /// it would fail only in cluster mode).
    pub fn json(&self) -> Result<serde_json::Value, ApiError> {
        Self::value(self.bytes()?)
    }

    fn value(body: &[u8]) -> Result<serde_json::Value, ApiError> {
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("request body is not valid JSON: {e}")))?;
        if let Some(key) = atasira_domain::error::nul_key(&value) {
            return Err(ApiError::new(ErrorCode::InvalidRequest, format!("request body{key}: text must not contain NUL characters (\\u0000)")));
        }
        Ok(value)
    }

    /// The body as `T`, a JSON object with unknown fields refused: bad JSON is 400
    /// `invalid_json`; any other JSON value, an object that is not a `T` or text with a NUL
    /// character is 422 `invalid_request`. An empty body reads as `{}`; one of blanks only is
    /// no JSON document (400).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let bytes = self.bytes()?;
        let body: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
        let value = Self::value(body)?;
        // Serde would read a struct from an array as well (`[]` as `{}`).
        if !value.is_object() {
            return Err(ApiError::new(ErrorCode::InvalidRequest, "request body must be a JSON object"));
        }
        serde_json::from_value(value).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("request body: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_body_is_an_empty_object_and_blanks_are_no_json() {
        let parse = |b: &'static [u8]| RawBody::new(Bytes::from_static(b)).parse::<crate::api::EmptyRequest>().map_err(|e| e.code);
        assert!(parse(b"").is_ok());
        assert!(parse(b"{}").is_ok());
        assert_eq!(parse(b" ").err(), Some(ErrorCode::InvalidJson));
        assert_eq!(parse(b"[]").err(), Some(ErrorCode::InvalidRequest));
        assert_eq!(parse(b"{\"x\":1}").err(), Some(ErrorCode::InvalidRequest));
    }
}
