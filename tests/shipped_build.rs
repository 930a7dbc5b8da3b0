//! The binary as it ships: a draft's submission and approval (C9) work on the release
//! profile, and it has no test hooks (R-ARCH-13): its fault-injection settings
//! (`ATASIRA_FAILPOINT`, `ATASIRA_FAILPOINT_DELAY`) arm nothing. scripts/test builds it
//! once with `--release` and without the `failpoints` feature, and names it in
//! `ATASIRA_TEST_RELEASE_BIN`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use atasira_tests::harness::{OutputWithin, Proc, SUBPROCESS_LIMIT, TempDir, http, listening_url};
use serde_json::json;

fn shipped_bin() -> PathBuf {
    let bin = std::env::var_os("ATASIRA_TEST_RELEASE_BIN")
        .map(PathBuf::from)
        .expect("ATASIRA_TEST_RELEASE_BIN is not set: run the suite with scripts/test, which builds the binary as it ships");
    assert!(bin.exists(), "{} is missing: run the suite with scripts/test", bin.display());
    bin
}

/// The `<prefix>` line of `atasira dev`'s stdout (its PATs), waiting for it.
fn stdout_line(p: &Proc, prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = p.stdout.lock().expect("lines").iter().find_map(|l| l.strip_prefix(prefix)) {
            return v.to_owned();
        }
        assert!(Instant::now() < deadline, "no {prefix:?} line; stderr:\n{}", p.stderr_text());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_shipped_binary_is_built_with_the_release_profile() {
    let out = std::process::Command::new(shipped_bin()).arg("--version").output_within(SUBPROCESS_LIMIT).expect("atasira --version");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && version.starts_with("atasira "), "{version}");
    assert!(!version.contains("debug build"), "the binary the approval test runs is not the release build: {version}");
}

#[test]
fn the_shipped_binary_ignores_failpoints_on_the_approval_path_and_says_so() {
    let dir = TempDir::new("atasira-shipped");
    let data = dir.0.join("data").display().to_string();
    // A test build would die on the approval's first step and pause every activation
    // for a minute.
    let env = [
        ("RUST_LOG", "info,sqlx=warn".to_owned()),
        ("ATASIRA_FAILPOINT", "approval-after-reservation,approval-after-decision".to_owned()),
        ("ATASIRA_FAILPOINT_DELAY", "activation:60000".to_owned()),
        ("ATASIRA_FAILPOINT_HOLD", format!("activation:{}", dir.0.display())),
    ];
    // Armed: a test build would hold every activation until the file is gone.
    std::fs::write(dir.0.join("armed"), "").expect("armed");
    let mut p = Proc::spawn("atasira dev (shipped)", &shipped_bin(), &["dev", "--data-dir", &data, "--listen", "127.0.0.1:0"], &env);
    let base = listening_url(&p.wait_stderr("listening on http://", Duration::from_secs(30)));
    for setting in ["ATASIRA_FAILPOINT (--failpoint)", "ATASIRA_FAILPOINT_DELAY (--failpoint-delay)", "ATASIRA_FAILPOINT_HOLD (--failpoint-hold)"] {
        p.wait_stderr(&format!("{setting} is set, but this build has no test hooks; ignored"), Duration::from_secs(1));
    }
    let (admin, agent) = (stdout_line(&p, "admin PAT: "), stdout_line(&p, "agent PAT: "));

    let started = Instant::now();
    let body = json!({"box_type": "shipped", "purpose": "p", "tools": ["Read"]}).to_string();
    let draft = http("POST", &format!("{base}/api/v1/boxes/box-drafts"), Some(&agent), &[], Some(body.as_bytes()));
    assert_eq!(draft.status, 201, "{}", draft.raw);
    let id = draft.body["draft_id"].as_str().expect("draft_id");
    let approve = json!({"confirm_over_limit": false}).to_string();
    let approved = http("POST", &format!("{base}/api/v1/boxes/box-drafts/{id}/approve"), Some(&admin), &[], Some(approve.as_bytes()));
    assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("active")), "{}", approved.raw);
    // No pause: the activation did not wait its minute.
    assert!(started.elapsed() < Duration::from_secs(30), "approving took {:?}", started.elapsed());
    let boxes = http("GET", &format!("{base}/api/v1/boxes"), Some(&admin), &[], None);
    assert_eq!(boxes.body["boxes"][0]["box_type"], "shipped", "{}", boxes.raw);
    // No kill: the process is still serving.
    assert!(p.wait_exit(Duration::from_millis(100)).is_none(), "the process exited; stderr:\n{}", p.stderr_text());
    assert!(!p.stderr_text().contains("testing hooks armed"), "{}", p.stderr_text());
}
