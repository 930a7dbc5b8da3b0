//! The cluster as an operator runs it, for the benchmarks that measure processes: the five
//! services and (optionally) the gateway, each an `atasira serve` process of this binary on
//! NATS and PostgreSQL, with fresh keys (kept across restarts), each with its own database
//! role and, given credentials, its own NATS identity.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use atasira_contracts::subjects;
use atasira_platform::bus::NatsBus;

use super::drafts::{ClusterOptions, connect, fresh_key};
use super::process_cpu_of;
use crate::keys::KeyKind;
use crate::nats_config;
use crate::services;

impl ClusterOptions {
    /// One line naming where the processes run, for a benchmark's heading.
    pub(super) fn describe(&self) -> String {
        format!(
            "NATS {} ({}) and PostgreSQL {}",
            self.nats_url,
            if self.creds_dir.is_some() { "each process with its own credentials" } else { "without credentials" },
            atasira_platform::store::redact(&self.database_url),
        )
    }

    /// A NATS connection as the gateway, for readiness and catch-up waits.
    pub(super) async fn gateway_bus(&self) -> anyhow::Result<NatsBus> {
        Ok(NatsBus::new(connect(&self.nats_url, self.creds_dir.as_deref(), subjects::GATEWAY).await?))
    }
}

/// The keys the processes of one benchmark share across restarts (a restarted audit
/// service continues the ledger with the same key).
pub(super) struct ClusterKeys {
    approval: String,
    audit: String,
}

impl ClusterKeys {
    pub(super) fn fresh() -> anyhow::Result<Self> {
        Ok(ClusterKeys { approval: fresh_key(KeyKind::Approval)?.render(), audit: fresh_key(KeyKind::Audit)?.render() })
    }
}

/// Each process's own database role, as `atasira db roles` makes them for a cluster
/// (roles `bench_<identity>`, URL files in a directory of the benchmark's), so that what is
/// measured includes what the database checks for each role. Made again for every start:
/// each time with new passwords.
pub(super) struct Roles {
    dir: PathBuf,
}

impl Roles {
    /// Creates (or renews) the roles on the database of `database_url`, which must be able
    /// to create roles.
    pub(super) async fn create(database_url: &str, dir: &Path) -> anyhow::Result<Roles> {
        let options = crate::db_roles::Options { database_url: database_url.to_owned(), role_prefix: "bench_".into(), out: dir.to_path_buf() };
        crate::db_roles::run(&options).await.context("the benchmark gives each process its own database role (`atasira db roles`)")?;
        Ok(Roles { dir: dir.to_path_buf() })
    }

    /// The file holding `identity`'s database URL.
    pub(super) fn url_file(&self, identity: &str) -> PathBuf {
        crate::db_roles::url_file(&self.dir, identity)
    }

    /// `identity`'s database URL.
    pub(super) fn url(&self, identity: &str) -> anyhow::Result<String> {
        let path = self.url_file(identity);
        Ok(std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?.trim().to_owned())
    }
}

/// Running processes; killed if dropped before [`Processes::stop`].
pub(super) struct Processes {
    running: Vec<(&'static str, Child)>,
    logs: PathBuf,
    /// The gateway's public address, when one runs.
    pub(super) api: Option<SocketAddr>,
}

/// The name of the gateway process in [`Processes`].
pub(super) const GATEWAY: &str = "gateway";

impl Processes {
    /// Starts the five services (and the gateway when `gateway`) with data in `dir`, and
    /// waits until every service answers on the bus and the gateway says it is ready.
    pub(super) async fn start(place: &ClusterOptions, keys: &ClusterKeys, dir: &Path, gateway: bool) -> anyhow::Result<Processes> {
        let exe = std::env::current_exe()?;
        let mut processes = Processes { running: Vec::new(), logs: dir.to_path_buf(), api: None };
        let roles = Roles::create(&place.database_url, &dir.join("db-roles")).await?;
        let mut names: Vec<&'static str> = subjects::SERVICES.to_vec();
        if gateway {
            names.push(GATEWAY);
        }
        eprintln!("  ... starting {}", names.join(", "));
        for name in names {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(processes.log(name))?;
            let mut command = Command::new(&exe);
            command
                .args(["serve", name])
                .env("ATASIRA_NATS_URL", &place.nats_url)
                .env("ATASIRA_DATABASE_URL_FILE", roles.url_file(name))
                .env_remove("ATASIRA_DATABASE_URL")
                .env("ATASIRA_DATA_DIR", dir.join("data"))
                .env_remove("ATASIRA_APPROVAL_KEY_FILE")
                // A benchmark measures throughput: no per-user request rate.
                .env("ATASIRA_RATE_LIMIT", "0")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            match &place.creds_dir {
                Some(creds) => command.env("ATASIRA_NATS_CREDS", nats_config::creds_path(creds, name)).env_remove("ATASIRA_INSECURE_NATS"),
                None => command.env("ATASIRA_INSECURE_NATS", "true").env_remove("ATASIRA_NATS_CREDS"),
            };
            match name {
                subjects::APPROVAL => {
                    command.env("ATASIRA_APPROVAL_KEY", &keys.approval);
                }
                subjects::AUDIT => {
                    command.env("ATASIRA_AUDIT_KEY", &keys.audit);
                }
                GATEWAY => {
                    let api = free_address()?;
                    command.args(["--listen", &api.to_string()]);
                    processes.api = Some(api);
                }
                _ => {}
            }
            processes.running.push((name, command.spawn()?));
        }
        processes.wait_ready(place).await?;
        Ok(processes)
    }

