//! `atasira dev` (every service in one process, embedded) and `atasira serve <service>`
//! (one service per process, cluster). Both build a `Runtime` and run the same service
//! code; only the adapters differ (R-ARCH-7).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use atasira_domain::audit::AuditKeys;
use atasira_domain::token::{ApprovalSigner, PublicKeyEntry};
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::bus::{InprocBus, NatsBus};
use atasira_platform::feed::FeedSource;
use atasira_platform::keys::AssertionKeys;
use atasira_platform::store::Db;
use atasira_platform::{Runtime, auth, relay};
use tokio::sync::watch;

use crate::keys::{KeyKind, KeySetting};

/// Settings every service mode shares.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where embedded data, keys, managed files and workspaces live.
    pub data_dir: PathBuf,
    /// `--manifests-dir` (default `<data-dir>/manifests`).
    pub manifests_dir: Option<PathBuf>,
    /// `ATASIRA_MAX_BOXES`.
    pub max_boxes: usize,
    /// `ATASIRA_DRAFT_TTL` in seconds.
    pub draft_ttl: chrono::TimeDelta,
    /// `ATASIRA_OVER_LIMIT_APPROVALS`.
    pub over_limit_approvals: u32,
    pub gateway: atasira_gateway::Config,
    /// `ATASIRA_PROVISION_BACKOFF_MS`: the provisioner's first retry delay.
    pub provision_backoff: Duration,
    /// `ATASIRA_BINDING_TTL`: the lease of an execution binding.
    pub binding_ttl: Duration,
    /// `ATASIRA_HOST_LEASE`: how long an execution host's heartbeat holds its Workers.
    pub host_lease: Duration,
    /// `ATASIRA_ASK_TTL`: how long a tool-use request waits for a human admin.
    pub ask_ttl: Duration,
    /// `ATASIRA_TRIGGER_IN_FLIGHT`: unended triggered Workers an event Box may have.
    pub trigger_in_flight: usize,
    /// Webhook deliveries and announcements (`ATASIRA_PUBLIC_URL`, `ATASIRA_WEBHOOK_*`).
    pub notifier: atasira_audit::NotifierConfig,
    /// The in-process execution host of `dev --runner` (none: Workers wait for a host).
    pub host: Option<atasira_host::HostConfig>,
}

impl Settings {
    fn manifests_dir(&self) -> PathBuf {
        self.manifests_dir.clone().unwrap_or_else(|| self.data_dir.join("manifests"))
    }
}

/// Reads `<data_dir>/keys/<name>` or creates it with 32 random bytes (hex), mode 0600.
fn key_file(data_dir: &Path, name: &str) -> anyhow::Result<String> {
    let dir = data_dir.join("keys");
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(s.trim().to_owned()),
        Err(_) => {
            let k = hex::encode(auth::random_secret());
            write_private(&path, &k)?;
            Ok(k)
        }
    }
}

fn write_private(path: &Path, content: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut f = options.open(path).with_context(|| format!("failed to create {}", path.display()))?;
    f.write_all(content.as_bytes())?;
    Ok(())
}

/// The audit key given (`--audit-key`, `ATASIRA_AUDIT_KEY`), else the one of a data dir.
pub fn audit_keys_for(audit_key: Option<&str>, data_dir: Option<&Path>) -> anyhow::Result<AuditKeys> {
    let setting = match (audit_key, data_dir) {
        (Some(k), _) => k.to_owned(),
        (None, Some(dir)) => key_file(dir, "audit.key")?,
        (None, None) => anyhow::bail!("to verify a cluster's ledger, pass --audit-key or set ATASIRA_AUDIT_KEY (the audit service's key)"),
    };
    KeySetting::parse(KeyKind::Audit, &setting)?.audit_keys()
}

async fn ctrl_c(tx: watch::Sender<bool>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
    }
    let _ = tx.send(true);
}

