//! A ledger row's `detail` (R-AUDIT-6): in a line, what an auditor needs to know of the
//! event without the event store: the refusal code and what was refused for a security
//! violation or a refused launch, the decision and what it grants for approvals and
//! edits, the reason for a rejection. The row's MAC covers it.
//!
//! Derived from the event alone, so the same event always gives the same detail. Never
//! holds secrets or execution host internals (workspaces, tool scopes): bindings are
//! described by their launch only.

use serde::Deserialize;
use serde_json::Value;

use crate::aggregates::access::AccessEvent;
use crate::aggregates::binding::BindingEvent;
use crate::aggregates::boxes::{BoxEvent, BoxRole};
use crate::aggregates::bundle::BundleEvent;
use crate::aggregates::draft::DraftEvent;
use crate::aggregates::notification::NotificationEvent;
use crate::aggregates::org_policy::OrgPolicyEvent;
use crate::aggregates::pat::PatEvent;
use crate::aggregates::security::SecurityEvent;
use crate::aggregates::types;
use crate::aggregates::webhook::WebhookEvent;
use crate::aggregates::worker::WorkerEvent;
use crate::manifest::{BoxManifest, Network, TriggerType};

/// The longest detail, in characters; longer text is cut and ends in `…`.
pub const DETAIL_CHARS: usize = 500;

/// The detail of an auditable event's row; empty for an event of no known aggregate type.
pub fn detail_of(aggregate_type: &str, payload: &Value) -> String {
    let text = match aggregate_type {
        types::DRAFT => DraftEvent::deserialize(payload).map(|e| draft(&e)),
        types::BOX => BoxEvent::deserialize(payload).map(|e| boxes(&e)),
        types::ACCESS => AccessEvent::deserialize(payload).map(|e| access(&e)),
        types::PAT => PatEvent::deserialize(payload).map(|e| token(&e)),
        types::WORKER => WorkerEvent::deserialize(payload).map(|e| worker(&e)),
        types::CONFIG_BUNDLE => BundleEvent::deserialize(payload).map(|e| bundle(&e)),
        types::EXECUTION_BINDING => BindingEvent::deserialize(payload).map(|e| binding(&e)),
        types::WEBHOOK => WebhookEvent::deserialize(payload).map(|e| webhook(&e)),
        types::NOTIFICATION => NotificationEvent::deserialize(payload).map(|e| notification(&e)),
        types::ORG_POLICY => OrgPolicyEvent::deserialize(payload).map(|OrgPolicyEvent::PolicyPublished { version, digest, rules, .. }| {
            let ids: Vec<&str> = rules.iter().map(|r| r.id.as_str()).collect();
            format!("policy version {version} ({digest}) in force: {} rule(s): {}", rules.len(), ids.join(", "))
        }),
        t if types::SECURITY.contains(&t) => {
            SecurityEvent::deserialize(payload).map(|SecurityEvent::SecurityViolation { kind, reason, .. }| format!("refused ({kind}): {reason}"))
        }
        _ => return String::new(),
    };
    clip(&text.unwrap_or_else(|e| format!("the event does not read as a {aggregate_type} event: {e}")))
}

fn notification(event: &NotificationEvent) -> String {
    match event {
        NotificationEvent::NotificationSent { channel, to, attempts, .. } => format!("{channel} sent to {} after {attempts} attempt(s)", to.join(", ")),
        NotificationEvent::NotificationFailed { channel, attempts, last_error, .. } => format!("{channel} not sent after {attempts} attempt(s): {last_error}"),
        NotificationEvent::NotificationRefused { channel, reason, .. } => format!("{channel} refused: {reason}"),
    }
}

fn webhook(event: &WebhookEvent) -> String {
    match event {
        WebhookEvent::WebhookRegistered { url, format, kinds, .. } => {
            let kinds = if kinds.is_empty() { "every announcement".to_owned() } else { kinds.join(", ") };
            format!("{} webhook {url} for {kinds}", format.as_str())
        }
        WebhookEvent::WebhookRemoved { .. } => "removed".to_owned(),
        WebhookEvent::WebhookDeliveryDeadLettered { kind, event_id, attempts, last_error, .. } => {
            format!("gave up delivering {kind} of {event_id} after {attempts} attempts: {last_error}")
        }
    }
}

