//! nats-server for the tests (one, or a cluster), with the configuration and credentials
//! `atasira nats-config` writes, and how the tests' own clients connect to it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::binary::{OutputWithin, SUBPROCESS_LIMIT, atasira_bin};
use super::http::http;
use super::proc::{Proc, TempDir, free_ports, required_env};

/// The user nkey seed in a credentials file `atasira nats-config` wrote.
pub fn creds_seed(path: &Path) -> String {
    creds_block_seed(path, "USER NKEY SEED")
}

/// The seed in the `kind` block of a credentials file (`TRIGGER LISTENER USER NKEY SEED`:
/// the runtime registry's trigger listener).
pub fn creds_block_seed(path: &Path, kind: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let begin = format!("-----BEGIN {kind}-----");
    let mut lines = text.lines().skip_while(|l| l.trim() != begin).skip(1);
    lines.next().map(|l| l.trim().to_owned()).unwrap_or_else(|| panic!("no {kind} in {}", path.display()))
}

/// Every NATS CA certificate `atasira nats-config` made in this test process: clients of
/// the tests trust them all (each test's server has its own).
static NATS_CAS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// `options` that speak TLS only, trusting the CAs of the tests' NATS servers.
pub fn nats_tls(options: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    let cas = NATS_CAS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let mut roots = rustls::RootCertStore::empty();
    // A finished test's directory is gone: its CA with it.
    for pem in cas.iter().filter_map(|path| std::fs::read(path).ok()) {
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
            roots.add(cert).expect("a CA certificate nats-config wrote");
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    options.tls_client_config(config).require_tls(true)
}

/// How a NATS publisher connects: its PAT as the token, replies on its own inbox, over TLS.
pub fn pat_options(token: &str) -> async_nats::ConnectOptions {
    let hash = atasira_platform::auth::hash_token(token);
    nats_tls(async_nats::ConnectOptions::with_token(token.to_owned()).custom_inbox_prefix(atasira_contracts::subjects::client_inbox(&hash)))
}

/// `options` that also hand the server's errors (permission violations) to the receiver.
pub fn reporting_server_errors(options: async_nats::ConnectOptions) -> (async_nats::ConnectOptions, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let options = options.event_callback(move |event| {
        let tx = tx.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                let _ = tx.send(e.to_string());
            }
        }
    });
    (options, rx)
}

/// A nats-server with JetStream on a free port, authenticated (R-ARCH-10), or a cluster of
/// them (routes on loopback); its store is deleted on drop.
#[derive(Debug)]
pub struct Nats {
    nodes: Vec<NatsNode>,
    /// JetStream's store (kept across `down`/`up`, removed on drop).
    store: TempDir,
    /// Where `atasira nats-config` wrote the configuration and credentials.
    creds_dir: PathBuf,
}

#[derive(Debug)]
struct NatsNode {
    port: u16,
    /// The monitoring port (clusters: `/healthz` says when JetStream has its leader).
    monitor: Option<u16>,
    /// The configuration `atasira nats-config` wrote for this node.
    conf: PathBuf,
    proc: Option<Proc>,
}

impl Nats {
    /// With the configuration and credentials that `atasira nats-config` writes into
    /// `creds_dir` (R-ARCH-10): every connection authenticated, each identity with its own
    /// permissions; JetStream in a temporary directory.
    pub fn start_authenticated(creds_dir: &Path) -> Nats {
        Nats::start_nodes(creds_dir, 1)
    }

