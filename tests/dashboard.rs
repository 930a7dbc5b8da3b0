//! The ops dashboard (R-UI-1) in a real browser: `tests/browser/dashboard.py` drives a
//! headless Chromium with Playwright against `atasira dev`. Sign in as admin, an over-limit
//! draft first and highlighted, approved only after the second confirmation, the Box in the
//! Boxes view without a reload (live updates), a rejection with a reason, a refusal in
//! words, edits, a Worker launched, the audit ledger verified; an agent sees no approve or
//! reject control; the links in announcements open their views. Webhooks: a delivery
//! dead-lettered and one delivered, seen in the Webhooks view with their deliveries. A Box's
//! timeline shows the Box as it was before and after a change. The Policy view publishes a
//! policy, lists the refusals it makes and checks a proposal.
//! Screenshots of each view are kept under the test's output directory.
//!
//! Needs what `scripts/test` provides: `ATASIRA_TEST_PYTHON` (a venv with `playwright`) and
//! `ATASIRA_TEST_CHROMIUM` (Debian's chromium).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::receiver::Receiver;
use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System, http};
use atasira_tests::workspace_root;
use serde_json::{Value, json};

fn env(name: &str, what: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the suite with scripts/test, which installs {what}"))
}

/// One headless Chromium at a time: the browser tests share a small machine.
static BROWSER: Mutex<()> = Mutex::new(());

/// Runs `scenario` of tests/browser/dashboard.py against `sys`, with `extra` in its
/// environment and its screenshots in `out`; fails the test unless every step passed.
fn browse(sys: &System, scenario: &str, out: &Path, extra: &[(&str, String)]) {
    let python = env("ATASIRA_TEST_PYTHON", "playwright into its venv");
    let chromium = env("ATASIRA_TEST_CHROMIUM", "Debian's chromium");
    let run = Command::new(&python)
        .arg(workspace_root().join("tests/browser/dashboard.py"))
        .env("ATASIRA_DASHBOARD_SCENARIO", scenario)
        .env("ATASIRA_DASHBOARD_URL", &sys.base_url)
        .env("ATASIRA_DASHBOARD_ADMIN", &sys.admin)
        .env("ATASIRA_DASHBOARD_AGENT", &sys.agent)
        .env("ATASIRA_DASHBOARD_OUT", out)
        .env("ATASIRA_TEST_CHROMIUM", &chromium)
        .envs(extra.iter().map(|(k, v)| (k, v)))
        .output_within(SUBPROCESS_LIMIT)
        .expect("python runs (is playwright installed in the venv of ATASIRA_TEST_PYTHON?)");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    eprintln!("{stdout}");
    assert!(run.status.success(), "the browser scenarios failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all scenarios passed"), "{stdout}");
}

fn draft(sys: &System, token: &str, body: &Value) -> String {
    let a = sys.post("/api/v1/boxes/box-drafts", token, body);
    assert_eq!(a.status, 201, "{}", a.raw);
    a.body["draft_id"].as_str().expect("draft_id").to_owned()
}

