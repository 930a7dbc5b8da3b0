//! Fault-injection hooks for the crash and race tests. Only a test build of the binary
//! (the `atasira` crate's `failpoints` feature, which scripts/test turns on) configures
//! them, once at start, from its settings (`--failpoint`, `--failpoint-delay`); a build
//! for use never calls [`configure`], so there each hook is a no-op.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

/// Which hooks fire in this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failpoints {
    /// Points where the process SIGKILLs itself ([`failpoint`]).
    pub kill: Vec<String>,
    /// Points that pause first ([`failpoint_delay`]).
    pub delay: Vec<FailpointDelay>,
    /// Points a test holds and releases ([`failpoint_delay`]).
    pub hold: Vec<FailpointHold>,
    /// A file holding the time the schedules see ([`now`]), in RFC 3339.
    pub clock: Option<std::path::PathBuf>,
}

/// A point a test holds: `name:DIR` on the command line. While `DIR/armed` exists, a
/// process reaching the point writes `DIR/reached` and waits there until `armed` is gone;
/// so a test forces an interleaving by what it does, not by how long it sleeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointHold {
    pub point: String,
    pub dir: std::path::PathBuf,
}

impl FromStr for FailpointHold {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some((point, dir)) if !point.trim().is_empty() && !dir.trim().is_empty() => Ok(Self { point: point.trim().to_owned(), dir: dir.trim().into() }),
            _ => Err(format!("expected NAME:DIRECTORY, got {s:?}")),
        }
    }
}

/// One pausing point: `name:millis` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointDelay {
    pub point: String,
    pub delay: Duration,
}

impl FromStr for FailpointDelay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (point, ms) = s.split_once(':').ok_or_else(|| format!("expected NAME:MILLISECONDS, got {s:?}"))?;
        let ms: u64 = ms.trim().parse().map_err(|_| format!("expected NAME:MILLISECONDS, got {s:?} (the pause is not a number)"))?;
        let point = point.trim();
        if point.is_empty() {
            return Err(format!("expected NAME:MILLISECONDS, got {s:?} (no name)"));
        }
        Ok(Self { point: point.to_owned(), delay: Duration::from_millis(ms) })
    }
}

static CONFIGURED: OnceLock<Failpoints> = OnceLock::new();

/// Sets this process's hooks; call it once, at start, before any service runs. A second
/// call changes nothing and hands its value back.
pub fn configure(failpoints: Failpoints) -> Result<(), Failpoints> {
    CONFIGURED.set(failpoints)
}

/// Crash-test hook: when `name` is configured as a kill point, the process is SIGKILLed
/// here, so tests can prove that nothing committed before it is lost.
pub fn failpoint(name: &str) {
    if CONFIGURED.get().is_some_and(|f| f.kill.iter().any(|p| p == name)) {
        eprintln!("failpoint {name}: killing this process");
        // A real SIGKILL (no unwinding, no flushing), like `kill -9` from outside.
        let _ = std::process::Command::new("kill").arg("-KILL").arg(std::process::id().to_string()).status();
        std::process::abort();
    }
}

/// Race hook: when `name` is configured as a pausing point, waits that long here; when it
/// is a held point and the test has armed it, waits until the test releases it (see
/// [`FailpointHold`]). So a test can force an interleaving.
pub async fn failpoint_delay(name: &str) {
    let Some(failpoints) = CONFIGURED.get() else { return };
    for d in failpoints.delay.iter().filter(|d| d.point == name) {
        tokio::time::sleep(d.delay).await;
    }
    for h in failpoints.hold.iter().filter(|h| h.point == name) {
        let armed = h.dir.join("armed");
        if !armed.exists() {
            continue;
        }
        eprintln!("failpoint {name}: held until the test releases it");
        let _ = std::fs::write(h.dir.join("reached"), name);
        while armed.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The time the schedules go by: the real clock, or in a test build the time in the test
/// clock's file (RFC 3339) while it is readable, so a test moves time instead of sleeping.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    let file = CONFIGURED.get().and_then(|f| f.clock.as_ref());
    file.and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| chrono::DateTime::parse_from_rfc3339(text.trim()).ok())
        .map_or_else(chrono::Utc::now, |t| t.with_timezone(&chrono::Utc))
}

/// Whether time comes from a test clock (then waits are short polls, not sleeps to a tick).
pub fn test_clock() -> bool {
    CONFIGURED.get().is_some_and(|f| f.clock.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_parses_from_name_and_milliseconds() {
        assert_eq!("activation:2500".parse(), Ok(FailpointDelay { point: "activation".into(), delay: Duration::from_millis(2500) }));
        assert!("activation".parse::<FailpointDelay>().is_err());
        assert!("activation:soon".parse::<FailpointDelay>().is_err());
        assert!(":10".parse::<FailpointDelay>().is_err());
    }

    #[test]
    fn a_hold_parses_from_name_and_directory() {
        assert_eq!("activation:/tmp/h".parse(), Ok(FailpointHold { point: "activation".into(), dir: "/tmp/h".into() }));
        assert!("activation".parse::<FailpointHold>().is_err());
        assert!(":/tmp/h".parse::<FailpointHold>().is_err());
        assert!("activation:".parse::<FailpointHold>().is_err());
    }

    #[tokio::test]
    async fn unconfigured_hooks_do_nothing() {
        // No test in this crate configures failpoints: the process would die.
        failpoint("anything");
        failpoint_delay("anything").await;
    }
}
