//! The audit ledger.

use super::*;

/// One ledger row: hash-chained and MACed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditRow {
    pub seq: i64,
    /// RFC 3339 in UTC with exactly three fractional digits (the MACed text).
    #[schema(format = DateTime)]
    pub time: String,
    /// e.g. `box_draft.create`, `box.activate`, `security_violation`.
    pub action: String,
    pub actor: String,
    pub target: String,
    pub event_id: String,
    /// `sha256:<hex>` of the event payload.
    pub payload_digest: String,
    /// What happened, in a line of at most 500 characters: the refusal and what was refused
    /// for a security violation or a refused launch, the decision and what it grants for
    /// approvals and edits, the reason for a rejection. Covered by `mac`. Empty in rows
    /// written before rows had a detail.
    pub detail: String,
    /// The id of the key that made `mac`.
    pub key_id: String,
    /// Lowercase hex HMAC-SHA256 over the row and the previous row's MAC.
    pub mac: String,
}

/// A page of ledger rows in seq order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditRows {
    pub rows: Vec<AuditRow>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// What changed, as `GET /api/v1/events/stream` announces it: the read models have applied
/// the store up to `position` (0: unknown, re-read everything the topics name).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StreamChange {
    pub position: i64,
    /// The views that may have changed.
    pub topics: Vec<StreamTopic>,
}

/// A kind of view a change concerns: `drafts` (pending and own drafts), `boxes` (Boxes,
/// their manifests, assignments and history), `workers`, `audit` (the ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamTopic {
    Drafts,
    Boxes,
    Workers,
    Audit,
}

impl StreamTopic {
    /// Every topic: what a client that may have missed changes reads again.
    pub const ALL: [StreamTopic; 4] = [StreamTopic::Drafts, StreamTopic::Boxes, StreamTopic::Workers, StreamTopic::Audit];
}

/// `{"ok": true, "rows": N}` or `{"ok": false, "first_bad_seq": S, "reason": "..."}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VerifyResult {
    pub ok: bool,
    /// How many rows verified (`ok: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The first row that does not verify (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad_seq: Option<i64>,
    /// What is wrong with it (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One line of a ledger export (`GET /api/v1/audit/export`): as a JSON object in `jsonl`, as
/// a record under the header's column names in `csv`. `type` says which line it is: the
/// `export` header (JSON lines only: the period, the seqs it spans, the checkpoint key),
/// a `row` (the ledger row with its `digest`, lowercase hex SHA-256 of the row's JSON) or a
/// `checkpoint` (after the last row it covers: the rows after `covers_after`, signed with
/// Ed25519 by `public_key`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditExportLine {
    /// `export`, `row` or `checkpoint`.
    #[serde(rename = "type")]
    pub kind: String,
    pub seq: Option<i64>,
    pub time: Option<String>,
    pub action: Option<String>,
    pub actor: Option<String>,
    pub target: Option<String>,
    pub event_id: Option<String>,
    pub payload_digest: Option<String>,
    pub detail: Option<String>,
    pub key_id: Option<String>,
    pub mac: Option<String>,
    pub digest: Option<String>,
    pub head_mac: Option<String>,
    pub prev_seq: Option<i64>,
    pub prev_mac: Option<String>,
    pub covers_after: Option<i64>,
    pub rows_digest: Option<String>,
    pub public_key: Option<String>,
    pub signature: Option<String>,
}
