//! The Box's whole life over REST (issue 10, items 3 and 4), in embedded mode and as a
//! cluster on a real nats-server and PostgreSQL: the Box list by state with cursor pages,
//! the history of a Box read from the store, decided drafts by status, unassignment, and
//! the feasibility check for any caller. One system per mode carries every scenario.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use atasira_tests::fixtures::draft_body;
use atasira_tests::harness::{Mode, System, http};
use serde_json::{Value, json};

/// Drafts (as the agent) and approves (as the admin); the Box id.
fn active_box(sys: &System, body: &Value) -> String {
    let a = sys.approve(&sys.draft(body), &sys.admin, false);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["box_id"].as_str().expect("box_id").to_owned()
}

fn delete(sys: &System, path: &str, token: &str, headers: &[(&str, &str)]) -> atasira_tests::harness::Answer {
    http("DELETE", &sys.url(path), Some(token), headers, None)
}

/// Every page of a list route, walked with `limit`; the items of `key` in page order.
fn walk(sys: &System, path: &str, token: &str, key: &str, limit: usize) -> Vec<Value> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let a = sys.get(&url, token);
        assert_eq!(a.status, 200, "{url}: {}", a.raw);
        let page = a.body[key].as_array().cloned().unwrap_or_default();
        assert!(page.len() <= limit, "{url}: a page holds at most its limit: {}", a.raw);
        items.extend(page);
        match a.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return items,
        }
    }
    panic!("{path}: the pages never ended");
}

fn ids(items: &[Value], key: &str) -> Vec<String> {
    items.iter().map(|i| i[key].as_str().unwrap_or_default().to_owned()).collect()
}

fn assert_bad_query(sys: &System, path: &str, token: &str, code: &str, parameter: &str) {
    let a = sys.get(path, token);
    assert_eq!((a.status, a.body["error"].as_str(), a.body["details"]["parameter"].as_str()), (400, Some(code), Some(parameter)), "{path}: {}", a.raw);
    assert!(a.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{path}: {}", a.raw);
}

#[test]
fn a_boxs_whole_life_is_queryable_and_feasibility_answers_any_caller() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        // Provisioning gives up quickly here, so its failure is part of the history.
        let system = System::start_with(mode, &[("ATASIRA_PROVISION_BACKOFF_MS", "5".to_owned())]);
        let sys = &system;
        let carol = sys.token("carol", "member", "human");
        let mut first = draft_body("life-a");
        first["required_access"] =
            json!([{"type": "git_remote", "url": "file:///nonexistent/atasira/life.git"}, {"type": "ssh_target", "host": "build.example", "user": "ci"}]);
        let a = active_box(sys, &first);
        let b = active_box(sys, &draft_body("life-b"));
        let c = active_box(sys, &draft_body("life-c"));

        feasibility(sys, &carol);
        unassignment(sys, &a, &carol);

        // R-BOX-7: stop b, archive c, and draft life-c again: two Boxes share the box_type.
        assert_eq!(sys.post(&format!("/api/v1/boxes/{b}/stop"), &sys.admin, &json!({})).status, 200);
        assert_eq!(sys.post(&format!("/api/v1/boxes/{c}/archive"), &sys.admin, &json!({})).status, 200);
        let c2 = active_box(sys, &draft_body("life-c"));
        assert_eq!(sys.post(&format!("/api/v1/boxes/{a}/stop"), &sys.admin, &json!({})).status, 200);
        assert_eq!(sys.post(&format!("/api/v1/boxes/{a}/resume"), &sys.admin, &json!({})).status, 200);

        box_lists(sys, [&a, &b, &c, &c2]);
        history(sys, &a, &c);
        drafts_by_status(sys, &carol);
    }
}

/// R-BOX-5: `state` filters (default: the active Boxes, idle or running, not stopped or
/// archived ones; `running` matches nothing until hosts run Workers); pages walk every Box
/// once, in activation order; bad values are 400.
fn box_lists(sys: &System, [a, b, c, c2]: [&str; 4]) {
    let list = |q: &str| {
        let r = sys.get(&format!("/api/v1/boxes{q}"), &sys.agent);
        assert_eq!(r.status, 200, "{q}: {}", r.raw);
        assert_eq!(r.body["next_cursor"], Value::Null, "{q}: {}", r.raw);
        ids(r.body["boxes"].as_array().expect("boxes"), "box_id")
    };
    assert_eq!(list(""), [a, c2], "stopped and archived Boxes are left out by default");
    assert_eq!(list("?state=idle"), [a, c2]);
    assert_eq!(list("?state=stopped"), [b]);
    assert_eq!(list("?state=archived"), [c], "archived Boxes stay queryable");
    assert_eq!(list("?state=running"), Vec::<String>::new(), "no Box has Workers running yet");
    assert_eq!(list("?state=all"), [a, b, c, c2]);
    let all = sys.get("/api/v1/boxes?state=all", &sys.agent).body["boxes"].as_array().cloned().expect("boxes");
    let life_c: Vec<&str> = all.iter().filter(|x| x["box_type"] == "life-c").map(|x| x["state"].as_str().unwrap_or_default()).collect();
    assert_eq!(life_c, ["archived", "idle"], "several Boxes share a box_type once one is archived");
    for limit in [1, 2, 3] {
        let walked = ids(&walk(sys, "/api/v1/boxes?state=all", &sys.agent, "boxes", limit), "box_id");
        assert_eq!(walked, [a, b, c, c2], "limit {limit}: every Box once, none missing");
    }
    assert_eq!(ids(&walk(sys, "/api/v1/boxes", &sys.agent, "boxes", 1), "box_id"), [a, c2]);
    assert_bad_query(sys, "/api/v1/boxes?state=active", &sys.agent, "invalid_query", "state");
    assert_bad_query(sys, "/api/v1/boxes?state=", &sys.agent, "invalid_query", "state");
    assert_bad_query(sys, "/api/v1/boxes?status=idle", &sys.agent, "invalid_query", "status");
    assert_bad_query(sys, "/api/v1/boxes?limit=0", &sys.agent, "invalid_limit", "limit");
    assert_bad_query(sys, "/api/v1/boxes?cursor=abc", &sys.agent, "invalid_cursor", "cursor");
}

