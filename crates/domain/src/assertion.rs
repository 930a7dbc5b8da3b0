//! The principal assertion (R-ARCH-3, R-AUTH-5, R-AUDIT-4): the gateway vouches for the
//! calling principal to services over NATS with an HMAC-SHA256 under an internal key.
//!
//! Why: services must not trust a bare principal in a message, since anything that can
//! publish on NATS could claim to be an admin. The assertion is short-lived (60 s), bound to
//! the request's correlation id (so it cannot be replayed on another request), and names its
//! key id (so keys rotate without breaking in-flight requests). Every refusal maps to the
//! typed error `unauthenticated` at the service boundary; [`AssertionError::reason`] says why.
//!
//! This module does no IO and reads no clock: keys and `now` come from the caller.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::principal::Principal;
use crate::token::push_item;

type HmacSha256 = Hmac<Sha256>;

/// Lifetime of an assertion (R-ARCH-3: 60 s): long enough for one request, short enough
/// that a captured one is soon worthless.
pub const ASSERTION_TTL: TimeDelta = TimeDelta::seconds(60);

/// Domain separation: a MAC over these bytes cannot be confused with a MAC made by the same
/// key for another purpose (e.g. audit rows) or another format version.
pub const PURPOSE_TAG: &str = "atasira.principal-assertion.v1";

/// Minimum secret length: HMAC-SHA256 keys shorter than the hash output weaken it.
pub const MIN_SECRET_LEN: usize = 32;

/// Upper bound on an encoded assertion accepted by [`PrincipalAssertion::decode`], so a
/// hostile header cannot make a service parse megabytes.
pub const MAX_ENCODED_LEN: usize = 16 * 1024;

/// Length of an HMAC-SHA256 tag in bytes.
const MAC_LEN: usize = 32;

/// One internal HMAC key with its id. Holds the keyed HMAC state, never prints it.
#[derive(Clone)]
pub struct AssertionKey {
    key_id: String,
    mac: HmacSha256,
}

impl AssertionKey {
    /// Builds a key from secret bytes given by the caller (config, secret store).
    /// Refuses secrets shorter than [`MIN_SECRET_LEN`].
    pub fn new(key_id: impl Into<String>, secret: &[u8]) -> Result<Self, AssertionKeyError> {
        let key_id = key_id.into();
        if secret.len() < MIN_SECRET_LEN {
            return Err(AssertionKeyError::SecretTooShort { key_id, len: secret.len(), min: MIN_SECRET_LEN });
        }
        let mac = <HmacSha256 as Mac>::new_from_slice(secret).map_err(|_| AssertionKeyError::InvalidSecret { key_id: key_id.clone() })?;
        Ok(Self { key_id, mac })
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    fn tag(&self, bytes: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = self.mac.clone();
        mac.update(bytes);
        mac.finalize().into_bytes().into()
    }
}

/// Never prints the secret: keys end up in logged configuration structs.
impl fmt::Debug for AssertionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AssertionKey").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// Why a key could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssertionKeyError {
    #[error("assertion key {key_id:?}: secret has {len} bytes, at least {min} required")]
    SecretTooShort { key_id: String, len: usize, min: usize },
    #[error("assertion key {key_id:?}: secret rejected by HMAC")]
    InvalidSecret { key_id: String },
}

/// The key set of a gateway or service (R-AUDIT-4 rotation): sign with the current key,
/// verify with the current or any retired key still kept, so assertions minted just before
/// a rotation keep verifying until they expire.
#[derive(Debug, Clone)]
pub struct AssertionKeys {
    current: AssertionKey,
    retired: BTreeMap<String, AssertionKey>,
}

impl AssertionKeys {
    /// `current` signs; `retired` only verify. A retired key with the current key's id is
    /// ignored (the current key wins).
    pub fn new(current: AssertionKey, retired: Vec<AssertionKey>) -> Self {
        let retired = retired.into_iter().filter(|k| k.key_id != current.key_id).map(|k| (k.key_id.clone(), k)).collect();
        Self { current, retired }
    }

