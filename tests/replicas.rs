//! Two replicas of a service (issue 13 item 5, R-ARCH-7): both answer requests (a NATS
//! queue group), but each relay and each consumer runs in one of them only, under a
//! PostgreSQL advisory lock; when the holder is SIGKILLed, the other takes over. Nothing
//! acknowledged is lost, the drafts view converges, and the audit ledger (one writer, one
//! hash chain) verifies.

use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::{Mode, System};
use serde_json::json;

fn pending(sys: &System) -> Vec<String> {
    let page = sys.get("/api/v1/boxes/box-drafts/pending?limit=200", &sys.admin);
    assert_eq!(page.status, 200, "{}", page.raw);
    page.body["drafts"].as_array().expect("drafts").iter().map(|d| d["draft_id"].as_str().expect("id").to_owned()).collect()
}

/// How long a wait here may take (the takeover needs the dead holder's session to end).
const TAKEOVER: Duration = Duration::from_secs(60);

#[test]
fn a_second_replica_stands_by_and_takes_over_the_consumers_when_the_first_dies() {
    let mut sys = System::start(Mode::Cluster);
    for service in ["drafts", "audit"] {
        sys.start_service(service, &[]);
    }
    // The replica that came second stands by for every consumer and relay of its service.
    eventually("the second replicas standing by", TAKEOVER, || {
        let standing_by = sys.stderr_of("serve audit")[1].contains("standing by") && sys.stderr_of("serve drafts")[1].contains("standing by");
        if standing_by { Ok(()) } else { Err("a second replica has not said it stands by".to_owned()) }
    });
    for replicas in [sys.stderr_of("serve drafts"), sys.stderr_of("serve audit")] {
        assert!(!replicas[0].contains("standing by"), "the first replica runs everything:\n{}", replicas[0]);
    }

    let mut acknowledged = Vec::new();
    for i in 0..4 {
        acknowledged.push(sys.draft(&json!({"box_type": format!("replica-before-{i}"), "purpose": "before the kill"})));
    }
    let approved = sys.approve(&acknowledged[0], &sys.admin, false);
    assert_eq!(approved.status, 200, "{}", approved.raw);
    acknowledged.remove(0);

    // The holders die; the standbys take over once PostgreSQL ends the dead sessions.
    let drafts = sys.kill_oldest("serve drafts");
    let audit = sys.kill_oldest("serve audit");
    assert!(!drafts.is_empty() && !audit.is_empty());
    for i in 0..4 {
        let a = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &json!({"box_type": format!("replica-after-{i}"), "purpose": "after the kill"}));
        // On failure, what the survivors said, for whoever reads the failure.
        let said = |name: &str| sys.stderr_of(name).join("\n");
        assert_eq!(a.status, 201, "{}\nsurvivors:\n{}\n{}\ngateway:\n{}", a.raw, said("serve drafts"), said("serve audit"), said("serve gateway"));
        acknowledged.push(a.body["draft_id"].as_str().expect("draft_id").to_owned());
    }
    eventually("the survivor taking over", TAKEOVER, || {
        let took_over = sys.stderr_of("serve drafts")[0].contains("took over") && sys.stderr_of("serve audit")[0].contains("took over");
        if took_over { Ok(()) } else { Err("a survivor has not said it took over".to_owned()) }
    });
    // Every acknowledged draft is in the view the survivor now keeps.
    eventually("the drafts view converging", TAKEOVER, || {
        let listed = pending(&sys);
        let missing: Vec<&String> = acknowledged.iter().filter(|id| !listed.contains(id)).collect();
        if missing.is_empty() { Ok(()) } else { Err(format!("acknowledged but not pending: {missing:?}")) }
    });
    assert_eq!(pending(&sys).len(), acknowledged.len());
    // One writer at a time: the ledger's chain holds, with a row for every draft.
    eventually("the ledger catching up", TAKEOVER, || {
        let rows = sys.get("/api/v1/audit?action=box_draft.create&limit=200", &sys.admin);
        // Eight drafts in all (one of them approved since).
        if rows.body["rows"].as_array().is_some_and(|r| r.len() == 8) { Ok(()) } else { Err(format!("not eight rows: {}", rows.raw)) }
    });
    let (code, verified) = sys.audit_verify();
    assert_eq!(code, 0, "{verified}");
}

#[test]
fn a_write_whose_wait_the_standby_answers_sees_the_other_replicas_consumers_soon() {
    // R-BOX-9 with replicas: the gateway's read-your-writes waits go to either drafts
    // process (a queue group), but the drafts view runs in one. The standby looks in the
    // store while it waits, 2 ms after its last look and at most 50 ms apart, instead of
    // once a second (the safety net), which would add up to a second to half the writes.
    let wait = [("ATASIRA_CONSISTENCY_WAIT", "3".to_owned())];
    // The first drafts process (it runs the drafts view) takes 300 ms per batch, so the
    // standby's first look never finds the write applied.
    let slow = [("ATASIRA_CONSISTENCY_WAIT", "3".to_owned()), ("ATASIRA_FAILPOINT_DELAY", "consumer.before_record:300".to_owned())];
    let mut sys = System::start_with(atasira_tests::harness::Mode::Cluster, &wait);
    sys.kill("serve drafts");
    sys.start_service("drafts", &slow);
    sys.start_service("drafts", &wait);
    eventually("the second drafts process standing by", TAKEOVER, || {
        if sys.stderr_of("serve drafts")[1].contains("standing by") { Ok(()) } else { Err("it has not said so".to_owned()) }
    });
    // Enough writes that the standby answers some of the waits (it does half, at random).
    let lagging: Vec<String> = (0..12)
        .filter_map(|i| {
            let a = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &json!({"box_type": format!("standby-{i}"), "purpose": "wait"}));
            assert_eq!(a.status, 201, "{}", a.raw);
            a.header("x-atasira-lagging").map(str::to_owned)
        })
        .collect();
    assert!(lagging.is_empty(), "writes answered before the drafts view had them: {lagging:?}");
    // The standby answered its share of the waits by its own looks, not its safety net.
    let metrics = atasira_tests::harness::http("GET", &format!("{}/metrics", sys.probe_url_of("serve drafts", 1)), None, &[], None).raw;
    let count = |look: &str| -> f64 {
        let line = format!("atasira_consistency_waits_total{{look=\"{look}\",outcome=\"applied\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(line.as_str())).map_or(0.0, |v| v.trim().parse().expect("a number"))
    };
    assert!(count("remote") > 0.0, "the standby answered no wait by its own looks:\n{metrics}");
    assert_eq!(count("safety_net"), 0.0, "the standby waited for its once-a-second look:\n{metrics}");
}
