//! The principal assertion (R-ARCH-3, R-ARCH-13, R-AUTH-5, R-AUDIT-4): a process of the
//! cluster vouches for the calling principal to a service over NATS with an Ed25519
//! signature under its own key.
//!
//! Why: services must not trust a bare principal in a message, since anything that can
//! publish on NATS could claim to be an admin. The assertion is short-lived (60 s) and bound
//! to one request: its subject, its message type, the SHA-256 of its payload, its
//! correlation id and its idempotency key ([`Binding`]), so a captured assertion is worthless for any other request
//! (an assertion made for `ListPendingDrafts` does not approve a draft). A verifier accepts
//! each assertion once ([`ReplayCache`]), so it is worthless for the same request a second
//! time too.
//!
//! Signing is asymmetric (R-ARCH-13): each signing process (the gateway; approval and the
//! runtime registry for the calls they make) holds its own [`AssertionSigner`] and publishes
//! its public half; verifiers hold only public keys ([`AssertionKeyring`]), each tied to the
//! issuer that published it, and accept a key only on requests that issuer sends. So a
//! process that verifies assertions cannot mint one, and one issuer's key cannot speak for
//! another. Keys carry an expiry, so a signer rotates by publishing a new key. Every
//! refusal maps to the typed error `unauthenticated` at the service boundary;
//! [`AssertionError::reason`] says why.
//!
//! This module does no IO and reads no clock: keys, randomness and `now` come from the caller.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::principal::Principal;
use crate::token::push_item;

/// Lifetime of an assertion (R-ARCH-3: 60 s): long enough for one request, short enough
/// that a captured one is soon worthless.
pub const ASSERTION_TTL: TimeDelta = TimeDelta::seconds(60);

/// How long a published signing key verifies: a signer publishes its next key well before
/// (see [`KEY_ROTATE_AFTER`]), so a key taken from a process stops working a day later.
pub const KEY_LIFETIME: TimeDelta = TimeDelta::hours(24);

/// When a signer publishes its next key.
pub const KEY_ROTATE_AFTER: TimeDelta = TimeDelta::hours(12);

/// Domain separation: a signature over these bytes cannot be confused with one made for
/// another purpose (e.g. approval tokens) or another format version.
pub const PURPOSE_TAG: &str = "atasira.principal-assertion.v3";

/// Upper bound on an encoded assertion accepted by [`PrincipalAssertion::decode`], so a
/// hostile header cannot make a service parse megabytes.
pub const MAX_ENCODED_LEN: usize = 16 * 1024;

/// Length of an Ed25519 signature in bytes.
const SIGNATURE_LEN: usize = 64;

/// What the replay cache remembers of an admitted assertion: the SHA-256 of what was signed.
type Tag = [u8; 32];

/// One process's signing key, with the id and the issuer (its process identity) it is
/// published under. Never prints the secret.
#[derive(Clone)]
pub struct AssertionSigner {
    key_id: String,
    issuer: String,
    signing: SigningKey,
    expires_at: DateTime<Utc>,
}

impl AssertionSigner {
    /// A signer from 32 secret bytes the caller drew at random, published at `now` (it
    /// verifies until `now + KEY_LIFETIME`).
    pub fn new(key_id: impl Into<String>, issuer: impl Into<String>, seed: &[u8; 32], now: DateTime<Utc>) -> Self {
        let expires_at = now.checked_add_signed(KEY_LIFETIME).unwrap_or(DateTime::<Utc>::MAX_UTC).trunc_subsecs(0);
        Self { key_id: key_id.into(), issuer: issuer.into(), signing: SigningKey::from_bytes(seed), expires_at }
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The public half, as it is published.
    pub fn public_key(&self) -> AssertionPublicKey {
        AssertionPublicKey { key_id: self.key_id.clone(), issuer: self.issuer.clone(), key: self.signing.verifying_key(), expires_at: self.expires_at }
    }

    /// Mints an assertion for `principal` on the one request `binding` describes, valid
    /// until `now + ASSERTION_TTL` truncated to whole seconds (only unix seconds are signed).
    pub fn sign(&self, principal: &Principal, binding: &Binding, now: DateTime<Utc>) -> PrincipalAssertion {
        let expires_at = now.checked_add_signed(ASSERTION_TTL).unwrap_or(DateTime::<Utc>::MAX_UTC).trunc_subsecs(0);
        let key_id = self.key_id.clone();
        let bytes = canonical_bytes(&key_id, principal, binding, expires_at);
        let signature = hex::encode(self.signing.sign(&bytes).to_bytes());
        PrincipalAssertion { key_id, principal: principal.clone(), binding: binding.clone(), expires_at, signature }
    }
}

impl fmt::Debug for AssertionSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssertionSigner").field("key_id", &self.key_id).field("issuer", &self.issuer).finish_non_exhaustive()
    }
}

/// A published public key: who may sign with it (the issuer) and until when it verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssertionPublicKey {
    key_id: String,
    issuer: String,
    key: VerifyingKey,
    expires_at: DateTime<Utc>,
}

