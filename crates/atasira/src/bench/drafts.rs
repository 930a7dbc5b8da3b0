//! `atasira bench drafts`: in one run on this machine,
//!
//! 1. a floor (a raw NATS request-reply whose responder runs one PostgreSQL transaction:
//!    insert a ~650-byte JSON event and upsert one projection row) and the drafts command
//!    path (NATS request -> assertion check -> validation -> event committed -> reply), at
//!    c=1 and c=N, in alternating blocks;
//! 2. REST submit with read-your-writes in cluster mode: the gateway's router and the
//!    services whose read models a submit waits for (drafts, runtime-registry, audit), each
//!    as `atasira serve` runs it (its own database role and pool, NATS connection and, with
//!    credentials, identity; its relay), in this process;
//! 3. REST submit on the embedded system `atasira dev` runs (SQLite in a fresh data dir,
//!    in-process bus);
//!
//! then one summary with the ratios and the targets. It asserts nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atasira_contracts::{decode_reply, envelope, signed_envelope, subjects, v1};
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::bus::{Bus, Endpoint, Handler, Message, NatsBus};
use atasira_platform::feed::FeedSource;
use atasira_platform::keys::AssertionKeys;
use atasira_platform::store::Db;
use atasira_platform::{Runtime, auth, relay};
use bytes::Bytes;
use prost::Message as _;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::http::Http;
use super::processes::Roles;
use super::{Figures, Op, TempDir, measure, measure_interleaved, op};
use crate::keys::{KeyKind, KeySetting};
use crate::nats_config;
use crate::services::{self, Embedded, NatsAuth, Settings};

/// What `atasira bench drafts` is told.
#[derive(Debug, Clone)]
pub struct DraftsOptions {
    /// Where the cluster part runs; `None` runs only the embedded part.
    pub cluster: Option<ClusterOptions>,
    pub concurrency: usize,
    pub count: usize,
}

/// Where NATS and PostgreSQL are for the cluster part.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nats_url: String,
    pub creds_dir: Option<std::path::PathBuf>,
    pub database_url: String,
}

/// How long one request may take before the run fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The floor borrows the gateway's route to the provisioner (no provisioner runs in the
/// benchmark), so that with credentials it passes the same permission checks as a command.
fn floor_subject() -> String {
    subjects::request(subjects::GATEWAY, subjects::PROVISIONER)
}

/// The floor's responder: one transaction per request, like a command commit plus a
/// projection row.
async fn start_floor(bus: &NatsBus, db: &Db) -> anyhow::Result<Endpoint> {
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
pub(super) async fn connect(nats_url: &str, creds_dir: Option<&Path>, identity: &str) -> anyhow::Result<async_nats::Client> {
    let auth = match creds_dir {
        Some(dir) => NatsAuth::Creds(nats_config::read_creds(&nats_config::creds_path(dir, identity))?),
        None => NatsAuth::Insecure { ca_pem: None },
    };
    services::connect_nats(nats_url, identity, &auth, false).await
}

/// What the in-process cluster's processes share: where NATS and PostgreSQL are, and the
/// keys every process of a cluster is given.
pub(super) struct Cluster<'a> {
    pub(super) options: &'a ClusterOptions,
    /// The public keys the processes learn (each signing process has its own signer).
    pub(super) keys: AssertionKeys,
    pub(super) settings: Settings,
    pub(super) audit: Arc<atasira_domain::audit::AuditKeys>,
    pub(super) shutdown: watch::Receiver<bool>,
    /// Each process's database role.
    roles: Roles,
}

type Task = JoinHandle<anyhow::Result<()>>;

impl<'a> Cluster<'a> {
    /// The processes of one cluster run: fresh audit keys, settings and database roles in
    /// `data`.
    pub(super) async fn new(options: &'a ClusterOptions, data: &std::path::Path, shutdown: watch::Receiver<bool>) -> anyhow::Result<Self> {
        Ok(Cluster {
            options,
            keys: AssertionKeys::default(),
            settings: settings_in(data),
            audit: Arc::new(fresh_key(KeyKind::Audit)?.audit_keys()?),
            shutdown,
            roles: Roles::create(&options.database_url, &data.join("db-roles")).await?,
        })
    }