    /// `nodes` servers: one alone, or a cluster whose configurations `atasira nats-config
    /// --route ...` wrote (authenticated routes on loopback, JetStream clustered). Returns
    /// once every node's JetStream is healthy.
    pub fn start_nodes(creds_dir: &Path, nodes: usize) -> Nats {
        let store_dir = TempDir::new("atasira-nats");
        // Client, route and monitoring ports of every node, all different.
        let mut free = free_ports(3 * nodes).into_iter();
        let ports: Vec<u16> = free.by_ref().take(nodes).collect();
        let out = creds_dir.display().to_string();
        let store = store_dir.0.display().to_string();
        let mut args = vec!["nats-config".to_owned(), "--out".into(), out, "--port".into(), ports[0].to_string(), "--store-dir".into(), store];
        // Two execution hosts' credentials (`System::start_host`).
        for host in super::system::HOSTS {
            args.extend(["--host".to_owned(), (*host).to_owned()]);
        }
        if nodes > 1 {
            for _ in 0..nodes {
                args.extend(["--route".to_owned(), format!("127.0.0.1:{}", free.next().expect("a route port"))]);
            }
        }
        let generated = Command::new(atasira_bin()).args(&args).output_within(SUBPROCESS_LIMIT).expect("atasira nats-config runs");
        assert!(generated.status.success(), "atasira nats-config failed: {}", String::from_utf8_lossy(&generated.stderr));
        NATS_CAS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(creds_dir.join("ca.pem"));
        let conf = |n: usize| if nodes == 1 { creds_dir.join("nats-server.conf") } else { creds_dir.join(format!("nats-server-{n}.conf")) };
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, port)| NatsNode { port: *port, monitor: free.next().filter(|_| nodes > 1), conf: conf(i + 1), proc: None })
            .collect();
        let mut nats = Nats { nodes, store: store_dir, creds_dir: creds_dir.to_path_buf() };
        nats.up();
        nats.set_up();
        nats
    }

    /// `atasira nats-setup`: the operator creates the events stream and the sentinel's
    /// consumer (no process of the cluster may).
    pub fn set_up(&self) {
        let creds = self.creds_dir.join(format!("{}.creds", atasira_contracts::subjects::OPERATOR));
        let replicas = self.nodes.len().min(3).to_string();
        let set_up = Command::new(atasira_bin())
            .args(["nats-setup", "--nats-url", &self.urls(), "--stream-replicas", &replicas, "--timeout", "30"])
            .arg("--nats-creds")
            .arg(&creds)
            .output_within(SUBPROCESS_LIMIT)
            .expect("atasira nats-setup runs");
        assert!(set_up.status.success(), "atasira nats-setup failed: {}", String::from_utf8_lossy(&set_up.stderr));
    }

    /// SIGKILLs every node and deletes JetStream's store: what a crash of the host does to
    /// what the servers had not written to disk yet, at its worst. `up` and `set_up` again
    /// give an empty events stream.
    pub fn lose_store(&mut self) {
        self.down();
        std::fs::remove_dir_all(&self.store.0).expect("JetStream's store deleted");
        std::fs::create_dir_all(&self.store.0).expect("JetStream's store made again");
    }

    /// The (first) server's client URL (TLS).
    pub fn url(&self) -> String {
        format!("tls://127.0.0.1:{}", self.nodes[0].port)
    }

    /// The (first) server's port.
    pub fn port(&self) -> u16 {
        self.nodes[0].port
    }

    /// Every node's client URL, separated by commas (as `--nats-url` takes them).
    pub fn urls(&self) -> String {
        self.nodes.iter().map(|n| format!("tls://127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",")
    }

    /// Starts (again) every node that is down.
    pub fn up(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].proc.is_none() {
                self.up_node(i);
            }
        }
        for node in &self.nodes {
            if let Some(monitor) = node.monitor {
                wait_for_healthz(monitor);
            }
        }
    }

    /// Starts node `i` (from 0) on its port and store (the port is in the configuration
    /// of a single server; a cluster's nodes share theirs, so each gets its own here; the
    /// address is narrowed to loopback).
    pub fn up_node(&mut self, i: usize) {
        let bin = PathBuf::from(required_env("ATASIRA_TEST_NATS_SERVER"));
        let node = &mut self.nodes[i];
        let conf = node.conf.to_str().expect("utf-8 path").to_owned();
        let port = node.port.to_string();
        let mut args = vec!["-c", &conf, "-a", "127.0.0.1", "-p", &port];
        let monitor = node.monitor.map(|m| m.to_string());
        if let Some(m) = &monitor {
            args.extend(["-m", m]);
        }
        let mut proc = Proc::spawn(&format!("nats-server {}", i + 1), &bin, &args, &[]);
        // Ready when it says so: a port that answers may be another process's (ports are
        // picked free, then released, and a parallel test can take one in between; that
        // server then dies with "address already in use", which the panic shows).
        proc.wait_stderr("Server is ready", Duration::from_secs(10));
        node.proc = Some(proc);
    }

    /// SIGKILLs every node.
    pub fn down(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
    }

    /// SIGKILLs node `i` (from 0).
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].proc.take() {
            p.kill();
        }
    }
}

/// Waits until a nats-server's monitoring port says it is healthy (JetStream included).
fn wait_for_healthz(monitor: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = http("GET", &format!("http://127.0.0.1:{monitor}/healthz"), None, &[], None);
        if a.status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "nats-server (monitor {monitor}) not healthy: {}", a.raw);
        std::thread::sleep(Duration::from_millis(100));
    }
}
