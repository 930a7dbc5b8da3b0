//! `atasira db roles`: one PostgreSQL role per process of the cluster (R-ARCH-13), each
//! with a generated password and only the rights its own code uses. A role may append
//! events only of its own aggregate types (and, on the draft stream that drafts and
//! approval share, only its own event types): the `event_writers` rows this writes, which
//! the events table's row-level security policy enforces. No role owns a table, so none
//! can alter, disable or drop a policy or a trigger, and none may update or delete anything
//! but its own read models and its consumers' progress.

use std::path::{Path, PathBuf};

use anyhow::Context;
use atasira_contracts::subjects;
use atasira_domain::aggregates::types;

/// The tables every consumer and relay keeps its progress in.
const PROGRESS_TABLES: &[&str] = &["projection_checkpoints", "projection_processed", "relay_checkpoints", "relay_dead_letters"];

/// (table, privileges).
type TableGrant = (&'static str, &'static str);
/// (aggregate type, event type or `None` for any).
type Append = (&'static str, Option<&'static str>);

/// What one process's role may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleGrants {
    /// The tables it may use, and how.
    pub tables: Vec<TableGrant>,
    /// What it may append to the store.
    pub appends: Vec<Append>,
}

/// The rights of `identity`'s role (pure): everyone reads the store and the consumers'
/// progress and appends its own events; services keep their consumers' progress; each
/// writes only its own tables.
pub fn grants(identity: &str) -> RoleGrants {
    let mut tables: Vec<TableGrant> = vec![("events", "SELECT, INSERT"), ("event_writers", "SELECT")];
    let progress = if subjects::SERVICES.contains(&identity) { "SELECT, INSERT, UPDATE, DELETE" } else { "SELECT" };
    tables.extend(PROGRESS_TABLES.iter().map(|t| (*t, progress)));
    // Services admit each principal assertion once across their replicas.
    if subjects::SERVICES.contains(&identity) {
        tables.push(("assertion_replay", "SELECT, INSERT, DELETE"));
    }
    // The services that NATS publishers address look their tokens up.
    let reads_tokens = subjects::CLIENT_ROUTES.iter().any(|(to, _)| *to == identity);
    if reads_tokens {
        tables.push(("gateway_tokens", "SELECT"));
    }
    let (own, appends): (Vec<TableGrant>, Vec<Append>) = match identity {
        subjects::GATEWAY => (
            vec![("gateway_tokens", "SELECT, INSERT, UPDATE"), ("gateway_idempotency", "SELECT, INSERT, UPDATE, DELETE")],
            vec![(types::PAT, None), (types::GATEWAY_ASSERTION_KEYS, None)],
        ),
        subjects::DRAFTS => (
            vec![("draft_rows", "SELECT, INSERT, UPDATE, DELETE"), ("drafts_box_types", "SELECT, INSERT, UPDATE, DELETE")],
            vec![
                (types::DRAFT, Some("DraftSubmitted")),
                (types::DRAFT, Some("DraftWithdrawn")),
                (types::DRAFT, Some("DraftExpired")),
                (types::DRAFTS_SECURITY, None),
            ],
        ),
        subjects::APPROVAL => (
            vec![],
            vec![
                (types::DRAFT, Some("DraftApproved")),
                (types::DRAFT, Some("DraftApprovalGiven")),
                (types::DRAFT, Some("DraftRejected")),
                (types::APPROVAL_KEYS, None),
                (types::APPROVAL_SECURITY, None),
                (types::APPROVAL_ASSERTION_KEYS, None),
                (types::ORG_POLICY, None),
            ],
        ),
        subjects::RUNTIME_REGISTRY => (
            [
                "box_rows",
                "registry_manifest_files",
                "worker_rows",
                "worker_transcript",
                "worker_life",
                "worker_log",
                "tool_requests",
                "host_leases",
                "trigger_slots",
            ]
            .map(|t| (t, "SELECT, INSERT, UPDATE, DELETE"))
            .to_vec(),
            [types::BOX, types::BOX_TYPE_NAMESPACE, types::REGISTRY_SECURITY, types::WORKER, types::CONFIG_BUNDLE, types::REGISTRY_ASSERTION_KEYS]
                .map(|t| (t, None))
                .to_vec(),
        ),
        subjects::PROVISIONER => (vec![], [types::ACCESS, types::PROVISIONER_SECURITY, types::EXECUTION_BINDING].map(|t| (t, None)).to_vec()),
        subjects::AUDIT => (
            vec![
                ("audit_ledger_rows", "SELECT, INSERT"),
                ("webhooks", "SELECT, INSERT, UPDATE, DELETE"),
                ("webhook_deliveries", "SELECT, INSERT, UPDATE, DELETE"),
            ],
            [types::AUDIT_LEDGER, types::AUDIT_SECURITY, types::WEBHOOK, types::NOTIFICATION].map(|t| (t, None)).to_vec(),
        ),
        _ => (vec![], vec![]),
    };
    tables.retain(|(t, _)| !own.iter().any(|(o, _)| o == t));
    tables.extend(own);
    RoleGrants { tables, appends }
}