impl AssertionPublicKey {
    /// From its published form (the key as 64 hex digits).
    pub fn from_hex(key_id: impl Into<String>, issuer: impl Into<String>, public_hex: &str, expires_at: DateTime<Utc>) -> Result<Self, AssertionKeyError> {
        let key_id = key_id.into();
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(public_hex, &mut bytes).map_err(|_| AssertionKeyError::Malformed { key_id: key_id.clone() })?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| AssertionKeyError::Malformed { key_id: key_id.clone() })?;
        Ok(Self { key_id, issuer: issuer.into(), key, expires_at })
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// The key as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.key.as_bytes())
    }
}

/// Why a published key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssertionKeyError {
    #[error("assertion key {key_id:?}: not an Ed25519 public key")]
    Malformed { key_id: String },
}

/// The public keys a verifier knows, by key id. It holds no secret: nothing here can mint
/// an assertion.
#[derive(Debug, Clone, Default)]
pub struct AssertionKeyring {
    keys: BTreeMap<String, AssertionPublicKey>,
}

impl AssertionKeyring {
    pub fn new(keys: impl IntoIterator<Item = AssertionPublicKey>) -> Self {
        let mut ring = Self::default();
        for key in keys {
            ring.insert(key);
        }
        ring
    }

    /// Adds a key; the first key published under an id stays (an id is never reused).
    pub fn insert(&mut self, key: AssertionPublicKey) {
        self.keys.entry(key.key_id.clone()).or_insert(key);
    }

    pub fn knows(&self, key_id: &str) -> bool {
        self.keys.contains_key(key_id)
    }

    /// Checks an assertion that arrived from `issuer` (the sender its subject names) for
    /// the request `binding` describes (the subject it arrived on, its message type, the
    /// digest of its payload, its correlation id) at `now`: the key must be one `issuer`
    /// published and not expired, and the signature must hold. What passes still has to be
    /// admitted once by the verifier's [`ReplayCache`] before its principal counts.
    pub fn verify(&self, a: &PrincipalAssertion, binding: &Binding, issuer: &str, now: DateTime<Utc>) -> Result<Verified, AssertionError> {
        let key = self.keys.get(&a.key_id).ok_or_else(|| AssertionError::UnknownKeyId { key_id: a.key_id.clone() })?;
        if key.issuer != issuer {
            return Err(AssertionError::WrongIssuer { key_id: a.key_id.clone() });
        }

        let mut signature = [0u8; SIGNATURE_LEN];
        hex::decode_to_slice(a.signature.as_bytes(), &mut signature).map_err(|_| AssertionError::MalformedSignature)?;

        if a.expires_at.timestamp_subsec_nanos() != 0 {
            return Err(AssertionError::NonCanonicalTime);
        }

        let bytes = canonical_bytes(&a.key_id, &a.principal, &a.binding, a.expires_at);
        // `verify` (not `verify_strict`): keys are drawn by the signers and read from the
        // store, never offered by a caller, so the small-order checks buy nothing here and
        // cost a point decompression per request. The replay tag is the digest of what was
        // signed, so no second encoding of a signature makes the same assertion new.
        key.key.verify(&bytes, &Signature::from_bytes(&signature)).map_err(|_| AssertionError::BadSignature)?;

        // The signature holds, so these are what the signer bound it to; compare with this request.
        if a.binding.subject != binding.subject {
            return Err(AssertionError::SubjectMismatch);
        }
        if a.binding.message_type != binding.message_type {
            return Err(AssertionError::MessageTypeMismatch);
        }
        if a.binding.payload_sha256 != binding.payload_sha256 {
            return Err(AssertionError::PayloadMismatch);
        }
        if a.binding.correlation_id != binding.correlation_id {
            return Err(AssertionError::CorrelationMismatch);
        }
        if a.binding.idempotency_key != binding.idempotency_key {
            return Err(AssertionError::IdempotencyKeyMismatch);
        }
        if now > key.expires_at {
            return Err(AssertionError::KeyExpired { key_id: a.key_id.clone() });
        }
        if now > a.expires_at {
            return Err(AssertionError::Expired { expires_at: a.expires_at });
        }
        if a.expires_at.signed_duration_since(now) > ASSERTION_TTL {
            return Err(AssertionError::ExpiryTooFar { expires_at: a.expires_at });
        }
        Ok(Verified { principal: a.principal.clone(), tag: Sha256::digest(&bytes).into(), expires_at: a.expires_at })
    }
}

/// The SHA-256 of an envelope's payload bytes: what an assertion binds of the payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadDigest(pub [u8; 32]);

impl PayloadDigest {
    /// The digest of `payload` (the encoded message, as it travels).
    pub fn of(payload: &[u8]) -> Self {
        Self(Sha256::digest(payload).into())
    }

    /// Reads exactly 64 lowercase hex digits; anything else is `None`.
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }

    /// Exactly 32 bytes; anything else is `None`.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for PayloadDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PayloadDigest({})", self.to_hex())
    }
}

impl fmt::Display for PayloadDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for PayloadDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PayloadDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::from_hex(&text).ok_or_else(|| serde::de::Error::custom("payload_sha256 must be 64 lowercase hex digits"))
    }
}