async fn wait(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

pub fn drafts_config(s: &Settings) -> atasira_drafts::DraftsConfig {
    // Sweep at least twice per TTL, and at least every minute.
    let half_ttl = s.draft_ttl.to_std().map(|d| d / 2).unwrap_or(Duration::from_secs(60));
    atasira_drafts::DraftsConfig {
        ttl: s.draft_ttl,
        sweep_every: half_ttl.clamp(Duration::from_millis(200), Duration::from_secs(60)),
        over_limit_approvals: s.over_limit_approvals,
    }
}

pub fn provisioner_config(s: &Settings) -> atasira_provisioner::ProvisionerConfig {
    atasira_provisioner::ProvisionerConfig {
        data_dir: s.data_dir.clone(),
        backoff: atasira_provisioner::Backoff::with_initial(s.provision_backoff),
        binding_ttl: s.binding_ttl,
    }
}

/// The embedded system `atasira dev` runs: every service and the gateway in this process,
/// on SQLite in a data dir and the in-process bus.
pub struct Embedded {
    /// Where the gateway listens.
    pub addr: SocketAddr,
    /// `https` when the gateway serves TLS, else `http`.
    pub scheme: &'static str,
    pub db: Db,
    /// Whether the store held no PAT before this start (`dev` then issues the first ones).
    pub first_start: bool,
    /// What every service runs on (the probe port of `dev` reads it).
    rt: Runtime,
    shutdown: watch::Sender<bool>,
    gateway: tokio::task::JoinHandle<anyhow::Result<()>>,
    services: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Embedded {
    /// Starts every service on `settings.data_dir`, waits until each answers, then serves
    /// the REST API on `listen` (HTTPS with `tls`).
    pub async fn start(settings: &Settings, listen: SocketAddr, tls: Option<Arc<ServerTls>>) -> anyhow::Result<Embedded> {
        let data_dir = settings.data_dir.clone();
        std::fs::create_dir_all(&data_dir).with_context(|| format!("failed to create {}", data_dir.display()))?;
        let db = Db::connect(&Db::sqlite_url(&data_dir)).await?;
        let rt = Runtime {
            db: db.clone(),
            bus: Arc::new(InprocBus::default()),
            feeds: FeedSource::default(),
            assertion_keys: AssertionKeys::default(),
            guards: Arc::new(guards(settings)),
        };
        let (shutdown, rx) = watch::channel(false);
        // The gateway, approval and the registry each sign with a key of their own.
        let gateway_rt = signing(&rt, atasira_contracts::subjects::GATEWAY, &rx).await?;
        let approval_rt = signing(&rt, atasira_contracts::subjects::APPROVAL, &rx).await?;
        let registry_rt = signing(&rt, atasira_contracts::subjects::RUNTIME_REGISTRY, &rx).await?;
        // A key file holds a key setting too, so an embedded operator rotates by editing it.
        let (signer, retired) = KeySetting::parse(KeyKind::Approval, &key_file(&data_dir, "approval.key")?)?.approval()?;
        let audit = audit_keys_for(None, Some(&data_dir))?;
        let first_start = !auth::has_tokens(&db).await?;
        let services = vec![
            tokio::spawn(atasira_drafts::run(rt.clone(), drafts_config(settings), rx.clone())),
            tokio::spawn(atasira_approval::run(approval_rt, approval_config(signer, retired), rx.clone())),
            tokio::spawn(atasira_runtime_registry::run(registry_rt, registry_config(settings), rx.clone())),
            tokio::spawn(atasira_audit::run(rt.clone(), audit_config(Arc::new(audit), settings, false), rx.clone())),
            tokio::spawn(atasira_provisioner::run(rt.clone(), provisioner_config(settings), rx.clone())),
        ];
        wait_ready(rt.bus.as_ref(), atasira_contracts::subjects::SERVICES).await?;
        let mut services = services;
        if let Some(host) = settings.host.clone() {
            services.push(tokio::spawn(atasira_host::run(rt.bus.clone(), host, rx.clone())));
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let (addr, gateway) = spawn_gateway(listen, tls, gateway_rt, settings.gateway.clone(), wait(rx)).await?;
        Ok(Embedded { addr, scheme, db, first_start, rt, shutdown, gateway, services })
    }

    /// Stops the system: the gateway and every service finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(true);
        self.finished().await
    }

    /// Waits until the system stopped (by [`Embedded::stop`] or a signal, see `dev`).
    async fn finished(self) -> anyhow::Result<()> {
        self.gateway.await.context("the gateway panicked")??;
        for s in self.services {
            s.await.context("a service panicked")??;
        }
        Ok(())
    }
}

/// `rt` with a signing key of `issuer`'s own, published in the store before it signs
/// anything, and replaced by a new one every twelve hours until shutdown (R-ARCH-13).
async fn signing(rt: &Runtime, issuer: &'static str, shutdown: &watch::Receiver<bool>) -> anyhow::Result<Runtime> {
    let keys = rt.assertion_keys.own_signer();
    keys.publish_new_key(&rt.db, issuer).await?;
    tokio::spawn(atasira_platform::keys::rotate(keys.clone(), rt.db.clone(), issuer, shutdown.clone()));
    Ok(Runtime { assertion_keys: keys, ..rt.clone() })
}

/// The process's limits: NATS publishers' tokens get the gateway's rate per user.
fn guards(settings: &Settings) -> atasira_platform::guard::Guards {
    let guards = atasira_platform::guard::Guards::default();
    match settings.gateway.rate {
        Some(rate) => guards.with_client_rate(rate),
        None => guards,
    }
}

/// `atasira dev`.
pub async fn dev(settings: Settings, listen: Listen) -> anyhow::Result<()> {
    let system = Embedded::start(&settings, listen.api, listen.tls.clone()).await?;
    if let Some(addr) = listen.probes {
        serve_probes("dev", addr, system.rt.clone(), system.shutdown.subscribe()).await?;
    }
    if system.first_start {
        let admin = auth::create_token(&system.db, &Principal::new("admin", Role::Admin, Kind::Human), None, auth::OPERATOR).await?.token;
        let agent = auth::create_token(&system.db, &Principal::new("agent", Role::Member, Kind::Agent), None, auth::OPERATOR).await?.token;
        println!("admin PAT: {admin}");
        println!("agent PAT: {agent}");
    }
    eprintln!("atasira dev: listening on {}://{} (data in {})", system.scheme, system.addr, settings.data_dir.display());
    tokio::spawn(ctrl_c(system.shutdown.clone()));
    system.finished().await
}

pub fn approval_config(signer: ApprovalSigner, retired: Vec<PublicKeyEntry>) -> atasira_approval::ApprovalConfig {
    atasira_approval::ApprovalConfig { signer, retired, activation_wait: Duration::from_secs(10) }
}

pub fn registry_config(s: &Settings) -> atasira_runtime_registry::RegistryConfig {
    atasira_runtime_registry::RegistryConfig {
        manifests_dir: s.manifests_dir(),
        max_boxes: s.max_boxes,
        host_lease: s.host_lease,
        ask_ttl: s.ask_ttl,
        trigger_in_flight: s.trigger_in_flight,
        listener: None,
    }
}

/// The audit service's settings; `on_bus`: announcements also go out on NATS (as
/// `atasira serve audit` sends them).
pub(crate) fn audit_config(keys: Arc<AuditKeys>, s: &Settings, on_bus: bool) -> atasira_audit::AuditConfig {
    atasira_audit::AuditConfig { notifier: atasira_audit::NotifierConfig { on_bus, ..s.notifier.clone() }, ..atasira_audit::AuditConfig::new(keys) }
}

/// What `atasira serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceName {
    Gateway,
    Drafts,
    Approval,
    RuntimeRegistry,
    Provisioner,
    Audit,
    /// An execution host (`--name`, `--runner`).
    Host,
}

/// Cluster-mode secrets, from flags or the environment.
#[derive(Debug, Clone)]
pub struct ClusterKeys {
    pub approval: Option<String>,
    pub approval_file: Option<PathBuf>,
    pub audit: Option<String>,
}

impl ServiceName {
    /// The process identity: its subjects, its NATS user and its credentials file.
    pub fn identity(self) -> &'static str {
        use atasira_contracts::subjects;
        match self {
            ServiceName::Gateway => subjects::GATEWAY,
            ServiceName::Drafts => subjects::DRAFTS,
            ServiceName::Approval => subjects::APPROVAL,
            ServiceName::RuntimeRegistry => subjects::RUNTIME_REGISTRY,
            ServiceName::Provisioner => subjects::PROVISIONER,
            ServiceName::Audit => subjects::AUDIT,
            ServiceName::Host => subjects::HOST,
        }
    }
}

