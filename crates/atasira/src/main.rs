//! `atasira`: the one binary (R-CLI-1): `dev` (embedded, every service in one process),
//! `serve <service>` (cluster), `nats-config` (R-ARCH-10), operator verbs on a data dir or
//! database (`tokens`, `projections rebuild`, `audit verify`, `keys rotate`), `bench drafts|workers|rebuild|idle|scale|soak`, offline verbs (`manifest
//! validate|context|feasibility`, `drafts preview`), and client verbs over REST (`workers`, `drafts`, `boxes`, `audit list`,
//! `audit verify` with `--url`, and `mcp`, the MCP server on stdio).
//!
//! One configuration per process: every setting is a clap argument with an `ATASIRA_*`
//! variable, parsed here and handed to the libraries as parameters (they never read the
//! environment; `tests/tidy.rs` checks it). Doc comments on the clap types are the help
//! users read: no spec ids there.

mod bench;
mod client;
mod db_roles;
mod decide;
mod files;
mod keys;
mod mcp;
mod nats_config;
mod offline;
mod operator;
mod otel;
mod probe;
mod services;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// atasira governs how AI employees ("Boxes") come into being and what they may do.
///
/// An agent or a person drafts a Box; only a human admin can approve it; an approved draft
/// becomes an active Box with its manifest, user assignments and provisioned access (git
/// workspaces, ssh and netrc entries). Every change is an event, and every decision is
/// recorded in a tamper-evident audit ledger.
///
/// Run everything in one process with `dev` (SQLite, no servers needed), or one service per
/// process with `serve <service>` on NATS and PostgreSQL (`nats-config` writes NATS's
/// configuration and each process's credentials). Operators issue tokens (`tokens`),
/// rebuild read models (`projections rebuild`), check the ledger (`audit verify`) and
/// rotate keys (`keys rotate`); `manifest` and `drafts preview` work offline; `bench
/// drafts` measures the draft path.
///
/// `drafts`, `boxes`, `workers` and `audit list` talk to a running gateway over its REST
/// API with a personal access token (--url/ATASIRA_BFF_URL, --token/ATASIRA_PAT); so does
/// `audit verify` when given --url instead of a data dir or database, and `mcp`, the MCP
/// server for AI agents (stdio).
///
/// Every setting is a flag or the ATASIRA_* environment variable shown next to it in the
/// command's --help. Logs go to stderr; RUST_LOG filters them (default: info).
/// The allocator: mimalloc instead of the C library's (ADR 0012: a command allocates many
/// small, short-lived buffers on several threads), for the C code linked in as well
/// (`override`: SQLite's allocations).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `--version` prints: a build without the release profile's optimizations says so.
const VERSION: &str = if cfg!(debug_assertions) { concat!(env!("CARGO_PKG_VERSION"), " (debug build)") } else { env!("CARGO_PKG_VERSION") };

