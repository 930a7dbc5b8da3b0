//! Every write route of the served OpenAPI document follows the spec's check order
//! (R-AUTH-1, R-DRAFT-14): 401, then 403 (role), then 404, then 400/413/422; takes an
//! `Idempotency-Key` (R-DRAFT-11); and a refusal that records an event answers with
//! `X-Atasira-Position`, so the next read sees it (R-BOX-9, R-AUDIT-5, R-AUTH-3).
//!
//! The walk reads the document the gateway serves, so a route added later is held to the
//! same rules. Each operation states who may call it in `x-atasira-access`:
//! `authenticated`, `admin`, `human_admin`, or a right that depends on the target (the
//! draft's requester, the Box's primary), named otherwise.

use atasira_tests::harness::{Answer, Mode, System, http};
use serde_json::Value;

/// An Idempotency-Key the gateway refuses (a space is not allowed).
const BAD_KEY: &str = "not a key";
/// Not JSON.
const BAD_BODY: &[u8] = b"{not json";
/// The gateway's body limit (1 MiB): a body over it is 413.
const MAX_BODY: usize = 1024 * 1024;

struct Write {
    method: String,
    path: String,
    op: Value,
}

impl Write {
    fn name(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// The path with every `{param}` an id nothing has, and every required query parameter
    /// a value that names nothing.
    fn url(&self, sys: &System) -> String {
        let mut path = self.path.clone();
        while let (Some(open), Some(close)) = (path.find('{'), path.find('}')) {
            path.replace_range(open..=close, "no-such-id");
        }
        let required: Vec<String> =
            self.params().filter(|p| p["in"] == "query" && p["required"] == true).filter_map(|p| p["name"].as_str().map(|n| format!("{n}=nobody"))).collect();
        if !required.is_empty() {
            path = format!("{path}?{}", required.join("&"));
        }
        sys.url(&path)
    }

    fn params(&self) -> impl Iterator<Item = &Value> {
        self.op["parameters"].as_array().into_iter().flatten()
    }

    fn names_an_id(&self) -> bool {
        self.params().any(|p| p["in"] == "path")
    }

    fn takes_body(&self) -> bool {
        self.op.get("requestBody").is_some()
    }

    fn send(&self, sys: &System, token: Option<&str>, key: &str, body: &[u8]) -> Answer {
        let body = self.takes_body().then_some(body);
        http(&self.method, &self.url(sys), token, &[("Idempotency-Key", key)], body)
    }
}

fn writes(doc: &Value) -> Vec<Write> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if ["post", "put", "patch", "delete"].contains(&method.as_str()) {
                out.push(Write { method: method.to_uppercase(), path: path.clone(), op: op.clone() });
            }
        }
    }
    out
}

fn is_validation(status: u16) -> bool {
    [400, 413, 422].contains(&status)
}

fn walk(mode: Mode) {
    let sys = System::start(mode);
    let doc = http("GET", &sys.url("/api/v1/openapi.json"), None, &[], None).body;
    let writes = writes(&doc);
    assert!(writes.len() >= 10, "the document lists the writes: {}", writes.len());
    let oversized = vec![b' '; MAX_BODY + 1];
    for w in &writes {
        let name = w.name();
        // R-DRAFT-11: every write documents the Idempotency-Key (the feasibility check and
        // the policy dry run are reads over POST: they record nothing, so take none)
        let records = !name.ends_with("/boxes/feasibility") && !name.ends_with("/policies/check");
        assert!(!records || w.params().any(|p| p["in"] == "header" && p["name"] == "Idempotency-Key"), "{name} documents no Idempotency-Key");
        let access = w.op["x-atasira-access"].as_str().unwrap_or_else(|| panic!("{name} does not say who may call it (x-atasira-access)"));

        // R-AUTH-1: no token is 401 before anything else (unknown id, bad key, bad body)
        let a = w.send(&sys, None, BAD_KEY, BAD_BODY);
        assert_eq!(a.status, 401, "{name} without a token: {}", a.raw);
        assert_eq!(a.body["error"], "unauthenticated", "{name}");

        // R-AUTH-2: a member agent without the right is 403 before 404 and validation; with
        // the right (or a right that depends on the target) the unknown id is 404 first
        let a = w.send(&sys, Some(&sys.agent), BAD_KEY, BAD_BODY);
        match access {
            "admin" | "human_admin" => assert_eq!(a.status, 403, "{name} as a member agent: {}", a.raw),
            "authenticated" if w.names_an_id() => assert_eq!(a.status, 404, "{name} as a member agent: {}", a.raw),
            "authenticated" => assert!(is_validation(a.status), "{name} as a member agent: {}", a.raw),
            _ => assert!([403, 404].contains(&a.status), "{name} as a member agent ({access}): {}", a.raw),
        }

        // R-DRAFT-14: a human admin (every role's right) gets 404 for an unknown id before
        // a malformed key, bad JSON or an oversized body is looked at
        for (what, key, body) in [("bad JSON and key", BAD_KEY, BAD_BODY), ("an oversized body", "k-oversized", oversized.as_slice())] {
            if what == "an oversized body" && !w.takes_body() {
                continue;
            }
            let a = w.send(&sys, Some(&sys.admin), key, body);
            if w.names_an_id() {
                assert_eq!(a.status, 404, "{name} as a human admin with {what}: {}", a.raw);
            } else {
                assert!(is_validation(a.status), "{name} as a human admin with {what}: {}", a.raw);
            }
        }
    }

    // R-AUTH-3, R-AUDIT-5, R-BOX-9: a self-approval is refused with the position of the
    // security violation it recorded, and the very next audit read shows the row
    let submitted = sys.post("/api/v1/boxes/box-drafts", &sys.admin, &serde_json::json!({"box_type": "self-made", "purpose": "p", "tools": ["Read"]}));
    assert_eq!(submitted.status, 201, "{}", submitted.raw);
    let draft_id = submitted.body["draft_id"].as_str().expect("draft id").to_owned();
    let refused = sys.approve(&draft_id, &sys.admin, false);
    assert_eq!((refused.status, refused.body["error"].as_str()), (403, Some("self_approval_forbidden")), "{}", refused.raw);
    let position: i64 = refused.header("x-atasira-position").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{:?}", refused.headers));
    assert!(position > 0);
    let rows = sys.get(&format!("/api/v1/audit?action=security_violation&target={draft_id}"), &sys.admin);
    assert_eq!(rows.body["rows"].as_array().map(Vec::len), Some(1), "{}", rows.raw);
}

#[test]
fn r_draft_14_every_write_route_checks_in_order_embedded() {
    walk(Mode::Embedded);
}

#[test]
fn r_draft_14_every_write_route_checks_in_order_cluster() {
    walk(Mode::Cluster);
}
