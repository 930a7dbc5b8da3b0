//! `Idempotency-Key` (R-DRAFT-11): per principal, kept 24 h, honoured by every POST/PUT/
//! PATCH. The first request claims the key, later ones get its stored answer; the same key
//! with a different body is 422 `idempotency_key_reuse`. Concurrent retries wait for the
//! first one instead of doing the work twice.
//!
//! A claim has a lease ([`crate::Config::claim_lease`]), longer than a write can take (the
//! gateway gives a write up at [`crate::Config::write_limit`]). A claim still unfinished
//! when its lease ends belongs to a gateway that died mid-request: one retry takes it over
//! (a conditional UPDATE on the claim's time, so two retries cannot both win) and does the
//! work again; the services make that re-run answer what the first run did (the drafts
//! service derives a draft's id from the key, a repeated decision is answered with the
//! first one). The claim's time fences its owner: a claimant that lost its claim stores
//! nothing.

use std::future::Future;
use std::time::Duration;

use atasira_domain::{ErrorCode, Principal};
use atasira_platform::store::Db;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::extract::IdempotencyKey;
use crate::{ApiError, AppState};

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

/// How often the gateway purges the answers it keeps no longer.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Deletes every stored answer older than 24 h (R-ARCH-15): a key is honoured that long,
/// and no caller can fill the table for good. How many went.
pub async fn purge_expired(db: &Db, now: chrono::DateTime<chrono::Utc>) -> anyhow::Result<u64> {
    let gone = sqlx::query("DELETE FROM gateway_idempotency WHERE created_at_ms < $1").bind((now - KEEP).timestamp_millis()).execute(db.any()).await?;
    Ok(gone.rows_affected())
}

/// Purges expired answers every ten minutes, as long as the gateway runs.
pub async fn sweep(db: Db) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    // The first tick is at once: start one period in.
    every.tick().await;
    loop {
        every.tick().await;
        match purge_expired(&db, chrono::Utc::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(purged = n, "purged idempotency answers older than 24 h"),
            Err(e) => tracing::warn!(error = %e, "could not purge old idempotency answers"),
        }
    }
}
/// Headers replayed with a stored answer.
const REPLAYED: &[&str] = &["content-type", "x-atasira-position", "x-atasira-lagging"];
/// How long a retry waits for a claim in progress before answering 503.
const WAIT: Duration = Duration::from_secs(15);

/// Runs `work` at most once per (principal, key) while its claim lives; without a key it
/// just runs it. A malformed key is 422 (routes check it earlier, after 404:
/// `routes::validated`).
pub async fn run(
    state: &AppState,
    principal: &Principal,
    key: &IdempotencyKey,
    route: &str,
    body: &[u8],
    work: impl Future<Output = Result<Response, ApiError>>,
) -> Result<Response, ApiError> {
    key.check()?;
    let Some(key) = key.key.clone() else { return work.await };
    let db = &state.rt.db;
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
    let claim = if claimed {
        now.timestamp_millis()
    } else {
        match replay(db, user, &key, &hash, state.config.claim_lease()).await? {
            Replayed::Answer(response) => return Ok(response),
            Replayed::TakenOver(claim) => {
                tracing::warn!(idempotency_key = key, "took over an Idempotency-Key claim left unfinished past its lease; doing the work again");
                claim
            }
        }
    };
    let limit = state.config.write_limit();
    let response = match tokio::time::timeout(limit, work).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => e.into_response(),
        Err(_) => ApiError::new(ErrorCode::ServiceUnavailable, format!("the request took longer than {} s; retry", limit.as_secs())).into_response(),
    };
    // Crash-test hook: the work is done (and committed), its answer not yet stored.
    atasira_platform::failpoint("gateway-after-work");
    store(db, user, &key, claim, response).await
}

