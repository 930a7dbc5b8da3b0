//! Execution bindings (R-WORKER-3, seed 003): the provisioner is the execution host's side
//! of a launch. For `PrepareBinding` (from the gateway, or from the registry for a Box's
//! own schedule or event) it prepares what the Worker's tools
//! will use — the Box's workspace directory under the data dir, the tool scope from the
//! Box's effective tools, ticket access to what the Worker's input names — records it as
//! `BindingPrepared` and answers only an opaque handle and its lease. `ConsumeBinding`
//! (from the runtime registry, as `CreateWorker` claims the handle it was given) hands the
//! binding to exactly one Worker. A sweeper records `BindingExpired` for prepared bindings
//! nobody consumed within their lease.
//!
//! `ResolveBinding` (from the execution host that runs the Worker holding the binding, and
//! nobody else) answers what the binding holds, so the host can run the Worker there
//! (R-HOST-1).
//!
//! Architecture Invariant: what a binding holds (workspace, tool scope, ticket access)
//! leaves this service only as `BindingPrepared` in the store and in the answer to the
//! host that runs the binding's Worker; no other reply carries it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use atasira_contracts::{Reply, convert, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::binding::{BindingCommand, BindingError, BindingEvent, ExecutionBinding};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxState};
use atasira_domain::aggregates::security::SecurityCommand;
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::worker::Worker;
use atasira_domain::worker::{LaunchRequest, may_launch, validate_launch};
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::refusal::Refusal;
use atasira_platform::service::{self as platform_service, Call};
use atasira_platform::store::Retry;
use atasira_platform::store::{Cqrs, Cursor, Db};
use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::SERVICE;

/// Where a binding's tools run: this provisioner's host.
const EXECUTION_HOST: &str = "local";
/// What a Worker may read of tickets: the tickets and objectives its input names.
const TICKET_ACCESS: &str = "referenced";
/// Events the sweeper reads at once.
const SWEEP_BATCH: i64 = 500;

/// Prepares and hands out execution bindings.
pub(crate) struct Bindings {
    rt: Runtime,
    cqrs: Cqrs<ExecutionBinding>,
    /// `<data_dir>/workspaces`, absolute.
    workspaces: PathBuf,
    ttl: Duration,
}

impl Bindings {
    pub(crate) fn new(rt: Runtime, workspaces: PathBuf, ttl: Duration) -> Self {
        Self { cqrs: rt.db.cqrs(), rt, workspaces, ttl }
    }

    /// `PrepareBinding`, from the gateway only, for a caller who may launch Workers of the
    /// Box (human admins, the Box's assigned users); the Box must be active.
    pub(crate) async fn prepare(&self, call: &Call, r: v1::PrepareBinding) -> Result<Reply, Refusal> {
        // The gateway prepares for people and agents; the registry only for a Box's own
        // trigger (R-TRIG-1).
        let from_gateway = call.only_from(&[subjects::GATEWAY], "preparing an execution binding");
        let principal = match from_gateway {
            Ok(()) => call.principal(&self.rt).await?,
            Err(refusal) => {
                call.only_from(&[subjects::GATEWAY, subjects::RUNTIME_REGISTRY], "preparing an execution binding")?;
                let principal = call.principal(&self.rt).await?;
                if !atasira_domain::trigger::is_trigger_of(&principal, &r.box_id) {
                    return Err(refusal);
                }
                principal
            }
        };
        let launch = LaunchRequest { launch_id: r.launch_id.clone(), box_id: r.box_id.clone(), role: String::new(), labels: BTreeMap::new(), input: vec![] };
        let errors: Vec<_> = validate_launch(&launch).into_iter().filter(|e| e.key == "launch_id").collect();
        if !errors.is_empty() {
            let mut refusal = Refusal::new(ErrorCode::InvalidRequest, atasira_domain::error::joined(&errors));
            refusal.field_errors = errors;
            return Err(refusal);
        }
        let current: BoxAggregate = self.rt.db.load(&r.box_id).await.map_err(Refusal::internal)?;
        let Some(the_box) = current.data.filter(|d| d.state == BoxState::Idle) else {
            return Err(Refusal::new(ErrorCode::BoxNotActive, format!("Box {:?} is not active: unknown, stopped or archived", clip(&r.box_id))));
        };
        if !may_launch(&principal, &r.box_id, &the_box.assignments) {
            return Err(self.forbidden(&principal, &r.box_id).await);
        }
        let workspace = self.workspaces.join(the_box.manifest.box_type.as_str());
        tokio::fs::create_dir_all(&workspace).await.map_err(|e| Refusal::internal(format!("cannot create {}: {e}", workspace.display())))?;
        // A symbolic link in its place would send the Worker somewhere else.
        if !tokio::fs::symlink_metadata(&workspace).await.is_ok_and(|m| m.is_dir()) {
            return Err(Refusal::internal(format!("{} is not a directory of its own (a symbolic link?)", workspace.display())));
        }
        let handle = format!("bnd_{}", uuid::Uuid::new_v4().simple());
        let at = Utc::now();
        let expires_at = lease_end(at, self.ttl);
        let command = BindingCommand::Prepare {
            handle: handle.clone(),
            box_id: r.box_id,
            launch_id: r.launch_id,
            prepared_by: principal.user_id,
            execution_host: EXECUTION_HOST.to_owned(),
            workspace: workspace.to_string_lossy().into_owned(),
            tool_scope: the_box.manifest.effective_tools(),
            ticket_access: TICKET_ACCESS.to_owned(),
            expires_at,
            at,
        };
        let head = self.cqrs.execute_new(&handle, command, metadata(call)).await?.head()?;
        Ok(reply_written(&v1::BindingLease { handle, expires_at: Some(convert::timestamp(expires_at)) }, head.position, vec![head.id]))
    }

