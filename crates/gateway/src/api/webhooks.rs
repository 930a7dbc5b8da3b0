//! Webhooks: approvers hear of every decision waiting for them.

use super::*;

/// What a webhook is told about: a draft waiting for approval (`draft.pending`), a change
/// request waiting for approval (`change.pending`), a tool call waiting for a human admin
/// (`tool_request.pending`), access setup that failed (`provisioning.failed`) and a failed
/// Worker whose Box escalates (`worker.escalated`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum WebhookKind {
    #[serde(rename = "draft.pending")]
    DraftPending,
    #[serde(rename = "change.pending")]
    ChangePending,
    #[serde(rename = "tool_request.pending")]
    ToolRequestPending,
    #[serde(rename = "provisioning.failed")]
    ProvisioningFailed,
    #[serde(rename = "worker.escalated")]
    WorkerEscalated,
}

/// How a delivery's body is written: `json` (the announcement: `kind`, `event_id`, `at`,
/// `title`, `box_type`, `box_id`, `requested_by`, `details` and an absolute `link` to the
/// dashboard) or `slack` (`{"text": ...}`, which Slack's incoming webhooks and the
/// Slack-compatible hooks of Mattermost, Rocket.Chat and others accept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    Json,
    Slack,
}

/// `POST /api/v1/webhooks`: where to send announcements and which. Unknown fields are
/// refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterWebhookRequest {
    /// Where deliveries are POSTed: an `http` or `https` URL naming a host, at most 2048
    /// characters, without a user name or password (the signature authenticates
    /// deliveries). The pattern is a form the API always takes (a host name, an optional
    /// port, a path of printable characters); IP addresses are taken too.
    #[schema(
        min_length = 8,
        max_length = 2048,
        pattern = r"^https?://([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z]([a-z0-9-]{0,61}[a-z0-9])?(:[1-9][0-9]{0,3})?(/[!-~]*)?$"
    )]
    pub url: String,
    /// How the body is written; absent, null or empty: `json`.
    #[serde(default)]
    #[schema(value_type = Option<WebhookFormat>)]
    pub format: Option<String>,
    /// Only these kinds; absent, null or empty: every kind.
    #[serde(default)]
    #[schema(value_type = Option<Vec<WebhookKind>>)]
    pub kinds: Option<Vec<String>>,
}

/// A registered webhook, with how its deliveries went. Never its secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    /// The webhook's id.
    pub webhook_id: String,
    pub url: String,
    pub format: WebhookFormat,
    /// The kinds it is told about; empty: every kind.
    #[schema(value_type = Vec<WebhookKind>)]
    pub kinds: Vec<String>,
    /// The human admin who registered it.
    pub registered_by: String,
    pub registered_at: DateTime<Utc>,
    /// Deliveries the receiver accepted (a 2xx answer).
    pub delivered: u32,
    /// Deliveries still being tried.
    pub pending: u32,
    /// Deliveries given up on (`GET /api/v1/webhooks/{webhook_id}/deliveries?state=dead`).
    pub dead: u32,
}

/// 201 of `POST /api/v1/webhooks`: the webhook and its secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookRegistered {
    #[serde(flatten)]
    pub webhook: Webhook,
    /// Signs every delivery, in the `X-Atasira-Signature` header: `t=<unix seconds>,v1=<hex
    /// HMAC-SHA256 of "<t>.<body>" keyed with this secret>`. Shown this once: keep it
    /// where the receiver can read it.
    pub secret: String,
}

/// 200 of `GET /api/v1/webhooks`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// Where a delivery is: `pending` (being tried), `delivered` (the receiver answered 2xx)
/// or `dead` (given up on: out of attempts, or the receiver answered 410 Gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookDeliveryState {
    Pending,
    Delivered,
    Dead,
}

impl WebhookDeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookDeliveryState::Pending => "pending",
            WebhookDeliveryState::Delivered => "delivered",
            WebhookDeliveryState::Dead => "dead",
        }
    }
}

/// One announcement on its way to one webhook.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookDelivery {
    pub delivery_id: String,
    pub webhook_id: String,
    /// The event announced.
    pub event_id: String,
    #[schema(value_type = WebhookKind)]
    pub kind: String,
    pub state: WebhookDeliveryState,
    /// Attempts so far.
    pub attempts: u32,
    /// The HTTP status of the receiver's last answer; `null` when it has not answered.
    pub last_status: Option<i32>,
    /// What went wrong with the last attempt; empty when nothing did.
    pub last_error: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When it is tried next; `null` unless `pending`.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// 200 of `GET /api/v1/webhooks/{webhook_id}/deliveries`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookDeliveryList {
    pub deliveries: Vec<WebhookDelivery>,
}
