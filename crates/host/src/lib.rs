//! The execution host (R-HOST-1, R-HOST-2, R-DECIDE-1): `atasira serve host --name NAME`
//! (and one in-process host in `atasira dev --runner`).
//!
//! It heartbeats to the registry, which renews its lease and hands it Workers waiting for a
//! host, each claimed once on its stream. For each it fetches the bundle by digest (and
//! checks the digest), asks the provisioner what the Worker's binding prepared (workspace,
//! tool scope: the only answer that says), and runs the operator's runner in the workspace
//! as a child process with a clean environment: on stdin the agent context XML and the
//! input; in the environment the Worker id and how to reach this host's decision endpoint
//! with a credential for this Worker alone. What the runner writes on stderr is its log,
//! on stdout its result; its exit ends it. Stop and kill reach it as signals to its process
//! group.
//!
//! The decision endpoint answers `{tool, input}` before every tool call from the Worker's
//! bundle and binding alone (`domain::decide`); denials are recorded on the Worker's stream
//! (ledger rows), every decision is counted.
//!
//! Architecture Invariant: a Worker's runner never sees its workspace path or tool scope
//! in an answer or event (it runs in the workspace, which is all it needs), and its
//! credential opens nothing but its own decisions. The host holds no database and signs
//! nothing: it speaks only on its own subjects, which its NATS identity alone may use.

mod decisions;
mod runner;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atasira_contracts::{Request, subjects, v1};
use atasira_platform::bus::Bus;
use atasira_platform::client::HostClient;
use tokio::sync::{mpsc, watch};

pub use decisions::Grant;

/// What the operator chose for this host.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Its name: its NATS identity is `host-<name>`.
    pub name: String,
    /// The runner: a shell command line, run with `/bin/sh -c` in each Worker's workspace.
    pub runner: String,
    /// Workers it runs at once.
    pub capacity: u32,
    /// How long a stopped runner has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Where the decision endpoint listens (loopback; port 0 picks one).
    pub decide_listen: SocketAddr,
    /// The runner's PATH (with the directory of `atasira` in it, for `atasira decide`).
    pub runner_path: String,
}

/// What the host tells a running Worker's supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// SIGTERM, then SIGKILL after the grace.
    Stop,
    /// SIGKILL now.
    Kill,
    /// It is not ours any more: SIGKILL, report nothing.
    Drop,
    /// SIGSTOP, then report it paused.
    Pause,
    /// SIGCONT, then report it running.
    Resume,
}

/// A Worker this host runs.
#[derive(Debug)]
pub(crate) struct Held {
    pub inputs_seen: u32,
    /// The last stop or kill passed on (the registry repeats its orders until the end).
    pub ordered: Option<Control>,
    pub control: mpsc::UnboundedSender<Control>,
    /// Later input for its stdin.
    pub input: mpsc::UnboundedSender<String>,
    /// Its credential at the decision endpoint.
    pub token: String,
    /// Its bundle and binding, once resolved.
    pub grant: Option<Arc<Grant>>,
}

/// The host's state, shared by the heartbeat loop, the supervisors and the decision
/// endpoint.
#[derive(Debug)]
pub(crate) struct Host {
    pub config: HostConfig,
    pub client: HostClient,
    pub held: Mutex<HashMap<String, Held>>,
    /// `http://127.0.0.1:<port>/v1/decide`, once listening.
    pub decide_url: std::sync::OnceLock<String>,
}

