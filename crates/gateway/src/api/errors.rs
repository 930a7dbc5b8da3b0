//! The error body.

use super::*;

/// Every error answer: `{"error": code, "message": text, "details": optional}`. The code
/// always maps to the same status.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error code, e.g. `draft_not_pending`, `invalid_cursor`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = details_schema)]
    pub details: Option<Value>,
}
