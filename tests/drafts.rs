//! Draft scenarios through the REST API, in embedded mode and in cluster mode (gateway
//! and drafts service as separate processes on a real nats-server and PostgreSQL).

use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::{Mode, OutputWithin, SUBPROCESS_LIMIT, System, http, in_both_modes};
use serde_json::{Value, json};

fn draft(box_type: &str) -> Value {
    json!({"box_type": box_type, "purpose": "週次売上レポートの自動作成", "success_criteria": ["毎週月曜にレポート生成"], "tools": ["Read"], "os_operations": ["file:read"]})
}

#[test]
fn a_draft_is_pending_and_visible_to_admins_at_once() {
    // R-DRAFT-1, R-DRAFT-10, R-APPROVE-1, R-BOX-9 (read-your-writes), R-AUTH-1
    in_both_modes(|sys| {
        let created = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft("sales-report"));
        assert_eq!(created.status, 201, "{:?}: {}", sys.mode, created.raw);
        assert_eq!(created.body["status"], "pending_approval");
        assert_eq!(created.body["box_type"], "sales-report");
        assert_eq!(created.body["over_limit"], false);
        let position: i64 = created.header("x-atasira-position").expect("position header").parse().expect("number");
        assert!(position > 0);
        assert_eq!(created.header("x-atasira-lagging"), None, "the projection caught up within the wait");
        // No polling: the write returned after the pending list applied it.
        let pending = sys.pending();
        assert_eq!(pending.len(), 1);
        let item = &pending[0];
        assert_eq!(item["draft_id"], created.body["draft_id"]);
        assert_eq!(item["requested_by"], "agent");
        for key in [
            "draft_id",
            "box_type",
            "purpose",
            "os_operations",
            "tools",
            "url_allowlist",
            "prohibited",
            "over_limit",
            "over_limit_ops",
            "over_limit_tools",
            "warnings",
            "requested_by",
            "status",
            "created_at",
            "network",
            "file_access",
            "allowed_apps",
            "required_access",
        ] {
            assert!(item.get(key).is_some(), "{key} missing from the pending item {item}");
        }
        assert_eq!(item["purpose"], "週次売上レポートの自動作成\n\n## Success criteria\n- 毎週月曜にレポート生成");
        // Listing pending needs role admin; no or unknown token is 401.
        assert_eq!(sys.get("/api/v1/boxes/box-drafts/pending", &sys.agent).status, 403);
        let member = sys.token("carol", "member", "human");
        let refused = sys.get("/api/v1/boxes/box-drafts/pending", &member);
        assert_eq!((refused.status, refused.body["error"].as_str()), (403, Some("forbidden")));
        assert_eq!(http("GET", &sys.url("/api/v1/boxes/box-drafts/pending"), None, &[], None).status, 401);
        assert_eq!(sys.get("/api/v1/boxes/box-drafts/pending", "atasira_pat_unknown").body["error"], "unauthenticated");
    });
}

#[test]
fn over_limit_and_refusals_are_answered_with_the_specs_codes() {
    // R-DRAFT-2, R-DRAFT-3, R-DRAFT-4, R-DRAFT-5, R-DRAFT-8, R-DRAFT-14
    in_both_modes(|sys| {
        let over = sys.post(
            "/api/v1/boxes/box-drafts",
            &sys.agent,
            &json!({"box_type": "ops-bot", "purpose": "p", "os_operations": ["shell:exec"], "tools": ["Bash"]}),
        );
        assert_eq!(over.status, 201);
        assert_eq!(over.body["over_limit"], true);
        let listed = sys.pending();
        assert_eq!(listed[0]["over_limit_ops"], json!(["shell:exec"]));
        assert_eq!(listed[0]["over_limit_tools"], json!(["Bash"]));
        for (body, status, code) in [
            (json!({"box_type": "admin-pm", "purpose": "p"}), 403, "self_privilege_forbidden"),
            (json!({"box_type": "heartbeat", "purpose": "p"}), 422, "box_manifest_validation"),
            (json!({"box_type": "Bad", "purpose": "p"}), 422, "box_manifest_validation"),
            (json!({"box_type": "ok", "purpose": "p", "os_operations": ["shell:run"]}), 422, "box_manifest_validation"),
            (json!({"box_type": "ok", "purpose": " "}), 422, "box_manifest_validation"),
            (json!({"box_type": "ok", "purpose": "p", "status": "active"}), 422, "invalid_request"),
        ] {
            let a = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &body);
            assert_eq!((a.status, a.body["error"].as_str()), (status, Some(code)), "{body}: {}", a.raw);
        }
        assert_eq!(sys.pending().len(), 1, "refusals change no state");
    });
}

