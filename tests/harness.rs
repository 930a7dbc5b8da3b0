//! The system under test, started as a user would: the real binary, real servers.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Embedded (`atasira dev`) or cluster (`atasira serve ...` on NATS + PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Embedded,
    Cluster,
}

/// The `atasira` binary that cargo built next to this test. A binary older than a source
/// it is built from is refused: the tests would run yesterday's code and pass or fail for
/// it (run the suite with scripts/test, which builds it first).
pub fn atasira_bin() -> PathBuf {
    static CHECKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe.parent().and_then(Path::parent).expect("target dir");
            let bin = dir.join("atasira");
            assert!(bin.exists(), "{} is missing: run the suite with scripts/test (or cargo build -p atasira first)", bin.display());
            let built = std::fs::metadata(&bin).and_then(|m| m.modified()).expect("the binary's time");
            let root = crate::workspace_root();
            if let Some(newer) = newer_source(&[root.join("crates"), root.join("proto")], built) {
                panic!(
                    "{} is older than {}: the tests would run a stale binary; run the suite with scripts/test (or cargo build -p atasira --features atasira/failpoints first)",
                    bin.display(),
                    newer.display()
                );
            }
            bin
        })
        .clone()
}

/// A source of the binary (Rust, protobuf, a dashboard asset; not test code, which the
/// binary does not hold) under `dirs` changed after `than`.
fn newer_source(dirs: &[PathBuf], than: std::time::SystemTime) -> Option<PathBuf> {
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                // Crate-local test files do not go into the binary.
                if path.file_name().is_some_and(|n| n != "tests") {
                    stack.push(path);
                }
            } else if meta.modified().is_ok_and(|m| m > than) && is_binary_source(&path) {
                return Some(path);
            }
        }
    }
    None
}

fn is_binary_source(path: &Path) -> bool {
    let source = path.extension().and_then(|e| e.to_str()).is_some_and(|e| ["rs", "proto", "html", "js", "css"].contains(&e));
    source && path.file_name().is_some_and(|n| n != "tests.rs")
}

/// A failpoint the test holds (`ATASIRA_FAILPOINT_HOLD`): while armed, a process that
/// reaches the point says so and waits there until the test releases it. A race is then
/// forced by what the test does, not by how long it sleeps.
#[derive(Debug)]
pub struct Hold {
    point: &'static str,
    dir: TempDir,
}

impl Hold {
    pub fn new(point: &'static str) -> Hold {
        Hold { point, dir: TempDir::new("atasira-hold") }
    }

    /// The setting that makes a process honour this hold.
    pub fn setting(&self) -> (&'static str, String) {
        ("ATASIRA_FAILPOINT_HOLD", format!("{}:{}", self.point, self.dir.0.display()))
    }

    /// From now on a process reaching the point waits there.
    pub fn arm(&self) {
        let _ = std::fs::remove_file(self.dir.0.join("reached"));
        std::fs::write(self.dir.0.join("armed"), "").expect("arm the hold");
    }

    /// Waits until a process is held at the point (at most `limit`; the test fails then).
    pub fn wait_reached(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.dir.0.join("reached").exists() {
            assert!(Instant::now() < deadline, "nothing reached the failpoint {} within {limit:?}", self.point);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets every process held at the point go on (and later ones pass).
    pub fn release(&self) {
        let _ = std::fs::remove_file(self.dir.0.join("armed"));
    }
}

/// How long a command a test starts may run before the test fails instead of hanging.
pub const SUBPROCESS_LIMIT: Duration = Duration::from_secs(900);

/// `Command::output` with a bound: a command still running after `limit` is killed and the
/// test fails, naming it (a hung tool would otherwise hang the whole suite).
pub trait OutputWithin {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<std::process::Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<std::process::Output> {
        let child = self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let pid = child.id();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(child.wait_with_output());
        });
        match finished.recv_timeout(limit) {
            Ok(output) => output,
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                panic!("{self:?} ran longer than {limit:?}: killed");
            }
        }
    }
}

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the suite with scripts/test, which starts nats-server and PostgreSQL"))
}

/// A directory removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The service processes of cluster mode, besides the gateway.
pub const CLUSTER_SERVICES: &[&str] = &["drafts", "approval", "runtime-registry", "provisioner", "audit"];

/// Environment variable names are static strings in practice; tests pass literals.
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_owned().into_boxed_str())
}

/// A free TCP port on loopback (bound and released).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` different free TCP ports on loopback: all bound at once, then released (one at a
/// time, the system may hand out the same port twice).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("free port")).collect();
    held.iter().map(|l| l.local_addr().expect("bound").port()).collect()
}