    pub fn current_key_id(&self) -> &str {
        &self.current.key_id
    }

    fn get(&self, key_id: &str) -> Option<&AssertionKey> {
        if self.current.key_id == key_id { Some(&self.current) } else { self.retired.get(key_id) }
    }

    /// Mints an assertion for `principal` on the request `correlation_id`, valid until
    /// `now + ASSERTION_TTL` truncated to whole seconds (only unix seconds are MACed).
    pub fn sign(&self, principal: &Principal, correlation_id: &str, now: DateTime<Utc>) -> PrincipalAssertion {
        let expires_at = now.checked_add_signed(ASSERTION_TTL).unwrap_or(DateTime::<Utc>::MAX_UTC).trunc_subsecs(0);
        let key_id = self.current.key_id.clone();
        let bytes = canonical_bytes(&key_id, principal, correlation_id, expires_at);
        let mac = hex::encode(self.current.tag(&bytes));
        PrincipalAssertion { key_id, principal: principal.clone(), correlation_id: correlation_id.to_owned(), expires_at, mac }
    }

    /// Checks an assertion for the request `correlation_id` at `now` and yields the
    /// principal it vouches for. The MAC is compared in constant time (R-AUDIT-4).
    pub fn verify(&self, a: &PrincipalAssertion, correlation_id: &str, now: DateTime<Utc>) -> Result<Principal, AssertionError> {
        let key = self.get(&a.key_id).ok_or_else(|| AssertionError::UnknownKeyId { key_id: a.key_id.clone() })?;

        let mut tag = [0u8; MAC_LEN];
        hex::decode_to_slice(a.mac.as_bytes(), &mut tag).map_err(|_| AssertionError::MalformedMac)?;

        if a.expires_at.timestamp_subsec_nanos() != 0 {
            return Err(AssertionError::NonCanonicalTime);
        }

        let bytes = canonical_bytes(&a.key_id, &a.principal, &a.correlation_id, a.expires_at);
        let mut mac = key.mac.clone();
        mac.update(&bytes);
        mac.verify_slice(&tag).map_err(|_| AssertionError::MacMismatch)?;

        if a.correlation_id != correlation_id {
            return Err(AssertionError::CorrelationMismatch);
        }
        if now > a.expires_at {
            return Err(AssertionError::Expired { expires_at: a.expires_at });
        }
        if a.expires_at.signed_duration_since(now) > ASSERTION_TTL {
            return Err(AssertionError::ExpiryTooFar { expires_at: a.expires_at });
        }
        Ok(a.principal.clone())
    }
}

/// The MACed bytes: purpose tag, key id, user_id, role, kind, correlation id, expires_at
/// (i64 unix seconds big-endian), each prefixed by its u32 big-endian length so that no two
/// distinct assertions share an encoding.
fn canonical_bytes(key_id: &str, principal: &Principal, correlation_id: &str, expires_at: DateTime<Utc>) -> Vec<u8> {
    let role = principal.role.to_string();
    let kind = principal.kind.to_string();
    let mut out = Vec::with_capacity(96 + key_id.len() + principal.user_id.len() + correlation_id.len() + role.len() + kind.len());
    push_item(&mut out, PURPOSE_TAG.as_bytes());
    push_item(&mut out, key_id.as_bytes());
    push_item(&mut out, principal.user_id.as_bytes());
    push_item(&mut out, role.as_bytes());
    push_item(&mut out, kind.as_bytes());
    push_item(&mut out, correlation_id.as_bytes());
    push_item(&mut out, &expires_at.timestamp().to_be_bytes());
    out
}

/// The gateway's statement "this request comes from this principal", carried in a NATS
/// header next to the envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalAssertion {
    pub key_id: String,
    pub principal: Principal,
    pub correlation_id: String,
    /// Whole seconds: only unix seconds are MACed.
    pub expires_at: DateTime<Utc>,
    /// Lowercase hex of the 32-byte HMAC-SHA256 tag.
    pub mac: String,
}