#[derive(Debug, Parser)]
#[command(name = "atasira", version = VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every service in one process on SQLite and an in-process bus (no server needed).
    Dev {
        /// Where the event store, projections, keys and managed files live.
        #[arg(long, env = "ATASIRA_DATA_DIR", default_value = "./atasira-data")]
        data_dir: PathBuf,
        /// Address of the REST API.
        #[arg(long, env = "ATASIRA_LISTEN", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Serve the health probes and metrics on this address (off unless given): `GET
        /// /healthz` answers 200 while the process runs; `GET /readyz` answers 200 when
        /// every service can work, else 503 naming what failed; `GET /metrics` in the
        /// Prometheus text format. Port 0 picks a free port (printed on stderr). Keep it
        /// off the public network: its answers name internal errors.
        #[arg(long, env = "ATASIRA_METRICS_LISTEN", value_name = "ADDR")]
        metrics_listen: Option<SocketAddr>,
        /// The name of the execution host `dev` runs in-process when --runner is given.
        #[arg(long, env = "ATASIRA_HOST_NAME", value_name = "NAME", default_value = "local")]
        host_name: String,
        #[command(flatten)]
        host: HostArgs,
        #[command(flatten)]
        https: HttpsArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Run one service as its own process on NATS and PostgreSQL (cluster mode), or an
    /// execution host (`serve host --name NAME --runner CMD`) that runs Workers on NATS alone.
    Serve {
        /// The service to run, or `host`.
        service: services::ServiceName,
        /// The execution host's name (`serve host` only): its NATS credentials are
        /// host-NAME.creds (`atasira nats-config --host NAME`).
        #[arg(long, env = "ATASIRA_HOST_NAME", value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        host: HostArgs,
        /// NATS server (JetStream enabled), or the nodes of a NATS cluster separated by
        /// commas.
        #[arg(long, env = "ATASIRA_NATS_URL", hide_env_values = true, default_value = "tls://127.0.0.1:4222")]
        nats_url: String,
        #[command(flatten)]
        nats_auth: NatsAuthArgs,
        /// PostgreSQL database holding the shared event store (every service; an execution
        /// host has none).
        #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// File holding this process's PostgreSQL URL (`atasira db roles` writes one per
        /// process; readable by its owner only).
        #[arg(long, env = "ATASIRA_DATABASE_URL_FILE", value_name = "FILE")]
        database_url_file: Option<PathBuf>,
        /// Ed25519 signing key of the approval service (approval only): ID:HEX[,ID:HEX...]
        /// (64 hex digits each). The first key signs; the public keys of all of them are
        /// published in the event store at start (once; a published key stays published),
        /// so approvals they signed keep verifying. A bare HEX is the key "approval-1".
        #[arg(long, env = "ATASIRA_APPROVAL_KEY", hide_env_values = true, value_name = "KEYS")]
        approval_key: Option<String>,
        /// File holding the approval signing key setting (as --approval-key; approval only).
        #[arg(long, env = "ATASIRA_APPROVAL_KEY_FILE")]
        approval_key_file: Option<PathBuf>,
        /// MAC key of the audit ledger (audit only): ID:HEX[,ID:HEX...] (32+ bytes each).
        /// The first key MACs new rows and checkpoints; the others only verify, so rows
        /// they MACed stay verifiable. A bare HEX is the key "audit-1".
        #[arg(long, env = "ATASIRA_AUDIT_KEY", hide_env_values = true, value_name = "KEYS")]
        audit_key: Option<String>,
        /// Where managed files live (manifests, workspaces, ssh config, netrc).
        #[arg(long, env = "ATASIRA_DATA_DIR", default_value = "./atasira-data")]
        data_dir: PathBuf,
        /// Address of the REST API (gateway only).
        #[arg(long, env = "ATASIRA_LISTEN", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Serve this process's health probes and metrics on this address (off unless
        /// given): `GET /healthz` answers 200 while the process runs; `GET /readyz` answers
        /// 200 when it is connected to NATS, its database answers and none of its consumers
        /// is stuck, else 503 naming what failed; `GET /metrics` in the Prometheus text
        /// format. Port 0 picks a free port (printed on stderr). Keep it off the public
        /// network: its answers name internal errors. The gateway's REST address only says
        /// whether the system works (`GET /healthz`).
        #[arg(long, env = "ATASIRA_METRICS_LISTEN", value_name = "ADDR")]
        metrics_listen: Option<SocketAddr>,
        #[command(flatten)]
        https: HttpsArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Write a nats-server configuration, its TLS certificates and one NATS credentials file
    /// per process.
    ///
    /// Every process of cluster mode (gateway, drafts, approval, provisioner,
    /// runtime-registry, audit) gets its own key and may publish and subscribe only on the
    /// subjects it needs; anyone else is admitted by the gateway's auth callout (a PAT as
    /// the NATS token). Every connection is TLS, checked against a private CA (DIR/ca.pem,
    /// also inside every credentials file). Start NATS with `nats-server -c
    /// DIR/nats-server.conf` and each process with `atasira serve <service> --nats-creds
    /// DIR/<service>.creds --nats-url tls://HOST:4222`. Prints the files it wrote (never a
    /// key) on stderr.
    NatsConfig {
        /// Directory to write nats-server.conf and the <process>.creds files to (created
        /// if missing, made readable by its owner only).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Port nats-server listens on for clients.
        #[arg(long, value_name = "N", default_value_t = 4222)]
        port: u16,
        /// Where nats-server keeps JetStream data (default DIR/jetstream).
        #[arg(long, value_name = "D")]
        store_dir: Option<PathBuf>,
        /// A NATS cluster instead of one server: the route address (HOST:PORT) of every
        /// node, repeated or separated by commas (e.g. nats-1:6222,nats-2:6222,nats-3:6222).
        /// Writes nats-server-1.conf ... nats-server-N.conf, one per node in this order, each
        /// listening for routes on its own address (on all interfaces unless HOST is an IP)
        /// and keeping JetStream in D/atasira-<n>. Routes authenticate with a password kept
        /// in those files, which are therefore readable by their owner only.
        #[arg(long = "route", value_name = "HOST:PORT", value_delimiter = ',', num_args = 1)]
        routes: Vec<String>,
        /// A host name or IP address clients reach NATS by, for the servers' TLS
        /// certificates (repeated or separated by commas; localhost, 127.0.0.1, ::1 and
        /// each node's --route host are always in).
        #[arg(long = "tls-host", value_name = "HOST", value_delimiter = ',', num_args = 1)]
        tls_hosts: Vec<String>,
        /// Where nats-server will read its certificate and key, if not from DIR (for
        /// example the directory a container mounts the configuration at). The files are
        /// written to DIR either way.
        #[arg(long, value_name = "PATH")]
        cert_dir: Option<PathBuf>,
        /// An execution host to write credentials for (DIR/host-NAME.creds, for `atasira
        /// serve host --name NAME`), repeated or separated by commas. A host may speak only
        /// as itself, and only to the runtime registry and the provisioner.
        #[arg(long = "host", value_name = "NAME", value_delimiter = ',', num_args = 1)]
        hosts: Vec<String>,
        /// Replace a configuration already in DIR, with new keys for every process (each
        /// process then needs its new file, and nats-server the new configuration).
        #[arg(long)]
        force: bool,
    },
    /// Create the public events stream and the audit sentinel's consumer on NATS, once,
    /// with the operator's credentials (run again to raise the stream's replicas).
    ///
    /// No process of the cluster may create, change or delete JetStream streams or
    /// consumers: run this after nats-server starts and before (or while) the services
    /// start; they wait for the stream. Prints what it did on stderr.
    NatsSetup {
        /// NATS server, or the nodes of a NATS cluster separated by commas.
        #[arg(long, env = "ATASIRA_NATS_URL", hide_env_values = true, default_value = "tls://127.0.0.1:4222")]
        nats_url: String,
        /// The operator's NATS credentials file, written by `atasira nats-config`
        /// (DIR/operator.creds). Required unless --insecure-nats.
        #[arg(long, env = "ATASIRA_NATS_CREDS", value_name = "FILE")]
        nats_creds: Option<PathBuf>,
        /// The CA certificate NATS's TLS certificate is checked against (PEM), instead of
        /// the one in the credentials file.
        #[arg(long, env = "ATASIRA_NATS_CA", value_name = "FILE")]
        nats_ca: Option<PathBuf>,
        /// Connect without credentials (a NATS server that authenticates nobody).
        #[arg(long, env = "ATASIRA_INSECURE_NATS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
        insecure_nats: bool,
        /// How many nats-servers keep a copy of the public events stream: 1 on a single
        /// server, 3 on a three-node cluster (then losing one node loses nothing). An
        /// existing stream is raised to this, never lowered.
        #[arg(long, env = "ATASIRA_STREAM_REPLICAS", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
        stream_replicas: u8,
        /// Give up after this many seconds if NATS does not answer.
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        timeout: u64,
    },
    /// Check the audit ledger's hash chain and signed checkpoints (`verify`: on a data dir or
    /// database, or through a running gateway with --url), or list its rows over the REST
    /// API of a running gateway (`list`).
    #[command(subcommand)]
    Audit(client::AuditCommand),
    /// Prepare the database: tables and append-only triggers.
    #[command(subcommand)]
    Db(operator::DbCommand),
    /// Issue, list and revoke personal access tokens (PATs), for the REST API and NATS.
    #[command(subcommand)]
    Tokens(operator::TokensCommand),
    /// Maintain the read models (projections) built from the event store.
    #[command(subcommand)]
    Projections(operator::ProjectionsCommand),
    /// Rotate the approval or audit key: print the next key setting.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Measure this machine: submitting drafts (against a floor measured in the same run),
    /// launching Workers, rebuilding projections, and the CPU idle services use. Prints
    /// figures and targets.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Work with BoxManifest YAML files offline (no server needed).
    #[command(subcommand)]
    Manifest(ManifestCommand),
    /// Work with Box drafts: `preview` works offline; the others go over the REST API of a
    /// running gateway and exit 0 when the API answered with success, 1 when it refused, 2
    /// on a usage error, 3 when the gateway could not be reached.
    #[command(subcommand)]
    Drafts(DraftsCommand),
    /// List, show and look after Boxes, over the REST API of a running gateway. Exit 0 when
    /// the API answered with success, 1 when it refused, 2 on a usage error, 3 when the
    /// gateway could not be reached.
    #[command(subcommand)]
    Boxes(client::BoxesCommand),
    /// Launch, show and list the Workers of Boxes, over the REST API of a running gateway.
    /// Exit 0 when the API answered with success, 1 when it refused, 2 on a usage error, 3
    /// when the gateway could not be reached.
    #[command(subcommand)]
    Workers(client::WorkersCommand),
    /// Send a notification from inside a Worker: reads {"channel": "email"|"line", "to":
    /// [...], "broadcast": false, "subject", "body"} JSON on stdin; the execution host
    /// decides it against the Box's notify settings and the audit service delivers it. Exit
    /// 0 when accepted, 2 when denied, 1 when it could not be handed over.
    Notify {
        /// The execution host's decision endpoint (set for a Worker by its host).
        #[arg(long, env = "ATASIRA_DECIDE_URL", value_name = "URL", hide_env_values = true)]
        url: Option<String>,
        /// The Worker's credential at its host (set for a Worker by its host).
        #[arg(long, env = "ATASIRA_WORKER_TOKEN", value_name = "TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Seconds to wait for the host's answer.
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        timeout: u64,
    },
    /// Decide a tool call before it runs: reads {"tool", "input"} JSON (or an agent CLI's
    /// pre-tool-use hook input, {"tool_name", "tool_input"}) on stdin, prints the decision
    /// ({"decision": "allow|deny|ask", "rule", "reason"}) and exits 0 when allowed, 2
    /// otherwise with the reason on stderr. Inside a Worker it asks the execution host that
    /// runs it (which records denials); elsewhere pass --manifest. Any failure to decide is
    /// a denial.
    Decide {
        /// Judge against this manifest YAML file instead of asking an execution host.
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
        /// The workspace the manifest's Worker would run in (default: the current
        /// directory; with --manifest only).
        #[arg(long, value_name = "DIR", requires = "manifest")]
        workspace: Option<PathBuf>,
        /// The execution host's decision endpoint (set for a Worker by its host).
        #[arg(long, env = "ATASIRA_DECIDE_URL", value_name = "URL", hide_env_values = true)]
        url: Option<String>,
        /// The Worker's credential at its host (set for a Worker by its host).
        #[arg(long, env = "ATASIRA_WORKER_TOKEN", value_name = "TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Seconds to wait for the host's answer (a call that needs a human admin waits for
        /// the decision).
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
    /// See and decide the tool calls Workers wait to make until a human admin decides, over
    /// the REST API of a running gateway. Exit 0 when the API answered with success, 1 when
    /// it refused, 2 on a usage error, 3 when the gateway could not be reached.
    #[command(subcommand)]
    ToolRequests(client::ToolRequestsCommand),
    /// Tell approvers of every decision waiting for them: register, list and remove
    /// webhooks (signed HTTP POSTs, Slack-compatible if asked) and see their deliveries,
    /// over the REST API of a running gateway. Exit 0 when the API answered with success, 1
    /// when it refused, 2 on a usage error, 3 when the gateway could not be reached.
    #[command(subcommand)]
    Webhooks(client::WebhooksCommand),
    /// The organisation's own rules in Cedar: show the version in force, publish a new one
    /// from a file, or dry-run one against today's pending drafts and Boxes, over the REST
    /// API of a running gateway. Exit 0 when the API answered with success, 1 when it
    /// refused, 2 on a usage error, 3 when the gateway could not be reached.
    #[command(subcommand)]
    Policies(client::PoliciesCommand),
    /// Serve the Model Context Protocol on stdin/stdout, for AI agents and MCP clients.
    ///
    /// Eight tools, each one call of a running gateway's REST API with the given token:
    /// atasira_create_box_draft (the draft always waits for a human admin's approval),
    /// atasira_pending_drafts and atasira_pending_tool_requests (need role admin),
    /// atasira_list_boxes, atasira_feasibility, atasira_request_change,
    /// atasira_stop_worker (a human admin or the Box's primary) and atasira_get_draft
    /// (your own drafts). There is no approve or reject tool. A
    /// refusal of the API is a tool error that starts with its error code. Standard
    /// output carries the protocol only; logs go to stderr. The gateway also serves the
    /// same tools over streamable HTTP at /mcp (with the token as Bearer).
    Mcp(mcp::McpArgs),
}

/// How `serve` authenticates to NATS.
#[derive(Debug, Clone, Args)]
struct NatsAuthArgs {
    /// This process's NATS credentials file, written by `atasira nats-config` (e.g.
    /// DIR/drafts.creds for `serve drafts`; readable by its owner only). Required unless
    /// --insecure-nats.
    #[arg(long, env = "ATASIRA_NATS_CREDS", value_name = "FILE")]
    nats_creds: Option<PathBuf>,
    /// The CA certificate NATS's TLS certificate is checked against (PEM), instead of the
    /// one in the credentials file (or, with --insecure-nats, to use TLS at all).
    #[arg(long, env = "ATASIRA_NATS_CA", value_name = "FILE")]
    nats_ca: Option<PathBuf>,
    /// Connect to NATS without credentials when no --nats-creds is given. Unsafe: anyone who
    /// reaches NATS can then read, answer and forge requests; a warning is logged every
    /// minute.
    #[arg(long, env = "ATASIRA_INSECURE_NATS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    insecure_nats: bool,
}

/// How an execution host runs Workers.
#[derive(Debug, Clone, Args)]
struct HostArgs {
    /// The command that runs a Worker (`/bin/sh -c CMD`), in the Worker's workspace with a
    /// clean environment: on stdin the Box's agent context XML and the Worker's input
    /// (<input><segment kind="text">...</segment></input>, again for each later input); in
    /// ATASIRA_WORKER_ID, ATASIRA_DECIDE_URL and ATASIRA_WORKER_TOKEN how to ask before each
    /// tool call (`atasira decide` does). Its stderr is the Worker's log, its stdout its
    /// result, its exit status how it ended. For `dev`: without it no Worker runs (they
    /// stay `created`). Example: examples/runner/echo-runner.sh.
    #[arg(long, env = "ATASIRA_RUNNER", value_name = "CMD")]
    runner: Option<String>,
    /// Workers the host runs at once.
    #[arg(long, env = "ATASIRA_HOST_CAPACITY", value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    capacity: u32,
    /// How long a stopped Worker's runner has between SIGTERM and SIGKILL: 10s, 1m.
    #[arg(long, env = "ATASIRA_STOP_GRACE", value_name = "DURATION", default_value = "10s", value_parser = atasira_domain::worker::parse_ttl)]
    stop_grace: Duration,
}

impl HostArgs {
    /// The host's configuration, if a runner was given.
    fn config(&self, name: &str) -> Option<atasira_host::HostConfig> {
        let runner = self.runner.clone()?;
        // The runner finds `atasira` (for `atasira decide`) first on its PATH.
        let own_dir = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_string_lossy().into_owned()));
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_owned());
        Some(atasira_host::HostConfig {
            name: name.to_owned(),
            runner,
            capacity: self.capacity,
            stop_grace: self.stop_grace,
            decide_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            runner_path: own_dir.map_or(path.clone(), |d| format!("{d}:{path}")),
        })
    }
}