/// R-BOX-6, R-AUDIT-1: a human admin or the Box's primary removes an assignment
/// (`BoxUserUnassigned`, audited `box.unassign`); a user not assigned is 404; a retry with
/// the same Idempotency-Key answers the first answer.
fn unassignment(sys: &System, a: &str, carol: &str) {
    let assign = |user: &str, role: &str| {
        let r = sys.post(&format!("/api/v1/boxes/{a}/user-assignments"), &sys.admin, &json!({"user_id": user, "role_in_box": role}));
        assert_eq!(r.status, 200, "{}", r.raw);
    };
    assign("carol", "member");
    assign("agent", "primary");
    let path = |user: &str| format!("/api/v1/boxes/{a}/user-assignments/{user}");
    // A member may not unassign, not even someone else's member.
    let refused = delete(sys, &path("agent"), carol, &[]);
    assert_eq!((refused.status, refused.body["error"].as_str()), (403, Some("forbidden")), "{}", refused.raw);
    // The Box's primary (an agent) removes carol.
    let removed = delete(sys, &path("carol"), &sys.agent, &[("Idempotency-Key", "unassign-carol")]);
    assert_eq!(removed.status, 200, "{}", removed.raw);
    assert_eq!(removed.body["assignments"], json!([{"user_id": "agent", "role_in_box": "primary"}]));
    assert!(removed.header("x-atasira-position").is_some_and(|p| p.parse::<i64>().is_ok_and(|p| p > 0)), "{:?}", removed.headers);
    let replay = delete(sys, &path("carol"), &sys.agent, &[("Idempotency-Key", "unassign-carol")]);
    assert_eq!((replay.status, replay.header("idempotent-replayed")), (200, Some("true")), "{}", replay.raw);
    assert_eq!(replay.body, removed.body);
    // Without the key the request is new: carol is not assigned any more.
    let again = delete(sys, &path("carol"), &sys.agent, &[]);
    assert_eq!((again.status, again.body["error"].as_str()), (404, Some("assignment_not_found")), "{}", again.raw);
    assert_eq!(delete(sys, &path("ghost"), &sys.admin, &[]).body["error"], "assignment_not_found");
    assert_eq!(delete(sys, "/api/v1/boxes/no-such-box/user-assignments/carol", &sys.admin, &[]).body["error"], "box_not_found");
    assert_eq!(sys.get(&format!("/api/v1/boxes/{a}"), &sys.agent).body["assignments"], json!([{"user_id": "agent", "role_in_box": "primary"}]));
    // The ledger has the signed row, read right after the write (read-your-writes).
    let rows = sys.get(&format!("/api/v1/audit?action=box.unassign&target={a}"), &sys.admin);
    let rows = rows.body["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0]["actor"].as_str(), rows[0]["mac"].as_str().map(str::len)), (Some("agent"), Some(64)));
    assert_eq!(sys.get("/api/v1/audit/verify", &sys.admin).body["ok"], true);
}

/// R-BOX-6, R-BOX-7, R-PROV-1: the history is every event of the Box in commit order,
/// typed, with who and when; pages walk it whole.
fn history(sys: &System, a: &str, c: &str) {
    let path = format!("/api/v1/boxes/{a}/history");
    // The provisioner's outcomes arrive on their own time.
    let deadline = Instant::now() + Duration::from_secs(60);
    let entries = loop {
        let r = sys.get(&format!("{path}?limit=200"), &sys.agent);
        assert_eq!(r.status, 200, "{}", r.raw);
        let entries = r.body["entries"].as_array().cloned().unwrap_or_default();
        let access = entries.iter().filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("access_"))).count();
        if access == 2 {
            assert_eq!(r.body["box_id"], a);
            break entries;
        }
        assert!(Instant::now() < deadline, "the provisioning outcomes never showed: {}", r.raw);
        std::thread::sleep(Duration::from_millis(100));
    };
    let life: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| !e["kind"].as_str().is_some_and(|k| k.starts_with("access_")))
        .map(|e| (e["kind"].as_str().unwrap_or_default(), e["actor"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        life,
        [
            ("activated", "admin"),
            ("user_assigned", "admin"),
            ("user_assigned", "admin"),
            ("user_unassigned", "agent"),
            ("stopped", "admin"),
            ("resumed", "admin")
        ],
        "{entries:?}"
    );
    let activated = &entries[0];
    assert_eq!((activated["box_type"].as_str(), activated["manifest_version"].as_str()), (Some("life-a"), Some("1.0.0")), "{activated}");
    assert!(activated["draft_id"].is_string() && activated["approval_key_id"].is_string() && activated["at"].is_string(), "{activated}");
    let unassigned = entries.iter().find(|e| e["kind"] == "user_unassigned").expect("unassigned");
    assert_eq!((unassigned["user_id"].as_str(), unassigned["role_in_box"].as_str()), (Some("carol"), Some("member")), "{unassigned}");
    assert_eq!(entries.iter().find(|e| e["kind"] == "stopped").map(|e| e["state"].clone()), Some(json!("stopped")));
    let failed = entries.iter().find(|e| e["kind"] == "access_provision_failed").expect("failed outcome");
    assert_eq!((failed["actor"].as_str(), failed["index"].as_u64(), failed["attempts"].as_u64()), (Some("system"), Some(0), Some(5)), "{failed}");
    assert!(failed["reason"].as_str().is_some_and(|r| !r.is_empty()), "{failed}");
    let provisioned = entries.iter().find(|e| e["kind"] == "access_provisioned").expect("provisioned outcome");
    assert_eq!(provisioned["index"], 1, "{provisioned}");
    // Times never go back, event ids never repeat.
    let times: Vec<&str> = entries.iter().filter(|e| !e["kind"].as_str().is_some_and(|k| k.starts_with("access_"))).filter_map(|e| e["at"].as_str()).collect();
    let times: Vec<chrono::DateTime<chrono::FixedOffset>> = times.iter().map(|t| chrono::DateTime::parse_from_rfc3339(t).expect("rfc 3339")).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    for limit in [1, 3] {
        let walked = walk(sys, &path, &sys.agent, "entries", limit);
        assert_eq!(ids(&walked, "event_id"), ids(&entries, "event_id"), "limit {limit}: the pages hold the history once, in order");
    }
    assert_eq!(ids(&entries, "event_id").iter().collect::<BTreeSet<_>>().len(), entries.len());
    // An archived Box keeps its history.
    let archived: Vec<String> = sys.get(&format!("/api/v1/boxes/{c}/history"), &sys.admin).body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(archived, ["activated", "archived"]);
    let missing = sys.get("/api/v1/boxes/no-such-box/history", &sys.agent);
    assert_eq!((missing.status, missing.body["error"].as_str()), (404, Some("box_not_found")), "{}", missing.raw);
    assert_bad_query(sys, &format!("{path}?cursor=12"), &sys.agent, "invalid_cursor", "cursor");
    assert_bad_query(sys, &format!("{path}?limit=-1"), &sys.agent, "invalid_limit", "limit");
    assert_bad_query(sys, &format!("{path}?state=all"), &sys.agent, "invalid_query", "state");
}

/// R-DRAFT-12, R-AUTH-2, R-APPROVE-1: admins list drafts by status, decided ones
/// included; requesters list their own with `mine=true`; pages walk all of them once.
fn drafts_by_status(sys: &System, carol: &str) {
    let rejected = sys.draft(&draft_body("life-rejected"));
    let r = sys.post(&format!("/api/v1/boxes/box-drafts/{rejected}/reject"), &sys.admin, &json!({"reason": "not now"}));
    assert_eq!(r.status, 200, "{}", r.raw);
    let withdrawn = sys.draft(&draft_body("life-withdrawn"));
    assert_eq!(sys.post(&format!("/api/v1/boxes/box-drafts/{withdrawn}/withdraw"), &sys.agent, &json!({})).status, 200);
    let pending = sys.draft(&draft_body("life-pending"));
    let carols = sys.post("/api/v1/boxes/box-drafts", carol, &draft_body("life-carol"));
    assert_eq!(carols.status, 201, "{}", carols.raw);
    let carols = carols.body["draft_id"].as_str().expect("id").to_owned();

    let list = |q: &str, token: &str| {
        let r = sys.get(&format!("/api/v1/boxes/box-drafts{q}"), token);
        assert_eq!(r.status, 200, "{q}: {}", r.raw);
        r.body["drafts"].as_array().cloned().unwrap_or_default()
    };
    assert_eq!(ids(&list("?status=rejected", &sys.admin), "draft_id"), [rejected.as_str()]);
    let decided = &list("?status=rejected", &sys.admin)[0]["decision"];
    assert_eq!((decided["by"].as_str(), decided["reason"].as_str()), (Some("admin"), Some("not now")), "{decided}");
    assert_eq!(ids(&list("?status=withdrawn", &sys.admin), "draft_id"), [withdrawn.as_str()]);
    assert_eq!(ids(&list("?status=pending_approval", &sys.admin), "draft_id"), [pending.clone(), carols.clone()]);
    assert_eq!(list("?status=expired", &sys.admin), Vec::<Value>::new());
    let approved = list("?status=approved", &sys.admin);
    assert_eq!(approved.len(), 4, "the four approved drafts, whose Boxes are active: {approved:?}");
    assert!(approved.iter().all(|d| d["status"] == "active" && d["box_id"].is_string()), "{approved:?}");
    assert_eq!(list("?status=active", &sys.admin).len(), 4);
    // Every draft, paged.
    let everything = list("?limit=200", &sys.admin);
    assert_eq!(everything.len(), 8);
    for limit in [1, 3] {
        let walked = walk(sys, "/api/v1/boxes/box-drafts", &sys.admin, "drafts", limit);
        assert_eq!(ids(&walked, "draft_id"), ids(&everything, "draft_id"), "limit {limit}");
    }
    let walked = walk(sys, "/api/v1/boxes/box-drafts?status=approved", &sys.admin, "drafts", 1);
    assert_eq!(ids(&walked, "draft_id"), ids(&approved, "draft_id"));
    // Requesters: their own, by status; everyone's needs role admin.
    assert_eq!(ids(&list("?mine=true&status=withdrawn", &sys.agent), "draft_id"), [withdrawn]);
    assert_eq!(list("?mine=true", &sys.agent).len(), 7);
    assert_eq!(ids(&list("?mine=true", carol), "draft_id"), [carols]);
    assert_eq!(list("?mine=true&status=rejected", carol), Vec::<Value>::new());
    for q in ["", "?status=rejected", "?mine=false"] {
        let refused = sys.get(&format!("/api/v1/boxes/box-drafts{q}"), &sys.agent);
        assert_eq!((refused.status, refused.body["error"].as_str()), (403, Some("forbidden")), "{q}: {}", refused.raw);
    }
    assert_bad_query(sys, "/api/v1/boxes/box-drafts?status=pending", &sys.admin, "invalid_query", "status");
    assert_bad_query(sys, "/api/v1/boxes/box-drafts?mine=yes", &sys.agent, "invalid_query", "mine");
    assert_bad_query(sys, "/api/v1/boxes/box-drafts?mine=true&cursor=x", &sys.agent, "invalid_cursor", "cursor");
}

/// R-FEAS-1: any authenticated caller (here a member, no admin role) gets the same
/// deterministic answer as `atasira manifest feasibility` on the Box's manifest, in
/// English and Japanese; no such Box is 404; bad bodies are 400/422.
fn feasibility(sys: &System, carol: &str) {
    let yaml = sys.data_dir().join("manifests/life-a.yaml");
    let path = "/api/v1/boxes/feasibility";
    for task in ["Read the sales CSV and email the report to the team", "毎週月曜に売上レポートをメールで送る", "Read the sales CSV file"] {
        let answer = sys.post(path, carol, &json!({"task_description": task, "box_type": "life-a"}));
        assert_eq!(answer.status, 200, "{task}: {}", answer.raw);
        assert!(answer.header("x-atasira-position").is_none(), "read-only: nothing was written");
        let (code, out, err) = sys.cli(&["manifest", "feasibility", yaml.to_str().expect("path"), task]);
        assert_eq!(code, 0, "{err}");
        let mut offline: Value = serde_json::from_str(&out).expect("the CLI prints JSON");
        offline["box_id"] = answer.body["box_id"].clone();
        assert_eq!(answer.body, offline, "{task}: REST and the CLI agree");
    }
    let en = sys.post(path, carol, &json!({"task_description": "Read the sales CSV and email the report to the team", "box_type": "life-a"}));
    assert_eq!((en.body["feasible"].as_bool(), en.body["missing_capabilities"].clone()), (Some(false), json!(["notify:email"])), "{}", en.raw);
    let ja = sys.post(path, &sys.agent, &json!({"task_description": "毎週月曜に売上レポートをメールで送る", "box_type": "life-a"}));
    assert_eq!(ja.body["missing_capabilities"], json!(["cron:schedule", "notify:email"]), "{}", ja.raw);
    let fits = sys.post(path, carol, &json!({"task_description": "Read the sales CSV file", "box_type": "life-a"}));
    assert_eq!((fits.body["feasible"].as_bool(), fits.body["available_operations"].clone()), (Some(true), json!(["file:read"])), "{}", fits.raw);
    let unknown = sys.post(path, carol, &json!({"task_description": "anything", "box_type": "no-such-type"}));
    assert_eq!((unknown.status, unknown.body["error"].as_str()), (404, Some("box_not_found")), "{}", unknown.raw);
    let blank = sys.post(path, carol, &json!({"task_description": "  ", "box_type": "life-a"}));
    assert_eq!((blank.status, blank.body["error"].as_str()), (422, Some("invalid_request")), "{}", blank.raw);
    let too_long = sys.post(path, carol, &json!({"task_description": "x".repeat(10_001), "box_type": "life-a"}));
    assert_eq!((too_long.status, too_long.body["error"].as_str()), (422, Some("invalid_request")), "{}", too_long.raw);
    let extra = sys.post(path, carol, &json!({"task_description": "t", "box_type": "life-a", "admin": true}));
    assert_eq!((extra.status, extra.body["error"].as_str()), (422, Some("invalid_request")), "{}", extra.raw);
    let missing = sys.post(path, carol, &json!({"task_description": "t"}));
    assert_eq!((missing.status, missing.body["error"].as_str()), (422, Some("invalid_request")), "{}", missing.raw);
    let not_json = http("POST", &sys.url(path), Some(carol), &[], Some(b"{"));
    assert_eq!((not_json.status, not_json.body["error"].as_str()), (400, Some("invalid_json")), "{}", not_json.raw);
    let anonymous = http("POST", &sys.url(path), None, &[], Some(br#"{"task_description":"t","box_type":"life-a"}"#));
    assert_eq!(anonymous.status, 401);
}

/// R-ARCH-5, R-BOX-2: `projections rebuild` rebuilds the manifest files where the
/// runtime-registry keeps them (its data dir, or `--manifests-dir` in cluster mode, where
/// it is required), never in the directory it runs in; and it exits 1, naming the event,
/// when an auditable event has no ledger row.
#[test]
fn a_rebuild_writes_manifest_files_where_the_registry_keeps_them_and_fails_on_an_incomplete_ledger() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let mut sys = System::start(mode);
        active_box(&sys, &draft_body("rebuilt-files"));
        let file = sys.data_dir().join("manifests/rebuilt-files.yaml");
        let written = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{mode:?}: the registry wrote {}: {e}", file.display()));
        std::fs::remove_file(&file).expect("remove the manifest file");

        if mode == Mode::Cluster {
            // With a database URL alone there is no place to put the files: refused, nothing written.
            let mut args = vec!["projections", "rebuild"];
            let target = sys.target_args();
            args.extend(target.iter().map(String::as_str));
            let (code, out, err) = sys.cli(&args);
            assert_ne!(code, 0, "{out}");
            assert!(err.contains("--manifests-dir"), "the error says what to add: {err}");
        }
        let (code, out, err) = sys.rebuild();
        assert_eq!(code, 0, "{mode:?}: {out} {err}");
        assert!(out.contains("registry_manifests"), "{out}");
        assert_eq!(std::fs::read_to_string(&file).ok().as_deref(), Some(written.as_str()), "{mode:?}: the file is back, as the registry wrote it");
        let stray: Vec<_> = std::fs::read_dir(sys.cli_dir()).expect("cli dir").collect();
        assert!(stray.is_empty(), "{mode:?}: nothing is written where the command runs: {stray:?}");

        // An auditable event written while no audit writer runs has no ledger row.
        sys.stop_gracefully();
        let payload = json!({"SecurityViolation": {"service": "drafts", "actor": "x", "target": "y", "kind": "invalid_assertion", "reason": "r", "at": "2026-12-01T00:00:00Z"}});
        sys.append_raw_event("drafts_security", "unrecorded", 1, "SecurityViolation", &payload.to_string());
        let (code, out, err) = sys.rebuild();
        assert_eq!(code, 1, "{mode:?}: an incomplete ledger fails the rebuild: {out} {err}");
        let report: Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("JSON: {out}"));
        assert_eq!(report["audit_ledger"]["missing"], json!(["drafts_security/unrecorded/1"]), "{mode:?}: {out}");
        assert!(err.contains("not complete"), "{err}");
    }
}