/// The one request an assertion is good for. The signer names it; the verifier derives it
/// from the request as it arrived and the two must be equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The NATS subject of the request, e.g. `atasira.box.gateway.approval`.
    pub subject: String,
    /// The envelope's message type, e.g. `atasira.v1.ApproveDraft`.
    pub message_type: String,
    /// The SHA-256 of the envelope's payload bytes.
    pub payload_sha256: PayloadDigest,
    /// The envelope's correlation id.
    pub correlation_id: String,
    /// The envelope's idempotency key (empty: none). A service may derive what it creates
    /// from it (the drafts service: the draft id), so it is bound like the payload.
    #[serde(default)]
    pub idempotency_key: String,
}

/// An assertion whose signature, binding and lifetime checked out; only
/// [`AssertionKeyring::verify`] makes one, and only [`ReplayCache::admit`] turns it into a
/// principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    principal: Principal,
    tag: Tag,
    expires_at: DateTime<Utc>,
}

impl Verified {
    /// What the replay cache remembers of it: the SHA-256 of what was signed.
    pub fn tag(&self) -> &Tag {
        &self.tag
    }

    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }
}

/// How long past its expiry an admitted assertion is remembered: a verifier whose clock is
/// stepped back by up to this much still refuses its replay.
pub const REPLAY_GRACE: TimeDelta = TimeDelta::seconds(5);

/// How many unexpired assertions a verifier remembers by default. Each entry costs about
/// 100 bytes; at the default it holds more than 4000 requests a second for a whole
/// assertion lifetime.
pub const REPLAY_CACHE_CAPACITY: usize = 1 << 18;

/// Every assertion a verifier admitted and that has not expired yet, by what was signed: a second
/// use within the lifetime is a replay. Bounded: expired entries are dropped as time moves
/// on, and when `capacity` unexpired entries are held, new assertions are refused
/// ([`ReplayError::Full`], which callers answer as `busy`) instead of growing the cache.
#[derive(Debug, Clone)]
pub struct ReplayCache {
    capacity: usize,
    seen: HashSet<Tag>,
    by_expiry: BTreeSet<(DateTime<Utc>, Tag)>,
}

impl Default for ReplayCache {
    fn default() -> Self {
        Self::new(REPLAY_CACHE_CAPACITY)
    }
}

impl ReplayCache {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, seen: HashSet::new(), by_expiry: BTreeSet::new() }
    }

    /// Unexpired assertions remembered (after the last prune).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Accepts `verified` if this is its first use; `now` must be the time it was verified at.
    pub fn admit(&mut self, verified: Verified, now: DateTime<Utc>) -> Result<Principal, ReplayError> {
        self.prune(now);
        if self.seen.contains(&verified.tag) {
            return Err(ReplayError::Replayed);
        }
        if self.seen.len() >= self.capacity {
            return Err(ReplayError::Full { capacity: self.capacity });
        }
        self.seen.insert(verified.tag);
        self.by_expiry.insert((verified.expires_at, verified.tag));
        Ok(verified.principal)
    }

    /// Forgets assertions expired for longer than [`REPLAY_GRACE`]: verification refuses
    /// them anyway.
    fn prune(&mut self, now: DateTime<Utc>) {
        let horizon = now.checked_sub_signed(REPLAY_GRACE).unwrap_or(DateTime::<Utc>::MIN_UTC);
        while let Some(&(expires_at, tag)) = self.by_expiry.first() {
            if expires_at >= horizon {
                break;
            }
            self.by_expiry.pop_first();
            self.seen.remove(&tag);
        }
    }
}

/// Why a verified assertion was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Its second use: `unauthenticated`, and a security violation.
    #[error("principal assertion was used before")]
    Replayed,
    /// Too many unexpired assertions: `busy`, retry in a moment.
    #[error("{capacity} unexpired principal assertions are remembered already; retry in a moment")]
    Full { capacity: usize },
}

/// The signed bytes: purpose tag, key id, user_id, role, kind, subject, message type, payload
/// digest (32 bytes), correlation id, idempotency key (when not empty), expires_at (i64 unix seconds big-endian), each
/// prefixed by its u32 big-endian length so that no two distinct assertions share an
/// encoding.
fn canonical_bytes(key_id: &str, principal: &Principal, binding: &Binding, expires_at: DateTime<Utc>) -> Vec<u8> {
    let role = principal.role.to_string();
    let kind = principal.kind.to_string();
    let Binding { subject, message_type, payload_sha256, correlation_id, idempotency_key } = binding;
    let mut out = Vec::with_capacity(
        170 + key_id.len()
            + principal.user_id.len()
            + subject.len()
            + message_type.len()
            + correlation_id.len()
            + idempotency_key.len()
            + role.len()
            + kind.len(),
    );
    push_item(&mut out, PURPOSE_TAG.as_bytes());
    push_item(&mut out, key_id.as_bytes());
    push_item(&mut out, principal.user_id.as_bytes());
    push_item(&mut out, role.as_bytes());
    push_item(&mut out, kind.as_bytes());
    push_item(&mut out, subject.as_bytes());
    push_item(&mut out, message_type.as_bytes());
    push_item(&mut out, &payload_sha256.0);
    push_item(&mut out, correlation_id.as_bytes());
    // Only when there is one. Unambiguous all the same: the items are length-prefixed, so
    // a keyed encoding has one item more.
    if !idempotency_key.is_empty() {
        push_item(&mut out, idempotency_key.as_bytes());
    }
    push_item(&mut out, &expires_at.timestamp().to_be_bytes());
    out
}

