//! Personal access tokens an operator can manage (R-AUTH-1, R-AUTH-4, R-AUDIT-1): list
//! (never the token or its hash), revoke by token, by id and by user, from the CLI and over
//! REST (admins); every issue and revocation is an event the audit ledger records, and a
//! revoked token stops working at once, over REST and over NATS.

use std::time::Duration;

use atasira_contracts::v1;
use atasira_tests::fixtures::{eventually, runtime};
use atasira_tests::harness::{Answer, Mode, System, http, pat_options};
use prost::Message as _;
use serde_json::Value;

fn cli_json(sys: &System, args: &[&str]) -> Value {
    let mut all: Vec<&str> = args.to_vec();
    let target = sys.target_args();
    all.extend(target.iter().map(String::as_str));
    let (code, out, err) = sys.cli(&all);
    assert_eq!(code, 0, "atasira {args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("atasira {args:?} printed no JSON: {out}"))
}

fn listed(sys: &System, user: &str) -> Vec<Value> {
    cli_json(sys, &["tokens", "list", "--user", user, "--json"])["tokens"].as_array().cloned().unwrap_or_default()
}

fn delete(sys: &System, path: &str, token: &str) -> Answer {
    http("DELETE", &sys.url(path), Some(token), &[], None)
}

/// The audit rows of `action` about `target`, read right after a write (no retries: the
/// write's answer waited for the ledger).
fn audit_rows(sys: &System, action: &str, target: &str) -> Vec<Value> {
    let a = sys.get(&format!("/api/v1/audit?action={action}&target={target}"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["rows"].as_array().cloned().unwrap_or_default()
}

/// A NATS publisher's connection with its PAT (cluster mode).
struct Publisher {
    client: async_nats::Client,
    hash: String,
}

impl Publisher {
    async fn connect(url: &str, token: &str) -> Result<Publisher, String> {
        let client = pat_options(token).connect(url).await.map_err(|e| e.to_string())?;
        Ok(Publisher { client, hash: atasira_platform::auth::hash_token(token) })
    }

    /// Lists the publisher's drafts: the page, or the refusal's code.
    async fn my_drafts(&self) -> Result<v1::DraftPage, String> {
        let env = atasira_contracts::envelope(&v1::ListMyDrafts { limit: 10, after: 0 }, &uuid::Uuid::new_v4().to_string(), "");
        let subject = format!("atasira.box.client.{}.drafts", self.hash);
        let reply = tokio::time::timeout(Duration::from_secs(10), self.client.request(subject, env.encode_to_vec().into()))
            .await
            .map_err(|_| "timeout".to_owned())?
            .map_err(|e| e.to_string())?;
        match atasira_contracts::decode_reply::<v1::DraftPage>(&reply.payload).map_err(|e| e.to_string())? {
            Ok((page, _)) => Ok(page),
            Err(e) => Err(e.code.as_str().to_owned()),
        }
    }
}

fn tokens_are_managed(mode: Mode) {
    let mut sys = System::start(mode);
    let carol = sys.token("carol", "member", "agent");
    let dave = [sys.token("dave", "member", "human"), sys.token("dave", "admin", "human")];

    // R-AUTH-4: the CLI lists tokens, never a token or its hash: a table for people, JSON
    // with --json (as every verb that prints data)
    let cli = |extra: &[&str]| {
        let mut args = vec!["tokens", "list"];
        args.extend(extra);
        let target = sys.target_args();
        args.extend(target.iter().map(String::as_str));
        sys.cli(&args)
    };
    let (code, table, err) = cli(&[]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["--json"]);
    assert_eq!(code, 0, "{err}");
    for token in [&sys.admin, &sys.agent, &carol, &dave[0], &dave[1]] {
        let hash = atasira_platform::auth::hash_token(token);
        for printed in [&out, &table] {
            assert!(!printed.contains(token.as_str()) && !printed.contains(&hash), "the list shows no token or hash");
        }
    }
    let all: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(all["tokens"].as_array().map(Vec::len), Some(5), "{all}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("TOKEN_ID") && lines[0].contains("LAST_USED"), "a table with a header: {table}");
    assert_eq!(lines.len(), 6, "a header and a row per token: {table}");
    assert!(lines.iter().any(|l| l.contains("carol") && l.contains("member") && l.contains("agent") && l.contains("active")), "{table}");
    let carol_row = &listed(&sys, "carol")[0];
    let carol_id = carol_row["token_id"].as_str().expect("id").to_owned();
    assert!(carol_id.starts_with("tok_"), "{carol_row}");
    assert_eq!((carol_row["role"].as_str(), carol_row["kind"].as_str(), carol_row["state"].as_str()), (Some("member"), Some("agent"), Some("active")));
    assert!(carol_row["last_used_at"].is_null(), "never used yet: {carol_row}");

    // R-AUTH-1: using a token notes when it was last used
    assert_eq!(sys.get("/api/v1/boxes", &carol).status, 200);
    assert!(listed(&sys, "carol")[0]["last_used_at"].is_string(), "used now");

    // R-AUTH-2: only admins list over REST; only human admins revoke, 403 before 404
    assert_eq!(sys.get("/api/v1/auth/tokens", &sys.agent).status, 403);
    let rest = sys.get("/api/v1/auth/tokens?user_id=carol", &sys.admin);
    assert_eq!(rest.status, 200, "{}", rest.raw);
    assert_eq!(rest.body["tokens"][0]["token_id"], carol_id.as_str());
    assert!(!rest.raw.contains(&carol) && !rest.raw.contains(&atasira_platform::auth::hash_token(&carol)));
    assert_eq!(delete(&sys, "/api/v1/auth/tokens/tok_unknown", &sys.agent).status, 403);
    let unknown = delete(&sys, "/api/v1/auth/tokens/tok_unknown", &sys.admin);
    assert_eq!((unknown.status, unknown.body["error"].as_str()), (404, Some("token_not_found")), "{}", unknown.raw);

    // a NATS publisher connected before the revocation (cluster mode)
    let rt = runtime();
    let nats_url = (mode == Mode::Cluster).then(|| sys.nats().url());
    let publisher = nats_url.as_ref().map(|url| rt.block_on(Publisher::connect(url, &carol)).expect("carol connects"));
    if let Some(publisher) = &publisher {
        assert!(rt.block_on(publisher.my_drafts()).is_ok(), "carol's token works over NATS");
    }

    // R-AUTH-4: an admin revokes one token by id over REST: 401 at once, audited
    let revoked = delete(&sys, &format!("/api/v1/auth/tokens/{carol_id}"), &sys.admin);
    assert_eq!(revoked.status, 200, "{}", revoked.raw);
    assert_eq!(revoked.body["revoked"], serde_json::json!([carol_id]));
    assert!(revoked.header("x-atasira-position").is_some_and(|p| p.parse::<i64>().is_ok_and(|p| p > 0)), "{:?}", revoked.headers);
    assert_eq!(sys.get("/api/v1/boxes", &carol).status, 401, "revoked at once on REST");
    if let (Some(publisher), Some(url)) = (&publisher, &nats_url) {
        assert_eq!(rt.block_on(publisher.my_drafts()).err().as_deref(), Some("unauthenticated"), "and refused over NATS at once");
        assert!(rt.block_on(Publisher::connect(url, &carol)).is_err(), "and it cannot connect again");
    }
    // R-AUDIT-1: the revocation is in the ledger for the very next read, by whom
    let rows = audit_rows(&sys, "token.revoke", &carol_id);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["actor"], "admin");
    assert_eq!(audit_rows(&sys, "token.issue", &carol_id).len(), 1, "the issue is recorded too");
    // revoking it again changes nothing
    let again = delete(&sys, &format!("/api/v1/auth/tokens/{carol_id}"), &sys.admin);
    assert_eq!((again.status, again.body["revoked"].clone()), (200, serde_json::json!([])), "{}", again.raw);
    assert_eq!(audit_rows(&sys, "token.revoke", &carol_id).len(), 1);
    assert_eq!(listed(&sys, "carol")[0]["state"], "revoked");

    // R-AUTH-4: every token of a user at once over REST
    assert_eq!(delete(&sys, "/api/v1/auth/tokens", &sys.admin).status, 400, "names the user");
    let all_of_dave = delete(&sys, "/api/v1/auth/tokens?user_id=dave", &sys.admin);
    assert_eq!(all_of_dave.status, 200, "{}", all_of_dave.raw);
    assert_eq!(all_of_dave.body["revoked"].as_array().map(Vec::len), Some(2));
    for token in &dave {
        assert_eq!(sys.get("/api/v1/boxes", token).status, 401);
    }

    // R-AUTH-1: a token made with --ttl works until then and never after; it is listed as
    // expired, and not among the active ones
    let short = {
        let mut args = vec!["tokens", "create", "--user", "frank", "--role", "member", "--kind", "agent", "--ttl", "2s"];
        let target = sys.target_args();
        args.extend(target.iter().map(String::as_str));
        let (code, out, err) = sys.cli(&args);
        assert_eq!(code, 0, "{err}");
        out.trim().to_owned()
    };
    let row = &listed(&sys, "frank")[0];
    let (created, expires) = (row["created_at"].as_str().expect("created_at"), row["expires_at"].as_str().expect("expires_at"));
    let lifetime = chrono::DateTime::parse_from_rfc3339(expires).expect("time") - chrono::DateTime::parse_from_rfc3339(created).expect("time");
    assert_eq!(lifetime.num_seconds(), 2, "{row}");
    assert_eq!(sys.get("/api/v1/boxes", &short).status, 200, "alive within its ttl");
    eventually("the short-lived token expired", Duration::from_secs(15), || match sys.get("/api/v1/boxes", &short).status {
        401 => Ok(()),
        other => Err(format!("answered {other}")),
    });
    assert_eq!(listed(&sys, "frank")[0]["state"], "expired");
    let active = cli_json(&sys, &["tokens", "list", "--user", "frank", "--active", "--json"]);
    assert_eq!(active["tokens"], serde_json::json!([]), "an expired token is not active");

    // R-AUTH-4: the CLI revokes by id and by user too, recorded as the operator's doing
    let erin = [sys.token("erin", "member", "agent"), sys.token("erin", "member", "agent")];
    let erin_ids: Vec<String> = listed(&sys, "erin").iter().map(|t| t["token_id"].as_str().expect("id").to_owned()).collect();
    let by_id = cli_json(&sys, &["tokens", "revoke", "--id", &erin_ids[0], "--json"]);
    assert_eq!(by_id["revoked"], serde_json::json!([erin_ids[0]]));
    assert_eq!(sys.get("/api/v1/boxes", &erin[0]).status, 401);
    assert_eq!(sys.get("/api/v1/boxes", &erin[1]).status, 200, "only that one");
    let by_user = cli_json(&sys, &["tokens", "revoke", "--user", "erin", "--json"]);
    assert_eq!(by_user["revoked"], serde_json::json!([erin_ids[1]]));
    assert_eq!(sys.get("/api/v1/boxes", &erin[1]).status, 401);
    let active = cli_json(&sys, &["tokens", "list", "--user", "erin", "--active", "--json"]);
    assert_eq!(active["tokens"], serde_json::json!([]));
    // the ledger follows the CLI's events too (no request waited for them: poll)
    let mut rows = vec![];
    for _ in 0..200 {
        rows = audit_rows(&sys, "token.revoke", &erin_ids[1]);
        if !rows.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(rows.len(), 1, "the CLI's revocation is audited");
    assert_eq!(rows[0]["actor"], "operator");
    let (code, verified) = sys.audit_verify();
    assert_eq!((code, &verified["ok"]), (0, &Value::Bool(true)), "{verified}");
}

#[test]
fn r_auth_4_tokens_are_listed_and_revoked_by_id_and_user_embedded() {
    tokens_are_managed(Mode::Embedded);
}

#[test]
fn r_auth_4_tokens_are_listed_and_revoked_by_id_and_user_cluster() {
    tokens_are_managed(Mode::Cluster);
}
