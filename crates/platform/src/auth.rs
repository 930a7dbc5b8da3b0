//! Personal access tokens (R-AUTH-1, R-AUTH-4): only SHA-256 hashes are stored; the token
//! itself is shown once, when created.

use atasira_domain::{Kind, Principal, Role};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::db::Db;

/// The gateway's token table.
pub const TOKENS_SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS gateway_tokens (
    token_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked BIGINT NOT NULL DEFAULT 0
)"];

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

/// Creates a token for `principal`, valid for `ttl` (forever when `None`); returns it.
pub async fn create_token(db: &Db, principal: &Principal, ttl: Option<chrono::TimeDelta>) -> anyhow::Result<String> {
    db.ensure_tables(TOKENS_SCHEMA).await?;
    let token = generate_token();
    let now = chrono::Utc::now();
    sqlx::query("INSERT INTO gateway_tokens (token_hash, user_id, role, kind, created_at_ms, expires_at_ms) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(hash_token(&token))
        .bind(&principal.user_id)
        .bind(principal.role.to_string())
        .bind(principal.kind.to_string())
        .bind(now.timestamp_millis())
        .bind(ttl.map(|t| (now + t).timestamp_millis()))
        .execute(db.any())
        .await?;
    Ok(token)
}

/// Revokes a token; returns whether it existed.
pub async fn revoke_token(db: &Db, token: &str) -> anyhow::Result<bool> {
    db.ensure_tables(TOKENS_SCHEMA).await?;
    let n = sqlx::query("UPDATE gateway_tokens SET revoked = 1 WHERE token_hash = $1 AND revoked = 0")
        .bind(hash_token(token))
        .execute(db.any())
        .await?
        .rows_affected();
    Ok(n > 0)
}

/// The principal of a valid (known, unrevoked, unexpired) token.
pub async fn lookup_token(db: &Db, token: &str) -> anyhow::Result<Option<Principal>> {
    lookup_token_hash(db, &hash_token(token)).await
}

/// The principal of a valid token known by its hash (a NATS publisher's subject names it).
pub async fn lookup_token_hash(db: &Db, token_hash: &str) -> anyhow::Result<Option<Principal>> {
    Ok(find_token(db, token_hash).await?.map(|t| t.principal))
}

/// A valid token's owner and end of life.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    pub principal: Principal,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A valid (known, unrevoked, unexpired) token, by its hash.
pub async fn find_token(db: &Db, token_hash: &str) -> anyhow::Result<Option<TokenRecord>> {
    let row = sqlx::query("SELECT user_id, role, kind, expires_at_ms, revoked FROM gateway_tokens WHERE token_hash = $1")
        .bind(token_hash)
        .fetch_optional(db.any())
        .await?;
    let Some(row) = row else { return Ok(None) };
    let revoked: i64 = row.try_get(4)?;
    let expires: Option<i64> = row.try_get(3)?;
    if revoked != 0 || expires.is_some_and(|e| e <= chrono::Utc::now().timestamp_millis()) {
        return Ok(None);
    }
    let role = match row.try_get::<String, _>(1)?.as_str() {
        "admin" => Role::Admin,
        _ => Role::Member,
    };
    let kind = match row.try_get::<String, _>(2)?.as_str() {
        "human" => Kind::Human,
        _ => Kind::Agent,
    };
    let principal = Principal::new(row.try_get::<String, _>(0)?, role, kind);
    Ok(Some(TokenRecord { principal, expires_at: expires.and_then(chrono::DateTime::from_timestamp_millis) }))
}

/// Whether any token exists yet (first start of `atasira dev`).
pub async fn has_tokens(db: &Db) -> anyhow::Result<bool> {
    db.ensure_tables(TOKENS_SCHEMA).await?;
    Ok(sqlx::query("SELECT 1 FROM gateway_tokens LIMIT 1").fetch_optional(db.any()).await?.is_some())
}
