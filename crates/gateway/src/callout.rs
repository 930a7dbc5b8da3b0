//! The NATS auth callout: a person or agent connects to NATS with their PAT as the
//! connection token, nats-server asks this service (on `$SYS.REQ.USER.AUTH`) whether to let
//! them in, and the answer is a user JWT, signed with the callout issuer's account key,
//! that grants only what that principal may do over NATS: requests on subjects that carry
//! their own token's hash, their own reply inbox, and the topics of the `event` Boxes they
//! may start, as the runtime registry lists them at connect (see
//! `subjects::client_permissions`).
//!
//! The token is checked like the REST API checks it (unknown, expired and revoked tokens
//! are refused), and the connection ends when the token expires, or after
//! [`MAX_CONNECTION_LIFETIME`] at the latest, so a revoked token's connection does not
//! outlive the next reconnect. Each request is checked against the store again by the
//! service that answers it, so a revocation takes effect at once.
//!
//! The requests carry the publisher's token, so nats-server encrypts them to the
//! callout's xkey (curve key) and this service encrypts its answers back to the server's.

use std::time::Duration;

use anyhow::Context as _;
use atasira_contracts::subjects;
use atasira_platform::auth::{self, TokenRecord};
use atasira_platform::client::Client;
use atasira_platform::store::Db;
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