/// How a process authenticates to NATS (R-ARCH-10), and which CA its TLS trusts.
#[derive(Debug, Clone)]
pub enum NatsAuth {
    /// Its own nkey, from the credentials file `atasira nats-config` wrote (with the CA).
    Creds(crate::nats_config::Creds),
    /// None (`--insecure-nats`): anyone who reaches NATS can read and forge requests. TLS
    /// only with a CA (`--nats-ca`) or a `tls://` URL.
    Insecure { ca_pem: Option<String> },
}

impl NatsAuth {
    /// From `--nats-creds`, `--nats-ca` and `--insecure-nats`: credentials are required
    /// unless the operator explicitly runs without; `--nats-ca` replaces the CA of the
    /// credentials file.
    pub fn from_args(identity: &str, creds: Option<&Path>, ca: Option<&Path>, insecure: bool) -> anyhow::Result<NatsAuth> {
        let ca_pem = match ca {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the NATS CA certificate {}", path.display()))?;
                let pem = crate::tls::certificate_blocks(&text)
                    .ok_or_else(|| anyhow::anyhow!("{} holds no certificate (-----BEGIN CERTIFICATE-----)", path.display()))?;
                Some(pem)
            }
            None => None,
        };
        match (creds, insecure) {
            (Some(path), _) => {
                let mut creds = crate::nats_config::read_creds(path)?;
                if ca_pem.is_some() {
                    creds.ca_pem = ca_pem;
                }
                let is_gateway = identity == atasira_contracts::subjects::GATEWAY;
                if creds.account_seed.is_some() && !is_gateway {
                    anyhow::bail!("{} is the gateway's NATS credentials file; the {identity} service needs its own ({identity}.creds)", path.display());
                }
                if creds.account_seed.is_none() && is_gateway {
                    anyhow::bail!(
                        "{} holds no auth callout issuer key, which the gateway needs to admit NATS publishers: pass the gateway.creds that `atasira nats-config` wrote",
                        path.display()
                    );
                }
                Ok(NatsAuth::Creds(creds))
            }
            (None, true) => Ok(NatsAuth::Insecure { ca_pem }),
            (None, false) => anyhow::bail!(
                "cluster mode needs NATS credentials: pass --nats-creds FILE (or set ATASIRA_NATS_CREDS) with the {identity}.creds file that \
                 `atasira nats-config --out DIR` wrote; --insecure-nats runs without them (then anyone who reaches NATS can read and forge requests)"
            ),
        }
    }
}