impl PrincipalAssertion {
    /// Header form: lowercase hex of the JSON. Hex because header values must be plain ASCII
    /// without CR/LF, and a user id may hold any character.
    pub fn encode(&self) -> String {
        // Serializing plain strings, enums and a DateTime cannot fail; an empty string would
        // simply be refused by `decode` as malformed.
        hex::encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses the header form. Only the shape is checked here; [`AssertionKeys::verify`]
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
    #[error("principal assertion is not valid hex-encoded JSON")]
    Malformed,
    #[error("principal assertion signed with unknown key id {key_id:?}")]
    UnknownKeyId { key_id: String },
    #[error("principal assertion mac is not 64 hex characters")]
    MalformedMac,
    #[error("principal assertion expiry carries fractions of a second, which the mac does not cover")]
    NonCanonicalTime,
    #[error("principal assertion mac does not match")]
    MacMismatch,
    #[error("principal assertion belongs to another request")]
    CorrelationMismatch,
    #[error("principal assertion expired at {expires_at}")]
    Expired { expires_at: DateTime<Utc> },
    #[error("principal assertion expires at {expires_at}, further ahead than its lifetime")]
    ExpiryTooFar { expires_at: DateTime<Utc> },
}

impl AssertionError {
    /// Short snake_case code, stable across releases.
    pub fn reason(&self) -> &'static str {
        match self {
            AssertionError::Malformed => "malformed_assertion",
            AssertionError::UnknownKeyId { .. } => "unknown_key_id",
            AssertionError::MalformedMac => "malformed_mac",
            AssertionError::NonCanonicalTime => "non_canonical_time",
            AssertionError::MacMismatch => "mac_mismatch",
            AssertionError::CorrelationMismatch => "correlation_mismatch",
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

    fn key(id: &str, byte: u8) -> AssertionKey {
        AssertionKey::new(id, &[byte; 32]).expect("valid key")
    }

    fn keys() -> AssertionKeys {
        AssertionKeys::new(key("k1", 1), vec![])
    }

    fn now0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000, 0).expect("valid timestamp")
    }

    fn member() -> Principal {
        Principal::new("user-1", Role::Member, Kind::Human)
    }

    #[test]
    fn r_arch_3_signed_assertion_verifies() {
        // given keys and a member principal
        let ks = keys();
        // when the gateway signs for a request and a service verifies within the TTL
        let a = ks.sign(&member(), "corr-1", now0());
        let got = ks.verify(&a, "corr-1", now0() + TimeDelta::seconds(30));
        // then the principal comes back and the expiry is now + 60 s
        assert_eq!(got, Ok(member()));
        assert_eq!(a.expires_at, now0() + ASSERTION_TTL);
        assert_eq!(a.key_id, "k1");
    }

    #[test]
    fn r_arch_3_tampered_role_fails() {
        // given an assertion for a member
        let ks = keys();
        let mut a = ks.sign(&member(), "corr-1", now0());
        // when the role is changed to admin
        a.principal.role = Role::Admin;
        // then the MAC no longer matches
        let err = ks.verify(&a, "corr-1", now0()).expect_err("tampered");
        assert_eq!(err, AssertionError::MacMismatch);
        assert_eq!(err.reason(), "mac_mismatch");
    }

    #[test]
    fn r_arch_3_tampered_fields_fail() {
        // given an assertion; when user id, kind, correlation id or expiry change; then mismatch
        let ks = keys();
        let a = ks.sign(&member(), "corr-1", now0());
        let alterations: Vec<fn(&mut PrincipalAssertion)> =
            vec![|a| a.principal.user_id = "user-2".into(), |a| a.principal.kind = Kind::Agent, |a| a.correlation_id = "corr-2".into(), |a| {
                a.expires_at -= TimeDelta::seconds(1)
            }];
        for alter in alterations {
            let mut forged = a.clone();
            alter(&mut forged);
            let corr = forged.correlation_id.clone();
            assert_eq!(ks.verify(&forged, &corr, now0()), Err(AssertionError::MacMismatch));
        }
    }

