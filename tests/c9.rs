//! The C9 flow end to end (SPEC §4–§7), in embedded mode and as a cluster of processes on
//! a real nats-server and PostgreSQL: approval, activation, provisioning, the audit ledger.

use std::time::Duration;

use atasira_tests::harness::{System, in_both_modes};
use serde_json::{Value, json};

fn sales(box_type: &str) -> Value {
    json!({"box_type": box_type, "name": box_type, "purpose": "週次売上レポートの自動作成", "success_criteria": ["毎週月曜にレポート生成"], "tools": ["Read"], "os_operations": ["file:read"]})
}

fn audit_actions(sys: &System) -> Vec<(String, String, String, String)> {
    let a = sys.get("/api/v1/audit?limit=500", &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap_or_default().to_owned(),
                r["target"].as_str().unwrap_or_default().to_owned(),
                r["key_id"].as_str().unwrap_or_default().to_owned(),
                r["mac"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn one_approval_passes_the_seeds_verification_list() {
    // R-BOX-8, R-APPROVE-4, R-BOX-4, R-BOX-2, R-AUDIT-1, R-BOX-6
    in_both_modes(|sys| {
        let id = sys.draft(&sales("sales-report"));
        let approved = sys.approve(&id, &sys.admin, false);
        assert_eq!(approved.status, 200, "{:?}: {}", sys.mode, approved.raw);
        assert_eq!(approved.body["status"], "active");
        assert_eq!(approved.body["box_type"], "sales-report");
        assert_eq!(approved.body["approved_by"], "admin");
        assert!(approved.body["approved_at"].is_string());
        let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
        assert_eq!(approved.header("x-atasira-lagging"), None, "every read model applied the approval before the answer");
        // 1. The draft is no longer pending.
        assert!(sys.pending().is_empty());
        // 2. The Box is listed, idle.
        let boxes = sys.get("/api/v1/boxes", &sys.agent);
        assert_eq!(
            boxes.body["boxes"],
            json!([{"box_id": box_id, "box_type": "sales-report", "name": "sales-report", "state": "idle", "manifest_version": "1.0.0", "created_at": approved.body["approved_at"]}]),
            "{}",
            boxes.raw
        );
        // 3. The YAML exists and is the manifest.
        let yaml = std::fs::read_to_string(sys.data_dir().join("manifests/sales-report.yaml")).expect("the manifest file exists");
        assert!(yaml.contains("box_type: sales-report") && yaml.contains("trigger_type: manual"), "{yaml}");
        // 4. Signed audit rows for create and approve (then activate and the bundle sync), after the issue of
        // the admin's and the agent's tokens.
        let rows = audit_actions(sys);
        let actions: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(actions, vec!["token.issue", "token.issue", "box_draft.create", "box_draft.approve", "box.activate", "bundle.sync"], "{rows:?}");
        assert!(rows.iter().all(|r| !r.2.is_empty() && r.3.len() == 64), "every row carries a key id and an HMAC");
        assert_eq!(sys.get("/api/v1/audit/verify", &sys.admin).body, json!({"ok": true, "rows": 6}));
        // The draft reads active with its Box and decision.
        let draft = sys.get(&format!("/api/v1/boxes/box-drafts/{id}"), &sys.agent);
        assert_eq!((draft.body["status"].as_str(), draft.body["box_id"].as_str()), (Some("active"), Some(box_id.as_str())), "{}", draft.raw);
        assert_eq!(draft.body["decision"]["by"], "admin");
        // Step 4 of the seed: approval does not assign the requester; an admin does.
        let detail = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent);
        assert_eq!(detail.body["assignments"], json!([]));
        assert_eq!(detail.body["manifest"]["box_type"], "sales-report");
        assert_eq!(detail.body["manifest_drift"], false);
        let assigned = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "primary"}));
        assert_eq!(assigned.status, 200, "{}", assigned.raw);
        assert_eq!(assigned.body["assignments"], json!([{"user_id": "agent", "role_in_box": "primary"}]));
        assert_eq!(
            sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.agent, &json!({"user_id": "x", "role_in_box": "member"})).status,
            200,
            "the Box's primary may assign"
        );
        let member = sys.token("carol", "member", "human");
        assert_eq!(sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &member, &json!({"user_id": "y", "role_in_box": "member"})).status, 403);
        // A repeat by the approving admin completes and answers 200 again (R-APPROVE-6).
        let again = sys.approve(&id, &sys.admin, false);
        assert_eq!((again.status, again.body["box_id"].as_str()), (200, Some(box_id.as_str())));
    });
}