/// R-CHANGE-1, R-AUDIT-6: a Box's grant changes through a change request that a human admin
/// approves like a draft: the Box keeps its id, assignments and history, its version's
/// major goes up, new Workers get the new bundle and old ones keep theirs; a rejected change
/// changes nothing; one change is pending per Box; a trigger change goes the same way.
#[test]
fn a_boxs_grant_changes_through_a_change_request_and_a_human_approval() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let sys = System::start(mode);
        let box_id = active_box(&sys, &draft_body("grows"));
        let changes = format!("/api/v1/boxes/{box_id}/change-requests");
        let assign = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "primary"}));
        assert_eq!(assign.status, 200, "{}", assign.raw);
        let launch = |id: &str| {
            let a = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &json!({"launch_id": id, "input": [{"kind": "text", "value": "go"}]}));
            assert_eq!(a.status, 201, "{mode:?}: {}", a.raw);
            let worker = a.body["worker_id"].as_str().expect("worker_id").to_owned();
            let bundle = sys.get(&format!("/api/v1/workers/{worker}/provenance"), &sys.admin).body["bundle_digest"].as_str().expect("bundle").to_owned();
            (worker, bundle)
        };
        let (old_worker, old_bundle) = launch("before-change");

        // The ways that do not change a grant say which way does.
        let widening = http("PATCH", &sys.url(&format!("/api/v1/boxes/{box_id}/config")), Some(&sys.admin), &[], Some(br#"{"tools": ["Read", "Bash"]}"#));
        assert_eq!((widening.status, widening.body["error"].as_str()), (403, Some("capability_change_requires_new_draft")), "{}", widening.raw);
        assert!(widening.body["message"].as_str().is_some_and(|m| m.contains("/change-requests")), "{}", widening.raw);
        let again = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft_body("grows"));
        assert_eq!((again.status, again.body["error"].as_str()), (409, Some("box_type_exists")), "{mode:?}: refused at submit: {}", again.raw);
        assert!(again.body["message"].as_str().is_some_and(|m| m.contains(&changes)), "{}", again.raw);
        let carol = sys.token("carol", "member", "human");
        assert_eq!(sys.post(&changes, &carol, &json!({"tools": ["Read", "Bash"]})).status, 403, "a member who is not the primary");
        assert_eq!(sys.post(&changes, &sys.agent, &json!({"box_type": "other"})).status, 422);
        assert_eq!(sys.post("/api/v1/boxes/no-such-box/change-requests", &sys.agent, &json!({"tools": []})).status, 404);

        // The primary, an agent, asks for shell:exec.
        let widen = json!({"os_operations": ["file:read", "shell:exec"], "tools": ["Read", "Bash"], "shell": {"allowed_commands": ["git"]}});
        let asked = sys.post(&changes, &sys.agent, &widen);
        assert_eq!(asked.status, 201, "{mode:?}: {}", asked.raw);
        let change = asked.body["draft_id"].as_str().expect("draft_id").to_owned();
        assert_eq!((asked.body["over_limit"].as_bool(), asked.body["version"].as_str()), (Some(true), Some("2.0.0")), "{}", asked.raw);
        assert_eq!(asked.body["over_limit_ops"], json!(["shell:exec"]), "judged on what it adds");
        let second = sys.post(&changes, &sys.admin, &json!({"tools": ["Read", "Grep"]}));
        assert_eq!((second.status, second.body["error"].as_str()), (409, Some("change_request_pending")), "{}", second.raw);
        let pending = sys.pending();
        let listed = pending.iter().find(|d| d["draft_id"] == change.as_str()).unwrap_or_else(|| panic!("{mode:?}: not pending: {pending:?}"));
        assert_eq!((listed["kind"].as_str(), listed["box_id"].as_str()), (Some("change"), Some(box_id.as_str())), "{listed}");
        let added: Vec<&str> = listed["added"].as_array().expect("added").iter().filter_map(Value::as_str).collect();
        assert!(added.contains(&"os_operations: shell:exec") && added.contains(&"tools: Bash") && added.contains(&"shell.allowed_commands: git"), "{added:?}");

        // A human admin approves, confirming what is over the limit.
        let unconfirmed = sys.approve(&change, &sys.admin, false);
        assert_eq!((unconfirmed.status, unconfirmed.body["error"].as_str()), (409, Some("over_limit_confirmation_required")), "{}", unconfirmed.raw);
        let approved = sys.approve(&change, &sys.admin, true);
        assert_eq!(
            (approved.status, approved.body["status"].as_str(), approved.body["box_id"].as_str()),
            (200, Some("active"), Some(box_id.as_str())),
            "{mode:?}: {}",
            approved.raw
        );
        let changed = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent);
        assert_eq!(changed.body["manifest_version"], "2.0.0", "{}", changed.raw);
        assert_eq!(changed.body["manifest"]["tools"], json!(["Read", "Bash"]), "{}", changed.raw);
        assert!(
            changed.body["assignments"].as_array().expect("assignments").iter().any(|a| a["user_id"] == "agent" && a["role_in_box"] == "primary"),
            "assignments kept"
        );
        let history = sys.get(&format!("/api/v1/boxes/{box_id}/history"), &sys.agent);
        assert!(history.body["entries"].as_array().expect("entries").iter().any(|e| e["kind"] == "activated"), "history kept: {}", history.raw);
        assert!(
            history.body["entries"].as_array().expect("entries").iter().any(|e| e["kind"] == "manifest_changed" && e["draft_id"] == change.as_str()),
            "{}",
            history.raw
        );
        let rows = sys.get(&format!("/api/v1/audit?action=box.change&target={box_id}"), &sys.admin).body["rows"].as_array().cloned().expect("rows");
        assert_eq!(rows.len(), 1, "{mode:?}: {rows:?}");
        assert!(rows[0]["detail"].as_str().is_some_and(|d| d.contains("+os_operations: shell:exec")), "{rows:?}");
        let (new_worker, new_bundle) = launch("after-change");
        assert_ne!(new_bundle, old_bundle, "{mode:?}: a new Worker gets the new bundle");
        let kept = sys.get(&format!("/api/v1/workers/{old_worker}/provenance"), &sys.admin);
        assert_eq!(kept.body["bundle_digest"].as_str(), Some(old_bundle.as_str()), "{mode:?}: the old Worker keeps its bundle: {}", kept.raw);
        let chain = sys.get(&format!("/api/v1/workers/{new_worker}/provenance"), &sys.admin).body;
        let kinds: Vec<&str> = chain["steps"].as_array().expect("steps").iter().filter_map(|s| s["kind"].as_str()).collect();
        assert!(kinds.contains(&"activation") && kinds.contains(&"change"), "{mode:?}: the chain shows both: {kinds:?}");
        assert_eq!(chain["approval_verified"], true, "{mode:?}: the change's approval verifies: {chain}");

        // A trigger change: rejected, nothing changes; asked again and approved, it does.
        let trigger = json!({"trigger_type": "schedule", "trigger_schedule": "0 9 * * 1"});
        let asked = sys.post(&changes, &sys.agent, &trigger);
        assert_eq!((asked.status, asked.body["over_limit"].as_bool()), (201, Some(false)), "{}", asked.raw);
        let refused = asked.body["draft_id"].as_str().expect("draft_id").to_owned();
        let r = sys.post(&format!("/api/v1/boxes/box-drafts/{refused}/reject"), &sys.admin, &json!({"reason": "not on Mondays"}));
        assert_eq!(r.status, 200, "{}", r.raw);
        assert_eq!(sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent).body["manifest_version"], "2.0.0", "a rejected change changes nothing");
        // R-CHANGE-2: its requester revises it; the thread is kept.
        let revised = sys.post(&format!("/api/v1/boxes/box-drafts/{refused}/revise"), &sys.agent, &json!({"trigger_schedule": "0 9 * * 2"}));
        assert_eq!(revised.status, 201, "{mode:?}: a rejected change is revised: {}", revised.raw);
        assert_eq!((revised.body["kind"].as_str(), revised.body["status"].as_str()), (Some("change"), Some("pending_approval")), "{}", revised.raw);
        let thread = &revised.body["revision"];
        assert_eq!(
            (thread["of"].as_str(), thread["version"].as_u64(), thread["rejected_by"].as_str()),
            (Some(refused.as_str()), Some(2), Some("admin")),
            "{thread}"
        );
        assert_eq!((thread["reason"].as_str(), thread["earlier"].clone()), (Some("not on Mondays"), json!([refused])), "{thread}");
        assert_eq!(
            (thread["added"].clone(), thread["removed"].clone()),
            (json!(["trigger_schedule: 0 9 * * 2"]), json!(["trigger_schedule: 0 9 * * 1"])),
            "{thread}"
        );
        let twice = sys.post(&format!("/api/v1/boxes/box-drafts/{refused}/revise"), &sys.agent, &json!({"trigger_schedule": "0 9 * * 3"}));
        assert_eq!((twice.status, twice.body["error"].as_str()), (409, Some("draft_not_pending")), "one revision per rejection: {}", twice.raw);
        let by_admin = sys.post(&format!("/api/v1/boxes/box-drafts/{refused}/revise"), &sys.admin, &json!({"trigger_schedule": "0 9 * * 3"}));
        assert_eq!(by_admin.status, 403, "only the requester revises: {}", by_admin.raw);
        let approved = sys.approve(revised.body["draft_id"].as_str().expect("draft_id"), &sys.admin, false);
        assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("active")), "{}", approved.raw);
        let scheduled = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent);
        assert_eq!(
            (scheduled.body["manifest_version"].as_str(), scheduled.body["manifest"]["trigger_type"].as_str()),
            (Some("3.0.0"), Some("schedule")),
            "{}",
            scheduled.raw
        );

        // A rejected draft of a new Box is revised the same way, its version kept.
        let first = sys.draft(&draft_body("revised-new"));
        assert_eq!(sys.post(&format!("/api/v1/boxes/box-drafts/{first}/reject"), &sys.admin, &json!({"reason": "needs Grep"})).status, 200);
        let carol_sees = sys.post(&format!("/api/v1/boxes/box-drafts/{first}/revise"), &carol, &json!({"tools": ["Read", "Grep"]}));
        assert_eq!((carol_sees.status, carol_sees.body["error"].as_str()), (404, Some("draft_not_found")), "{}", carol_sees.raw);
        let second = sys.post(&format!("/api/v1/boxes/box-drafts/{first}/revise"), &sys.agent, &json!({"tools": ["Read", "Grep"]}));
        assert_eq!((second.status, second.body["kind"].as_str(), second.body["version"].as_str()), (201, Some("new"), Some("1.0.0")), "{}", second.raw);
        assert_eq!(second.body["revision"]["added"], json!(["tools: Grep"]), "{}", second.raw);
        let second_id = second.body["draft_id"].as_str().expect("id").to_owned();
        let not_rejected = sys.post(&format!("/api/v1/boxes/box-drafts/{second_id}/revise"), &sys.agent, &json!({"tools": []}));
        assert_eq!(not_rejected.body["error"], "draft_not_pending", "only a rejected draft is revised: {}", not_rejected.raw);
        let approved = sys.approve(&second_id, &sys.admin, false);
        assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("active")), "{mode:?}: {}", approved.raw);
        assert_eq!(sys.audit_verify().0, 0, "the ledger verifies");
    }
}