/// A child process whose output lines are kept; killed on drop.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(name: &str, program: &Path, args: &[&str], envs: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(program);
        cmd.args(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Proc::spawn_command(name, cmd)
    }

    /// Starts `cmd` as it is (arguments, environment, working directory), output kept.
    pub fn spawn_command(name: &str, mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        for (pipe, sink) in [
            (child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), stdout.clone()),
            (child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), stderr.clone()),
        ] {
            if let Some(pipe) = pipe {
                std::thread::spawn(move || {
                    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                        if let Ok(mut s) = sink.lock() {
                            s.push(line);
                        }
                    }
                });
            }
        }
        Proc { name: name.to_owned(), child, stdout, stderr }
    }

    /// Waits until a line of stderr contains `needle`; returns that line.
    pub fn wait_stderr(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.stderr.lock().expect("lines").iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before printing {needle:?}; stderr:\n{}", self.name, self.stderr_text());
            }
            assert!(Instant::now() < deadline, "{} did not print {needle:?}; stderr:\n{}", self.name, self.stderr_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// The process id.
    pub fn child_id(&self) -> u32 {
        self.child.id()
    }

    /// SIGINT (a graceful stop) and wait for the exit.
    pub fn interrupt(&mut self) {
        let _ = Command::new("kill").arg("-INT").arg(self.child.id().to_string()).status();
        let _ = self.wait_exit(Duration::from_secs(20));
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- {} stderr ---\n{}", self.name, self.stderr_text());
        }
    }
}

/// The user nkey seed in a credentials file `atasira nats-config` wrote.
pub fn creds_seed(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines().skip_while(|l| l.trim() != "-----BEGIN USER NKEY SEED-----").skip(1);
    lines.next().map(|l| l.trim().to_owned()).unwrap_or_else(|| panic!("no user seed in {}", path.display()))
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
    _store: TempDir,
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
        let mut nats = Nats { nodes, _store: store_dir };
        nats.up();
        // The operator creates the events stream and the sentinel's consumer (no process
        // of the cluster may).
        let creds = creds_dir.join(format!("{}.creds", atasira_contracts::subjects::OPERATOR));
        let replicas = nats.nodes.len().min(3).to_string();
        let set_up = Command::new(atasira_bin())
            .args(["nats-setup", "--nats-url", &nats.urls(), "--stream-replicas", &replicas, "--timeout", "30"])
            .arg("--nats-creds")
            .arg(&creds)
            .output_within(SUBPROCESS_LIMIT)
            .expect("atasira nats-setup runs");
        assert!(set_up.status.success(), "atasira nats-setup failed: {}", String::from_utf8_lossy(&set_up.stderr));
        nats
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

/// A PostgreSQL server of one test's own, for tests that stop and start it (the shared
/// server of `scripts/test` serves every other test). Stopped and removed on drop.
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// The superuser's URL of the `postgres` database.
    pub admin_url: String,
}