#[test]
fn over_limit_needs_the_second_confirmation() {
    // R-APPROVE-3, R-DRAFT-8
    in_both_modes(|sys| {
        let id = sys.draft(&json!({"box_type": "ops", "purpose": "p", "os_operations": ["shell:exec"]}));
        let first = sys.approve(&id, &sys.admin, false);
        assert_eq!((first.status, first.body["error"].as_str()), (409, Some("over_limit_confirmation_required")));
        assert_eq!(sys.pending().len(), 1, "the draft stays pending");
        let second = sys.approve(&id, &sys.admin, true);
        assert_eq!((second.status, second.body["status"].as_str()), (200, Some("active")), "{}", second.raw);
    });
}

#[test]
fn only_human_admins_who_did_not_request_the_draft_decide() {
    // R-AUTH-2, R-AUTH-3, R-AUDIT-5
    in_both_modes(|sys| {
        let mine = {
            let a = sys.post("/api/v1/boxes/box-drafts", &sys.admin, &sales("mine"));
            a.body["draft_id"].as_str().expect("id").to_owned()
        };
        let self_approval = sys.approve(&mine, &sys.admin, false);
        assert_eq!((self_approval.status, self_approval.body["error"].as_str()), (403, Some("self_approval_forbidden")));
        let self_reject = sys.post(&format!("/api/v1/boxes/box-drafts/{mine}/reject"), &sys.admin, &json!({"reason": "x"}));
        assert_eq!(self_reject.body["error"], "self_approval_forbidden");
        // A refusal answers at once; its security_violation row follows like any other.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let violations = loop {
            let v: Vec<_> = audit_actions(sys).into_iter().filter(|r| r.0 == "security_violation").collect();
            if v.len() >= 2 || std::time::Instant::now() > deadline {
                break v;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(violations.len(), 2, "one signed security_violation row per attempt");
        assert!(violations.iter().all(|r| r.1 == mine));
        let id = sys.draft(&sales("theirs"));
        let agent_admin = sys.token("ops-bot", "admin", "agent");
        let member = sys.token("carol", "member", "human");
        for token in [&agent_admin, &member, &sys.agent.clone()] {
            let a = sys.approve(&id, token, false);
            assert_eq!((a.status, a.body["error"].as_str()), (403, Some("forbidden")), "{}", a.raw);
        }
        assert_eq!(sys.pending().len(), 2, "nothing was decided");
        assert_eq!(sys.approve("no-such-draft", &sys.admin, false).status, 404);
    });
}

#[test]
fn one_decision_per_draft_even_under_concurrency() {
    // R-APPROVE-5, R-APPROVE-6, R-APPROVE-7
    in_both_modes(|sys| {
        let rejected = sys.draft(&sales("rejected"));
        let r = sys.post(&format!("/api/v1/boxes/box-drafts/{rejected}/reject"), &sys.admin, &json!({"reason": "権限過大"}));
        assert_eq!((r.status, r.body["status"].as_str()), (200, Some("rejected")), "{}", r.raw);
        let late = sys.approve(&rejected, &sys.admin, false);
        assert_eq!((late.status, late.body["error"].as_str()), (409, Some("draft_not_pending")));
        let draft = sys.get(&format!("/api/v1/boxes/box-drafts/{rejected}"), &sys.agent);
        assert_eq!((draft.body["status"].as_str(), draft.body["decision"]["reason"].as_str()), (Some("rejected"), Some("権限過大")));

        let contested = sys.draft(&sales("contested"));
        let alice = sys.token("alice", "admin", "human");
        let bob = sys.token("bob", "admin", "human");
        let answers: Vec<_> = std::thread::scope(|s| {
            let a = s.spawn(|| sys.approve(&contested, &alice, false));
            let b = s.spawn(|| sys.approve(&contested, &bob, false));
            vec![a.join().expect("thread"), b.join().expect("thread")]
        });
        let mut statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, vec![200, 409], "{answers:?}");
        assert!(answers.iter().any(|a| a.body["error"] == "draft_not_pending"));
        let boxes = sys.get("/api/v1/boxes", &sys.admin).body["boxes"].as_array().cloned().unwrap_or_default();
        assert_eq!(boxes.len(), 1, "exactly one Box");
        // A withdrawn draft cannot be approved either (R-DRAFT-13).
        let withdrawn = sys.draft(&sales("withdrawn"));
        let w = sys.post(&format!("/api/v1/boxes/box-drafts/{withdrawn}/withdraw"), &sys.agent, &json!({}));
        assert_eq!((w.status, w.body["status"].as_str()), (200, Some("withdrawn")), "{}", w.raw);
        assert_eq!(sys.approve(&withdrawn, &sys.admin, false).body["error"], "draft_not_pending");
    });
}

