//! The pure core of atasira: every rule of the spec that needs no IO.
//!
//! Architecture Invariant: this crate performs no IO and depends on no runtime, transport,
//! database or wire-format crate (tokio, async-nats, sqlx, prost, axum). Adapters build
//! commands from the outside world (clock, ids, keys, look-ups) and feed them in; the
//! functions here decide. `tests/tidy.rs` enforces the dependency rule.

pub mod assertion;
pub mod audit;
pub mod bounds;
pub mod box_type;
pub mod change;
pub mod context;
pub mod decide;
pub mod draft_request;
pub mod error;
pub mod feasibility;
pub mod manifest;
pub mod notify;
pub mod org_policy;
pub mod os_operation;
pub mod policy;
pub mod principal;
pub mod token;
pub mod trigger;
pub mod worker;

pub mod aggregates;

pub use box_type::BoxType;
pub use error::{ErrorCode, FieldError, Refusing};
pub use manifest::BoxManifest;
pub use os_operation::OSOperation;
pub use principal::{Kind, Principal, Role};

error::refusing_via_code!(
    aggregates::draft::DraftError,
    aggregates::namespace::NamespaceError,
    aggregates::security::SecurityError,
    aggregates::pat::PatError,
    aggregates::assertion_keys::AssertionKeyPublishError,
    aggregates::org_policy::OrgPolicyError,
);

impl Refusing for policy::MentorEditError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
    fn field_errors(&self) -> Vec<error::FieldError> {
        policy::MentorEditError::field_errors(self)
    }
}

impl Refusing for policy::ConfigEditError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
    fn field_errors(&self) -> Vec<error::FieldError> {
        policy::ConfigEditError::field_errors(self)
    }
}

impl Refusing for aggregates::boxes::BoxError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
    fn field_errors(&self) -> Vec<error::FieldError> {
        match self {
            aggregates::boxes::BoxError::MentorEdit(e) => e.field_errors(),
            aggregates::boxes::BoxError::ConfigEdit(e) => e.field_errors(),
            aggregates::boxes::BoxError::ManifestInvalid(errors) => errors.clone(),
            _ => Vec::new(),
        }
    }
}

impl Refusing for draft_request::DraftRequestError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
    fn field_errors(&self) -> Vec<error::FieldError> {
        match self {
            draft_request::DraftRequestError::Invalid(errors) => errors.clone(),
            _ => Vec::new(),
        }
    }
}
