//! Query parameters, parsed into typed values before any service is asked. The rules, the
//! same on every route that takes query parameters:
//!
//! - `cursor`: the `next_cursor` of the previous page, a decimal position (at most 18
//!   digits); anything else is 400 `invalid_cursor`.
//! - `limit`: a whole number of at least 1 (decimal digits); `0`, `-1`, `abc` or an empty
//!   value are 400 `invalid_limit`. A limit over the route's maximum is clamped to it.
//! - every other parameter: an unknown name, a repeated name, an empty value or a malformed
//!   value (one with a NUL character, say) is 400 `invalid_query`, with `details.parameter`
//!   naming it.

use atasira_domain::ErrorCode;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use serde_json::json;
use utoipa::IntoParams;

use crate::{ApiError, api};

/// The `Idempotency-Key` header of the writes.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // Only documents the header; `extract::IdempotencyKey` reads it.
pub struct IdempotencyHeader {
    /// Retries with the same key (per caller, kept 24 h) get the first answer, with
    /// `Idempotent-Replayed: true`, waiting for it while it is in progress (then 503 with
    /// `Retry-After`); the same key with a different request is 422
    /// `idempotency_key_reuse`. 1 to 255 visible ASCII characters, no spaces; anything else
    /// is 422 `invalid_request`.
    #[param(rename = "Idempotency-Key", value_type = String, required = false, pattern = "^[!-~]{1,255}$")]
    pub idempotency_key: Option<String>,
}

/// Query parameters of one route, parsed from the query string's name/value pairs.
pub trait FromQuery: Sized {
    /// The names this route accepts.
    const NAMES: &'static [&'static str];
    fn from_query(query: &Pairs) -> Result<Self, ApiError>;
}

/// The extractor: `Params<T>` for a route whose query parameters are `T`.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: FromQuery> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, format!("unreadable query string: {}", e.body_text())))?;
        let pairs = Pairs::new(pairs, T::NAMES)?;
        T::from_query(&pairs).map(Params)
    }
}

/// The checked name/value pairs of a query string: known names, each at most once, none
/// empty.
#[derive(Debug)]
pub struct Pairs(Vec<(String, String)>);

impl Pairs {
    fn new(pairs: Vec<(String, String)>, names: &[&str]) -> Result<Self, ApiError> {
        for (i, (name, value)) in pairs.iter().enumerate() {
            if !names.contains(&name.as_str()) {
                let known = names.join(", ");
                return Err(invalid(ErrorCode::InvalidQuery, name, format!("unknown query parameter {name:?}; this route takes {known}")));
            }
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Err(invalid(code_for(name), name, format!("query parameter {name} is given more than once")));
            }
            if value.is_empty() {
                return Err(invalid(code_for(name), name, format!("query parameter {name} is empty")));
            }
            if value.contains('\0') {
                return Err(invalid(code_for(name), name, format!("query parameter {name} holds a NUL character")));
            }
        }
        Ok(Self(pairs))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

fn code_for(name: &str) -> ErrorCode {
    match name {
        "cursor" => ErrorCode::InvalidCursor,
        "limit" => ErrorCode::InvalidLimit,
        _ => ErrorCode::InvalidQuery,
    }
}

fn invalid(code: ErrorCode, parameter: &str, message: String) -> ApiError {
    ApiError::new(code, message).with_details(Some(json!({"parameter": parameter})))
}

/// A position to continue after: the `next_cursor` of an earlier page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(u64);

impl Cursor {
    /// The most digits a cursor has (every position fits in 18 digits).
    const MAX_DIGITS: usize = 18;

    fn parse(text: &str) -> Result<Self, ApiError> {
        let bad = || invalid(ErrorCode::InvalidCursor, "cursor", format!("cursor {text:?} is not the next_cursor of a page"));
        if text.is_empty() || text.len() > Self::MAX_DIGITS || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        text.parse().map(Cursor).map_err(|_| bad())
    }

    /// The position the services take.
    pub fn wire(self) -> u64 {
        self.0
    }
}

/// A page size of at least 1, clamped to the route's maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(u32);

impl Limit {
    fn parse(text: &str, max: u32) -> Result<Self, ApiError> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(ErrorCode::InvalidLimit, "limit", format!("limit {text:?} is not a whole number of at least 1")));
        }
        if text.bytes().all(|b| b == b'0') {
            return Err(invalid(ErrorCode::InvalidLimit, "limit", "limit must be at least 1".to_owned()));
        }
        // All digits and not zero: only too large a number fails to parse, and that is clamped.
        Ok(Limit(text.parse::<u32>().unwrap_or(u32::MAX).min(max)))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

