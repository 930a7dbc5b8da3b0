//! The `atasira` binary the tests run (refused when older than its sources), commands run
//! with a time limit, and failpoints a test holds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::proc::TempDir;

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
