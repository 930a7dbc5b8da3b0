//! The decision endpoint (R-DECIDE-1): `POST /v1/decide` on loopback, for the Workers this
//! host runs. A Worker's credential (`ATASIRA_WORKER_TOKEN`, fresh for each Worker) names
//! the Worker; the answer comes from its bundle and binding alone, after the host looked up
//! where the call's paths really lead. Denials are recorded on the Worker's stream.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use atasira_domain::decide::{Decision, Facts, ToolCall, Verdict, decide, paths_of};
use atasira_domain::manifest::BoxManifest;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use subtle::ConstantTimeEq as _;
use tokio::sync::watch;

use crate::Host;

/// What a Worker's calls are judged against: its bundle's manifest and its binding.
#[derive(Debug)]
pub struct Grant {
    pub manifest: BoxManifest,
    /// The workspace, its real path (symbolic links resolved).
    pub workspace: String,
    pub tool_scope: Vec<String>,
}

impl Grant {
    /// The decision for `call`, the filesystem consulted for where its paths lead.
    pub fn decide(&self, call: &ToolCall) -> Decision {
        let workspace = Path::new(&self.workspace);
        let real_paths = paths_of(call).into_iter().filter_map(|p| real_path(workspace, &p).map(|real| (p, real))).collect();
        let grant = atasira_domain::decide::Grant { manifest: &self.manifest, workspace: &self.workspace, tool_scope: &self.tool_scope };
        decide(grant, call, &Facts { real_paths })
    }
}

/// Where `written` (relative to `workspace`) really leads: its longest existing ancestor
/// with links resolved, and the rest as written.
fn real_path(workspace: &Path, written: &str) -> Option<String> {
    let path = if Path::new(written).is_absolute() { PathBuf::from(written) } else { workspace.join(written) };
    let mut existing = path.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(mut real) = std::fs::canonicalize(existing) {
            for part in rest.iter().rev() {
                real.push(part);
            }
            return Some(real.to_string_lossy().into_owned());
        }
        rest.push(existing.file_name()?.to_owned());
        existing = existing.parent()?;
    }
}

/// The largest call a Worker may send.
const BODY_LIMIT: usize = 128 * 1024;

pub(crate) async fn serve(host: Arc<Host>, shutdown: watch::Receiver<bool>) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(host.config.decide_listen).await?;
    let addr = listener.local_addr()?;
    let app =
        Router::new().route("/v1/decide", post(decide_route)).route("/v1/notify", post(notify_route)).layer(DefaultBodyLimit::max(BODY_LIMIT)).with_state(host);
    let mut shutdown = shutdown;
    let task = tokio::spawn(async move {
        let stop = async move {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    return;
                }
            }
        };
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
            tracing::error!(error = %e, "the decision endpoint stopped");
        }
    });
    Ok((addr, task))
}

fn refused(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(serde_json::json!({"error": code, "message": message}))).into_response()
}

/// The Worker whose credential the request carries, and its grant; or the refusal.
fn worker_of(host: &Host, headers: &HeaderMap) -> Result<(String, Arc<Grant>), Box<Response>> {
    let token = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    let found = {
        let held = host.lock();
        // Every credential is compared, in constant time each.
        let mut found = None;
        for (worker_id, h) in held.iter() {
            if !token.is_empty() && bool::from(h.token.as_bytes().ct_eq(token.as_bytes())) {
                found = Some((worker_id.clone(), h.grant.clone()));
            }
        }
        found
    };
    let Some((worker_id, grant)) = found else {
        return Err(Box::new(refused(StatusCode::UNAUTHORIZED, "unauthenticated", "no Worker of this host holds this credential")));
    };
    let Some(grant) = grant else {
        return Err(Box::new(refused(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "the Worker is starting")));
    };
    Ok((worker_id, grant))
}

async fn decide_route(State(host): State<Arc<Host>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let (worker_id, grant) = match worker_of(&host, &headers) {
        Ok(found) => found,
        Err(refusal) => return *refusal,
    };
    let call: ToolCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(e) => return refused(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", &format!("a call is {{\"tool\": ..., \"input\": {{...}}}}: {e}")),
    };
    Json(decided(&host, &worker_id, &grant, &call).await).into_response()
}

/// The decision on `call` by Worker `worker_id`: a denial recorded, an ask waited for.
async fn decided(host: &Host, worker_id: &str, grant: &Grant, call: &ToolCall) -> Decision {
    let decision = grant.decide(call);
    atasira_platform::metrics::global().decision(decision.decision.as_str());
    match decision.decision {
        Verdict::Allow => decision,
        Verdict::Deny => {
            tracing::info!(worker_id, tool = call.tool, rule = decision.rule, "tool call denied");
            let recorded = atasira_contracts::v1::ToolDecision {
                tool: call.tool.clone(),
                decision: "deny".to_owned(),
                rule: decision.rule.clone(),
                reason: decision.reason.clone(),
                input: Some(atasira_contracts::manifest::value_to_proto(&call.input)),
            };
            let _ = host.report(worker_id, atasira_contracts::v1::report_worker::Report::Decision(recorded)).await;
            decision
        }
        Verdict::Ask => ask(host, worker_id, call, decision).await,
    }
}