/// Warns about a NATS connection without credentials now and every minute.
async fn warn_insecure_nats(identity: &'static str) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    loop {
        every.tick().await;
        tracing::warn!(
            "{identity}: NATS without credentials (--insecure-nats): anyone who reaches NATS can read, answer and forge requests; \
             run `atasira nats-config` and pass --nats-creds"
        );
    }
}

/// Serves the probe port (`--metrics-listen`) of the process `identity` until `rx` says stop.
async fn serve_probes(identity: &'static str, addr: SocketAddr, rt: Runtime, rx: watch::Receiver<bool>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("failed to listen on {addr} for the probes"))?;
    eprintln!("atasira {identity}: probes on http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(e) = crate::probe::serve(listener, rt, wait(rx)).await {
            tracing::error!("{identity}: the probe port stopped: {e:#}");
        }
    });
    Ok(())
}

/// The gateway's HTTPS configuration (`--tls-cert`, `--tls-key`).
pub type ServerTls = tokio_rustls::rustls::ServerConfig;

/// Serves the REST API on `addr` (HTTPS with `tls`) until `shutdown`; returns the address it
/// listens on (port 0 picks one).
async fn spawn_gateway(
    addr: SocketAddr,
    tls: Option<Arc<ServerTls>>,
    rt: Runtime,
    config: atasira_gateway::Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("failed to listen on {addr}"))?;
    let local = listener.local_addr()?;
    let served = match tls {
        Some(tls) => tokio::spawn(atasira_gateway::serve(crate::tls::TlsListener::new(listener, tls)?, rt, config, shutdown)),
        None => tokio::spawn(atasira_gateway::serve(listener, rt, config, shutdown)),
    };
    Ok((local, served))
}

/// Where `atasira dev` and `atasira serve` listen.
#[derive(Debug, Clone)]
pub struct Listen {
    /// The REST API (`dev`, and `serve gateway`).
    pub api: SocketAddr,
    /// HTTPS for the REST API (`--tls-cert`, `--tls-key`); plain HTTP without.
    pub tls: Option<Arc<ServerTls>>,
    /// The probe port (`--metrics-listen`), if any.
    pub probes: Option<SocketAddr>,
}