#[test]
fn a_draft_is_readable_by_its_requester_and_admins_only() {
    // R-DRAFT-12
    in_both_modes(|sys| {
        let created = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft("reader"));
        let id = created.body["draft_id"].as_str().expect("id").to_owned();
        let path = format!("/api/v1/boxes/box-drafts/{id}");
        let mine = sys.get(&path, &sys.agent);
        assert_eq!(mine.status, 200, "{}", mine.raw);
        assert_eq!(mine.body["status"], "pending_approval");
        assert_eq!(mine.body["decision"], Value::Null);
        assert_eq!(mine.body["manifest"]["trigger_type"], "manual");
        assert_eq!(sys.get(&path, &sys.admin).status, 200);
        let other = sys.token("mallory", "member", "agent");
        assert_eq!(sys.get(&path, &other).body["error"], "draft_not_found");
        assert_eq!(sys.get("/api/v1/boxes/box-drafts/nope", &sys.admin).status, 404);
        sys.post("/api/v1/boxes/box-drafts", &other, &draft("other"));
        let list = sys.get("/api/v1/boxes/box-drafts?mine=true", &sys.agent);
        assert_eq!(list.body["drafts"].as_array().map(Vec::len), Some(1), "{}", list.raw);
        let no_mine = sys.get("/api/v1/boxes/box-drafts", &sys.agent);
        assert_eq!((no_mine.status, no_mine.body["error"].as_str()), (403, Some("forbidden")), "everyone's drafts need role admin: {}", no_mine.raw);
    });
}

#[test]
fn idempotency_keys_return_the_first_answer_even_under_concurrency() {
    // R-DRAFT-11
    in_both_modes(|sys| {
        let body = draft("idem").to_string();
        let send =
            |key: &str, body: &str| http("POST", &sys.url("/api/v1/boxes/box-drafts"), Some(&sys.agent), &[("Idempotency-Key", key)], Some(body.as_bytes()));
        let answers: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|_| s.spawn(|| send("k-1", &body))).collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let ids: std::collections::BTreeSet<String> = answers.iter().map(|a| a.body["draft_id"].as_str().expect("201 with id").to_owned()).collect();
        assert!(answers.iter().all(|a| a.status == 201), "{answers:?}");
        assert_eq!(ids.len(), 1, "eight concurrent retries made one draft");
        assert_eq!(sys.pending().len(), 1);
        let reuse = send("k-1", &draft("different").to_string());
        assert_eq!((reuse.status, reuse.body["error"].as_str()), (422, Some("idempotency_key_reuse")));
        // The same key from another principal is another key.
        let other = sys.token("dave", "member", "human");
        let theirs = http("POST", &sys.url("/api/v1/boxes/box-drafts"), Some(&other), &[("Idempotency-Key", "k-1")], Some(body.as_bytes()));
        assert_eq!(theirs.status, 201);
        assert_ne!(theirs.body["draft_id"].as_str(), ids.iter().next().map(String::as_str));
    });
}