    /// `ConsumeBinding`, from the runtime registry only, on behalf of the launch's caller.
    pub(crate) async fn consume(&self, call: &Call, r: v1::ConsumeBinding) -> Result<Reply, Refusal> {
        call.only_from(&[subjects::RUNTIME_REGISTRY], "claiming an execution binding")?;
        let principal = call.principal(&self.rt).await?;
        // Not a handle this service makes: nothing to look up.
        if !is_handle(&r.handle) {
            return Err(BindingError::NotFound.into());
        }
        let command = BindingCommand::Consume { box_id: r.box_id, worker_id: r.worker_id, by: principal.user_id, now: Utc::now() };
        // A repeat commits nothing: the receipt names the binding's last event.
        let head = self.cqrs.execute(&r.handle, command, metadata(call), Retry::ONCE).await?.head()?;
        Ok(reply_written(&v1::Ack {}, head.position, vec![head.id]))
    }

    /// `ResolveBinding`, from an execution host only, for a binding a Worker holds that this
    /// host runs: the workspace, tool scope and ticket access the binding was prepared with.
    pub(crate) async fn resolve(&self, call: &Call, r: v1::ResolveBinding) -> Result<Reply, Refusal> {
        let host = call.only_hosts("resolving an execution binding")?.to_owned();
        if !is_handle(&r.handle) {
            return Err(BindingError::NotFound.into());
        }
        let binding: ExecutionBinding = self.rt.db.load(&r.handle).await.map_err(Refusal::internal)?;
        let Some(data) = binding.data else { return Err(BindingError::NotFound.into()) };
        let worker: Worker = self.rt.db.load(&r.worker_id).await.map_err(Refusal::internal)?;
        let runs_it = worker.host.as_deref() == Some(host.as_str()) && worker.state.is_live();
        if data.consumed_by.as_deref() != Some(r.worker_id.as_str()) || !runs_it {
            let record = SecurityCommand::Record {
                service: SERVICE.to_owned(),
                actor: subjects::host_identity(&host),
                target: clip(&r.worker_id),
                kind: "host_not_running_worker".to_owned(),
                reason: "asked for the execution binding of a Worker it does not run".to_owned(),
                at: Utc::now(),
            };
            let refusal = Refusal::new(ErrorCode::Forbidden, "this host does not run the Worker that holds this binding");
            return Err(platform_service::refuse_recorded(&self.rt, SERVICE, refusal, record).await);
        }
        for link in self.rt.db.stream(types::EXECUTION_BINDING, &r.handle).await.map_err(Refusal::internal)? {
            if let Ok(BindingEvent::BindingPrepared { workspace, tool_scope, ticket_access, .. }) = link.decode::<BindingEvent>() {
                return Ok(reply_ok(&v1::ResolvedBinding { workspace, tool_scope, ticket_access }));
            }
        }
        Err(BindingError::NotFound.into())
    }

    /// R-AUDIT-5: a caller who may not launch Workers of the Box is refused, and the
    /// refusal recorded as a security violation.
    async fn forbidden(&self, principal: &Principal, box_id: &str) -> Refusal {
        let refusal = Refusal::new(ErrorCode::Forbidden, "launching Workers of this Box needs a human admin or a user assigned to the Box");
        let record = SecurityCommand::Record {
            service: SERVICE.to_owned(),
            actor: principal.user_id.clone(),
            target: clip(box_id),
            kind: "launch_forbidden".to_owned(),
            reason: "asked for an execution binding of a Box it may not launch Workers of".to_owned(),
            at: Utc::now(),
        };
        platform_service::refuse_recorded(&self.rt, SERVICE, refusal, record).await
    }
}