#[test]
fn r_ui_1_the_page_is_served_with_its_policy_and_leaves_the_api_alone() {
    let sys = System::start(Mode::Embedded);
    let page = http("GET", &sys.url("/"), None, &[], None);
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = page.header("content-security-policy").expect("a Content-Security-Policy");
    assert!(csp.starts_with("default-src 'self'") && !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    assert_eq!(page.header("cache-control"), Some("no-cache"));
    assert!(page.raw.contains("/assets/app.js"), "{}", page.raw);
    // Revalidation by ETag.
    let etag = page.header("etag").expect("an ETag").to_owned();
    let again = http("GET", &sys.url("/"), None, &[("If-None-Match", &etag)], None);
    assert_eq!(again.status, 304);
    for (file, kind) in [("app.js", "text/javascript"), ("app.css", "text/css"), ("favicon.svg", "image/svg+xml")] {
        let a = http("GET", &sys.url(&format!("/assets/{file}")), None, &[], None);
        assert_eq!(a.status, 200, "{file}");
        assert!(a.header("content-type").is_some_and(|t| t.starts_with(kind)), "{file}: {:?}", a.header("content-type"));
        assert_eq!(a.header("x-content-type-options"), Some("nosniff"), "{file}");
    }
    // Unknown files and API routes are still the API's JSON 404.
    for path in ["/assets/nope.js", "/assets/index.html", "/api/v1/nope", "/nope"] {
        let a = http("GET", &sys.url(path), None, &[], None);
        assert_eq!((a.status, a.body["error"].as_str()), (404, Some("not_found")), "{path}: {}", a.raw);
    }
    // Who the caller is, for the page to show and to decide which controls to draw.
    let me = sys.get("/api/v1/auth/whoami", &sys.admin);
    assert_eq!((me.status, me.body.clone()), (200, json!({"user_id": "admin", "role": "admin", "kind": "human"})));
    let me = sys.get("/api/v1/auth/whoami", &sys.agent);
    assert_eq!(me.body, json!({"user_id": "agent", "role": "member", "kind": "agent"}));
    assert_eq!(http("GET", &sys.url("/api/v1/auth/whoami"), None, &[], None).status, 401);
}

#[test]
fn r_ui_1_an_admin_approves_over_the_limit_after_a_second_confirmation_and_an_agent_cannot_in_a_browser() {
    let _browser = BROWSER.lock().unwrap_or_else(PoisonError::into_inner);
    // An over-the-limit draft needs two human admins (R-CHANGE-3): the page shows the progress.
    let sys = System::start_with(Mode::Embedded, &[("ATASIRA_OVER_LIMIT_APPROVALS", "2".to_owned())]);
    let second_admin = sys.token("second-admin", "admin", "human");
    let types = json!({"over": "dash-sales", "reject": "dash-reject", "live": "dash-live", "own": "dash-own"});
    let over = draft(
        &sys,
        &sys.agent,
        &json!({"box_type": types["over"], "name": "Sales reports", "purpose": "Write the weekly sales report",
            "success_criteria": ["A report every Monday", "Errors go to a person"],
            "os_operations": ["shell:exec", "file:read"], "tools": ["Bash", "Read"], "url_allowlist": ["https://reports.example"],
            "file_access": ["read:/srv/reports/*"], "allow_network": true,
            "required_access": [{"type": "git_remote", "url": "https://git.example/sales.git"}]}),
    );
    let reject = draft(&sys, &sys.agent, &json!({"box_type": types["reject"], "purpose": "Read the mail", "tools": ["Read"]}));
    let live = draft(&sys, &sys.agent, &json!({"box_type": types["live"], "purpose": "Answer questions"}));
    let own = draft(&sys, &sys.admin, &json!({"box_type": types["own"], "purpose": "Something of my own"}));

    // The screenshots stay after the run, under cargo's directory for test output.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let drafts = json!({"over": over, "reject": reject, "live": live, "own": own, "types": types});
    browse(&sys, "approvals", &out, &[("ATASIRA_DASHBOARD_SECOND_ADMIN", second_admin), ("ATASIRA_DASHBOARD_DRAFTS", drafts.to_string())]);
    for view in ["pending", "boxes", "workers", "audit", "agent"] {
        assert!(out.join(format!("dashboard-{view}.png")).is_file(), "no screenshot of {view} in {}", out.display());
    }

    // What the browser did is what the API holds.
    let drafts = sys.get(&format!("/api/v1/boxes/box-drafts/{over}"), &sys.admin);
    assert_eq!(drafts.body["status"], "active", "{}", drafts.raw);
    assert_eq!(sys.get(&format!("/api/v1/boxes/box-drafts/{own}"), &sys.admin).body["status"], "pending_approval");
    let (code, verified) = sys.audit_verify();
    assert_eq!((code, verified["ok"].as_bool()), (0, Some(true)), "{verified}");
}

#[test]
fn r_notify_1_the_dashboard_shows_webhooks_their_deliveries_and_the_dead_ones_in_a_browser() {
    let _browser = BROWSER.lock().unwrap_or_else(PoisonError::into_inner);
    // One receiver refuses every delivery, the other takes each; two attempts, 100 ms apart.
    let failing = Receiver::start(|_, _| "500 Internal Server Error");
    let ok = Receiver::start(|_, _| "204 No Content");
    let env = [("ATASIRA_WEBHOOK_ATTEMPTS", "2".to_owned()), ("ATASIRA_WEBHOOK_BACKOFF", "100ms".to_owned())];
    let sys = System::start_with(Mode::Embedded, &env);
    let (failing_url, ok_url) = (failing.url("/hooks/down"), ok.url("/hooks/ok"));

    // The browser registers both, sees a draft's delivery dead-lettered at one and delivered
    // at the other, reads the deliveries and removes the second webhook.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let hooks = json!({"failing": failing_url, "ok": ok_url});
    browse(&sys, "webhooks", &out, &[("ATASIRA_DASHBOARD_WEBHOOKS", hooks.to_string())]);
    assert!(out.join("dashboard-webhooks.png").is_file(), "no screenshot of webhooks in {}", out.display());

    // What the browser saw is what happened: two attempts at the one, one at the other.
    assert_eq!(failing.at("/hooks/down").len(), 2, "{:?}", failing.received());
    let delivered = ok.at("/hooks/ok");
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert!(delivered[0].json()["text"].as_str().is_some_and(|t| t.contains("/#pending")), "{:?}", delivered[0].json());
    let listed = sys.get("/api/v1/webhooks", &sys.admin);
    assert_eq!(listed.status, 200, "{}", listed.raw);
    let webhooks = listed.body["webhooks"].as_array().cloned().unwrap_or_default();
    assert_eq!(webhooks.len(), 1, "the second webhook was removed: {}", listed.raw);
    let w = &webhooks[0];
    assert_eq!(
        (w["url"].as_str(), w["delivered"].as_u64(), w["pending"].as_u64(), w["dead"].as_u64()),
        (Some(failing_url.as_str()), Some(0), Some(0), Some(1)),
        "{w}"
    );
    let id = w["webhook_id"].as_str().expect("webhook_id");
    let dead = sys.get(&format!("/api/v1/webhooks/{id}/deliveries?state=dead"), &sys.admin);
    assert_eq!(dead.body["deliveries"][0]["last_status"], 500, "{}", dead.raw);
    // Registering and removing are on the ledger, as is the dead letter.
    let rows = |action: &str| sys.get(&format!("/api/v1/audit?action={action}"), &sys.admin).body["rows"].as_array().map_or(0, Vec::len);
    eventually("the webhooks' rows on the ledger", Duration::from_secs(30), || {
        let got = [rows("webhook.register"), rows("webhook.remove"), rows("webhook.dead_letter")];
        if got == [2, 1, 1] { Ok(()) } else { Err(format!("register, remove, dead letter: {got:?}")) }
    });
    let (code, verified) = sys.audit_verify();
    assert_eq!((code, verified["ok"].as_bool()), (0, Some(true)), "{verified}");
}

#[test]
fn r_hist_1_the_box_timeline_shows_the_box_as_it_was_before_and_after_a_change_in_a_browser() {
    let _browser = BROWSER.lock().unwrap_or_else(PoisonError::into_inner);
    let sys = System::start(Mode::Embedded);
    let bob = sys.token("bob", "admin", "human");
    // A Box the admin approved, off the network and reading only.
    let first = draft(&sys, &sys.agent, &json!({"box_type": "dash-timeline", "name": "Price watch", "purpose": "Watch prices", "tools": ["Read"]}));
    let approved = sys.approve(&first, &sys.admin, false);
    assert_eq!(approved.status, 200, "{}", approved.raw);
    let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
    // Then a change request puts it on a filtered network and adds a tool; bob approves it.
    let changes = format!("/api/v1/boxes/{box_id}/change-requests");
    let asked = sys.post(&changes, &sys.admin, &json!({"network": "filtered", "url_allowlist": ["prices.example"], "tools": ["Read", "Grep"]}));
    assert_eq!(asked.status, 201, "{}", asked.raw);
    let changed = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
    assert_eq!(changed.status, 200, "{}", changed.raw);
    // Then the agent is assigned.
    let assigned = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "member"}));
    assert_eq!(assigned.status, 200, "{}", assigned.raw);
    let now = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.admin);
    assert_eq!((now.body["manifest"]["network"].as_str(), now.body["approved_by"].as_str()), (Some("filtered"), Some("bob")), "{}", now.raw);

    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let shown = json!({"box_id": box_id, "box_type": "dash-timeline"});
    browse(&sys, "timeline", &out, &[("ATASIRA_DASHBOARD_BOX", shown.to_string())]);
    assert!(out.join("dashboard-timeline.png").is_file(), "no screenshot of the timeline in {}", out.display());
}

