//! Scale-out on a NATS cluster (issue 13 item 5; R-ARCH-7, R-ARCH-8, R-OPS-3): three
//! nats-servers (authenticated routes on loopback, the events stream kept in three copies),
//! two processes of every service and two gateways. Clients run draft → approve → archive
//! cycles with an `Idempotency-Key` per command, retrying on the other gateway when one
//! fails, as a client of such a system would. Under that load one NATS node is SIGKILLed,
//! then one process of every service and one gateway (the oldest of each, which holds the
//! relays and consumers).
//!
//! What must hold: no acknowledged command is lost, no draft or Box is made twice, the Box
//! limit is never exceeded (replayed from the store), the audit ledger verifies, the read
//! models converge on the store, every event reaches the replicated stream once, and
//! throughput comes back (the time it takes is printed, not asserted). Then the dead are
//! restarted: the NATS node catches the stream up and the processes stand by.
//!
//! `ATASIRA_LONG_TESTS=1` runs a heavier load for longer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::{Answer, System, http};
use serde_json::{Value, json};

/// How hard and how long.
#[derive(Debug, Clone, Copy)]
struct Load {
    clients: usize,
    /// Before the first kill, and after each kill before the next.
    settle: Duration,
}

impl Load {
    fn from_env() -> Load {
        if std::env::var("ATASIRA_LONG_TESTS").is_ok_and(|v| v == "1") {
            Load { clients: 8, settle: Duration::from_secs(20) }
        } else {
            Load { clients: 4, settle: Duration::from_secs(6) }
        }
    }
}

/// What the clients were told, and when.
#[derive(Debug, Default)]
struct Record {
    /// Acknowledged drafts: box_type → draft_id.
    drafts: BTreeMap<String, String>,
    /// Acknowledged approvals: draft_id → box_id.
    approved: BTreeMap<String, String>,
    /// Acknowledged archives: box_id.
    archived: BTreeSet<String>,
    /// Approvals refused because the limit was reached (the draft stays pending).
    limited: usize,
    /// Commands given up after retrying for a minute (not acknowledged: no promise made).
    gave_up: Vec<String>,
    /// Answers no client should ever get (a 4xx other than the limit, say).
    unexpected: Vec<String>,
    /// When each acknowledgement arrived.
    acks: Vec<Instant>,
    /// Each acknowledged command's first attempt and its answer.
    spans: Vec<(Instant, Instant)>,
    /// Retries after a failed attempt.
    retries: usize,
}

/// Sends one command until it gets an answer that is not a failure of the system (no
/// answer, 5xx), with the same Idempotency-Key, switching to the other gateway after each
/// failure (`gateway` is the one to try first, and then the one that answered); `None`
/// after a minute.
fn send(gateways: &[String], gateway: &mut usize, path: &str, token: &str, key: &str, body: &Value, record: &Mutex<Record>) -> Option<Answer> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let bytes = body.to_string();
    loop {
        let base = &gateways[*gateway % gateways.len()];
        let a = http("POST", &format!("{base}{path}"), Some(token), &[("Idempotency-Key", key)], Some(bytes.as_bytes()));
        if a.status != 0 && a.status < 500 {
            record.lock().expect("record").spans.push((started, Instant::now()));
            return Some(a);
        }
        *gateway += 1;
        if Instant::now() > deadline {
            return None;
        }
        record.lock().expect("record").retries += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One client: cycles until `stop`.
fn client(n: usize, gateways: &[String], agent: &str, admin: &str, stop: &AtomicBool, record: &Mutex<Record>) {
    let ack = |f: &dyn Fn(&mut Record)| {
        let mut r = record.lock().expect("record");
        r.acks.push(Instant::now());
        f(&mut r);
    };
    let odd = |what: String| record.lock().expect("record").unexpected.push(what);
    let gave_up = |what: String| record.lock().expect("record").gave_up.push(what);
    // Clients start spread over the gateways.
    let mut gateway = n;
    for cycle in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let box_type = format!("scale-{n}-{cycle}");
        let body = json!({"box_type": box_type, "purpose": "scale-out load", "success_criteria": ["it stays correct"]});
        let Some(a) = send(gateways, &mut gateway, "/api/v1/boxes/box-drafts", agent, &format!("{box_type}-draft"), &body, record) else {
            gave_up(format!("draft {box_type}"));
            continue;
        };
        if a.status != 201 {
            odd(format!("draft {box_type}: {} {}", a.status, a.raw));
            continue;
        }
        let draft_id = a.body["draft_id"].as_str().expect("draft_id").to_owned();
        ack(&|r| {
            r.drafts.insert(box_type.clone(), draft_id.clone());
        });

        let path = format!("/api/v1/boxes/box-drafts/{draft_id}/approve");
        let Some(a) = send(gateways, &mut gateway, &path, admin, &format!("{box_type}-approve"), &json!({"confirm_over_limit": false}), record) else {
            gave_up(format!("approve {draft_id}"));
            continue;
        };
        match (a.status, a.body["error"].as_str()) {
            (200, _) => {}
            (409, Some("box_limit_reached")) => {
                ack(&|r| r.limited += 1);
                continue;
            }
            _ => {
                odd(format!("approve {draft_id}: {} {}", a.status, a.raw));
                continue;
            }
        }
        let box_id = a.body["box_id"].as_str().expect("box_id").to_owned();
        ack(&|r| {
            r.approved.insert(draft_id.clone(), box_id.clone());
        });

        let path = format!("/api/v1/boxes/{box_id}/archive");
        let Some(a) = send(gateways, &mut gateway, &path, admin, &format!("{box_type}-archive"), &json!({}), record) else {
            gave_up(format!("archive {box_id}"));
            continue;
        };
        if a.status == 200 && a.body["state"] == "archived" {
            ack(&|r| {
                r.archived.insert(box_id.clone());
            });
        } else {
            odd(format!("archive {box_id}: {} {}", a.status, a.raw));
        }
    }
}

