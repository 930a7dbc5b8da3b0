//! Error codes of the spec, each with the one HTTP status it maps to.
//!
//! Every refusal the spec names has its own code here; transports (HTTP, NATS, CLI) map
//! `ErrorCode` to their own representation in exactly one place each.

use serde::{Deserialize, Serialize};

/// One validation problem, naming the manifest or request key it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// Dotted path of the key (`loop_control.max_iterations`, `os_operations[2]`).
    pub key: String,
    pub message: String,
}

impl FieldError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { key: key.into(), message: message.into() }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Field errors as one line (`key: message; key: message`), for error messages.
pub fn joined(errors: &[FieldError]) -> String {
    errors.iter().map(FieldError::to_string).collect::<Vec<_>>().join("; ")
}

/// Where the first text holding a NUL character is in a JSON value, keys included: `""`
/// for the value itself, else a path such as `.tools[1]` or `[0].url`. No store keeps such
/// text (PostgreSQL refuses it), so every entry point refuses it, naming the key.
pub fn nul_key(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    // Path segments innermost first; built only along the path that holds one.
    fn walk(value: &Value) -> Option<Vec<String>> {
        match value {
            Value::String(s) => s.contains('\0').then(Vec::new),
            Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| {
                walk(v).map(|mut path| {
                    path.push(format!("[{i}]"));
                    path
                })
            }),
            Value::Object(map) => map.iter().find_map(|(k, v)| {
                let inner = if k.contains('\0') { Some(Vec::new()) } else { walk(v) };
                inner.map(|mut path| {
                    path.push(format!(".{k}"));
                    path
                })
            }),
            _ => None,
        }
    }
    walk(value).map(|path| path.iter().rev().map(String::as_str).collect())
}

/// A refusal that carries one of the spec's codes: what every transport needs to answer
/// it (the code, the message, the keys at fault).
pub trait Refusing: std::fmt::Display {
    fn error_code(&self) -> ErrorCode;
    /// The request or manifest keys at fault, if the refusal is about keys.
    fn field_errors(&self) -> Vec<FieldError> {
        Vec::new()
    }
}

/// Implements [`Refusing`] for error enums that have an inherent `code()`.
macro_rules! refusing_via_code {
    ($($t:ty),+ $(,)?) => {
        $(impl $crate::error::Refusing for $t {
            fn error_code(&self) -> $crate::error::ErrorCode {
                self.code()
            }
        })+
    };
}
pub(crate) use refusing_via_code;