/// `text`, cut to [`DETAIL_CHARS`] characters (the last one `…` when cut).
fn clip(text: &str) -> String {
    if text.chars().count() <= DETAIL_CHARS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(DETAIL_CHARS - 1).collect();
    cut.push('…');
    cut
}

fn draft(event: &DraftEvent) -> String {
    match event {
        DraftEvent::DraftSubmitted { box_type, revision: Some(r), .. } => {
            format!("revision {} of {box_type} (after {}, rejected by {}: {}): {}", r.version, r.draft_id, r.rejected_by, r.reason, r.diff.summary())
        }
        DraftEvent::DraftSubmitted { box_type, manifest, over_limit, change: Some(change), .. } => {
            let over = if over_limit.over_limit {
                format!(", over limit ({})", list(over_limit.over_limit_ops.iter().chain(&over_limit.over_limit_tools)))
            } else {
                String::new()
            };
            format!("change request of {box_type} ({}) to v{}{over}: {}", change.box_id, manifest.version, change.diff.summary())
        }
        DraftEvent::DraftSubmitted { box_type, manifest, over_limit, .. } => {
            let over = if over_limit.over_limit {
                format!("over limit ({})", list(over_limit.over_limit_ops.iter().chain(&over_limit.over_limit_tools)))
            } else {
                "within limits".to_owned()
            };
            format!("submitted {box_type} v{}, {over}; asks for {}", manifest.version, grants(manifest))
        }
        DraftEvent::DraftApproved { box_type, confirm_over_limit, token, .. } => {
            let confirmed = if *confirm_over_limit { "; over limit confirmed" } else { "" };
            format!("approved {box_type}: manifest {}, signed by key {}{confirmed}", token.claims.manifest_digest, token.claims.key_id)
        }
        DraftEvent::DraftRejected { box_type, reason, .. } => format!("rejected {box_type}: {reason}"),
        DraftEvent::DraftApprovalGiven { box_type, approvals, approvals_required, .. } => {
            format!("approval {approvals} of {approvals_required} for {box_type}; the next human admin's completes it")
        }
        DraftEvent::DraftWithdrawn { .. } => "withdrawn by its requester".to_owned(),
        DraftEvent::DraftExpired { .. } => "expired without a decision".to_owned(),
    }
}

fn boxes(event: &BoxEvent) -> String {
    match event {
        BoxEvent::BoxActivated { box_type, manifest, draft_id, manifest_digest, .. } => {
            format!("activated {box_type} v{} (draft {draft_id}, manifest {manifest_digest}); grants {}", manifest.version, grants(manifest))
        }
        BoxEvent::BoxManifestEdited { manifest, changed_keys, .. } => format!("mentor edit of {}; now v{}", list(changed_keys), manifest.version),
        BoxEvent::BoxConfigEdited { manifest, changed_keys, .. } => format!("config edit of {}; now v{}", list(changed_keys), manifest.version),
        BoxEvent::BoxUserAssigned { user_id, role_in_box, .. } => format!("assigned {user_id} as {}", role(*role_in_box)),
        BoxEvent::BoxUserUnassigned { user_id, role_in_box, .. } => format!("unassigned {user_id} (was {})", role(*role_in_box)),
        BoxEvent::BoxStopped { box_type, .. } => format!("stopped {box_type}"),
        BoxEvent::BoxResumed { box_type, .. } => format!("resumed {box_type}"),
        BoxEvent::BoxArchived { box_type, .. } => format!("archived {box_type}"),
        BoxEvent::BoxManifestChanged { box_type, draft_id, manifest, manifest_digest, diff, .. } => {
            format!("changed {box_type} to v{} (change request {draft_id}, manifest {manifest_digest}): {}", manifest.version, diff.summary())
        }
    }
}

fn access(event: &AccessEvent) -> String {
    match event {
        AccessEvent::AccessProvisioned { access, detail, .. } => format!("provisioned {access}: {detail}"),
        AccessEvent::AccessProvisionFailed { access, reason, attempts, .. } => format!("could not provision {access} after {attempts} attempt(s): {reason}"),
    }
}