#[test]
fn a_write_answered_before_a_read_model_applied_it_names_the_one_behind() {
    // R-BOX-9: when a read model takes longer than the consistency wait, the write is still
    // answered (it is stored), with its position and `X-Atasira-Lagging` naming what is
    // behind; a read shortly after sees the write.
    for mode in [Mode::Embedded, Mode::Cluster] {
        let slow = [("ATASIRA_CONSISTENCY_WAIT", "0.2".to_owned()), ("ATASIRA_FAILPOINT_DELAY", "consumer.before_record:1500".to_owned())];
        let sys = System::start_with(mode, &slow);
        let created = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft("lagging-report"));
        assert_eq!(created.status, 201, "{mode:?}: {}", created.raw);
        assert!(created.header("x-atasira-position").is_some_and(|p| p.parse::<i64>().is_ok_and(|p| p > 0)), "{mode:?}: a position");
        let lagging = created.header("x-atasira-lagging").unwrap_or_else(|| panic!("{mode:?}: no X-Atasira-Lagging although the drafts view is slow"));
        assert!(lagging.split(',').any(|s| s == "drafts_view"), "{mode:?}: the drafts view is named: {lagging}");
        let id = created.body["draft_id"].as_str().expect("draft_id");
        eventually("the draft readable once the view caught up", Duration::from_secs(15), || {
            let a = sys.get(&format!("/api/v1/boxes/box-drafts/{id}"), &sys.agent);
            if a.status == 200 { Ok(()) } else { Err(format!("{}: {}", a.status, a.raw)) }
        });
    }
}

#[test]
fn drafts_survive_a_restart_and_a_rebuild_gives_the_same_projection() {
    // R-ARCH-4, R-ARCH-5
    in_both_modes(|sys| {
        for i in 0..5 {
            assert_eq!(sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft(&format!("box-{i}"))).status, 201);
        }
        let before = sys.pending();
        sys.restart();
        assert_eq!(sys.pending(), before, "{:?}: restart keeps the drafts", sys.mode);
        let (code, out, err) = sys.rebuild();
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("drafts_view"), "{out}");
        assert_eq!(sys.pending(), before, "rebuilt == live");
    });
}

