//! Liveness and readiness of every process (R-OPS-2): `GET /healthz` and `GET /readyz` on
//! each process's probe port (`atasira serve <service> --metrics-listen`, `atasira dev
//! --metrics-listen`); readiness follows the NATS connection. The gateway's REST address
//! only says whether the system works, naming nothing inside it (R-ARCH-13).

use std::time::{Duration, Instant};

use atasira_tests::harness::{CLUSTER_SERVICES, Mode, System, http};
use serde_json::json;

/// Asks `url` until `done` holds for the answer; the last answer.
fn eventually(url: &str, timeout: Duration, done: impl Fn(u16, &serde_json::Value) -> bool) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + timeout;
    loop {
        let a = http("GET", url, None, &[], None);
        if done(a.status, &a.body) {
            return (a.status, a.body);
        }
        assert!(Instant::now() < deadline, "{url} never answered as expected; last {}: {}", a.status, a.raw);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The readiness URLs of a cluster: every service's probe port and the gateway's.
fn readiness_urls(sys: &mut System) -> Vec<String> {
    let mut urls: Vec<String> = CLUSTER_SERVICES.iter().map(|s| format!("{}/readyz", sys.probe_url(&format!("serve {s}")))).collect();
    urls.push(format!("{}/readyz", sys.probe_url("serve gateway")));
    urls
}

#[test]
fn every_cluster_process_is_alive_and_ready_and_not_ready_while_nats_is_down() {
    // R-OPS-2: each process says it is alive and ready on its own port.
    let mut sys = System::start(Mode::Cluster);
    for service in CLUSTER_SERVICES.iter().chain(&["gateway"]) {
        let probes = sys.probe_url(&format!("serve {service}"));
        let alive = http("GET", &format!("{probes}/healthz"), None, &[], None);
        assert_eq!((alive.status, &alive.body), (200, &json!({"status": "alive"})), "{service}");
        let ready = http("GET", &format!("{probes}/readyz"), None, &[], None);
        assert_eq!((ready.status, &ready.body), (200, &json!({"status": "ready"})), "{service}: {}", ready.raw);
    }
    // The gateway's REST address says that every service answers, and no more.
    let health = http("GET", &sys.url("/healthz"), None, &[], None);
    assert_eq!((health.status, &health.body), (200, &json!({"status": "ok"})));
    assert_eq!(http("GET", &sys.url("/readyz"), None, &[], None).status, 404, "readiness is on the probe port only");

    let urls = readiness_urls(&mut sys);
    sys.nats().down();
    for url in &urls {
        let (_, body) = eventually(url, Duration::from_secs(30), |status, _| status == 503);
        assert_eq!(body["status"], "not_ready", "{url}: {body}");
        assert_eq!(body["checks"]["nats"]["ok"], false, "{url}: {body}");
        assert!(body["checks"]["nats"]["error"].as_str().is_some_and(|e| e.contains("NATS")), "{url}: {body}");
        assert_eq!(body["checks"]["database"]["ok"], true, "{url}: {body}");
        // Alive all the same on a probe port: the process runs.
        let alive = http("GET", &url.replace("/readyz", "/healthz"), None, &[], None);
        assert_eq!(alive.status, 200, "{url}: {}", alive.raw);
    }
    // R-ARCH-13: the public answer names nothing of what failed.
    let (_, body) = eventually(&sys.url("/healthz"), Duration::from_secs(30), |status, _| status == 503);
    assert_eq!(body, json!({"status": "unavailable"}));
    sys.nats().up();
    for url in urls.iter().chain([&sys.url("/healthz")]) {
        let (_, body) = eventually(url, Duration::from_secs(60), |status, _| status == 200);
        assert!(body == json!({"status": "ready"}) || body == json!({"status": "ok"}), "{url}: {body}");
    }
    // Ready means working: a draft goes through again.
    let agent = sys.agent.clone();
    let submitted = sys.post("/api/v1/boxes/box-drafts", &agent, &json!({"box_type": "after-outage", "purpose": "p"}));
    assert_eq!(submitted.status, 201, "{}", submitted.raw);
}

#[test]
fn the_embedded_system_is_alive_and_ready_on_its_probe_port() {
    let mut sys = System::start(Mode::Embedded);
    let probes = sys.probe_url("atasira dev");
    let alive = http("GET", &format!("{probes}/healthz"), None, &[], None);
    assert_eq!((alive.status, &alive.body), (200, &json!({"status": "alive"})), "{}", alive.raw);
    let ready = http("GET", &format!("{probes}/readyz"), None, &[], None);
    assert_eq!((ready.status, &ready.body), (200, &json!({"status": "ready"})), "{}", ready.raw);
    assert_eq!(http("GET", &sys.url("/readyz"), None, &[], None).status, 404, "readiness is on the probe port only");
}

#[test]
fn a_stalled_consumer_makes_its_process_not_ready() {
    // R-OPS-2: a drafts event the drafts view cannot read (written behind the product's
    // back) stalls that view; the drafts process says it is not ready and names it.
    let mut sys = System::start(Mode::Cluster);
    let drafts = format!("{}/readyz", sys.probe_url("serve drafts"));
    assert_eq!(http("GET", &drafts, None, &[], None).status, 200);
    sys.append_raw_event("draft", "broken", 1, "DraftSubmitted", r#"{"DraftSubmitted": {"nonsense": true}}"#);
    let (_, body) = eventually(&drafts, Duration::from_secs(30), |status, _| status == 503);
    assert_eq!(body["status"], "not_ready", "{body}");
    assert_eq!(body["checks"]["consumers"]["ok"], false, "{body}");
    assert!(body["checks"]["consumers"]["stalled"].to_string().contains("drafts_view"), "{body}");
    assert_eq!((&body["checks"]["nats"]["ok"], &body["checks"]["database"]["ok"]), (&json!(true), &json!(true)), "{body}");
    // Alive all the same.
    let alive = http("GET", &drafts.replace("/readyz", "/healthz"), None, &[], None);
    assert_eq!(alive.status, 200);
}