/// `atasira serve <service>`.
pub async fn serve(
    service: ServiceName,
    nats_url: &str,
    nats_auth: NatsAuth,
    database_url: &str,
    keys: ClusterKeys,
    listen: Listen,
    settings: Settings,
) -> anyhow::Result<()> {
    let identity = service.identity();
    let db = Db::connect(database_url).await?;
    if let NatsAuth::Insecure { .. } = nats_auth {
        tokio::spawn(warn_insecure_nats(identity));
    }
    // The gateway answers nats-server's auth callout with this key (NATS publishers).
    let callout_issuer = match &nats_auth {
        NatsAuth::Creds(creds) => match (&creds.account_seed, &creds.xkey_seed) {
            (Some(issuer), xkey) => Some(atasira_gateway::callout::Keys::from_seeds(issuer, xkey.as_deref())?),
            (None, _) => None,
        },
        NatsAuth::Insecure { .. } => None,
    };
    let client = connect_nats(nats_url, identity, &nats_auth, true).await?;
    // Its commits ring the other processes over NATS (ADR 9).
    db.ring_over_nats(client.clone(), identity, atasira_platform::store::bells::DOORBELL_GAP);
    let events = relay::EventsStream::new(async_nats::jetstream::new(client.clone()));
    let rt = Runtime {
        db: db.clone(),
        bus: Arc::new(NatsBus::new(client.clone())),
        feeds: FeedSource::default(),
        assertion_keys: AssertionKeys::default(),
        guards: Arc::new(guards(&settings)),
    };
    let (tx, rx) = watch::channel(false);
    tokio::spawn(ctrl_c(tx));
    // The processes that call others for a principal sign with a key of their own.
    let rt = match service {
        ServiceName::Gateway | ServiceName::Approval | ServiceName::RuntimeRegistry => signing(&rt, identity, &rx).await?,
        _ => rt,
    };
    if let Some(addr) = listen.probes {
        serve_probes(identity, addr, rt.clone(), rx.clone()).await?;
    }
    let relay_for = |name: &'static str, types: &'static [&'static str]| tokio::spawn(relay::run(db.clone(), events.clone(), name, types, rx.clone()));
    match service {
        ServiceName::Gateway => {
            let scheme = if listen.tls.is_some() { "https" } else { "http" };
            // The callout asks the registry which topics a publisher may publish on.
            let registry = atasira_platform::client::Client::new(identity, rt.bus.clone(), rt.assertion_keys.clone(), Duration::from_secs(5));
            let (addr, served) = spawn_gateway(listen.api, listen.tls, rt, settings.gateway.clone(), wait(rx.clone())).await?;
            eprintln!("atasira gateway: listening on {scheme}://{addr}");
            let callout = callout_issuer.map(|issuer| tokio::spawn(atasira_gateway::callout::run(client, db.clone(), registry, issuer, wait(rx))));
            let served = served.await?;
            if let Some(callout) = callout {
                callout.await??;
            }
            served
        }
        ServiceName::Drafts => {
            let relay = relay_for(atasira_drafts::SERVICE, atasira_drafts::AGGREGATE_TYPES);
            atasira_drafts::run(rt, drafts_config(&settings), rx).await?;
            let _ = relay.await;
            Ok(())
        }
        ServiceName::Approval => {
            let key = match (keys.approval, keys.approval_file) {
                (Some(k), _) => k,
                (None, Some(path)) => std::fs::read_to_string(&path).with_context(|| format!("failed to read the approval key file {}", path.display()))?,
                (None, None) => anyhow::bail!(
                    "the approval service needs its signing key: --approval-key-file FILE, --approval-key or ATASIRA_APPROVAL_KEY (ID:HEX, 64 hex digits)"
                ),
            };
            let setting = KeySetting::parse(KeyKind::Approval, &key)?;
            tracing::info!(keys = ?setting.ids(), "approval signing keys (current first; retired keys only verify)");
            let (signer, retired) = setting.approval()?;
            let relay = relay_for(atasira_approval::SERVICE, atasira_approval::AGGREGATE_TYPES);
            atasira_approval::run(rt, approval_config(signer, retired), rx).await?;
            let _ = relay.await;
            Ok(())
        }
        ServiceName::RuntimeRegistry => {
            let relay = relay_for(atasira_runtime_registry::SERVICE, atasira_runtime_registry::AGGREGATE_TYPES);
            let mut config = registry_config(&settings);
            config.listener = trigger_listener(nats_url, &nats_auth).await?;
            atasira_runtime_registry::run(rt, config, rx).await?;
            let _ = relay.await;
            Ok(())
        }
        ServiceName::Provisioner => {
            let relay = relay_for(atasira_provisioner::SERVICE, atasira_provisioner::AGGREGATE_TYPES);
            atasira_provisioner::run(rt, provisioner_config(&settings), rx).await?;
            let _ = relay.await;
            Ok(())
        }
        ServiceName::Audit => {
            let key = keys.audit.ok_or_else(|| anyhow::anyhow!("the audit service needs its MAC key: --audit-key or ATASIRA_AUDIT_KEY (ID:HEX, 32+ bytes)"))?;
            let setting = KeySetting::parse(KeyKind::Audit, &key)?;
            tracing::info!(keys = ?setting.ids(), "audit MAC keys (current first; retired keys only verify)");
            let relay = relay_for(atasira_audit::SERVICE, atasira_audit::AGGREGATE_TYPES);
            // Holds every notification on the public event feed to the store.
            let sentinel = tokio::spawn(atasira_platform::sentinel::run(rt.clone(), events.clone(), rx.clone()));
            atasira_audit::run(rt, audit_config(Arc::new(setting.audit_keys()?), &settings, true), rx).await?;
            let _ = relay.await;
            let _ = sentinel.await;
            Ok(())
        }
        ServiceName::Host => anyhow::bail!("an execution host runs with `serve host --name NAME --runner CMD`"),
    }
}

/// `atasira serve host`: an execution host on NATS, with its own identity; no database.
pub async fn serve_host(nats_url: &str, nats_auth: NatsAuth, config: atasira_host::HostConfig, probes: Option<SocketAddr>) -> anyhow::Result<()> {
    let identity = atasira_contracts::subjects::host_identity(&config.name);
    if let NatsAuth::Insecure { .. } = nats_auth {
        tokio::spawn(warn_insecure_nats("host"));
    }
    let client = connect_nats(nats_url, &identity, &nats_auth, true).await?;
    let bus: Arc<dyn atasira_platform::bus::Bus> = Arc::new(NatsBus::new(client));
    let (tx, rx) = watch::channel(false);
    tokio::spawn(ctrl_c(tx));
    if let Some(addr) = probes {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("failed to listen on {addr} for the probes"))?;
        eprintln!("atasira {identity}: probes on http://{}", listener.local_addr()?);
        let router = crate::probe::host_router(bus.clone());
        let stop = wait(rx.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).with_graceful_shutdown(stop).await {
                tracing::error!("the probe port stopped: {e}");
            }
        });
    }
    eprintln!("atasira {identity}: running Workers with {:?}, {} at once", config.runner, config.capacity);
    atasira_host::run(bus, config, rx).await
}