/// R-CHANGE-3: with `ATASIRA_OVER_LIMIT_APPROVALS=2`, an over-the-limit draft or change
/// needs two distinct human admins, neither its requester: the first approval leaves it
/// pending (shown with its progress), the second activates; one rejection ends it; a draft
/// within the limit needs one.
#[test]
fn over_the_limit_needs_two_human_admins_when_the_operator_says_so() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let sys = System::start_with(mode, &[("ATASIRA_OVER_LIMIT_APPROVALS", "2".to_owned())]);
        let (bob, carol) = (sys.token("bob", "admin", "human"), sys.token("carol", "admin", "human"));
        let over = |box_type: &str, token: &str| {
            let body = json!({"box_type": box_type, "purpose": "runs git", "tools": ["Read", "Bash"], "os_operations": ["file:read", "shell:exec"]});
            let a = sys.post("/api/v1/boxes/box-drafts", token, &body);
            assert_eq!(a.status, 201, "{}", a.raw);
            a.body["draft_id"].as_str().expect("draft_id").to_owned()
        };
        let draft = over("two-keys", &carol);
        let listed = |id: &str| sys.pending().into_iter().find(|d| d["draft_id"] == id).unwrap_or_else(|| panic!("{id} is not pending"));
        assert_eq!((listed(&draft)["approvals_required"].as_u64(), listed(&draft)["approvals"].clone()), (Some(2), json!([])));

        let first = sys.approve(&draft, &sys.admin, true);
        assert_eq!((first.status, first.body["status"].as_str()), (200, Some("pending_approval")), "{mode:?}: {}", first.raw);
        assert_eq!((first.body["approvals"].clone(), first.body["approvals_required"].as_u64()), (json!(["admin"]), Some(2)), "{}", first.raw);
        let again = sys.approve(&draft, &sys.admin, true);
        assert_eq!((again.status, again.body["status"].as_str()), (200, Some("pending_approval")), "the same admin twice is one approval: {}", again.raw);
        assert_eq!(listed(&draft)["approvals"], json!(["admin"]), "the pending list shows the progress");
        let own = sys.approve(&draft, &carol, true);
        assert_eq!((own.status, own.body["error"].as_str()), (403, Some("self_approval_forbidden")), "{}", own.raw);
        let unconfirmed = sys.approve(&draft, &bob, false);
        assert_eq!(unconfirmed.body["error"], "over_limit_confirmation_required", "{}", unconfirmed.raw);
        let second = sys.approve(&draft, &bob, true);
        assert_eq!((second.status, second.body["status"].as_str()), (200, Some("active")), "{mode:?}: {}", second.raw);
        assert_eq!(second.body["approvals"], json!(["admin"]), "{}", second.raw);
        let box_id = second.body["box_id"].as_str().expect("box_id").to_owned();
        assert_eq!(sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent).status, 200);
        let given =
            sys.get(&format!("/api/v1/audit?action=box_draft.approval_given&target={draft}"), &sys.admin).body["rows"].as_array().cloned().expect("rows");
        assert_eq!(given.len(), 1, "{mode:?}: each approval is a ledger row: {given:?}");
        assert!(given[0]["detail"].as_str().is_some_and(|d| d.starts_with("approval 1 of 2")), "{given:?}");

        // One rejection ends it.
        let rejected = over("two-keys-rejected", &sys.agent);
        assert_eq!(sys.approve(&rejected, &sys.admin, true).body["status"], "pending_approval");
        let r = sys.post(&format!("/api/v1/boxes/box-drafts/{rejected}/reject"), &bob, &json!({"reason": "no shell"}));
        assert_eq!(r.status, 200, "{}", r.raw);
        let late = sys.approve(&rejected, &carol, true);
        assert_eq!((late.status, late.body["error"].as_str()), (409, Some("draft_not_pending")), "{}", late.raw);

        // Within the limit, one approval; a change that adds shell:exec needs two again.
        let within = sys.draft(&draft_body("one-key"));
        let one = sys.approve(&within, &sys.admin, false);
        assert_eq!((one.status, one.body["status"].as_str(), one.body["approvals_required"].as_u64()), (200, Some("active"), Some(1)), "{}", one.raw);
        let small = one.body["box_id"].as_str().expect("box_id").to_owned();
        let asked = sys.post(&format!("/api/v1/boxes/{small}/change-requests"), &sys.admin, &json!({"os_operations": ["file:read", "shell:exec"]}));
        assert_eq!(asked.status, 201, "{}", asked.raw);
        let change = asked.body["draft_id"].as_str().expect("draft_id").to_owned();
        assert_eq!(sys.approve(&change, &bob, true).body["status"], "pending_approval");
        let done = sys.approve(&change, &carol, true);
        assert_eq!((done.status, done.body["status"].as_str()), (200, Some("active")), "{mode:?}: {}", done.raw);
        assert_eq!(sys.get(&format!("/api/v1/boxes/{small}"), &sys.agent).body["manifest_version"], "2.0.0");
        assert_eq!(sys.audit_verify().0, 0);
    }
}