#[test]
fn a_hundred_malformed_requests_get_4xx_json_and_change_nothing() {
    // R-DRAFT-14, R-AUTH-1
    in_both_modes(|sys| {
        let url = sys.url("/api/v1/boxes/box-drafts");
        let big = format!("{{\"box_type\":\"a\",\"purpose\":\"{}\"}}", "x".repeat(1024 * 1024 + 10));
        let mut corpus: Vec<(Option<String>, Vec<u8>)> = Vec::new();
        let admin = Some(sys.admin.clone());
        let bodies: Vec<String> = vec![
            String::new(), "{".into(), "}".into(), "[".into(), "null".into(), "true".into(), "1".into(), "\"s\"".into(), "[]".into(), "{}".into(),
            "{\"box_type\":}".into(), "{box_type: 'a'}".into(), "\u{0}".into(), "{\"box_type\":\"a\",}".into(), "{\"a\":1}{\"b\":2}".into(),
            "{\"box_type\":1,\"purpose\":\"p\"}".into(), "{\"box_type\":\"a\",\"purpose\":2}".into(), "{\"box_type\":\"a\",\"purpose\":\"p\",\"tools\":\"Bash\"}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"tools\":[1]}".into(), "{\"box_type\":\"a\",\"purpose\":\"p\",\"allow_network\":\"yes\"}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"success_criteria\":\"x\"}".into(), "{\"box_type\":\"a\",\"purpose\":\"p\",\"required_access\":[1]}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"required_access\":[{\"type\":\"ftp\"}]}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"required_access\":[{\"type\":\"netrc_entry\",\"machine\":\"m\",\"login\":\"l\",\"vault\":\"v\",\"item\":\"i\",\"password\":\"x\"}]}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"os_operations\":[\"file:delete\"]}".into(), "{\"box_type\":\"a\",\"purpose\":\"p\",\"os_operations\":[null]}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"manifest\":{}}".into(), "{\"box_type\":\"a\",\"purpose\":\"p\",\"state\":\"active\"}".into(),
            "{\"box_type\":\"a\",\"purpose\":\"p\",\"version\":\"9.9.9\"}".into(), "{\"box_type\":\"a\",\"purpose\":\"p\",\"trigger_type\":\"schedule\"}".into(),
            "{\"purpose\":\"p\"}".into(), "{\"box_type\":\"a\"}".into(), "{\"box_type\":\"\",\"purpose\":\"p\"}".into(), "{\"box_type\":\"-a\",\"purpose\":\"p\"}".into(),
            "{\"box_type\":\"a b\",\"purpose\":\"p\"}".into(), format!("{{\"box_type\":\"{}\",\"purpose\":\"p\"}}", "a".repeat(65)),
            "{\"box_type\":\"admin-pm\",\"purpose\":\"p\"}".into(), "{\"box_type\":\"admin-ops\",\"purpose\":\"p\"}".into(), "{\"box_type\":\"\u{00e9}t\u{00e9}\",\"purpose\":\"p\"}".into(),
            big,
        ];
        let reserved = [
            "heartbeat",
            "task",
            "log",
            "result",
            "pause",
            "resume",
            "kill",
            "escalation",
            "events",
            "drafts",
            "approval",
            "provisioner",
            "runtime-registry",
            "audit",
            "gateway",
        ];
        for body in &bodies {
            corpus.push((admin.clone(), body.clone().into_bytes()));
        }
        for word in reserved {
            corpus.push((admin.clone(), format!("{{\"box_type\":\"{word}\",\"purpose\":\"p\"}}").into_bytes()));
        }
        for body in bodies.iter().take(20) {
            corpus.push((None, body.clone().into_bytes()));
            corpus.push((Some("atasira_pat_nope".into()), body.clone().into_bytes()));
        }
        for junk in [vec![0xff, 0xfe, 0xfd], vec![0u8; 64], b"{\"box_type\":\"a\",\"purpose\":\"\xff\"}".to_vec()] {
            corpus.push((admin.clone(), junk));
        }
        for i in 0..6 {
            corpus.push((admin.clone(), format!("{}1{}", "[".repeat(100_000 + i), "]".repeat(100_000 + i)).into_bytes()));
        }
        assert!(corpus.len() >= 100, "corpus has {} requests", corpus.len());
        for (token, body) in &corpus {
            let a = http("POST", &url, token.as_deref(), &[], Some(body));
            let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
            assert!((400..500).contains(&a.status), "{:?}: {shown:?} got {}: {}", sys.mode, a.status, a.raw);
            assert!(a.body["error"].is_string() && a.body["message"].is_string(), "{shown:?}: not a JSON error: {}", a.raw);
        }
        // Wrong methods and routes are JSON too.
        let wrong = http("DELETE", &url, admin.as_deref(), &[], None);
        assert_eq!((wrong.status, wrong.body["error"].as_str()), (405, Some("method_not_allowed")));
        assert_eq!(http("GET", &sys.url("/api/v1/nope"), admin.as_deref(), &[], None).body["error"], "not_found");
        assert!(sys.pending().is_empty(), "no request of the corpus made a draft");
        assert_eq!(sys.get("/api/v1/boxes/box-drafts?mine=true", &sys.admin).body["drafts"], json!([]));
    });
}

#[test]
fn the_openapi_document_and_health_need_no_token() {
    // R-AUTH-2: /healthz and /api/v1/openapi.json are public
    let sys = System::start(Mode::Embedded);
    let doc = http("GET", &sys.url("/api/v1/openapi.json"), None, &[], None);
    assert_eq!(doc.status, 200);
    assert!(doc.body["paths"]["/api/v1/boxes/box-drafts"]["post"].is_object(), "{}", doc.raw);
    assert!(doc.body["paths"]["/api/v1/boxes/box-drafts/pending"]["get"].is_object());
    assert_eq!(http("GET", &sys.url("/healthz"), None, &[], None).status, 200);
}

#[test]
fn a_revoked_token_is_refused_at_once() {
    // R-AUTH-4, R-AUTH-1
    in_both_modes(|sys| {
        let token = sys.token("temp", "member", "human");
        assert_eq!(sys.get("/api/v1/boxes/box-drafts?mine=true", &token).status, 200);
        let mut args = vec!["tokens", "revoke", token.as_str()];
        let target = sys.target_args();
        args.extend(target.iter().map(String::as_str));
        let (code, _, err) = sys.cli(&args);
        assert_eq!(code, 0, "{err}");
        let refused = sys.get("/api/v1/boxes/box-drafts?mine=true", &token);
        assert_eq!((refused.status, refused.body["error"].as_str()), (401, Some("unauthenticated")));
        let (code, _, err) = sys.cli(&args);
        assert_ne!(code, 0, "revoking twice says so: {err}");
    });
}