/// What a Worker sends to `POST /v1/notify`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifyRequest {
    /// `email` or `line`.
    channel: String,
    #[serde(default)]
    to: Vec<String>,
    #[serde(default)]
    broadcast: bool,
    #[serde(default)]
    subject: String,
    #[serde(default)]
    body: String,
}

/// `POST /v1/notify` (R-NOTIFY-1): a Worker's notification, decided like a tool call
/// (`notify:<channel>`: the Box declares the channel, the recipients are its, a broadcast
/// only when declared). Allowed, it is recorded on the Worker's stream and the audit service
/// delivers it: 202 with its id. Denied: 403 with the decision (a ledger row).
async fn notify_route(State(host): State<Arc<Host>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let (worker_id, grant) = match worker_of(&host, &headers) {
        Ok(found) => found,
        Err(refusal) => return *refusal,
    };
    let request: NotifyRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let shape = "a notification is {\"channel\": \"email\"|\"line\", \"to\": [...], \"broadcast\": false, \"subject\": ..., \"body\": ...}";
            return refused(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", &format!("{shape}: {e}"));
        }
    };
    if !matches!(request.channel.as_str(), "email" | "line") {
        return refused(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", "channel: email or line");
    }
    let call = ToolCall { tool: format!("notify:{}", request.channel), input: serde_json::json!({"to": request.to, "broadcast": request.broadcast}) };
    let decision = decided(&host, &worker_id, &grant, &call).await;
    if decision.decision != Verdict::Allow {
        return (StatusCode::FORBIDDEN, Json(decision)).into_response();
    }
    let notification_id = format!("ntf_{}", hex::encode(&atasira_platform::auth::random_secret()[..16]));
    let notification = atasira_contracts::v1::Notification {
        notification_id: notification_id.clone(),
        channel: request.channel,
        to: request.to,
        broadcast: request.broadcast,
        subject: request.subject,
        body: request.body,
    };
    match host.report(&worker_id, atasira_contracts::v1::report_worker::Report::Notify(notification)).await {
        Ok(()) => (StatusCode::ACCEPTED, Json(serde_json::json!({"notification_id": notification_id, "decision": decision}))).into_response(),
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", &format!("the notification could not be recorded: {e}")),
    }
}

/// R-DECIDE-2: the call waits for a human admin's decision, recorded as a tool-use request;
/// approved, it is allowed; rejected, expired or unknowable, denied.
async fn ask(host: &Host, worker_id: &str, call: &ToolCall, asked: Decision) -> Decision {
    let request_id = format!("tur_{}", hex::encode(&atasira_platform::auth::random_secret()[..16]));
    tracing::info!(worker_id, tool = call.tool, rule = asked.rule, request_id, "tool call waits for a human admin");
    let request = atasira_contracts::v1::AskTool {
        worker_id: worker_id.to_owned(),
        request_id: request_id.clone(),
        tool: call.tool.clone(),
        rule: asked.rule.clone(),
        reason: asked.reason.clone(),
        input: Some(atasira_contracts::manifest::value_to_proto(&call.input)),
        wait_ms: 10_000,
    };
    let mut failures = 0;
    loop {
        match host.client.ask(atasira_contracts::subjects::RUNTIME_REGISTRY, &request, std::time::Duration::from_secs(10)).await {
            Ok(Ok(written)) => {
                let answer = written.reply;
                let (verdict, reason) = match answer.state.as_str() {
                    "pending" => continue,
                    "approved" => (Verdict::Allow, format!("approved by {} ({request_id})", answer.decided_by)),
                    "rejected" => (Verdict::Deny, format!("rejected by {} ({request_id}): {}", answer.decided_by, answer.reason)),
                    _ => (Verdict::Deny, format!("no human admin decided in time ({request_id})")),
                };
                return Decision { decision: verdict, rule: asked.rule, reason };
            }
            Ok(Err(refused)) => return Decision { decision: Verdict::Deny, rule: asked.rule, reason: format!("the request could not be recorded: {refused}") },
            Err(e) => {
                failures += 1;
                if failures >= 6 {
                    return Decision { decision: Verdict::Deny, rule: asked.rule, reason: format!("the decision could not be learned: {e}") };
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_decide_1_a_path_is_judged_where_it_really_leads() {
        let dir = std::env::temp_dir().join(format!("atasira-host-test-{}", std::process::id()));
        let workspace = dir.join("ws");
        std::fs::create_dir_all(&workspace).expect("workspace");
        let workspace = std::fs::canonicalize(&workspace).expect("real");
        std::os::unix::fs::symlink("/etc", workspace.join("out")).expect("link");
        assert_eq!(real_path(&workspace, "out/passwd").as_deref(), Some("/etc/passwd"));
        assert_eq!(real_path(&workspace, "new/file.md"), Some(workspace.join("new/file.md").to_string_lossy().into_owned()));
        let manifest: BoxManifest =
            serde_json::from_value(serde_json::json!({"box_type": "notes", "purpose": "p", "os_operations": ["file:write"]})).expect("manifest");
        let grant = Grant { manifest, workspace: workspace.to_string_lossy().into_owned(), tool_scope: vec!["file:write".into()] };
        let call = |path: &str| ToolCall { tool: "file:write".into(), input: serde_json::json!({"path": path}) };
        assert_eq!(grant.decide(&call("notes.md")).decision, Verdict::Allow);
        assert_eq!(grant.decide(&call("out/cron")).decision, Verdict::Deny, "a link out of the workspace");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