/// HTTPS for the REST API.
#[derive(Debug, Clone, Args)]
struct HttpsArgs {
    /// Serve the REST API over HTTPS with this certificate chain (PEM, the server's
    /// certificate first); needs --tls-key. Without, plain HTTP: keep it on loopback or
    /// behind a proxy that terminates TLS.
    #[arg(long, env = "ATASIRA_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM; readable by its owner only).
    #[arg(long, env = "ATASIRA_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl HttpsArgs {
    fn server_config(&self) -> anyhow::Result<Option<std::sync::Arc<services::ServerTls>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => tls::server_config(cert, key).map(Some),
            _ => Ok(None),
        }
    }
}

/// Settings shared by `dev` and `serve`.
#[derive(Debug, Clone, Args)]
struct CommonArgs {
    /// Seconds a write waits for the read models it affects, so the next read sees it.
    #[arg(long, env = "ATASIRA_CONSISTENCY_WAIT", default_value_t = 5.0)]
    consistency_wait: f64,
    /// Where the manifest YAML files are written (default <data-dir>/manifests).
    #[arg(long, env = "ATASIRA_MANIFESTS_DIR")]
    manifests_dir: Option<PathBuf>,
    /// At most this many active Boxes.
    #[arg(long, env = "ATASIRA_MAX_BOXES", default_value_t = atasira_domain::aggregates::namespace::DEFAULT_MAX_BOXES)]
    max_boxes: usize,
    /// Pending drafts expire after this many seconds (default 7 days).
    #[arg(long, env = "ATASIRA_DRAFT_TTL", default_value_t = 604_800)]
    draft_ttl: i64,
    /// How many distinct human admins (none of them the requester) must approve a draft or
    /// change request that is over the limit; the Box is activated or changed at the last.
    /// Set where the drafts service runs: a draft keeps what was set when it was submitted.
    #[arg(long, env = "ATASIRA_OVER_LIMIT_APPROVALS", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    over_limit_approvals: u32,
    /// Seconds the gateway waits for a service to answer before 503.
    #[arg(long, env = "ATASIRA_REQUEST_TIMEOUT", default_value_t = 30.0)]
    request_timeout: f64,
    /// Requests a second each user may send to the REST API and the MCP server, on
    /// average (0: no limit); beyond, 429 with Retry-After.
    #[arg(long, env = "ATASIRA_RATE_LIMIT", value_name = "PER_SECOND", default_value_t = 50)]
    rate_limit: u32,
    /// Requests a user may send at once before its rate applies.
    #[arg(long, env = "ATASIRA_RATE_BURST", value_name = "N", default_value_t = 200)]
    rate_burst: u32,
    /// Milliseconds before the first retry of a failed access setup (git clone, ssh,
    /// netrc); each later retry waits twice as long, at most 30 s.
    #[arg(long, env = "ATASIRA_PROVISION_BACKOFF_MS", default_value_t = 1000)]
    provision_backoff_ms: u64,
    /// How long an execution binding the provisioner prepares for a Worker launch (its
    /// workspace and tool scope) stays usable before it expires unused: 600, 90s, 10m, 1h.
    #[arg(long, env = "ATASIRA_BINDING_TTL", value_name = "DURATION", default_value = "10m", value_parser = atasira_domain::worker::parse_ttl)]
    binding_ttl: Duration,
    /// How long an execution host holds its Workers after its last heartbeat: a host not
    /// heard from for this long loses them (they end `lost` and never run again): 10s, 1m.
    #[arg(long, env = "ATASIRA_HOST_LEASE", value_name = "DURATION", default_value = "10s", value_parser = atasira_domain::worker::parse_ttl)]
    host_lease: Duration,
    /// How long a Worker's tool call that needs a human admin waits for one; then it is
    /// denied: 5m, 30s, 1h.
    #[arg(long, env = "ATASIRA_ASK_TTL", value_name = "DURATION", default_value = "5m", value_parser = atasira_domain::worker::parse_ttl)]
    ask_ttl: Duration,
    /// Workers an event-triggered Box may have running at once, counting every Worker its
    /// schedule or events started that has not ended; an event beyond is refused and
    /// recorded, not queued.
    #[arg(long, env = "ATASIRA_TRIGGER_IN_FLIGHT", value_name = "N", default_value_t = atasira_domain::trigger::IN_FLIGHT, value_parser = clap::value_parser!(usize))]
    trigger_in_flight: usize,
    /// The dashboard's address as approvers reach it: links in webhook deliveries and
    /// announcements start there.
    #[arg(long, env = "ATASIRA_PUBLIC_URL", value_name = "URL", default_value = "http://127.0.0.1:8080")]
    public_url: String,
    /// Where the secrets of Boxes' notifications are: `<dir>/<vault>/<item>.json`, named by
    /// a manifest's `notify.<channel>.vault` and `.item` (default: `<data-dir>/secrets`).
    #[arg(long, env = "ATASIRA_SECRETS_DIR", value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
    /// Attempts at a webhook delivery, the first included; then it is given up (listed as
    /// dead and recorded on the audit ledger).
    #[arg(long, env = "ATASIRA_WEBHOOK_ATTEMPTS", value_name = "N", default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=50))]
    webhook_attempts: u32,
    /// The wait after a webhook delivery's first failure; it doubles after each (at most
    /// 10m): 2s, 500ms, 1m.
    #[arg(long, env = "ATASIRA_WEBHOOK_BACKOFF", value_name = "DURATION", default_value = "2s", value_parser = atasira_domain::worker::parse_ttl)]
    webhook_backoff: Duration,
    /// Testing only: seconds an unfinished Idempotency-Key claim holds before a retry may
    /// take it over and redo the work (default: three request timeouts, the consistency
    /// wait and 6 s, longer than any request can take). Shorter lets a retry redo work that
    /// is still running.
    #[arg(long, env = "ATASIRA_IDEMPOTENCY_LEASE", value_name = "SECONDS", help_heading = "Testing")]
    idempotency_lease: Option<f64>,
    #[command(flatten)]
    hooks: TestHooks,
}