/// `limit` and `cursor` of a page; absent means the default size and the first page.
#[derive(Debug, Default, Clone, Copy)]
pub struct Page {
    pub limit: Option<Limit>,
    pub cursor: Option<Cursor>,
}

impl Page {
    fn from_query(query: &Pairs, max: u32) -> Result<Self, ApiError> {
        Ok(Self { limit: query.get("limit").map(|l| Limit::parse(l, max)).transpose()?, cursor: query.get("cursor").map(Cursor::parse).transpose()? })
    }

    /// The page size the services take (0: their default).
    pub fn limit(&self) -> u32 {
        self.limit.map(Limit::get).unwrap_or(0)
    }

    /// The position after which the page starts (0: the first page).
    pub fn after(&self) -> u64 {
        self.cursor.map(Cursor::wire).unwrap_or(0)
    }
}

/// Largest page of drafts.
pub const DRAFTS_PAGE_MAX: u32 = 200;
/// Largest page of audit rows.
pub const AUDIT_PAGE_MAX: u32 = 500;

/// `GET /api/v1/boxes/box-drafts/pending`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PendingQuery {
    /// Page size: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<Cursor>,
}

impl FromQuery for PendingQuery {
    const NAMES: &'static [&'static str] = &["limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let page = Page::from_query(query, DRAFTS_PAGE_MAX)?;
        Ok(Self { limit: page.limit, cursor: page.cursor })
    }
}

impl PendingQuery {
    pub fn page(&self) -> Page {
        Page { limit: self.limit, cursor: self.cursor }
    }
}

/// `GET /api/v1/boxes/box-drafts?mine=&status=`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DraftsQuery {
    /// `true`: the caller's own drafts (anyone). `false` or absent: every requester's
    /// drafts (role admin).
    #[param(value_type = Option<bool>)]
    pub mine: bool,
    /// Only drafts with this status; `approved` includes drafts whose Box is active.
    #[param(value_type = Option<api::DraftStatus>, inline)]
    pub status: Option<api::DraftStatus>,
    /// Page size: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<Cursor>,
}

/// A snake_case word of a closed set, or 400 naming the parameter and the words.
fn one_of<T: serde::de::DeserializeOwned>(query: &Pairs, name: &str, words: &[&str]) -> Result<Option<T>, ApiError> {
    let Some(text) = query.get(name) else { return Ok(None) };
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map(Some)
        .map_err(|_| invalid(ErrorCode::InvalidQuery, name, format!("{name}={text} is not one of {}", words.join(", "))))
}

/// The schema of `limit`: a whole number of at least 1, any size (larger than the route's
/// maximum reads as the maximum).
#[derive(Debug)]
pub struct PageSize;

impl utoipa::PartialSchema for PageSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new().schema_type(SchemaType::Type(Type::Integer)).minimum(Some(1)).into()
    }
}

impl utoipa::ToSchema for PageSize {}

impl FromQuery for DraftsQuery {
    const NAMES: &'static [&'static str] = &["mine", "status", "limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let mine = match query.get("mine") {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(invalid(ErrorCode::InvalidQuery, "mine", format!("mine={other} is not supported: use mine=true or mine=false"))),
        };
        let status = one_of(query, "status", &["pending_approval", "approved", "active", "rejected", "withdrawn", "expired"])?;
        let page = Page::from_query(query, DRAFTS_PAGE_MAX)?;
        Ok(Self { mine, status, limit: page.limit, cursor: page.cursor })
    }
}

impl DraftsQuery {
    pub fn page(&self) -> Page {
        Page { limit: self.limit, cursor: self.cursor }
    }
}

/// Largest page of Boxes.
pub const BOXES_PAGE_MAX: u32 = 200;

/// `GET /api/v1/boxes?state=`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BoxesQuery {
    /// Which Boxes: `idle`, `running` (a Worker of the Box runs), `stopped`, `archived` or
    /// `all`. Absent: the active ones (`idle` and `running`), not stopped
    /// or archived ones.
    #[param(value_type = Option<api::BoxStateFilter>, inline)]
    pub state: Option<api::BoxStateFilter>,
    /// Page size: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<Cursor>,
}

