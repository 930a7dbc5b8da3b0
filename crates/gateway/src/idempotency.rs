//! `Idempotency-Key` (R-DRAFT-11): per principal, kept 24 h, honoured by every POST/PUT/
//! PATCH. The first request claims the key, later ones get its stored answer; the same key
//! with a different body is 422 `idempotency_key_reuse`. Concurrent retries wait for the
//! first one instead of doing the work twice.

use std::future::Future;
use std::time::Duration;

use atasira_domain::{ErrorCode, Principal};
use atasira_platform::db::Db;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::ApiError;
use crate::extract::IdempotencyKey;

pub const SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS gateway_idempotency (
    principal TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status BIGINT NOT NULL,
    body TEXT NOT NULL,
    headers TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (principal, idem_key)
)"];

const KEEP: chrono::TimeDelta = chrono::TimeDelta::hours(24);
/// Headers replayed with a stored answer.
const REPLAYED: &[&str] = &["content-type", "x-atasira-position", "x-atasira-lagging"];

/// Runs `work` at most once per (principal, key); without a key it just runs it. A
/// malformed key is 422 (routes check it earlier, after 404: `routes::validated`).
pub async fn run(
    db: &Db,
    principal: &Principal,
    key: &IdempotencyKey,
    route: &str,
    body: &[u8],
    work: impl Future<Output = Result<Response, ApiError>>,
) -> Result<Response, ApiError> {
    key.check()?;
    let Some(key) = key.key.clone() else { return work.await };
    let hash = hex::encode(Sha256::digest([route.as_bytes(), b"\n", body].concat()));
    let user = principal.user_id.as_str();
    let now = chrono::Utc::now();
    sqlx::query("DELETE FROM gateway_idempotency WHERE principal = $1 AND idem_key = $2 AND created_at_ms < $3")
        .bind(user)
        .bind(&key)
        .bind((now - KEEP).timestamp_millis())
        .execute(db.any())
        .await
        .map_err(ApiError::internal)?;
    let claimed = sqlx::query(
        "INSERT INTO gateway_idempotency (principal, idem_key, request_hash, status, body, headers, created_at_ms) VALUES ($1, $2, $3, 0, '', '', $4) ON CONFLICT DO NOTHING",
    )
    .bind(user)
    .bind(&key)
    .bind(&hash)
    .bind(now.timestamp_millis())
    .execute(db.any())
    .await
    .map_err(ApiError::internal)?
    .rows_affected()
        == 1;

    if claimed {
        let response = match work.await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        };
        return store(db, user, &key, response).await;
    }
    replay(db, user, &key, &hash).await
}

/// Stores a finished answer (5xx answers release the key so a retry can redo the work).
async fn store(db: &Db, user: &str, key: &str, response: Response) -> Result<Response, ApiError> {
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.map_err(ApiError::internal)?;
    if parts.status.is_server_error() {
        sqlx::query("DELETE FROM gateway_idempotency WHERE principal = $1 AND idem_key = $2")
            .bind(user)
            .bind(key)
            .execute(db.any())
            .await
            .map_err(ApiError::internal)?;
    } else {
        let headers: serde_json::Map<String, serde_json::Value> = REPLAYED
            .iter()
            .filter_map(|h| parts.headers.get(*h).and_then(|v| v.to_str().ok()).map(|v| ((*h).to_owned(), serde_json::Value::from(v))))
            .collect();
        sqlx::query("UPDATE gateway_idempotency SET status = $1, body = $2, headers = $3 WHERE principal = $4 AND idem_key = $5")
            .bind(i64::from(parts.status.as_u16()))
            .bind(String::from_utf8_lossy(&bytes).into_owned())
            .bind(serde_json::Value::Object(headers).to_string())
            .bind(user)
            .bind(key)
            .execute(db.any())
            .await
            .map_err(ApiError::internal)?;
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// The stored answer for a key someone already claimed; waits while it is in progress.
async fn replay(db: &Db, user: &str, key: &str, hash: &str) -> Result<Response, ApiError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let row = sqlx::query("SELECT request_hash, status, body, headers FROM gateway_idempotency WHERE principal = $1 AND idem_key = $2")
            .bind(user)
            .bind(key)
            .fetch_optional(db.any())
            .await
            .map_err(ApiError::internal)?;
        let Some(row) = row else {
            return Err(ApiError::new(ErrorCode::ServiceUnavailable, "the first request with this Idempotency-Key failed; retry"));
        };
        let stored_hash: String = row.try_get(0).map_err(ApiError::internal)?;
        if stored_hash != hash {
            return Err(ApiError::new(ErrorCode::IdempotencyKeyReuse, "this Idempotency-Key was used with a different request"));
        }
        let status: i64 = row.try_get(1).map_err(ApiError::internal)?;
        if status != 0 {
            let body: String = row.try_get(2).map_err(ApiError::internal)?;
            let headers: String = row.try_get(3).map_err(ApiError::internal)?;
            let status = StatusCode::from_u16(u16::try_from(status).unwrap_or(500)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, body).into_response();
            if let Ok(serde_json::Value::Object(h)) = serde_json::from_str::<serde_json::Value>(&headers) {
                for (name, value) in h {
                    if let (Ok(n), Some(Ok(v))) = (HeaderName::try_from(name.as_str()), value.as_str().map(HeaderValue::from_str)) {
                        response.headers_mut().insert(n, v);
                    }
                }
            }
            response.headers_mut().insert(HeaderName::from_static("idempotent-replayed"), HeaderValue::from_static("true"));
            return Ok(response);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::new(ErrorCode::ServiceUnavailable, "the first request with this Idempotency-Key is still running; retry"));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
