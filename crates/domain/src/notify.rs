//! Telling people (R-NOTIFY-1): which events approvers hear about, what they are told, how
//! a webhook delivery is signed, and when a failed delivery is tried again or given up.
//!
//! Pure: the audit service's notifier feeds in the events and the clock, sends, and records
//! what these functions decide.
//!
//! Approvers hear of every decision waiting for them: a pending draft (`draft.pending`), a
//! pending change request (`change.pending`), a tool call waiting for a human
//! (`tool_request.pending`), a provisioning that failed (`provisioning.failed`), and a
//! failed Worker whose Box escalates (`worker.escalated`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::aggregates::access::AccessEvent;
use crate::aggregates::draft::DraftEvent;
pub use crate::aggregates::webhook::Format;
use crate::aggregates::worker::WorkerEvent;

/// Every kind of announcement, as webhooks filter on them.
pub const KINDS: &[&str] = &["draft.pending", "change.pending", "tool_request.pending", "provisioning.failed", "worker.escalated"];

/// What approvers are told about one event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Announcement {
    /// One of [`KINDS`].
    pub kind: String,
    /// The event announced (`<type>/<id>/<sequence>`): one announcement per event.
    pub event_id: String,
    pub at: DateTime<Utc>,
    /// One line for a person.
    pub title: String,
    pub box_type: String,
    /// The Box, once there is one.
    pub box_id: Option<String>,
    /// Who asked (a draft's or change's requester, the Worker for a tool call).
    pub requested_by: String,
    /// What an approver needs to decide: capabilities and `over_limit` for a draft, the
    /// diff for a change, the tool, its input and the rule for a tool call, the reason for
    /// a failure.
    pub details: Value,
    /// Where in the dashboard it is decided, relative to the gateway's address
    /// (`/#pending`, `/#tool-requests`, `/#boxes/<id>`, `/#workers/<id>`).
    pub link: String,
}

/// A draft or change that waits for approvers.
pub fn of_draft(event: &DraftEvent, event_id: &str) -> Option<Announcement> {
    let DraftEvent::DraftSubmitted { draft_id, box_type, manifest, over_limit, requested_by, submitted_at, change, approvals_required, .. } = event else {
        return None;
    };
    let mut details = json!({
        "draft_id": draft_id,
        "os_operations": manifest.os_operations,
        "tools": manifest.tools,
        "network": manifest.network,
        "over_limit": over_limit.over_limit,
        "over_limit_ops": over_limit.over_limit_ops,
        "over_limit_tools": over_limit.over_limit_tools,
        "approvals_required": approvals_required,
    });
    let (kind, title, box_id) = match change {
        Some(change) => {
            details["diff"] = json!({"added": change.diff.added, "removed": change.diff.removed, "summary": change.diff.summary()});
            (
                "change.pending",
                format!("Change to {box_type} waits for approval ({}), asked by {}", change.diff.summary(), requested_by.user_id),
                Some(change.box_id.clone()),
            )
        }
        None => ("draft.pending", format!("New Box {box_type} waits for approval, drafted by {}", requested_by.user_id), None),
    };
    let title = if over_limit.over_limit { format!("{title}; over the limit: confirm before approving") } else { title };
    Some(Announcement {
        kind: kind.to_owned(),
        event_id: event_id.to_owned(),
        at: *submitted_at,
        title,
        box_type: box_type.clone(),
        box_id,
        requested_by: requested_by.user_id.clone(),
        details,
        link: "/#pending".to_owned(),
    })
}

/// A tool call that waits for a human admin (R-DECIDE-2), of a Worker of `box_type`.
pub fn of_worker(event: &WorkerEvent, event_id: &str, box_type: &str) -> Option<Announcement> {
    let WorkerEvent::WorkerToolUseRequested { request_id, worker_id, box_id, tool, rule, reason, input, expires_at, at, .. } = event else {
        return None;
    };
    Some(Announcement {
        kind: "tool_request.pending".to_owned(),
        event_id: event_id.to_owned(),
        at: *at,
        title: format!("A Worker of {box_type} asks to call {tool}: {reason}"),
        box_type: box_type.to_owned(),
        box_id: Some(box_id.clone()),
        requested_by: worker_id.clone(),
        details: json!({"request_id": request_id, "worker_id": worker_id, "tool": tool, "input": input, "rule": rule, "expires_at": expires_at}),
        link: "/#tool-requests".to_owned(),
    })
}

/// A provisioning that failed after its attempts (R-BOX-5).
pub fn of_access(event: &AccessEvent, event_id: &str) -> Option<Announcement> {
    let AccessEvent::AccessProvisionFailed { box_id, box_type, index, access, reason, attempts, at } = event else {
        return None;
    };
    Some(Announcement {
        kind: "provisioning.failed".to_owned(),
        event_id: event_id.to_owned(),
        at: *at,
        title: format!("Provisioning {access} for {box_type} failed after {attempts} attempts: {reason}"),
        box_type: box_type.clone(),
        box_id: Some(box_id.clone()),
        requested_by: String::new(),
        details: json!({"index": index, "access": access, "reason": reason, "attempts": attempts}),
        link: format!("/#boxes/{box_id}"),
    })
}