impl FromQuery for BoxesQuery {
    const NAMES: &'static [&'static str] = &["state", "limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let state = one_of(query, "state", &["idle", "running", "stopped", "archived", "all"])?;
        let page = Page::from_query(query, BOXES_PAGE_MAX)?;
        Ok(Self { state, limit: page.limit, cursor: page.cursor })
    }
}

impl BoxesQuery {
    pub fn page(&self) -> Page {
        Page { limit: self.limit, cursor: self.cursor }
    }
}

/// `GET /api/v1/tool-requests?state=`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ToolRequestsQuery {
    /// Which requests: `pending` (the default), `approved`, `rejected`, `expired` or `all`.
    #[param(value_type = Option<api::ToolRequestStateFilter>, inline)]
    pub state: Option<api::ToolRequestStateFilter>,
    /// Page size: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<Cursor>,
}

impl FromQuery for ToolRequestsQuery {
    const NAMES: &'static [&'static str] = &["state", "limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let state = one_of(query, "state", &["pending", "approved", "rejected", "expired", "all"])?;
        let page = Page::from_query(query, WORKERS_PAGE_MAX)?;
        Ok(Self { state, limit: page.limit, cursor: page.cursor })
    }
}

impl ToolRequestsQuery {
    pub fn page(&self) -> Page {
        Page { limit: self.limit, cursor: self.cursor }
    }
}

/// Where a page of a history continues: the commit order's transaction id and position,
/// as `<tx>.<position>` (the `next_cursor` of the previous page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitCursor {
    pub tx_id: u64,
    pub position: u64,
}

impl CommitCursor {
    fn parse(text: &str) -> Result<Self, ApiError> {
        let bad = || invalid(ErrorCode::InvalidCursor, "cursor", format!("cursor {text:?} is not the next_cursor of a page"));
        let (tx, position) = text.split_once('.').ok_or_else(bad)?;
        let number = |part: &str| -> Result<u64, ApiError> {
            if part.is_empty() || part.len() > Cursor::MAX_DIGITS || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse().map_err(|_| bad())
        };
        Ok(Self { tx_id: number(tx)?, position: number(position)? })
    }

    /// The `next_cursor` text of a page ending at (`tx_id`, `position`).
    pub fn text(tx_id: u64, position: u64) -> String {
        format!("{tx_id}.{position}")
    }
}

/// Largest page of a Box's history.
pub const HISTORY_PAGE_MAX: u32 = 200;

/// `GET /api/v1/boxes/{box_id}/history`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Page size: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = r"^[0-9]{1,18}\.[0-9]{1,18}$")]
    pub cursor: Option<CommitCursor>,
}

impl FromQuery for HistoryQuery {
    const NAMES: &'static [&'static str] = &["limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        Ok(Self {
            limit: query.get("limit").map(|l| Limit::parse(l, HISTORY_PAGE_MAX)).transpose()?,
            cursor: query.get("cursor").map(CommitCursor::parse).transpose()?,
        })
    }
}

/// `GET /api/v1/boxes/{box_id}`: now, or as it was.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AsOfQuery {
    /// The Box as it was: after the events up to this store position (the
    /// `X-Atasira-Position` a write answered, or a history entry's), or recorded at or
    /// before this RFC 3339 time. Absent: now.
    #[param(
        value_type = Option<String>,
        pattern = r"^([1-9][0-9]{0,17}|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))$"
    )]
    pub at: Option<AsOf>,
}

/// A point in the store's past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsOf {
    Position(i64),
    Time(DateTime<Utc>),
}

impl AsOfQuery {
    /// A request's `at` (a position, 0 for none) and `at_time`.
    pub fn wire(&self) -> (i64, Option<prost_types::Timestamp>) {
        match self.at {
            None => (0, None),
            Some(AsOf::Position(p)) => (p, None),
            Some(AsOf::Time(t)) => (0, Some(atasira_contracts::convert::timestamp(t))),
        }
    }
}

impl FromQuery for AsOfQuery {
    const NAMES: &'static [&'static str] = &["at"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let at = match query.get("at") {
            None => None,
            Some(text) => Some(match text.parse::<i64>() {
                Ok(p) if p > 0 => AsOf::Position(p),
                _ => AsOf::Time(
                    DateTime::parse_from_rfc3339(text)
                        .map_err(|_| {
                            invalid(
                                ErrorCode::InvalidQuery,
                                "at",
                                format!("at {text:?} is neither a store position (a whole number from 1) nor an RFC 3339 time"),
                            )
                        })?
                        .with_timezone(&Utc),
                ),
            }),
        };
        Ok(Self { at })
    }
}