/// The role name of `identity` under `prefix` (`atasira_` + `runtime_registry`, ...).
pub fn role_name(prefix: &str, identity: &str) -> String {
    format!("{prefix}{}", identity.replace('-', "_"))
}

fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 44
        && prefix.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok { Ok(()) } else { anyhow::bail!("--role-prefix {prefix:?}: use lowercase letters, digits and _ (at most 44), starting with a letter or _") }
}

/// `url` with its user and password replaced (`scheme://user:password@host/...`).
pub fn url_for(url: &str, user: &str, password: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| anyhow::anyhow!("--database-url is not a postgres:// URL"))?;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    Ok(format!("{scheme}://{user}:{password}@{host}"))
}

/// `atasira db roles` settings.
#[derive(Debug)]
pub struct Options {
    /// A role that owns the schema and may create roles.
    pub database_url: String,
    pub role_prefix: String,
    /// Where the per-process URL files go.
    pub out: PathBuf,
}

/// The file holding `identity`'s database URL in `dir`.
pub fn url_file(dir: &Path, identity: &str) -> PathBuf {
    dir.join(format!("{identity}.database-url"))
}

/// Creates (or updates, with new passwords) every process's role, grants it its rights,
/// records what it may append, and writes each role's URL into `out` (mode 0600).
pub async fn run(options: &Options) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    check_prefix(&options.role_prefix)?;
    // The tables and triggers first (as `db prepare`), so there is something to grant.
    let db = crate::services::open_db(None, Some(&options.database_url)).await?;
    prepare_all(&db).await?;
    let mut conn = sqlx::PgConnection::connect(&options.database_url)
        .await
        .with_context(|| format!("failed to connect to {}", atasira_platform::store::redact(&options.database_url)))?;
    std::fs::create_dir_all(&options.out).with_context(|| format!("cannot create {}", options.out.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&options.out, std::fs::Permissions::from_mode(0o700)).with_context(|| format!("cannot restrict {}", options.out.display()))?;
    }
    let mut tx = conn.begin().await?;
    // Nobody but the owner creates objects in the schema (PostgreSQL before 15 let everyone).
    sqlx::query("REVOKE CREATE ON SCHEMA public FROM PUBLIC").execute(&mut *tx).await?;
    let mut written = Vec::new();
    for identity in subjects::IDENTITIES {
        let role = role_name(&options.role_prefix, identity);
        let password = hex::encode(atasira_platform::auth::random_secret());
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)").bind(&role).fetch_one(&mut *tx).await?;
        let verb = if exists { "ALTER" } else { "CREATE" };
        // The name is checked above and the password is hex: nothing here needs quoting.
        sqlx::query(&format!("{verb} ROLE {role} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOBYPASSRLS PASSWORD '{password}'"))
            .execute(&mut *tx)
            .await
            .with_context(|| format!("cannot {} role {role} (the role of --database-url needs CREATEROLE)", verb.to_lowercase()))?;
        sqlx::query(&format!("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")).execute(&mut *tx).await?;
        sqlx::query(&format!("GRANT USAGE ON SCHEMA public TO {role}")).execute(&mut *tx).await?;
        let RoleGrants { tables, appends } = grants(identity);
        for (table, privileges) in tables {
            sqlx::query(&format!("GRANT {privileges} ON {table} TO {role}"))
                .execute(&mut *tx)
                .await
                .with_context(|| format!("cannot grant {privileges} on {table} to {role}"))?;
        }
        sqlx::query("DELETE FROM event_writers WHERE role = $1").bind(&role).execute(&mut *tx).await?;
        for (aggregate_type, event_type) in appends {
            sqlx::query("INSERT INTO event_writers (role, aggregate_type, event_type) VALUES ($1, $2, $3)")
                .bind(&role)
                .bind(aggregate_type)
                .bind(event_type)
                .execute(&mut *tx)
                .await?;
        }
        written.push((*identity, role, url_for(&options.database_url, &role_name(&options.role_prefix, identity), &password)?));
    }
    tx.commit().await?;
    for (identity, role, url) in &written {
        let path = url_file(&options.out, identity);
        crate::files::write_file(&path, &format!("{url}\n"), 0o600)?;
        eprintln!("atasira db roles: role {role}: {} (mode 0600)", path.display());
    }
    eprintln!("next: start each process with ATASIRA_DATABASE_URL_FILE=<that file> (or --database-url-file)");
    eprintln!("      running this again gives every role a new password and rewrites the files");
    Ok(())
}

