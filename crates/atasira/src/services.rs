//! `atasira dev` (every service in one process, embedded) and `atasira serve <service>`
//! (one service per process, cluster). Both build a `Runtime` and run the same service
//! code; only the adapters differ (R-ARCH-7).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use atasira_domain::assertion::{AssertionKey, AssertionKeys};
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::bus::{InprocBus, NatsBus};
use atasira_platform::db::Db;
use atasira_platform::feed::FeedSource;
use atasira_platform::{auth, relay, Runtime};
use tokio::sync::watch;

/// Key id of the internal assertion key.
const INTERNAL_KEY_ID: &str = "internal-1";

/// Loads (or, first time, creates) the embedded internal key in the data dir.
fn embedded_key(data_dir: &Path) -> anyhow::Result<AssertionKeys> {
    let dir = data_dir.join("keys");
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let path = dir.join("internal.key");
    let hex_key = match std::fs::read_to_string(&path) {
        Ok(s) => s.trim().to_owned(),
        Err(_) => {
            let k = hex::encode(auth::random_secret());
            write_private(&path, &k)?;
            k
        }
    };
    keys_from_hex(&hex_key)
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

/// Parses a hex internal key (at least 32 bytes).
pub fn keys_from_hex(hex_key: &str) -> anyhow::Result<AssertionKeys> {
    let bytes = hex::decode(hex_key.trim()).context("the internal key must be hex")?;
    let key = AssertionKey::new(INTERNAL_KEY_ID, &bytes).map_err(|e| anyhow::anyhow!("internal key: {e}"))?;
    Ok(AssertionKeys::new(key, vec![]))
}

fn shutdown_channel() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(false)
}

async fn ctrl_c(tx: watch::Sender<bool>) {
    let _ = tokio::signal::ctrl_c().await;
    let _ = tx.send(true);
}

async fn wait(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// `atasira dev`.
pub async fn dev(data_dir: PathBuf, listen: SocketAddr, gateway: atasira_gateway::Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&data_dir).with_context(|| format!("failed to create {}", data_dir.display()))?;
    let db = Db::connect(&Db::sqlite_url(&data_dir)).await?;
    let rt = Runtime {
        db: db.clone(),
        bus: Arc::new(InprocBus::default()),
        feeds: FeedSource::Store { wake: Arc::new(tokio::sync::Notify::new()) },
        assertion_keys: Arc::new(embedded_key(&data_dir)?),
    };
    let first_start = !auth::has_tokens(&db).await?;
    let (tx, rx) = shutdown_channel();
    let drafts = tokio::spawn(atasira_drafts::run(rt.clone(), rx.clone()));
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("failed to listen on {listen}"))?;
    if first_start {
        let admin = auth::create_token(&db, &Principal::new("admin", Role::Admin, Kind::Human), None).await?;
        let agent = auth::create_token(&db, &Principal::new("agent", Role::Member, Kind::Agent), None).await?;
        println!("admin PAT: {admin}");
        println!("agent PAT: {agent}");
    }
    eprintln!("atasira dev: listening on http://{} (data in {})", listener.local_addr()?, data_dir.display());
    tokio::spawn(ctrl_c(tx));
    atasira_gateway::serve(listener, rt, gateway, wait(rx)).await?;
    drafts.await.context("drafts service panicked")??;
    Ok(())
}

/// What `atasira serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceName {
    Gateway,
    Drafts,
}

/// `atasira serve <service>`.
pub async fn serve(service: ServiceName, nats_url: &str, database_url: &str, internal_key: &str, listen: SocketAddr, gateway: atasira_gateway::Config) -> anyhow::Result<()> {
    let db = Db::connect(database_url).await?;
    let client = connect_nats(nats_url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let rt = Runtime { db: db.clone(), bus: Arc::new(NatsBus::new(client)), feeds: FeedSource::JetStream { js: js.clone() }, assertion_keys: Arc::new(keys_from_hex(internal_key)?) };
    let (tx, rx) = shutdown_channel();
    tokio::spawn(ctrl_c(tx));
    match service {
        ServiceName::Gateway => {
            let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("failed to listen on {listen}"))?;
            eprintln!("atasira gateway: listening on http://{}", listener.local_addr()?);
            atasira_gateway::serve(listener, rt, gateway, wait(rx)).await
        }
        ServiceName::Drafts => {
            let relay = tokio::spawn(relay::run(db, js, atasira_drafts::SERVICE, atasira_drafts::AGGREGATE_TYPES, rx.clone()));
            atasira_drafts::run(rt, rx).await?;
            let _ = relay.await;
            Ok(())
        }
    }
}

/// Connects to NATS, retrying for a while so services can start before the server.
async fn connect_nats(url: &str) -> anyhow::Result<async_nats::Client> {
    let options = async_nats::ConnectOptions::new().retry_on_initial_connect().connection_timeout(Duration::from_secs(5)).name("atasira");
    options.connect(url).await.with_context(|| format!("failed to connect to NATS at {url}"))
}

/// The database named by `--data-dir` or `--database-url`.
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