/// Stores a finished answer under the claim made at `claim` (5xx answers release the key so
/// a retry can redo the work). A claim taken over meanwhile is no longer this request's:
/// its answer goes to its caller only.
async fn store(db: &Db, user: &str, key: &str, claim: i64, response: Response) -> Result<Response, ApiError> {
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.map_err(ApiError::internal)?;
    if parts.status.is_server_error() {
        sqlx::query("DELETE FROM gateway_idempotency WHERE principal = $1 AND idem_key = $2 AND status = 0 AND created_at_ms = $3")
            .bind(user)
            .bind(key)
            .bind(claim)
            .execute(db.any())
            .await
            .map_err(ApiError::internal)?;
    } else {
        let headers: serde_json::Map<String, serde_json::Value> = REPLAYED
            .iter()
            .filter_map(|h| parts.headers.get(*h).and_then(|v| v.to_str().ok()).map(|v| ((*h).to_owned(), serde_json::Value::from(v))))
            .collect();
        sqlx::query(
            "UPDATE gateway_idempotency SET status = $1, body = $2, headers = $3 WHERE principal = $4 AND idem_key = $5 AND status = 0 AND created_at_ms = $6",
        )
        .bind(i64::from(parts.status.as_u16()))
        .bind(String::from_utf8_lossy(&bytes).into_owned())
        .bind(serde_json::Value::Object(headers).to_string())
        .bind(user)
        .bind(key)
        .bind(claim)
        .execute(db.any())
        .await
        .map_err(ApiError::internal)?;
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// What a request with a claimed key gets.
enum Replayed {
    /// The stored answer, a refusal, or 503.
    Answer(Response),
    /// The claim was abandoned and is now this request's, made at this time (ms).
    TakenOver(i64),
}

/// What a row of a claimed key says to a request with `hash` at `now_ms`.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The key was used with another request.
    Reuse,
    /// The answer is stored.
    Done,
    /// The work is in progress; its claim's lease ends in this much.
    Running { lease_left: Duration },
    /// The claim's lease ended without an answer: whoever made it died.
    Abandoned,
}

/// The pure decision on a stored row (`status` 0: claimed, no answer yet).
fn verdict(stored_hash: &str, hash: &str, status: i64, claimed_at_ms: i64, now_ms: i64, lease: Duration) -> Verdict {
    if stored_hash != hash {
        return Verdict::Reuse;
    }
    if status != 0 {
        return Verdict::Done;
    }
    let ends = claimed_at_ms.saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
    if now_ms >= ends {
        return Verdict::Abandoned;
    }
    Verdict::Running { lease_left: Duration::from_millis(u64::try_from(ends - now_ms).unwrap_or(0)) }
}

/// The stored answer for a key someone already claimed; waits while it is in progress, and
/// takes the claim over when its lease ended unfinished.
async fn replay(db: &Db, user: &str, key: &str, hash: &str, lease: Duration) -> Result<Replayed, ApiError> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = sqlx::query("SELECT request_hash, status, body, headers, created_at_ms FROM gateway_idempotency WHERE principal = $1 AND idem_key = $2")
            .bind(user)
            .bind(key)
            .fetch_optional(db.any())
            .await
            .map_err(ApiError::internal)?;
        let Some(row) = row else {
            return Ok(Replayed::Answer(retry_later("the first request with this Idempotency-Key failed; retry", Duration::from_secs(1))));
        };
        let stored_hash: String = row.try_get(0).map_err(ApiError::internal)?;
        let status: i64 = row.try_get(1).map_err(ApiError::internal)?;
        let claimed_at: i64 = row.try_get(4).map_err(ApiError::internal)?;
        let now = chrono::Utc::now().timestamp_millis();
        let lease_left = match verdict(&stored_hash, hash, status, claimed_at, now, lease) {
            Verdict::Reuse => return Err(ApiError::new(ErrorCode::IdempotencyKeyReuse, "this Idempotency-Key was used with a different request")),
            Verdict::Done => {
                let body: String = row.try_get(2).map_err(ApiError::internal)?;
                let headers: String = row.try_get(3).map_err(ApiError::internal)?;
                return Ok(Replayed::Answer(stored(status, body, &headers)));
            }
            Verdict::Abandoned => {
                // One conditional UPDATE: of two retries that both saw the same abandoned
                // claim, one changes its time and the other matches nothing.
                let taken = sqlx::query(
                    "UPDATE gateway_idempotency SET created_at_ms = $1 WHERE principal = $2 AND idem_key = $3 AND status = 0 AND created_at_ms = $4",
                )
                .bind(now)
                .bind(user)
                .bind(key)
                .bind(claimed_at)
                .execute(db.any())
                .await
                .map_err(ApiError::internal)?
                .rows_affected();
                if taken == 1 {
                    return Ok(Replayed::TakenOver(now));
                }
                continue;
            }
            Verdict::Running { lease_left } => lease_left,
        };
        if tokio::time::Instant::now() >= deadline {
            return Ok(Replayed::Answer(retry_later("the first request with this Idempotency-Key is still running; retry", lease_left)));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A stored answer, as first given, marked `Idempotent-Replayed: true`.
fn stored(status: i64, body: String, headers: &str) -> Response {
    let status = StatusCode::from_u16(u16::try_from(status).unwrap_or(500)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    if let Ok(serde_json::Value::Object(h)) = serde_json::from_str::<serde_json::Value>(headers) {
        for (name, value) in h {
            if let (Ok(n), Some(Ok(v))) = (HeaderName::try_from(name.as_str()), value.as_str().map(HeaderValue::from_str)) {
                response.headers_mut().insert(n, v);
            }
        }
    }
    response.headers_mut().insert(HeaderName::from_static("idempotent-replayed"), HeaderValue::from_static("true"));
    response
}

/// 503 `service_unavailable` with `Retry-After`: `after`, in whole seconds, at least 1.
fn retry_later(message: &str, after: Duration) -> Response {
    let mut response = ApiError::new(ErrorCode::ServiceUnavailable, message).into_response();
    let seconds = after.as_millis().div_ceil(1000).max(1);
    if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(45);
    const T0: i64 = 1_000_000;

    #[test]
    fn r_draft_11_a_claim_within_its_lease_is_waited_for_and_says_how_long_it_may_hold() {
        // given a claim made at T0 with a 45 s lease; when a retry looks at T0 + 30 s
        let seen = verdict("h", "h", 0, T0, T0 + 30_000, LEASE);
        // then the work is still running for at most 15 s more
        assert_eq!(seen, Verdict::Running { lease_left: Duration::from_secs(15) });
        assert_eq!(verdict("h", "h", 0, T0, T0 + 44_999, LEASE), Verdict::Running { lease_left: Duration::from_millis(1) });
    }

    #[test]
    fn r_draft_11_a_claim_unfinished_past_its_lease_is_abandoned() {
        // given a claim made at T0; when a retry looks when its lease ends, or later
        for now in [T0 + 45_000, T0 + 3_600_000] {
            // then it may take the claim over
            assert_eq!(verdict("h", "h", 0, T0, now, LEASE), Verdict::Abandoned, "{now}");
        }
    }

    #[test]
    fn r_draft_11_a_stored_answer_is_replayed_whatever_its_age() {
        // given an answer stored long ago (status 201); when the same request comes again
        // then it gets the answer, never a second run
        assert_eq!(verdict("h", "h", 201, T0, T0 + 3_600_000, LEASE), Verdict::Done);
        assert_eq!(verdict("h", "h", 409, T0, T0 + 1, LEASE), Verdict::Done);
    }

    #[test]
    fn r_draft_11_another_request_with_the_key_is_reuse_even_when_abandoned() {
        // given a claim for request h; when a different request arrives with the same key,
        // in or past the lease, with or without an answer; then 422, never a take-over
        for (status, now) in [(0, T0 + 1), (0, T0 + 60_000), (201, T0 + 1)] {
            assert_eq!(verdict("h", "other", status, T0, now, LEASE), Verdict::Reuse);
        }
    }

    #[test]
    fn a_retry_later_answer_is_503_with_retry_after_in_whole_seconds() {
        // given 1.2 s left on a lease; when answered; then 503 and Retry-After: 2
        let r = retry_later("still running; retry", Duration::from_millis(1200));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers().get(axum::http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("2"));
        // and never 0
        let r = retry_later("x", Duration::ZERO);
        assert_eq!(r.headers().get(axum::http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
    }

    #[tokio::test]
    async fn r_arch_15_answers_older_than_a_day_are_purged_and_younger_ones_kept() {
        // given two stored answers, one 25 h old and one 1 h old
        let dir = std::env::temp_dir().join(format!("atasira-idem-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let db = Db::connect(&Db::sqlite_url(&dir)).await.expect("db");
        db.ensure_tables(SCHEMA).await.expect("table");
        let now = chrono::Utc::now();
        for (key, age) in [("old", 25), ("young", 1)] {
            sqlx::query("INSERT INTO gateway_idempotency (principal, idem_key, request_hash, status, body, headers, created_at_ms) VALUES ('u', $1, 'h', 201, '', '', $2)")
                .bind(key)
                .bind((now - chrono::TimeDelta::hours(age)).timestamp_millis())
                .execute(db.any())
                .await
                .expect("row");
        }
        // when the sweeper runs; then only the old one goes
        assert_eq!(purge_expired(&db, now).await.expect("purged"), 1);
        let left: Vec<String> = sqlx::query_scalar("SELECT idem_key FROM gateway_idempotency").fetch_all(db.any()).await.expect("rows");
        assert_eq!(left, ["young"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
