//! What many test files need and would otherwise each write again: a runtime for async
//! code, a bounded wait for what must come, and a sample draft.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A current-thread tokio runtime (IO and timers on), for a test's async code.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// Runs `f` to its end on a fresh [`runtime`].
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// The first pause of [`eventually`] between two tries; each next one is twice as long, up
/// to [`LONGEST_PAUSE`] (a condition that holds soon is seen soon, and a slow one is not
/// asked for in a busy loop).
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause of [`eventually`] between two tries.
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// Tries `probe` until it returns `Ok`, and returns that value: a bounded wait for what
/// must come. After `timeout` the test fails, naming `what` and the probe's last `Err`
/// (say there what was seen instead). `probe` is tried at least once.
#[track_caller]
pub fn eventually<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        match probe() {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => panic!("waited {timeout:?} for {what}; the last try: {last}"),
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

/// A draft as the agent submits it (`POST /api/v1/boxes/box-drafts`): a Box of type and name
/// `box_type` that reads files.
pub fn draft_body(box_type: &str) -> Value {
    json!({"box_type": box_type, "name": box_type, "purpose": "週次売上レポートの自動作成", "tools": ["Read"], "os_operations": ["file:read"]})
}

/// The smallest draft: `box_type`, a purpose and one tool, nothing else.
pub fn minimal_draft_body(box_type: &str) -> Value {
    json!({"box_type": box_type, "purpose": "p", "tools": ["Read"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventually_returns_the_first_ok_and_names_what_it_waited_for_when_none_comes() {
        let mut tries = 0;
        let value = eventually("the third try", Duration::from_secs(5), || {
            tries += 1;
            if tries == 3 { Ok(tries * 10) } else { Err(format!("try {tries}")) }
        });
        assert_eq!((value, tries), (30, 3));

        let failed = std::panic::catch_unwind(|| eventually::<()>("a miracle", Duration::from_millis(50), || Err("nothing yet".to_owned())));
        let message = failed.expect_err("no miracle came").downcast::<String>().expect("a formatted message");
        assert!(message.contains("a miracle") && message.contains("50ms") && message.contains("nothing yet"), "{message}");
    }
}
