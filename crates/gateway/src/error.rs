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
    /// A refusal that recorded an event (a security violation): the position it produced
    /// and the read models still behind, answered as the consistency headers (R-BOX-9).
    pub consistency: Option<Box<(i64, Vec<String>)>>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: None, consistency: None }
    }

    pub fn with_details(mut self, details: Option<Value>) -> Self {
        self.details = details;
        self
    }

    /// A service's typed refusal, as it came over the bus.
    pub fn from_reply(e: atasira_contracts::Refused) -> Self {
        let details = if e.field_errors.is_empty() { None } else { Some(json!(e.field_errors)) };
        Self { code: e.code, message: e.message, details, consistency: None }
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "gateway failure");
        Self::new(ErrorCode::Internal, "internal failure; retry later")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let consistency = self.consistency;
        let mut response = (status, Json(ErrorBody { error: self.code.as_str().to_owned(), message: self.message, details: self.details })).into_response();
        if let Some(written) = &consistency {
            let (position, lagging) = written.as_ref();
            crate::consistency_headers(&mut response, *position, lagging);
        }
        if self.code == ErrorCode::Busy {
            // Contention passes in moments; say when to come back.
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
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
        let e = ApiError::from_reply(refused);
        assert_eq!(e.details, Some(json!([{"key": "purpose", "message": "blank"}])));
    }
}