/// The fault-injection hooks of the crash and race tests, in a build made for tests
/// (`--features failpoints`).
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, Args)]
struct TestHooks {
    /// Test builds only: kill the process (SIGKILL) when it reaches one of these points
    /// (comma separated), to prove that nothing committed before is lost.
    #[arg(long, env = "ATASIRA_FAILPOINT", value_name = "POINT", value_delimiter = ',', help_heading = "Testing")]
    failpoint: Vec<String>,
    /// Test builds only: pause at a point for some milliseconds (NAME:MILLIS, comma
    /// separated), to force an interleaving.
    #[arg(long, env = "ATASIRA_FAILPOINT_DELAY", value_name = "NAME:MILLIS", value_delimiter = ',', help_heading = "Testing")]
    failpoint_delay: Vec<atasira_platform::failpoints::FailpointDelay>,
    /// Test builds only: hold at a point while the test has armed it (NAME:DIRECTORY,
    /// comma separated; see tests/harness/binary.rs `Hold`), to force an interleaving.
    #[arg(long, env = "ATASIRA_FAILPOINT_HOLD", value_name = "NAME:DIR", value_delimiter = ',', help_heading = "Testing")]
    failpoint_hold: Vec<atasira_platform::failpoints::FailpointHold>,
    /// Test builds only: the schedules' clock is the time in this file (RFC 3339), so a
    /// test moves time instead of waiting for it; the real clock while it is unreadable.
    #[arg(long, env = "ATASIRA_TEST_CLOCK", value_name = "FILE", help_heading = "Testing")]
    test_clock: Option<std::path::PathBuf>,
}