    /// Waits until each service answers a read-your-writes wait on its request subject and
    /// the gateway's `/readyz` answers 200, failing as soon as a process stops.
    async fn wait_ready(&mut self, place: &ClusterOptions) -> anyhow::Result<()> {
        let bus = place.gateway_bus().await?;
        let api = self.api;
        let ready = async {
            services::wait_ready(&bus, subjects::SERVICES).await?;
            if let Some(api) = api {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let url = format!("http://{api}/readyz");
                    let answer = tokio::task::spawn_blocking({
                        let agent = agent.clone();
                        move || agent.get(&url).call().map(|r| r.status()).ok()
                    })
                    .await?;
                    if answer == Some(200) {
                        break;
                    }
                    anyhow::ensure!(Instant::now() < deadline, "the gateway did not become ready within 60 s");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Ok::<_, anyhow::Error>(())
        };
        tokio::pin!(ready);
        loop {
            tokio::select! {
                r = &mut ready => return r,
                _ = tokio::time::sleep(Duration::from_millis(200)) => self.check()?,
            }
        }
    }

    /// Fails, with the end of its log, when a process has stopped.
    pub(super) fn check(&mut self) -> anyhow::Result<()> {
        if let Some((name, status)) = self.running.iter_mut().find_map(|(name, child)| child.try_wait().ok().flatten().map(|status| (*name, status))) {
            anyhow::bail!("the {name} process stopped ({status}):\n{}", self.tail(name));
        }
        Ok(())
    }

    /// Waits until no process uses more than 5 % of a core over two windows of a second in a
    /// row: the relays have published, the audit ledger and every view have caught up.
    pub(super) async fn settle(&mut self) -> anyhow::Result<()> {
        let pids = self.pids();
        let (mut quiet, mut told) = (0, Instant::now());
        while quiet < 2 {
            let before: Vec<_> = pids.iter().map(|(_, pid)| process_cpu_of(pid).unwrap_or_default()).collect();
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.check()?;
            let busy: Vec<String> = pids
                .iter()
                .zip(before)
                .filter_map(|((name, pid), b)| {
                    let used = process_cpu_of(pid).unwrap_or_default().saturating_sub(b);
                    (used > Duration::from_millis(50)).then(|| format!("{name} {:.0} %", used.as_secs_f64() * 100.0))
                })
                .collect();
            quiet = if busy.is_empty() { quiet + 1 } else { 0 };
            if !busy.is_empty() && told.elapsed() > Duration::from_secs(5) {
                eprintln!("  ... still busy with the stored events: {}", busy.join(", "));
                told = Instant::now();
            }
        }
        Ok(())
    }

    /// Each process's name and pid.
    pub(super) fn pids(&self) -> Vec<(&'static str, String)> {
        self.running.iter().map(|(name, child)| (*name, child.id().to_string())).collect()
    }

    fn log(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// The end of a process's log, to say why it stopped.
    fn tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.log(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Asks every process to stop (SIGTERM, as an operator would), then kills what is left
    /// after 10 seconds.
    pub(super) fn stop(mut self) {
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

/// A loopback address no one listens on now.
fn free_address() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The resident memory of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`); `None`
/// when the process is gone.
pub(super) fn rss_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resident_memory_of_this_process_is_read() {
        assert!(rss_of("self").is_some_and(|b| b > 0));
        assert!(rss_of("0").is_none());
    }
}
