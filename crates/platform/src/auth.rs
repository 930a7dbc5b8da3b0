//! Personal access tokens (R-AUTH-1, R-AUTH-4): only SHA-256 hashes are stored; the token
//! itself is shown once, when created.

pub use atasira_domain::aggregates::pat::OPERATOR;
use atasira_domain::aggregates::pat::{PatCommand, PersonalAccessToken, TOKEN_ID_PREFIX};
use atasira_domain::{Kind, Principal, Role};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::store::Db;

/// The gateway's token table: the credentials (hashes) and their state. Every issue and
/// revocation is also an event of the `pat` aggregate (the audit ledger records it); the
/// event comes first, so no token lives or dies unrecorded.
pub const TOKENS_SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS gateway_tokens (
    token_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked BIGINT NOT NULL DEFAULT 0,
    token_id TEXT,
    last_used_at_ms BIGINT,
    revoked_at_ms BIGINT
)"];

/// Columns added after the first release, for tables created before them.
const ADDED_COLUMNS: &[(&str, &str)] = &[("token_id", "TEXT"), ("last_used_at_ms", "BIGINT"), ("revoked_at_ms", "BIGINT")];

/// "Last used" is written at most once per this interval per token, not on every request.
pub const LAST_USED_RESOLUTION: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

/// Creates the token table, brings an older one up to date (public ids for tokens that
/// have none) and its index; idempotent.
pub async fn prepare(db: &Db) -> anyhow::Result<()> {
    db.ensure_tables(TOKENS_SCHEMA).await?;
    for (column, ty) in ADDED_COLUMNS {
        db.ensure_column("gateway_tokens", column, ty).await?;
    }
    let unnamed: Vec<String> =
        sqlx::query("SELECT token_hash FROM gateway_tokens WHERE token_id IS NULL").fetch_all(db.any()).await?.iter().map(|r| r.get(0)).collect();
    for hash in unnamed {
        sqlx::query("UPDATE gateway_tokens SET token_id = $1 WHERE token_hash = $2 AND token_id IS NULL")
            .bind(new_token_id())
            .bind(hash)
            .execute(db.any())
            .await?;
    }
    db.ensure_tables(&[
        "CREATE UNIQUE INDEX IF NOT EXISTS gateway_tokens_id ON gateway_tokens (token_id)",
        "CREATE INDEX IF NOT EXISTS gateway_tokens_user ON gateway_tokens (user_id)",
    ])
    .await
}

/// A new public token id: `tok_` and 24 random hex digits (not derived from the token).
pub fn new_token_id() -> String {
    let mut bytes = [0u8; 12];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_ID_PREFIX}{}", hex::encode(bytes))
}

/// Prefix that makes atasira tokens recognisable (secret scanners, logs).
pub const TOKEN_PREFIX: &str = "atasira_pat_";

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// 32 random bytes from the OS, hex-encoded, behind [`TOKEN_PREFIX`].
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// 32 random bytes for keys.
pub fn random_secret() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// The events a token operation appended: their ids and the position of the last one
/// (read-your-writes: the gateway waits for the audit ledger to follow).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    pub event_ids: Vec<String>,
    pub position: i64,
}

impl Recorded {
    fn add(&mut self, other: Recorded) {
        self.event_ids.extend(other.event_ids);
        self.position = self.position.max(other.position);
    }
}

/// A new token: shown once.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    pub token_id: String,
    pub recorded: Recorded,
}

async fn execute(db: &Db, token_id: &str, command: PatCommand) -> anyhow::Result<Recorded> {
    let receipt = db
        .cqrs::<PersonalAccessToken>()
        .execute(token_id, command, Default::default(), crate::store::Retry::ONCE)
        .await
        .map_err(|e| anyhow::anyhow!("token {token_id}: {}", e.message))?;
    Ok(Recorded { position: receipt.events.last().map_or(0, |e| e.position), event_ids: receipt.events.into_iter().map(|e| e.id).collect() })
}