/// A process's statement "this request comes from this principal", carried in the
/// request's envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalAssertion {
    pub key_id: String,
    pub principal: Principal,
    /// The one request it is good for.
    pub binding: Binding,
    /// Whole seconds: only unix seconds are signed.
    pub expires_at: DateTime<Utc>,
    /// Lowercase hex of the 64-byte Ed25519 signature.
    pub signature: String,
}

impl PrincipalAssertion {
    /// Text form: lowercase hex of the JSON. Hex because it may travel as a header value,
    /// which must be plain ASCII without CR/LF, and a user id may hold any character.
    pub fn encode(&self) -> String {
        // Serializing plain strings, enums and a DateTime cannot fail; an empty string would
        // simply be refused by `decode` as malformed.
        hex::encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses the text form. Only the shape is checked here; [`AssertionKeyring::verify`]
    /// decides whether it is valid.
    pub fn decode(encoded: &str) -> Result<Self, AssertionError> {
        if encoded.len() > MAX_ENCODED_LEN {
            return Err(AssertionError::Malformed);
        }
        let json = hex::decode(encoded.trim()).map_err(|_| AssertionError::Malformed)?;
        serde_json::from_slice(&json).map_err(|_| AssertionError::Malformed)
    }
}

/// Why an assertion was refused. All of them answer `unauthenticated` (R-AUTH-5); the
/// [`AssertionError::reason`] code goes into logs and audit details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssertionError {
    #[error("the request carries no principal assertion")]
    Missing,
    #[error("principal assertion is malformed")]
    Malformed,
    #[error("principal assertion signed with unknown key id {key_id:?}")]
    UnknownKeyId { key_id: String },
    #[error("principal assertion signed with key {key_id:?}, which its sender did not publish")]
    WrongIssuer { key_id: String },
    #[error("principal assertion signed with key {key_id:?}, which has expired")]
    KeyExpired { key_id: String },
    #[error("principal assertion signature is not 128 hex characters")]
    MalformedSignature,
    #[error("principal assertion expiry carries fractions of a second, which the signature does not cover")]
    NonCanonicalTime,
    #[error("principal assertion signature does not hold")]
    BadSignature,
    #[error("principal assertion was made for another subject")]
    SubjectMismatch,
    #[error("principal assertion was made for another message type")]
    MessageTypeMismatch,
    #[error("principal assertion was made for another payload")]
    PayloadMismatch,
    #[error("principal assertion belongs to another request")]
    CorrelationMismatch,
    #[error("principal assertion was made for another idempotency key")]
    IdempotencyKeyMismatch,
    #[error("principal assertion expired at {expires_at}")]
    Expired { expires_at: DateTime<Utc> },
    #[error("principal assertion expires at {expires_at}, further ahead than its lifetime")]
    ExpiryTooFar { expires_at: DateTime<Utc> },
}