#[test]
fn the_box_limit_holds_under_twenty_concurrent_approvals_and_stop_frees_a_slot() {
    // R-BOX-3, R-BOX-7, R-APPROVE-7
    in_both_modes(|sys| {
        for bt in ["first", "second"] {
            let id = sys.draft(&sales(bt));
            assert_eq!(sys.approve(&id, &sys.admin, false).status, 200);
        }
        let ids: Vec<String> = (0..20).map(|i| sys.draft(&sales(&format!("rush-{i}")))).collect();
        let shared: &System = sys;
        let answers: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = ids.iter().map(|id| s.spawn(move || shared.approve(id, &shared.admin, false))).collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let ok = answers.iter().filter(|a| a.status == 200).count();
        let limited = answers.iter().filter(|a| a.status == 409 && a.body["error"] == "box_limit_reached").count();
        assert_eq!((ok, limited), (1, 19), "{:?}: {:?}", sys.mode, answers.iter().map(|a| (a.status, a.raw.clone())).collect::<Vec<_>>());
        let boxes = sys.get("/api/v1/boxes", &sys.admin).body["boxes"].as_array().cloned().unwrap_or_default();
        assert_eq!(boxes.len(), 3, "never cap + 1");
        assert_eq!(sys.pending().len(), 19, "refused drafts stay pending");
        // Stopping a Box frees its slot; a stopped Box is not listed; resume needs a slot.
        let first = boxes.iter().find(|b| b["box_type"] == "first").expect("first")["box_id"].as_str().expect("id").to_owned();
        let stopped = sys.post(&format!("/api/v1/boxes/{first}/stop"), &sys.admin, &json!({}));
        assert_eq!((stopped.status, stopped.body["state"].as_str()), (200, Some("stopped")), "{}", stopped.raw);
        let listed = sys.get("/api/v1/boxes", &sys.admin).body["boxes"].as_array().cloned().unwrap_or_default();
        assert!(!listed.iter().any(|b| b["box_id"] == first.as_str()), "R-BOX-5: a stopped Box is not listed by default: {listed:?}");
        let next = ids.iter().zip(&answers).find(|(_, a)| a.status == 409).map(|(id, _)| id.clone()).expect("a refused draft");
        assert_eq!(sys.approve(&next, &sys.admin, false).status, 200, "the freed slot is taken");
        let resume = sys.post(&format!("/api/v1/boxes/{first}/resume"), &sys.admin, &json!({}));
        assert_eq!((resume.status, resume.body["error"].as_str()), (409, Some("box_limit_reached")));
        // Archive is terminal and frees the box_type; stop/resume/archive need a human admin.
        let agent_admin = sys.token("ops-bot", "admin", "agent");
        assert_eq!(sys.post(&format!("/api/v1/boxes/{first}/archive"), &agent_admin, &json!({})).status, 403);
        let archived = sys.post(&format!("/api/v1/boxes/{first}/archive"), &sys.admin, &json!({}));
        assert_eq!(archived.body["state"], "archived");
        assert_eq!(sys.post(&format!("/api/v1/boxes/{first}/resume"), &sys.admin, &json!({})).status, 409);
        assert!(sys.data_dir().join("manifests/.archived").read_dir().map(|d| d.count()).unwrap_or(0) == 1, "the YAML moved to .archived/");
        assert!(!sys.data_dir().join("manifests/first.yaml").exists());
    });
}

#[test]
fn a_foreign_manifest_file_is_never_overwritten() {
    // R-BOX-2
    in_both_modes(|sys| {
        let dir = sys.data_dir().join("manifests");
        std::fs::create_dir_all(&dir).expect("dir");
        let foreign = b"# written by hand\nbox_type: handmade\npurpose: mine\n";
        std::fs::write(dir.join("handmade.yaml"), foreign).expect("write");
        let id = sys.draft(&sales("handmade"));
        let a = sys.approve(&id, &sys.admin, false);
        assert_eq!((a.status, a.body["error"].as_str()), (409, Some("manifest_exists")), "{}", a.raw);
        assert_eq!(std::fs::read(dir.join("handmade.yaml")).expect("still there"), foreign, "byte for byte unchanged");
        assert_eq!(sys.pending().len(), 1, "the draft stays pending");
    });
}

