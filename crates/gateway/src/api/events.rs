//! Events that start `event` Boxes (R-TRIG-1).

use super::*;

/// Longest message id an event may carry.
pub const MESSAGE_ID_CHARS: usize = 200;

/// `POST /api/v1/trigger-events`: an event on a topic, as a NATS publisher's message on it
/// would be. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TriggerEventRequest {
    /// The topic: the `trigger_event` of the Boxes to start, 1 to 16 dot-separated tokens of
    /// letters, digits, `_` and `-`, not beginning with `atasira.` or `_INBOX.`.
    #[schema(min_length = 1, max_length = 200, pattern = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){0,15}$")]
    pub topic: String,
    /// Names the event: the same id again launches nothing more (NATS publishers send it
    /// as the `Nats-Msg-Id` header).
    #[schema(min_length = 1, max_length = 200)]
    pub message_id: String,
    /// The Workers' input, as text; absent or empty: a line naming the topic and the id.
    #[serde(default)]
    #[schema(max_length = 16384)]
    pub data: String,
}

/// What an event did for one Box: `launched` (a Worker now), `existing` (the same message
/// launched it before), `refused` (recorded; `code` says why: `too_many_workers` when the
/// Box's triggered Workers still running are at their bound, so publish again later with a
/// new id) or `failed` (not settled: send the same event again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TriggerOutcome {
    Launched,
    Existing,
    Refused,
    Failed,
}

/// One Box's launch for an event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TriggerLaunch {
    pub box_id: String,
    /// The Worker the event launches (`GET /api/v1/workers/{worker_id}`), or would have.
    pub worker_id: String,
    pub outcome: TriggerOutcome,
    /// Why it was refused (an error code); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What went wrong; absent when nothing did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// 200 of `POST /api/v1/trigger-events`: one launch per Box listening on the topic (none
/// when no active Box does).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TriggerLaunches {
    pub launches: Vec<TriggerLaunch>,
}
