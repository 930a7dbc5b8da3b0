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
mod http;
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
    let done = Arc::new(AtomicUsize::new(0));
    let progress = report_progress(label, count, &done);
    let block = run_block(op, concurrency, 0..count, &done).await;
    progress.abort();
    let block = block.map_err(|e| e.context(format!("{label} failed")))?;
    let figures = Figures { label: label.to_owned(), concurrency, count, elapsed: block.elapsed, latencies: block.latencies, cpu: block.cpu };
    figures.print();
    Ok(figures)
}

/// Runs `count` requests of each of two ops with `concurrency` in flight, in `rounds`
/// alternating blocks (A B, then B A, ...), and prints the figures of each: a slow or fast
/// phase of the host then falls on both alike, so their ratio is the ops' own. After each
/// block it waits a moment, so that work the block left behind (a relay's pass) is not
/// measured in the next; that work's CPU counts for the block's op.
async fn measure_interleaved(concurrency: usize, count: usize, rounds: usize, a: (&str, &Op), b: (&str, &Op)) -> anyhow::Result<(Figures, Figures)> {
    const SETTLE: Duration = Duration::from_millis(50);
    let rounds = rounds.clamp(1, count.max(1));
    let done = Arc::new(AtomicUsize::new(0));
    let progress = report_progress(&format!("{} / {}", a.0, b.0), 2 * count, &done);
    let mut figures = [a, b].map(|(label, _)| Figures {
        label: label.to_owned(),
        concurrency,
        count,
        elapsed: Duration::ZERO,
        latencies: Vec::with_capacity(count),
        cpu: Duration::ZERO,
    });
    let result: anyhow::Result<()> = async {
        for round in 0..rounds {
            let indices = count * round / rounds..count * (round + 1) / rounds;
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let (label, op) = [a, b][which];
                let block = run_block(op, concurrency, indices.clone(), &done).await.map_err(|e| e.context(format!("{label} failed")))?;
                // What the block left behind is its op's CPU, not its time.
                let cpu = process_cpu();
                tokio::time::sleep(SETTLE).await;
                let f = &mut figures[which];
                f.elapsed += block.elapsed;
                f.cpu += block.cpu + process_cpu().saturating_sub(cpu);
                f.latencies.extend(block.latencies);
            }
        }
        Ok(())
    }
    .await;
    progress.abort();
    result?;
    let [fa, fb] = figures;
    fa.print();
    fb.print();
    Ok((fa, fb))
}

/// Prints how far a run got every few seconds (on stderr), until aborted.
fn report_progress(label: &str, count: usize, done: &Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let (done, label) = (done.clone(), label.to_owned());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        every.tick().await;
        loop {
            every.tick().await;
            eprintln!("  ... {label}: {} of {count}", done.load(Ordering::Relaxed));
        }
    })
}

/// What one block of requests took.
struct Block {
    elapsed: Duration,
    latencies: Vec<Duration>,
    cpu: Duration,
}

/// Runs the requests of `indices` with `concurrency` in flight, counting each in `done`.
async fn run_block(op: &Op, concurrency: usize, indices: std::ops::Range<usize>, done: &Arc<AtomicUsize>) -> anyhow::Result<Block> {
    let next = Arc::new(AtomicUsize::new(indices.start));
    let cpu0 = process_cpu();
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (op, next, done, end) = (op.clone(), next.clone(), done.clone(), indices.end);
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let t = Instant::now();
                op(i).await?;
                lat.push(t.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut latencies = Vec::with_capacity(indices.len());
    let mut failed = None;
    for w in workers {
        match w.await? {
            Ok(l) => latencies.extend(l),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(Block { elapsed: start.elapsed(), latencies, cpu: process_cpu().saturating_sub(cpu0) })
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

    #[tokio::test]
    async fn interleaved_runs_each_request_once_in_alternating_blocks() {
        // given two ops that record which of them ran which request
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recording = |which: char| {
            let seen = seen.clone();
            op(move |i| {
                let seen = seen.clone();
                async move {
                    seen.lock().expect("seen").push((which, i));
                    Ok(())
                }
            })
        };
        let (a, b) = (recording('a'), recording('b'));
        // when 10 requests of each run in 4 rounds, one at a time
        let (fa, fb) = measure_interleaved(1, 10, 4, ("a", &a), ("b", &b)).await.expect("measured");
        // then each op ran every request once, and the blocks alternate a b, b a, a b, b a
        assert_eq!((fa.latencies.len(), fb.latencies.len()), (10, 10));
        let seen = seen.lock().expect("seen").clone();
        for which in ['a', 'b'] {
            let mut ran: Vec<usize> = seen.iter().filter(|(w, _)| *w == which).map(|(_, i)| *i).collect();
            ran.sort_unstable();
            assert_eq!(ran, (0..10).collect::<Vec<_>>());
        }
        let mut blocks: Vec<char> = seen.iter().map(|(w, _)| *w).collect();
        blocks.dedup();
        // (a b b a a b b a, each op's two blocks in a row counted once)
        assert_eq!(blocks.into_iter().collect::<String>(), "ababa");
    }

    #[test]
    fn cpu_of_this_process_is_read() {
        assert!(process_cpu_of("self").is_some());
        assert!(process_cpu_of("0").is_none());
    }
}