    /// A process's runtime: its own database pool (as its own role) and NATS connection as
    /// `identity`.
    pub(super) async fn runtime(&self, identity: &str) -> anyhow::Result<(Runtime, async_nats::jetstream::Context)> {
        let db = Db::connect(&self.roles.url(identity)?).await?;
        let client = connect(&self.options.nats_url, self.options.creds_dir.as_deref(), identity).await?;
        let js = async_nats::jetstream::new(client.clone());
        db.ring_over_nats(client.clone(), identity, atasira_platform::store::bells::DOORBELL_GAP);
        let rt = Runtime {
            db: db.clone(),
            bus: Arc::new(NatsBus::new(client)),
            feeds: FeedSource::default(),
            assertion_keys: self.keys.own_signer(),
            guards: Default::default(),
        };
        // The processes that sign publish a key of their own first, as `serve` does.
        if [subjects::GATEWAY, subjects::APPROVAL, subjects::RUNTIME_REGISTRY].contains(&identity) {
            rt.assertion_keys.publish_new_key(&db, identity).await?;
        }
        Ok((rt, js))
    }

    /// The tasks `atasira serve <service>` runs for a service: the service, its relay and
    /// (audit) the sentinel. Approval signs with a fresh key.
    pub(super) async fn start(&self, service: &'static str) -> anyhow::Result<Vec<Task>> {
        let (rt, js) = self.runtime(service).await?;
        let rx = self.shutdown.clone();
        let relay = |name: &'static str, types: &'static [&'static str]| -> Task {
            let (db, js, rx) = (rt.db.clone(), js.clone(), rx.clone());
            tokio::spawn(async move {
                relay::run(db, relay::EventsStream::new(js), name, types, rx).await;
                Ok(())
            })
        };
        Ok(match service {
            subjects::DRAFTS => vec![
                relay(atasira_drafts::SERVICE, atasira_drafts::AGGREGATE_TYPES),
                tokio::spawn(atasira_drafts::run(rt.clone(), services::drafts_config(&self.settings), rx.clone())),
            ],
            subjects::RUNTIME_REGISTRY => vec![
                relay(atasira_runtime_registry::SERVICE, atasira_runtime_registry::AGGREGATE_TYPES),
                tokio::spawn(atasira_runtime_registry::run(rt.clone(), services::registry_config(&self.settings), rx.clone())),
            ],
            subjects::AUDIT => {
                let sentinel = tokio::spawn({
                    let (rt, js, rx) = (rt.clone(), js.clone(), rx.clone());
                    async move {
                        atasira_platform::sentinel::run(rt, relay::EventsStream::new(js), rx).await;
                        Ok(())
                    }
                });
                vec![
                    relay(atasira_audit::SERVICE, atasira_audit::AGGREGATE_TYPES),
                    sentinel,
                    tokio::spawn(atasira_audit::run(rt.clone(), services::audit_config(self.audit.clone(), &self.settings, true), rx.clone())),
                ]
            }
            subjects::APPROVAL => {
                let (signer, retired) = fresh_key(KeyKind::Approval)?.approval()?;
                vec![
                    relay(atasira_approval::SERVICE, atasira_approval::AGGREGATE_TYPES),
                    tokio::spawn(atasira_approval::run(rt.clone(), services::approval_config(signer, retired), rx.clone())),
                ]
            }
            subjects::PROVISIONER => vec![
                relay(atasira_provisioner::SERVICE, atasira_provisioner::AGGREGATE_TYPES),
                tokio::spawn(atasira_provisioner::run(rt.clone(), services::provisioner_config(&self.settings), rx.clone())),
            ],
            other => anyhow::bail!("the benchmark does not run the {other} service"),
        })
    }
}