/// A build for use has no fault-injection hooks: the settings are still accepted, so that
/// a leftover one does not stop a process from starting, but they arm nothing and are not
/// in --help.
#[cfg(not(feature = "failpoints"))]
#[derive(Debug, Clone, Args)]
struct TestHooks {
    #[arg(long, env = "ATASIRA_FAILPOINT", hide = true, action = clap::ArgAction::Append)]
    failpoint: Vec<String>,
    #[arg(long, env = "ATASIRA_FAILPOINT_DELAY", hide = true, action = clap::ArgAction::Append)]
    failpoint_delay: Vec<String>,
    #[arg(long, env = "ATASIRA_FAILPOINT_HOLD", hide = true, action = clap::ArgAction::Append)]
    failpoint_hold: Vec<String>,
    #[arg(long, env = "ATASIRA_TEST_CLOCK", hide = true)]
    test_clock: Option<String>,
}

impl TestHooks {
    /// Arms the fault-injection hooks of this process (none unless a test asks).
    #[cfg(feature = "failpoints")]
    fn configure(&self) {
        if !self.failpoint.is_empty() || !self.failpoint_delay.is_empty() || !self.failpoint_hold.is_empty() {
            let pauses: Vec<String> = self.failpoint_delay.iter().map(|d| format!("{}:{}", d.point, d.delay.as_millis())).collect();
            let holds: Vec<&str> = self.failpoint_hold.iter().map(|h| h.point.as_str()).collect();
            eprintln!("atasira: testing hooks armed: kill at {:?}, pause at {:?}, hold at {:?}", self.failpoint, pauses, holds);
        }
        let failpoints = atasira_platform::failpoints::Failpoints {
            kill: self.failpoint.clone(),
            delay: self.failpoint_delay.clone(),
            hold: self.failpoint_hold.clone(),
            clock: self.test_clock.clone(),
        };
        // Only `main` calls this, once; a second call could only repeat the same values.
        let _ = atasira_platform::failpoints::configure(failpoints);
    }

    /// This build arms nothing; a hook asked for anyway is named on stderr, then ignored.
    #[cfg(not(feature = "failpoints"))]
    fn configure(&self) {
        for (set, setting) in [
            (!self.failpoint.is_empty(), "ATASIRA_FAILPOINT (--failpoint)"),
            (!self.failpoint_delay.is_empty(), "ATASIRA_FAILPOINT_DELAY (--failpoint-delay)"),
            (!self.failpoint_hold.is_empty(), "ATASIRA_FAILPOINT_HOLD (--failpoint-hold)"),
            (self.test_clock.is_some(), "ATASIRA_TEST_CLOCK (--test-clock)"),
        ] {
            if set {
                eprintln!("atasira: warning: {setting} is set, but this build has no test hooks; ignored");
            }
        }
    }
}