/// Pure: what a connection presenting `token` (looked up as `record`) may do at `now`,
/// `topics` being the `event` Boxes' topics its principal may publish on.
pub fn decide(user_nkey: &str, token: Option<&str>, record: Option<&TokenRecord>, topics: &[String], now: DateTime<Utc>) -> Verdict {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Verdict::Deny("connect with your atasira token as the NATS token".to_owned());
    };
    let Some(record) = record else {
        return Verdict::Deny("the token is unknown, expired or revoked".to_owned());
    };
    let Some(granted) = subjects::client_permissions(&auth::hash_token(token), record.principal.is_admin(), topics) else {
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
async fn answer(db: &Db, registry: &Client, issuer: &KeyPair, request: &[u8]) -> Option<String> {
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
    let topics = match &record {
        Some(r) => trigger_topics(registry, &r.principal).await,
        None => Vec::new(),
    };
    let verdict = decide(&request.user_nkey, token, record.as_ref(), &topics, Utc::now());
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

/// The header in which nats-server names its own xkey (public) when it encrypts.
pub const SERVER_XKEY_HEADER: &str = "Nats-Server-Xkey";

/// The callout's keys: the issuer that signs answers, and the xkey requests are encrypted to.
pub struct Keys {
    issuer: KeyPair,
    xkey: Option<nkeys::XKey>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("issuer", &self.issuer.public_key()).field("xkey", &self.xkey.as_ref().map(nkeys::XKey::public_key)).finish()
    }
}

impl Keys {
    /// From the seeds in the gateway's credentials file (`xkey`: `SX...`, if the
    /// configuration encrypts requests).
    pub fn from_seeds(issuer: &str, xkey: Option<&str>) -> anyhow::Result<Keys> {
        let xkey = xkey
            .map(|seed| nkeys::XKey::from_seed(seed.trim()).map_err(|e| anyhow::anyhow!("the auth callout encryption key is not a curve nkey seed: {e}")))
            .transpose()?;
        Ok(Keys { issuer: issuer_from_seed(issuer)?, xkey })
    }

    /// The request in clear, and the server key to encrypt the answer to; `None` when it
    /// cannot be read (encrypted to another key, or in clear although this callout has an
    /// xkey: then the server's configuration and this process's disagree).
    fn open(&self, payload: &[u8], server_xkey: Option<&str>) -> Option<(Vec<u8>, Option<nkeys::XKey>)> {
        match (&self.xkey, server_xkey) {
            (Some(own), Some(server)) => {
                let server = nkeys::XKey::from_public_key(server).ok()?;
                let clear = own.open(payload, &server).ok()?;
                Some((clear, Some(server)))
            }
            (None, None) => Some((payload.to_vec(), None)),
            (Some(_), None) => {
                tracing::warn!("auth callout: a request in clear, but this gateway expects them encrypted (regenerate the NATS configuration)");
                None
            }
            (None, Some(_)) => {
                tracing::warn!("auth callout: an encrypted request, but this gateway's credentials hold no encryption key");
                None
            }
        }
    }

    /// `answer` as sent back: encrypted to `server` when the request was.
    fn seal(&self, answer: String, server: Option<&nkeys::XKey>) -> Option<Vec<u8>> {
        match (&self.xkey, server) {
            (Some(own), Some(server)) => {
                own.seal(answer.as_bytes(), server).map_err(|e| tracing::error!(error = %e, "auth callout: cannot encrypt the answer")).ok()
            }
            _ => Some(answer.into_bytes()),
        }
    }
}

/// The topics `principal` may publish on, as the runtime registry lists them; none when it
/// does not answer (the publisher is admitted without them and gets them at its next
/// connect).
async fn trigger_topics(registry: &Client, principal: &atasira_domain::Principal) -> Vec<String> {
    match registry.call(subjects::RUNTIME_REGISTRY, principal, &atasira_contracts::v1::ListTriggerTopics {}, "").await {
        Ok(Ok(written)) => written.reply.topics,
        Ok(Err(refused)) => {
            tracing::warn!(code = %refused.code, reason = refused.message, "auth callout: the runtime registry did not list trigger topics");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(error = %e, "auth callout: the runtime registry did not list trigger topics; admitted without them");
            Vec::new()
        }
    }
}

/// Serves the auth callout until `shutdown` resolves. Several gateways share the work (one
/// queue group).
pub async fn run(client: async_nats::Client, db: Db, registry: Client, keys: Keys, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let registry = std::sync::Arc::new(registry);
    let mut requests =
        client.queue_subscribe(subjects::AUTH_CALLOUT, "atasira-auth-callout".to_owned()).await.context("cannot subscribe to the auth callout subject")?;
    let keys = std::sync::Arc::new(keys);
    tracing::info!(issuer = %keys.issuer.public_key(), encrypted = keys.xkey.is_some(), "auth callout: answering NATS connections");
    tokio::pin!(shutdown);
    loop {
        let msg = tokio::select! {
            msg = requests.next() => match msg { Some(m) => m, None => return Ok(()) },
            () = &mut shutdown => return Ok(()),
        };
        let (client, db, keys, registry) = (client.clone(), db.clone(), keys.clone(), registry.clone());
        tokio::spawn(async move {
            let Some(reply) = msg.reply else { return };
            let server_xkey = msg.headers.as_ref().and_then(|h| h.get(SERVER_XKEY_HEADER)).map(|v| v.as_str().to_owned());
            let Some((request, server)) = keys.open(&msg.payload, server_xkey.as_deref()) else { return };
            let Some(jwt) = answer(&db, &registry, &keys.issuer, &request).await else { return };
            let Some(sealed) = keys.seal(jwt, server.as_ref()) else { return };
            if let Err(e) = client.publish(reply, sealed.into()).await {
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
        assert!(matches!(decide("UABC", None, None, &[], now), Verdict::Deny(_)));
        assert!(matches!(decide("UABC", Some(""), None, &[], now), Verdict::Deny(_)));
        assert!(matches!(decide("UABC", Some("atasira_pat_x"), None, &[], now), Verdict::Deny(_)));
    }

    #[test]
    fn given_a_valid_token_when_deciding_then_only_its_own_subjects_and_inbox_are_granted() {
        let now = Utc::now();
        let user = allowed(decide("UABC", Some("atasira_pat_x"), Some(&record(Role::Member, None)), &[], now));
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
        // R-TRIG-1: the topics of the event Boxes it may start, and only those.
        let topics = vec!["sales.csv.arrived".to_owned(), "atasira.box.gateway.approval".to_owned()];
        let user = allowed(decide("UABC", Some("atasira_pat_x"), Some(&record(Role::Member, None)), &topics, now));
        let publish = &user.nats.permissions.permissions.publish.allow;
        assert!(publish.contains(&"sales.csv.arrived".to_owned()) && !publish.iter().any(|s| s.contains("gateway")), "{publish:?}");
    }

    #[test]
    fn given_a_token_expiring_soon_when_deciding_then_the_connection_ends_with_it() {
        let now = Utc::now();
        let soon = now + chrono::TimeDelta::minutes(5);
        let user = allowed(decide("UABC", Some("t"), Some(&record(Role::Admin, Some(soon))), &[], now));
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

    #[test]
    fn given_an_encrypted_request_when_opened_then_the_answer_is_encrypted_back_to_the_server_only() {
        let server = nkeys::XKey::new();
        let own = nkeys::XKey::new();
        let keys = Keys::from_seeds(&KeyPair::new_account().seed().expect("seed"), Some(&own.seed().expect("seed"))).expect("keys");
        let sealed = server.seal(b"request jwt", &nkeys::XKey::from_public_key(&own.public_key()).expect("public")).expect("sealed");
        let (clear, back_to) = keys.open(&sealed, Some(&server.public_key())).expect("opened");
        assert_eq!(clear, b"request jwt");
        let answer = keys.seal("answer jwt".to_owned(), back_to.as_ref()).expect("sealed");
        assert_ne!(answer, b"answer jwt", "not in clear");
        let own_public = nkeys::XKey::from_public_key(&own.public_key()).expect("public");
        assert_eq!(server.open(&answer, &own_public).expect("the server opens it"), b"answer jwt");
        // In clear although encryption is configured, or encrypted to another key: unanswered.
        assert!(keys.open(b"request jwt", None).is_none());
        let other = nkeys::XKey::new();
        let to_other = server.seal(b"x", &nkeys::XKey::from_public_key(&other.public_key()).expect("public")).expect("sealed");
        assert!(keys.open(&to_other, Some(&server.public_key())).is_none());
        assert!(!format!("{keys:?}").contains(&own.seed().expect("seed")[2..]), "Debug shows public keys only");
    }
}