/// Acknowledgements per second in `[from, to)`.
fn rate(acks: &[Instant], from: Instant, to: Instant) -> f64 {
    let n = acks.iter().filter(|t| **t >= from && **t < to).count();
    n as f64 / to.duration_since(from).as_secs_f64().max(1e-3)
}

/// How long after `kill` the acknowledgements were back to half the rate of the `before`
/// window: the start of the first one-second window (sliding by 100 ms) that reaches it.
fn recovery(acks: &[Instant], kill: Instant, before: Duration, until: Instant) -> Option<Duration> {
    let baseline = rate(acks, kill - before, kill);
    let window = Duration::from_secs(1);
    let mut at = kill;
    while at + window <= until {
        if rate(acks, at, at + window) >= baseline / 2.0 {
            return Some(at - kill);
        }
        at += Duration::from_millis(100);
    }
    None
}

/// Every row of a read model's list, following `next_cursor`.
fn all_pages(sys: &System, path: &str, field: &str) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit=200&cursor={c}"),
            None => format!("{path}{sep}limit=200"),
        };
        let page = sys.get(&url, &sys.admin);
        assert_eq!(page.status, 200, "{url}: {}", page.raw);
        rows.extend(page.body[field].as_array().cloned().unwrap_or_default());
        match page.body["next_cursor"].as_str().filter(|c| !c.is_empty()) {
            Some(c) => cursor = Some(c.to_owned()),
            None => return rows,
        }
    }
}

/// The ids of `aggregate_type`'s aggregates that have an event of `event_type`.
fn ids_with(sys: &System, aggregate_type: &str, event_type: &str) -> Vec<String> {
    let listed = sys.sql_text(&format!(
        "SELECT COALESCE(string_agg(aggregate_id, ',' ORDER BY global_position), '') FROM events WHERE aggregate_type = '{aggregate_type}' AND event_type = '{event_type}'"
    ));
    listed.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// The events stream as JetStream reports it (read as the operator).
struct StreamState {
    messages: u64,
    replicas: usize,
    /// The leader's peers: (server name, current, offline).
    peers: Vec<(String, bool, bool)>,
}

/// The events the JetStream stream holds, and its replicas (read as the operator).
fn stream_state(sys: &System) -> StreamState {
    use atasira_contracts::subjects;
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
        let js = sys.jetstream_as(subjects::OPERATOR).await;
        let mut stream = js.get_stream(subjects::EVENTS_STREAM).await.expect("the events stream");
        let info = stream.info().await.expect("info");
        let peers = info.cluster.as_ref().map(|c| c.replicas.iter().map(|p| (p.name.clone(), p.current, p.offline)).collect()).unwrap_or_default();
        StreamState { messages: info.state.messages, replicas: info.config.num_replicas, peers }
    })
}

