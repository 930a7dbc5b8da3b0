//! The compose deployment, run as an operator would, without a container engine (R-OPS-1,
//! R-OPS-3): `docker-compose.yml` is read, and every atasira service's `command` runs with
//! its `environment` as a local process, variables resolved as compose resolves them.
//!
//! What stands in for the containers:
//! - each service gets a root directory of its own holding the directories the Dockerfile
//!   creates (its `install -d` lines); each named volume is a directory, linked into the
//!   roots of the services that mount it at their mount points; container paths in
//!   commands and environment are read inside the service's root;
//! - the hostnames `nats` and `postgres` are the local nats-server (started with the
//!   compose `nats` service's command, on the configuration the `nats-config` service's
//!   script writes) and the test's PostgreSQL (a fresh database owned by the compose
//!   file's user); every port a container listens on gets a free local port;
//! - readiness is each service's `healthcheck` command, run until it passes.
//!
//! Then the first admin token is made with the command deploy/README.md documents, and the
//! README's walkthrough (draft, approve, list Boxes, verify the ledger) runs against the
//! gateway. A change to the compose file that breaks a command or a variable fails here.
//! `docker-compose config` (installed by scripts/test) validates the file too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use atasira_tests::harness::{Database, OutputWithin, Proc, SUBPROCESS_LIMIT, TempDir, atasira_bin, free_port, http};
use atasira_tests::workspace_root;
use serde_json::json;
use yaml_serde::Value as Yaml;

