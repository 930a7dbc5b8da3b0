//! The NATS auth callout: a person or agent connects to NATS with their PAT as the
//! connection token, nats-server asks this service (on `$SYS.REQ.USER.AUTH`) whether to let
//! them in, and the answer is a user JWT, signed with the callout issuer's account key,
//! that grants only what that principal may do over NATS: requests on subjects that carry
//! their own token's hash, and their own reply inbox (see `subjects::client_permissions`).
//!
//! The token is checked like the REST API checks it (unknown, expired and revoked tokens
//! are refused), and the connection ends when the token expires, or after
//! [`MAX_CONNECTION_LIFETIME`] at the latest, so a revoked token's connection does not
//! outlive the next reconnect. Each request is checked against the store again by the
//! service that answers it, so a revocation takes effect at once.

use std::time::Duration;

use anyhow::Context as _;
use atasira_contracts::subjects;
use atasira_platform::auth::{self, TokenRecord};
use atasira_platform::db::Db;
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use nats_jwt_rs::authorization::AuthResponse;
use nats_jwt_rs::types::{Permission, Permissions, ResponsePermission};
use nats_jwt_rs::user::User;
use nats_jwt_rs::{Claim, Claims};
use nkeys::KeyPair;
use serde::Deserialize;

/// A publisher's connection is re-authorized at least this often.
pub const MAX_CONNECTION_LIFETIME: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// The parts of nats-server's authorization request the callout reads (lenient: the
/// server sends more, and fields vary across server versions).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct AuthRequest {
    server_id: ServerId,
    user_nkey: String,
    #[serde(default)]
    connect_opts: ConnectOpts,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
struct ServerId {
    id: String,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
struct ConnectOpts {
    #[serde(default)]
    auth_token: Option<String>,
}

impl Claim for AuthRequest {
    fn validate() {}
}

/// The callout's verdict for one connection: the user claims to grant, or why not.
#[derive(Debug)]
pub enum Verdict {
    Allow(Box<Claims<User>>),
    Deny(String),
}

/// Pure: what a connection presenting `token` (looked up as `record`) may do at `now`.
pub fn decide(user_nkey: &str, token: Option<&str>, record: Option<&TokenRecord>, now: DateTime<Utc>) -> Verdict {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Verdict::Deny("connect with your atasira token as the NATS token".to_owned());
    };
    let Some(record) = record else {
        return Verdict::Deny("the token is unknown, expired or revoked".to_owned());
    };
    let Some(granted) = subjects::client_permissions(&auth::hash_token(token), record.principal.is_admin()) else {
        return Verdict::Deny("the token cannot be turned into NATS subjects".to_owned());
    };
    let mut claims = User::new_claims(record.principal.user_id.clone(), user_nkey.to_owned());
    // Config mode: the audience names the account the user is placed in.
    claims.aud = Some(subjects::ACCOUNT.to_owned());
    let lifetime_end = now + MAX_CONNECTION_LIFETIME;
    let end = record.expires_at.map_or(lifetime_end, |e| e.min(lifetime_end));
    claims.exp = Some(end.timestamp());
    let permissions = &mut claims.nats.permissions.permissions;
    *permissions = Permissions {
        publish: Permission { allow: granted.publish, deny: vec![] },
        subscribe: Permission { allow: granted.subscribe, deny: vec![] },
        resp: granted.allow_responses.then_some(ResponsePermission { max_messages: 1, ttl: Duration::ZERO }),
    };
    Verdict::Allow(Box::new(claims))
}

/// Signs the answer to the request from server `server_id` about `user_nkey`.
fn respond(issuer: &KeyPair, server_id: &str, user_nkey: &str, verdict: Verdict) -> anyhow::Result<String> {
    let mut response = AuthResponse::generic_claim(user_nkey.to_owned());
    response.aud = Some(server_id.to_owned());
    match verdict {
        Verdict::Allow(user) => response.nats.jwt = user.encode(issuer)?,
        Verdict::Deny(reason) => response.nats.error = reason,
    }
    response.encode(issuer)
}

/// Answers one authorization request (a JWT signed by the server); `None` when the request
/// itself is not one (then nothing is answered and the server times the connection out).
async fn answer(db: &Db, issuer: &KeyPair, request: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(request).ok()?;
    let claims = match Claims::<AuthRequest>::decode(text) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "auth callout: not an authorization request");
            return None;
        }
    };
    let request = claims.nats;
    let token = request.connect_opts.auth_token.as_deref();
    let record = match token {
        Some(t) if !t.is_empty() => match auth::find_token(db, &auth::hash_token(t), true).await {
            Ok(record) => record,
            Err(e) => {
                tracing::error!(error = %e, "auth callout: token lookup failed");
                return respond(issuer, &request.server_id.id, &request.user_nkey, Verdict::Deny("atasira cannot check tokens right now".to_owned())).ok();
            }
        },
        _ => None,
    };
    let verdict = decide(&request.user_nkey, token, record.as_ref(), Utc::now());
    match &verdict {
        Verdict::Allow(user) => tracing::info!(user = user.name.as_deref().unwrap_or(""), "auth callout: NATS publisher admitted"),
        Verdict::Deny(reason) => tracing::warn!(reason = %reason, "auth callout: NATS connection refused"),
    }
    match respond(issuer, &request.server_id.id, &request.user_nkey, verdict) {
        Ok(jwt) => Some(jwt),
        Err(e) => {
            tracing::error!(error = %e, "auth callout: cannot sign the answer");
            None
        }
    }
}