/// Waits until `services` have applied every draft event stored so far (the audit ledger
/// and the registry catch up with the commands of the first runs), saying so as it waits.
pub(super) async fn catch_up(bus: &dyn Bus, db: &Db, services: &[&str]) -> anyhow::Result<()> {
    use sqlx::Row as _;
    let last = sqlx::query("SELECT aggregate_id, sequence FROM events WHERE aggregate_type = $1 ORDER BY global_position DESC LIMIT 1")
        .bind(atasira_domain::aggregates::types::DRAFT)
        .fetch_optional(db.any())
        .await?;
    let Some(last) = last else { return Ok(()) };
    let id = atasira_platform::store::StoredEvent::event_id_of(atasira_domain::aggregates::types::DRAFT, &last.try_get::<String, _>(0)?, last.try_get(1)?);
    let deadline = Instant::now() + Duration::from_secs(600);
    for service in services {
        loop {
            let wait = v1::WaitForPosition { position: 0, timeout_ms: 5_000, event_ids: vec![id.clone()] };
            let env = envelope(&wait, &uuid::Uuid::new_v4().to_string(), "");
            let reply =
                bus.request(&subjects::request(subjects::GATEWAY, service), BTreeMap::new(), env.encode_to_vec().into(), Duration::from_secs(10)).await?;
            let lagging = match decode_reply::<v1::WaitForPositionReply>(&reply)? {
                Ok((r, _)) => r.lagging,
                Err(e) => anyhow::bail!("the {service} service refused a wait: {} {}", e.code, e.message),
            };
            if lagging.is_empty() {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "the {service} service did not catch up within 10 minutes: {lagging:?} behind");
            eprintln!("  ... waiting for {service} to catch up with the events so far ({} behind)", lagging.join(", "));
        }
    }
    Ok(())
}

/// REST submit (`POST /api/v1/boxes/box-drafts`) with read-your-writes: a 201 that is not
/// lagging, over keep-alive connections.
pub(super) fn rest_submit(addr: std::net::SocketAddr, pat: String, tag: &'static str) -> Op {
    let http = Http::new(addr, &pat, TIMEOUT);
    op(move |i: usize| {
        let http = http.clone();
        async move {
            let body = json!({"box_type": format!("{tag}-{}", i % 1000), "purpose": "Weekly sales report.", "tools": ["Read"]}).to_string();
            let answer = http.post_json("/api/v1/boxes/box-drafts", body).await?;
            let lagging = answer.headers.get("x-atasira-lagging");
            anyhow::ensure!(
                answer.status == 201 && lagging.is_none(),
                "REST answered {} (lagging: {lagging:?}): {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
            Ok(())
        }
    })
}

/// `GET path` answered 200, over keep-alive connections.
pub(super) fn rest_get(addr: std::net::SocketAddr, pat: String, path: &'static str) -> Op {
    let http = Http::new(addr, &pat, TIMEOUT);
    op(move |_| {
        let http = http.clone();
        async move {
            let answer = http.get(path).await?;
            anyhow::ensure!(answer.status == 200, "GET {path} answered {}: {}", answer.status, String::from_utf8_lossy(&answer.body));
            Ok(())
        }
    })
}

/// A fresh setting of one key kind, as `atasira keys rotate` would print for a first key.
pub(super) fn fresh_key(kind: KeyKind) -> anyhow::Result<KeySetting> {
    KeySetting::fresh(kind, None, auth::random_secret())
}

/// The figures of the cluster part.
struct ClusterFigures {
    floor_1: Figures,
    drafts_1: Figures,
    floor_n: Figures,
    drafts_n: Figures,
    rest_1: Figures,
    rest_n: Figures,
}

async fn cluster(o: &ClusterOptions, concurrency: usize, count: usize) -> anyhow::Result<ClusterFigures> {
    let small = (count / 4).max(50);
    let data = TempDir::new("cluster")?;
    let (tx, rx) = watch::channel(false);
    let cluster = Cluster::new(o, data.path(), rx.clone()).await?;
    // The gateway (which sends the commands) and the floor are processes of their own too.
    let (gateway_rt, _) = cluster.runtime(subjects::GATEWAY).await?;
    let gateway_bus = gateway_rt.bus.clone();
    let floor_db = Db::connect(&o.database_url).await?;
    let floor = start_floor(&NatsBus::new(connect(&o.nats_url, o.creds_dir.as_deref(), subjects::PROVISIONER).await?), &floor_db).await?;
    let mut tasks = cluster.start(subjects::DRAFTS).await?;
    services::wait_ready(gateway_bus.as_ref(), &[subjects::DRAFTS]).await?;

    let floor_op = {
        let bus = gateway_bus.clone();
        op(move |i: usize| {
            let bus = bus.clone();
            async move {
                let reply = bus.request(&floor_subject(), BTreeMap::new(), floor_payload(i), TIMEOUT).await?;
                anyhow::ensure!(&reply[..] == b"ok", "floor responder failed");
                Ok(())
            }
        })
    };
    let agent = Principal::new("bench-agent", Role::Member, Kind::Agent);
    let drafts_op = {
        let (bus, keys, agent) = (gateway_bus.clone(), gateway_rt.assertion_keys.signer()?, agent.clone());
        op(move |i: usize| {
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
                let reply = bus.request(&subject, BTreeMap::new(), env.encode_to_vec().into(), TIMEOUT).await?;
                match atasira_contracts::decode_reply::<v1::SubmitDraftReply>(&reply)? {
                    Ok(_) => Ok(()),
                    Err(e) => anyhow::bail!("drafts refused: {} {}", e.code, e.message),
                }
            }
        })
    };

    println!("-- cluster: the drafts command (NATS request to the drafts service, its relay running) against the floor");
    // Warm-up, so connection pools and caches are not measured.
    measure("warm-up (floor)", concurrency, concurrency * 4, &floor_op).await?;
    measure("warm-up (drafts)", concurrency, concurrency * 4, &drafts_op).await?;
    // Floor and command in alternating blocks, so that the host's slower and faster
    // moments fall on both alike.
    let base = ("floor: NATS + 1 PG transaction", &floor_op);
    let command = ("drafts: submit command path", &drafts_op);
    let (floor_1, drafts_1) = measure_interleaved(1, small, 10, base, command).await?;
    let (floor_n, drafts_n) = measure_interleaved(concurrency, count, 4, base, command).await?;

    println!();
    println!("-- cluster: REST submit with read-your-writes (gateway; drafts, runtime-registry and audit each with its own connections)");
    eprintln!("  ... starting runtime-registry and audit");
    tasks.extend(cluster.start(subjects::RUNTIME_REGISTRY).await?);
    tasks.extend(cluster.start(subjects::AUDIT).await?);
    let read_models = atasira_gateway::Config::default().read_models;
    services::wait_ready(gateway_bus.as_ref(), &read_models).await?;
    catch_up(gateway_bus.as_ref(), &floor_db, &read_models).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let gateway_db = gateway_rt.db.clone();
    let gateway = tokio::spawn(atasira_gateway::serve(listener, gateway_rt, cluster.settings.gateway.clone(), {
        let mut rx = rx.clone();
        async move {
            let _ = rx.changed().await;
        }
    }));
    let pat = auth::create_token(&gateway_db, &agent, Some(chrono::TimeDelta::hours(1)), auth::OPERATOR).await?.token;
    let rest = rest_submit(addr, pat, "rest");
    measure("warm-up (REST)", concurrency, concurrency * 4, &rest).await?;
    let rest_1 = measure("REST submit + read-your-writes", 1, small, &rest).await?;
    let rest_n = measure("REST submit + read-your-writes", concurrency, count, &rest).await?;

    let _ = tx.send(true);
    floor.stop();
    gateway.await??;
    for t in tasks {
        t.await??;
    }
    sqlx::query("DROP TABLE IF EXISTS bench_floor_events, bench_floor_view").execute(floor_db.any()).await?;
    Ok(ClusterFigures { floor_1, drafts_1, floor_n, drafts_n, rest_1, rest_n })
}