#[test]
fn a_failing_git_remote_leaves_the_box_idle_with_the_failure_shown() {
    // R-PROV-1
    in_both_modes(|sys| {
        let mut body = sales("repo-box");
        body["required_access"] = json!([{"type": "git_remote", "url": "file:///nonexistent/atasira/repo.git"}, {"type": "ssh_target", "host": "build.example", "user": "ci", "port": 2222}]);
        let id = sys.draft(&body);
        let a = sys.approve(&id, &sys.admin, false);
        assert_eq!(a.status, 200, "{}", a.raw);
        let box_id = a.body["box_id"].as_str().expect("box").to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let detail = loop {
            let d = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.admin);
            if d.body["provisioning"].as_array().map(Vec::len) == Some(2) || std::time::Instant::now() > deadline {
                break d;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(detail.body["state"], "idle", "failure never undoes the activation");
        let outcomes = detail.body["provisioning"].as_array().expect("outcomes");
        assert_eq!(outcomes[0]["status"], "failed", "{}", detail.raw);
        assert_eq!(outcomes[0]["attempts"], 5);
        assert!(outcomes[0]["reason"].as_str().is_some_and(|r| !r.is_empty()));
        assert_eq!(outcomes[1]["status"], "provisioned");
        let ssh = std::fs::read_to_string(sys.data_dir().join("ssh/config")).expect("managed ssh config");
        assert!(ssh.contains("HostName build.example") && ssh.contains("Port 2222") && !ssh.contains("IdentityFile"), "{ssh}");
        let actions: Vec<String> = audit_actions(sys).into_iter().map(|r| r.0).collect();
        assert!(actions.contains(&"access.provision_failed".to_owned()), "{actions:?}");
    });
}

#[test]
fn tampering_with_the_ledger_is_named_and_a_truncated_tail_is_caught() {
    // R-AUDIT-2, R-AUDIT-4
    in_both_modes(|sys| {
        for bt in ["a1", "a2"] {
            let id = sys.draft(&sales(bt));
            assert_eq!(sys.approve(&id, &sys.admin, false).status, 200);
        }
        // (rows 1 and 2: the issue of the admin's and the agent's tokens)
        assert_eq!(sys.audit_verify(), (0, json!({"ok": true, "rows": 10})));
        // A graceful stop writes the signed checkpoint of the head.
        sys.stop_gracefully();
        assert!(sys.sql_i64("SELECT COUNT(*) FROM events WHERE event_type = 'AuditCheckpoint'") >= 1, "a checkpoint was written on shutdown");
        sys.tamper("UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 4");
        let (code, v) = sys.audit_verify();
        assert_eq!((code, v["ok"].as_bool(), v["first_bad_seq"].as_i64()), (1, Some(false), Some(4)), "{v}");
        sys.tamper("UPDATE audit_ledger_rows SET actor = 'admin' WHERE seq = 4");
        assert_eq!(sys.audit_verify().0, 0, "restored");
        sys.tamper("DELETE FROM audit_ledger_rows WHERE seq = 6");
        let (code, v) = sys.audit_verify();
        assert_eq!((code, v["first_bad_seq"].as_i64()), (1, Some(6)), "the deleted row is named: {v}");
        sys.restart();
        assert_eq!(sys.get("/api/v1/audit/verify", &sys.admin).body["ok"], false, "the REST answer agrees");
    });
    // Truncating the last rows is detected against the latest checkpoint.
    in_both_modes(|sys| {
        let id = sys.draft(&sales("t1"));
        assert_eq!(sys.approve(&id, &sys.admin, false).status, 200);
        sys.stop_gracefully();
        sys.tamper("DELETE FROM audit_ledger_rows WHERE seq >= 4");
        let (code, v) = sys.audit_verify();
        assert_eq!((code, v["ok"].as_bool()), (1, Some(false)), "{v}");
        assert!(v["reason"].as_str().is_some_and(|r| r.contains("checkpoint")), "{v}");
    });
}

#[test]
fn a_pending_draft_expires_after_its_ttl() {
    // R-DRAFT-13
    for mode in [atasira_tests::harness::Mode::Embedded, atasira_tests::harness::Mode::Cluster] {
        let sys = System::start_with(mode, &[("ATASIRA_DRAFT_TTL", "2".to_owned())]);
        let id = sys.draft(&sales("short-lived"));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let draft = loop {
            let d = sys.get(&format!("/api/v1/boxes/box-drafts/{id}"), &sys.agent);
            if d.body["status"] == "expired" || std::time::Instant::now() > deadline {
                break d;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(draft.body["status"], "expired", "{mode:?}: {}", draft.raw);
        assert!(sys.pending().is_empty());
        assert_eq!(sys.approve(&id, &sys.admin, false).body["error"], "draft_not_pending");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !audit_actions(&sys).iter().any(|r| r.0 == "box_draft.expire") {
            assert!(std::time::Instant::now() < deadline, "no box_draft.expire row");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