/// The spec's error codes (`{"error": code}`), with their HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the body is not JSON (R-DRAFT-14).
    InvalidJson,
    /// 401: no or unknown token (R-AUTH-1), or a missing/invalid assertion (R-AUTH-5).
    Unauthenticated,
    /// 403: known principal without the needed role or kind (R-AUTH-2).
    Forbidden,
    /// 403: a draft for `admin-pm`/`admin-ops` (R-DRAFT-4, INV-5).
    SelfPrivilegeForbidden,
    /// 403: deciding on one's own draft (R-AUTH-3).
    SelfApprovalForbidden,
    /// 403: mentor edit of a prohibited or unknown key (R-EDIT-2).
    MentorEditProhibitedKey,
    /// 403: a config edit that would widen capability (R-EDIT-3).
    CapabilityChangeRequiresNewDraft,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 404: no such draft.
    DraftNotFound,
    /// 404: no such Box.
    BoxNotFound,
    /// 409: the draft was already decided, withdrawn or expired (R-APPROVE-2).
    DraftNotPending,
    /// 409: over_limit draft approved without `confirm_over_limit` (R-APPROVE-3).
    OverLimitConfirmationRequired,
    /// 409: `ATASIRA_MAX_BOXES` active Boxes already (R-BOX-3).
    BoxLimitReached,
    /// 409: a non-archived Box or a live reservation holds this box_type (R-BOX-3).
    BoxTypeExists,
    /// 409: a manifest file the registry did not write is in the way (R-BOX-2).
    ManifestExists,
    /// 409: the Box is archived (terminal) or otherwise not in a state for the command.
    BoxNotActive,
    /// 409: the approval token does not verify or does not bind this activation (R-BOX-1).
    InvalidApprovalToken,
    /// 413: body or manifest over 1 MiB (R-DRAFT-14, SPEC §8).
    PayloadTooLarge,
    /// 422: manifest or draft content invalid (R-DRAFT-2, R-DRAFT-3, R-DRAFT-5, R-DRAFT-6, R-MAN-*).
    BoxManifestValidation,
    /// 422: unknown fields or wrong types in a request body (R-DRAFT-14).
    InvalidRequest,
    /// 422: an Idempotency-Key reused with a different body (R-DRAFT-11).
    IdempotencyKeyReuse,
    /// 500: a failure of ours (database, bug); never used for a user mistake.
    Internal,
    /// 503: a service did not answer in time or is not running.
    ServiceUnavailable,
    /// 409: a concurrent change to the same thing won; retrying may succeed.
    Conflict,
    /// 503: too much contention right now; retry after a moment (`Retry-After`).
    Busy,
    /// 429: this caller sent more requests than its rate allows; retry after `Retry-After`.
    RateLimited,
    /// 400: a `cursor` query parameter that no page ever returned.
    InvalidCursor,
    /// 400: a `limit` query parameter that is not a whole number in range.
    InvalidLimit,
    /// 400: another malformed query parameter (named in the details).
    InvalidQuery,
    /// 404: the user is not assigned to the Box (R-BOX-6).
    AssignmentNotFound,
    /// 404: no personal access token with this id (R-AUTH-4).
    TokenNotFound,
    /// 404: the ConfigBundle of the Box's current manifest was never synced (R-WORKER-2).
    BundleNotFound,
    /// 409: the bundle does not derive from the Box's approved manifest and its recorded
    /// edits (R-WORKER-6).
    BundleDigestMismatch,
    /// 422: the bundle belongs to another Box (R-WORKER-6).
    BundleProfileIncompatible,
    /// 404: no execution binding with this handle (R-WORKER-3).
    BindingNotFound,
    /// 410: the binding's lease ran out (R-WORKER-3).
    BindingExpired,
    /// 409: the binding was prepared for another Box (R-WORKER-6).
    BindingBoxMismatch,
    /// 409: the runtime cannot use this binding (its execution host, or it is held by another
    /// Worker) (R-WORKER-6).
    BindingUnusable,
    /// 409: the launch_id was used for a different request (R-WORKER-4).
    LaunchIdConflict,
    /// 422: an initial input segment that is not `text`, `ticket_ref` or `objective_ref`
    /// (R-WORKER-5).
    InvalidSegment,
    /// 404: no such Worker (R-WORKER-7).
    WorkerNotFound,
    /// 409: the Box has a change request pending already; one at a time (R-CHANGE-1).
    ChangeRequestPending,
    /// 409: the Box's manifest changed since the change request was made on it (R-CHANGE-1).
    ChangeBaseOutdated,
    /// 409: the Worker has ended or was lost; it takes no more input or stop (R-HOST-2).
    WorkerEnded,
    /// 404: no such tool-use request (R-DECIDE-2).
    ToolRequestNotFound,
    /// 409: the tool-use request was decided or expired already (R-DECIDE-2).
    ToolRequestNotPending,
    /// 429: the Box has as many triggered Workers running as its triggers may start; the
    /// event is refused, not queued (R-TRIG-1).
    TooManyWorkers,
    /// 403: a rule of the organisation's policy forbids it; the message names the policy
    /// version and the rule (R-POLICY-1).
    PolicyDenied,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 49] = [
        ErrorCode::InvalidJson,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::SelfPrivilegeForbidden,
        ErrorCode::SelfApprovalForbidden,
        ErrorCode::MentorEditProhibitedKey,
        ErrorCode::CapabilityChangeRequiresNewDraft,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::DraftNotFound,
        ErrorCode::BoxNotFound,
        ErrorCode::DraftNotPending,
        ErrorCode::OverLimitConfirmationRequired,
        ErrorCode::BoxLimitReached,
        ErrorCode::BoxTypeExists,
        ErrorCode::ManifestExists,
        ErrorCode::BoxNotActive,
        ErrorCode::InvalidApprovalToken,
        ErrorCode::PayloadTooLarge,
        ErrorCode::BoxManifestValidation,
        ErrorCode::InvalidRequest,
        ErrorCode::IdempotencyKeyReuse,
        ErrorCode::Internal,
        ErrorCode::ServiceUnavailable,
        ErrorCode::Conflict,
        ErrorCode::Busy,
        ErrorCode::RateLimited,
        ErrorCode::InvalidCursor,
        ErrorCode::InvalidLimit,
        ErrorCode::InvalidQuery,
        ErrorCode::AssignmentNotFound,
        ErrorCode::TokenNotFound,
        ErrorCode::BundleNotFound,
        ErrorCode::BundleDigestMismatch,
        ErrorCode::BundleProfileIncompatible,
        ErrorCode::BindingNotFound,
        ErrorCode::BindingExpired,
        ErrorCode::BindingBoxMismatch,
        ErrorCode::BindingUnusable,
        ErrorCode::LaunchIdConflict,
        ErrorCode::InvalidSegment,
        ErrorCode::WorkerNotFound,
        ErrorCode::ChangeRequestPending,
        ErrorCode::ChangeBaseOutdated,
        ErrorCode::WorkerEnded,
        ErrorCode::ToolRequestNotFound,
        ErrorCode::ToolRequestNotPending,
        ErrorCode::TooManyWorkers,
        ErrorCode::PolicyDenied,
    ];

    /// The wire code, e.g. `box_limit_reached`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::SelfPrivilegeForbidden => "self_privilege_forbidden",
            ErrorCode::SelfApprovalForbidden => "self_approval_forbidden",
            ErrorCode::MentorEditProhibitedKey => "mentor_edit_prohibited_key",
            ErrorCode::CapabilityChangeRequiresNewDraft => "capability_change_requires_new_draft",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::DraftNotFound => "draft_not_found",
            ErrorCode::BoxNotFound => "box_not_found",
            ErrorCode::DraftNotPending => "draft_not_pending",
            ErrorCode::OverLimitConfirmationRequired => "over_limit_confirmation_required",
            ErrorCode::BoxLimitReached => "box_limit_reached",
            ErrorCode::BoxTypeExists => "box_type_exists",
            ErrorCode::ManifestExists => "manifest_exists",
            ErrorCode::BoxNotActive => "box_not_active",
            ErrorCode::InvalidApprovalToken => "invalid_approval_token",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BoxManifestValidation => "box_manifest_validation",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::IdempotencyKeyReuse => "idempotency_key_reuse",
            ErrorCode::Internal => "internal",
            ErrorCode::ServiceUnavailable => "service_unavailable",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Busy => "busy",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::InvalidCursor => "invalid_cursor",
            ErrorCode::InvalidLimit => "invalid_limit",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::AssignmentNotFound => "assignment_not_found",
            ErrorCode::TokenNotFound => "token_not_found",
            ErrorCode::BundleNotFound => "bundle_not_found",
            ErrorCode::BundleDigestMismatch => "bundle_digest_mismatch",
            ErrorCode::BundleProfileIncompatible => "bundle_profile_incompatible",
            ErrorCode::BindingNotFound => "binding_not_found",
            ErrorCode::BindingExpired => "binding_expired",
            ErrorCode::BindingBoxMismatch => "binding_box_mismatch",
            ErrorCode::BindingUnusable => "binding_unusable",
            ErrorCode::LaunchIdConflict => "launch_id_conflict",
            ErrorCode::InvalidSegment => "invalid_segment",
            ErrorCode::WorkerNotFound => "worker_not_found",
            ErrorCode::ChangeRequestPending => "change_request_pending",
            ErrorCode::ChangeBaseOutdated => "change_base_outdated",
            ErrorCode::WorkerEnded => "worker_ended",
            ErrorCode::ToolRequestNotFound => "tool_request_not_found",
            ErrorCode::ToolRequestNotPending => "tool_request_not_pending",
            ErrorCode::TooManyWorkers => "too_many_workers",
            ErrorCode::PolicyDenied => "policy_denied",
        }
    }

    /// Parses a wire code (as carried in error replies between services).
    pub fn parse(code: &str) -> Option<ErrorCode> {
        serde_json::from_value(serde_json::Value::String(code.to_owned())).ok()
    }

    /// The HTTP status this code always answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidJson | ErrorCode::InvalidCursor | ErrorCode::InvalidLimit | ErrorCode::InvalidQuery => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden
            | ErrorCode::SelfPrivilegeForbidden
            | ErrorCode::SelfApprovalForbidden
            | ErrorCode::MentorEditProhibitedKey
            | ErrorCode::CapabilityChangeRequiresNewDraft
            | ErrorCode::PolicyDenied => 403,
            ErrorCode::NotFound | ErrorCode::DraftNotFound | ErrorCode::BoxNotFound | ErrorCode::AssignmentNotFound | ErrorCode::TokenNotFound => 404,
            ErrorCode::BundleNotFound | ErrorCode::BindingNotFound | ErrorCode::WorkerNotFound | ErrorCode::ToolRequestNotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::DraftNotPending
            | ErrorCode::OverLimitConfirmationRequired
            | ErrorCode::BoxLimitReached
            | ErrorCode::BoxTypeExists
            | ErrorCode::ManifestExists
            | ErrorCode::BoxNotActive
            | ErrorCode::InvalidApprovalToken
            | ErrorCode::Conflict
            | ErrorCode::BundleDigestMismatch
            | ErrorCode::BindingBoxMismatch
            | ErrorCode::BindingUnusable
            | ErrorCode::LaunchIdConflict
            | ErrorCode::ChangeRequestPending
            | ErrorCode::ChangeBaseOutdated
            | ErrorCode::WorkerEnded
            | ErrorCode::ToolRequestNotPending => 409,
            ErrorCode::BindingExpired => 410,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::BoxManifestValidation | ErrorCode::InvalidRequest | ErrorCode::IdempotencyKeyReuse => 422,
            ErrorCode::BundleProfileIncompatible | ErrorCode::InvalidSegment => 422,
            ErrorCode::RateLimited | ErrorCode::TooManyWorkers => 429,
            ErrorCode::Internal => 500,
            ErrorCode::ServiceUnavailable | ErrorCode::Busy => 503,
        }
    }

    /// Refusals that the spec calls security violations (R-AUDIT-5): the refusing service
    /// appends a `SecurityViolation` event for them.
    pub fn is_security_violation(self) -> bool {
        matches!(self, ErrorCode::SelfApprovalForbidden | ErrorCode::MentorEditProhibitedKey | ErrorCode::InvalidApprovalToken)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_code_equals_serde_name_for_every_code() {
        // One source of truth: the serde name and `as_str` never drift apart.
        for code in ErrorCode::ALL {
            let json = serde_json::to_value(code).expect("serializes");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert_eq!(json, serde_json::Value::String(code.as_str().into()));
            let user_mistake = !matches!(code, ErrorCode::Internal | ErrorCode::ServiceUnavailable | ErrorCode::Busy);
            assert_eq!((400..500).contains(&code.http_status()), user_mistake, "{code}: user mistakes are 4xx, only our failures 5xx");
        }
    }

    #[test]
    fn the_key_of_text_with_a_nul_is_named() {
        let v = serde_json::json!({"a": "ok", "tools": ["Read", "B\u{0}"], "n": 1});
        assert_eq!(nul_key(&v), Some(".tools[1]".to_owned()));
        assert_eq!(nul_key(&serde_json::json!([{"url": "u\u{0}"}])), Some("[0].url".to_owned()));
        assert_eq!(nul_key(&serde_json::json!({"k\u{0}": 1})), Some(".k\u{0}".to_owned()));
        assert_eq!(nul_key(&serde_json::json!("x\u{0}")), Some(String::new()));
        assert_eq!(nul_key(&serde_json::json!({"a": ["b", {"c": null}]})), None);
    }

    #[test]
    fn statuses_follow_the_spec() {
        // R-DRAFT-14, R-APPROVE-3, R-BOX-3, R-AUTH-3
        assert_eq!(ErrorCode::PayloadTooLarge.http_status(), 413);
        assert_eq!(ErrorCode::InvalidJson.http_status(), 400);
        assert_eq!(ErrorCode::InvalidCursor.http_status(), 400);
        assert_eq!(ErrorCode::InvalidLimit.http_status(), 400);
        assert_eq!(ErrorCode::InvalidQuery.http_status(), 400);
        assert_eq!(ErrorCode::OverLimitConfirmationRequired.http_status(), 409);
        assert_eq!(ErrorCode::BoxLimitReached.http_status(), 409);
        assert_eq!(ErrorCode::SelfApprovalForbidden.http_status(), 403);
        assert_eq!(ErrorCode::CapabilityChangeRequiresNewDraft.http_status(), 403);
    }
}
