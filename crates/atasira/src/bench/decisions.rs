//! `atasira bench workers`, the Workers' run: the decision before a tool call in-process
//! (decisions per second, p50 and p99, against a floor measured in the same run: reading
//! the call's JSON, the least any decision does), and launch-to-running on the embedded
//! system with an execution host (from the launch request until the Worker's answer says
//! `running`).

use std::time::{Duration, Instant};

use atasira_domain::decide::ToolCall;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::auth;
use serde_json::json;

use super::TempDir;
use super::drafts::settings_in;
use crate::services::Embedded;

/// Latencies, sorted.
pub(super) struct Latencies(Vec<Duration>);

impl Latencies {
    fn new(mut l: Vec<Duration>) -> Latencies {
        l.sort();
        Latencies(l)
    }
    pub(super) fn percentile(&self, p: f64) -> Duration {
        let i = ((self.0.len().max(1) as f64 - 1.0) * p).round() as usize;
        self.0.get(i).copied().unwrap_or_default()
    }
}

/// What the in-process decisions measured.
pub(super) struct DecisionFigures {
    pub per_second: f64,
    pub decide: Latencies,
    pub floor: Latencies,
}

/// `count` decisions over a mix of calls (files inside and outside the grant, through
/// the filesystem; shell commands; URLs; notifications; unknown tools).
pub(super) fn decisions(count: usize) -> anyhow::Result<DecisionFigures> {
    let dir = TempDir::new("decisions")?;
    let workspace = std::fs::canonicalize(dir.path())?;
    std::fs::write(workspace.join("notes.md"), "x")?;
    let manifest: atasira_domain::BoxManifest = serde_json::from_value(json!({
        "box_type": "bench-decisions",
        "purpose": "Write the weekly notes.",
        "os_operations": ["file:read", "file:write", "shell:exec", "browser:navigate", "notify:email"],
        "tools": ["Read", "Write", "Bash"],
        "file_access": ["read:/data/*"],
        "network": "filtered",
        "url_allowlist": ["example.com"],
        "shell": {"allowed_commands": ["git", "ls"], "require_approval_outside_allowlist": false},
        "credentials": {"allowed_vaults": ["ops"]},
        "notify": {"email": {"vault": "ops", "item": "smtp", "recipients": ["ops@example.com"]}},
    }))?;
    let manifest = manifest.effective();
    let tool_scope = manifest.effective_tools();
    let grant = atasira_host::Grant { manifest, workspace: workspace.to_string_lossy().into_owned(), tool_scope };
    let calls: Vec<Vec<u8>> = [
        json!({"tool": "Read", "input": {"file_path": "notes.md"}}),
        json!({"tool": "file:write", "input": {"path": "/etc/cron.d/x"}}),
        json!({"tool": "Bash", "input": {"command": "git status && ls -la"}}),
        json!({"tool": "shell:exec", "input": {"command": "rm -rf /"}}),
        json!({"tool": "browser:navigate", "input": {"url": "https://docs.example.com/a"}}),
        json!({"tool": "notify:email", "input": {"to": ["ops@example.com"]}}),
        json!({"tool": "WebFetch", "input": {"url": "https://example.com"}}),
        json!({"tool_name": "Write", "tool_input": {"file_path": "out/report.md", "content": "..."}}),
    ]
    .iter()
    .map(|c| serde_json::to_vec(c).unwrap_or_default())
    .collect();
    // Warm-up (page cache, allocator).
    for bytes in calls.iter().cycle().take(calls.len() * 50) {
        let call: ToolCall = serde_json::from_slice(bytes)?;
        std::hint::black_box(grant.decide(&call));
    }
    let mut floor = Vec::with_capacity(count);
    for bytes in calls.iter().cycle().take(count) {
        let started = Instant::now();
        let call: ToolCall = serde_json::from_slice(bytes)?;
        std::hint::black_box(&call);
        floor.push(started.elapsed());
    }
    let mut decide = Vec::with_capacity(count);
    let all = Instant::now();
    for bytes in calls.iter().cycle().take(count) {
        let started = Instant::now();
        let call: ToolCall = serde_json::from_slice(bytes)?;
        std::hint::black_box(grant.decide(&call));
        decide.push(started.elapsed());
    }
    let per_second = count as f64 / all.elapsed().as_secs_f64();
    Ok(DecisionFigures { per_second, decide: Latencies::new(decide), floor: Latencies::new(floor) })
}

/// Launch-to-running on the embedded system with an in-process host whose runner waits
/// for its input to end: `count` launches one after another, each timed until the
/// Worker's answer says `running`.
pub(super) async fn launch_to_running(count: usize) -> anyhow::Result<Latencies> {
    let data = TempDir::new("launch-to-running")?;
    let mut settings = settings_in(data.path());
    settings.host = Some(atasira_host::HostConfig {
        name: "bench".to_owned(),
        runner: "cat > /dev/null".to_owned(),
        capacity: u32::try_from(count + 8).unwrap_or(u32::MAX),
        stop_grace: Duration::from_secs(1),
        decide_listen: "127.0.0.1:0".parse()?,
        runner_path: "/usr/local/bin:/usr/bin:/bin".to_owned(),
    });
    let system = Embedded::start(&settings, "127.0.0.1:0".parse()?, None).await?;
    let addr = system.addr;
    let admin = Principal::new("bench-admin", Role::Admin, Kind::Human);
    let pat = auth::create_token(&system.db, &admin, Some(chrono::TimeDelta::hours(1)), auth::OPERATOR).await?.token;
    let box_id = super::workers::active_box(addr, &system.db, pat.clone(), "bench-running".to_owned()).await?;
    let measured = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Duration>> {
        let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
        let mut latencies = Vec::with_capacity(count);
        for i in 0..count {
            let started = Instant::now();
            let body = json!({"launch_id": format!("run-{i}"), "input": [{"kind": "text", "value": "wait"}]});
            let launched = super::workers::rest(&http, addr, &pat, &format!("/api/v1/boxes/{box_id}/workers"), &body, 201)?;
            let worker_id = launched["worker_id"].as_str().unwrap_or_default().to_owned();
            loop {
                let w: serde_json::Value =
                    http.get(&format!("http://{addr}/api/v1/workers/{worker_id}")).set("Authorization", &format!("Bearer {pat}")).call()?.into_json()?;
                if w["state"] == "running" {
                    break;
                }
                anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "Worker {worker_id} never ran: {w}");
                std::thread::sleep(Duration::from_millis(2));
            }
            latencies.push(started.elapsed());
        }
        Ok(latencies)
    })
    .await?;
    system.stop().await?;
    Ok(Latencies::new(measured?))
}