/// Largest page of a Box's Workers.
pub const WORKERS_PAGE_MAX: u32 = 200;

/// `GET /api/v1/boxes/{box_id}/workers`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WorkersQuery {
    /// Page size: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<Cursor>,
}

impl FromQuery for WorkersQuery {
    const NAMES: &'static [&'static str] = &["limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let page = Page::from_query(query, WORKERS_PAGE_MAX)?;
        Ok(Self { limit: page.limit, cursor: page.cursor })
    }
}

impl WorkersQuery {
    pub fn page(&self) -> Page {
        Page { limit: self.limit, cursor: self.cursor }
    }
}

/// `GET /api/v1/audit`: filters (all must match) and a page.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only rows of this action, e.g. `box_draft.approve`.
    #[param(pattern = r"^[^\u0000]+$")]
    pub action: Option<String>,
    /// Only rows about this target (a draft or Box id).
    #[param(pattern = r"^[^\u0000]+$")]
    pub target: Option<String>,
    /// Only rows at or after this RFC 3339 time.
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<DateTime<Utc>>,
    /// Page size: a whole number of at least 1 (default 50); more than 500 is read as 500.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
    /// The `next_cursor` of the previous page.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,18}$")]
    pub cursor: Option<Cursor>,
}

impl FromQuery for AuditQuery {
    const NAMES: &'static [&'static str] = &["action", "target", "since", "limit", "cursor"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let since = match query.get("since") {
            None => None,
            Some(text) => Some(
                DateTime::parse_from_rfc3339(text)
                    .map_err(|e| invalid(ErrorCode::InvalidQuery, "since", format!("since {text:?} is not an RFC 3339 time: {e}")))?
                    .with_timezone(&Utc),
            ),
        };
        let page = Page::from_query(query, AUDIT_PAGE_MAX)?;
        Ok(Self {
            action: query.get("action").map(str::to_owned),
            target: query.get("target").map(str::to_owned),
            since,
            limit: page.limit,
            cursor: page.cursor,
        })
    }
}

/// How `GET /api/v1/audit/export` writes the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ExportFormat {
    /// One JSON object a line: an `export` header, then `row` and `checkpoint` lines.
    Jsonl,
    /// CSV with a header line; a `type` column says which lines are rows and checkpoints.
    Csv,
}

/// `GET /api/v1/audit/export`'s parameters.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// Rows at or after this RFC 3339 time (absent: from the start).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<DateTime<Utc>>,
    /// Rows before this RFC 3339 time (absent: up to now).
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<DateTime<Utc>>,
    /// `jsonl` (the default) or `csv`.
    #[param(value_type = Option<ExportFormat>)]
    pub format: Option<ExportFormat>,
}

impl FromQuery for ExportQuery {
    const NAMES: &'static [&'static str] = &["since", "until", "format"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let time = |name: &str| match query.get(name) {
            None => Ok(None),
            Some(text) => DateTime::parse_from_rfc3339(text)
                .map(|t| Some(t.with_timezone(&Utc)))
                .map_err(|e| invalid(ErrorCode::InvalidQuery, name, format!("{name} {text:?} is not an RFC 3339 time: {e}"))),
        };
        let format = match query.get("format") {
            None => None,
            Some("jsonl") => Some(ExportFormat::Jsonl),
            Some("csv") => Some(ExportFormat::Csv),
            Some(other) => return Err(invalid(ErrorCode::InvalidQuery, "format", format!("format {other:?}: use jsonl or csv"))),
        };
        Ok(Self { since: time("since")?, until: time("until")?, format })
    }
}

impl AuditQuery {
    pub fn page(&self) -> Page {
        Page { limit: self.limit, cursor: self.cursor }
    }
}

/// Largest page of a webhook's deliveries.
pub const WEBHOOK_DELIVERIES_PAGE_MAX: u32 = 200;

/// `GET /api/v1/webhooks/{webhook_id}/deliveries?state=&limit=`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WebhookDeliveriesQuery {
    /// Only deliveries in this state: `pending`, `delivered` or `dead`. Absent: all.
    #[param(value_type = Option<api::WebhookDeliveryState>, inline)]
    pub state: Option<api::WebhookDeliveryState>,
    /// How many: a whole number of at least 1 (default 50); more than 200 is read as 200.
    #[param(value_type = PageSize, inline, required = false)]
    pub limit: Option<Limit>,
}

