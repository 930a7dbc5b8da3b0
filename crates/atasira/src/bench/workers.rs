//! `atasira bench workers`: the one-request launch of a Worker (`POST
//! /api/v1/boxes/{box_id}/workers`: the bundle synced, a binding prepared, the Worker
//! created, the answer once the read models hold it), each with a fresh launch_id on one
//! active Box, at c=1 and c=N; on the embedded system `atasira dev` runs and, given a
//! PostgreSQL database, in cluster mode (the gateway and every service a launch involves,
//! each with its own database pool and NATS connection, in this process). It prints p50 and
//! p99 and asserts nothing.

use std::net::SocketAddr;
use std::time::Duration;

use atasira_contracts::subjects;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::auth;
use atasira_platform::store::Db;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::drafts::{Cluster, ClusterOptions, settings_in};
use super::{Figures, Op, TempDir, measure, op};
use crate::services::{self, Embedded};

/// What `atasira bench workers` is told.
#[derive(Debug, Clone)]
pub struct WorkersOptions {
    /// Where the cluster part runs; `None` runs only the embedded part.
    pub cluster: Option<ClusterOptions>,
    pub concurrency: usize,
    pub count: usize,
}

/// How long one request may take before the run fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A JSON request to the API on `addr` as `pat`; the answer's body when its status is
/// `expected`.
pub(super) fn rest(agent: &ureq::Agent, addr: SocketAddr, pat: &str, path: &str, body: &Value, expected: u16) -> anyhow::Result<Value> {
    let url = format!("http://{addr}{path}");
    let answer = agent.post(&url).set("Authorization", &format!("Bearer {pat}")).send_json(body.clone());
    match answer {
        Ok(resp) if resp.status() == expected && resp.header("x-atasira-lagging").is_none() => Ok(resp.into_json()?),
        Ok(resp) => anyhow::bail!("POST {path} answered {} (lagging: {:?})", resp.status(), resp.header("x-atasira-lagging")),
        Err(ureq::Error::Status(status, resp)) => anyhow::bail!("POST {path} answered {status}: {}", resp.into_string().unwrap_or_default()),
        Err(e) => anyhow::bail!("POST {path} failed: {e}"),
    }
}

/// An active Box on the system at `addr`: drafted by an agent, approved by a human admin
/// (`admin`); its id.
pub(super) async fn active_box(addr: SocketAddr, db: &Db, admin: String, box_type: String) -> anyhow::Result<String> {
    let agent = Principal::new("bench-agent", Role::Member, Kind::Agent);
    let agent_pat = auth::create_token(db, &agent, Some(chrono::TimeDelta::hours(1)), auth::OPERATOR).await?.token;
    tokio::task::spawn_blocking(move || {
        let http = ureq::AgentBuilder::new().timeout(TIMEOUT).build();
        let draft = json!({"box_type": box_type, "purpose": "Answer questions about the weekly sales figures.", "tools": ["Read"]});
        let draft = rest(&http, addr, &agent_pat, "/api/v1/boxes/box-drafts", &draft, 201)?;
        let draft_id = draft["draft_id"].as_str().unwrap_or_default();
        let approved = rest(&http, addr, &admin, &format!("/api/v1/boxes/box-drafts/{draft_id}/approve"), &json!({}), 200)?;
        approved["box_id"].as_str().map(str::to_owned).ok_or_else(|| anyhow::anyhow!("the approval named no Box: {approved}"))
    })
    .await?
}

/// One launch with a fresh launch_id (`<tag>-<i>`): a 201 that is not lagging.
fn launch(addr: SocketAddr, pat: String, box_id: &str, tag: String) -> Op {
    let http = ureq::AgentBuilder::new().max_idle_connections_per_host(256).timeout(TIMEOUT).build();
    let path = format!("/api/v1/boxes/{box_id}/workers");
    op(move |i: usize| {
        let (http, path, pat, tag) = (http.clone(), path.clone(), pat.clone(), tag.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                let body = json!({"launch_id": format!("{tag}-{i}"), "labels": {"bench": "workers"},
                    "input": [{"kind": "text", "value": "Summarise this week's sales figures."}, {"kind": "ticket_ref", "value": format!("T-{i}")}]});
                rest(&http, addr, &pat, &path, &body, 201).map(|_| ())
            })
            .await?
        }
    })
}

/// Launches at c=1 and c=N on one fresh Box of the system at `addr`, after a warm-up.
/// Box type and launch ids are new in every run, so a database used before takes them.
async fn launches(addr: SocketAddr, db: &Db, concurrency: usize, count: usize) -> anyhow::Result<(Figures, Figures)> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let run = &run[..12];
    let admin = Principal::new("bench-admin", Role::Admin, Kind::Human);
    let pat = auth::create_token(db, &admin, Some(chrono::TimeDelta::hours(1)), auth::OPERATOR).await?.token;
    let box_id = active_box(addr, db, pat.clone(), format!("bench-workers-{run}")).await?;
    let warm = launch(addr, pat.clone(), &box_id, format!("bench-{run}-warm"));
    measure("warm-up (launch)", concurrency, concurrency * 4, &warm).await?;
    let one = launch(addr, pat.clone(), &box_id, format!("bench-{run}-c1"));
    let at_1 = measure("one-request launch + read-your-writes", 1, (count / 4).max(50), &one).await?;
    let many = launch(addr, pat, &box_id, format!("bench-{run}-cn"));
    let at_n = measure("one-request launch + read-your-writes", concurrency, count, &many).await?;
    Ok((at_1, at_n))
}