impl PrivatePostgres {
    /// initdb in a temporary directory and start on a free loopback port.
    pub fn start() -> PrivatePostgres {
        let bin = PathBuf::from(required_env("ATASIRA_TEST_PG_BIN"));
        let dir = TempDir::new("atasira-pg");
        if Self::as_root() {
            // PostgreSQL refuses to run as root: the directory is its user's.
            let owned = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir.0).status().expect("chown runs");
            assert!(owned.success(), "chown of {} failed", dir.0.display());
        }
        let port = free_port();
        let pg = PrivatePostgres { port, admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"), dir, bin };
        let data = pg.dir.0.join("data");
        pg.run("initdb", &["-D", &data.to_string_lossy(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-locale"]);
        let conf = "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n";
        let mut file = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).expect("postgresql.conf");
        std::io::Write::write_all(&mut file, conf.as_bytes()).expect("configure");
        pg.up();
        pg
    }

    fn as_root() -> bool {
        Command::new("id").arg("-u").output_within(SUBPROCESS_LIMIT).map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
    }

    /// Runs one of PostgreSQL's programs (as `postgres` when we are root); it must succeed.
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bin.join(program);
        let mut command = if Self::as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let out = command.args(args).current_dir("/").stdin(Stdio::null()).output_within(SUBPROCESS_LIMIT).unwrap_or_else(|e| panic!("{program} runs: {e}"));
        assert!(out.status.success(), "{program} {args:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }

    /// Starts the server (again), on the same port; returns once it accepts connections.
    pub fn up(&self) {
        let (data, log) = (self.dir.0.join("data"), self.dir.0.join("postgres.log"));
        let port = format!("-p {}", self.port);
        self.run("pg_ctl", &["-D", &data.to_string_lossy(), "-l", &log.to_string_lossy(), "-o", &port, "-w", "-t", "60", "start"]);
    }

    /// Stops the server (fast shutdown: connections are told and closed).
    pub fn down(&self) {
        self.run("pg_ctl", &["-D", &self.dir.0.join("data").to_string_lossy(), "-m", "fast", "-w", "-t", "60", "stop"]);
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.dir.0.join("data");
        let mut command = if Self::as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(self.bin.join("pg_ctl"));
            c
        } else {
            Command::new(self.bin.join("pg_ctl"))
        };
        let _ = command
            .args(["-D", &data.to_string_lossy(), "-m", "immediate", "-w", "stop"])
            .current_dir("/")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A fresh PostgreSQL database, dropped on drop.
#[derive(Debug)]
pub struct Database {
    pub url: String,
    admin_url: String,
    name: String,
    /// Roles made for this database (`atasira db roles`), dropped with it.
    pub roles: Vec<String>,
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(f)
}

impl Database {
    pub fn create() -> Database {
        Database::create_at(&required_env("ATASIRA_TEST_DATABASE_URL"))
    }

    /// A fresh database on the server `admin_url` names (a [`PrivatePostgres`]).
    pub fn create_at(admin_url: &str) -> Database {
        let admin_url = admin_url.to_owned();
        let name = format!("atasira_t_{}", uuid::Uuid::new_v4().simple());
        block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&admin_url).await.expect("connect to the test PostgreSQL");
            sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create database");
        });
        let base = admin_url.rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap_or(admin_url.clone());
        Database { url: format!("{base}/{name}"), admin_url, name, roles: Vec::new() }
    }

    /// One role per process, as `atasira db roles` makes them (names unique to this
    /// database); each process's URL is in `dir/<process>.database-url`.
    pub fn make_roles(&mut self, dir: &Path) {
        let prefix = format!("atasira_{}_", &self.name[10..22]);
        let made = Command::new(atasira_bin())
            .args(["db", "roles", "--database-url", &self.url, "--role-prefix", &prefix, "--out"])
            .arg(dir)
            .env_remove("ATASIRA_DATABASE_URL")
            .output_within(SUBPROCESS_LIMIT)
            .expect("atasira db roles runs");
        assert!(made.status.success(), "atasira db roles failed: {}", String::from_utf8_lossy(&made.stderr));
        self.roles = atasira_contracts::subjects::IDENTITIES.iter().map(|i| format!("{prefix}{}", i.replace('-', "_"))).collect();
    }

    /// This database's URL for another role (`role@host`, no password: the test cluster
    /// trusts loopback connections).
    pub fn url_as(&self, role: &str) -> String {
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let host = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
        format!("{scheme}://{role}@{host}")
    }

    /// Runs statements in order on this database as `url` (the superuser's `self.url`, or
    /// [`Database::url_as`]); the first error is returned.
    pub fn run_as(&self, url: &str, statements: &[&str]) -> Result<(), String> {
        block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(url).await.map_err(|e| e.to_string())?;
            for statement in statements {
                sqlx::query(statement).execute(&mut conn).await.map_err(|e| format!("{statement}: {e}"))?;
            }
            Ok(())
        })
    }

    /// Runs statements on the whole PostgreSQL cluster (roles) as the superuser.
    pub fn run_on_cluster(&self, statements: &[&str]) -> Result<(), String> {
        self.run_as(&self.admin_url, statements)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let (url, name, roles) = (self.admin_url.clone(), self.name.clone(), self.roles.clone());
        let _ = std::thread::spawn(move || {
            block_on(async {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut conn).await;
                    for role in roles {
                        let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {role}")).execute(&mut conn).await;
                    }
                }
            })
        })
        .join();
    }
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub raw: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One HTTP request; non-2xx answers are answers, not errors.
pub fn http(method: &str, url: &str, token: Option<&str>, headers: &[(&str, &str)], body: Option<&[u8]>) -> Answer {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
    let mut req = agent.request(method, url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    // JSON unless the caller names another Content-Type.
    if body.is_some() && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
        req = req.set("Content-Type", "application/json");
    }
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let result = match body {
        Some(b) => req.send_bytes(b),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        // The server went away mid-request (crash tests): status 0.
        Err(e) => return Answer { status: 0, headers: vec![], body: Value::Null, raw: e.to_string() },
    };
    let status = response.status();
    let headers = response.headers_names().into_iter().filter_map(|n| response.header(&n).map(|v| (n.clone(), v.to_owned()))).collect();
    let raw = response.into_string().unwrap_or_default();
    let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
    Answer { status, headers, body, raw }
}

