//! Operator verbs on a data dir (embedded) or a database URL (cluster): tokens and
//! projection rebuilds. They work while `atasira dev` runs on the same data dir.

use std::path::PathBuf;

use atasira_domain::{Kind, Principal, Role};
use atasira_platform::auth;
use atasira_platform::projection::{self, Projection};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use crate::services::open_db;

/// Where the database is. Both may be set, as in the environment of a cluster process:
/// then the database URL names the store and the data dir only where managed files are
/// (manifests), as for `atasira serve`.
#[derive(Debug, Args)]
#[group(required = true, multiple = true)]
pub struct Target {
    /// Data directory of `atasira dev` (embedded); with --database-url, only where the
    /// managed files are.
    #[arg(long, env = "ATASIRA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// PostgreSQL URL (cluster); the store, also when a data dir is set.
    #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// File holding the PostgreSQL URL (as `atasira db roles` writes them).
    #[arg(long, env = "ATASIRA_DATABASE_URL_FILE", value_name = "FILE")]
    database_url_file: Option<PathBuf>,
}

impl Target {
    /// `--database-url`, else the URL in `--database-url-file`.
    pub fn database_url(&self) -> anyhow::Result<Option<String>> {
        crate::services::database_url(self.database_url.clone(), self.database_url_file.as_deref())
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Admin,
    Member,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KindArg {
    Human,
    Agent,
}

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create a PAT; prints it on stdout (once) and nothing else.
    Create {
        /// The user the token acts for.
        #[arg(long)]
        user: String,
        /// admin or member.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// human or agent; only humans may approve.
        #[arg(long, value_enum)]
        kind: KindArg,
        /// Lifetime such as 30m, 12h, 7d (no expiry when absent).
        #[arg(long)]
        ttl: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List tokens, oldest first, as a table (with --json: {"tokens": [{token_id, user_id,
    /// role, kind, state, created_at, expires_at, last_used_at, revoked_at}]}). Never shows a
    /// token or its hash.
    List {
        /// Only this user's tokens.
        #[arg(long)]
        user: Option<String>,
        /// Only tokens that still work (not revoked, not expired).
        #[arg(long)]
        active: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Revoke PATs: one by the token itself or by its id, or every token of a user. Prints
    /// the ids revoked (with --json: {"revoked": [token ids]}); they stop working at once,
    /// over REST and NATS.
    #[command(group(clap::ArgGroup::new("which").required(true).multiple(false).args(["token", "id", "user"])))]
    Revoke {
        /// The token to revoke.
        token: Option<String>,
        /// The id of the token to revoke (tok_..., as `atasira tokens list` shows it).
        #[arg(long)]
        id: Option<String>,
        /// Revoke every token of this user.
        #[arg(long)]
        user: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProjectionsCommand {
    /// Drop every projection and rebuild it from the event store, the runtime-registry's
    /// manifest files included; the audit ledger is not rebuilt but checked: every auditable
    /// event has exactly one row, else the exit code is 1. Prints what it did as JSON.
    Rebuild {
        #[command(flatten)]
        target: Target,
        /// The runtime-registry's manifest directory, where the manifest YAML files are
        /// rebuilt (default <data-dir>/manifests; with only --database-url it is required).
        #[arg(long, env = "ATASIRA_MANIFESTS_DIR")]
        manifests_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Create every table and append-only trigger that the services use (idempotent).
    /// Services create them too when they start, unless their database role may not create
    /// objects: then run this first, as the role that owns the schema.
    Prepare {
        #[command(flatten)]
        target: Target,
    },
    /// Create one PostgreSQL role per process (gateway, drafts, approval, provisioner,
    /// runtime-registry, audit), each with a new generated password and only the rights its
    /// code uses: it appends only its own events (the database refuses others), writes only
    /// its own tables, and cannot alter or disable a trigger. Writes each role's URL to
    /// DIR/<process>.database-url (mode 0600); run again to give every role a new password.
    /// Prepares the tables first, as `db prepare` does.
    Roles {
        /// PostgreSQL URL of a role that owns the schema and may create roles.
        #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Directory for the <process>.database-url files (created, readable by you only).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Prefix of the role names (atasira_gateway, atasira_drafts, ...).
        #[arg(long, value_name = "PREFIX", default_value = "atasira_")]
        role_prefix: String,
    },
}

/// `30m`, `12h`, `7d`, `90s`.
fn parse_ttl(s: &str) -> anyhow::Result<chrono::TimeDelta> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num.parse().map_err(|_| anyhow::anyhow!("--ttl {s:?}: expected a number and a unit, like 12h"))?;
    let delta = match unit {
        "s" => chrono::TimeDelta::try_seconds(n),
        "m" => chrono::TimeDelta::try_minutes(n),
        "h" | "" => chrono::TimeDelta::try_hours(n),
        "d" => chrono::TimeDelta::try_days(n),
        other => anyhow::bail!("--ttl unit {other:?}: use s, m, h or d"),
    };
    delta.filter(|d| *d > chrono::TimeDelta::zero()).ok_or_else(|| anyhow::anyhow!("--ttl {s:?} is out of range"))
}

pub async fn tokens(cmd: TokensCommand) -> anyhow::Result<()> {
    match cmd {
        TokensCommand::Create { user, role, kind, ttl, target } => {
            if user.trim().is_empty() {
                anyhow::bail!("--user must not be empty");
            }
            let ttl = ttl.as_deref().map(parse_ttl).transpose()?;
            let db = open_db(target.data_dir.as_deref(), target.database_url()?.as_deref()).await?;
            let role = match role {
                RoleArg::Admin => Role::Admin,
                RoleArg::Member => Role::Member,
            };
            let kind = match kind {
                KindArg::Human => Kind::Human,
                KindArg::Agent => Kind::Agent,
            };
            println!("{}", auth::create_token(&db, &Principal::new(user, role, kind), ttl, auth::OPERATOR).await?.token);
            Ok(())
        }
        TokensCommand::List { user, active, json, target } => {
            let db = open_db(target.data_dir.as_deref(), target.database_url()?.as_deref()).await?;
            auth::prepare(&db).await?;
            let tokens: Vec<auth::TokenInfo> =
                auth::list_tokens(&db, user.as_deref()).await?.into_iter().filter(|t| !active || t.state == auth::TokenState::Active).collect();
            if json {
                let tokens: Vec<serde_json::Value> = tokens.iter().map(token_json).collect();
                println!("{}", json!({ "tokens": tokens }));
            } else if tokens.is_empty() {
                println!("no tokens");
            } else {
                let rows: Vec<Vec<String>> = tokens.iter().map(token_row).collect();
                crate::client::print::print_table(&["TOKEN_ID", "USER", "ROLE", "KIND", "STATE", "CREATED", "EXPIRES", "LAST_USED"], &rows);
            }
            Ok(())
        }
        TokensCommand::Revoke { token, id, user, json, target } => {
            let which = match (&token, &id, &user) {
                (Some(token), _, _) => auth::Which::Token(token),
                (_, Some(id), _) => auth::Which::Id(id),
                (_, _, Some(user)) => auth::Which::User(user),
                _ => anyhow::bail!("name the token, --id or --user"),
            };
            let db = open_db(target.data_dir.as_deref(), target.database_url()?.as_deref()).await?;
            auth::prepare(&db).await?;
            let revoked = auth::revoke(&db, which, auth::OPERATOR).await?;
            if revoked.token_ids.is_empty() && user.is_none() {
                anyhow::bail!("no such token, or it is revoked already");
            }
            if json {
                println!("{}", json!({ "revoked": revoked.token_ids }));
            } else if revoked.token_ids.is_empty() {
                println!("no token of {:?} was active", user.unwrap_or_default());
            } else {
                for id in &revoked.token_ids {
                    println!("revoked {id}");
                }
            }
            Ok(())
        }
    }
}

/// A token as a row of `tokens list`'s table; times in UTC to the minute, `-` for none.
fn token_row(t: &auth::TokenInfo) -> Vec<String> {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or_else(|| "-".to_owned(), |t| t.format("%Y-%m-%d %H:%MZ").to_string());
    vec![
        t.token_id.clone(),
        t.principal.user_id.clone(),
        t.principal.role.to_string(),
        t.principal.kind.to_string(),
        t.state.as_str().to_owned(),
        time(Some(t.created_at)),
        time(t.expires_at),
        time(t.last_used_at),
    ]
}

/// A token as `tokens list --json` shows it (the REST list has the same fields).
fn token_json(t: &auth::TokenInfo) -> serde_json::Value {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    json!({
        "token_id": t.token_id,
        "user_id": t.principal.user_id,
        "role": t.principal.role.to_string(),
        "kind": t.principal.kind.to_string(),
        "state": t.state.as_str(),
        "created_at": time(Some(t.created_at)),
        "expires_at": time(t.expires_at),
        "last_used_at": time(t.last_used_at),
        "revoked_at": time(t.revoked_at),
    })
}

/// `audit verify` on the store: a data dir or a database URL (at least one), with the
/// ledger's MAC key setting. Prints the result as JSON; exit 1 when it does not verify.
pub async fn audit_verify(data_dir: Option<PathBuf>, database_url: Option<String>, audit_key: Option<String>) -> anyhow::Result<std::process::ExitCode> {
    let db = open_db(data_dir.as_deref(), database_url.as_deref()).await?;
    let keys = crate::services::audit_keys_for(audit_key.as_deref(), data_dir.as_deref())?;
    let result = atasira_audit::verify(&db, &keys).await?;
    let json = serde_json::to_value(&result)?;
    println!("{json}");
    Ok(if json["ok"] == true { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(1) })
}

pub async fn db(cmd: DbCommand) -> anyhow::Result<()> {
    match cmd {
        DbCommand::Prepare { target } => {
            let db = open_db(target.data_dir.as_deref(), target.database_url()?.as_deref()).await?;
            crate::db_roles::prepare_all(&db).await?;
            eprintln!("the database has every table and trigger");
            Ok(())
        }
        DbCommand::Roles { database_url, out, role_prefix } => crate::db_roles::run(&crate::db_roles::Options { database_url, role_prefix, out }).await,
    }
}

/// `projections rebuild`: exit 1 when the ledger check finds an auditable event without
/// exactly one row.
pub async fn projections(cmd: ProjectionsCommand) -> anyhow::Result<std::process::ExitCode> {
    match cmd {
        ProjectionsCommand::Rebuild { target, manifests_dir } => {
            // The manifest files are the registry's: rebuilt where it keeps them, never in
            // whatever directory the command happens to run in.
            let Some(manifests_dir) = manifests_dir.or_else(|| target.data_dir.as_ref().map(|d| d.join("manifests"))) else {
                anyhow::bail!(
                    "name the runtime-registry's manifest directory with --manifests-dir (or ATASIRA_MANIFESTS_DIR), or its --data-dir: the manifest files are rebuilt there"
                );
            };
            let db = open_db(target.data_dir.as_deref(), target.database_url()?.as_deref()).await?;
            let registry = atasira_runtime_registry::RegistryConfig {
                manifests_dir,
                max_boxes: 0,
                host_lease: std::time::Duration::from_secs(10),
                ask_ttl: std::time::Duration::from_secs(300),
                trigger_in_flight: 0,
                listener: None,
            };
            let all: Vec<_> = atasira_drafts::projections().into_iter().chain(atasira_runtime_registry::projections(&registry)).collect();
            let all: Vec<&dyn Projection> = all.iter().map(AsRef::as_ref).collect();
            let names: Vec<&str> = all.iter().map(|p| p.name()).collect();
            eprintln!("rebuilding {} ...", names.join(", "));
            let applied = projection::rebuild_all(&db, &all, |name, applied| eprintln!("rebuilt {name}: {applied} events applied")).await?;
            let rebuilt: Vec<_> = names.iter().zip(applied).map(|(name, applied)| json!({"projection": name, "events_applied": applied})).collect();
            let ledger = atasira_audit::check_complete(&db).await?;
            println!("{}", json!({"rebuilt": rebuilt, "audit_ledger": ledger}));
            let count = |key: &str| ledger[key].as_array().map_or(0, Vec::len);
            let (missing, duplicated) = (count("missing"), count("duplicated"));
            if missing + duplicated > 0 {
                eprintln!(
                    "the audit ledger is not complete: {missing} auditable event(s) without a row, {duplicated} with more than one (their ids are in audit_ledger above)"
                );
                return Ok(std::process::ExitCode::from(1));
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// `atasira nats-setup`: as the operator, creates the events stream (or raises its
/// replicas) and the sentinel's consumer; says what it did on stderr.
pub async fn nats_set_up(nats_url: &str, auth: &crate::services::NatsAuth, replicas: usize) -> anyhow::Result<()> {
    use atasira_platform::relay::{self, StreamSetUp};
    let client = crate::services::connect_nats(nats_url, atasira_contracts::subjects::OPERATOR, auth, true).await?;
    let js = async_nats::jetstream::new(client.clone());
    let (stream, did) = relay::set_up_events_stream(&js, replicas).await?;
    let what = match did {
        StreamSetUp::Created => format!("created the events stream {} ({replicas} replica(s))", atasira_contracts::subjects::EVENTS_STREAM),
        StreamSetUp::ReplicasRaised { from } => format!("raised the events stream's replicas from {from} to {replicas}"),
        StreamSetUp::AlreadyThere => format!("the events stream {} is already there", atasira_contracts::subjects::EVENTS_STREAM),
    };
    eprintln!("atasira nats-setup: {what}");
    let consumer = if atasira_platform::sentinel::set_up_consumer(&stream).await? { "created" } else { "is already there" };
    eprintln!("atasira nats-setup: the audit sentinel's consumer {consumer}");
    client.flush().await.map_err(|e| anyhow::anyhow!("NATS: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::TokensCommand;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: TokensCommand,
    }

    #[test]
    fn a_cluster_process_environment_with_both_a_data_dir_and_a_database_url_names_the_database() {
        // Inside a compose container both are set; the store is the database.
        let args = ["t", "create", "--user", "admin", "--role", "admin", "--kind", "human", "--data-dir", "/var/lib/atasira", "--database-url", "postgres://x"];
        let Cli { command: TokensCommand::Create { target, .. } } = Cli::try_parse_from(args).expect("both are accepted") else {
            panic!("not create");
        };
        assert_eq!(target.database_url.as_deref(), Some("postgres://x"));
        assert!(Cli::try_parse_from(["t", "create", "--user", "a", "--role", "admin", "--kind", "human"]).is_err(), "one of them is required");
    }
}