#[test]
fn every_service_answers_srv_ping_from_a_foreign_nats_client() {
    // R-ARCH-8, R-ARCH-10: nats-py, not our client, discovers the services, as an admin
    // authenticated by PAT (the token), with the inbox its PAT's hash names.
    let mut sys = System::start(Mode::Cluster);
    let python = std::env::var("ATASIRA_TEST_PYTHON").expect("ATASIRA_TEST_PYTHON (a python with nats-py) is set by scripts/test");
    let script = r#"
import asyncio, hashlib, json, ssl, sys
import nats
async def main():
    token = sys.argv[2]
    inbox = "_INBOX.client." + hashlib.sha256(token.encode()).hexdigest()
    tls = ssl.create_default_context(cafile=sys.argv[3])
    nc = await nats.connect(sys.argv[1], tls=tls, token=token, inbox_prefix=inbox, allow_reconnect=False)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("$SRV.PING", b"", reply=inbox)
    names = set()
    try:
        while True:
            msg = await sub.next_msg(timeout=1.5)
            names.add(json.loads(msg.data)["name"])
    except Exception:
        pass
    info = await nc.request("$SRV.INFO.drafts", b"", timeout=2)
    stats = await nc.request("$SRV.STATS.drafts", b"", timeout=2)
    print(json.dumps({"names": sorted(names), "info": json.loads(info.data), "stats": json.loads(stats.data)}))
    await nc.close()
asyncio.run(main())
"#;
    let url = sys.nats().url();
    let ca = sys.nats_ca().display().to_string();
    let out = std::process::Command::new(python).args(["-c", script, &url, &sys.admin, &ca]).output_within(SUBPROCESS_LIMIT).expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["names"], json!(["approval", "audit", "drafts", "gateway", "provisioner", "runtime-registry"]), "{v}");
    // Requests from atasira's processes, and from NATS publishers (their token's hash).
    let mut endpoints: Vec<&str> = v["info"]["endpoints"].as_array().expect("endpoints").iter().filter_map(|e| e["subject"].as_str()).collect();
    endpoints.sort_unstable();
    assert_eq!(endpoints, ["atasira.box.*.drafts", "atasira.box.client.*.drafts"], "{v}");
    assert!(v["stats"]["endpoints"].is_array());
    let _ = Duration::ZERO;
}

