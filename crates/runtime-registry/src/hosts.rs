//! Execution hosts (R-HOST-1, R-HOST-2): the registry's side. A host heartbeats
//! (`HostHeartbeat`): that renews its lease, hands it Workers waiting for a host (each
//! claimed on its stream, once) and the orders for those it runs (stop, kill, later input,
//! drop what is no longer its). It fetches the bundle its Workers pin (`GetBundle`) and
//! reports on them (`ReportWorker`); only the host a Worker's stream names may. The
//! registry publishes what hosts report on the Box's channels, so no host needs (or has)
//! the right to publish there. A sweeper records `WorkerLost` for the Workers of a host
//! whose lease ran out.
//!
//! Users act on Workers here too: stop or kill (`StopWorker`, admins and the Box's
//! primary), more input (`AddWorkerInput`, those who may launch Workers of the Box);
//! stopping or archiving a Box stops its Workers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{Reply, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxRole};
use atasira_domain::aggregates::bundle::BundleEvent;
use atasira_domain::aggregates::security::SecurityCommand;
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::worker::{Notification, Report, ToolAsk, ToolRequestState, Worker, WorkerCommand, WorkerEvent, bounded_log};
use atasira_domain::worker::{WorkerState, bundle_bytes, digest_of, may_launch};
use atasira_domain::{BoxManifest, ErrorCode, Principal};
use atasira_platform::projection as proj;
use atasira_platform::refusal::Refusal;
use atasira_platform::service as platform_service;
use atasira_platform::store::{EventAt, Retry};

use crate::workers_view;
use crate::{Registry, SERVICE};