/// A failed Worker whose Box escalates (`loop_control.escalate_on_failure`): approvers and
/// the Box's primaries (named in the details) are told.
#[derive(Debug)]
pub struct Failure<'a> {
    pub worker_id: &'a str,
    pub box_id: &'a str,
    pub box_type: &'a str,
    pub exit_code: Option<i32>,
    pub result: &'a str,
    /// Who launched it.
    pub launched_by: &'a str,
    /// The Box's primary users.
    pub primaries: Vec<String>,
    pub at: DateTime<Utc>,
}

/// The announcement of `f` (the `WorkerFinished` event `event_id`).
pub fn of_failure(f: &Failure<'_>, event_id: &str) -> Announcement {
    let code = f.exit_code.map_or_else(|| "no exit code".to_owned(), |c| format!("exit code {c}"));
    Announcement {
        kind: "worker.escalated".to_owned(),
        event_id: event_id.to_owned(),
        at: f.at,
        title: format!("A Worker of {} failed ({code}) and escalates", f.box_type),
        box_type: f.box_type.to_owned(),
        box_id: Some(f.box_id.to_owned()),
        requested_by: f.launched_by.to_owned(),
        details: json!({
            "worker_id": f.worker_id,
            "exit_code": f.exit_code,
            "result": f.result.chars().take(2000).collect::<String>(),
            "primaries": f.primaries,
        }),
        link: format!("/#workers/{}", f.worker_id),
    }
}

/// The body of a delivery of `a` in `format`; links start at `base_url` (the dashboard's
/// address, without a trailing slash).
pub fn body(a: &Announcement, format: Format, base_url: &str) -> Value {
    let link = format!("{}{}", base_url.trim_end_matches('/'), a.link);
    match format {
        Format::Json => {
            let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
            v["link"] = Value::String(link);
            v
        }
        Format::Slack => {
            let who = if a.requested_by.is_empty() { String::new() } else { format!("\nAsked by {}", a.requested_by) };
            json!({"text": format!("*{}*{who}\n<{link}|Open in atasira>", a.title)})
        }
    }
}

/// The header a delivery is signed in.
pub const SIGNATURE_HEADER: &str = "X-Atasira-Signature";

/// The signature of a delivery sent at `timestamp` (unix seconds): `t=<timestamp>,v1=<hex
/// HMAC-SHA256 of "<timestamp>.<body>" under the webhook's secret>`. The receiver computes
/// the same and compares in constant time, and refuses old timestamps (a replay).
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={timestamp},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// How failed deliveries are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; then the delivery is dead-lettered.
    pub attempts: u32,
    /// The wait after the first failure; it doubles after each, up to [`MAX_BACKOFF`].
    pub backoff: Duration,
}

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 6, backoff: Duration::from_secs(2) }
    }
}

/// How an attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver answered with this HTTP status.
    Status(u16),
    /// No answer (refused, timed out, not HTTP): why.
    Failed(String),
}

/// What comes after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Delivered,
    /// Again after this long.
    RetryIn(Duration),
    /// Given up: kept on the dead-letter list.
    DeadLetter,
}

/// After attempt number `attempt` (1 for the first) went `how`: a 2xx is delivered; `410
/// Gone` says the receiver is gone for good; anything else is tried again, waiting twice as
/// long each time, until the policy's attempts are spent.
pub fn after(attempt: u32, how: &Attempt, policy: RetryPolicy) -> Next {
    match how {
        Attempt::Status(s) if (200..300).contains(s) => Next::Delivered,
        Attempt::Status(410) => Next::DeadLetter,
        _ if attempt >= policy.attempts => Next::DeadLetter,
        _ => {
            let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(20));
            Next::RetryIn(policy.backoff.saturating_mul(factor).min(MAX_BACKOFF))
        }
    }
}

/// Whether `url` may be a webhook's: `http` or `https`, a host, at most 2,048 characters,
/// no credentials in it (they would be shown in lists). The reason when not.
pub fn webhook_url_problem(url: &str) -> Option<&'static str> {
    if url.is_empty() || url.len() > 2048 || url.chars().any(char::is_control) {
        return Some("1 to 2048 characters");
    }
    let Ok(parsed) = url::Url::parse(url) else { return Some("not a URL") };
    if !matches!(parsed.scheme(), "http" | "https") {
        return Some("http or https only");
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Some("names no host");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Some("credentials do not belong in the URL; the signature authenticates deliveries");
    }
    None
}

#[cfg(test)]
mod tests;