#[test]
fn r_policy_1_an_admin_publishes_a_policy_checks_a_proposal_and_sees_its_refusals_in_a_browser() {
    let _browser = BROWSER.lock().unwrap_or_else(PoisonError::into_inner);
    let sys = System::start(Mode::Embedded);
    // A Box off the network whose primary is the agent (who may request its changes).
    let first = draft(&sys, &sys.agent, &json!({"box_type": "dash-policy-box", "purpose": "Read reports", "tools": ["Read"]}));
    let approved = sys.approve(&first, &sys.admin, false);
    assert_eq!(approved.status, 200, "{}", approved.raw);
    let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
    let assigned = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "primary"}));
    assert_eq!(assigned.status, 200, "{}", assigned.raw);
    // A pending draft on a filtered network: a policy that keeps Boxes off the network
    // would deny it.
    let pending = draft(
        &sys,
        &sys.agent,
        &json!({"box_type": "dash-policy-net", "purpose": "Fetch prices", "tools": ["Read"], "allow_network": true, "url_allowlist": ["prices.example"]}),
    );

    // The browser publishes version 1; the agent's change request asking for the whole
    // network is refused beside it (from the scenario, between its steps); the browser
    // lists the refusal and checks a stricter proposal without publishing it.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let seeded = json!({"pending": pending, "box": box_id});
    browse(&sys, "policy", &out, &[("ATASIRA_DASHBOARD_DRAFTS", seeded.to_string())]);
    assert!(out.join("dashboard-policy.png").is_file(), "no screenshot of the policy in {}", out.display());

    // What the browser did is what the API holds: version 1 only, the draft still pending,
    // the Box unchanged, one refusal on the ledger naming the rule.
    let policy = sys.get("/api/v1/policies", &sys.admin);
    assert_eq!(policy.status, 200, "{}", policy.raw);
    assert_eq!((policy.body["version"].as_u64(), policy.body["published_by"].as_str()), (Some(1), Some("admin")), "{}", policy.raw);
    assert_eq!(policy.body["rules"][0]["id"], "no-full-network", "{}", policy.raw);
    assert_eq!(sys.get(&format!("/api/v1/boxes/box-drafts/{pending}"), &sys.admin).body["status"], "pending_approval");
    assert_eq!(sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.admin).body["manifest"]["network"], "none");
    let violations = sys.get("/api/v1/audit?action=security_violation&limit=500", &sys.admin);
    let refusals: Vec<&str> = violations.body["rows"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["detail"].as_str()).filter(|d| d.starts_with("refused (policy_denied):")).collect())
        .unwrap_or_default();
    assert_eq!(refusals.len(), 1, "{}", violations.raw);
    assert!(refusals[0].contains("policy version 1, rule no-full-network"), "{refusals:?}");
    let (code, verified) = sys.audit_verify();
    assert_eq!((code, verified["ok"].as_bool()), (0, Some(true)), "{verified}");
}