/// The settings of `atasira dev` with data in `dir`.
pub(super) fn settings_in(dir: &std::path::Path) -> Settings {
    Settings {
        data_dir: dir.to_path_buf(),
        manifests_dir: None,
        max_boxes: atasira_domain::aggregates::namespace::DEFAULT_MAX_BOXES,
        draft_ttl: chrono::TimeDelta::days(7),
        over_limit_approvals: 1,
        // The benchmark measures throughput: no per-user rate.
        gateway: atasira_gateway::Config { rate: None, ..Default::default() },
        provision_backoff: Duration::from_secs(1),
        binding_ttl: atasira_domain::worker::DEFAULT_BINDING_TTL,
        host_lease: Duration::from_secs(10),
        ask_ttl: Duration::from_secs(300),
        trigger_in_flight: atasira_domain::trigger::IN_FLIGHT,
        notifier: atasira_audit::NotifierConfig::default(),
        host: None,
    }
}

/// REST submit on the embedded system (`atasira dev` in a fresh data dir), at c=1 and c=N.
async fn embedded(concurrency: usize, count: usize) -> anyhow::Result<(Figures, Figures)> {
    let data = TempDir::new("embedded")?;
    let settings = settings_in(data.path());
    let system = Embedded::start(&settings, "127.0.0.1:0".parse()?, None).await?;
    let agent = Principal::new("bench-agent", Role::Member, Kind::Agent);
    let pat = auth::create_token(&system.db, &agent, Some(chrono::TimeDelta::hours(1)), auth::OPERATOR).await?.token;
    let rest = rest_submit(system.addr, pat, "embedded");
    println!("-- embedded: REST submit with read-your-writes (every service in this process, SQLite in {})", data.path().display());
    measure("warm-up (REST, embedded)", concurrency, concurrency * 4, &rest).await?;
    let rest_1 = measure("REST submit + read-your-writes", 1, (count / 4).max(50), &rest).await?;
    let (commits, appends) = system.db.appends_per_commit();
    let rest_n = measure("REST submit + read-your-writes", concurrency, count, &rest).await?;
    let (commits, appends) = (system.db.appends_per_commit().0 - commits, system.db.appends_per_commit().1 - appends);
    println!("  (c={concurrency}: {appends} submissions in {commits} commits, {:.1} per commit)", appends as f64 / commits.max(1) as f64);
    system.stop().await?;
    Ok((rest_1, rest_n))
}