fn token(event: &PatEvent) -> String {
    match event {
        PatEvent::TokenIssued { user_id, role, kind, expires_at, .. } => {
            let expires = expires_at.map_or_else(|| "never expires".to_owned(), |t| format!("expires {}", super::canonical_time(t)));
            format!("token for {user_id}: role {role}, kind {kind}, {expires}")
        }
        PatEvent::TokenRevoked { user_id, .. } => format!("token of {user_id} revoked"),
    }
}

fn worker(event: &WorkerEvent) -> String {
    match event {
        WorkerEvent::WorkerCreated { launch_id, bundle_digest, role, .. } => {
            let role = if role.is_empty() { String::new() } else { format!(" as {role}") };
            format!("launch {launch_id}{role} with bundle {bundle_digest}")
        }
        WorkerEvent::WorkerLaunchRefused { launch_id, code, reason, .. } => format!("launch {launch_id} refused ({code}): {reason}"),
        WorkerEvent::WorkerClaimed { host, .. } => format!("claimed by host {host}"),
        WorkerEvent::WorkerRunning { host, .. } => format!("running on host {host}"),
        WorkerEvent::WorkerPaused { host, .. } => format!("paused on host {host}"),
        WorkerEvent::WorkerLogged { lines, .. } => format!("{} log line(s)", lines.len()),
        WorkerEvent::WorkerFinished { state, exit_code, .. } => match exit_code {
            Some(code) => format!("{state} (exit code {code})"),
            None => state.to_string(),
        },
        WorkerEvent::WorkerLost { host, .. } => format!("lost: host {host} stopped renewing its lease"),
        WorkerEvent::WorkerStopRequested { kill: true, .. } => "kill requested".to_owned(),
        WorkerEvent::WorkerStopRequested { kill: false, .. } => "stop requested".to_owned(),
        WorkerEvent::WorkerInputAdded { input, .. } => format!("{} input segment(s)", input.len()),
        WorkerEvent::WorkerPauseRequested { pause: true, .. } => "pause requested".to_owned(),
        WorkerEvent::WorkerPauseRequested { pause: false, .. } => "resume requested".to_owned(),
        WorkerEvent::WorkerToolDenied { tool, rule, reason, .. } => format!("{tool} denied by {rule}: {reason}"),
        WorkerEvent::WorkerNotificationRequested { notification: n, .. } => {
            let to = if n.broadcast { "every follower".to_owned() } else { n.to.join(", ") };
            format!("{} to {to} ({}): {}", n.channel, n.notification_id, n.subject)
        }
        WorkerEvent::WorkerToolUseRequested { request_id, tool, rule, reason, .. } => {
            format!("{tool} waits for a human admin ({request_id}) under {rule}: {reason}")
        }
        WorkerEvent::WorkerToolUseApproved { request_id, tool, .. } => format!("{tool} approved ({request_id})"),
        WorkerEvent::WorkerToolUseRejected { request_id, tool, reason, .. } => format!("{tool} rejected ({request_id}): {reason}"),
        WorkerEvent::WorkerToolUseExpired { request_id, tool, .. } => format!("{tool} denied: nobody decided in time ({request_id})"),
    }
}

fn bundle(event: &BundleEvent) -> String {
    let BundleEvent::ConfigBundleSynced { digest, manifest_version, .. } = event;
    format!("bundle {digest} of manifest v{manifest_version}")
}

fn binding(event: &BindingEvent) -> String {
    match event {
        BindingEvent::BindingPrepared { launch_id, expires_at, .. } => format!("for launch {launch_id}, until {}", super::canonical_time(*expires_at)),
        BindingEvent::BindingConsumed { worker_id, .. } => format!("taken by Worker {worker_id}"),
        BindingEvent::BindingExpired { .. } => "its lease ran out unused".to_owned(),
    }
}