impl AssertionError {
    /// Short snake_case code, stable across releases.
    pub fn reason(&self) -> &'static str {
        match self {
            AssertionError::Missing => "missing_assertion",
            AssertionError::Malformed => "malformed_assertion",
            AssertionError::UnknownKeyId { .. } => "unknown_key_id",
            AssertionError::WrongIssuer { .. } => "wrong_issuer",
            AssertionError::KeyExpired { .. } => "key_expired",
            AssertionError::MalformedSignature => "malformed_signature",
            AssertionError::NonCanonicalTime => "non_canonical_time",
            AssertionError::BadSignature => "bad_signature",
            AssertionError::SubjectMismatch => "subject_mismatch",
            AssertionError::MessageTypeMismatch => "message_type_mismatch",
            AssertionError::PayloadMismatch => "payload_mismatch",
            AssertionError::CorrelationMismatch => "correlation_mismatch",
            AssertionError::IdempotencyKeyMismatch => "idempotency_key_mismatch",
            AssertionError::Expired { .. } => "expired",
            AssertionError::ExpiryTooFar { .. } => "expiry_too_far",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::principal::{Kind, Role};
    use proptest::prelude::*;

    fn now0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000, 0).expect("valid timestamp")
    }

    /// The gateway's signer `id` with seed bytes `byte`, published an hour before `now0`.
    fn key(id: &str, byte: u8) -> AssertionSigner {
        AssertionSigner::new(id, "gateway", &[byte; 32], now0() - TimeDelta::hours(1))
    }

    /// A signer and a verifier's keyring that knows its public key.
    struct Keys {
        signer: AssertionSigner,
        ring: AssertionKeyring,
    }

    impl Keys {
        fn of(signer: AssertionSigner, known: &[&AssertionSigner]) -> Self {
            Keys { ring: AssertionKeyring::new(known.iter().map(|k| k.public_key())), signer }
        }
        fn sign(&self, p: &Principal, b: &Binding, now: DateTime<Utc>) -> PrincipalAssertion {
            self.signer.sign(p, b, now)
        }
        /// Verifies as a service does a request the gateway sent.
        fn verify(&self, a: &PrincipalAssertion, b: &Binding, now: DateTime<Utc>) -> Result<Verified, AssertionError> {
            self.ring.verify(a, b, "gateway", now)
        }
    }

    fn keys() -> Keys {
        let k = key("k1", 1);
        Keys::of(k.clone(), &[&k])
    }

    fn member() -> Principal {
        Principal::new("user-1", Role::Member, Kind::Human)
    }

    fn admin() -> Principal {
        Principal::new("alice", Role::Admin, Kind::Human)
    }

    /// A request as the gateway sends it to a service.
    fn request(subject: &str, message_type: &str, payload: &[u8], correlation_id: &str) -> Binding {
        Binding {
            subject: subject.to_owned(),
            message_type: message_type.to_owned(),
            payload_sha256: PayloadDigest::of(payload),
            correlation_id: correlation_id.to_owned(),
            idempotency_key: String::new(),
        }
    }

    fn list_pending() -> Binding {
        request("atasira.box.gateway.drafts", "atasira.v1.ListPendingDrafts", b"\x08\x05", "corr-1")
    }

    /// Verifies and unwraps the principal.
    fn check(ks: &Keys, a: &PrincipalAssertion, binding: &Binding, now: DateTime<Utc>) -> Result<Principal, AssertionError> {
        ks.verify(a, binding, now).map(|v| v.principal().clone())
    }

    #[test]
    fn r_arch_3_signed_assertion_verifies() {
        // given keys and a member principal
        let ks = keys();
        // when the gateway signs for a request and a service verifies that request within the TTL
        let a = ks.sign(&member(), &list_pending(), now0());
        let got = check(&ks, &a, &list_pending(), now0() + TimeDelta::seconds(30));
        // then the principal comes back and the expiry is now + 60 s
        assert_eq!(got, Ok(member()));
        assert_eq!(a.expires_at, now0() + ASSERTION_TTL);
        assert_eq!(a.key_id, "k1");
        assert_eq!(a.binding, list_pending());
    }

    #[test]
    fn r_arch_3_an_assertion_for_list_pending_is_refused_for_approve_draft() {
        // given an admin's assertion made for ListPendingDrafts to the drafts service
        let ks = keys();
        let a = ks.sign(&admin(), &list_pending(), now0());
        // when it is presented with an ApproveDraft (another type, subject and payload, same correlation id)
        let approve = request("atasira.box.gateway.approval", "atasira.v1.ApproveDraft", b"\x0a\x02d1", "corr-1");
        // then it is refused: made for another subject
        assert_eq!(check(&ks, &a, &approve, now0()), Err(AssertionError::SubjectMismatch));
        // and on the drafts subject, for another message type
        let approve_here = Binding { subject: list_pending().subject, ..approve.clone() };
        let err = check(&ks, &a, &approve_here, now0()).expect_err("other type");
        assert_eq!(err, AssertionError::MessageTypeMismatch);
        assert_eq!(err.reason(), "message_type_mismatch");
    }

    #[test]
    fn r_arch_3_an_assertion_is_refused_on_another_subject() {
        // given an assertion for a request to the drafts service
        let ks = keys();
        let a = ks.sign(&admin(), &list_pending(), now0());
        // when the same request is sent to another service; then refused
        let elsewhere = Binding { subject: "atasira.box.gateway.audit".into(), ..list_pending() };
        let err = check(&ks, &a, &elsewhere, now0()).expect_err("other subject");
        assert_eq!(err.reason(), "subject_mismatch");
    }

    #[test]
    fn r_arch_3_an_assertion_is_refused_for_a_changed_payload() {
        // given an assertion for a request with limit 5
        let ks = keys();
        let a = ks.sign(&admin(), &list_pending(), now0());
        // when the payload is changed (limit 6) and everything else kept; then refused
        let changed = Binding { payload_sha256: PayloadDigest::of(b"\x08\x06"), ..list_pending() };
        let err = check(&ks, &a, &changed, now0()).expect_err("changed payload");
        assert_eq!(err, AssertionError::PayloadMismatch);
        assert_eq!(err.reason(), "payload_mismatch");
    }

    #[test]
    fn r_arch_3_other_correlation_id_fails() {
        // given an assertion for corr-1; when presented on request corr-2; then refused
        let ks = keys();
        let a = ks.sign(&member(), &list_pending(), now0());
        let other = Binding { correlation_id: "corr-2".into(), ..list_pending() };
        let err = check(&ks, &a, &other, now0()).expect_err("other request");
        assert_eq!(err, AssertionError::CorrelationMismatch);
        assert_eq!(err.reason(), "correlation_mismatch");
    }

    #[test]
    fn r_draft_11_other_idempotency_key_fails() {
        // given an assertion for a submit with key k1 (the drafts service derives the
        // draft id from it); when the same request arrives with key k2; then refused
        let ks = keys();
        let with_key = Binding { idempotency_key: "k1".into(), ..list_pending() };
        let a = ks.sign(&member(), &with_key, now0());
        let other = Binding { idempotency_key: "k2".into(), ..list_pending() };
        let err = check(&ks, &a, &other, now0()).expect_err("other key");
        assert_eq!(err, AssertionError::IdempotencyKeyMismatch);
        assert_eq!(err.reason(), "idempotency_key_mismatch");
        // and a forged binding that claims k2 breaks the signature
        let mut forged = a.clone();
        forged.binding.idempotency_key = "k2".into();
        assert_eq!(check(&ks, &forged, &other, now0()).expect_err("forged"), AssertionError::BadSignature);
        assert_eq!(check(&ks, &a, &with_key, now0()).map(|p| p.user_id), Ok(member().user_id));
    }

    #[test]
    fn r_arch_3_tampered_role_fails() {
        // given an assertion for a member
        let ks = keys();
        let mut a = ks.sign(&member(), &list_pending(), now0());
        // when the role is changed to admin
        a.principal.role = Role::Admin;
        // then the signature no longer holds
        let err = check(&ks, &a, &list_pending(), now0()).expect_err("tampered");
        assert_eq!(err, AssertionError::BadSignature);
        assert_eq!(err.reason(), "bad_signature");
    }

    #[test]
    fn r_arch_3_tampered_fields_fail() {
        // given an assertion; when any signed field changes (and the request is made to match it); then mismatch
        let ks = keys();
        let a = ks.sign(&member(), &list_pending(), now0());
        let alterations: Vec<fn(&mut PrincipalAssertion)> = vec![
            |a| a.principal.user_id = "user-2".into(),
            |a| a.principal.kind = Kind::Agent,
            |a| a.binding.subject = "atasira.box.gateway.approval".into(),
            |a| a.binding.message_type = "atasira.v1.ApproveDraft".into(),
            |a| a.binding.payload_sha256 = PayloadDigest::of(b"other"),
            |a| a.binding.correlation_id = "corr-2".into(),
            |a| a.expires_at -= TimeDelta::seconds(1),
        ];
        for alter in alterations {
            let mut forged = a.clone();
            alter(&mut forged);
            let binding = forged.binding.clone();
            assert_eq!(check(&ks, &forged, &binding, now0()), Err(AssertionError::BadSignature), "{forged:?}");
        }
    }

    #[test]
    fn r_arch_3_expired_assertion_fails() {
        // given an assertion; when verified one second after expiry; then expired
        let ks = keys();
        let a = ks.sign(&member(), &list_pending(), now0());
        assert!(ks.verify(&a, &list_pending(), a.expires_at).is_ok());
        let err = check(&ks, &a, &list_pending(), a.expires_at + TimeDelta::seconds(1)).expect_err("expired");
        assert_eq!(err, AssertionError::Expired { expires_at: a.expires_at });
        assert_eq!(err.reason(), "expired");
    }

    #[test]
    fn r_arch_3_expiry_further_than_ttl_fails() {
        // given an assertion signed 10 s in the future (e.g. a skewed or forged clock)
        let ks = keys();
        let a = ks.sign(&member(), &list_pending(), now0() + TimeDelta::seconds(10));
        // when verified now; then its expiry is further than the TTL
        let err = check(&ks, &a, &list_pending(), now0()).expect_err("too far");
        assert_eq!(err.reason(), "expiry_too_far");
    }

    #[test]
    fn r_audit_4_rotated_key_still_verifies() {
        // given an assertion signed by the old key
        let (old, new) = (key("k-old", 1), key("k-new", 2));
        let a = old.sign(&member(), &list_pending(), now0());
        // when the signer has published a new key and the verifier knows both
        let rotated = Keys::of(new.clone(), &[&new, &old]);
        // then the old assertion verifies, and new ones are signed with the new key
        assert_eq!(check(&rotated, &a, &list_pending(), now0()), Ok(member()));
        assert_eq!(rotated.sign(&member(), &list_pending(), now0()).key_id, "k-new");
    }

    #[test]
    fn r_audit_4_unknown_key_fails() {
        // given an assertion by k-old; when the verifier only knows k-new; then unknown key
        let a = key("k-old", 1).sign(&member(), &list_pending(), now0());
        let new = key("k-new", 2);
        let ks = Keys::of(new.clone(), &[&new]);
        let err = check(&ks, &a, &list_pending(), now0()).expect_err("unknown");
        assert_eq!(err, AssertionError::UnknownKeyId { key_id: "k-old".into() });
        assert_eq!(err.reason(), "unknown_key_id");
    }

    #[test]
    fn r_audit_4_other_secret_under_same_id_fails() {
        // given an assertion by k1 with seed 1; when verified with k1 published from seed 2
        let a = keys().sign(&member(), &list_pending(), now0());
        let other = key("k1", 2);
        let ks = Keys::of(other.clone(), &[&other]);
        // then the signature does not hold
        assert_eq!(check(&ks, &a, &list_pending(), now0()), Err(AssertionError::BadSignature));
    }

    #[test]
    fn r_arch_13_a_key_verifies_only_what_its_own_issuer_sends() {
        // given the registry's key, which the verifier knows as the registry's
        let registry = AssertionSigner::new("r1", "runtime-registry", &[7; 32], now0());
        let ring = AssertionKeyring::new([registry.public_key()]);
        let a = registry.sign(&admin(), &list_pending(), now0());
        // when its assertion arrives on a request the gateway sent; then refused
        let err = ring.verify(&a, &list_pending(), "gateway", now0()).expect_err("another issuer");
        assert_eq!(err, AssertionError::WrongIssuer { key_id: "r1".into() });
        assert_eq!(err.reason(), "wrong_issuer");
        // and on the registry's own request it holds
        assert!(ring.verify(&a, &list_pending(), "runtime-registry", now0()).is_ok());
        // and the keyring has no way to sign: it holds public keys only
        assert_eq!(ring.keys.values().map(AssertionPublicKey::to_hex).collect::<Vec<_>>(), [registry.public_key().to_hex()]);
    }

    #[test]
    fn r_audit_4_an_expired_key_verifies_nothing() {
        // given a key published at now0; when an assertion signed just before its end is
        // checked after it; then refused, although the assertion itself is young
        let k = AssertionSigner::new("k1", "gateway", &[1; 32], now0());
        let ks = Keys::of(k.clone(), &[&k]);
        let end = now0() + KEY_LIFETIME;
        let a = ks.sign(&member(), &list_pending(), end - TimeDelta::seconds(1));
        assert!(ks.verify(&a, &list_pending(), end).is_ok());
        let err = check(&ks, &a, &list_pending(), end + TimeDelta::seconds(1)).expect_err("expired key");
        assert_eq!(err.reason(), "key_expired");
    }

    #[test]
    fn r_arch_13_a_published_key_reads_back_and_a_bad_one_is_refused() {
        let k = key("k1", 3).public_key();
        let back = AssertionPublicKey::from_hex("k1", "gateway", &k.to_hex(), k.expires_at()).expect("reads");
        assert_eq!(back, k);
        for bad in ["", "zz", &"00".repeat(31)] {
            assert!(AssertionPublicKey::from_hex("k1", "gateway", bad, k.expires_at()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn r_arch_3_malformed_signature_and_subsecond_expiry_fail() {
        // given a valid assertion
        let ks = keys();
        let a = ks.sign(&member(), &list_pending(), now0());
        // when the signature is not 64 bytes of hex; then malformed
        for bad in ["", "xyz", "abcd", &"0".repeat(130)] {
            let mut forged = a.clone();
            forged.signature = bad.to_owned();
            let err = check(&ks, &forged, &list_pending(), now0()).expect_err("bad signature");
            assert_eq!(err.reason(), "malformed_signature", "{bad:?}");
        }
        // when the expiry gains an (unsigned) fraction of a second; then refused
        let mut forged = a.clone();
        forged.expires_at += TimeDelta::milliseconds(500);
        let err = check(&ks, &forged, &list_pending(), now0()).expect_err("subsecond");
        assert_eq!(err.reason(), "non_canonical_time");
    }

    #[test]
    fn r_arch_3_sign_truncates_subseconds() {
        // given a clock reading with milliseconds; when signed; then expiry is whole seconds
        let ks = keys();
        let now = now0() + TimeDelta::milliseconds(400);
        let a = ks.sign(&member(), &list_pending(), now);
        assert_eq!(a.expires_at, now0() + ASSERTION_TTL);
        assert_eq!(check(&ks, &a, &list_pending(), now), Ok(member()));
    }

    #[test]
    fn r_arch_3_an_assertion_is_admitted_once() {
        // given a verified assertion
        let ks = keys();
        let mut cache = ReplayCache::default();
        let a = ks.sign(&admin(), &list_pending(), now0());
        let verified = ks.verify(&a, &list_pending(), now0()).expect("valid");
        // when it is admitted, then presented again within its lifetime
        assert_eq!(cache.admit(verified, now0()), Ok(admin()));
        let again = ks.verify(&a, &list_pending(), now0() + TimeDelta::seconds(20)).expect("still valid");
        // then the second use is a replay
        let err = cache.admit(again, now0() + TimeDelta::seconds(20)).expect_err("replayed");
        assert_eq!(err, ReplayError::Replayed);
        // and the same signature written in capitals is the same assertion
        let mut shouting = a.clone();
        shouting.signature = a.signature.to_uppercase();
        let verified = ks.verify(&shouting, &list_pending(), now0()).expect("hex is hex");
        assert_eq!(cache.admit(verified, now0()), Err(ReplayError::Replayed));
    }

    #[test]
    fn r_arch_3_the_replay_cache_forgets_expired_assertions_and_refuses_when_full() {
        // given a cache for two assertions holding two
        let ks = keys();
        let mut cache = ReplayCache::new(2);
        let binding = |c: &str| Binding { correlation_id: c.into(), ..list_pending() };
        for (i, c) in ["c1", "c2"].into_iter().enumerate() {
            let at = now0() + TimeDelta::seconds(i64::try_from(i).expect("small"));
            let v = ks.verify(&ks.sign(&admin(), &binding(c), at), &binding(c), at).expect("valid");
            assert!(cache.admit(v, at).is_ok());
        }
        // when a third comes while both are unexpired; then the cache refuses instead of growing
        let third = ks.sign(&admin(), &binding("c3"), now0() + TimeDelta::seconds(2));
        let v = ks.verify(&third, &binding("c3"), now0() + TimeDelta::seconds(2)).expect("valid");
        assert_eq!(cache.admit(v.clone(), now0() + TimeDelta::seconds(2)), Err(ReplayError::Full { capacity: 2 }));
        assert_eq!(cache.len(), 2);
        // when the first has been expired for longer than the grace; then it is forgotten and the third fits
        let later = now0() + ASSERTION_TTL + REPLAY_GRACE + TimeDelta::seconds(1);
        assert_eq!(cache.admit(v, later), Ok(admin()));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn r_auth_5_encode_decode_round_trips_as_ascii() {
        // given an assertion for a user id with non-ASCII and newline characters
        let ks = keys();
        let p = Principal::new("jürgen\r\nx", Role::Admin, Kind::Agent);
        let a = ks.sign(&p, &list_pending(), now0());
        // when encoded as text and decoded again
        let header = a.encode();
        let back = PrincipalAssertion::decode(&header).expect("decode");
        // then the text is plain hex and the assertion still verifies
        assert!(header.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(back, a);
        assert_eq!(check(&ks, &back, &list_pending(), now0()), Ok(p));
    }

    #[test]
    fn r_auth_5_decode_refuses_garbage() {
        // given inputs that are not hex JSON of an assertion, or too long; then malformed
        let too_long = "00".repeat(MAX_ENCODED_LEN);
        for bad in ["", "zz", "7b7d", &too_long] {
            let err = PrincipalAssertion::decode(bad).expect_err("garbage");
            assert_eq!(err.reason(), "malformed_assertion");
        }
    }

    #[test]
    fn r_arch_3_payload_digests_read_only_64_lowercase_hex_digits() {
        let d = PayloadDigest::of(b"");
        assert_eq!(d.to_hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(PayloadDigest::from_hex(&d.to_hex()), Some(d));
        for bad in ["", "e3b0", &d.to_hex().to_uppercase(), &format!("{}0", d.to_hex()), &"g".repeat(64)] {
            assert_eq!(PayloadDigest::from_hex(bad), None, "{bad:?}");
        }
        assert_eq!(PayloadDigest::from_slice(&d.0), Some(d));
        assert_eq!(PayloadDigest::from_slice(&[0; 31]), None);
    }

    #[test]
    fn r_audit_4_a_signer_never_prints_its_secret() {
        let k = AssertionSigner::new("k1", "gateway", &[0xCD; 32], now0());
        let text = format!("{k:?}");
        assert!(text.contains("k1") && text.contains("gateway"));
        assert!(!text.to_lowercase().contains("cdcd") && !text.contains("205"), "{text}");
    }

    #[test]
    fn r_arch_3_canonical_bytes_are_length_prefixed() {
        // given two assertions whose neighbouring fields concatenate identically; then bytes differ
        let p1 = Principal::new("c", Role::Member, Kind::Human);
        let p2 = Principal::new("bc", Role::Member, Kind::Human);
        assert_ne!(canonical_bytes("ab", &p1, &list_pending(), now0()), canonical_bytes("a", &p2, &list_pending(), now0()));
        let b1 = Binding { subject: "a.b".into(), message_type: "c".into(), ..list_pending() };
        let b2 = Binding { subject: "a".into(), message_type: ".bc".into(), ..list_pending() };
        assert_ne!(canonical_bytes("k", &p1, &b1, now0()), canonical_bytes("k", &p1, &b2, now0()));
    }

    #[test]
    fn r_draft_11_an_idempotency_key_is_one_more_item_and_no_key_adds_nothing() {
        // given a request without a key; then its bytes are the nine items and the expiry
        let p = member();
        let plain = canonical_bytes("k", &p, &list_pending(), now0());
        let mut expected = Vec::new();
        for item in [PURPOSE_TAG.as_bytes(), b"k", p.user_id.as_bytes(), b"member", b"human", b"atasira.box.gateway.drafts", b"atasira.v1.ListPendingDrafts"] {
            push_item(&mut expected, item);
        }
        push_item(&mut expected, &list_pending().payload_sha256.0);
        push_item(&mut expected, b"corr-1");
        push_item(&mut expected, &now0().timestamp().to_be_bytes());
        assert_eq!(plain, expected);
        // and a key is an item of its own, never mistaken for the end of the correlation id
        let keyed = Binding { idempotency_key: "x".into(), ..list_pending() };
        let folded = Binding { correlation_id: "corr-1\0\0\0\x01x".into(), ..list_pending() };
        assert_ne!(canonical_bytes("k", &p, &keyed, now0()), canonical_bytes("k", &p, &folded, now0()));
        assert_ne!(canonical_bytes("k", &p, &keyed, now0()), plain);
    }

    proptest! {
        // R-ARCH-3: verification is total: arbitrary fields never panic, forgeries never pass.
        #[test]
        fn r_arch_3_verify_never_panics(
            key_id in prop_oneof![Just("k1".to_owned()), ".*"],
            user_id in ".*",
            subject in ".*",
            corr in ".*",
            signature in prop_oneof![".*", "[0-9a-f]{128}"],
            secs in -100_000_000_000i64..100_000_000_000i64,
            nanos in prop_oneof![3 => Just(0u32), 1 => 0u32..2_000_000_000u32],
            now_secs in -100_000_000_000i64..100_000_000_000i64,
        ) {
            let ks = keys();
            let expires_at = DateTime::from_timestamp(secs, nanos).unwrap_or(DateTime::UNIX_EPOCH);
            let now = DateTime::from_timestamp(now_secs, 0).unwrap_or(DateTime::UNIX_EPOCH);
            let binding = Binding { subject, correlation_id: corr, ..list_pending() };
            let a = PrincipalAssertion {
                key_id,
                principal: Principal::new(user_id, Role::Admin, Kind::Human),
                binding: binding.clone(),
                expires_at,
                signature,
            };
            prop_assert!(ks.verify(&a, &binding, now).is_err());
            let _ = PrincipalAssertion::decode(&a.encode());
        }
    }
}
