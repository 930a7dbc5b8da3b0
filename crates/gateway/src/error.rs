//! The one error-to-HTTP mapping (R-DRAFT-14): `{"error": code, "message": text,
//! "details": optional}` with the status the code always has.

use atasira_domain::ErrorCode;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::api::ErrorBody;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    /// The events the refusal recorded (a security violation): the answer waits for the
    /// read models and says `X-Atasira-Position` (`routes::write`).
    pub recorded: Option<Box<(i64, Vec<String>)>>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: None, recorded: None }
    }

    pub fn with_details(mut self, details: Option<Value>) -> Self {
        self.details = details;
        self
    }

    /// A service's typed refusal, as it came over the bus for the request `correlation_id`.
    /// A failure on the service's side (`internal`, `service_unavailable`) may carry a
    /// database or NATS error: it is logged, and the caller gets [`ApiError::failure`].
    pub fn from_reply(e: atasira_contracts::Refused, service: &str, correlation_id: &str) -> Self {
        let recorded = (!e.event_ids.is_empty()).then(|| Box::new((e.position, e.event_ids)));
        if matches!(e.code, ErrorCode::Internal | ErrorCode::ServiceUnavailable) {
            tracing::error!(service, correlation_id, code = %e.code, error = %e.message, "a service failed");
            return Self { recorded, ..Self::failure(e.code, correlation_id) };
        }
        let details = if e.field_errors.is_empty() { None } else { Some(json!(e.field_errors)) };
        Self { code: e.code, message: e.message, details, recorded }
    }

    /// A failure of the gateway itself: logged under a new reference, which is all the
    /// caller learns of it.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        let reference = uuid::Uuid::new_v4().to_string();
        tracing::error!(reference, error = %e, "gateway failure");
        Self::failure(ErrorCode::Internal, &reference)
    }

    /// A failure of the store: 503 `service_unavailable` while the database is away (it
    /// passes by itself, so the caller retries), else 500 `internal`.
    pub fn store(e: anyhow::Error) -> Self {
        if !atasira_platform::failure::is_transient(&e) {
            return Self::internal(format!("{e:#}"));
        }
        let reference = uuid::Uuid::new_v4().to_string();
        tracing::warn!(reference, error = format!("{e:#}"), "the database did not answer");
        Self::failure(ErrorCode::ServiceUnavailable, &reference)
    }

    /// What a caller is told of a failure on the server's side: a fixed text and the
    /// reference the log names it by, never the error itself.
    pub fn failure(code: ErrorCode, reference: &str) -> Self {
        let what = if code == ErrorCode::ServiceUnavailable { "a service did not answer; retry later" } else { "internal failure; retry later" };
        Self::new(code, format!("{what} (reference {reference})"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = self.details.as_ref().and_then(|d| d.get("retry_after_seconds")).and_then(Value::as_u64);
        let status = StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(ErrorBody { error: self.code.as_str().to_owned(), message: self.message, details: self.details })).into_response();
        if self.code == ErrorCode::Busy {
            // Contention passes in moments; say when to come back.
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        if let (ErrorCode::RateLimited, Some(seconds)) = (self.code, retry_after) {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_says_when_to_come_back_and_a_conflict_does_not() {
        let busy = ApiError::new(ErrorCode::Busy, "contended").into_response();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers().get(axum::http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
        let conflict = ApiError::new(ErrorCode::Conflict, "lost a race").into_response();
        assert_eq!(conflict.status(), StatusCode::CONFLICT);
        assert!(conflict.headers().get(axum::http::header::RETRY_AFTER).is_none());
    }

    #[test]
    fn field_errors_of_a_refusal_are_its_details() {
        let refused = atasira_contracts::Refused {
            code: ErrorCode::BoxManifestValidation,
            message: "invalid".into(),
            field_errors: vec![atasira_domain::FieldError::new("purpose", "blank")],
            position: 0,
            event_ids: vec![],
        };
        let e = ApiError::from_reply(refused, "drafts", "c-1");
        assert_eq!(e.details, Some(json!([{"key": "purpose", "message": "blank"}])));
    }

    #[test]
    fn a_failure_on_the_servers_side_names_its_reference_and_nothing_of_the_error() {
        let leaky = "error returned from database: relation \"events\" does not exist (nats://10.0.0.7:4222)";
        for code in [ErrorCode::Internal, ErrorCode::ServiceUnavailable] {
            let refused = atasira_contracts::Refused { code, message: leaky.into(), field_errors: vec![], position: 0, event_ids: vec![] };
            let e = ApiError::from_reply(refused, "drafts", "c-42");
            assert_eq!(e.code, code);
            assert!(e.message.ends_with("retry later (reference c-42)") && !e.message.contains("database"), "{}", e.message);
        }
        let e = ApiError::internal(leaky);
        assert!(e.message.starts_with("internal failure; retry later (reference ") && !e.message.contains("database"), "{}", e.message);
    }
}