/// Creates a token for `principal`, valid for `ttl` (forever when `None`), issued `by` an
/// admin or [`OPERATOR`]: records `TokenIssued`, then stores the hash.
pub async fn create_token(db: &Db, principal: &Principal, ttl: Option<chrono::TimeDelta>, by: &str) -> anyhow::Result<Issued> {
    prepare(db).await?;
    let token = generate_token();
    let token_id = new_token_id();
    let now = chrono::Utc::now();
    let expires_at = ttl.map(|t| now + t);
    let command = PatCommand::Issue {
        token_id: token_id.clone(),
        user_id: principal.user_id.clone(),
        role: principal.role,
        kind: principal.kind,
        expires_at,
        by: by.to_owned(),
        at: now,
    };
    let recorded = execute(db, &token_id, command).await?;
    sqlx::query("INSERT INTO gateway_tokens (token_hash, user_id, role, kind, created_at_ms, expires_at_ms, token_id) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(hash_token(&token))
        .bind(&principal.user_id)
        .bind(principal.role.to_string())
        .bind(principal.kind.to_string())
        .bind(now.timestamp_millis())
        .bind(expires_at.map(|t| t.timestamp_millis()))
        .bind(&token_id)
        .execute(db.any())
        .await?;
    Ok(Issued { token, token_id, recorded })
}

/// Which tokens to revoke.
#[derive(Debug, Clone, Copy)]
pub enum Which<'a> {
    /// The token itself (its holder, or an operator who has it).
    Token(&'a str),
    /// By public id.
    Id(&'a str),
    /// Every live token of a user.
    User(&'a str),
}

/// What a revocation did: the public ids of the tokens it revoked and the events.
#[derive(Debug, Clone, Default)]
pub struct Revoked {
    pub token_ids: Vec<String>,
    pub recorded: Recorded,
}

/// Revokes tokens (the table must exist, [`prepare`]), `by` an admin or [`OPERATOR`]: for each live (unrevoked) token,
/// `TokenRevoked` first, then the table, so it stops working at once for REST and NATS
/// (both look the token up on every request). Revoking a revoked token does nothing.
pub async fn revoke(db: &Db, which: Which<'_>, by: &str) -> anyhow::Result<Revoked> {
    let (filter, value) = match which {
        Which::Token(token) => ("token_hash = $1", hash_token(token)),
        Which::Id(id) => ("token_id = $1", id.to_owned()),
        Which::User(user) => ("user_id = $1", user.to_owned()),
    };
    let rows = sqlx::query(&format!("SELECT token_id, user_id FROM gateway_tokens WHERE {filter} AND revoked = 0 ORDER BY created_at_ms, token_id"))
        .bind(value)
        .fetch_all(db.any())
        .await?;
    let mut revoked = Revoked::default();
    for row in rows {
        let (token_id, user_id): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let at = chrono::Utc::now();
        let command = PatCommand::Revoke { token_id: token_id.clone(), user_id, by: by.to_owned(), at };
        revoked.recorded.add(execute(db, &token_id, command).await?);
        sqlx::query("UPDATE gateway_tokens SET revoked = 1, revoked_at_ms = $1 WHERE token_id = $2 AND revoked = 0")
            .bind(at.timestamp_millis())
            .bind(&token_id)
            .execute(db.any())
            .await?;
        revoked.token_ids.push(token_id);
    }
    Ok(revoked)
}

/// Whether a token with this public id exists (live or not).
pub async fn token_exists(db: &Db, token_id: &str) -> anyhow::Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM gateway_tokens WHERE token_id = $1").bind(token_id).fetch_optional(db.any()).await?.is_some())
}

/// Revokes a token; returns whether it existed (and was live).
pub async fn revoke_token(db: &Db, token: &str) -> anyhow::Result<bool> {
    prepare(db).await?;
    Ok(!revoke(db, Which::Token(token), OPERATOR).await?.token_ids.is_empty())
}

/// Whether a token is usable now, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    Active,
    Expired,
    Revoked,
}

impl TokenState {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenState::Active => "active",
            TokenState::Expired => "expired",
            TokenState::Revoked => "revoked",
        }
    }
}

/// What an operator sees of a token: never the token or its hash.
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub token_id: String,
    pub principal: Principal,
    pub state: TokenState,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// To the minute ([`LAST_USED_RESOLUTION`]); `None` when never used.
    pub last_used_at: Option<chrono::DateTime<chrono::Utc>>,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every token (of `user`, when named), oldest first. The table must exist ([`prepare`]).