    #[test]
    fn r_arch_3_other_correlation_id_fails() {
        // given an assertion for corr-1; when presented on request corr-2; then refused
        let ks = keys();
        let a = ks.sign(&member(), "corr-1", now0());
        let err = ks.verify(&a, "corr-2", now0()).expect_err("other request");
        assert_eq!(err, AssertionError::CorrelationMismatch);
        assert_eq!(err.reason(), "correlation_mismatch");
    }

    #[test]
    fn r_arch_3_expired_assertion_fails() {
        // given an assertion; when verified one second after expiry; then expired
        let ks = keys();
        let a = ks.sign(&member(), "corr-1", now0());
        assert!(ks.verify(&a, "corr-1", a.expires_at).is_ok());
        let err = ks.verify(&a, "corr-1", a.expires_at + TimeDelta::seconds(1)).expect_err("expired");
        assert_eq!(err, AssertionError::Expired { expires_at: a.expires_at });
        assert_eq!(err.reason(), "expired");
    }

    #[test]
    fn r_arch_3_expiry_further_than_ttl_fails() {
        // given an assertion signed 10 s in the future (e.g. a skewed or forged clock)
        let ks = keys();
        let a = ks.sign(&member(), "corr-1", now0() + TimeDelta::seconds(10));
        // when verified now; then its expiry is further than the TTL
        let err = ks.verify(&a, "corr-1", now0()).expect_err("too far");
        assert_eq!(err.reason(), "expiry_too_far");
    }

    #[test]
    fn r_audit_4_rotated_key_still_verifies() {
        // given an assertion signed by the old key
        let old = AssertionKeys::new(key("k-old", 1), vec![]);
        let a = old.sign(&member(), "corr-1", now0());
        // when the verifier has rotated to a new key but keeps the old one
        let rotated = AssertionKeys::new(key("k-new", 2), vec![key("k-old", 1)]);
        // then the old assertion verifies, and new ones are signed with the new key
        assert_eq!(rotated.verify(&a, "corr-1", now0()), Ok(member()));
        assert_eq!(rotated.sign(&member(), "corr-1", now0()).key_id, "k-new");
        assert_eq!(rotated.current_key_id(), "k-new");
    }

    #[test]
    fn r_audit_4_unknown_key_fails() {
        // given an assertion by k-old; when the verifier only knows k-new; then unknown key
        let a = AssertionKeys::new(key("k-old", 1), vec![]).sign(&member(), "corr-1", now0());
        let ks = AssertionKeys::new(key("k-new", 2), vec![]);
        let err = ks.verify(&a, "corr-1", now0()).expect_err("unknown");
        assert_eq!(err, AssertionError::UnknownKeyId { key_id: "k-old".into() });
        assert_eq!(err.reason(), "unknown_key_id");
    }

    #[test]
    fn r_audit_4_other_secret_under_same_id_fails() {
        // given an assertion by k1 with secret 1; when verified with k1 holding secret 2
        let a = keys().sign(&member(), "corr-1", now0());
        let ks = AssertionKeys::new(key("k1", 2), vec![]);
        // then the MAC does not match
        assert_eq!(ks.verify(&a, "corr-1", now0()), Err(AssertionError::MacMismatch));
    }