/// `atasira bench drafts`.
pub async fn drafts(o: DraftsOptions) -> anyhow::Result<()> {
    if let Some(c) = &o.cluster {
        anyhow::ensure!(c.database_url.starts_with("postgres"), "the benchmark's cluster part runs on PostgreSQL: pass a postgres:// URL");
    }
    let n = o.concurrency.max(1);
    let count = o.count.max(n);
    let where_ = match &o.cluster {
        Some(c) => format!(
            "PostgreSQL {}, NATS {} ({})",
            atasira_platform::store::redact(&c.database_url),
            c.nats_url,
            if c.creds_dir.is_some() { "each process with its own credentials" } else { "anonymous" }
        ),
        None => "embedded only".to_owned(),
    };
    println!(
        "atasira bench drafts: {count} requests per run at c={n} ({} at c=1), {where_}, {} CPUs",
        (count / 4).max(50),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    println!();
    let cluster_figures = match &o.cluster {
        Some(c) => {
            let figures = cluster(c, n, count).await?;
            println!();
            Some(figures)
        }
        None => None,
    };
    let (embedded_1, embedded_n) = embedded(n, count).await?;

    println!();
    println!("== summary (figures of this run; targets beside them)");
    let row = |what: String, figure: String, target: &str| println!("  {what:<54} {figure:>12}   {target}");
    let cn = format!("c={n}");
    if let Some(c) = &cluster_figures {
        row("cluster, REST submit + read-your-writes, p50 at c=1".into(), format!("{:.2} ms", c.rest_1.p50_ms()), "target <= 4 ms");
        row(format!("cluster, REST submit + read-your-writes, {cn}"), format!("{:.1} /s", c.rest_n.per_second()), "");
    }
    row(format!("embedded, REST submit + read-your-writes, {cn}"), format!("{:.1} /s", embedded_n.per_second()), "target >= 3,000 /s");
    row("embedded, REST submit + read-your-writes, p50 at c=1".into(), format!("{:.2} ms", embedded_1.p50_ms()), "");
    if let Some(c) = &cluster_figures {
        row(
            "drafts command p50 at c=1 / floor p50 at c=1".into(),
            format!("{:.2} x", c.drafts_1.p50_ms() / c.floor_1.p50_ms()),
            &format!("target <= 1.5 x   ({:.2} ms / {:.2} ms)", c.drafts_1.p50_ms(), c.floor_1.p50_ms()),
        );
        row(
            "drafts command p50 at c=1 - floor p50 at c=1".into(),
            format!("{:.0} µs", (c.drafts_1.p50_ms() - c.floor_1.p50_ms()) * 1e3),
            "(what the command adds to the floor)",
        );
        row(
            format!("drafts command throughput at {cn} / floor"),
            format!("{:.2}", c.drafts_n.per_second() / c.floor_n.per_second()),
            &format!("target >= 0.50   ({:.1} /s / {:.1} /s)", c.drafts_n.per_second(), c.floor_n.per_second()),
        );
        row(
            format!("drafts command CPU per command at {cn} / floor"),
            format!("{:.2}", c.drafts_n.cpu.as_secs_f64() / c.floor_n.cpu.as_secs_f64().max(1e-9)),
            "",
        );
    }
    Ok(())
}