/// The longest a heartbeat waits for news.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// Workers one heartbeat hands out at most, and Workers a host may say it runs.
const CLAIMS_PER_BEAT: u32 = 16;
const RUNNING_MAX: usize = 1024;
/// Log lines a Worker's answer shows (its last ones).
pub(crate) const LOG_SHOWN: i64 = 200;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Registry {
    /// `HostHeartbeat`: renews the host's lease, then answers as soon as there is
    /// something for it (Workers to start, orders), at the latest after its wait.
    pub(crate) async fn heartbeat(&self, host: &str, r: v1::HostHeartbeat) -> Result<Reply, Refusal> {
        if r.running.len() > RUNNING_MAX {
            return Err(Refusal::new(ErrorCode::InvalidRequest, format!("a host runs at most {RUNNING_MAX} Workers")));
        }
        self.renew(host, r.capacity).await.map_err(Refusal::internal)?;
        // A third of the lease at most: the next heartbeat renews it in time.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(u64::from(r.wait_ms)).min(MAX_WAIT).min(self.config.host_lease / 3);
        let mut progress = self.rt.db.on_progress();
        let running: HashMap<&str, u32> = r.running.iter().map(|w| (w.worker_id.as_str(), w.inputs_seen)).collect();
        let lease_ms = u32::try_from(self.config.host_lease.as_millis()).unwrap_or(u32::MAX);
        loop {
            let (orders, live) = self.orders_for(host, &running).await?;
            let claimed = if r.capacity > 0 { self.claim_for(host, r.capacity.min(CLAIMS_PER_BEAT)).await? } else { vec![] };
            if !orders.is_empty() || !claimed.is_empty() || tokio::time::Instant::now() >= deadline {
                self.publish_heartbeats(host, &live).await;
                return Ok(reply_ok(&v1::HostOrders { lease_ms, claimed, orders }));
            }
            tokio::select! {
                _ = progress.changed() => {}
                // What another replica's consumers did is seen on the next look.
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    async fn renew(&self, host: &str, capacity: u32) -> anyhow::Result<()> {
        let now = now_ms();
        let until = now.saturating_add(i64::try_from(self.config.host_lease.as_millis()).unwrap_or(i64::MAX));
        sqlx::query(
            "INSERT INTO host_leases (name, capacity, lease_until_ms, seen_at_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO UPDATE SET capacity = excluded.capacity, lease_until_ms = excluded.lease_until_ms, seen_at_ms = excluded.seen_at_ms",
        )
        .bind(host)
        .bind(i64::from(capacity))
        .bind(until)
        .bind(now)
        .execute(self.rt.db.any())
        .await?;
        Ok(())
    }

    /// What the host must do to the Workers it says it runs (as their streams say), and
    /// those of them it does run (id, box_type, state); a Worker the store says it runs and
    /// it does not know of (it restarted) is lost.
    async fn orders_for(&self, host: &str, running: &HashMap<&str, u32>) -> Result<(Vec<v1::WorkerOrder>, Vec<Live>), Refusal> {
        use v1::worker_order::Kind;
        let mut orders = Vec::new();
        let mut live = Vec::new();
        for (worker_id, seen) in running {
            let order = |kind: Kind| v1::WorkerOrder { worker_id: (*worker_id).to_owned(), kind: kind as i32, ..Default::default() };
            let worker: Worker = self.rt.db.load(worker_id).await.map_err(Refusal::internal)?;
            let Some(data) = worker.data.as_ref().filter(|_| worker.host.as_deref() == Some(host) && worker.state.is_live()) else {
                orders.push(order(Kind::Drop));
                continue;
            };
            live.push(Live { worker_id: data.worker_id.clone(), box_type: data.box_type.clone(), state: worker.state });
            match worker.stop_requested {
                Some(true) => orders.push(order(Kind::Kill)),
                Some(false) => orders.push(order(Kind::Stop)),
                None if worker.pause_requested && worker.state == WorkerState::Running => orders.push(order(Kind::Pause)),
                None if !worker.pause_requested && worker.state == WorkerState::Paused => orders.push(order(Kind::Resume)),
                None => {}
            }
            if worker.inputs > *seen {
                // The transcript as the catalog holds it so far; the rest at a later beat.
                let entries = workers_view::inputs_after(&self.rt.db, worker_id, *seen).await.map_err(Refusal::internal)?;
                for (n, entry) in entries.iter().take((worker.inputs - seen) as usize).enumerate() {
                    let input = entry.iter().map(workers_view::segment_to_wire).collect();
                    orders.push(v1::WorkerOrder { input, inputs_seen: seen + u32::try_from(n + 1).unwrap_or(u32::MAX), ..order(Kind::Input) });
                }
            }
        }
        let held = workers_view::lives(&self.rt.db, "host = $1 AND state IN ('starting', 'running', 'paused')", host, 1024).await.map_err(Refusal::internal)?;
        for orphan in held.iter().filter(|l| !running.contains_key(l.worker_id.as_str())) {
            tracing::warn!(host, worker_id = orphan.worker_id, "the host no longer runs a Worker it held (it restarted?): lost");
            self.lose(host, &orphan.worker_id).await;
        }
        Ok((orders, live))
    }

    /// Claims up to `n` Workers waiting for a host; what this host needs to start each.
    async fn claim_for(&self, host: &str, n: u32) -> Result<Vec<v1::HostWorker>, Refusal> {
        let mut claimed = Vec::new();
        for worker_id in workers_view::waiting(&self.rt.db, n).await.map_err(Refusal::internal)? {
            let command = WorkerCommand::Claim { host: host.to_owned(), at: chrono::Utc::now() };
            match self.workers.execute(&worker_id, command, HashMap::new(), Retry::ONCE).await {
                Ok(receipt) if receipt.appended() => {}
                Ok(_) => continue,
                // Another host (or a stop) came first.
                Err(refusal) if matches!(refusal.code, ErrorCode::Conflict | ErrorCode::WorkerEnded) => continue,
                Err(refusal) => return Err(refusal),
            }
            let Some(created) = self.created(&worker_id).await? else { continue };
            let WorkerEvent::WorkerCreated { box_id, box_type, bundle_digest, binding_handle, initial_input, .. } = created.event else { continue };
            tracing::info!(host, worker_id, box_type, "Worker claimed");
            claimed.push(v1::HostWorker {
                worker_id,
                box_id,
                box_type,
                bundle_digest,
                binding_handle,
                initial_input: initial_input.iter().map(workers_view::segment_to_wire).collect(),
            });
        }
        Ok(claimed)
    }

    /// Publishes a heartbeat on the channel of each Box whose Workers the host runs.
    async fn publish_heartbeats(&self, host: &str, live: &[Live]) {
        for w in live {
            let body = serde_json::json!({"worker_id": w.worker_id, "host": host, "state": w.state.as_str(), "at": chrono::Utc::now()});
            self.publish(&w.box_type, "heartbeat", &body).await;
        }
    }

    async fn publish(&self, box_type: &str, channel: &str, body: &serde_json::Value) {
        let subject = subjects::channel(box_type, channel);
        if let Err(e) = self.rt.bus.publish(&subject, body.to_string().into()).await {
            tracing::debug!(subject, error = %e, "could not publish on a Box channel");
        }
    }

    /// Records the Worker lost (its host's lease ran out, or the host forgot it).
    async fn lose(&self, host: &str, worker_id: &str) {
        let command = WorkerCommand::Lose { host: host.to_owned(), at: chrono::Utc::now() };
        match self.workers.execute(worker_id, command, HashMap::new(), Retry::ONCE).await {
            Ok(_) => tracing::warn!(host, worker_id, "Worker lost"),
            Err(refusal) => tracing::debug!(host, worker_id, "not lost: {refusal}"),
        }
    }

    /// The Box and the manifest of the bundle `digest`, if synced.
    async fn bundle_manifest(&self, digest: &str) -> anyhow::Result<Option<(String, BoxManifest)>> {
        for link in self.rt.db.stream(types::CONFIG_BUNDLE, digest).await? {
            if let Ok(BundleEvent::ConfigBundleSynced { box_id, manifest, .. }) = link.decode::<BundleEvent>() {
                return Ok(Some((box_id, manifest)));
            }
        }
        Ok(None)
    }

    /// Whether a failure of Worker `worker_id` escalates: its bundle's
    /// `loop_control.escalate_on_failure` (seed 000: on by default).
    async fn escalates(&self, worker_id: &str) -> bool {
        let Ok(worker) = self.rt.db.load::<Worker>(worker_id).await else { return false };
        let Some(digest) = worker.data.map(|d| d.bundle_digest) else { return false };
        matches!(self.bundle_manifest(&digest).await, Ok(Some((_, m))) if m.loop_control.escalate_on_failure)
    }

    /// `GetBundle`: the canonical bytes of the bundle a Worker this host runs pins.
    pub(crate) async fn get_bundle(&self, host: &str, r: v1::GetBundle) -> Result<Reply, Refusal> {
        let worker: Worker = self.rt.db.load(&r.worker_id).await.map_err(Refusal::internal)?;
        let pinned = worker.host.as_deref() == Some(host) && worker.state.is_live() && worker.data.as_ref().is_some_and(|d| d.bundle_digest == r.digest);
        let manifest = if pinned { self.bundle_manifest(&r.digest).await.map_err(Refusal::internal)? } else { None };
        let Some((box_id, manifest)) = manifest else {
            return Err(Refusal::new(ErrorCode::BundleNotFound, "no Worker this host runs pins this bundle"));
        };
        let canonical = bundle_bytes(&box_id, &manifest);
        if digest_of(&canonical) != r.digest {
            return Err(Refusal::new(ErrorCode::BundleDigestMismatch, "the stored bundle does not give its digest"));
        }
        Ok(reply_ok(&v1::BundleBytes { canonical }))
    }

    /// `ReportWorker`: the host's report on a Worker it runs, recorded on its stream and
    /// published on the Box's channel. A host reporting on a Worker it does not run is
    /// refused, and the refusal recorded.
    pub(crate) async fn report(&self, host: &str, r: v1::ReportWorker) -> Result<Reply, Refusal> {
        use v1::report_worker::Report as Wire;
        let at = chrono::Utc::now();
        let (command, published) = match r.report {
            Some(Wire::Running(_)) => (WorkerCommand::Report { host: host.to_owned(), report: Report::Running, at }, None),
            Some(Wire::Paused(_)) => (WorkerCommand::Report { host: host.to_owned(), report: Report::Paused, at }, None),
            Some(Wire::Log(lines)) => {
                let body = serde_json::json!({"worker_id": r.worker_id, "lines": bounded_log(lines.lines.clone(), usize::MAX)});
                (WorkerCommand::Report { host: host.to_owned(), report: Report::Log(lines.lines), at }, Some(("log", body)))
            }
            Some(Wire::Finished(end)) => {
                let state = WorkerState::parse(&end.state)
                    .filter(|s| matches!(s, WorkerState::Succeeded | WorkerState::Failed | WorkerState::Killed))
                    .ok_or_else(|| Refusal::new(ErrorCode::InvalidRequest, "state: succeeded, failed or killed"))?;
                let body = serde_json::json!({"worker_id": r.worker_id, "state": state, "exit_code": end.exit_code});
                let report = Report::Finished { state, exit_code: end.exit_code, result: end.result };
                (WorkerCommand::Report { host: host.to_owned(), report, at }, Some(("result", body)))
            }
            Some(Wire::Decision(d)) if d.decision == "deny" => {
                let input = d.input.map(atasira_contracts::manifest::value_from_proto).unwrap_or_default().to_string();
                let command = WorkerCommand::RecordDenial { host: host.to_owned(), tool: d.tool, rule: d.rule, reason: d.reason, input, at };
                (command, None)
            }
            Some(Wire::Decision(_)) => return Err(Refusal::new(ErrorCode::InvalidRequest, "decision: only denials are recorded this way")),
            Some(Wire::Notify(n)) => {
                let notification =
                    Notification { notification_id: n.notification_id, channel: n.channel, to: n.to, broadcast: n.broadcast, subject: n.subject, body: n.body };
                (WorkerCommand::Notify { host: host.to_owned(), notification, at }, None)
            }
            None => return Err(Refusal::new(ErrorCode::InvalidRequest, "report: running, paused, log, finished or decision")),
        };
        let receipt = match self.workers.execute(&r.worker_id, command, HashMap::new(), Retry::ONCE).await {
            Ok(receipt) => receipt,
            Err(refusal) if refusal.code == ErrorCode::Forbidden => return Err(self.not_its_host(host, &r.worker_id, refusal).await),
            Err(refusal) => return Err(refusal),
        };
        if let Some((channel, body)) = published.filter(|_| receipt.appended())
            && let Some(life) = workers_view::life(&self.rt.db, &r.worker_id).await.ok().flatten()
        {
            self.publish(&life.box_type, channel, &body).await;
            // A failure escalates on the Box's `escalation` channel (the audit service
            // tells approvers and the Box's primaries, R-NOTIFY-1).
            if body["state"] == serde_json::json!(WorkerState::Failed) && self.escalates(&r.worker_id).await {
                self.publish(&life.box_type, "escalation", &body).await;
            }
        }
        Ok(receipt.head().map_or_else(|_| reply_ok(&v1::Ack {}), |at| reply_written(&v1::Ack {}, at.position, vec![at.id])))
    }

    /// `AskTool` (R-DECIDE-2): records the tool-use request once, then waits (bounded) for
    /// a human admin's decision; past its deadline it is expired, a denial.
    pub(crate) async fn ask_tool(&self, host: &str, r: v1::AskTool) -> Result<Reply, Refusal> {
        let now = chrono::Utc::now();
        let expires_at = now + chrono::TimeDelta::from_std(self.config.ask_ttl).unwrap_or(chrono::TimeDelta::minutes(5));
        let input = r.input.map(atasira_contracts::manifest::value_from_proto).unwrap_or_default().to_string();
        let ask = ToolAsk { request_id: r.request_id.clone(), tool: r.tool, rule: r.rule, reason: r.reason, input, expires_at };
        match self.workers.execute(&r.worker_id, WorkerCommand::Ask { host: host.to_owned(), ask, at: now }, HashMap::new(), Retry::ONCE).await {
            Ok(_) => {}
            Err(refusal) if refusal.code == ErrorCode::Forbidden => return Err(self.not_its_host(host, &r.worker_id, refusal).await),
            Err(refusal) => return Err(refusal),
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(u64::from(r.wait_ms)).min(MAX_WAIT);
        loop {
            let worker: Worker = self.rt.db.load(&r.worker_id).await.map_err(Refusal::internal)?;
            let request =
                worker.tool_requests.get(&r.request_id).cloned().ok_or_else(|| Refusal::new(ErrorCode::ToolRequestNotFound, "no such tool-use request"))?;
            if request.state == ToolRequestState::Pending && chrono::Utc::now() >= request.expires_at {
                let command = WorkerCommand::ExpireTool { request_id: r.request_id.clone(), now: chrono::Utc::now() };
                self.workers.execute(&r.worker_id, command, HashMap::new(), Retry::ONCE).await?;
                continue;
            }
            if request.state != ToolRequestState::Pending || tokio::time::Instant::now() >= deadline {
                return Ok(reply_ok(&v1::ToolAnswer {
                    state: request.state.as_str().to_owned(),
                    expires_at: Some(atasira_contracts::convert::timestamp(request.expires_at)),
                    decided_by: request.decided_by,
                    reason: request.reason,
                }));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `ListToolRequests` (admins): a page of tool-use requests, newest first.
    pub(crate) async fn list_tool_requests(&self, principal: &Principal, r: v1::ListToolRequests) -> Result<Reply, Refusal> {
        if !principal.is_admin() {
            return Err(Refusal::new(ErrorCode::Forbidden, "only admins see tool-use requests"));
        }
        let state = if r.state.is_empty() { "pending" } else { r.state.as_str() };
        if !["pending", "approved", "rejected", "expired", "all"].contains(&state) {
            return Err(Refusal::new(ErrorCode::InvalidQuery, "state: pending, approved, rejected, expired or all"));
        }
        let (requests, next_cursor) = workers_view::tool_requests(&self.rt.db, state, r.limit, r.after).await.map_err(Refusal::internal)?;
        Ok(reply_ok(&v1::ToolRequestPage { requests, next_cursor }))
    }

    /// `DecideToolRequest` (R-DECIDE-2): one decision, by a human admin who did not launch
    /// the Worker, before the request's deadline.
    pub(crate) async fn decide_tool_request(&self, principal: Principal, r: v1::DecideToolRequest) -> Result<Reply, Refusal> {
        let found = workers_view::tool_request(&self.rt.db, &r.request_id).await.map_err(Refusal::internal)?;
        let Some(found) = found else { return Err(Refusal::new(ErrorCode::ToolRequestNotFound, format!("no tool-use request {:?}", r.request_id))) };
        if !principal.is_admin() {
            return Err(Refusal::new(ErrorCode::Forbidden, "only a human admin decides a Worker's tool call"));
        }
        // R-POLICY-1: the organisation's rules on runtime approvals (a denial is recorded);
        // the Box is read only when a policy is in force.
        let active = self.policies.active(&self.rt.db).await?;
        let boxed = match &active {
            Some(_) => self.rt.db.load::<atasira_domain::aggregates::boxes::BoxAggregate>(&found.box_id).await.map_err(Refusal::internal)?.data,
            None => None,
        };
        let policy = match (active, boxed) {
            (Some(active), Some(b)) => {
                let input =
                    atasira_domain::org_policy::Input::runtime_approval(&principal, &b.manifest, &found.box_id, &found.worker_id, &found.tool, r.approve);
                Some(active.admit(&self.rt, SERVICE, &r.request_id, &input).await?)
            }
            _ => None,
        };
        let command = WorkerCommand::DecideTool {
            request_id: r.request_id.clone(),
            by: principal,
            approve: r.approve,
            reason: r.reason,
            now: chrono::Utc::now(),
            policy,
        };
        let at = self.workers.execute(&found.worker_id, command, HashMap::new(), Retry::ONCE).await?.head()?;
        proj::wait_for_events(&self.rt.db, &[workers_view::READ_MODEL], std::slice::from_ref(&at.id), at.position, Duration::from_secs(5))
            .await
            .map_err(Refusal::internal)?;
        let view = workers_view::tool_request(&self.rt.db, &r.request_id).await.map_err(Refusal::internal)?.unwrap_or(found);
        Ok(reply_written(&view, at.position, vec![at.id]))
    }

    /// `GetToolRequest` (admins): one tool-use request.
    pub(crate) async fn get_tool_request(&self, principal: &Principal, request_id: &str) -> Result<v1::ToolRequestView, Refusal> {
        if !principal.is_admin() {
            return Err(Refusal::new(ErrorCode::Forbidden, "only admins see tool-use requests"));
        }
        workers_view::tool_request(&self.rt.db, request_id)
            .await
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::new(ErrorCode::ToolRequestNotFound, format!("no tool-use request {request_id:?}")))
    }

    /// R-AUDIT-5: a host that reports on (or asks for) a Worker it does not run.
    async fn not_its_host(&self, host: &str, worker_id: &str, refusal: Refusal) -> Refusal {
        let record = SecurityCommand::Record {
            service: SERVICE.to_owned(),
            actor: subjects::host_identity(host),
            target: worker_id.chars().take(128).collect(),
            kind: "host_not_running_worker".to_owned(),
            reason: format!("host {host} reported on a Worker it does not run"),
            at: chrono::Utc::now(),
        };
        platform_service::refuse_recorded(&self.rt, SERVICE, refusal, record).await
    }

    /// The Worker's stream, or `worker_not_found`.
    async fn worker(&self, worker_id: &str) -> Result<Worker, Refusal> {
        let worker: Worker = self.rt.db.load(worker_id).await.map_err(Refusal::internal)?;
        if worker.data.is_none() {
            return Err(Refusal::new(ErrorCode::WorkerNotFound, format!("no Worker {worker_id:?}")));
        }
        Ok(worker)
    }

    /// Who may stop, kill, pause or resume a Worker: human admins and its Box's primary.
    async fn may_control(&self, principal: &Principal, worker_id: &str, what: &str) -> Result<(), Refusal> {
        let worker = self.worker(worker_id).await?;
        let box_id = worker.data.as_ref().map(|d| d.box_id.clone()).unwrap_or_default();
        let the_box: BoxAggregate = self.rt.db.load(&box_id).await.map_err(Refusal::internal)?;
        let primary = the_box.data.as_ref().is_some_and(|b| b.assignments.iter().any(|(u, role)| *u == principal.user_id && *role == BoxRole::Primary));
        if principal.is_human_admin() || primary {
            return Ok(());
        }
        Err(Refusal::new(ErrorCode::Forbidden, format!("{what} a Worker needs a human admin or the Box's primary")))
    }

    /// `PauseWorker` (R-HOST-2): its host stops (SIGSTOP) or continues (SIGCONT) its runner.
    pub(crate) async fn pause_worker(&self, principal: Principal, r: v1::PauseWorker) -> Result<Reply, Refusal> {
        self.may_control(&principal, &r.worker_id, if r.pause { "pausing" } else { "resuming" }).await?;
        let command = WorkerCommand::Pause { by: principal.user_id.clone(), pause: r.pause, at: chrono::Utc::now() };
        let at = self.workers.execute(&r.worker_id, command, HashMap::new(), Retry::ONCE).await?.head()?;
        if let Some(life) = workers_view::life(&self.rt.db, &r.worker_id).await.ok().flatten() {
            let channel = if r.pause { "pause" } else { "resume" };
            self.publish(&life.box_type, channel, &serde_json::json!({"worker_id": r.worker_id})).await;
        }
        self.worker_answer(&principal, &r.worker_id, at).await
    }

    /// `StopWorker` (R-HOST-2): admins and the Box's primary stop or kill a Worker.
    pub(crate) async fn stop_worker(&self, principal: Principal, r: v1::StopWorker) -> Result<Reply, Refusal> {
        self.may_control(&principal, &r.worker_id, "stopping").await?;
        let command = WorkerCommand::Stop { by: principal.user_id.clone(), kill: r.kill, at: chrono::Utc::now() };
        let at = self.workers.execute(&r.worker_id, command, HashMap::new(), Retry::ONCE).await?.head()?;
        if let Some(life) = workers_view::life(&self.rt.db, &r.worker_id).await.ok().flatten() {
            self.publish(&life.box_type, "kill", &serde_json::json!({"worker_id": r.worker_id, "kill": r.kill})).await;
        }
        self.worker_answer(&principal, &r.worker_id, at).await
    }

    /// `AddWorkerInput`: more input for a Worker, from those who may launch Workers of
    /// its Box.
    pub(crate) async fn add_input(&self, principal: Principal, r: v1::AddWorkerInput) -> Result<Reply, Refusal> {
        let worker = self.worker(&r.worker_id).await?;
        let box_id = worker.data.as_ref().map(|d| d.box_id.clone()).unwrap_or_default();
        let the_box: BoxAggregate = self.rt.db.load(&box_id).await.map_err(Refusal::internal)?;
        let assignments = the_box.data.map(|b| b.assignments).unwrap_or_default();
        if !may_launch(&principal, &box_id, &assignments) {
            return Err(Refusal::new(ErrorCode::Forbidden, "sending input to a Worker needs a human admin or a user assigned to the Box"));
        }
        let mut input = Vec::with_capacity(r.input.len());
        for (i, segment) in r.input.iter().enumerate() {
            let segment = workers_view::segment_from_wire(segment)
                .ok_or_else(|| Refusal::new(ErrorCode::InvalidSegment, format!("input[{i}]: a segment is text, ticket_ref or objective_ref")))?;
            input.push(segment);
        }
        let command = WorkerCommand::AddInput { by: principal.user_id.clone(), input, at: chrono::Utc::now() };
        let at = self.workers.execute(&r.worker_id, command, HashMap::new(), Retry::ONCE).await?.head()?;
        self.worker_answer(&principal, &r.worker_id, at).await
    }

    /// The Worker once the catalog shows `at`.
    async fn worker_answer(&self, principal: &Principal, worker_id: &str, at: EventAt) -> Result<Reply, Refusal> {
        proj::wait_for_events(&self.rt.db, &[workers_view::READ_MODEL], std::slice::from_ref(&at.id), at.position, Duration::from_secs(5))
            .await
            .map_err(Refusal::internal)?;
        let view = self.worker_view(principal, worker_id).await?;
        Ok(reply_written(&v1::WorkerReply { worker: Some(view), created: false }, at.position, vec![at.id]))
    }

    /// R-HOST-2: stopping or archiving a Box stops its Workers (those waiting for a host end
    /// at once).
    pub(crate) async fn stop_box_workers(&self, box_id: &str, by: &str) {
        let lives = match workers_view::lives(&self.rt.db, "box_id = $1 AND state IN ('created', 'starting', 'running', 'paused')", box_id, 10_000).await {
            Ok(lives) => lives,
            Err(e) => return tracing::warn!(box_id, error = %e, "could not read the Box's Workers to stop them"),
        };
        for life in lives {
            let command = WorkerCommand::Stop { by: by.to_owned(), kill: false, at: chrono::Utc::now() };
            if let Err(refusal) = self.workers.execute(&life.worker_id, command, HashMap::new(), Retry::ONCE).await {
                tracing::warn!(box_id, worker_id = life.worker_id, "could not stop a Worker of the stopped Box: {refusal}");
            }
        }
    }
}

/// A Worker its host runs, as its stream says.
#[derive(Debug)]
struct Live {
    worker_id: String,
    box_type: String,
    state: WorkerState,
}

/// The sweeper: every quarter lease, the Workers whose host's lease ran out are lost.
pub(crate) async fn sweep_lost(registry: Arc<Registry>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let every = (registry.config.host_lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    // Said once per outage, not every quarter lease.
    let mut warned = false;
    loop {
        let due = sqlx::query(
            "SELECT l.worker_id, l.host FROM worker_life l LEFT JOIN host_leases h ON h.name = l.host
             WHERE l.state IN ('starting', 'running', 'paused') AND (h.lease_until_ms IS NULL OR h.lease_until_ms < $1) LIMIT 1000",
        )
        .bind(now_ms())
        .fetch_all(registry.rt.db.any())
        .await;
        match due {
            Ok(rows) => {
                for row in rows {
                    let (Ok(worker_id), Ok(host)) = (sqlx::Row::try_get::<String, _>(&row, 0), sqlx::Row::try_get::<String, _>(&row, 1)) else { continue };
                    registry.lose(&host, &worker_id).await;
                }
                warned = false;
            }
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %e, "could not look for lost Workers; trying again");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = platform_service::until_shutdown(shutdown.clone()) => return,
        }
    }
}
