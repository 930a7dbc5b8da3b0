//! PostgreSQL for the tests: a fresh database on the shared server of `scripts/test`, or a
//! server of a test's own that it can stop and start.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::binary::{OutputWithin, SUBPROCESS_LIMIT, atasira_bin};
use super::proc::{TempDir, free_port, required_env};
use crate::fixtures::block_on;

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
