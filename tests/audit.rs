//! The audit ledger on a real PostgreSQL (R-AUDIT-1, R-AUDIT-2, R-ARCH-6): the same SQL as
//! embedded mode, concurrent writers never fork the chain, tampering is named. And the whole
//! product in both modes (issue 9, item 6): a tail removed after a checkpoint and regrown is
//! named by `audit verify` over REST and the CLI, the ledger and the events refuse to be
//! rewritten, and cluster services run under a database role that cannot switch that off.

use std::collections::HashMap;

use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::audit::{AuditKey, AuditKeys, Verification};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::store::Db;
use atasira_tests::fixtures::draft_body;
use atasira_tests::harness::{Database, Mode, OutputWithin, SUBPROCESS_LIMIT, System, in_both_modes};
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime")
}

fn keys() -> AuditKeys {
    AuditKeys::new(AuditKey::new("audit-1", &[5; 32]).expect("key"), vec![])
}

async fn submit(db: &Db, id: &str) {
    let plan = BoxDraftCreateRequest::from_value(json!({"box_type": id, "purpose": "p"})).and_then(|r| r.plan()).expect("plan");
    let command = DraftCommand::Submit { draft_id: id.into(), plan, requested_by: Principal::new("agent", Role::Member, Kind::Agent), at: chrono::Utc::now() };
    db.cqrs::<Draft>().execute(id, command, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("submit");
}

/// Waits until `n` draft events are visible: transactions in flight anywhere in the
/// PostgreSQL cluster (other tests) may hold back visibility for a moment.
async fn visible(db: &Db, n: usize) {
    for _ in 0..400 {
        if db.events_after(0, &["draft"], 1000).await.expect("read").len() >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{n} events never became visible");
}

/// Runs `statement` as the superuser with the ledger's triggers off, then on again.
async fn tamper(db: &Db, statement: &str) {
    let mut tx = db.any().begin().await.expect("begin");
    for s in ["ALTER TABLE audit_ledger_rows DISABLE TRIGGER USER", statement, "ALTER TABLE audit_ledger_rows ENABLE TRIGGER USER"] {
        sqlx::query(s).execute(&mut *tx).await.unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    tx.commit().await.expect("commit");
}

#[test]
fn concurrent_ledger_writers_on_postgres_append_one_chain_and_tampering_is_named() {
    let database = Database::create();
    runtime().block_on(async {
        let db = Db::connect(&database.url).await.expect("connect");
        let ks = keys();
        for i in 0..12 {
            submit(&db, &format!("d{i}")).await;
        }
        visible(&db, 12).await;
        // given two writers catching up at once (two audit processes, or a redelivery
        // racing the live writer); then one chain, one row per event
        atasira_audit::prepare(&db).await.expect("prepare");
        let (a, b) = tokio::join!(
            {
                let (db, ks) = (db.clone(), ks.clone());
                tokio::spawn(async move { atasira_audit::apply_pending(&db, &ks).await })
            },
            {
                let (db, ks) = (db.clone(), ks.clone());
                tokio::spawn(async move { atasira_audit::apply_pending(&db, &ks).await })
            }
        );
        let appended = a.expect("joined").expect("writer a") + b.expect("joined").expect("writer b");
        assert_eq!(appended, 12);
        assert_eq!(atasira_audit::verify(&db, &ks).await.expect("verify"), Verification::Ok { rows: 12 });
        let check = atasira_audit::check_complete(&db).await.expect("check");
        assert_eq!(check, json!({"ledger_rows": 12, "auditable_events": 12, "missing": [], "duplicated": []}));
        // and pages with filters work on PostgreSQL too
        let (page, next) =
            atasira_audit::page(&db, atasira_audit::Filter { action: "box_draft.create", target: "d3", ..Default::default() }, 0, 0).await.expect("page");
        assert_eq!((page.len(), page[0].event_id.as_str(), next.as_str()), (1, "draft/d3/1", ""));
        let since = atasira_audit::page(&db, atasira_audit::Filter { since: Some(page[0].time), ..Default::default() }, 0, 0).await.expect("page").0;
        assert!(!since.is_empty() && since.iter().all(|r| r.time >= page[0].time));
        // when a checkpoint is recorded and then the tail row is deleted; then the tail is named
        assert_eq!(atasira_audit::checkpoint(&db, &ks).await.expect("checkpoint"), Some(12));
        // (as the superuser, with the ledger's triggers off: they refuse it otherwise)
        let refused = sqlx::query("DELETE FROM audit_ledger_rows WHERE seq = 12").execute(db.any()).await.expect_err("refused");
        assert!(refused.to_string().contains("append-only"), "{refused}");
        tamper(&db, "DELETE FROM audit_ledger_rows WHERE seq = 12").await;
        let v = atasira_audit::verify(&db, &ks).await.expect("verify");
        assert!(matches!(&v, Verification::Broken { first_bad_seq: 12, reason } if reason.contains("tail")), "{v:?}");
        // when a middle row is modified; then that row comes first
        tamper(&db, "UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 5").await;
        let v = atasira_audit::verify(&db, &ks).await.expect("verify");
        assert!(matches!(v, Verification::Broken { first_bad_seq: 5, .. }), "{v:?}");
    });
}

/// A writer that knows the head it left seals its next batch after it without reading it;
/// when someone appended since, or an event has its row already, its write fails whole on
/// the unique keys and it reads the head, so the chain never forks.
async fn a_known_head_never_forks_the_chain(db: &Db) {
    use atasira_audit::{KnownHead, append_batch, append_batch_after};
    let ks = keys();
    atasira_audit::prepare(db).await.expect("prepare");
    for id in ["k1", "k2", "k3"] {
        submit(db, id).await;
    }
    visible(db, 3).await;
    let events = db.events_after(0, &["draft"], 10).await.expect("events");
    // given a writer that appended k1's submission and knows the head it left
    let known = KnownHead::default();
    assert_eq!(append_batch_after(db, &ks, &events[..1], &known).await.expect("first"), 1);
    assert_eq!(known.seq(), Some(1));
    // when another writer appends k2's, and the first appends k3's after the head it knows
    assert_eq!(append_batch(db, &ks, &events[1..2]).await.expect("another writer"), 1);
    assert_eq!(append_batch_after(db, &ks, &events[2..3], &known).await.expect("after a moved head"), 1);
    assert_eq!(known.seq(), Some(3));
    // and k2's is delivered to it again
    assert_eq!(append_batch_after(db, &ks, &events[1..2], &known).await.expect("a redelivery"), 0);
    assert_eq!(known.seq(), Some(3), "a redelivery leaves the head it knows");
    // then one chain, one row per event, in the order they were appended
    let (rows, _) = atasira_audit::page(db, atasira_audit::Filter::default(), 0, 0).await.expect("page");
    let mut targets: Vec<(i64, String)> = rows.iter().map(|r| (r.seq, r.target.clone())).collect();
    targets.sort();
    assert_eq!(targets, vec![(1, "k1".to_owned()), (2, "k2".to_owned()), (3, "k3".to_owned())]);
    assert_eq!(atasira_audit::verify(db, &ks).await.expect("verify"), Verification::Ok { rows: 3 });
}

#[test]
fn a_ledger_writer_that_knows_the_head_never_forks_the_chain_on_postgresql() {
    // R-AUDIT-1, R-AUDIT-2 (cluster store)
    let database = Database::create();
    runtime().block_on(async { a_known_head_never_forks_the_chain(&Db::connect(&database.url).await.expect("connect")).await });
}

#[test]
fn a_ledger_writer_that_knows_the_head_never_forks_the_chain_on_sqlite() {
    // R-AUDIT-1, R-AUDIT-2 (embedded store)
    let dir = atasira_tests::harness::TempDir::new("atasira-known-head");
    runtime().block_on(async { a_known_head_never_forks_the_chain(&Db::connect(&Db::sqlite_url(&dir.0)).await.expect("connect")).await });
}

/// The ledger's first rows: the harness issues the admin's and the agent's tokens
/// (`token.issue`, R-AUDIT-1), so the rows of a test start at seq 3.
const TOKEN_ROWS: usize = 2;

/// Submits and approves a draft: four ledger rows (create, approve, activate, and the sync of
/// the Box's configuration bundle).
fn approved_box(sys: &System, box_type: &str) {
    let id = sys.draft(&draft_body(box_type));
    let a = sys.approve(&id, &sys.admin, false);
    assert_eq!(a.status, 200, "{}", a.raw);
}

/// Submits `n` drafts: one ledger row each.
fn submitted(sys: &System, prefix: &str, n: usize) {
    for i in 0..n {
        sys.draft(&draft_body(&format!("{prefix}-{i}")));
    }
}

/// Waits until the ledger has exactly `n` rows after the tokens' (GET /api/v1/audit).
fn ledger_has(sys: &System, n: usize) {
    let n = TOKEN_ROWS + n;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let a = sys.get("/api/v1/audit?limit=500", &sys.admin);
        let rows = a.body["rows"].as_array().map(Vec::len);
        if a.status == 200 && rows == Some(n) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the ledger never had {n} rows; last answer {}: {}", a.status, a.raw);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The recorded checkpoints' `(seq, prev_seq)`, in order.
fn checkpoint_links(sys: &System) -> Vec<(i64, i64)> {
    runtime().block_on(async {
        let db = Db::connect(&sys.database_url()).await.expect("connect");
        atasira_audit::checkpoints(&db).await.expect("checkpoints").iter().map(|c| (c.seq, c.prev_seq)).collect()
    })
}

#[test]
fn a_tail_removed_after_a_checkpoint_and_regrown_is_named_by_rest_and_cli() {
    // R-AUDIT-2 (issue 9, item 6): checkpoints form a chain and verification checks every
    // one, so new rows re-using removed seqs under a new checkpoint do not hide the removal.
    in_both_modes(|sys| {
        // given 3 rows (after the tokens') and checkpoint K over them (a graceful stop
        // records a checkpoint),
        // then 3 more rows and a second checkpoint
        submitted(sys, "kept", 3);
        ledger_has(sys, 3);
        sys.stop_gracefully();
        sys.start_services(&[]);
        submitted(sys, "removed", 3);
        ledger_has(sys, 6);
        sys.stop_gracefully();
        assert_eq!(checkpoint_links(sys), vec![(5, 0), (8, 5)], "each checkpoint names the one before it");
        assert_eq!(sys.audit_verify(), (0, json!({"ok": true, "rows": 8})));
        // when the database superuser deletes the rows after checkpoint K
        sys.tamper("DELETE FROM audit_ledger_rows WHERE seq > 5");
        assert_eq!(sys.audit_verify().1["first_bad_seq"], json!(6), "a removed tail is named at once");
        // and the ledger regrows past the last checkpoint, which the service checkpoints
        sys.start_services(&[]);
        submitted(sys, "regrown", 6);
        ledger_has(sys, 9);
        sys.stop_gracefully();
        assert_eq!(checkpoint_links(sys), vec![(5, 0), (8, 5), (11, 8)]);
        // then the CLI names seq 8, the checkpoint whose row was replaced
        let (code, cli) = sys.audit_verify();
        assert_eq!((code, &cli["ok"], &cli["first_bad_seq"]), (1, &json!(false), &json!(8)), "{cli}");
        assert!(cli["reason"].as_str().is_some_and(|r| r.contains("checkpoint at seq 8")), "{cli}");
        // and the REST answer is the same
        sys.start_services(&[]);
        let rest = sys.get("/api/v1/audit/verify", &sys.admin);
        assert_eq!((rest.status, &rest.body), (200, &cli), "{}", rest.raw);
    });
}

#[test]
fn the_ledger_refuses_update_delete_and_truncate_and_the_events_refuse_truncate() {
    // R-AUDIT-2, R-ARCH-4 (issue 9, item 6): the database itself refuses to rewrite history,
    // even to its superuser, as long as the triggers are on.
    in_both_modes(|sys| {
        approved_box(sys, "guarded");
        ledger_has(sys, 4);
        let mut refused = vec![
            "UPDATE audit_ledger_rows SET actor = 'mallory' WHERE seq = 1",
            "DELETE FROM audit_ledger_rows WHERE seq = 3",
            "DELETE FROM audit_ledger_rows",
        ];
        if sys.mode == Mode::Cluster {
            refused.extend(["TRUNCATE audit_ledger_rows", "TRUNCATE events", "TRUNCATE events, audit_ledger_rows"]);
        } else {
            refused.extend(["UPDATE events SET payload = '{}'", "DELETE FROM events"]);
        }
        for statement in refused {
            let err = sys.sql_refused(statement);
            assert!(err.contains("append-only"), "{statement}: {err}");
        }
        // and nothing changed
        let (code, v) = sys.audit_verify();
        assert_eq!((code, &v), (0, &json!({"ok": true, "rows": TOKEN_ROWS + 4})));
        assert!(sys.sql_i64("SELECT COUNT(*) FROM events") > 3);
        // and a restart (which prepares the tables again) keeps one set of triggers
        sys.restart();
        let triggers = match sys.mode {
            Mode::Cluster => sys.sql_i64(
                "SELECT COUNT(*) FROM pg_trigger WHERE tgname IN ('events_append_only', 'events_no_truncate', 'audit_ledger_rows_append_only', 'audit_ledger_rows_no_truncate')",
            ),
            Mode::Embedded => sys.sql_i64("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN ('events', 'audit_ledger_rows')"),
        };
        assert_eq!(triggers, 4);
    });
}

/// PostgreSQL roles made for one test, dropped (after the test's database) on drop.
struct Roles {
    admin_url: String,
    names: Vec<String>,
}

impl Roles {
    fn create(database: &Database, names: &[&str]) -> Roles {
        let statements: Vec<String> = names.iter().map(|n| format!("CREATE ROLE {n} LOGIN")).collect();
        database.run_on_cluster(&statements.iter().map(String::as_str).collect::<Vec<_>>()).expect("create roles");
        let admin_url = std::env::var("ATASIRA_TEST_DATABASE_URL").expect("scripts/test sets ATASIRA_TEST_DATABASE_URL");
        Roles { admin_url, names: names.iter().map(|n| (*n).to_owned()).collect() }
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        let (url, names) = (self.admin_url.clone(), self.names.clone());
        runtime().block_on(async move {
            use sqlx::Connection;
            if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                for name in names {
                    let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {name}")).execute(&mut conn).await;
                }
            }
        });
    }
}

#[test]
fn cluster_services_run_under_a_role_that_cannot_rewrite_history() {
    // Issue 9, item 6: the README's section "Running with a database role that cannot
    // rewrite history", step by step. The owner role owns the schema, the tables and their
    // triggers; the services' role may only read and write rows.
    let database = Database::create();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (owner, service) = (format!("atasira_owner_{}", &suffix[..12]), format!("atasira_service_{}", &suffix[..12]));
    let roles = Roles::create(&database, &[&owner, &service]);
    let (owner_url, service_url) = (database.url_as(&owner), database.url_as(&service));
    // given the schema handed to the owner (as the superuser)
    let schema = [
        format!("ALTER SCHEMA public OWNER TO {owner}"),
        "REVOKE ALL ON SCHEMA public FROM PUBLIC".into(),
        format!("GRANT USAGE ON SCHEMA public TO {service}"),
    ];
    database.run_as(&database.url, &schema.iter().map(String::as_str).collect::<Vec<_>>()).expect("schema to the owner");
    // and every table and trigger created by the owner
    let prepared = std::process::Command::new(atasira_tests::harness::atasira_bin())
        .args(["db", "prepare", "--database-url", &owner_url])
        .env_remove("ATASIRA_DATABASE_URL")
        .output_within(SUBPROCESS_LIMIT)
        .expect("atasira runs");
    assert!(prepared.status.success(), "db prepare: {}", String::from_utf8_lossy(&prepared.stderr));
    // and rows granted to the service role, but no rewriting of events or ledger rows
    let grants = [
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {service}"),
        format!("REVOKE UPDATE, DELETE ON events, audit_ledger_rows FROM {service}"),
    ];
    database.run_as(&owner_url, &grants.iter().map(String::as_str).collect::<Vec<_>>()).expect("grants");
    // when every cluster process runs as the service role
    let mut sys = System::start_cluster_on(database, &[("ATASIRA_DATABASE_URL", service_url.clone())]);
    // then the product works: a Box is approved, the ledger verifies (as that role too)
    approved_box(&sys, "least-privilege");
    ledger_has(&sys, 4);
    assert_eq!(sys.audit_verify(), (0, json!({"ok": true, "rows": TOKEN_ROWS + 4})));
    let (code, out, err) = sys.cli(&["audit", "verify", "--database-url", &service_url]);
    assert_eq!((code, out.trim()), (0, r#"{"ok":true,"rows":6}"#), "{err}");
    // and the service role can neither switch the triggers off nor go around them
    for statement in [
        "ALTER TABLE audit_ledger_rows DISABLE TRIGGER USER",
        "ALTER TABLE events DISABLE TRIGGER events_append_only",
        "DROP TRIGGER audit_ledger_rows_append_only ON audit_ledger_rows",
        "DROP FUNCTION atasira_ledger_append_only() CASCADE",
        "SET session_replication_role = replica",
        "DELETE FROM audit_ledger_rows",
        "UPDATE events SET payload = '{}'",
        "TRUNCATE audit_ledger_rows",
        "TRUNCATE events",
        "CREATE TABLE audit_ledger_rows_copy (seq BIGINT)",
    ] {
        let refused = sys.database().run_as(&service_url, &[statement]);
        let err = refused.expect_err(statement);
        assert!(err.contains("must be owner") || err.contains("permission denied"), "{err}");
    }
    // and the owner, who can, is still refused by the triggers while they are on
    let err = sys.database().run_as(&owner_url, &["DELETE FROM audit_ledger_rows"]).expect_err("refused");
    assert!(err.contains("append-only"), "{err}");
    // and a table the role may not create is named when it is missing
    sys.stop_gracefully();
    sys.database().run_as(&owner_url, &["DROP TABLE gateway_tokens"]).expect("drop");
    let (code, _, err) = sys.cli(&["tokens", "create", "--user", "x", "--role", "member", "--kind", "agent", "--database-url", &service_url]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("gateway_tokens") && err.contains(&service) && err.contains("atasira db prepare"), "{err}");
    drop(sys);
    drop(roles);
}

/// An insert of one event as `aggregate_type`/`event_type`, rolled back if it is taken.
fn try_append(sys: &System, url: &str, aggregate_type: &str, event_type: &str) -> Result<(), String> {
    sys.database().run_as(url, &["BEGIN", &append_statement(aggregate_type, event_type), "ROLLBACK"])
}

/// The statement that appends one event of a fresh stream as `aggregate_type`/`event_type`.
fn append_statement(aggregate_type: &str, event_type: &str) -> String {
    format!(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) \
         VALUES ('{aggregate_type}', 'forged-{}', 1, '{event_type}', '1', '{{}}', '{{}}')",
        uuid::Uuid::new_v4().simple()
    )
}

#[test]
fn each_process_role_appends_only_its_own_events_and_can_switch_nothing_off() {
    // R-ARCH-13: given a cluster whose processes run as the roles `atasira db roles` made
    let sys = System::start(Mode::Cluster);
    approved_box(&sys, "own-roles");
    ledger_has(&sys, 4);
    let connected: Vec<String> = {
        let url = sys.database_url();
        let statement = "SELECT DISTINCT usename::text FROM pg_stat_activity WHERE datname = current_database()";
        runtime().block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("connects");
            sqlx::query_scalar(statement).fetch_all(&mut conn).await.expect("activity")
        })
    };
    for identity in atasira_contracts::subjects::IDENTITIES {
        let role = sys.database_url_of(identity).split("://").nth(1).and_then(|r| r.split(':').next()).expect("a role").to_owned();
        assert!(connected.contains(&role), "{identity} does not run as its role {role}: {connected:?}");
    }
    // each role may append what it owns, and nothing of another's: no decision but
    // approval's, no key but its own, no Box but the registry's
    let owns = |identity: &str| match identity {
        "gateway" => ("pat", "TokenIssued"),
        "drafts" => ("draft", "DraftSubmitted"),
        "approval" => ("draft", "DraftApproved"),
        "provisioner" => ("access", "AccessProvisioned"),
        "runtime-registry" => ("box", "BoxActivated"),
        _ => ("audit_ledger", "AuditCheckpoint"),
    };
    let foreign = [
        ("draft", "DraftApproved", "approval"),
        ("approval_keys", "ApprovalKeyPublished", "approval"),
        ("gateway_assertion_keys", "AssertionKeyPublished", "gateway"),
        ("box", "BoxActivated", "runtime-registry"),
        ("pat", "TokenIssued", "gateway"),
        ("audit_ledger", "AuditCheckpoint", "audit"),
    ];
    for identity in atasira_contracts::subjects::IDENTITIES {
        let url = sys.database_url_of(identity);
        let (t, e) = owns(identity);
        assert_eq!(try_append(&sys, &url, t, e), Ok(()), "{identity} appends its own {e}");
        for (t, e, owner) in foreign.iter().filter(|(_, _, owner)| owner != identity) {
            let err = try_append(&sys, &url, t, e).expect_err(&format!("{identity} appended {e}"));
            assert!(err.contains("violates row-level security policy"), "{identity} {e} (owner {owner}): {err}");
        }
        // and none can write tokens but the gateway, or rewrite or switch anything off
        let token_row = "INSERT INTO gateway_tokens (token_hash, user_id, role, kind, created_at_ms) VALUES ('x', 'mallory', 'admin', 'human', 0)";
        let token = sys.database().run_as(&url, &["BEGIN", token_row, "ROLLBACK"]);
        assert_eq!(token.is_ok(), *identity == "gateway", "{identity} writing a token row: {token:?}");
        for statement in [
            "ALTER TABLE events DISABLE ROW LEVEL SECURITY",
            "DROP POLICY events_appended_by_their_writers ON events",
            "ALTER POLICY events_appended_by_their_writers ON events WITH CHECK (true)",
            "CREATE POLICY mine ON events FOR INSERT WITH CHECK (true)",
            "ALTER TABLE events DISABLE TRIGGER USER",
            "DROP TRIGGER events_append_only ON events",
            "DELETE FROM event_writers",
            "INSERT INTO event_writers (role, aggregate_type) VALUES (current_user, 'draft')",
            "UPDATE events SET payload = '{}'",
            "DELETE FROM audit_ledger_rows",
            "UPDATE audit_ledger_rows SET mac = ''",
            "SET session_replication_role = replica",
            "CREATE TABLE sneaky (x int)",
        ] {
            let err = sys.database().run_as(&url, &[statement]).expect_err(&format!("{identity}: {statement}"));
            assert!(err.contains("must be owner") || err.contains("permission denied") || err.contains("append-only"), "{identity}: {err}");
        }
        // a session without row-level security appends nothing, not even its own events
        let (t, e) = owns(identity);
        let unguarded =
            sys.database().run_as(&url, &["SET row_security = off", &append_statement(t, e)]).expect_err(&format!("{identity} without row security"));
        assert!(unguarded.contains("row-level security"), "{identity}: {unguarded}");
    }
    // and the legitimate flow went on: the ledger verifies
    assert_eq!(sys.audit_verify().0, 0);
}

#[test]
fn ledger_rows_say_what_happened_and_a_changed_detail_is_named() {
    // R-AUDIT-6: each row carries a short detail under its MAC: what a submission asks for,
    // what an approval signs and grants, why a draft was rejected.
    in_both_modes(|sys| {
        approved_box(sys, "detailed");
        let rejected = sys.draft(&draft_body("refused-one"));
        let r = sys.post(&format!("/api/v1/boxes/box-drafts/{rejected}/reject"), &sys.admin, &json!({"reason": "too broad for now"}));
        assert_eq!(r.status, 200, "{}", r.raw);
        ledger_has(sys, 6);
        let rows = sys.get("/api/v1/audit?limit=500", &sys.admin).body["rows"].as_array().cloned().expect("rows");
        let detail = |action: &str| -> String {
            let row = rows.iter().find(|r| r["action"] == action).unwrap_or_else(|| panic!("no {action} row: {rows:?}"));
            row["detail"].as_str().expect("detail").to_owned()
        };
        assert!(detail("box_draft.create").starts_with("submitted detailed v"), "{}", detail("box_draft.create"));
        assert!(detail("box_draft.create").contains("tools [Read]"), "{}", detail("box_draft.create"));
        assert!(detail("box_draft.approve").starts_with("approved detailed: manifest sha256:"), "{}", detail("box_draft.approve"));
        assert!(detail("box.activate").contains("grants os_operations [file:read], tools [Read]"), "{}", detail("box.activate"));
        assert_eq!(detail("box_draft.reject"), "rejected refused-one: too broad for now");
        assert!(detail("token.issue").starts_with("token for "), "{}", detail("token.issue"));
        assert_eq!(sys.audit_verify(), (0, json!({"ok": true, "rows": TOKEN_ROWS + 6})));

        // when the superuser rewrites a detail, verification names that row
        let seq = rows.iter().find(|r| r["action"] == "box_draft.reject").and_then(|r| r["seq"].as_i64()).expect("seq");
        sys.tamper(&format!("UPDATE audit_ledger_rows SET detail = 'approved after all' WHERE seq = {seq}"));
        let (code, verified) = sys.audit_verify();
        assert_eq!((code, &verified["first_bad_seq"]), (1, &json!(seq)), "{verified}");
    });
}

/// One line of an export whose `seq` is `seq`, changed by `change`.
fn change_row(export: &str, seq: i64, change: impl Fn(&str) -> String) -> String {
    export.lines().map(|l| if l.contains(&format!("\"seq\":{seq},")) && l.contains("\"type\":\"row\"") { change(l) } else { l.to_owned() } + "\n").collect()
}

#[test]
fn r_audit_3_an_exported_period_verifies_offline_and_a_changed_byte_names_its_row() {
    in_both_modes(|sys| {
        // given rows under a first signed checkpoint (a graceful stop records one)
        submitted(sys, "spring", 3);
        ledger_has(sys, 3);
        sys.stop_gracefully();
        sys.start_services(&[]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let since = chrono::Utc::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // and the period's rows after it, not yet checkpointed
        submitted(sys, "summer", 3);
        ledger_has(sys, 6);
        let until = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
        let period = format!(
            "since={}&until={}",
            since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
        .replace('+', "%2B");

        // Only admins export.
        assert_eq!(sys.get(&format!("/api/v1/audit/export?{period}"), &sys.agent).status, 403, "{:?}", sys.mode);
        let bad = sys.get("/api/v1/audit/export?format=xml", &sys.admin);
        assert_eq!((bad.status, bad.body["error"].clone()), (400, json!("invalid_query")), "{}", bad.raw);

        // when the period is exported (a checkpoint is recorded first, so its rows are covered)
        let a = atasira_tests::harness::http("GET", &sys.url(&format!("/api/v1/audit/export?{period}")), Some(&sys.admin), &[], None);
        assert_eq!(a.status, 200, "{}", a.raw);
        let header: serde_json::Value = serde_json::from_str(a.raw.lines().next().expect("a header")).expect("JSON");
        assert_eq!((header["type"].clone(), header["from_seq"].clone(), header["to_seq"].clone()), (json!("export"), json!(6), json!(8)), "{header}");
        let public_key = header["public_key"].as_str().expect("the checkpoint key").to_owned();
        assert_eq!(a.raw.matches("\"type\":\"row\"").count(), 3, "{}", a.raw);
        let dir = sys.cli_dir();
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("summer.jsonl");
        std::fs::write(&file, &a.raw).expect("write");
        // then it verifies offline, with nothing but the file and the published key
        let verify = |file: &std::path::Path| {
            let (code, out, err) = sys.cli(&["audit", "verify", "--file", file.to_str().expect("utf-8"), "--public-key", &public_key]);
            (code, serde_json::from_str::<serde_json::Value>(out.trim()).unwrap_or_else(|_| panic!("no JSON: {out} {err}")))
        };
        let (code, v) = verify(&file);
        assert_eq!((code, v["ok"].clone(), v["rows"].clone(), v["covered"].clone()), (0, json!(true), json!(3), json!(3)), "{v}");

        // A changed byte in a row names the row; in a checkpoint, the checkpoint.
        std::fs::write(&file, change_row(&a.raw, 7, |l| l.replacen("\"detail\":\"", "\"detail\":\"X", 1))).expect("write");
        let (code, v) = verify(&file);
        assert_eq!((code, v["ok"].clone(), v["first_bad_seq"].clone()), (1, json!(false), json!(7)), "{v}");
        assert!(v["reason"].as_str().is_some_and(|r| r.contains("row 7")), "{v}");
        let forged = a.raw.replacen("\"rows_digest\":\"", "\"rows_digest\":\"0", 1);
        std::fs::write(&file, forged.replacen("\"rows_digest\":\"00", "\"rows_digest\":\"01", 1)).expect("write");
        assert_eq!(verify(&file).0, 1);

        // The whole ledger as CSV through the CLI: both signed checkpoints cover it.
        let csv = dir.join("all.csv");
        let (code, _, err) =
            sys.cli(&["audit", "export", "--format", "csv", "--out", csv.to_str().expect("utf-8"), "--url", &sys.url(""), "--token", &sys.admin]);
        assert_eq!(code, 0, "{err}");
        let (code, v) = verify(&csv);
        assert_eq!((code, v["ok"].clone(), v["rows"].clone()), (0, json!(true), json!(8)), "{v}");
        let text = std::fs::read_to_string(&csv).expect("read");
        assert!(text.starts_with("type,seq,time,"), "{text}");
        std::fs::write(&csv, text.replacen("spring-1", "spring-I", 1)).expect("write");
        let (code, v) = verify(&csv);
        assert_eq!((code, v["ok"].clone()), (1, json!(false)), "{v}");
        assert!(v["first_bad_seq"].as_i64().is_some_and(|s| (3..=5).contains(&s)), "{v}");
    });
}
