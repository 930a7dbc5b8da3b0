//! `atasira bench soak`: whether a process's memory grows with the work it has done. Starts
//! the cluster as processes (`atasira serve`: the five services and the gateway) on a
//! fresh store, sends a warm-up of commands over REST, reads every process's resident
//! memory, sends a long run of commands (drafts submitted with read-your-writes, every
//! fourth rejected by an admin), waits until every process is idle, and reads it again.
//! It prints each process's memory after warm-up, its peak and its memory after the run,
//! and asserts nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use atasira_domain::{Kind, Principal, Role};
use atasira_platform::auth;
use atasira_platform::store::Db;
use serde_json::json;

use super::drafts::ClusterOptions;
use super::processes::{ClusterKeys, Processes, rss_of};
use super::{Op, TempDir, measure, op, thousands};

/// What `atasira bench soak` is told.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub cluster: ClusterOptions,
    /// Commands of the measured run.
    pub commands: usize,
    /// Commands of the warm-up.
    pub warm_up: usize,
    pub concurrency: usize,
}

/// The target: every process's memory after the run at most this factor of its memory
/// after warm-up.
const TARGET_RATIO: f64 = 1.5;

/// How long one request may take before the run fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// One step of the run: a draft submitted over REST (201, not lagging); for every fourth
/// step the draft is then rejected by the admin. The commands of `steps` steps.
fn commands_of(steps: usize) -> usize {
    steps + steps.div_ceil(4)
}

/// The steps that make at least `commands` commands.
fn steps_for(commands: usize) -> usize {
    let mut steps = commands * 4 / 5;
    while commands_of(steps) < commands {
        steps += 1;
    }
    steps
}

fn step(api: std::net::SocketAddr, agent_pat: String, admin_pat: String) -> Op {
    let http = ureq::AgentBuilder::new().max_idle_connections_per_host(256).timeout(TIMEOUT).build();
    let base = format!("http://{api}/api/v1/boxes/box-drafts");
    op(move |i: usize| {
        let (http, base, agent, admin) = (http.clone(), base.clone(), format!("Bearer {agent_pat}"), format!("Bearer {admin_pat}"));
        async move {
            tokio::task::spawn_blocking(move || {
                let body = json!({"box_type": format!("soak-{}", i % 1000), "purpose": "Weekly sales report.", "tools": ["Read"]}).to_string();
                let created = match http.post(&base).set("Authorization", &agent).set("Content-Type", "application/json").send_string(&body) {
                    Ok(resp) if resp.status() == 201 && resp.header("x-atasira-lagging").is_none() => resp.into_json::<serde_json::Value>()?,
                    Ok(resp) => anyhow::bail!("submit answered {} (lagging: {:?})", resp.status(), resp.header("x-atasira-lagging")),
                    Err(e) => anyhow::bail!("submit failed: {e}"),
                };
                if i.is_multiple_of(4) {
                    let id = created["draft_id"].as_str().ok_or_else(|| anyhow::anyhow!("the submit's answer names no draft_id"))?;
                    let url = format!("{base}/{id}/reject");
                    match http.post(&url).set("Authorization", &admin).set("Content-Type", "application/json").send_string(r#"{"reason":"soak"}"#) {
                        Ok(resp) if resp.status() == 200 => drop(resp.into_string()),
                        Ok(resp) => anyhow::bail!("reject answered {}", resp.status()),
                        Err(e) => anyhow::bail!("reject failed: {e}"),
                    }
                }
                Ok(())
            })
            .await?
        }
    })
}

/// Every process's resident memory now, by name.
fn memory(processes: &Processes) -> BTreeMap<&'static str, u64> {
    processes.pids().into_iter().filter_map(|(name, pid)| rss_of(&pid).map(|b| (name, b))).collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// `atasira bench soak`.
pub async fn soak(o: SoakOptions) -> anyhow::Result<()> {
    anyhow::ensure!(o.cluster.database_url.starts_with("postgres"), "the cluster runs on PostgreSQL: pass a postgres:// URL");
    let n = o.concurrency.max(1);
    println!(
        "atasira bench soak: {} commands after a warm-up of {} at c={n} (drafts submitted over REST with read-your-writes, every fourth rejected); the cluster as processes on {}, {} CPUs",
        thousands(commands_of(steps_for(o.commands)) as f64),
        thousands(commands_of(steps_for(o.warm_up)) as f64),
        o.cluster.describe(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let dir = TempDir::new("soak")?;
    let db = Db::connect(&o.cluster.database_url).await?;
    let mut processes = Processes::start(&o.cluster, &ClusterKeys::fresh()?, dir.path(), true).await?;
    let api = processes.api.ok_or_else(|| anyhow::anyhow!("no gateway runs"))?;
    let ttl = Some(chrono::TimeDelta::hours(4));
    let agent = auth::create_token(&db, &Principal::new("soak-agent", Role::Member, Kind::Agent), ttl, auth::OPERATOR).await?.token;
    let admin = auth::create_token(&db, &Principal::new("soak-admin", Role::Admin, Kind::Human), ttl, auth::OPERATOR).await?.token;
    let step = step(api, agent, admin);

    measure("warm-up", n, steps_for(o.warm_up), &step).await?;
    processes.settle().await?;
    let warm = memory(&processes);

    // The peak, sampled every second while the run lasts.
    let peak = Arc::new(std::sync::Mutex::new(warm.clone()));
    let running = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (pids, peak, running) = (processes.pids(), peak.clone(), running.clone());
        async move {
            while running.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut peak = peak.lock().unwrap_or_else(|e| e.into_inner());
                for (name, pid) in &pids {
                    if let Some(b) = rss_of(pid) {
                        let p = peak.entry(name).or_default();
                        *p = (*p).max(b);
                    }
                }
            }
        }
    });
    let run = measure("submit (every fourth rejected)", n, steps_for(o.commands), &step).await;
    running.store(false, Ordering::Relaxed);
    sampler.await?;
    run?;
    processes.settle().await?;
    let after = memory(&processes);
    processes.check()?;
    processes.stop();

    println!();
    println!("== summary (figures of this run; targets beside them)");
    let peak = peak.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut worst = 0.0_f64;
    for (name, w) in &warm {
        let (a, p) = (after.get(name).copied().unwrap_or_default(), peak.get(name).copied().unwrap_or_default());
        let ratio = a as f64 / (*w).max(1) as f64;
        worst = worst.max(ratio);
        println!("  {name:<18} resident memory {:>7.1} MiB after warm-up, {:>7.1} MiB peak, {:>7.1} MiB after the run = {ratio:.2} x", mib(*w), mib(p), mib(a));
    }
    println!("  the largest growth of a process                    {worst:.2} x   target <= {TARGET_RATIO} x");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_make_at_least_the_commands_asked_for() {
        for commands in [1, 4, 5, 6, 2_000, 100_000] {
            let steps = steps_for(commands);
            assert!(commands_of(steps) >= commands, "{commands}: {steps} steps make {}", commands_of(steps));
            assert!(steps == 0 || commands_of(steps - 1) < commands);
        }
    }
}