/// The product, running.
#[derive(Debug)]
pub struct System {
    pub mode: Mode,
    pub base_url: String,
    pub admin: String,
    pub agent: String,
    dir: TempDir,
    nats: Option<Nats>,
    /// Cluster: where `atasira nats-config` wrote nats-server.conf and each process's
    /// `<identity>.creds` (see `nats_seed`).
    pub nats_dir: Option<PathBuf>,
    database: Option<Database>,
    procs: Vec<Proc>,
    /// Cluster: processes per service (and gateways).
    replicas: usize,
}

impl System {
    pub fn start(mode: Mode) -> System {
        System::start_with(mode, &[])
    }

    /// Starts with extra environment for every process (settings such as a short TTL).
    pub fn start_with(mode: Mode, extra_env: &[(&str, String)]) -> System {
        let database = (mode == Mode::Cluster).then(Database::create);
        System::start_on(mode, database, 1, 1, true, extra_env)
    }

    /// Cluster: starts on a database the test prepared (roles, grants); `System` drops it.
    pub fn start_cluster_on(database: Database, extra_env: &[(&str, String)]) -> System {
        System::start_on(Mode::Cluster, Some(database), 1, 1, false, extra_env)
    }

    /// Cluster, scaled out: a cluster of `nats_nodes` nats-servers, and `replicas` processes
    /// of every service and of the gateway (`gateway_urls` lists the gateways).
    pub fn start_scaled(nats_nodes: usize, replicas: usize, extra_env: &[(&str, String)]) -> System {
        System::start_on(Mode::Cluster, Some(Database::create()), nats_nodes, replicas, true, extra_env)
    }