#[test]
fn three_nats_nodes_and_two_of_every_process_lose_nothing_when_one_of_each_dies_under_load() {
    let load = Load::from_env();
    let limit = 3;
    let env = [
        ("ATASIRA_MAX_BOXES", limit.to_string()),
        // A request whose NATS node died is answered 503 after this, and retried; a retry
        // of a request whose gateway died takes its Idempotency-Key over after the lease
        // these bound (3 × 5 s + 5 s + a margin: about 26 s).
        ("ATASIRA_REQUEST_TIMEOUT", "5".to_owned()),
        ("ATASIRA_CONSISTENCY_WAIT", "5".to_owned()),
        // The load comes from a few users as fast as it can: no per-user rate.
        ("ATASIRA_RATE_LIMIT", "0".to_owned()),
    ];
    let mut sys = System::start_scaled(3, 2, &env);
    let gateways = sys.gateway_urls();
    assert_eq!(gateways.len(), 2);
    let (agent, admin) = (sys.agent.clone(), sys.admin.clone());

    let stop = AtomicBool::new(false);
    let record = Mutex::new(Record::default());
    let started = Instant::now();
    let mut kills: Vec<(&str, Instant)> = Vec::new();
    std::thread::scope(|s| {
        for n in 0..load.clients {
            let (gateways, agent, admin, stop, record) = (&gateways, &agent, &admin, &stop, &record);
            s.spawn(move || client(n, gateways, agent, admin, stop, record));
        }
        std::thread::sleep(load.settle);
        // One NATS node: its clients reconnect to the others; the stream keeps a quorum.
        sys.nats().kill_node(1);
        kills.push(("one NATS node", Instant::now()));
        std::thread::sleep(load.settle);
        // The oldest process of every service (it holds the relays and consumers) and a gateway.
        for name in ["serve drafts", "serve approval", "serve provisioner", "serve runtime-registry", "serve audit", "serve gateway"] {
            sys.kill_oldest(name);
        }
        kills.push(("one process of every service and a gateway", Instant::now()));
        // The checks below read through the gateway that is left.
        sys.base_url = gateways[1].clone();
        std::thread::sleep(load.settle + load.settle);
        stop.store(true, Ordering::Relaxed);
    });
    let ended = Instant::now();
    let record = record.into_inner().expect("record");

    // The figures (the closing note reports them).
    eprintln!(
        "scale-out: {} clients, {:.1} s of load, {} acknowledgements, {} retries",
        load.clients,
        (ended - started).as_secs_f64(),
        record.acks.len(),
        record.retries
    );
    eprintln!(
        "scale-out: {} drafts, {} approvals ({} refused at the limit of {limit}), {} archives acknowledged; {} gave up",
        record.drafts.len(),
        record.approved.len(),
        record.limited,
        record.archived.len(),
        record.gave_up.len()
    );
    for (i, (what, at)) in kills.iter().enumerate() {
        let next = kills.get(i + 1).map_or(ended, |(_, t)| *t);
        let before = rate(&record.acks, *at - Duration::from_secs(3), *at);
        let first = record.acks.iter().find(|t| *t > at).map(|t| *t - *at);
        let back = recovery(&record.acks, *at, Duration::from_secs(3), next);
        // The longest any command in flight at the kill, or sent after it, waited for its answer.
        let longest = record.spans.iter().filter(|(_, end)| end > at && end <= &next).map(|(start, end)| *end - (*start).max(*at)).max();
        eprintln!(
            "scale-out: killed {what}: {before:.1} acks/s before; first acknowledgement after {}; throughput back to half after {}; \
             the slowest command in flight waited {}",
            first.map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            back.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            longest.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64())),
        );
    }
    assert!(record.gave_up.is_empty(), "commands never answered after a minute of retries: {:?}", record.gave_up);
    assert!(record.unexpected.is_empty(), "answers no client should get: {:#?}", record.unexpected);
    assert!(record.drafts.len() >= load.clients && !record.approved.is_empty(), "the load ran: {record:?}");
    for (i, (what, at)) in kills.iter().enumerate() {
        let next = kills.get(i + 1).map_or(ended, |(_, t)| *t);
        assert!(record.acks.iter().any(|t| t > at && *t < next), "nothing was acknowledged after {what} was killed");
    }

    // Nothing acknowledged is lost, nothing is made twice: the store.
    let drafts = ids_with(&sys, "draft", "DraftSubmitted");
    let distinct: BTreeSet<&String> = drafts.iter().collect();
    assert_eq!(distinct.len(), drafts.len(), "a draft submitted twice");
    for (box_type, id) in &record.drafts {
        assert!(distinct.contains(id), "the acknowledged draft {id} ({box_type}) is not in the store");
    }
    let approved = ids_with(&sys, "draft", "DraftApproved");
    for id in record.approved.keys() {
        assert!(approved.contains(id), "the acknowledged approval of {id} is not in the store");
    }
    let activated = ids_with(&sys, "box", "BoxActivated");
    let archived = ids_with(&sys, "box", "BoxArchived");
    assert_eq!(activated.iter().collect::<BTreeSet<_>>().len(), activated.len(), "a Box activated twice");
    assert_eq!(activated.len(), approved.len(), "one Box per approved draft: {} Boxes, {} approvals", activated.len(), approved.len());
    for box_id in record.approved.values() {
        assert!(activated.contains(box_id), "the acknowledged Box {box_id} is not in the store");
    }
    for box_id in &record.archived {
        assert!(archived.contains(box_id), "the acknowledged archive of {box_id} is not in the store");
    }

    // The limit, replayed in commit order: a Box counts from its activation to its archive.
    let order = sys.sql_text(
        "SELECT COALESCE(string_agg(event_type, ',' ORDER BY global_position), '') FROM events WHERE aggregate_type = 'box' AND event_type IN ('BoxActivated', 'BoxArchived')",
    );
    let (mut active, mut most) = (0_i64, 0_i64);
    for event in order.split(',').filter(|e| !e.is_empty()) {
        active += if event == "BoxActivated" { 1 } else { -1 };
        most = most.max(active);
    }
    eprintln!("scale-out: at most {most} Boxes active at once (limit {limit})");
    assert!(most <= limit, "{most} Boxes were active at once, over the limit of {limit}");

    // The read models converge on the store.
    eventually("the read models converging", Duration::from_secs(60), || {
        let listed = all_pages(&sys, "/api/v1/boxes/box-drafts", "drafts");
        let by_id: BTreeMap<&str, &str> = listed.iter().filter_map(|d| Some((d["draft_id"].as_str()?, d["status"].as_str()?))).collect();
        if by_id.len() != drafts.len() {
            return Err(format!("{} drafts listed, {} in the store", by_id.len(), drafts.len()));
        }
        for id in &drafts {
            let want: &[&str] = if approved.contains(id) { &["approved", "active"] } else { &["pending_approval"] };
            if !by_id.get(id.as_str()).is_some_and(|s| want.contains(s)) {
                return Err(format!("draft {id}: listed {:?}, the store says {want:?}", by_id.get(id.as_str())));
            }
        }
        let boxes = all_pages(&sys, "/api/v1/boxes?state=all", "boxes");
        let states: BTreeMap<&str, &str> = boxes.iter().filter_map(|b| Some((b["box_id"].as_str()?, b["state"].as_str()?))).collect();
        if states.len() != activated.len() {
            return Err(format!("{} Boxes listed, {} in the store", states.len(), activated.len()));
        }
        for id in &activated {
            let want = if archived.contains(id) { "archived" } else { "idle" };
            if states.get(id.as_str()) != Some(&want) {
                return Err(format!("Box {id}: listed {:?}, the store says {want}", states.get(id.as_str())));
            }
        }
        Ok(())
    });

    // One writer at a time kept the ledger's chain whole, with a row per draft.
    eventually("the audit ledger catching up", Duration::from_secs(60), || {
        let rows = all_pages(&sys, "/api/v1/audit?action=box_draft.create", "rows");
        if rows.len() == drafts.len() { Ok(()) } else { Err(format!("{} ledger rows for {} drafts", rows.len(), drafts.len())) }
    });
    let (code, verified) = sys.audit_verify();
    assert_eq!(code, 0, "{verified}");

    // Every event reached the replicated stream, once (JetStream drops the relays' repeats).
    // (The audit service keeps appending signed checkpoints, so both are read each time.)
    let events = eventually("every event on the stream", Duration::from_secs(60), || {
        let events = u64::try_from(sys.sql_i64("SELECT count(*) FROM events")).expect("count");
        let StreamState { messages, replicas, .. } = stream_state(&sys);
        if replicas != 3 {
            return Err(format!("the stream has {replicas} replicas"));
        }
        if messages == events { Ok(events) } else { Err(format!("{messages} messages on the stream, {events} events in the store")) }
    });
    eprintln!("scale-out: {events} events in the store, each on the stream (3 replicas) once");

    // The dead come back, as an operator would restart them: the NATS node rejoins and
    // catches the stream up, restarted processes stand by, and a new gateway serves.
    sys.nats().up();
    for service in ["drafts", "approval", "provisioner", "runtime-registry", "audit"] {
        sys.start_service(service, &env);
    }
    sys.start_gateway(&env);
    eventually("the restarted NATS node catching the stream up", Duration::from_secs(60), || {
        let peers = stream_state(&sys).peers;
        let healthy = peers.len() == 2 && peers.iter().all(|(_, current, offline)| *current && !offline);
        if healthy { Ok(()) } else { Err(format!("the leader's peers: {peers:?}")) }
    });
    eventually("the restarted processes standing by", Duration::from_secs(60), || {
        for service in ["serve drafts", "serve approval", "serve provisioner", "serve runtime-registry", "serve audit"] {
            let newest = sys.stderr_of(service).pop().unwrap_or_default();
            if !newest.contains("standing by") {
                return Err(format!("{service} restarted but not standing by"));
            }
        }
        Ok(())
    });
    let a = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &json!({"box_type": "after-the-restarts", "purpose": "healed"}));
    assert_eq!((a.status, a.header("x-atasira-lagging")), (201, None), "{}", a.raw);
}