/// Waits until every service answers on the bus, so `/healthz` means ready.
pub async fn wait_ready(bus: &dyn atasira_platform::bus::Bus, services: &[&str]) -> anyhow::Result<()> {
    use prost::Message as _;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for service in services {
        let probe = atasira_contracts::envelope(&atasira_contracts::v1::WaitForPosition { position: 0, timeout_ms: 0, event_ids: vec![] }, "ready-probe", "");
        loop {
            let subject = atasira_contracts::subjects::request(atasira_contracts::subjects::GATEWAY, service);
            match bus.request(&subject, Default::default(), probe.encode_to_vec().into(), Duration::from_secs(5)).await {
                Ok(_) => break,
                Err(e) if tokio::time::Instant::now() >= deadline => anyhow::bail!("the {service} service did not start: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
    Ok(())
}

/// Connects to NATS as `identity` (its nkey, its own inbox prefix); `wait_for_server`
/// retries until the server is there, so services can start before it. Connection trouble
/// (a refused key, say) is logged.
pub async fn connect_nats(url: &str, identity: &str, auth: &NatsAuth, wait_for_server: bool) -> anyhow::Result<async_nats::Client> {
    let (options, ca_pem) = match auth {
        NatsAuth::Creds(creds) => (async_nats::ConnectOptions::with_nkey(creds.user_seed.clone()), creds.ca_pem.as_deref()),
        NatsAuth::Insecure { ca_pem } => (async_nats::ConnectOptions::new(), ca_pem.as_deref()),
    };
    // With a CA, TLS or nothing: a server (or someone in between) offering plain text is
    // refused, whatever the URL's scheme.
    let options = match ca_pem {
        Some(ca) => options.tls_client_config(crate::tls::client_config(ca)?).require_tls(true),
        None => options,
    };
    let who = identity.to_owned();
    let options = if wait_for_server { options.retry_on_initial_connect() } else { options };
    let options = options
        .custom_inbox_prefix(atasira_contracts::subjects::inbox_of(identity))
        .connection_timeout(Duration::from_secs(5))
        .name(format!("atasira {identity}"))
        .event_callback(move |event| {
            let who = who.clone();
            async move {
                match event {
                    async_nats::Event::ServerError(_) | async_nats::Event::ClientError(_) => tracing::warn!("{who}: NATS {event}"),
                    _ => tracing::info!("{who}: NATS {event}"),
                }
            }
        });
    options.connect(server_addrs(url)?.as_slice()).await.with_context(|| format!("failed to connect to NATS at {url}"))
}

/// The registry's second NATS connection, as the trigger listener whose seed its
/// credentials file holds (`None` without one: events then come through the REST API only).
async fn trigger_listener(url: &str, auth: &NatsAuth) -> anyhow::Result<Option<atasira_platform::bus::TopicListener>> {
    let listener = match auth {
        NatsAuth::Creds(creds) => match &creds.trigger_seed {
            Some(seed) => {
                NatsAuth::Creds(crate::nats_config::Creds { user_seed: seed.clone(), account_seed: None, xkey_seed: None, trigger_seed: None, ..creds.clone() })
            }
            None => {
                tracing::warn!(
                    "the runtime registry's NATS credentials hold no trigger listener key: event Boxes hear no NATS topic (events come through the REST API only); \
                     write new credentials with `atasira nats-config`"
                );
                return Ok(None);
            }
        },
        // Without credentials the registry's own connection may hear anything.
        NatsAuth::Insecure { ca_pem } => NatsAuth::Insecure { ca_pem: ca_pem.clone() },
    };
    let client = connect_nats(url, atasira_contracts::subjects::TRIGGER_LISTENER, &listener, true).await?;
    Ok(Some(atasira_platform::bus::TopicListener::new(client)))
}

/// `--nats-url`: one server, or several separated by commas (the nodes of a cluster; the
/// client also learns the others from the server it reaches).
pub fn server_addrs(url: &str) -> anyhow::Result<Vec<async_nats::ServerAddr>> {
    let addrs: Vec<async_nats::ServerAddr> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| u.parse::<async_nats::ServerAddr>().map_err(|e| anyhow::anyhow!("{u:?} is not a NATS server address: {e}")))
        .collect::<anyhow::Result<_>>()?;
    if addrs.is_empty() {
        anyhow::bail!("no NATS server address given");
    }
    Ok(addrs)
}

/// `--database-url`, else the URL in `--database-url-file` (trimmed; a file another user
/// may read is refused: it holds a password).
pub fn database_url(url: Option<String>, file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let Some(path) = file.filter(|_| url.is_none()) else { return Ok(url) };
    let text = crate::files::read_private(path, "database URL file", "a password")?;
    let url = text.trim();
    if url.is_empty() {
        anyhow::bail!("the database URL file {} is empty", path.display());
    }
    Ok(Some(url.to_owned()))
}

/// The database named by `--database-url`, else by `--data-dir` (a cluster process has both
/// set: its store is the database, its data dir holds managed files).
pub async fn open_db(data_dir: Option<&Path>, database_url: Option<&str>) -> anyhow::Result<Db> {
    match (data_dir, database_url) {
        (_, Some(url)) => Db::connect(url).await,
        (Some(dir), None) => {
            if !dir.exists() {
                anyhow::bail!("{} does not exist: start `atasira dev --data-dir {}` first or pass --database-url", dir.display(), dir.display());
            }
            Db::connect(&Db::sqlite_url(dir)).await
        }
        (None, None) => anyhow::bail!("pass --data-dir DIR (embedded) or --database-url URL (cluster)"),
    }
}