impl CommonArgs {
    fn settings(&self, data_dir: PathBuf) -> services::Settings {
        let secrets_dir = self.secrets_dir.clone().unwrap_or_else(|| data_dir.join("secrets"));
        services::Settings {
            data_dir,
            manifests_dir: self.manifests_dir.clone(),
            max_boxes: self.max_boxes,
            draft_ttl: chrono::TimeDelta::try_seconds(self.draft_ttl.max(1)).unwrap_or(chrono::TimeDelta::days(7)),
            over_limit_approvals: self.over_limit_approvals,
            gateway: atasira_gateway::Config {
                consistency_wait: Duration::from_secs_f64(self.consistency_wait.clamp(0.0, 60.0)),
                request_timeout: Duration::from_secs_f64(self.request_timeout.clamp(0.1, 300.0)),
                idempotency_lease: self.idempotency_lease.map(|s| Duration::from_secs_f64(s.clamp(0.1, 86_400.0))),
                rate: std::num::NonZeroU32::new(self.rate_limit)
                    .map(|per_second| atasira_gateway::ratelimit::Rate { per_second, burst: std::num::NonZeroU32::new(self.rate_burst).unwrap_or(per_second) }),
                ..Default::default()
            },
            provision_backoff: Duration::from_millis(self.provision_backoff_ms),
            binding_ttl: self.binding_ttl,
            host_lease: self.host_lease,
            ask_ttl: self.ask_ttl,
            trigger_in_flight: self.trigger_in_flight.max(1),
            notifier: atasira_audit::NotifierConfig {
                public_url: self.public_url.clone(),
                retry: atasira_domain::notify::RetryPolicy { attempts: self.webhook_attempts, backoff: self.webhook_backoff },
                on_bus: false,
                secrets_dir,
            },
            host: None,
        }
    }
}

/// Where a cluster benchmark finds NATS and PostgreSQL.
#[derive(Debug, Args)]
struct BenchClusterArgs {
    /// NATS server (JetStream enabled).
    #[arg(long, env = "ATASIRA_NATS_URL", hide_env_values = true, default_value = "tls://127.0.0.1:4222")]
    nats_url: String,
    /// A PostgreSQL database the benchmark may write to (use a throwaway one: events stay).
    #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Directory of credentials written by `atasira nats-config` (for the NATS server
    /// at --nats-url): each process of the benchmark connects with its own, so the
    /// authenticated topology is measured. Without it every connection is anonymous.
    #[arg(long, env = "ATASIRA_NATS_CREDS_DIR", value_name = "DIR")]
    nats_creds_dir: Option<PathBuf>,
}