/// Every table and trigger the services use (connecting creates the event store's).
pub async fn prepare_all(db: &atasira_platform::store::Db) -> anyhow::Result<()> {
    atasira_gateway::prepare(db).await?;
    atasira_audit::prepare(db).await?;
    let registry = atasira_runtime_registry::RegistryConfig {
        manifests_dir: PathBuf::new(),
        max_boxes: 0,
        host_lease: std::time::Duration::from_secs(10),
        ask_ttl: std::time::Duration::from_secs(300),
        trigger_in_flight: 0,
        listener: None,
    };
    for p in atasira_drafts::projections().into_iter().chain(atasira_runtime_registry::projections(&registry)) {
        atasira_platform::projection::prepare(db, p.as_ref()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appenders(aggregate_type: &str, event_type: &str) -> Vec<&'static str> {
        subjects::IDENTITIES
            .iter()
            .copied()
            .filter(|i| grants(i).appends.iter().any(|(t, e)| *t == aggregate_type && e.is_none_or(|e| e == event_type)))
            .collect()
    }

    #[test]
    fn r_arch_13_every_aggregate_type_has_its_writers_and_decisions_are_approvals_alone() {
        for t in types::ALL {
            assert!(!appenders(t, "AnyEvent").is_empty() || *t == types::DRAFT, "{t} has no writer");
        }
        assert_eq!(appenders(types::DRAFT, "DraftApproved"), [subjects::APPROVAL]);
        assert_eq!(appenders(types::DRAFT, "DraftRejected"), [subjects::APPROVAL]);
        assert_eq!(appenders(types::DRAFT, "DraftSubmitted"), [subjects::DRAFTS]);
        assert_eq!(appenders(types::APPROVAL_KEYS, "ApprovalKeyPublished"), [subjects::APPROVAL]);
        assert_eq!(appenders(types::GATEWAY_ASSERTION_KEYS, "AssertionKeyPublished"), [subjects::GATEWAY]);
        assert_eq!(appenders(types::BOX, "BoxActivated"), [subjects::RUNTIME_REGISTRY]);
        assert_eq!(appenders(types::AUDIT_LEDGER, "AuditCheckpoint"), [subjects::AUDIT]);
        assert!(appenders(types::DRAFT, "DraftApproved").iter().all(|i| *i != subjects::PROVISIONER));
        // and every type but the draft stream has exactly one writer
        for t in types::ALL.iter().filter(|t| **t != types::DRAFT) {
            assert_eq!(appenders(t, "AnyEvent").len(), 1, "{t}");
        }
    }

    #[test]
    fn r_arch_13_only_the_gateway_writes_tokens_and_no_role_rewrites_events_or_the_ledger() {
        let writes = |identity: &str, table: &str| grants(identity).tables.iter().any(|(t, p)| *t == table && (p.contains("INSERT") || p.contains("UPDATE")));
        for identity in subjects::IDENTITIES {
            assert_eq!(writes(identity, "gateway_tokens"), *identity == subjects::GATEWAY, "{identity}");
            for (table, privileges) in grants(identity).tables {
                if ["events", "audit_ledger_rows", "event_writers"].contains(&table) {
                    assert!(!privileges.contains("UPDATE") && !privileges.contains("DELETE"), "{identity} on {table}: {privileges}");
                }
            }
        }
        assert!(grants(subjects::PROVISIONER).tables.iter().all(|(t, _)| !["draft_rows", "box_rows", "gateway_tokens", "audit_ledger_rows"].contains(t)));
        assert!(writes(subjects::AUDIT, "audit_ledger_rows") && !writes(subjects::DRAFTS, "audit_ledger_rows"));
        assert!(!writes(subjects::GATEWAY, "projection_checkpoints"), "the gateway keeps no consumer");
    }

    #[test]
    fn role_names_and_urls_follow_the_prefix_and_refuse_odd_text() {
        assert_eq!(role_name("atasira_", "runtime-registry"), "atasira_runtime_registry");
        assert_eq!(url_for("postgres://admin:pw@db:5432/atasira", "atasira_drafts", "ab").expect("url"), "postgres://atasira_drafts:ab@db:5432/atasira");
        assert_eq!(url_for("postgres://db/atasira", "r", "p").expect("url"), "postgres://r:p@db/atasira");
        for bad in ["", "Atasira", "a-b", "a;drop", "1abc"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
        assert!(check_prefix("atasira_t_0123abcd_").is_ok());
    }
}