/// Parses the callout issuer's account seed (`SA...`).
pub fn issuer_from_seed(seed: &str) -> anyhow::Result<KeyPair> {
    let pair = KeyPair::from_seed(seed.trim()).map_err(|e| anyhow::anyhow!("the auth callout issuer key is not an nkey seed: {e}"))?;
    anyhow::ensure!(pair.public_key().starts_with('A'), "the auth callout issuer key must be an account nkey seed (it starts with SA)");
    Ok(pair)
}

/// Serves the auth callout until `shutdown` resolves. Several gateways share the work (one
/// queue group).
pub async fn run(client: async_nats::Client, db: Db, issuer: KeyPair, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let mut requests =
        client.queue_subscribe(subjects::AUTH_CALLOUT, "atasira-auth-callout".to_owned()).await.context("cannot subscribe to the auth callout subject")?;
    let issuer = std::sync::Arc::new(issuer);
    tracing::info!(issuer = %issuer.public_key(), "auth callout: answering NATS connections");
    tokio::pin!(shutdown);
    loop {
        let msg = tokio::select! {
            msg = requests.next() => match msg { Some(m) => m, None => return Ok(()) },
            () = &mut shutdown => return Ok(()),
        };
        let (client, db, issuer) = (client.clone(), db.clone(), issuer.clone());
        tokio::spawn(async move {
            let Some(reply) = msg.reply else { return };
            if let Some(jwt) = answer(&db, &issuer, &msg.payload).await
                && let Err(e) = client.publish(reply, jwt.into()).await
            {
                tracing::warn!(error = %e, "auth callout: cannot answer");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::{Kind, Principal, Role};

    fn record(role: Role, expires_at: Option<DateTime<Utc>>) -> TokenRecord {
        TokenRecord { principal: Principal::new("ana", role, Kind::Agent), expires_at }
    }

    fn allowed(v: Verdict) -> Claims<User> {
        match v {
            Verdict::Allow(c) => *c,
            Verdict::Deny(r) => panic!("refused: {r}"),
        }
    }

    #[test]
    fn given_no_token_or_an_unknown_one_when_deciding_then_the_connection_is_refused() {
        let now = Utc::now();
        assert!(matches!(decide("UABC", None, None, now), Verdict::Deny(_)));
        assert!(matches!(decide("UABC", Some(""), None, now), Verdict::Deny(_)));
        assert!(matches!(decide("UABC", Some("atasira_pat_x"), None, now), Verdict::Deny(_)));
    }

    #[test]
    fn given_a_valid_token_when_deciding_then_only_its_own_subjects_and_inbox_are_granted() {
        let now = Utc::now();
        let user = allowed(decide("UABC", Some("atasira_pat_x"), Some(&record(Role::Member, None)), now));
        let hash = auth::hash_token("atasira_pat_x");
        assert_eq!(user.sub, "UABC");
        assert_eq!(user.aud.as_deref(), Some(subjects::ACCOUNT));
        assert_eq!(user.name.as_deref(), Some("ana"));
        let p = &user.nats.permissions.permissions;
        assert!(p.publish.allow.iter().all(|s| s.starts_with(&format!("atasira.box.client.{hash}."))), "{:?}", p.publish.allow);
        assert!(p.subscribe.allow.iter().all(|s| s.starts_with(&format!("_INBOX.client.{hash}"))), "{:?}", p.subscribe.allow);
        assert!(p.resp.is_none());
        // Re-authorized within the hour.
        assert_eq!(user.exp, Some((now + MAX_CONNECTION_LIFETIME).timestamp()));
    }

    #[test]
    fn given_a_token_expiring_soon_when_deciding_then_the_connection_ends_with_it() {
        let now = Utc::now();
        let soon = now + chrono::TimeDelta::minutes(5);
        let user = allowed(decide("UABC", Some("t"), Some(&record(Role::Admin, Some(soon))), now));
        assert_eq!(user.exp, Some(soon.timestamp()));
    }

    #[test]
    fn the_answer_is_signed_by_the_issuer_for_the_asking_server() {
        let issuer = KeyPair::new_account();
        let jwt = respond(&issuer, "NSERVER", "UABC", Verdict::Deny("no".into())).expect("signed");
        let back = Claims::<AuthResponse>::decode(&jwt).expect("verifies");
        assert_eq!(back.iss, issuer.public_key());
        assert_eq!(back.aud.as_deref(), Some("NSERVER"));
        assert_eq!(back.sub, "UABC");
        assert_eq!(back.nats.error, "no");
        assert!(issuer_from_seed(&KeyPair::new_user().seed().expect("seed")).is_err());
        assert!(issuer_from_seed(&issuer.seed().expect("seed")).is_ok());
    }
}