impl Host {
    pub(crate) async fn ask<R: Request>(&self, to: &str, request: &R) -> anyhow::Result<R::Reply> {
        match self.client.ask(to, request, Duration::ZERO).await? {
            Ok(written) => Ok(written.reply),
            Err(refused) => anyhow::bail!("{refused}"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reports on a Worker; a failure is logged (the registry learns the end at the next
    /// heartbeat at the latest: the Worker is then not in the host's list).
    pub(crate) async fn report(&self, worker_id: &str, report: v1::report_worker::Report) -> Result<(), String> {
        let request = v1::ReportWorker { worker_id: worker_id.to_owned(), report: Some(report) };
        for attempt in 0..3 {
            match self.client.ask(subjects::RUNTIME_REGISTRY, &request, Duration::ZERO).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(refused)) => {
                    tracing::warn!(worker_id, "the registry refused a report: {refused}");
                    return Err(refused.to_string());
                }
                Err(e) if attempt == 2 => {
                    tracing::warn!(worker_id, error = %e, "could not report on a Worker");
                    return Err(e.to_string());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        Err("could not report".to_owned())
    }
}

/// How long a heartbeat may wait at the registry for news.
const BEAT_WAIT: Duration = Duration::from_secs(2);

/// Runs the host on `bus` until `shutdown` flips; then kills its runners.
pub async fn run(bus: Arc<dyn Bus>, config: HostConfig, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    anyhow::ensure!(subjects::is_host_name(&config.name), "{:?} cannot name a host: 1 to 32 lowercase letters, digits and '-'", config.name);
    let client = HostClient::new(&config.name, bus, Duration::from_secs(10));
    let host = Arc::new(Host { config, client, held: Mutex::new(HashMap::new()), decide_url: std::sync::OnceLock::new() });
    let (addr, endpoint) = decisions::serve(host.clone(), shutdown.clone()).await?;
    let _ = host.decide_url.set(format!("http://{addr}/v1/decide"));
    tracing::info!(host = host.config.name, capacity = host.config.capacity, "execution host: decisions on http://{addr}");
    let mut lease = Duration::from_secs(10);
    let mut heard = tokio::time::Instant::now();
    let mut shutdown_rx = shutdown.clone();
    loop {
        if *shutdown_rx.borrow() {
            break;
        }
        let beat = {
            let held = host.lock();
            let running = held.iter().map(|(id, h)| v1::HostRunning { worker_id: id.clone(), inputs_seen: h.inputs_seen }).collect::<Vec<_>>();
            let free = host.config.capacity.saturating_sub(u32::try_from(held.len()).unwrap_or(u32::MAX));
            v1::HostHeartbeat { capacity: free, running, wait_ms: u32::try_from(BEAT_WAIT.as_millis()).unwrap_or(2000) }
        };
        let answer = tokio::select! {
            answer = host.client.ask(subjects::RUNTIME_REGISTRY, &beat, BEAT_WAIT) => answer,
            _ = shutdown_rx.changed() => break,
        };
        match answer {
            Ok(Ok(written)) => {
                heard = tokio::time::Instant::now();
                let orders = written.reply;
                if orders.lease_ms > 0 {
                    lease = Duration::from_millis(u64::from(orders.lease_ms));
                }
                // Orders repeat until they are done: nothing new, a breath before asking again.
                if !obey(&host, orders) {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Ok(Err(refused)) => {
                tracing::warn!(host = host.config.name, "the registry refused a heartbeat: {refused}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                tracing::warn!(host = host.config.name, error = %e, "heartbeat not answered");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // Not heard for a lease: the registry counts our Workers lost, so none may go on.
        if heard.elapsed() > lease {
            let dropped = host.lock().values().filter(|h| h.control.send(Control::Drop).is_ok()).count();
            if dropped > 0 {
                tracing::error!(host = host.config.name, dropped, "no heartbeat answered within the lease: Workers killed (the registry records them lost)");
            }
        }
    }
    for held in host.lock().values() {
        let _ = held.control.send(Control::Kill);
    }
    // The supervisors report the kills while the bus is still there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !host.lock().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    endpoint.abort();
    Ok(())
}

/// Acts on a heartbeat's answer: starts the Workers claimed, passes the orders on; whether
/// anything in it was new.
fn obey(host: &Arc<Host>, orders: v1::HostOrders) -> bool {
    use v1::worker_order::Kind;
    let mut new = !orders.claimed.is_empty();
    for order in orders.orders {
        let mut held = host.lock();
        let Some(h) = held.get_mut(&order.worker_id) else { continue };
        let control = match Kind::try_from(order.kind).unwrap_or(Kind::Unspecified) {
            Kind::Stop => Control::Stop,
            Kind::Kill => Control::Kill,
            Kind::Drop => Control::Drop,
            Kind::Pause => Control::Pause,
            Kind::Resume => Control::Resume,
            Kind::Input => {
                if order.inputs_seen > h.inputs_seen {
                    let segments: Vec<_> = order.input.iter().filter_map(segment_from_wire).collect();
                    let _ = h.input.send(atasira_domain::context::input_xml(&segments));
                    h.inputs_seen = order.inputs_seen;
                    new = true;
                }
                continue;
            }
            Kind::Unspecified => continue,
        };
        if h.ordered != Some(control) && h.ordered != Some(Control::Drop) {
            h.ordered = Some(control);
            let _ = h.control.send(control);
            new = true;
        }
    }
    for claimed in orders.claimed {
        runner::start(host.clone(), claimed);
    }
    new
}

pub(crate) fn segment_from_wire(segment: &v1::Segment) -> Option<atasira_domain::worker::Segment> {
    use atasira_domain::worker::Segment;
    use v1::segment::Kind;
    Some(match segment.kind.as_ref()? {
        Kind::Text(v) => Segment::Text(v.clone()),
        Kind::TicketRef(v) => Segment::TicketRef(v.clone()),
        Kind::ObjectiveRef(v) => Segment::ObjectiveRef(v.clone()),
    })
}
