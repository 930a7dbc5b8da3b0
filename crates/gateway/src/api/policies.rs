//! The organisation's policy: Cedar rules every draft, change request, config edit, Worker
//! launch and runtime approval meets.

use super::*;

/// `PUT /api/v1/policies`: the new version's text. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishPolicyRequest {
    /// Cedar policies. `forbid` rules refuse (`@id` names the rule, `@reason` says why);
    /// matching `permit` rules may ask for more: `@approvals("N")` distinct human admins,
    /// `@confirm("true")` the second confirmation. Everything no rule forbids is permitted.
    #[schema(min_length = 1, max_length = 65536, pattern = r"^[^\u0000]*\S[^\u0000]*$")]
    pub text: String,
}

/// `permit` or `forbid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyEffect {
    Permit,
    Forbid,
}

/// One rule of the policy.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PolicyRule {
    /// Its `@id`, or `policyN` by its place in the text.
    pub id: String,
    pub effect: PolicyEffect,
    /// Its `@reason`: what a refusal says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its `@approvals`: distinct human admins it requires where it matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approvals: Option<u32>,
    /// Its `@confirm`: the second confirmation at approval where it matches.
    pub confirm: bool,
}

/// The organisation's policy in force (version 0: none was ever published; everything the
/// built-in rules allow is allowed).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Policy {
    pub version: u64,
    /// `sha256:<hex>` of the text; empty for version 0.
    pub digest: String,
    pub text: String,
    pub rules: Vec<PolicyRule>,
    pub published_by: Option<String>,
    pub published_at: Option<DateTime<Utc>>,
}

/// `POST /api/v1/policies/check`: a dry run; nothing is recorded. Unknown fields are
/// refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyCheckRequest {
    /// A proposed version: put, beside the one in force, to every pending draft and change
    /// request and every Box. Absent: the one in force.
    #[serde(default)]
    #[schema(max_length = 65536, pattern = r"^[^\u0000]*$")]
    pub text: Option<String>,
    /// A proposed draft, as `POST /api/v1/boxes/box-drafts` takes it, put to the proposed
    /// version (or the one in force) as the caller's.
    #[serde(default)]
    #[schema(value_type = Option<BoxDraftCreateRequest>)]
    pub draft: Option<Value>,
}

/// `allow` or `deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyDecision {
    Allow,
    Deny,
}

/// What a policy version decides on one request.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PolicyOutcome {
    /// The version that decided (0: no policy).
    pub version: u64,
    pub decision: PolicyDecision,
    /// The deciding rules: those that forbid it, or those that ask for more.
    pub rules: Vec<String>,
    pub approvals_required: u32,
    pub confirm: bool,
    /// A denial's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a check put to the policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyChangeKind {
    /// A pending draft of a new Box (as its requester submitted it).
    Draft,
    /// A pending change request.
    Change,
    /// A Box that is not archived (its next Worker launch).
    Box,
}

/// A pending draft, change request or Box the proposed version decides differently.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PolicyChange {
    pub kind: PolicyChangeKind,
    /// The draft id or the Box id.
    pub id: String,
    pub box_type: String,
    pub before: PolicyOutcome,
    pub after: PolicyOutcome,
}

/// A dry run's answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PolicyCheck {
    pub active_version: u64,
    /// The proposed draft's outcome, if one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft: Option<PolicyOutcome>,
    /// What the proposed version decides differently (empty without one).
    pub changes: Vec<PolicyChange>,
    /// How many pending drafts and Boxes were put to both versions.
    pub checked: u32,
    /// More than one check takes: the rest were not checked.
    pub truncated: bool,
}