impl From<BenchClusterArgs> for bench::ClusterOptions {
    fn from(a: BenchClusterArgs) -> Self {
        bench::ClusterOptions { nats_url: a.nats_url, creds_dir: a.nats_creds_dir, database_url: a.database_url }
    }
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Submitting drafts: the drafts command path against a raw NATS + PostgreSQL floor,
    /// REST submit with read-your-writes in cluster mode, and REST submit on the embedded
    /// system `atasira dev` runs; prints the figures, their ratios and the targets.
    ///
    /// The cluster part runs the gateway and the services a submit waits for (drafts,
    /// runtime-registry, audit) in this process, each with its own database role and pool
    /// (`db roles`: the --database-url role must be able to create roles) and NATS
    /// connection; the embedded part starts every service on SQLite in a fresh temporary
    /// data dir.
    Drafts {
        /// NATS server (JetStream enabled).
        #[arg(long, env = "ATASIRA_NATS_URL", hide_env_values = true, default_value = "tls://127.0.0.1:4222")]
        nats_url: String,
        /// A PostgreSQL database the benchmark may write to (use a throwaway one: events
        /// stay). Not needed with --embedded-only.
        #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true, required_unless_present = "embedded_only")]
        database_url: Option<String>,
        /// Directory of credentials written by `atasira nats-config` (for the NATS server
        /// at --nats-url): each process of the benchmark connects with its own, so the
        /// authenticated topology is measured. Without it every connection is anonymous.
        #[arg(long, env = "ATASIRA_NATS_CREDS_DIR", value_name = "DIR")]
        nats_creds_dir: Option<PathBuf>,
        /// Only the embedded part (REST submit on SQLite, every service in this process):
        /// needs neither NATS nor PostgreSQL.
        #[arg(long)]
        embedded_only: bool,
        /// Requests in flight in the concurrent runs.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Requests per concurrent run (a quarter of it, at least 50, at concurrency 1).
        #[arg(long, default_value_t = 2000)]
        count: usize,
    },
    /// Launching and running Workers: the one request a browser makes (`POST
    /// /api/v1/boxes/{box_id}/workers`, answered once the read models hold the Worker),
    /// each with a fresh launch_id on one active Box; prints p50 and p99 at c=1 and at
    /// --concurrency. Then the decision before a tool call in-process (decisions per
    /// second, p50 against reading the call, p99) and launch-to-running with an in-process
    /// execution host (p50, p99).
    ///
    /// The embedded part starts every service on SQLite in a fresh temporary data dir; with
    /// a database URL, the cluster part then runs the gateway and the five services in this
    /// process, each with its own database role and pool (`db roles`: the --database-url
    /// role must be able to create roles) and NATS connection.
    Workers {
        /// NATS server (JetStream enabled), for the cluster part.
        #[arg(long, env = "ATASIRA_NATS_URL", hide_env_values = true, default_value = "tls://127.0.0.1:4222")]
        nats_url: String,
        /// A PostgreSQL database the cluster part may write to (use a throwaway one: events
        /// stay). Without it only the embedded part runs. Only this flag selects it (not
        /// ATASIRA_DATABASE_URL), so a benchmark never writes to a database by accident.
        #[arg(long)]
        database_url: Option<String>,
        /// Directory of credentials written by `atasira nats-config` (for the NATS server
        /// at --nats-url): each process of the cluster part connects with its own. Without
        /// it every connection is anonymous.
        #[arg(long, env = "ATASIRA_NATS_CREDS_DIR", value_name = "DIR")]
        nats_creds_dir: Option<PathBuf>,
        /// Launches in flight in the concurrent runs.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Launches per concurrent run (a quarter of it, at least 50, at concurrency 1).
        #[arg(long, default_value_t = 400)]
        count: usize,
    },
    /// Rebuilding the drafts view and the Box view: seeds a store with N events, then
    /// times the rebuild of both and prints events per second, with where the time goes.
    Rebuild {
        /// How many events to seed (whole groups of 8: drafts submitted, approved,
        /// rejected and pending, a Box with a user and an access).
        #[arg(long, value_name = "N", default_value_t = 100_000)]
        events: usize,
        /// Seed and rebuild in this PostgreSQL database (a throwaway one: the events stay)
        /// instead of SQLite in a fresh temporary directory. Only this flag selects it (not
        /// ATASIRA_DATABASE_URL), so a benchmark never writes to a database by accident.
        #[arg(long)]
        database_url: Option<String>,
    },
    /// Idle cost: starts the five services as processes (`atasira serve`, fresh keys),
    /// waits until they answer, and prints the share of a CPU core each uses over a window
    /// without traffic (from /proc), then stops them.
    Idle {
        #[command(flatten)]
        cluster: BenchClusterArgs,
        /// Length of the measured window in seconds.
        #[arg(long, value_name = "S", default_value_t = 10)]
        seconds: u64,
    },
    /// How cost grows with the store: seeds a fresh PostgreSQL database with drafts to
    /// --small events, starts the five services and the gateway as processes, measures REST
    /// submit with read-your-writes and the first page of pending drafts at c=1; then seeds
    /// to --large events, starts them again and measures the same; prints the ratios, and
    /// that of a floor (GET /healthz) which shows how much the host changed speed meanwhile.
    Scale {
        #[command(flatten)]
        cluster: BenchClusterArgs,
        /// Stored events of the first measurement.
        #[arg(long, value_name = "N", default_value_t = 10_000)]
        small: usize,
        /// Stored events of the second measurement.
        #[arg(long, value_name = "N", default_value_t = 1_000_000)]
        large: usize,
        /// Requests per measured figure (more give a steadier median).
        #[arg(long, default_value_t = 1_000)]
        count: usize,
    },
    /// Memory over a long run: starts the five services and the gateway as processes,
    /// sends a warm-up of commands over REST, then a long run (drafts submitted with
    /// read-your-writes, every fourth rejected by an admin), and prints each process's
    /// resident memory after warm-up, at its peak and after the run.
    Soak {
        #[command(flatten)]
        cluster: BenchClusterArgs,
        /// Commands of the measured run.
        #[arg(long, value_name = "N", default_value_t = 100_000)]
        commands: usize,
        /// Commands of the warm-up, before the first reading.
        #[arg(long, value_name = "N", default_value_t = 5_000)]
        warm_up: usize,
        /// Requests in flight.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
}

#[derive(Debug, Subcommand)]
enum ManifestCommand {
    /// Validate a manifest. Exit 0 and {"manifest", "warnings"} when valid; exit 1 and
    /// {"errors", "warnings"} when invalid; exit 2 when the file is unreadable, over 1 MiB
    /// or not YAML.
    Validate {
        /// The manifest YAML file (`-` reads standard input).
        file: PathBuf,
    },
    /// Print the agent context XML of a manifest (what reaches the Box's system prompt).
    Context {
        /// The manifest YAML file (`-` reads standard input).
        file: PathBuf,
    },
    /// Check whether a task fits a Box's declared capabilities, or needs a new draft, as JSON.
    Feasibility {
        /// The manifest YAML file (`-` reads standard input).
        file: PathBuf,
        /// The task in plain words (English or Japanese).
        task_description: String,
    },
}

#[derive(Debug, Subcommand)]
enum DraftsCommand {
    /// Print what `POST /api/v1/boxes/box-drafts` would answer for a request body, as
    /// {"status": 201|403|422, "body": {...}}, without submitting anything.
    Preview {
        /// The BoxDraftCreateRequest JSON, inline or `-` to read standard input.
        #[arg(long = "json", value_name = "BODY")]
        json: String,
    },
    #[command(flatten)]
    Client(client::DraftsCommand),
}

fn main() -> ExitCode {
    // The matches too: `workers create` reads the order of its input flags from them, and
    // `audit verify` whether a setting came from the command line or the environment.
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let outcome = match cli.command {
        Command::Dev { data_dir, listen, metrics_listen, host_name, host, https, common } => {
            common.hooks.configure();
            run_traced(Some("atasira-dev"), async move {
                let listen = services::Listen { api: listen, tls: https.server_config()?, probes: metrics_listen };
                let mut settings = common.settings(data_dir);
                settings.host = host.config(&host_name);
                services::dev(settings, listen).await
            })
        }
        Command::Serve { service: services::ServiceName::Host, name, host, nats_url, nats_auth, metrics_listen, .. } => {
            let Some(name) = name else {
                return exit_usage("serve host needs --name NAME (its NATS credentials are host-NAME.creds)");
            };
            let Some(config) = host.config(&name) else {
                return exit_usage("serve host needs --runner CMD: the command that runs each Worker");
            };
            let identity = atasira_contracts::subjects::host_identity(&name);
            run_traced(Some(&format!("atasira-{identity}")), async move {
                let auth = services::NatsAuth::from_args(&identity, nats_auth.nats_creds.as_deref(), nats_auth.nats_ca.as_deref(), nats_auth.insecure_nats)?;
                services::serve_host(&nats_url, auth, config, metrics_listen).await
            })
        }
        Command::Serve {
            service,
            nats_url,
            nats_auth,
            database_url,
            database_url_file,
            approval_key,
            approval_key_file,
            audit_key,
            data_dir,
            listen,
            metrics_listen,
            https,
            common,
            ..
        } => {
            common.hooks.configure();
            let keys = services::ClusterKeys { approval: approval_key, approval_file: approval_key_file, audit: audit_key };
            let trace_as = format!("atasira-{}", service.identity());
            run_traced(Some(&trace_as), async move {
                let auth =
                    services::NatsAuth::from_args(service.identity(), nats_auth.nats_creds.as_deref(), nats_auth.nats_ca.as_deref(), nats_auth.insecure_nats)?;
                let listen = services::Listen { api: listen, tls: https.server_config()?, probes: metrics_listen };
                let database_url = services::database_url(database_url, database_url_file.as_deref())?
                    .ok_or_else(|| anyhow::anyhow!("the {} service needs its database: --database-url URL or --database-url-file FILE", service.identity()))?;
                services::serve(service, &nats_url, auth, &database_url, keys, listen, common.settings(data_dir)).await
            })
        }
        Command::NatsConfig { out, port, store_dir, routes, tls_hosts, cert_dir, hosts, force } => {
            nats_config::run(&nats_config::Options { out, port, store_dir, routes, tls_hosts, cert_dir, hosts, force })
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| format!("{e:#}"))
        }
        Command::NatsSetup { nats_url, nats_creds, nats_ca, insecure_nats, stream_replicas, timeout } => run_async(async move {
            let auth = services::NatsAuth::from_args(atasira_contracts::subjects::OPERATOR, nats_creds.as_deref(), nats_ca.as_deref(), insecure_nats)?;
            let setup = operator::nats_set_up(&nats_url, &auth, usize::from(stream_replicas));
            tokio::time::timeout(std::time::Duration::from_secs(timeout), setup)
                .await
                .map_err(|_| anyhow::anyhow!("NATS at {nats_url} did not answer within {timeout} s"))?
        }),
        Command::Audit(cmd) => {
            let sub = matches.subcommand().and_then(|(_, m)| m.subcommand()).map(|(_, m)| m);
            match client::audit(cmd, sub) {
                Ok(code) => Ok(code),
                Err(check) => run_async_code(operator::audit_verify(check.data_dir, check.database_url, check.audit_key)),
            }
        }
        Command::Db(cmd) => run_async(operator::db(cmd)),
        Command::Tokens(cmd) => run_async(operator::tokens(cmd)),
        Command::Projections(cmd) => run_async_code(operator::projections(cmd)),
        Command::Keys(cmd) => keys::keys(cmd).map(|()| ExitCode::SUCCESS).map_err(|e| format!("{e:#}")),
        Command::Bench(BenchCommand::Drafts { nats_url, database_url, nats_creds_dir, embedded_only, concurrency, count }) => {
            run_async(bench::drafts(bench::DraftsOptions {
                cluster: if embedded_only {
                    None
                } else {
                    database_url.map(|database_url| bench::ClusterOptions { nats_url, creds_dir: nats_creds_dir, database_url })
                },
                concurrency,
                count,
            }))
        }
        Command::Bench(BenchCommand::Workers { nats_url, database_url, nats_creds_dir, concurrency, count }) => {
            run_async(bench::workers(bench::WorkersOptions {
                cluster: database_url.map(|database_url| bench::ClusterOptions { nats_url, creds_dir: nats_creds_dir, database_url }),
                concurrency,
                count,
            }))
        }
        Command::Bench(BenchCommand::Rebuild { events, database_url }) => run_async(bench::rebuild(events, database_url.as_deref())),
        Command::Bench(BenchCommand::Idle { cluster, seconds }) => run_async(bench::idle(bench::IdleOptions { cluster: cluster.into(), seconds })),
        Command::Bench(BenchCommand::Scale { cluster, small, large, count }) => {
            run_async(bench::scale(bench::ScaleOptions { cluster: cluster.into(), small, large, count }))
        }
        Command::Bench(BenchCommand::Soak { cluster, commands, warm_up, concurrency }) => {
            run_async(bench::soak(bench::SoakOptions { cluster: cluster.into(), commands, warm_up, concurrency }))
        }
        Command::Manifest(ManifestCommand::Validate { file }) => offline::validate(&file),
        Command::Manifest(ManifestCommand::Context { file }) => offline::context(&file),
        Command::Manifest(ManifestCommand::Feasibility { file, task_description }) => offline::feasibility(&file, &task_description),
        Command::Drafts(DraftsCommand::Preview { json }) => offline::preview(&json),
        Command::Drafts(DraftsCommand::Client(cmd)) => Ok(client::drafts(cmd)),
        Command::Boxes(cmd) => Ok(client::boxes(cmd)),
        Command::Mcp(args) => run_async(mcp::serve(args)),
        Command::ToolRequests(cmd) => Ok(client::tool_requests(cmd)),
        Command::Webhooks(cmd) => Ok(client::webhooks(cmd)),
        Command::Policies(cmd) => Ok(client::policies(cmd)),
        Command::Notify { url, token, timeout } => Ok(decide::notify(url, token, Duration::from_secs(timeout.max(1)))),
        Command::Decide { manifest, workspace, url, token, timeout } => {
            let source = match (manifest, url, token) {
                (Some(file), _, _) => Some(decide::Source::Manifest { file, workspace }),
                (None, Some(url), Some(token)) => Some(decide::Source::Host { url, token }),
                _ => None,
            };
            Ok(decide::run(source, Duration::from_secs(timeout.max(1))))
        }
        Command::Workers(cmd) => {
            let sub = matches.subcommand().and_then(|(_, m)| m.subcommand()).map(|(_, m)| m);
            Ok(client::workers(cmd, sub))
        }
    };
    match outcome {
        Ok(code) => code,
        Err(message) => {
            eprintln!("atasira: {message}");
            ExitCode::from(2)
        }
    }
}