/// The embedded part: `atasira dev` in a fresh data dir.
async fn embedded(concurrency: usize, count: usize) -> anyhow::Result<(Figures, Figures)> {
    let data = TempDir::new("workers-embedded")?;
    let system = Embedded::start(&settings_in(data.path()), "127.0.0.1:0".parse()?, None).await?;
    println!("-- embedded: one-request launch (every service in this process, SQLite in {})", data.path().display());
    let figures = launches(system.addr, &system.db, concurrency, count).await;
    system.stop().await?;
    figures
}

/// The cluster part: the gateway and the five services, each with its own connections.
async fn cluster(o: &ClusterOptions, concurrency: usize, count: usize) -> anyhow::Result<(Figures, Figures)> {
    let data = TempDir::new("workers-cluster")?;
    let (tx, rx) = watch::channel(false);
    let cluster = Cluster::new(o, data.path(), rx.clone()).await?;
    let (gateway_rt, _) = cluster.runtime(subjects::GATEWAY).await?;
    let gateway_bus = gateway_rt.bus.clone();
    let mut tasks = Vec::new();
    for service in subjects::SERVICES {
        tasks.extend(cluster.start(service).await?);
    }
    services::wait_ready(gateway_bus.as_ref(), subjects::SERVICES).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let gateway_db = gateway_rt.db.clone();
    let gateway = tokio::spawn(atasira_gateway::serve(listener, gateway_rt, cluster.settings.gateway.clone(), {
        let mut rx = rx.clone();
        async move {
            let _ = rx.changed().await;
        }
    }));
    println!(
        "-- cluster: one-request launch (gateway; drafts, approval, provisioner, runtime-registry and audit each with its own connections; data in {})",
        data.path().display()
    );
    let figures = launches(addr, &gateway_db, concurrency, count).await;
    let _ = tx.send(true);
    gateway.await??;
    for t in tasks {
        t.await??;
    }
    figures
}

/// `atasira bench workers`.
pub async fn workers(o: WorkersOptions) -> anyhow::Result<()> {
    if let Some(c) = &o.cluster {
        anyhow::ensure!(c.database_url.starts_with("postgres"), "the benchmark's cluster part runs on PostgreSQL: pass a postgres:// URL");
    }
    let n = o.concurrency.max(1);
    let count = o.count.max(n);
    let where_ = match &o.cluster {
        Some(c) => format!("embedded, and cluster on PostgreSQL {}, NATS {}", atasira_platform::store::redact(&c.database_url), c.nats_url),
        None => "embedded only".to_owned(),
    };
    println!(
        "atasira bench workers: {count} launches per run at c={n} ({} at c=1), {where_}, {} CPUs",
        (count / 4).max(50),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    println!();
    let (embedded_1, embedded_n) = embedded(n, count).await?;
    println!("-- decisions before tool calls, in-process (an execution host's work)");
    let decided = super::decisions::decisions(100_000)?;
    println!("-- launch-to-running, embedded with an execution host");
    let running = super::decisions::launch_to_running((count / 8).clamp(20, 100)).await?;
    let cluster_figures = match &o.cluster {
        Some(c) => {
            println!();
            Some(cluster(c, n, count).await?)
        }
        None => None,
    };

    println!();
    println!("== summary (figures of this run)");
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let row = |what: String, figure: String| println!("  {what:<58} {figure:>12}");
    let mut runs = vec![("embedded", &embedded_1, &embedded_n)];
    if let Some((c1, cn)) = &cluster_figures {
        runs.push(("cluster", c1, cn));
    }
    for (mode, at_1, at_n) in runs {
        for f in [at_1, at_n] {
            let c = f.concurrency;
            row(format!("{mode}, one-request launch, p50 at c={c}"), ms(f.percentile(0.5)));
            row(format!("{mode}, one-request launch, p99 at c={c}"), ms(f.percentile(0.99)));
        }
        row(format!("{mode}, one-request launches at c={}", at_n.concurrency), format!("{:.1} /s", at_n.per_second()));
    }
    let us = |d: Duration| format!("{:.1} us", d.as_secs_f64() * 1e6);
    row("decisions per second (in-process, one thread)".to_owned(), format!("{:.0} /s", decided.per_second));
    row("decision p50 / floor p50 (reading the call)".to_owned(), format!("{} / {}", us(decided.decide.percentile(0.5)), us(decided.floor.percentile(0.5))));
    let ratio = decided.decide.percentile(0.5).as_secs_f64() / decided.floor.percentile(0.5).as_secs_f64().max(1e-9);
    row("decision p50 / floor p50, ratio".to_owned(), format!("{ratio:.1}x"));
    row("decision p99 (target: at most 1 ms)".to_owned(), us(decided.decide.percentile(0.99)));
    row("embedded, launch to running, p50".to_owned(), ms(running.percentile(0.5)));
    row("embedded, launch to running, p99".to_owned(), ms(running.percentile(0.99)));
    Ok(())
}