    /// With `roles`, every cluster process connects as its own database role (`atasira db
    /// roles`); otherwise as the test's database URL (or what `extra_env` says).
    fn start_on(mode: Mode, mut database: Option<Database>, nats_nodes: usize, replicas: usize, roles: bool, extra_env: &[(&str, String)]) -> System {
        let dir = TempDir::new("atasira-sys");
        if roles && let Some(db) = database.as_mut() {
            db.make_roles(&dir.0.join("db"));
        }
        let nats_dir = (mode == Mode::Cluster).then(|| dir.0.join("nats"));
        let nats = nats_dir.as_deref().map(|d| Nats::start_nodes(d, nats_nodes));
        let mut sys =
            System { mode, base_url: String::new(), admin: String::new(), agent: String::new(), dir, nats, nats_dir, database, procs: Vec::new(), replicas };
        sys.start_services(extra_env);
        match mode {
            Mode::Embedded => {
                // stdout and stderr are read by separate threads: the token lines may trail
                // the "listening" line on stderr.
                let deadline = Instant::now() + Duration::from_secs(30);
                while !sys.procs[0].stdout.lock().expect("lines").iter().any(|l| l.starts_with("agent PAT: ")) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let out = sys.procs[0].stdout.lock().expect("lines").clone();
                let pat = |prefix: &str| {
                    out.iter().find_map(|l| l.strip_prefix(prefix)).map(str::to_owned).unwrap_or_else(|| panic!("no {prefix:?} line in {out:?}"))
                };
                sys.admin = pat("admin PAT: ");
                sys.agent = pat("agent PAT: ");
            }
            Mode::Cluster => {
                sys.admin = sys.token("admin", "admin", "human");
                sys.agent = sys.token("agent", "member", "agent");
            }
        }
        sys
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    /// `--data-dir DIR` or `--database-url URL`.
    pub fn target_args(&self) -> Vec<String> {
        match &self.database {
            None => vec!["--data-dir".into(), self.data_dir().display().to_string()],
            Some(db) => vec!["--database-url".into(), db.url.clone()],
        }
    }

    /// Cluster: the database URL the process `identity` connects with: its own role's,
    /// when the system made roles.
    pub fn database_url_of(&self, identity: &str) -> String {
        let file = self.dir.0.join("db").join(format!("{identity}.database-url"));
        std::fs::read_to_string(file).map(|u| u.trim().to_owned()).unwrap_or_else(|_| self.database_url())
    }

    pub fn database_url(&self) -> String {
        match &self.database {
            None => format!("sqlite://{}?mode=rwc", self.data_dir().join("atasira.db").display()),
            Some(db) => db.url.clone(),
        }
    }

    pub fn nats(&mut self) -> &mut Nats {
        self.nats.as_mut().expect("cluster mode has NATS")
    }

    /// Cluster: where nats-server listens (`&self`, unlike `nats()`).
    pub fn nats_url(&self) -> String {
        self.nats.as_ref().expect("cluster mode has NATS").url()
    }

    /// Cluster: every NATS node's client URL, separated by commas.
    pub fn nats_urls(&self) -> String {
        self.nats.as_ref().expect("cluster mode has NATS").urls()
    }

    /// An envelope of `message` for `subject` (a request as the gateway sends it) with an
    /// assertion for the admin that the running gateway signed, through
    /// `POST /api/v1/auth/nats-assertion`: what someone who captured one holds. No test
    /// can mint one itself: only the gateway holds its signing key.
    pub fn gateway_signed<M: atasira_contracts::Named>(&self, subject: &str, message: &M, correlation_id: &str) -> atasira_contracts::Envelope {
        use prost::Message as _;
        let mut env = atasira_contracts::envelope(message, correlation_id, "");
        let binding = atasira_contracts::binding(subject, &env);
        let body = serde_json::json!({
            "subject": binding.subject,
            "message_type": binding.message_type,
            "payload_sha256": binding.payload_sha256.to_hex(),
            "correlation_id": binding.correlation_id,
        });
        let issued = http("POST", &self.url("/api/v1/auth/nats-assertion"), Some(&self.admin), &[], Some(body.to_string().as_bytes()));
        assert_eq!(issued.status, 200, "{}", issued.raw);
        let wire = hex::decode(issued.body["assertion_protobuf_hex"].as_str().expect("protobuf hex")).expect("hex");
        env.assertion = Some(atasira_contracts::v1::PrincipalAssertion::decode(&wire[..]).expect("an assertion"));
        env
    }

    /// Cluster: the credentials file `atasira nats-config` wrote for `identity`.
    pub fn nats_creds(&self, identity: &str) -> PathBuf {
        self.nats_dir.as_ref().expect("cluster mode has NATS credentials").join(format!("{identity}.creds"))
    }

    /// Cluster: a JetStream context connected to every NATS node as the process
    /// `identity` (its nkey and inbox prefix), for a test that reads or forges the feed.
    pub async fn jetstream_as(&self, identity: &str) -> async_nats::jetstream::Context {
        let urls: Vec<async_nats::ServerAddr> = self.nats_urls().split(',').map(|u| u.parse().expect("a NATS address")).collect();
        let client = self.nats_options(identity).connect(urls.as_slice()).await.unwrap_or_else(|e| panic!("connects as {identity}: {e}"));
        async_nats::jetstream::new(client)
    }

    /// Cluster: how the process `identity` connects to NATS (its nkey, its inbox prefix, TLS
    /// trusting the cluster's CA), for a test that connects as it.
    pub fn nats_options(&self, identity: &str) -> async_nats::ConnectOptions {
        nats_tls(async_nats::ConnectOptions::with_nkey(self.nats_seed(identity)).custom_inbox_prefix(atasira_contracts::subjects::inbox_prefix(identity)))
    }

    /// Cluster: the NATS CA certificate (`ca.pem`), for a client that is not ours.
    pub fn nats_ca(&self) -> PathBuf {
        self.nats_dir.as_ref().expect("cluster mode has NATS credentials").join("ca.pem")
    }

    /// Cluster: the user nkey seed of `identity`, for a test that connects as it.
    pub fn nats_seed(&self, identity: &str) -> String {
        creds_seed(&self.nats_creds(identity))
    }

    /// The environment of the cluster process `identity` (it connects with its own
    /// credentials), with `extra` on top.
    fn cluster_env(&self, identity: &str, extra: &[(&str, String)]) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("ATASIRA_NATS_URL", self.nats.as_ref().map(Nats::urls).unwrap_or_default()),
            ("ATASIRA_NATS_CREDS", self.nats_dir.as_ref().map(|_| self.nats_creds(identity).display().to_string()).unwrap_or_default()),
            ("ATASIRA_DATABASE_URL", self.database_url_of(identity)),
            ("ATASIRA_APPROVAL_KEY", "a1".repeat(32)),
            ("ATASIRA_AUDIT_KEY", "b2".repeat(32)),
            ("ATASIRA_DATA_DIR", self.data_dir().display().to_string()),
            ("ATASIRA_PROVISION_BACKOFF_MS", "10".into()),
            ("RUST_LOG", "info,sqlx=warn".into()),
        ];
        for (k, v) in extra {
            if let Some(slot) = env.iter_mut().find(|(name, _)| name == k) {
                slot.1 = v.clone();
            } else {
                env.push((leak(k), v.clone()));
            }
        }
        env
    }

    /// Starts every process of the mode; waits until the API answers.
    pub fn start_services(&mut self, extra_env: &[(&str, String)]) {
        let bin = atasira_bin();
        match self.mode {
            Mode::Embedded => {
                let data = self.data_dir().display().to_string();
                let mut env = vec![("RUST_LOG", "info,sqlx=warn".to_owned()), ("ATASIRA_PROVISION_BACKOFF_MS", "10".to_owned())];
                env.extend(extra_env.iter().map(|(k, v)| (*k, v.clone())));
                let args = ["dev", "--data-dir", &data, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"];
                let mut p = Proc::spawn("atasira dev", &bin, &args, &env);
                let line = p.wait_stderr("listening on http://", Duration::from_secs(30));
                self.base_url = listening_url(&line);
                self.procs.push(p);
            }
            Mode::Cluster => {
                for _ in 0..self.replicas {
                    for service in CLUSTER_SERVICES {
                        self.start_service(service, extra_env);
                    }
                }
                let first = self.procs.len();
                for _ in 0..self.replicas {
                    self.start_gateway(extra_env);
                }
                // The first gateway answers `base_url`.
                self.base_url = listening_url(&self.procs[first].wait_stderr("listening on http://", Duration::from_secs(1)));
            }
        }
        let ready = http("GET", &format!("{}/readyz", self.base_url), None, &[], None);
        assert_eq!(ready.status, 200, "readyz: {}", ready.raw);
    }

    /// Cluster: starts the gateway process; `base_url` follows its new port.
    pub fn start_gateway(&mut self, extra_env: &[(&str, String)]) {
        let env = self.cluster_env("gateway", extra_env);
        let args = ["serve", "gateway", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"];
        let mut g = Proc::spawn("atasira serve gateway", &atasira_bin(), &args, &env);
        let line = g.wait_stderr("listening on http://", Duration::from_secs(30));
        self.base_url = listening_url(&line);
        self.procs.push(g);
    }

    /// Events written behind the product's back ring no bell in embedded mode (PostgreSQL
    /// notifies on every commit); feeds look at the store at least every 2 s anyway.
    pub fn notify_store_changed(&self) {
        if self.mode == Mode::Embedded {
            std::thread::sleep(Duration::from_millis(2500));
        }
    }

    /// Cluster: starts (another) drafts service process.
    pub fn start_drafts(&mut self, extra_env: &[(&str, String)]) {
        self.start_service("drafts", extra_env);
    }

    /// Cluster: starts one service process (`atasira serve <service>`), waiting until it
    /// serves its subject.
    pub fn start_service(&mut self, service: &str, extra_env: &[(&str, String)]) {
        let env = self.cluster_env(service, extra_env);
        let mut p = Proc::spawn(&format!("atasira serve {service}"), &atasira_bin(), &["serve", service, "--metrics-listen", "127.0.0.1:0"], &env);
        p.wait_stderr("serving on", Duration::from_secs(30));
        self.procs.push(p);
    }

    /// The probe port (`--metrics-listen`) of the (first) process whose name contains
    /// `name` (`atasira dev` in embedded mode), as `http://ADDR`.
    pub fn probe_url(&mut self, name: &str) -> String {
        self.probe_url_of(name, 0)
    }

    /// Every gateway's base URL, oldest first.
    pub fn gateway_urls(&mut self) -> Vec<String> {
        let gateways = self.procs.iter_mut().filter(|p| p.name.contains("serve gateway"));
        gateways.map(|p| listening_url(&p.wait_stderr("listening on http://", Duration::from_secs(30)))).collect()
    }

    /// Cluster: the probe port of the `nth` (from 0, oldest first) process whose name contains
    /// `name`.
    pub fn probe_url_of(&mut self, name: &str, nth: usize) -> String {
        let p = self.procs.iter_mut().filter(|p| p.name.contains(name)).nth(nth).unwrap_or_else(|| panic!("no process {name} #{nth}"));
        listening_url(&p.wait_stderr("probes on http://", Duration::from_secs(30)))
    }

    /// The process whose name contains `name`.
    pub fn proc(&mut self, name: &str) -> &mut Proc {
        self.procs.iter_mut().find(|p| p.name.contains(name)).unwrap_or_else(|| panic!("no process {name}"))
    }

    /// SIGKILLs and forgets the first (oldest) process whose name contains `name`; its stderr.
    pub fn kill_oldest(&mut self, name: &str) -> String {
        let at = self.procs.iter().position(|p| p.name.contains(name)).unwrap_or_else(|| panic!("no process {name}"));
        let mut p = self.procs.remove(at);
        p.kill();
        p.stderr_text()
    }

    /// The stderr of every process whose name contains `name`, oldest first.
    pub fn stderr_of(&self, name: &str) -> Vec<String> {
        self.procs.iter().filter(|p| p.name.contains(name)).map(Proc::stderr_text).collect()
    }

    /// SIGKILLs and forgets the processes whose name contains `name`.
    pub fn kill(&mut self, name: &str) {
        for p in self.procs.iter_mut().filter(|p| p.name.contains(name)) {
            p.kill();
        }
        self.procs.retain(|p| !p.name.contains(name));
    }

    /// Stops everything and starts it again on the same data.
    pub fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// Restarts with extra environment (failpoints).
    pub fn restart_with(&mut self, extra_env: &[(&str, String)]) {
        for p in &mut self.procs {
            p.kill();
        }
        self.procs.clear();
        self.start_services(extra_env);
    }

    /// Stops every process gracefully (services write their final state, e.g. the audit
    /// checkpoint), then forgets them.
    pub fn stop_gracefully(&mut self) {
        // The gateway first, then the services, as an operator would.
        self.procs.sort_by_key(|p| !p.name.contains("gateway"));
        for p in &mut self.procs {
            p.interrupt();
        }
        self.procs.clear();
    }

    /// Runs the binary with `args`; (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = Command::new(atasira_bin());
        cmd.args(args).env_remove("ATASIRA_AUDIT_KEY");
        if self.mode == Mode::Cluster {
            cmd.env("ATASIRA_AUDIT_KEY", "b2".repeat(32));
        }
        let out = cmd.output_within(SUBPROCESS_LIMIT).expect("atasira runs");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// A new PAT via `atasira tokens create`.
    pub fn token(&self, user: &str, role: &str, kind: &str) -> String {
        let mut args = vec!["tokens", "create", "--user", user, "--role", role, "--kind", kind];
        let target = self.target_args();
        args.extend(target.iter().map(String::as_str));
        let (code, out, err) = self.cli(&args);
        assert_eq!(code, 0, "tokens create failed: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "tokens create prints the token alone: {out:?}");
        lines[0].to_owned()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    pub fn get(&self, path: &str, token: &str) -> Answer {
        http("GET", &self.url(path), Some(token), &[], None)
    }

    pub fn post(&self, path: &str, token: &str, body: &Value) -> Answer {
        http("POST", &self.url(path), Some(token), &[], Some(body.to_string().as_bytes()))
    }

    /// Submits a draft as the agent; its id.
    pub fn draft(&self, body: &Value) -> String {
        let a = self.post("/api/v1/boxes/box-drafts", &self.agent, body);
        assert_eq!(a.status, 201, "{}", a.raw);
        a.body["draft_id"].as_str().expect("draft_id").to_owned()
    }

    /// Approves as `token`.
    pub fn approve(&self, draft_id: &str, token: &str, confirm: bool) -> Answer {
        self.post(&format!("/api/v1/boxes/box-drafts/{draft_id}/approve"), token, &serde_json::json!({"confirm_over_limit": confirm}))
    }

    /// `atasira audit verify` on this system's store: (exit code, JSON).
    pub fn audit_verify(&self) -> (i32, Value) {
        let mut args = vec!["audit", "verify"];
        let target = self.target_args();
        args.extend(target.iter().map(String::as_str));
        let (code, out, err) = self.cli(&args);
        (code, serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("audit verify printed no JSON: {out} {err}")))
    }

    /// Cluster: the database (for tests that add roles).
    pub fn database(&self) -> &Database {
        self.database.as_ref().expect("cluster mode has a database")
    }

    /// Runs `statement` as the database superuser (or the owner of the SQLite file) would,
    /// to tamper with the audit ledger: with its append-only triggers off, then on again
    /// (PostgreSQL: `ALTER TABLE ... DISABLE TRIGGER USER` and `ENABLE` in one
    /// transaction; SQLite: `DROP TRIGGER`, then the service's own trigger DDL).
    pub fn tamper(&self, statement: &str) {
        match &self.database {
            Some(db) => {
                let statements =
                    ["BEGIN", "ALTER TABLE audit_ledger_rows DISABLE TRIGGER USER", statement, "ALTER TABLE audit_ledger_rows ENABLE TRIGGER USER", "COMMIT"];
                db.run_as(&db.url, &statements).unwrap_or_else(|e| panic!("tampering failed: {e}"));
            }
            None => {
                let drop = ["DROP TRIGGER audit_ledger_rows_append_only_update", "DROP TRIGGER audit_ledger_rows_append_only_delete"];
                for statement in drop.iter().chain([&statement]).chain(atasira_audit::SQLITE_LEDGER_TRIGGERS) {
                    self.sql(statement);
                }
            }
        }
    }

    /// Runs SQL on this system's database that must be refused; the error.
    pub fn sql_refused(&self, statement: &str) -> String {
        let url = self.database_url();
        block_on(async {
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&url).await.expect("database");
            match sqlx::query(statement).execute(&pool).await {
                Ok(_) => panic!("{statement} was not refused"),
                Err(e) => e.to_string(),
            }
        })
    }

    /// Runs SQL on this system's database (tampering tests).
    pub fn sql(&self, statement: &str) {
        let url = self.database_url();
        block_on(async {
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&url).await.expect("database");
            sqlx::query(statement).execute(&pool).await.unwrap_or_else(|e| panic!("{statement}: {e}"));
        });
    }

    /// Appends an event straight into the store, as an attacker with database access (or
    /// a bug) would: no aggregate decided it. `payload` is the event's JSON.
    pub fn append_raw_event(&self, aggregate_type: &str, aggregate_id: &str, sequence: i64, event_type: &str, payload: &str) {
        let payload = payload.replace('\'', "''");
        let values = match self.mode {
            Mode::Embedded => format!("'{payload}', '{{}}'"),
            Mode::Cluster => format!("CAST('{payload}' AS json), CAST('{{}}' AS json)"),
        };
        self.sql(&format!(
            "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) \
             VALUES ('{aggregate_type}', '{aggregate_id}', {sequence}, '{event_type}', '1', {values})"
        ));
    }

    /// One scalar from this system's database.
    pub fn sql_i64(&self, query: &str) -> i64 {
        let url = self.database_url();
        block_on(async {
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&url).await.expect("database");
            let row = sqlx::query(query).fetch_one(&pool).await.unwrap_or_else(|e| panic!("{query}: {e}"));
            sqlx::Row::try_get::<i64, _>(&row, 0).expect("an integer")
        })
    }

    /// One text from this system's database.
    pub fn sql_text(&self, query: &str) -> String {
        let url = self.database_url();
        block_on(async {
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&url).await.expect("database");
            let row = sqlx::query(query).fetch_one(&pool).await.unwrap_or_else(|e| panic!("{query}: {e}"));
            sqlx::Row::try_get::<String, _>(&row, 0).expect("text")
        })
    }

    /// `GET /box-drafts/pending` as the admin: the list.
    pub fn pending(&self) -> Vec<Value> {
        let a = self.get("/api/v1/boxes/box-drafts/pending?limit=200", &self.admin);
        assert_eq!(a.status, 200, "{}", a.raw);
        a.body["drafts"].as_array().cloned().unwrap_or_default()
    }

    /// Polls `pending()` until `pred` holds (events may take a moment after a crash).
    pub fn eventually_pending(&self, timeout: Duration, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            // Services may still be reconnecting: a 503 here is a reason to ask again.
            let a = self.get("/api/v1/boxes/box-drafts/pending?limit=200", &self.admin);
            let list = if a.status == 200 { a.body["drafts"].as_array().cloned().unwrap_or_default() } else { Vec::new() };
            if a.status == 200 && pred(&list) {
                return list;
            }
            assert!(Instant::now() < deadline, "pending list never matched; last answer {}: {}", a.status, a.raw);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The `http://ADDR` in a "listening on" or "probes on" line.
pub fn listening_url(line: &str) -> String {
    let start = line.find("http://").expect("url in line");
    let rest = &line[start..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    let url = &rest[..end];
    let _: SocketAddr = url.trim_start_matches("http://").parse().expect("socket address");
    url.to_owned()
}

/// Runs `scenario` against both modes, embedded first.
pub fn in_both_modes(scenario: impl Fn(&mut System)) {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let mut sys = System::start(mode);
        scenario(&mut sys);
    }
}
