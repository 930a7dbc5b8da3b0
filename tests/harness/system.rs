//! The product running, as a user starts it: embedded (`atasira dev`) or as a cluster of
//! processes on nats-server and PostgreSQL.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::binary::{OutputWithin, SUBPROCESS_LIMIT, atasira_bin};
use super::http::{Answer, http};
use super::nats::{Nats, creds_seed, nats_tls};
use super::postgres::Database;
use super::proc::{Proc, TempDir, listening_url};
use crate::fixtures::block_on;

/// Embedded (`atasira dev`) or cluster (`atasira serve ...` on NATS + PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Embedded,
    Cluster,
}

/// The service processes of cluster mode, besides the gateway.
pub const CLUSTER_SERVICES: &[&str] = &["drafts", "approval", "runtime-registry", "provisioner", "audit"];

/// The execution hosts a cluster has credentials for (`atasira nats-config --host`).
pub const HOSTS: &[&str] = &["h1", "h2"];

/// The example runner the repository ships.
pub fn example_runner() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runner/echo-runner.sh");
    std::fs::canonicalize(&path).unwrap_or(path).display().to_string()
}

/// Environment variable names are static strings in practice; tests pass literals.
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_owned().into_boxed_str())
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
        nats_tls(async_nats::ConnectOptions::with_nkey(self.nats_seed(identity)).custom_inbox_prefix(atasira_contracts::subjects::inbox_of(identity)))
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

    /// Cluster: starts execution host `name` (one of [`HOSTS`]: `atasira serve host`) with its
    /// own NATS credentials and nothing else (no database), the runner and settings in
    /// `extra_env` (`ATASIRA_RUNNER`); waits until it serves decisions. Embedded mode runs
    /// its host in `atasira dev` (`ATASIRA_RUNNER` at start): nothing to do.
    pub fn start_host(&mut self, name: &str, extra_env: &[(&str, String)]) {
        if self.mode == Mode::Embedded {
            return;
        }
        let mut env = vec![
            ("ATASIRA_NATS_URL", self.nats.as_ref().map(Nats::urls).unwrap_or_default()),
            ("ATASIRA_NATS_CREDS", self.nats_creds(&format!("host-{name}")).display().to_string()),
            ("RUST_LOG", "info".to_owned()),
        ];
        env.extend(extra_env.iter().map(|(k, v)| (leak(k), v.clone())));
        let args = ["serve", "host", "--name", name, "--metrics-listen", "127.0.0.1:0"];
        let mut p = Proc::spawn(&format!("atasira serve host {name}"), &atasira_bin(), &args, &env);
        p.wait_stderr("execution host: decisions on", Duration::from_secs(30));
        self.procs.push(p);
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

    /// Where the CLI runs: a directory of this system's own, so that nothing a command
    /// writes relative to it lands in the repository.
    pub fn cli_dir(&self) -> PathBuf {
        self.dir.0.join("cwd")
    }

    /// Runs the binary with `args` in [`System::cli_dir`]; (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let cwd = self.cli_dir();
        std::fs::create_dir_all(&cwd).expect("the CLI's directory");
        let mut cmd = Command::new(atasira_bin());
        cmd.current_dir(&cwd).args(args).env_remove("ATASIRA_AUDIT_KEY").env_remove("ATASIRA_MANIFESTS_DIR");
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

    /// `atasira projections rebuild` on this system's store and the runtime-registry's
    /// manifest directory: (exit code, stdout, stderr).
    pub fn rebuild(&self) -> (i32, String, String) {
        let mut args = vec!["projections".to_owned(), "rebuild".to_owned()];
        args.extend(self.target_args());
        if self.mode == Mode::Cluster {
            args.extend(["--manifests-dir".to_owned(), self.data_dir().join("manifests").display().to_string()]);
        }
        self.cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
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

/// Runs `scenario` against both modes, embedded first.
pub fn in_both_modes(scenario: impl Fn(&mut System)) {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let mut sys = System::start(mode);
        scenario(&mut sys);
    }
}
