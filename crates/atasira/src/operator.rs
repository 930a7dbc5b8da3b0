//! Operator verbs on a data dir (embedded) or a database URL (cluster): tokens and
//! projection rebuilds. They work while `atasira dev` runs on the same data dir.

use std::path::PathBuf;

use atasira_domain::{Kind, Principal, Role};
use atasira_platform::{auth, projection};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use crate::services::open_db;

/// Where the database is.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Target {
    /// Data directory of `atasira dev` (embedded).
    #[arg(long, env = "ATASIRA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// PostgreSQL URL (cluster).
    #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
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
    /// Revoke a PAT.
    Revoke {
        /// The token to revoke.
        token: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProjectionsCommand {
    /// Drop every projection and rebuild it from the event store; the audit ledger is not
    /// rebuilt but checked: every auditable event has exactly one row.
    Rebuild {
        #[command(flatten)]
        target: Target,
        /// Where the manifest YAML files are (default <data-dir>/manifests).
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
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain and every signed checkpoint. Prints {"ok": true, "rows": N} and
    /// exits 0, or {"ok": false, "first_bad_seq": S, "reason": ...} and exits 1.
    Verify {
        #[command(flatten)]
        target: Target,
        /// MAC key setting of the audit ledger, as the audit service has it
        /// (ID:HEX[,ID:HEX...]; keep the retired keys, or the rows they MACed do not
        /// verify). With --data-dir it defaults to that data dir's key.
        #[arg(long, env = "ATASIRA_AUDIT_KEY", hide_env_values = true)]
        audit_key: Option<String>,
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
            let db = open_db(target.data_dir.as_deref(), target.database_url.as_deref()).await?;
            let role = match role {
                RoleArg::Admin => Role::Admin,
                RoleArg::Member => Role::Member,
            };
            let kind = match kind {
                KindArg::Human => Kind::Human,
                KindArg::Agent => Kind::Agent,
            };
            println!("{}", auth::create_token(&db, &Principal::new(user, role, kind), ttl).await?);
            Ok(())
        }
        TokensCommand::Revoke { token, target } => {
            let db = open_db(target.data_dir.as_deref(), target.database_url.as_deref()).await?;
            if !auth::revoke_token(&db, &token).await? {
                anyhow::bail!("no such token, or it is revoked already");
            }
            eprintln!("revoked");
            Ok(())
        }
    }
}

pub async fn audit(cmd: AuditCommand) -> anyhow::Result<std::process::ExitCode> {
    match cmd {
        AuditCommand::Verify { target, audit_key } => {
            let db = open_db(target.data_dir.as_deref(), target.database_url.as_deref()).await?;
            let keys = crate::services::audit_keys_for(audit_key.as_deref(), target.data_dir.as_deref())?;
            let result = atasira_audit::verify(&db, &keys).await?;
            let json = serde_json::to_value(&result)?;
            println!("{json}");
            Ok(if json["ok"] == true { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(1) })
        }
    }
}

pub async fn db(cmd: DbCommand) -> anyhow::Result<()> {
    match cmd {
        DbCommand::Prepare { target } => {
            // Connecting creates the event store's tables and triggers.
            let db = open_db(target.data_dir.as_deref(), target.database_url.as_deref()).await?;
            atasira_gateway::prepare(&db).await?;
            atasira_audit::prepare(&db).await?;
            let registry = atasira_runtime_registry::RegistryConfig { manifests_dir: PathBuf::new(), max_boxes: 0 };
            for p in atasira_drafts::projections().into_iter().chain(atasira_runtime_registry::projections(&registry)) {
                projection::prepare(&db, p.as_ref()).await?;
            }
            eprintln!("the database has every table and trigger");
            Ok(())
        }
    }
}

pub async fn projections(cmd: ProjectionsCommand) -> anyhow::Result<()> {
    match cmd {
        ProjectionsCommand::Rebuild { target, manifests_dir } => {
            let db = open_db(target.data_dir.as_deref(), target.database_url.as_deref()).await?;
            let manifests_dir =
                manifests_dir.or_else(|| target.data_dir.as_ref().map(|d| d.join("manifests"))).unwrap_or_else(|| PathBuf::from("./atasira-data/manifests"));
            let registry = atasira_runtime_registry::RegistryConfig { manifests_dir, max_boxes: 0 };
            let mut rebuilt = Vec::new();
            for p in atasira_drafts::projections().into_iter().chain(atasira_runtime_registry::projections(&registry)) {
                eprintln!("rebuilding {} ...", p.name());
                let applied = projection::rebuild(&db, p.as_ref()).await?;
                rebuilt.push(json!({"projection": p.name(), "events_applied": applied}));
            }
            let ledger = atasira_audit::check_complete(&db).await?;
            println!("{}", json!({"rebuilt": rebuilt, "audit_ledger": ledger}));
            Ok(())
        }
    }
}