impl FromQuery for WebhookDeliveriesQuery {
    const NAMES: &'static [&'static str] = &["state", "limit"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let state = one_of(query, "state", &["pending", "delivered", "dead"])?;
        let limit = query.get("limit").map(|l| Limit::parse(l, WEBHOOK_DELIVERIES_PAGE_MAX)).transpose()?;
        Ok(Self { state, limit })
    }
}

/// `GET /api/v1/auth/tokens`: filters.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TokensQuery {
    /// Only this user's tokens.
    #[param(pattern = r"^[^\u0000]+$")]
    pub user_id: Option<String>,
    /// Only tokens in this state.
    #[param(inline)]
    pub state: Option<crate::api::TokenState>,
}

impl FromQuery for TokensQuery {
    const NAMES: &'static [&'static str] = &["user_id", "state"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let state = match query.get("state") {
            None => None,
            Some("active") => Some(crate::api::TokenState::Active),
            Some("expired") => Some(crate::api::TokenState::Expired),
            Some("revoked") => Some(crate::api::TokenState::Revoked),
            Some(other) => return Err(invalid(ErrorCode::InvalidQuery, "state", format!("state {other:?} is not one of active, expired, revoked"))),
        };
        Ok(Self { user_id: query.get("user_id").map(str::to_owned), state })
    }
}

/// `DELETE /api/v1/auth/tokens`: whose tokens to revoke (required).
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RevokeUserQuery {
    /// Revoke every token of this user.
    #[param(pattern = r"^[^\u0000]+$")]
    pub user_id: String,
}