pub async fn list_tokens(db: &Db, user: Option<&str>) -> anyhow::Result<Vec<TokenInfo>> {
    let sql = format!(
        "SELECT token_id, user_id, role, kind, created_at_ms, expires_at_ms, revoked, last_used_at_ms, revoked_at_ms FROM gateway_tokens {} ORDER BY created_at_ms, token_id",
        if user.is_some() { "WHERE user_id = $1" } else { "" }
    );
    let mut query = sqlx::query(&sql);
    if let Some(user) = user {
        query = query.bind(user);
    }
    let now = chrono::Utc::now().timestamp_millis();
    let time = |ms: Option<i64>| ms.and_then(chrono::DateTime::from_timestamp_millis);
    let mut out = Vec::new();
    for row in query.fetch_all(db.any()).await? {
        let expires: Option<i64> = row.try_get(5)?;
        let state = if row.try_get::<i64, _>(6)? != 0 {
            TokenState::Revoked
        } else if expires.is_some_and(|e| e <= now) {
            TokenState::Expired
        } else {
            TokenState::Active
        };
        out.push(TokenInfo {
            token_id: row.try_get(0)?,
            principal: principal_of(row.try_get(1)?, &row.try_get::<String, _>(2)?, &row.try_get::<String, _>(3)?),
            state,
            created_at: time(Some(row.try_get(4)?)).unwrap_or_default(),
            expires_at: time(expires),
            last_used_at: time(row.try_get(7)?),
            revoked_at: time(row.try_get(8)?),
        });
    }
    Ok(out)
}

fn principal_of(user_id: String, role: &str, kind: &str) -> Principal {
    let role = if role == "admin" { Role::Admin } else { Role::Member };
    let kind = if kind == "human" { Kind::Human } else { Kind::Agent };
    Principal::new(user_id, role, kind)
}

/// The principal of a valid (known, unrevoked, unexpired) token.
/// The gateway's lookup: it notes the use (the token table is the gateway's to write).
pub async fn lookup_token(db: &Db, token: &str) -> anyhow::Result<Option<Principal>> {
    Ok(find_token(db, &hash_token(token), true).await?.map(|t| t.principal))
}

/// The principal of a valid token known by its hash (a NATS publisher's subject names it):
/// a service's lookup, which only reads the token table (R-ARCH-13); the gateway notes
/// a NATS publisher's use when its auth callout admits the connection.
pub async fn lookup_token_hash(db: &Db, token_hash: &str) -> anyhow::Result<Option<Principal>> {
    Ok(find_token(db, token_hash, false).await?.map(|t| t.principal))
}

/// A valid token's owner and end of life.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    pub principal: Principal,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A valid (known, unrevoked, unexpired) token, by its hash. With `note_use` (the gateway),
/// notes the use, at most once a minute per token ([`LAST_USED_RESOLUTION`]), so a busy
/// token costs no write per request.
pub async fn find_token(db: &Db, token_hash: &str, note_use: bool) -> anyhow::Result<Option<TokenRecord>> {
    let row = sqlx::query("SELECT user_id, role, kind, expires_at_ms, revoked, last_used_at_ms FROM gateway_tokens WHERE token_hash = $1")
        .bind(token_hash)
        .fetch_optional(db.any())
        .await?;
    let Some(row) = row else { return Ok(None) };
    let revoked: i64 = row.try_get(4)?;
    let expires: Option<i64> = row.try_get(3)?;
    let now = chrono::Utc::now().timestamp_millis();
    if revoked != 0 || expires.is_some_and(|e| e <= now) {
        return Ok(None);
    }
    let last_used: Option<i64> = row.try_get(5)?;
    if note_use && last_used.is_none_or(|t| now - t >= LAST_USED_RESOLUTION.num_milliseconds()) {
        // Best effort: a failed note must not refuse a valid token. The condition keeps
        // concurrent requests from writing it more than once.
        let noted = sqlx::query("UPDATE gateway_tokens SET last_used_at_ms = $1 WHERE token_hash = $2 AND (last_used_at_ms IS NULL OR last_used_at_ms <= $3)")
            .bind(now)
            .bind(token_hash)
            .bind(now - LAST_USED_RESOLUTION.num_milliseconds())
            .execute(db.any())
            .await;
        if let Err(e) = noted {
            tracing::warn!(error = %e, "could not note a token's last use");
        }
    }
    let principal = principal_of(row.try_get(0)?, &row.try_get::<String, _>(1)?, &row.try_get::<String, _>(2)?);
    Ok(Some(TokenRecord { principal, expires_at: expires.and_then(chrono::DateTime::from_timestamp_millis) }))
}

/// Whether any token exists yet (first start of `atasira dev`).
pub async fn has_tokens(db: &Db) -> anyhow::Result<bool> {
    prepare(db).await?;
    Ok(sqlx::query("SELECT 1 FROM gateway_tokens LIMIT 1").fetch_optional(db.any()).await?.is_some())
}