/// What compose would read from the operator's shell (and .env) for this run.
fn operator_env() -> BTreeMap<String, String> {
    [
        ("ATASIRA_APPROVAL_KEY", "4d".repeat(32)),
        ("ATASIRA_AUDIT_KEY", "5e".repeat(32)),
        ("POSTGRES_PASSWORD", "6f".repeat(16)),
        // ATASIRA_MAX_BOXES and RUST_LOG are left to the file's defaults.
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Compose's variable interpolation: `$$` is a `$`; `$VAR`, `${VAR}`; `${VAR:-default}`
/// (unset or empty), `${VAR-default}` (unset); `${VAR:?message}`, `${VAR?message}` (an
/// error naming the message); an unset variable without a default is empty.
fn interpolate(text: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(braced) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let end = braced
                .char_indices()
                .find(|(_, c)| match c {
                    '{' => {
                        depth += 1;
                        false
                    }
                    '}' if depth == 0 => true,
                    '}' => {
                        depth -= 1;
                        false
                    }
                    _ => false,
                })
                .map(|(i, _)| i)
                .ok_or_else(|| format!("unclosed ${{ in {text:?}"))?;
            let expr = &braced[..end];
            rest = &braced[end + 1..];
            let name_end = expr.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(expr.len());
            let (name, op) = expr.split_at(name_end);
            let value = env.get(name);
            let set = value.is_some();
            let non_empty = value.is_some_and(|v| !v.is_empty());
            let resolved = if let Some(default) = op.strip_prefix(":-") {
                if non_empty { value.cloned().unwrap_or_default() } else { interpolate(default, env)? }
            } else if let Some(default) = op.strip_prefix('-') {
                if set { value.cloned().unwrap_or_default() } else { interpolate(default, env)? }
            } else if let Some(message) = op.strip_prefix(":?") {
                if non_empty { value.cloned().unwrap_or_default() } else { return Err(format!("{name}: {message}")) }
            } else if let Some(message) = op.strip_prefix('?') {
                if set { value.cloned().unwrap_or_default() } else { return Err(format!("{name}: {message}")) }
            } else if op.is_empty() {
                value.cloned().unwrap_or_default()
            } else {
                return Err(format!("unsupported interpolation ${{{expr}}}"));
            };
            out.push_str(&resolved);
        } else {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            if end == 0 {
                return Err(format!("a lone $ in {text:?} (write $$ for a dollar sign)"));
            }
            out.push_str(env.get(&rest[..end]).map(String::as_str).unwrap_or(""));
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[test]
fn interpolation_follows_compose() {
    let env: BTreeMap<String, String> = [("SET", "v"), ("EMPTY", "")].into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    assert_eq!(interpolate("a$$b ${SET} $SET", &env).as_deref(), Ok("a$b v v"));
    assert_eq!(interpolate("${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET:-${SET}}", &env).as_deref(), Ok("d  d v"));
    assert_eq!(interpolate("${UNSET:?say why}", &env), Err("UNSET: say why".to_owned()));
    assert!(interpolate("${EMPTY:?no}", &env).is_err());
    assert_eq!(interpolate("${EMPTY?no}", &env).as_deref(), Ok(""));
    assert!(interpolate("cost: $ 5", &env).is_err());
}

/// The compose file with its merge keys (`<<: *anchor`) applied.
fn compose_file() -> Yaml {
    let path = workspace_root().join("docker-compose.yml");
    let text = std::fs::read_to_string(&path).expect("docker-compose.yml");
    let mut doc: Yaml = yaml_serde::from_str(&text).expect("docker-compose.yml is YAML");
    doc.apply_merge().expect("merge keys apply");
    doc
}

fn scalar(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Null => String::new(),
        other => panic!("expected a scalar, got {other:?}"),
    }
}

fn strings(v: &Yaml) -> Vec<String> {
    match v {
        Yaml::Sequence(items) => items.iter().map(scalar).collect(),
        Yaml::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        Yaml::Null => vec![],
        other => panic!("expected a list, got {other:?}"),
    }
}

/// One service of the compose file, its variables resolved.
#[derive(Debug, Clone)]
struct Service {
    name: String,
    image: String,
    entrypoint: Vec<String>,
    command: Vec<String>,
    environment: BTreeMap<String, String>,
    /// (volume, mount point).
    volumes: Vec<(String, String)>,
    /// Container ports published on the host.
    ports: Vec<u16>,
    healthcheck: Vec<String>,
}

fn services(doc: &Yaml, env: &BTreeMap<String, String>) -> Vec<Service> {
    let resolve = |name: &str, s: String| interpolate(&s, env).unwrap_or_else(|e| panic!("service {name}: {e}"));
    let mapping = doc["services"].as_mapping().expect("services");
    mapping
        .iter()
        .map(|(name, s)| {
            let name = scalar(name);
            let environment = match &s["environment"] {
                Yaml::Mapping(m) => m.iter().map(|(k, v)| (scalar(k), resolve(&name, scalar(v)))).collect(),
                Yaml::Sequence(items) => items
                    .iter()
                    .map(|i| {
                        let line = resolve(&name, scalar(i));
                        let (k, v) = line.split_once('=').unwrap_or((&line, ""));
                        (k.to_owned(), v.to_owned())
                    })
                    .collect(),
                _ => BTreeMap::new(),
            };
            let volumes = strings(&s["volumes"])
                .into_iter()
                .map(|v| {
                    let mut parts = v.split(':');
                    (parts.next().unwrap_or_default().to_owned(), parts.next().unwrap_or_else(|| panic!("service {name}: volume {v:?}")).to_owned())
                })
                .collect();
            let ports = strings(&s["ports"])
                .into_iter()
                .map(|p| {
                    // Published on loopback only: the public port is plain HTTP.
                    let rest = p.strip_prefix("127.0.0.1:").unwrap_or_else(|| panic!("service {name}: port {p:?} is not published on 127.0.0.1 only"));
                    let (host, container) = rest.rsplit_once(':').unwrap_or((rest, rest));
                    assert_eq!(host, container, "service {name}: the test publishes ports on the same number");
                    container.parse().unwrap_or_else(|_| panic!("service {name}: port {p:?}"))
                })
                .collect();
            Service {
                image: scalar(&s["image"]),
                entrypoint: strings(&s["entrypoint"]).into_iter().map(|a| resolve(&name, a)).collect(),
                command: strings(&s["command"]).into_iter().map(|a| resolve(&name, a)).collect(),
                environment,
                volumes,
                ports,
                healthcheck: strings(&s["healthcheck"]["test"]).into_iter().map(|a| resolve(&name, a)).collect(),
                name,
            }
        })
        .collect()
}

/// The directories the Dockerfile creates (`install -d ... PATH...`).
fn image_dirs() -> Vec<String> {
    let dockerfile = std::fs::read_to_string(workspace_root().join("deploy/Dockerfile")).expect("deploy/Dockerfile");
    let dirs: Vec<String> = dockerfile
        .lines()
        .filter(|l| l.contains("install -d"))
        .flat_map(|l| l.split_whitespace().filter(|w| w.starts_with('/')).map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert!(!dirs.is_empty(), "the Dockerfile creates its directories with install -d");
    dirs
}

/// The local stand-ins for the containers: roots, volumes and ports.
struct Local {
    dir: TempDir,
    ports: BTreeMap<(String, u16), u16>,
    /// (compose host:port/db, local) pairs for the database URL.
    database: (String, String),
}

impl Local {
    fn port(&mut self, service: &str, container_port: u16) -> u16 {
        *self.ports.entry((service.to_owned(), container_port)).or_insert_with(free_port)
    }

    fn root(&self, service: &str) -> PathBuf {
        self.dir.0.join("roots").join(service)
    }

    fn volume(&self, name: &str) -> PathBuf {
        self.dir.0.join("volumes").join(name)
    }

    /// Makes the service's root: the image's directories, then each volume linked at its
    /// mount point (a named volume is created on first use).
    fn prepare_root(&self, s: &Service, image_dirs: &[String]) {
        let root = self.root(&s.name);
        if s.image == "atasira:dev" {
            for d in image_dirs {
                std::fs::create_dir_all(root.join(d.trim_start_matches('/'))).expect("image dir");
            }
        }
        let mut volumes = s.volumes.clone();
        volumes.sort_by_key(|(_, mount)| mount.len());
        for (volume, mount) in &volumes {
            let target = self.volume(volume);
            std::fs::create_dir_all(&target).expect("volume");
            let at = root.join(mount.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().expect("a parent")).expect("mount parent");
            // A volume mounted over a directory of the image starts with its content (the
            // image's directories are empty ones).
            if at.is_dir() && !at.is_symlink() {
                for entry in std::fs::read_dir(&at).expect("image dir").map_while(Result::ok) {
                    std::fs::create_dir_all(target.join(entry.file_name())).expect("copied dir");
                }
                std::fs::remove_dir_all(&at).expect("mount point");
            }
            std::os::unix::fs::symlink(&target, &at).unwrap_or_else(|e| panic!("{}: mount {volume} at {mount}: {e}", s.name));
        }
    }

    /// A value of the service's command, environment or health check, as it reads on this
    /// machine: hostnames and listening ports mapped, container paths inside its root.
    fn map(&mut self, s: &Service, value: &str) -> String {
        // Ports the service itself listens on (in its container, on any address).
        let mut v = value.to_owned();
        for host in ["0.0.0.0:", "127.0.0.1:"] {
            if let Some(at) = v.find(host) {
                let digits: String = v[at + host.len()..].chars().take_while(char::is_ascii_digit).collect();
                if let Ok(port) = digits.parse::<u16>() {
                    let local = self.port(&s.name, port);
                    v = format!("{}127.0.0.1:{local}{}", &v[..at], &v[at + host.len() + digits.len()..]);
                    break;
                }
            }
        }
        // Other containers, by hostname.
        v = v.replace(&self.database.0, &self.database.1);
        let nats = self.port("nats", 4222);
        v = v.replace("nats:4222", &format!("127.0.0.1:{nats}"));
        if v.starts_with('/') && !v.starts_with("/dev/") {
            v = self.root(&s.name).join(v.trim_start_matches('/')).display().to_string();
        }
        v
    }

    fn command(&mut self, s: &Service, program: &Path, args: &[String]) -> Command {
        let mut cmd = Command::new(program);
        let args: Vec<String> = args.iter().map(|a| self.map(s, a)).collect();
        cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
        cmd.env("HOME", self.root(&s.name).join("var/lib/atasira"));
        let env: Vec<(String, String)> = s.environment.iter().map(|(k, v)| (k.clone(), self.map(s, v))).collect();
        cmd.envs(env);
        let workdir = self.root(&s.name).join("var/lib/atasira");
        cmd.current_dir(if workdir.exists() { workdir } else { self.root(&s.name) });
        cmd
    }

    /// Runs the service's health check (`CMD` or `CMD-SHELL`) until it passes.
    fn wait_healthy(&mut self, s: &Service, procs: &mut [Proc]) {
        let (program, args): (String, Vec<String>) = match s.healthcheck.split_first() {
            Some((kind, rest)) if kind == "CMD" => (rest[0].clone(), rest[1..].to_vec()),
            Some((kind, rest)) if kind == "CMD-SHELL" => ("sh".to_owned(), vec!["-c".to_owned(), rest.join(" ")]),
            other => panic!("service {}: a health check must test something, not {other:?}", s.name),
        };
        let args: Vec<String> = args.iter().map(|a| self.map(s, a)).collect();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let out = Command::new(&program)
                .args(&args)
                .output_within(SUBPROCESS_LIMIT)
                .unwrap_or_else(|e| panic!("service {}: health check {program}: {e}", s.name));
            if out.status.success() {
                return;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = procs.iter().map(|p| format!("--- {} ---\n{}", p.name, p.stderr_text())).collect();
                panic!("service {} never became healthy ({program} {args:?}: {})\n{}", s.name, String::from_utf8_lossy(&out.stderr), logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn service<'a>(all: &'a [Service], name: &str) -> &'a Service {
    all.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("docker-compose.yml has no {name} service"))
}

/// `docker-compose config -q` (Debian's docker-compose, which scripts/test installs: it
/// parses and checks the file without a Docker engine).
fn validate_with_docker_compose(env: &BTreeMap<String, String>) {
    let out = Command::new("docker-compose")
        .arg("version")
        .output_within(SUBPROCESS_LIMIT)
        .unwrap_or_else(|e| panic!("docker-compose does not run ({e}): scripts/test installs it (apt-get install docker-compose)"));
    assert!(out.status.success(), "docker-compose version: {}", String::from_utf8_lossy(&out.stderr));
    // An empty env file: an operator's .env beside the compose file does not count here.
    let file = workspace_root().join("docker-compose.yml");
    let dir = TempDir::new("atasira-compose-config");
    let env_file = dir.0.join("empty.env");
    std::fs::write(&env_file, "").expect("env file");
    let compose = || {
        let mut cmd = Command::new("docker-compose");
        cmd.arg("-f").arg(&file).arg("--env-file").arg(&env_file).args(["config", "-q"]);
        cmd
    };
    let checked = compose().envs(env).output_within(SUBPROCESS_LIMIT).expect("docker-compose runs");
    assert!(checked.status.success(), "docker-compose config: {}", String::from_utf8_lossy(&checked.stderr));
    // Without the keys compose must refuse to start (they have no default).
    let refused = compose().env_remove("ATASIRA_AUDIT_KEY").output_within(SUBPROCESS_LIMIT).expect("runs");
    assert!(!refused.status.success(), "compose starts without ATASIRA_AUDIT_KEY");
}

/// The documented bootstrap command (deploy/README.md) with `--role` in it, as argv after
/// `docker compose exec gateway`.
fn documented_token_command(role: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(workspace_root().join("deploy/README.md")).expect("deploy/README.md");
    let line = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("docker compose exec gateway atasira tokens create") && l.contains(&format!("--role {role}")))
        .unwrap_or_else(|| panic!("deploy/README.md documents no `docker compose exec gateway atasira tokens create ... --role {role}`"));
    let line = line.split(" #").next().unwrap_or(line);
    line.trim_start_matches("docker compose exec gateway ").split_whitespace().map(str::to_owned).collect()
}

#[test]
fn the_compose_deployment_starts_and_serves_the_walkthrough() {
    let env = operator_env();
    validate_with_docker_compose(&env);
    let doc = compose_file();
    let all = services(&doc, &env);
    let atasira: Vec<Service> = all.iter().filter(|s| s.image == "atasira:dev" && s.command.first().is_some_and(|c| c == "serve")).cloned().collect();
    let names: Vec<&str> = atasira.iter().map(|s| s.name.as_str()).collect();
    for expected in ["drafts", "approval", "runtime-registry", "provisioner", "audit", "gateway"] {
        assert!(names.contains(&expected), "docker-compose.yml runs no `atasira serve {expected}` ({names:?})");
    }
    for s in &atasira {
        assert_eq!(s.command.get(1), Some(&s.name), "service {} serves {:?}", s.name, s.command);
    }

    // The image's version label is the binary's version.
    let dockerfile = std::fs::read_to_string(workspace_root().join("deploy/Dockerfile")).expect("Dockerfile");
    let arg = dockerfile.lines().find_map(|l| l.strip_prefix("ARG ATASIRA_VERSION=")).expect("the Dockerfile's ARG ATASIRA_VERSION=<version>");
    let version = Command::new(atasira_bin()).arg("--version").output_within(SUBPROCESS_LIMIT).expect("atasira --version");
    // (The tests' own binary is a debug build, and says so after its version.)
    let version = String::from_utf8_lossy(&version.stdout);
    assert_eq!(version.trim().trim_end_matches(" (debug build)"), format!("atasira {}", arg.trim()), "update ARG ATASIRA_VERSION in deploy/Dockerfile");

    // PostgreSQL: no service connects as the owner; each reads its own role's URL file.
    let pg = service(&all, "postgres");
    for s in &atasira {
        assert!(!s.environment.contains_key("ATASIRA_DATABASE_URL"), "service {} connects as the database owner", s.name);
        let file = s.environment.get("ATASIRA_DATABASE_URL_FILE").unwrap_or_else(|| panic!("service {} has no ATASIRA_DATABASE_URL_FILE", s.name));
        let volume = s.volumes.iter().find(|(_, m)| file.starts_with(m.as_str())).map(|(v, _)| v.clone()).expect("a volume for the URL file");
        assert_eq!(volume, format!("creds-{}", s.name), "service {} reads another process's database URL", s.name);
    }
    let mut database = Database::create();
    let user = &pg.environment["POSTGRES_USER"];
    let password = pg.environment["POSTGRES_PASSWORD"].replace('\'', "''");
    database
        .run_on_cluster(&[&format!(
            "DO $$ BEGIN CREATE ROLE {user} LOGIN CREATEROLE PASSWORD '{password}'; EXCEPTION WHEN duplicate_object THEN ALTER ROLE {user} CREATEROLE; END $$"
        )])
        .expect("the compose database user");
    // The roles db-roles makes (default names), dropped with the database.
    database.roles = ["gateway", "drafts", "approval", "provisioner", "runtime_registry", "audit"].map(|s| format!("atasira_{s}")).to_vec();
    let local_db = database.url_as(user);
    let (db_host, db_name) = {
        let rest = local_db.split_once('@').map(|(_, r)| r).expect("host");
        rest.split_once('/').map(|(h, d)| (h.to_owned(), d.to_owned())).expect("database name")
    };
    database.run_as(&database.url, &[&format!("ALTER DATABASE {db_name} OWNER TO {user}")]).expect("owner");

    let mut local = Local {
        dir: TempDir::new("atasira-compose"),
        ports: BTreeMap::new(),
        database: (format!("@postgres:5432/{}", pg.environment["POSTGRES_DB"]), format!("@{db_host}/{db_name}")),
    };
    let dirs = image_dirs();
    for s in &all {
        local.prepare_root(s, &dirs);
    }
    let mut procs: Vec<Proc> = Vec::new();

    // nats-config: its script, as root would run it in its container (the ownership
    // changes to the image's user are left out: this test runs as one user).
    let nats_config = service(&all, "nats-config");
    assert_eq!(nats_config.entrypoint.first().map(String::as_str), Some("sh"), "nats-config runs a shell script");
    let script = nats_config.command.last().expect("the nats-config script").clone();
    let bin_dir = local.dir.0.join("bin");
    std::fs::create_dir_all(&bin_dir).expect("bin");
    std::os::unix::fs::symlink(atasira_bin(), bin_dir.join("atasira")).expect("atasira on PATH");
    let root = local.root("nats-config");
    let nats_store = local.root("nats").join("data");
    // nats-server reads its certificate and key where its container mounts the configuration.
    let nats_conf = local.root("nats").join("etc/nats");
    let nats_port = local.port("nats", 4222);
    let script = script
        .replace("/out/", &format!("{}/out/", root.display()))
        .replace("/tmp/nats", &format!("{}/tmp/nats", root.display()))
        .replace("--store-dir /data", &format!("--store-dir {}", nats_store.display()))
        .replace("--cert-dir /etc/nats", &format!("--cert-dir {}", nats_conf.display()))
        .replace("--port 4222", &format!("--port {nats_port}"));
    assert!(script.contains(&format!("--port {nats_port}")), "nats-config names the NATS port (--port 4222)");
    assert!(script.contains(&format!("--cert-dir {}", nats_conf.display())), "nats-server reads its certificate where nats mounts nats-conf");
    let prelude = "chown() { :; }\ninstall() { command install $(printf '%s ' \"$@\" | sed 's/-o [0-9]* -g [0-9]* //'); }\n";
    let mut args = nats_config.entrypoint[1..].to_vec();
    args.push(format!("{prelude}{script}"));
    let ran = Command::new("sh")
        .args(&args)
        .env("PATH", format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default()))
        .output_within(SUBPROCESS_LIMIT)
        .expect("the nats-config script runs");
    assert!(ran.status.success(), "the nats-config script failed: {}{}", String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    // Every atasira service mounts its own credentials, which the script wrote.
    for s in &atasira {
        let creds = s.environment.get("ATASIRA_NATS_CREDS").unwrap_or_else(|| panic!("service {} has no ATASIRA_NATS_CREDS", s.name));
        let path = PathBuf::from(local.map(s, creds));
        assert!(path.exists(), "service {}: {creds} is not in its credentials volume", s.name);
        let volume = s.volumes.iter().find(|(_, m)| creds.starts_with(m.as_str())).map(|(v, _)| v.clone()).expect("a credentials volume");
        assert_eq!(volume, format!("creds-{}", s.name), "service {} mounts another process's credentials", s.name);
    }

    // db-roles: its script (after postgres is up), as root would run it in its container.
    let db_roles = service(&all, "db-roles");
    let script = db_roles.command.last().expect("the db-roles script").clone();
    let root = local.root("db-roles");
    let script = script
        .replace("/out/", &format!("{}/out/", root.display()))
        .replace("/tmp/db", &format!("{}/tmp/db", root.display()))
        .replace(&local.database.0, &local.database.1);
    let mut args = db_roles.entrypoint[1..].to_vec();
    args.push(format!("{prelude}{script}"));
    let ran = Command::new("sh")
        .args(&args)
        .envs(db_roles.environment.iter())
        .env("PATH", format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default()))
        .output_within(SUBPROCESS_LIMIT)
        .expect("the db-roles script runs");
    assert!(ran.status.success(), "the db-roles script failed: {}{}", String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    for s in &atasira {
        let file = PathBuf::from(local.map(s, &s.environment["ATASIRA_DATABASE_URL_FILE"]));
        let url = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("service {}: {}: {e}", s.name, file.display()));
        assert!(url.starts_with(&format!("postgres://atasira_{}:", s.name.replace('-', "_"))), "service {}: {url}", s.name);
    }

    // nats: its command on the written configuration, on loopback.
    let nats = service(&all, "nats");
    let nats_bin = PathBuf::from(std::env::var("ATASIRA_TEST_NATS_SERVER").expect("ATASIRA_TEST_NATS_SERVER: run with scripts/test"));
    // A port flag's value is a port the container listens on.
    let mut nats_args = nats.command.clone();
    for i in 1..nats_args.len() {
        if nats_args[i - 1].ends_with("port")
            && let Ok(port) = nats_args[i].parse::<u16>()
        {
            nats_args[i] = local.port("nats", port).to_string();
        }
    }
    let mut cmd = local.command(nats, &nats_bin, &nats_args);
    cmd.args(["-a", "127.0.0.1"]);
    procs.push(Proc::spawn_command("nats-server", cmd));
    local.wait_healthy(nats, &mut procs);

    // nats-setup: the operator creates the events stream and the sentinel's consumer, with
    // credentials no atasira service mounts.
    let setup = service(&all, "nats-setup");
    assert_eq!(setup.command.first().map(String::as_str), Some("nats-setup"), "{:?}", setup.command);
    let operator = setup.environment.get("ATASIRA_NATS_CREDS").expect("nats-setup has ATASIRA_NATS_CREDS");
    assert!(setup.volumes.iter().any(|(v, m)| v == "creds-operator" && operator.starts_with(m.as_str())), "nats-setup mounts the operator's credentials");
    for s in &atasira {
        assert!(s.volumes.iter().all(|(v, _)| v != "creds-operator"), "service {} mounts the operator's credentials", s.name);
    }
    let out = local.command(setup, &atasira_bin(), &setup.command).output_within(SUBPROCESS_LIMIT).expect("nats-setup runs");
    assert!(out.status.success(), "nats-setup failed: {}", String::from_utf8_lossy(&out.stderr));

    // The atasira services, then their health checks (GET /readyz).
    for s in &atasira {
        let cmd = local.command(s, &atasira_bin(), &s.command);
        procs.push(Proc::spawn_command(&format!("atasira {}", s.name), cmd));
    }
    for s in &atasira {
        local.wait_healthy(s, &mut procs);
        assert!(s.healthcheck.iter().any(|a| a.contains("/readyz")), "service {}: the health check asks /readyz", s.name);
    }

    // The first tokens, with the documented command, in the gateway's environment.
    let gateway = service(&all, "gateway").clone();
    let token = |local: &mut Local, role: &str| {
        let argv = documented_token_command(role);
        assert_eq!(argv[0], "atasira");
        let out = local.command(&gateway, &atasira_bin(), &argv[1..]).output_within(SUBPROCESS_LIMIT).expect("tokens create");
        assert!(out.status.success(), "{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let admin = token(&mut local, "admin");
    let agent = token(&mut local, "member");
    let port = *gateway.ports.first().expect("the gateway publishes its port");
    let api = format!("http://127.0.0.1:{}/api/v1", local.port("gateway", port));

    // The README's walkthrough.
    let draft = json!({"box_type": "sales-report", "name": "sales-report", "purpose": "週次売上レポートの自動作成",
        "success_criteria": ["毎週月曜にレポート生成", "エラー時は人間へ通知"], "os_operations": [], "tools": ["Read"],
        "url_allowlist": [], "allow_network": false, "prohibited_actions": []});
    let submitted = http("POST", &format!("{api}/boxes/box-drafts"), Some(&agent), &[("Idempotency-Key", "first-draft")], Some(draft.to_string().as_bytes()));
    assert_eq!(submitted.status, 201, "{}", submitted.raw);
    assert_eq!(submitted.body["status"], "pending_approval");
    let draft_id = submitted.body["draft_id"].as_str().expect("draft_id").to_owned();
    let pending = http("GET", &format!("{api}/boxes/box-drafts/pending"), Some(&admin), &[], None);
    assert_eq!(pending.body["drafts"][0]["draft_id"], draft_id.as_str(), "{}", pending.raw);
    let approved = http("POST", &format!("{api}/boxes/box-drafts/{draft_id}/approve"), Some(&admin), &[], Some(br#"{"confirm_over_limit": false}"#));
    assert_eq!(approved.status, 200, "{}", approved.raw);
    assert_eq!(approved.body["status"], "active");
    let boxes = http("GET", &format!("{api}/boxes"), Some(&agent), &[], None);
    assert_eq!(boxes.status, 200, "{}", boxes.raw);
    assert_eq!(boxes.body["boxes"][0]["box_type"], "sales-report", "{}", boxes.raw);
    let verified = http("GET", &format!("{api}/audit/verify"), Some(&admin), &[], None);
    assert_eq!(verified.body["ok"], true, "{}", verified.raw);
    // The runbook's check of the ledger on the store, in the audit container.
    let audit = service(&all, "audit").clone();
    let out = local.command(&audit, &atasira_bin(), &["audit".to_owned(), "verify".to_owned()]).output_within(SUBPROCESS_LIMIT).expect("audit verify");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(report["ok"], true, "audit verify in the audit container: {report} {}", String::from_utf8_lossy(&out.stderr));
    // The registry wrote the manifest into its volume.
    assert!(local.volume("manifests").join("sales-report.yaml").exists(), "the manifest file is not in the manifests volume");
    drop(procs);
}
