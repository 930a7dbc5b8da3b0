//! `atasira bench`: figures measured on this machine, printed beside their targets, never
//! asserted.
//!
//! - `drafts` ([`drafts::drafts`]): the drafts command path and REST submit with
//!   read-your-writes in cluster mode (NATS + PostgreSQL, services in this process, each
//!   with its own connections), against a floor measured in the same run; then REST submit
//!   on the embedded system `atasira dev` runs.
//! - `workers` ([`workers::workers`]): the one-request launch of a Worker, p50 and p99 at
//!   c=1 and c=N, embedded and (given a database) in cluster mode; the decision before a
//!   tool call in-process and launch-to-running with an execution host
//!   ([`decisions`]).
//! - `rebuild` ([`rebuild::rebuild`]): rebuilding the drafts view and the Box view from a
//!   store seeded with N events.
//! - `idle` ([`idle::idle`]): the CPU the five service processes use with no traffic.
//! - `scale` ([`scale::scale`]): REST submit and the pending list at a small and a large
//!   store, the cluster as processes.
//! - `soak` ([`soak::soak`]): the resident memory of every process before and after a long
//!   run of commands.

mod decisions;
mod drafts;
mod idle;
mod processes;
mod rebuild;
mod scale;
mod soak;
mod workers;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use drafts::{ClusterOptions, DraftsOptions, drafts};
pub use idle::{IdleOptions, idle};
pub use rebuild::rebuild;
pub use scale::{ScaleOptions, scale};
pub use soak::{SoakOptions, soak};
pub use workers::{WorkersOptions, workers};

/// Linux reports process CPU time in clock ticks of 10 ms (`USER_HZ` = 100).
const TICK: Duration = Duration::from_millis(10);

/// One measured run.
struct Figures {
    label: String,
    concurrency: usize,
    count: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    cpu: Duration,
}

impl Figures {
    fn per_second(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
    fn percentile(&self, p: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        let i = ((l.len() as f64 - 1.0) * p).round() as usize;
        l.get(i).copied().unwrap_or_default()
    }
    fn p50_ms(&self) -> f64 {
        self.percentile(0.5).as_secs_f64() * 1e3
    }
    fn print(&self) {
        println!(
            "{:<38} c={:<3} n={:<6} {:>9.1} /s  p50 {:>8.3} ms  p99 {:>8.3} ms  cpu {:>7.1} µs/op",
            self.label,
            self.concurrency,
            self.count,
            self.per_second(),
            self.p50_ms(),
            self.percentile(0.99).as_secs_f64() * 1e3,
            self.cpu.as_secs_f64() * 1e6 / self.count as f64
        );
    }
}

/// CPU time (user + system, every thread) of process `pid` ("self" for this one) so far,
/// from `/proc/<pid>/stat`; `None` when the process is gone.
fn process_cpu_of(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields are counted after the last ')'.
    let after: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command, state is index 0, utime 11, stime 12.
    let ticks = after.get(11)?.parse::<u32>().ok()? + after.get(12)?.parse::<u32>().ok()?;
    Some(TICK * ticks)
}

/// CPU time of this process so far.
fn process_cpu() -> Duration {
    process_cpu_of("self").unwrap_or_default()
}

/// One request of a measured run, given its index.
type Op = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

/// Wraps an async closure as an [`Op`].
fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

/// Runs `count` requests with `concurrency` in flight and prints the figures; a run that
/// lasts says how far it got every few seconds (on stderr).
async fn measure(label: &str, concurrency: usize, count: usize, op: &Op) -> anyhow::Result<Figures> {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let progress = tokio::spawn({
        let (done, label) = (done.clone(), label.to_owned());
        async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            every.tick().await;
            loop {
                every.tick().await;
                eprintln!("  ... {label}: {} of {count}", done.load(Ordering::Relaxed));
            }
        }
    });
    let cpu0 = process_cpu();
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (op, next, done) = (op.clone(), next.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let t = Instant::now();
                op(i).await?;
                lat.push(t.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    let mut failed = None;
    for w in workers {
        match w.await? {
            Ok(l) => latencies.extend(l),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    progress.abort();
    if let Some(e) = failed {
        return Err(e.context(format!("{label} failed")));
    }
    let elapsed = start.elapsed();
    let figures = Figures { label: label.to_owned(), concurrency, count, elapsed, latencies, cpu: process_cpu().saturating_sub(cpu0) };
    figures.print();
    Ok(figures)
}

/// A fresh directory under the system's temporary directory, removed by [`TempDir`]'s drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("atasira-bench-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `12345` -> `12,345`.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!((thousands(0.0), thousands(999.4), thousands(1000.0), thousands(1234567.0)), ("0".into(), "999".into(), "1,000".into(), "1,234,567".into()));
    }

    #[test]
    fn cpu_of_this_process_is_read() {
        assert!(process_cpu_of("self").is_some());
        assert!(process_cpu_of("0").is_none());
    }
}
