//! `atasira bench idle`: starts the five services as `atasira serve <service>` processes
//! on NATS and PostgreSQL (fresh keys, a temporary data dir; with credentials each its own),
//! waits until each answers on the bus, lets them settle, then reads their CPU time
//! (user + system) from `/proc/<pid>/stat` over a window without traffic and prints it as a
//! share of one core.

use std::time::{Duration, Instant};

use super::drafts::ClusterOptions;
use super::processes::{ClusterKeys, Processes};
use super::{TICK, TempDir, process_cpu_of};

/// What `atasira bench idle` is told.
#[derive(Debug, Clone)]
pub struct IdleOptions {
    pub cluster: ClusterOptions,
    pub seconds: u64,
}

/// The target: under half a percent of one core per idle service process.
const TARGET_PERCENT: f64 = 0.5;

/// How long the services may settle after they answer, before the window opens.
const SETTLE: Duration = Duration::from_secs(3);

/// `atasira bench idle`.
pub async fn idle(o: IdleOptions) -> anyhow::Result<()> {
    anyhow::ensure!(o.cluster.database_url.starts_with("postgres"), "the services run in cluster mode on PostgreSQL: pass a postgres:// URL");
    let dir = TempDir::new("idle")?;
    println!(
        "atasira bench idle: the five services as processes on {}, {} s without traffic, {} CPUs",
        o.cluster.describe(),
        o.seconds,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let mut processes = Processes::start(&o.cluster, &ClusterKeys::fresh()?, dir.path(), false).await?;
    eprintln!("  ... all five answer; letting them settle for {} s", SETTLE.as_secs());
    tokio::time::sleep(SETTLE).await;

    eprintln!("  ... measuring for {} s", o.seconds);
    let pids = processes.pids();
    let before: Vec<Option<Duration>> = pids.iter().map(|(_, pid)| process_cpu_of(pid)).collect();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.seconds.max(1))).await;
    let after: Vec<Option<Duration>> = pids.iter().map(|(_, pid)| process_cpu_of(pid)).collect();
    let window = start.elapsed();
    processes.check()?;

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