/// The end of a lease that starts at `at` (far in the future for a lease too long to
/// count).
pub(crate) fn lease_end(at: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(ttl).ok().and_then(|d| at.checked_add_signed(d)).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// How often the sweeper looks: twice per lease, at least every 30 s, at most every second.
pub(crate) fn sweep_every(ttl: Duration) -> Duration {
    (ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Whether `handle` has the shape of the handles `prepare` makes (`bnd_` and 32 hex digits).
fn is_handle(handle: &str) -> bool {
    handle.strip_prefix("bnd_").is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The request's correlation id travels on the events it causes.
fn metadata(call: &Call) -> HashMap<String, String> {
    let mut metadata = HashMap::new();
    if !call.env.correlation_id.is_empty() {
        metadata.insert("correlation_id".to_owned(), clip(&call.env.correlation_id));
    }
    metadata
}

/// Caller-chosen text in a message or record: at most 128 characters.
fn clip(text: &str) -> String {
    text.chars().take(128).collect()
}

/// The prepared, unconsumed bindings the store holds, read on from a cursor.
#[derive(Debug, Default)]
pub(crate) struct OpenBindings {
    cursor: Cursor,
    /// handle -> end of its lease.
    open: BTreeMap<String, DateTime<Utc>>,
}

impl OpenBindings {
    /// Reads the binding events committed since the last call (all of them the first time).
    pub(crate) async fn catch_up(&mut self, db: &Db) -> anyhow::Result<()> {
        loop {
            let batch = db.read(self.cursor, &[types::EXECUTION_BINDING], SWEEP_BATCH).await?;
            let full = i64::try_from(batch.events.len()).unwrap_or(i64::MAX) >= SWEEP_BATCH;
            for event in &batch.events {
                self.cursor = event.cursor();
                match event.decode::<BindingEvent>() {
                    Ok(BindingEvent::BindingPrepared { handle, expires_at, .. }) => {
                        self.open.insert(handle, expires_at);
                    }
                    Ok(BindingEvent::BindingConsumed { handle, .. } | BindingEvent::BindingExpired { handle, .. }) => {
                        self.open.remove(&handle);
                    }
                    Err(e) => tracing::error!(event_id = %event.event_id, error = %e, "unreadable execution binding event; skipped"),
                }
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// The handles whose lease is over at `now`.
    pub(crate) fn due(&self, now: DateTime<Utc>) -> Vec<String> {
        self.open.iter().filter(|(_, end)| **end <= now).map(|(handle, _)| handle.clone()).collect()
    }

    pub(crate) fn forget(&mut self, handle: &str) {
        self.open.remove(handle);
    }
}

/// One sweep: reads what is new, then records `BindingExpired` for every prepared binding
/// whose lease is over (the aggregate adds nothing for one a Worker claimed meanwhile).
pub(crate) async fn sweep_once(db: &Db, cqrs: &Cqrs<ExecutionBinding>, open: &mut OpenBindings) -> anyhow::Result<usize> {
    open.catch_up(db).await?;
    let now = Utc::now();
    let mut expired = 0;
    for handle in open.due(now) {
        match cqrs.execute(&handle, BindingCommand::Expire { now }, HashMap::new(), Retry::ONCE).await {
            Ok(_) => {
                open.forget(&handle);
                expired += 1;
            }
            // A conflict or a failure of ours: the next sweep tries again.
            Err(refusal) if matches!(refusal.code, ErrorCode::Conflict | ErrorCode::Internal) => {
                tracing::warn!(handle, "could not expire an execution binding: {refusal}");
            }
            Err(refusal) => {
                tracing::error!(handle, "an execution binding cannot be expired: {refusal}");
                open.forget(&handle);
            }
        }
    }
    Ok(expired)
}

/// The sweeper: a sweep at start (the open bindings come from the store), then one every
/// [`sweep_every`] until `shutdown` flips.
pub(crate) async fn sweep(rt: Runtime, ttl: Duration, shutdown: watch::Receiver<bool>) {
    let cqrs = rt.db.cqrs::<ExecutionBinding>();
    let mut open = OpenBindings::default();
    loop {
        match sweep_once(&rt.db, &cqrs, &mut open).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(expired = n, "execution bindings past their lease expired"),
            Err(e) => tracing::warn!(error = %e, "could not read the execution bindings; sweeping again later"),
        }
        tokio::select! {
            () = tokio::time::sleep(sweep_every(ttl)) => {}
            () = platform_service::until_shutdown(shutdown.clone()) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_worker_3_the_sweeper_looks_twice_per_lease_between_1_and_30_seconds() {
        assert_eq!(sweep_every(Duration::from_secs(600)), Duration::from_secs(30));
        assert_eq!(sweep_every(Duration::from_secs(20)), Duration::from_secs(10));
        assert_eq!(sweep_every(Duration::from_secs(1)), Duration::from_secs(1));
    }

    #[test]
    fn handles_have_one_shape_and_leases_never_overflow() {
        assert!(is_handle(&format!("bnd_{}", uuid::Uuid::new_v4().simple())));
        for bad in ["", "bnd_", "bnd_xyz", "wkr_0123456789abcdef0123456789abcdef", &format!("bnd_{}", "a".repeat(33))] {
            assert!(!is_handle(bad), "{bad}");
        }
        let at = Utc::now();
        assert_eq!(lease_end(at, Duration::from_secs(600)), at + chrono::TimeDelta::minutes(10));
        assert_eq!(lease_end(at, Duration::from_secs(u64::MAX)), DateTime::<Utc>::MAX_UTC);
    }
}
