//! `atasira bench idle`: starts the five services as `atasira serve <service>` processes
//! on NATS and PostgreSQL (fresh keys, a temporary data dir; with credentials each its own),
//! waits until each answers on the bus, lets them settle, then reads their CPU time
//! (user + system) from `/proc/<pid>/stat` over a window without traffic and prints it as a
//! share of one core.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use atasira_contracts::subjects;
use atasira_platform::bus::NatsBus;

use super::drafts::{connect, fresh_key};
use super::{TICK, TempDir, process_cpu_of};
use crate::keys::KeyKind;
use crate::nats_config;
use crate::services;

/// What `atasira bench idle` is told.
#[derive(Debug, Clone)]
pub struct IdleOptions {
    pub nats_url: String,
    pub creds_dir: Option<PathBuf>,
    pub database_url: String,
    pub seconds: u64,
}

/// The target: under half a percent of one core per idle service process.
const TARGET_PERCENT: f64 = 0.5;

/// How long the services may settle after they answer, before the window opens.
const SETTLE: Duration = Duration::from_secs(3);

/// The service processes; killed if dropped before [`Processes::stop`].
struct Processes {
    running: Vec<(&'static str, Child)>,
    logs: PathBuf,
}

impl Processes {
    fn log(&self, service: &str) -> PathBuf {
        self.logs.join(format!("{service}.log"))
    }

    /// The end of a service's log, to say why it stopped.
    fn tail(&self, service: &str) -> String {
        let text = std::fs::read_to_string(self.log(service)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// A service that has exited, with its status.
    fn exited(&mut self) -> Option<(&'static str, std::process::ExitStatus)> {
        self.running.iter_mut().find_map(|(name, child)| child.try_wait().ok().flatten().map(|status| (*name, status)))
    }

    /// Asks every process to stop (SIGTERM, as an operator would), then kills what is left
    /// after 10 seconds.
    fn stop(mut self) {
        for (_, child) in &self.running {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, child) in &mut self.running {
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.running.retain_mut(|(_, child)| child.try_wait().ok().flatten().is_none());
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `atasira bench idle`.
pub async fn idle(o: IdleOptions) -> anyhow::Result<()> {
    anyhow::ensure!(o.database_url.starts_with("postgres"), "the services run in cluster mode on PostgreSQL: pass a postgres:// URL");
    let dir = TempDir::new("idle")?;
    let exe = std::env::current_exe()?;
    println!(
        "atasira bench idle: the five services as processes on NATS {} ({}) and PostgreSQL {}, {} s without traffic, {} CPUs",
        o.nats_url,
        if o.creds_dir.is_some() { "each with its own credentials" } else { "without credentials" },
        atasira_platform::store::redact(&o.database_url),
        o.seconds,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let (approval, audit) = (fresh_key(KeyKind::Approval)?.render(), fresh_key(KeyKind::Audit)?.render());
    let mut processes = Processes { running: Vec::new(), logs: dir.path().to_path_buf() };
    eprintln!("  ... starting {}", subjects::SERVICES.join(", "));
    for service in subjects::SERVICES {
        let log = std::fs::File::create(processes.log(service))?;
        let mut command = Command::new(&exe);
        command
            .args(["serve", service])
            .env("ATASIRA_NATS_URL", &o.nats_url)
            .env("ATASIRA_DATABASE_URL", &o.database_url)
            .env("ATASIRA_DATA_DIR", dir.path().join("data"))
            .env_remove("ATASIRA_APPROVAL_KEY_FILE")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        match &o.creds_dir {
            Some(creds) => command.env("ATASIRA_NATS_CREDS", nats_config::creds_path(creds, service)).env_remove("ATASIRA_INSECURE_NATS"),
            None => command.env("ATASIRA_INSECURE_NATS", "true").env_remove("ATASIRA_NATS_CREDS"),
        };
        match *service {
            subjects::APPROVAL => command.env("ATASIRA_APPROVAL_KEY", &approval),
            subjects::AUDIT => command.env("ATASIRA_AUDIT_KEY", &audit),
            _ => &mut command,
        };
        processes.running.push((service, command.spawn()?));
    }

    // Ready when each answers a read-your-writes wait on its request subject.
    let bus = NatsBus::new(connect(&o.nats_url, o.creds_dir.as_deref(), subjects::GATEWAY).await?);
    let ready = services::wait_ready(&bus, subjects::SERVICES);
    tokio::pin!(ready);
    loop {
        tokio::select! {
            r = &mut ready => { r?; break; }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if let Some((service, status)) = processes.exited() {
                    anyhow::bail!("the {service} process stopped ({status}) before it was ready:\n{}", processes.tail(service));
                }
            }
        }
    }
    eprintln!("  ... all five answer; letting them settle for {} s", SETTLE.as_secs());
    tokio::time::sleep(SETTLE).await;

    eprintln!("  ... measuring for {} s", o.seconds);
    let pids: Vec<(&str, String)> = processes.running.iter().map(|(name, child)| (*name, child.id().to_string())).collect();
    let before: Vec<Option<Duration>> = pids.iter().map(|(_, pid)| process_cpu_of(pid)).collect();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.seconds.max(1))).await;
    let after: Vec<Option<Duration>> = pids.iter().map(|(_, pid)| process_cpu_of(pid)).collect();
    let window = start.elapsed();
    if let Some((service, status)) = processes.exited() {
        anyhow::bail!("the {service} process stopped ({status}) during the window:\n{}", processes.tail(service));
    }

    let mut worst: Option<(&str, f64)> = None;
    for ((service, _), (b, a)) in pids.iter().zip(before.iter().zip(&after)) {
        let (Some(b), Some(a)) = (b, a) else { anyhow::bail!("cannot read the CPU time of the {service} process") };
        let used = a.saturating_sub(*b);
        let percent = used.as_secs_f64() / window.as_secs_f64() * 100.0;
        println!("{service:<18} cpu {:>7.3} s in {:.1} s = {percent:>6.2} % of a core", used.as_secs_f64(), window.as_secs_f64());
        if worst.is_none_or(|(_, w)| percent > w) {
            worst = Some((service, percent));
        }
    }
    processes.stop();
    let (service, percent) = worst.unwrap_or(("none", 0.0));
    println!();
    println!("== summary (figures of this run; targets beside them)");
    println!(
        "  idle CPU of a service process, the busiest ({service}): {percent:.2} % of a core   target < {TARGET_PERCENT} % each  (resolution {:.2} %)",
        TICK.as_secs_f64() / window.as_secs_f64() * 100.0
    );
    Ok(())
}
