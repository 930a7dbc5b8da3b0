//! What a test process has of its own: the environment `scripts/test` gives it, temporary
//! directories, free ports, and the child processes it starts (output kept, killed on drop).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A setting `scripts/test` gives the suite (the test fails, saying so, when it is missing).
pub(crate) fn required_env(name: &str) -> String {
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

/// A free TCP port on loopback (bound and released).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// Where [`free_ports`] looks: below Linux's default range of ephemeral ports
/// (32768-60999), from which the system picks the local port of every outgoing connection
/// and of every `bind` to port 0. A port picked from that range was once taken that way
/// between this check and the test's process binding it (a probe port, so the process
/// could not start).
const FREE_PORTS: std::ops::Range<u16> = 10_000..32_768;

/// `n` different free TCP ports on loopback, at random in [`FREE_PORTS`]: all bound at once,
/// then released (one at a time, the same port could come twice).
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut held: Vec<TcpListener> = Vec::with_capacity(n);
    for _ in 0..10_000 {
        if held.len() == n {
            break;
        }
        let port = FREE_PORTS.start + (uuid::Uuid::new_v4().as_u128() % u128::from(FREE_PORTS.end - FREE_PORTS.start)) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    // Not enough free there: whatever the system hands out.
    while held.len() < n {
        held.push(TcpListener::bind("127.0.0.1:0").expect("free port"));
    }
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

/// The `http://ADDR` in a "listening on" or "probes on" line.
pub fn listening_url(line: &str) -> String {
    let start = line.find("http://").expect("url in line");
    let rest = &line[start..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    let url = &rest[..end];
    let _: SocketAddr = url.trim_start_matches("http://").parse().expect("socket address");
    url.to_owned()
}