/// A usage mistake found after parsing: said on stderr, exit 2.
fn exit_usage(message: &str) -> ExitCode {
    eprintln!("atasira: {message}");
    ExitCode::from(2)
}

/// Like `run_async`, for commands that choose their exit code.
fn run_async_code(fut: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> Result<ExitCode, String> {
    let mut code = ExitCode::SUCCESS;
    run_async(async {
        code = fut.await?;
        Ok(())
    })?;
    Ok(code)
}

/// Runs an async command on a multi-threaded runtime with logs on stderr.
fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> Result<ExitCode, String> {
    run_traced(None, fut)
}

/// Like `run_async`; a process with a `service_name` also exports its spans over OTLP when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and starts no exporter otherwise).
fn run_traced(service_name: Option<&str>, fut: impl std::future::Future<Output = anyhow::Result<()>>) -> Result<ExitCode, String> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let provider = match service_name.filter(|_| otel::configured()).map(otel::provider).transpose() {
        Ok(provider) => provider,
        Err(e) => return Err(format!("cannot export traces: {e:#}")),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(provider.as_ref().map(otel::layer))
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| format!("cannot start the runtime: {e}"))?;
    let outcome = runtime.block_on(fut).map(|()| ExitCode::SUCCESS).map_err(|e| format!("{e:#}"));
    drop(runtime);
    // Sends the spans still in the batch.
    if let Some(provider) = provider
        && let Err(e) = provider.shutdown()
    {
        eprintln!("atasira: traces not all exported: {e}");
    }
    outcome
}
