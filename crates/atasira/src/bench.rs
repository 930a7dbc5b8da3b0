//! `atasira bench drafts`: measures, in one run on this machine, a floor (a raw NATS
//! request-reply whose responder runs one PostgreSQL transaction: insert a ~650-byte JSON
//! event and upsert one projection row) and the real drafts command path (NATS request ->
//! assertion check -> validation -> event committed -> reply), then the full REST submit
//! with read-your-writes. It prints figures and ratios; it asserts nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atasira_contracts::{signed_envelope, subjects, v1};
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::bus::{Bus, Handler, Message, NatsBus};
use atasira_platform::db::Db;
use atasira_platform::feed::FeedSource;
use atasira_platform::{Runtime, auth, relay};
use bytes::Bytes;
use prost::Message as _;
use serde_json::json;

use crate::nats_config;
use crate::services::NatsAuth;

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
    fn print(&self) {
        println!(
            "{:<34} c={:<3} n={:<6} {:>9.1} cmd/s  p50 {:>8.3} ms  p99 {:>8.3} ms  cpu {:>7.1} µs/cmd",
            self.label,
            self.concurrency,
            self.count,
            self.per_second(),
            self.percentile(0.5).as_secs_f64() * 1e3,
            self.percentile(0.99).as_secs_f64() * 1e3,
            self.cpu.as_secs_f64() * 1e6 / self.count as f64
        );
    }
}

/// CPU time (user + system) of this process so far, from /proc.
fn process_cpu() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            // Fields after the command: state is index 0, utime 11, stime 12.
            Some(after.get(11)?.parse::<u64>().ok()? + after.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Sends `count` requests with `concurrency` in flight; each call is `op(i)`.
async fn measure<F, Fut>(label: &str, concurrency: usize, count: usize, op: F) -> anyhow::Result<Figures>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cpu0 = process_cpu();
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (op, next) = (op.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let t = Instant::now();
                op(i).await?;
                lat.push(t.elapsed());
            }
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    for w in workers {
        latencies.extend(w.await??);
    }
    let elapsed = start.elapsed();
    let figures = Figures { label: label.to_owned(), concurrency, count, elapsed, latencies, cpu: process_cpu().saturating_sub(cpu0) };
    figures.print();
    Ok(figures)
}

/// The floor borrows the gateway's route to the provisioner (no provisioner runs in the
/// benchmark), so that with credentials it passes the same permission checks as a command.
fn floor_subject() -> String {
    subjects::request(subjects::GATEWAY, subjects::PROVISIONER)
}

/// The floor's responder: one transaction per request, like a command commit plus a
/// projection row.
async fn start_floor(bus: &NatsBus, db: &Db) -> anyhow::Result<atasira_platform::bus::Endpoint> {
    db.ensure_tables(&[
        "CREATE TABLE IF NOT EXISTS bench_floor_events (id BIGSERIAL PRIMARY KEY, payload json NOT NULL)",
        "CREATE TABLE IF NOT EXISTS bench_floor_view (k TEXT PRIMARY KEY, n BIGINT NOT NULL)",
    ])
    .await?;
    let db = db.clone();
    let handler: Handler = Arc::new(move |m: Message| {
        let db = db.clone();
        Box::pin(async move {
            let result: anyhow::Result<()> = async {
                let mut tx = db.any().begin().await?;
                sqlx::query("INSERT INTO bench_floor_events (payload) VALUES (CAST($1 AS json))")
                    .bind(String::from_utf8_lossy(&m.payload).into_owned())
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("INSERT INTO bench_floor_view (k, n) VALUES ('k', 1) ON CONFLICT (k) DO UPDATE SET n = bench_floor_view.n + 1")
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }
            .await;
            Bytes::from(if result.is_ok() { "ok" } else { "error" })
        })
    });
    Ok(bus.serve("bench-floor", &[floor_subject()], handler).await?)
}