/// What a manifest grants, in the order an approver weighs it.
pub fn grants(m: &BoxManifest) -> String {
    let network = match m.network {
        Network::None => "none",
        Network::Local => "local",
        Network::Filtered => "filtered",
        Network::Full => "full",
    };
    let trigger = match m.trigger_type {
        TriggerType::Manual => "manual".to_owned(),
        TriggerType::Event => format!("event {}", m.trigger_event),
        TriggerType::Schedule => format!("schedule {}", m.trigger_schedule),
    };
    let mut parts = vec![format!("os_operations [{}]", list(&m.os_operations)), format!("tools [{}]", list(&m.tools)), format!("network {network}")];
    if !m.url_allowlist.is_empty() {
        parts.push(format!("url_allowlist [{}]", list(&m.url_allowlist)));
    }
    if !m.shell.allowed_commands.is_empty() {
        parts.push(format!("shell [{}]", list(&m.shell.allowed_commands)));
    }
    if !m.credentials.allowed_vaults.is_empty() {
        parts.push(format!("vaults [{}]", list(&m.credentials.allowed_vaults)));
    }
    parts.push(format!("trigger {trigger}"));
    parts.join(", ")
}

fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" ")
}

fn role(role: BoxRole) -> &'static str {
    match role {
        BoxRole::Primary => "primary",
        BoxRole::Member => "member",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn r_audit_6_a_security_violation_names_what_was_refused() {
        // given a refused mentor edit of tools and shell, as the registry records it
        let payload = json!({"SecurityViolation": {"service": "runtime-registry", "actor": "alice", "target": "b1",
            "kind": "mentor_edit_prohibited_key", "reason": "a mentor edit tried to change `tools`, `shell`", "at": "2026-12-01T00:00:00Z"}});
        // when its detail is made; then the code and the keys are in it
        assert_eq!(detail_of("registry_security", &payload), "refused (mentor_edit_prohibited_key): a mentor edit tried to change `tools`, `shell`");
    }

    #[test]
    fn r_audit_6_a_rejection_says_why_and_a_refused_launch_its_code() {
        let rejected =
            json!({"DraftRejected": {"draft_id": "d1", "box_type": "sales", "rejected_by": "alice", "reason": "too broad", "at": "2026-12-01T00:00:00Z"}});
        assert_eq!(detail_of("draft", &rejected), "rejected sales: too broad");
        let refused = json!({"WorkerLaunchRefused": {"worker_id": "wkr_1", "launch_id": "l-1", "box_id": "b1", "by": "agent", "code": "forbidden",
            "reason": "needs a human admin or an assignment to the Box", "at": "2026-12-01T00:00:00Z"}});
        assert_eq!(detail_of("worker", &refused), "launch l-1 refused (forbidden): needs a human admin or an assignment to the Box");
    }

    #[test]
    fn r_audit_6_long_text_is_cut_and_unknown_shapes_are_said_so() {
        // given a rejection with a reason far over the bound
        let long = json!({"DraftRejected": {"draft_id": "d1", "box_type": "s", "rejected_by": "a", "reason": "x".repeat(5_000), "at": "2026-12-01T00:00:00Z"}});
        let detail = detail_of("draft", &long);
        // then the detail is cut to its bound, visibly
        assert_eq!(detail.chars().count(), DETAIL_CHARS);
        assert!(detail.ends_with('…'));
        // and an event that does not read as its type still gets a row that says so
        assert!(detail_of("draft", &json!({"DraftSubmitted": {"nonsense": true}})).starts_with("the event does not read as a draft event"));
        // and an aggregate type with no detail gets none
        assert_eq!(detail_of("audit_ledger", &json!({})), "");
    }

    #[test]
    fn r_audit_6_grants_list_what_an_approver_weighs() {
        let request = crate::draft_request::BoxDraftCreateRequest {
            box_type: Some("ops".into()),
            purpose: Some("p".into()),
            tools: Some(vec!["Read".into(), "Bash".into()]),
            os_operations: Some(vec!["file:read".into(), "shell:exec".into()]),
            ..Default::default()
        };
        let manifest = request.plan().expect("plan").manifest;
        let text = grants(&manifest);
        assert!(text.starts_with("os_operations [file:read shell:exec], tools [Read Bash], network none"), "{text}");
        assert!(text.ends_with("trigger manual"), "{text}");
    }
}