#[test]
fn the_gateway_issues_an_assertion_for_a_pat_bound_to_one_request() {
    // R-AUTH-5, R-ARCH-3: POST /auth/nats-assertion mints an assertion for the caller's
    // principal, bound to the subject, message type and payload digest it is told; a
    // service takes it for that request, once.
    use atasira_contracts::v1;
    use atasira_domain::assertion::PayloadDigest;
    use prost::Message as _;
    let mut sys = System::start(Mode::Cluster);
    let url = sys.nats().url();
    // Sent as the gateway would (with its NATS credentials): only the assertion may vouch.
    let gateway_seed = sys.nats_seed("gateway");
    let body = |purpose: &str| v1::SubmitDraft {
        request: Some(v1::BoxDraftCreateRequest { box_type: "from-nats".into(), purpose: purpose.into(), tools: vec!["Read".into()], ..Default::default() }),
    };
    let issue = |token: Option<&str>, request: &Value| http("POST", &sys.url("/api/v1/auth/nats-assertion"), token, &[], Some(request.to_string().as_bytes()));
    let described = |payload: &[u8], correlation_id: &str| {
        json!({"subject": "atasira.box.gateway.drafts", "message_type": "atasira.v1.SubmitDraft",
            "payload_sha256": PayloadDigest::of(payload).to_hex(), "correlation_id": correlation_id})
    };
    let payload = body("p").encode_to_vec();
    let issued = issue(Some(&sys.agent), &described(&payload, "tool-1"));
    assert_eq!(issued.status, 200, "{}", issued.raw);
    assert_eq!(issued.body["correlation_id"], "tool-1");
    let a = &issued.body["assertion"];
    assert_eq!((a["principal"]["user_id"].as_str(), a["subject"].as_str()), (Some("agent"), Some("atasira.box.gateway.drafts")));
    assert_eq!(
        (a["message_type"].as_str(), a["payload_sha256"].as_str()),
        (Some("atasira.v1.SubmitDraft"), Some(PayloadDigest::of(&payload).to_hex().as_str()))
    );
    let wire =
        v1::PrincipalAssertion::decode(hex::decode(issued.body["assertion_protobuf_hex"].as_str().expect("hex")).expect("hex").as_slice()).expect("protobuf");
    // Without a token, nothing; a request described wrong is refused field by field.
    assert_eq!(issue(None, &described(&payload, "tool-1")).status, 401);
    let bad = issue(Some(&sys.agent), &json!({"subject": "atasira.box.anyone.drafts", "message_type": "SubmitDraft", "payload_sha256": "ABC"}));
    assert_eq!((bad.status, bad.body["error"].as_str()), (422, Some("invalid_request")), "{}", bad.raw);
    let keys: Vec<&str> = bad.body["details"].as_array().expect("details").iter().filter_map(|d| d["key"].as_str()).collect();
    assert_eq!(keys, ["subject", "message_type", "payload_sha256"]);
    let missing = issue(Some(&sys.agent), &json!({}));
    assert_eq!(missing.status, 422, "{}", missing.raw);
    assert_eq!(missing.body["details"].as_array().map(Vec::len), Some(3), "{}", missing.raw);
    let issue_nul = |request: &v1::SubmitDraft| {
        let a = issue(Some(&sys.agent), &described(&request.encode_to_vec(), "tool-3"));
        assert_eq!(a.status, 200, "{}", a.raw);
        v1::PrincipalAssertion::decode(hex::decode(a.body["assertion_protobuf_hex"].as_str().expect("hex")).expect("hex").as_slice()).expect("protobuf")
    };

    // The assertion on the request it describes, sent where atasira's processes send
    // (once nats-server runs with authorization, that needs the gateway's credentials).
    let send = |assertion: Option<v1::PrincipalAssertion>, correlation: &str, request: &v1::SubmitDraft| -> Result<String, String> {
        let env = v1::Envelope {
            message_type: "atasira.v1.SubmitDraft".into(),
            correlation_id: correlation.into(),
            causation_id: String::new(),
            idempotency_key: String::new(),
            assertion,
            payload: request.encode_to_vec(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let client = atasira_tests::harness::nats_tls(async_nats::ConnectOptions::with_nkey(gateway_seed.clone()).custom_inbox_prefix("_INBOX.gateway"))
                .connect(url.clone())
                .await
                .expect("nats as the gateway");
            let reply = client.request("atasira.box.gateway.drafts", env.encode_to_vec().into()).await.expect("a reply");
            match atasira_contracts::decode_reply::<v1::SubmitDraftReply>(&reply.payload).expect("decodes") {
                Ok((r, _)) => Ok(r.draft_id),
                Err(e) => Err(e.to_string()),
            }
        })
    };
    let refused = |reason: &str| Err(format!("unauthenticated: invalid principal assertion: {reason}"));
    assert_eq!(send(None, "tool-1", &body("p")), Err("unauthenticated: the request carries no principal assertion".to_owned()));
    assert_eq!(send(Some(wire.clone()), "tool-2", &body("p")), refused("correlation_mismatch"));
    assert_eq!(send(Some(wire.clone()), "tool-1", &body("other")), refused("payload_mismatch"));
    let mut forged = wire.clone();
    if let Some(p) = forged.principal.as_mut() {
        p.role = v1::Role::Admin as i32;
    }
    assert_eq!(send(Some(forged), "tool-1", &body("p")), refused("bad_signature"), "the signature covers the role");
    let id = send(Some(wire.clone()), "tool-1", &body("p")).expect("accepted with the issued assertion");
    assert_eq!(send(Some(wire), "tool-1", &body("p")), refused("replayed"), "accepted once");
    // Text the store cannot keep is the caller's mistake, named, not our failure.
    let nul = body("p\u{0}");
    let issued = issue_nul(&nul);
    assert!(send(Some(issued), "tool-3", &nul).is_err_and(|e| e.starts_with("invalid_request: ")), "a NUL character over NATS");
    let pending = sys.eventually_pending(Duration::from_secs(10), |l| l.len() == 1);
    assert_eq!(pending[0]["draft_id"], id.as_str());
    assert_eq!(pending[0]["requested_by"], "agent");
}