fn floor_payload(i: usize) -> Bytes {
    // ~650 bytes, the size of a DraftSubmitted payload's manifest part.
    let body = json!({"DraftSubmitted": {"draft_id": format!("floor-{i}"), "box_type": "sales-report", "requested_by": {"user_id": "agent", "role": "member", "kind": "agent"},
        "manifest": {"box_type": "sales-report", "version": "1.0.0", "purpose": "x".repeat(380), "tools": ["Read"], "os_operations": ["file:read"], "network": "none", "trigger_type": "manual"}}});
    Bytes::from(body.to_string())
}

/// One NATS connection as `identity`: with its credentials from `creds_dir`, else
/// anonymous.
async fn connect(nats_url: &str, creds_dir: Option<&Path>, identity: &str) -> anyhow::Result<async_nats::Client> {
    let auth = match creds_dir {
        Some(dir) => NatsAuth::Creds(nats_config::read_creds(&nats_config::creds_path(dir, identity))?),
        None => NatsAuth::Insecure,
    };
    crate::services::connect_nats(nats_url, identity, &auth, false).await
}

/// `atasira bench drafts`.
pub async fn drafts(nats_url: &str, creds_dir: Option<&Path>, database_url: &str, concurrency: usize, count: usize) -> anyhow::Result<()> {
    anyhow::ensure!(database_url.starts_with("postgres"), "the benchmark runs on PostgreSQL (cluster mode): pass a postgres:// URL");
    let concurrency = concurrency.max(1);
    let count = count.max(concurrency);
    let db = Db::connect(database_url).await?;
    // Each process of the cluster has its own connection (and, with credentials, its own
    // identity): the drafts service, the gateway (which sends the commands) and the floor.
    let drafts_client = connect(nats_url, creds_dir, subjects::DRAFTS).await?;
    let gateway_client = connect(nats_url, creds_dir, subjects::GATEWAY).await?;
    let floor_client = connect(nats_url, creds_dir, subjects::PROVISIONER).await?;
    let bus = NatsBus::new(gateway_client.clone());
    let drafts_js = async_nats::jetstream::new(drafts_client.clone());
    let keys = Arc::new(crate::services::internal_keys(&hex::encode(auth::random_secret()))?);
    let drafts_rt = Runtime {
        db: db.clone(),
        bus: Arc::new(NatsBus::new(drafts_client)),
        feeds: FeedSource::default(),
        assertion_keys: keys.clone(),
        guards: Default::default(),
    };
    let rt = Runtime { db: db.clone(), bus: Arc::new(bus.clone()), feeds: FeedSource::default(), assertion_keys: keys.clone(), guards: Default::default() };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let drafts_task = tokio::spawn(atasira_drafts::run(drafts_rt, atasira_drafts::DraftsConfig::default(), rx.clone()));
    let relay_task = tokio::spawn(relay::run(db.clone(), drafts_js, atasira_drafts::SERVICE, atasira_drafts::AGGREGATE_TYPES, rx.clone()));
    let floor = start_floor(&NatsBus::new(floor_client), &db).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    println!(
        "atasira bench drafts: {count} commands per run, PostgreSQL {}, NATS {nats_url} ({}), {} CPUs",
        atasira_platform::db::redact(database_url),
        if creds_dir.is_some() { "each process with its own credentials" } else { "anonymous" },
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let timeout = Duration::from_secs(30);
    let floor_op = {
        let bus = bus.clone();
        move |i: usize| {
            let bus = bus.clone();
            async move {
                let reply = bus.request(&floor_subject(), BTreeMap::new(), floor_payload(i), timeout).await?;
                anyhow::ensure!(&reply[..] == b"ok", "floor responder failed");
                Ok(())
            }
        }
    };
    let agent = Principal::new("bench-agent", Role::Member, Kind::Agent);
    let drafts_op = {
        let (bus, keys, agent) = (bus.clone(), keys.clone(), agent.clone());
        move |i: usize| {
            let (bus, keys, agent) = (bus.clone(), keys.clone(), agent.clone());
            async move {
                // Unique per request, as the gateway's: an assertion is accepted once.
                let correlation = format!("bench-{i}-{}", uuid::Uuid::new_v4());
                let request = v1::BoxDraftCreateRequest {
                    box_type: format!("bench-{}", i % 1000),
                    purpose: "Weekly sales report from the CSV exports, mailed to the leads.".into(),
                    tools: vec!["Read".into()],
                    os_operations: vec!["file:read".into(), "notify:email".into()],
                    ..Default::default()
                };
                let subject = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
                let env = signed_envelope(&keys, &agent, &subject, &v1::SubmitDraft { request: Some(request) }, &correlation, "", chrono::Utc::now());
                let reply = bus.request(&subject, BTreeMap::new(), env.encode_to_vec().into(), timeout).await?;
                match atasira_contracts::decode_reply::<v1::SubmitDraftReply>(&reply)? {
                    Ok(_) => Ok(()),
                    Err(e) => anyhow::bail!("drafts refused: {} {}", e.code, e.message),
                }
            }
        }
    };

    // Warm-up, so connection pools and caches are not measured.
    measure("warm-up (floor)", concurrency, concurrency * 4, floor_op.clone()).await?;
    measure("warm-up (drafts)", concurrency, concurrency * 4, drafts_op.clone()).await?;
    println!();
    let floor_1 = measure("floor: NATS + 1 PG transaction", 1, (count / 4).max(50), floor_op.clone()).await?;
    let drafts_1 = measure("drafts: submit command path", 1, (count / 4).max(50), drafts_op.clone()).await?;
    let floor_n = measure("floor: NATS + 1 PG transaction", concurrency, count, floor_op).await?;
    let drafts_n = measure("drafts: submit command path", concurrency, count, drafts_op).await?;
    println!();
    println!("ratios (drafts / floor, same run):");
    println!("  throughput at c={concurrency}: {:.2}  (target >= 0.50)", drafts_n.per_second() / floor_n.per_second());
    println!("  p50 at c=1:           {:.2}  (target <= 2.00)", drafts_1.percentile(0.5).as_secs_f64() / floor_1.percentile(0.5).as_secs_f64());
    println!("  CPU per command at c={concurrency}: {:.2}", drafts_n.cpu.as_secs_f64() / floor_n.cpu.as_secs_f64().max(1e-9));

    // The full REST submit with read-your-writes, through a gateway in this process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let gateway =
        tokio::spawn(atasira_gateway::serve(listener, rt.clone(), atasira_gateway::Config { read_models: vec![subjects::DRAFTS], ..Default::default() }, {
            let mut rx = rx.clone();
            async move {
                let _ = rx.changed().await;
            }
        }));
    let pat = auth::create_token(&db, &agent, Some(chrono::TimeDelta::hours(1))).await?;
    let url = format!("http://{addr}/api/v1/boxes/box-drafts");
    let rest_op = move |i: usize| {
        let (url, pat) = (url.clone(), pat.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                let body = json!({"box_type": format!("rest-{}", i % 1000), "purpose": "Weekly sales report.", "tools": ["Read"]}).to_string();
                let r = ureq::post(&url).set("Authorization", &format!("Bearer {pat}")).set("Content-Type", "application/json").send_string(&body);
                match r {
                    Ok(resp) if resp.status() == 201 && resp.header("x-atasira-lagging").is_none() => Ok(()),
                    Ok(resp) => anyhow::bail!("REST answered {} (lagging: {:?})", resp.status(), resp.header("x-atasira-lagging")),
                    Err(e) => anyhow::bail!("REST failed: {e}"),
                }
            })
            .await?
        }
    };
    println!();
    measure("warm-up (REST)", concurrency, concurrency * 2, rest_op.clone()).await?;
    measure("REST submit + read-your-writes", concurrency, count / 2, rest_op).await?;

    let _ = tx.send(true);
    floor.stop();
    let _ = gateway.await;
    let _ = drafts_task.await;
    let _ = relay_task.await;
    sqlx::query("DROP TABLE IF EXISTS bench_floor_events, bench_floor_view").execute(db.any()).await?;
    Ok(())
}