    #[test]
    fn r_arch_3_malformed_mac_and_subsecond_expiry_fail() {
        // given a valid assertion
        let ks = keys();
        let a = ks.sign(&member(), "corr-1", now0());
        // when the mac is not 32 bytes of hex; then malformed mac
        for bad in ["", "xyz", "abcd", &"0".repeat(66)] {
            let mut forged = a.clone();
            forged.mac = bad.to_owned();
            let err = ks.verify(&forged, "corr-1", now0()).expect_err("bad mac");
            assert_eq!(err.reason(), "malformed_mac", "{bad:?}");
        }
        // when the expiry gains an (unMACed) fraction of a second; then refused
        let mut forged = a.clone();
        forged.expires_at += TimeDelta::milliseconds(500);
        let err = ks.verify(&forged, "corr-1", now0()).expect_err("subsecond");
        assert_eq!(err.reason(), "non_canonical_time");
    }

    #[test]
    fn r_arch_3_sign_truncates_subseconds() {
        // given a clock reading with milliseconds; when signed; then expiry is whole seconds
        let ks = keys();
        let now = now0() + TimeDelta::milliseconds(400);
        let a = ks.sign(&member(), "corr-1", now);
        assert_eq!(a.expires_at, now0() + ASSERTION_TTL);
        assert_eq!(ks.verify(&a, "corr-1", now), Ok(member()));
    }

    #[test]
    fn r_auth_5_encode_decode_round_trips_as_ascii() {
        // given an assertion for a user id with non-ASCII and newline characters
        let ks = keys();
        let p = Principal::new("jürgen\r\nx", Role::Admin, Kind::Agent);
        let a = ks.sign(&p, "corr-1", now0());
        // when encoded for a header and decoded again
        let header = a.encode();
        let back = PrincipalAssertion::decode(&header).expect("decode");
        // then the header is plain hex and the assertion still verifies
        assert!(header.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(back, a);
        assert_eq!(ks.verify(&back, "corr-1", now0()), Ok(p));
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
    fn r_audit_4_key_debug_hides_secret_and_short_secret_refused() {
        // given a key; when debug-printed; then only the key id shows
        let k = AssertionKey::new("k1", &[0xCD; 32]).expect("valid");
        let text = format!("{k:?}");
        assert!(text.contains("k1"));
        assert!(!text.to_lowercase().contains("cdcd"));
        assert!(!text.contains("205"));
        // and a short secret is refused
        let err = AssertionKey::new("k1", b"short").expect_err("short");
        assert_eq!(err, AssertionKeyError::SecretTooShort { key_id: "k1".into(), len: 5, min: 32 });
    }

    #[test]
    fn r_arch_3_canonical_bytes_are_length_prefixed() {
        // given two assertions whose key id + user id concatenate identically; then bytes differ
        let p1 = Principal::new("c", Role::Member, Kind::Human);
        let p2 = Principal::new("bc", Role::Member, Kind::Human);
        assert_ne!(canonical_bytes("ab", &p1, "x", now0()), canonical_bytes("a", &p2, "x", now0()));
    }

    proptest! {
        // R-ARCH-3: verification is total: arbitrary fields never panic, forgeries never pass.
        #[test]
        fn r_arch_3_verify_never_panics(
            key_id in prop_oneof![Just("k1".to_owned()), ".*"],
            user_id in ".*",
            corr in ".*",
            mac in prop_oneof![".*", "[0-9a-f]{64}"],
            secs in -100_000_000_000i64..100_000_000_000i64,
            nanos in prop_oneof![3 => Just(0u32), 1 => 0u32..2_000_000_000u32],
            now_secs in -100_000_000_000i64..100_000_000_000i64,
        ) {
            let ks = keys();
            let expires_at = DateTime::from_timestamp(secs, nanos).unwrap_or(DateTime::UNIX_EPOCH);
            let now = DateTime::from_timestamp(now_secs, 0).unwrap_or(DateTime::UNIX_EPOCH);
            let a = PrincipalAssertion {
                key_id,
                principal: Principal::new(user_id, Role::Admin, Kind::Human),
                correlation_id: corr.clone(),
                expires_at,
                mac,
            };
            prop_assert!(ks.verify(&a, &corr, now).is_err());
            let _ = PrincipalAssertion::decode(&a.encode());
        }
    }
}