#[test]
fn a_submission_decided_on_what_it_assumed_is_decided_again_when_a_box_or_a_policy_came_meanwhile() {
    // R-CHANGE-1, R-POLICY-1: in both modes a submission is decided without reading first
    // (no Box of its box_type assumed, the policy its process read last) and its append holds
    // only if both are still so. The test holds submissions after their decision and before
    // their append, and meanwhile activates a Box of the box_type, or publishes a policy
    // that forbids it: the submission is then refused as if it had come after.
    use atasira_tests::harness::Hold;
    for mode in [Mode::Embedded, Mode::Cluster] {
        let hold = Hold::new("drafts.submit.before_append");
        let sys = System::start_with(mode, &[hold.setting()]);
        let publish = |text: &str, key: &str| {
            let body = json!({"text": text}).to_string();
            let a = http("PUT", &sys.url("/api/v1/policies"), Some(&sys.admin), &[("Idempotency-Key", key)], Some(body.as_bytes()));
            assert_eq!(a.status, 200, "{}", a.raw);
        };
        let submit_held_while = |box_type: &str, meanwhile: &dyn Fn()| {
            hold.arm();
            std::thread::scope(|s| {
                let submitted = s.spawn(|| sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft(box_type)));
                hold.wait_reached(Duration::from_secs(30));
                meanwhile();
                hold.release();
                submitted.join().expect("thread")
            })
        };
        // given a drafts process that has read the store once (no policy), and a pending draft
        sys.draft(&draft("warm-up"));
        let first = sys.draft(&draft("raced"));

        // when another draft of that box_type is held while the first one's Box is activated
        let second = submit_held_while("raced", &|| {
            assert_eq!(sys.approve(&first, &sys.admin, false).status, 200);
            eventually("the drafts view knows the Box", Duration::from_secs(20), || {
                let d = sys.get(&format!("/api/v1/boxes/box-drafts/{first}"), &sys.admin);
                if d.body["box_id"].as_str().is_some_and(|b| !b.is_empty()) { Ok(()) } else { Err(d.raw) }
            });
        });
        // then it is refused: the box_type has a Box
        assert_eq!((second.status, second.body["error"].as_str()), (409, Some("box_type_exists")), "{mode:?}: {}", second.raw);

        // when a draft is held while a policy that forbids its box_type is published
        let forbid = r#"forbid(principal, action == Action::"draft", resource) when { resource.box_type == "frowned-upon" };"#;
        let third = submit_held_while("frowned-upon", &|| publish(forbid, "policy-1"));
        // then the policy refuses it
        assert_eq!((third.status, third.body["error"].as_str()), (403, Some("policy_denied")), "{mode:?}: {}", third.raw);

        // when a version that no longer forbids it is published: the box_type is drafted again,
        // although the process last read the version that forbade it
        publish(r#"forbid(principal, action == Action::"draft", resource) when { resource.box_type == "other" };"#, "policy-2");
        let fourth = sys.post("/api/v1/boxes/box-drafts", &sys.agent, &draft("frowned-upon"));
        assert_eq!(fourth.status, 201, "{}", fourth.raw);
        // and nothing of the refused submissions is pending
        let pending: Vec<String> = sys.pending().iter().filter_map(|d| d["box_type"].as_str().map(str::to_owned)).collect();
        assert_eq!(pending, ["warm-up", "frowned-upon"], "{pending:?}");
    }
}