impl FromQuery for RevokeUserQuery {
    const NAMES: &'static [&'static str] = &["user_id"];
    fn from_query(query: &Pairs) -> Result<Self, ApiError> {
        let user_id = query
            .get("user_id")
            .ok_or_else(|| invalid(ErrorCode::InvalidQuery, "user_id", "name the user whose tokens to revoke: ?user_id=USER".to_owned()))?;
        Ok(Self { user_id: user_id.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse<T: FromQuery>(query: &str) -> Result<T, (u16, String, String)> {
        let pairs: Vec<(String, String)> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (n, v) = p.split_once('=').unwrap_or((p, ""));
                (n.to_owned(), v.to_owned())
            })
            .collect();
        Pairs::new(pairs, T::NAMES).and_then(|p| T::from_query(&p)).map_err(|e| {
            let parameter = e.details.as_ref().and_then(|d| d["parameter"].as_str()).unwrap_or_default().to_owned();
            (e.code.http_status(), e.code.as_str().to_owned(), parameter)
        })
    }

    fn refusal(code: &str, parameter: &str) -> (u16, String, String) {
        (400, code.to_owned(), parameter.to_owned())
    }

    #[test]
    fn cursors_are_decimal_positions() {
        assert_eq!(parse::<PendingQuery>("cursor=42").map(|q| q.page().after()), Ok(42));
        assert_eq!(parse::<PendingQuery>("").map(|q| q.page().after()), Ok(0));
        for bad in ["cursor=abc", "cursor=-1", "cursor=1.5", "cursor=", "cursor=1234567890123456789", "cursor=%20", "cursor=1&cursor=2"] {
            assert_eq!(parse::<PendingQuery>(bad).err(), Some(refusal("invalid_cursor", "cursor")), "{bad}");
        }
    }

    #[test]
    fn limits_are_at_least_one_and_clamped() {
        assert_eq!(parse::<PendingQuery>("limit=7").map(|q| q.page().limit()), Ok(7));
        assert_eq!(parse::<PendingQuery>("limit=201").map(|q| q.page().limit()), Ok(DRAFTS_PAGE_MAX));
        assert_eq!(parse::<PendingQuery>("limit=99999999999999999999999").map(|q| q.page().limit()), Ok(DRAFTS_PAGE_MAX));
        assert_eq!(parse::<AuditQuery>("limit=501").map(|q| q.page().limit()), Ok(AUDIT_PAGE_MAX));
        assert_eq!(parse::<PendingQuery>("").map(|q| q.page().limit()), Ok(0), "absent: the service's default");
        for bad in ["limit=0", "limit=00", "limit=-1", "limit=abc", "limit=", "limit=1e3", "limit=+5"] {
            assert_eq!(parse::<PendingQuery>(bad).err(), Some(refusal("invalid_limit", "limit")), "{bad}");
        }
    }

    #[test]
    fn mine_is_true_or_false_and_status_a_draft_status() {
        // R-DRAFT-12
        assert_eq!(parse::<DraftsQuery>("mine=true&limit=5").map(|q| (q.mine, q.status)), Ok((true, None)));
        assert_eq!(parse::<DraftsQuery>("").map(|q| (q.mine, q.status)), Ok((false, None)));
        assert_eq!(parse::<DraftsQuery>("mine=false&status=approved").map(|q| (q.mine, q.status)), Ok((false, Some(api::DraftStatus::Approved))));
        for bad in ["mine=1", "mine=", "mine=TRUE"] {
            assert_eq!(parse::<DraftsQuery>(bad).err(), Some(refusal("invalid_query", "mine")), "{bad}");
        }
        for bad in ["status=pending", "status=", "status=Approved", "status=approved&status=rejected"] {
            assert_eq!(parse::<DraftsQuery>(bad).err(), Some(refusal("invalid_query", "status")), "{bad}");
        }
    }

    #[test]
    fn box_states_are_the_named_ones() {
        // R-BOX-5
        for (query, want) in [("", None), ("state=running", Some(api::BoxStateFilter::Running)), ("state=all", Some(api::BoxStateFilter::All))] {
            assert_eq!(parse::<BoxesQuery>(query).map(|q| q.state), Ok(want), "{query}");
        }
        for bad in ["state=active", "state=IDLE", "state="] {
            assert_eq!(parse::<BoxesQuery>(bad).err(), Some(refusal("invalid_query", "state")), "{bad}");
        }
        assert_eq!(parse::<BoxesQuery>("limit=500").map(|q| q.page().limit()), Ok(BOXES_PAGE_MAX));
    }

    #[test]
    fn webhook_deliveries_take_a_state_and_a_limit() {
        let q = parse::<WebhookDeliveriesQuery>("state=dead&limit=500").expect("valid");
        assert_eq!((q.state, q.limit.map(Limit::get)), (Some(api::WebhookDeliveryState::Dead), Some(WEBHOOK_DELIVERIES_PAGE_MAX)));
        assert_eq!(parse::<WebhookDeliveriesQuery>("").map(|q| (q.state, q.limit)), Ok((None, None)));
        for bad in ["state=failed", "state=Dead", "state="] {
            assert_eq!(parse::<WebhookDeliveriesQuery>(bad).err(), Some(refusal("invalid_query", "state")), "{bad}");
        }
        assert_eq!(parse::<WebhookDeliveriesQuery>("cursor=1").err(), Some(refusal("invalid_query", "cursor")));
        assert_eq!(parse::<WebhookDeliveriesQuery>("limit=0").err(), Some(refusal("invalid_limit", "limit")));
    }

    #[test]
    fn history_cursors_are_a_transaction_and_a_position() {
        assert_eq!(parse::<HistoryQuery>("cursor=12.34").map(|q| q.cursor), Ok(Some(CommitCursor { tx_id: 12, position: 34 })));
        assert_eq!(CommitCursor::text(12, 34), "12.34");
        for bad in ["cursor=12", "cursor=.3", "cursor=1.", "cursor=a.b", "cursor=1.2.3", "cursor=1234567890123456789.1"] {
            assert_eq!(parse::<HistoryQuery>(bad).err(), Some(refusal("invalid_cursor", "cursor")), "{bad}");
        }
    }

    #[test]
    fn unknown_and_malformed_parameters_are_named() {
        assert_eq!(parse::<PendingQuery>("limit=5&foo=1").err(), Some(refusal("invalid_query", "foo")));
        assert_eq!(parse::<AuditQuery>("since=yesterday").err(), Some(refusal("invalid_query", "since")));
        assert_eq!(parse::<AuditQuery>("action=").err(), Some(refusal("invalid_query", "action")));
        assert_eq!(parse::<AuditQuery>("target=a\0b").err(), Some(refusal("invalid_query", "target")));
        let q = parse::<AuditQuery>("action=box.activate&since=2026-01-01T00:00:00Z").expect("valid");
        assert_eq!((q.action.as_deref(), q.since.map(|s| s.timestamp())), (Some("box.activate"), Some(1_767_225_600)));
    }
}
