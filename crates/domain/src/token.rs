//! The approval token (R-APPROVE-4, R-BOX-1): an Ed25519 signature by the approval service
//! over the approved draft, which the registry, CreateWorker and auditors verify with public
//! keys only.
//!
//! Why Ed25519 and not an HMAC: a verifier holding an HMAC key could also mint tokens, so
//! every verifier would be a second approval service. With a signature only the approval
//! service (the sole holder of the secret) can approve; everybody else can merely check.
//!
//! Why "parse, don't validate": [`VerifiedApproval`] has private fields and only
//! [`Keyring::verify`] builds one, so code that activates a Box (R-BOX-1) can demand a
//! `VerifiedApproval` in its signature and thereby cannot be reached with an unchecked token.
//!
//! This module does no IO, reads no clock and generates no randomness: the caller passes
//! secrets, public keys and `now` in.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long after approval the Box may be activated with the token (R-APPROVE-4: 10 min).
/// Short, so that a leaked token is useless soon after.
pub const ACTIVATION_WINDOW: TimeDelta = TimeDelta::minutes(10);

/// Domain separation: a signature over these bytes can never be mistaken for a signature
/// made by the same key for another purpose or another version of the format.
pub const PURPOSE_TAG: &str = "atasira.approval-token.v1";

/// Length of an Ed25519 signature in bytes (its hex form is twice as long).
const SIGNATURE_LEN: usize = 64;

/// What the approval service vouches for: this exact manifest of this draft, for this
/// box_type, was approved by this admin at this time, and may be activated until `deadline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalClaims {
    /// Which signing key made the signature; lets verifiers keep retired keys (rotation).
    pub key_id: String,
    pub draft_id: String,
    pub box_type: String,
    /// `"sha256:<hex>"` of the canonical manifest JSON (see [`manifest_digest`]).
    pub manifest_digest: String,
    /// User id of the human admin who approved.
    pub approver: String,
    /// Whole seconds: only unix seconds are signed (see [`ApprovalClaims::canonical_bytes`]).
    pub issued_at: DateTime<Utc>,
    /// Whole seconds; `issued_at + ACTIVATION_WINDOW` for tokens from [`ApprovalSigner`].
    pub deadline: DateTime<Utc>,
}

impl ApprovalClaims {
    /// The bytes that are signed: the purpose tag, then every field in a fixed order, each
    /// item prefixed by its length as a u32 big-endian, times as i64 unix seconds big-endian.
    ///
    /// Why length prefixes: without them `box_type="ab", draft_id="c"` and
    /// `box_type="a", draft_id="bc"` would concatenate to the same bytes and one signature
    /// would cover both. With them the encoding is injective (for fields below 4 GiB, far
    /// beyond anything a request can carry).
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(128 + self.key_id.len() + self.draft_id.len() + self.box_type.len() + self.manifest_digest.len() + self.approver.len());
        push_item(&mut out, PURPOSE_TAG.as_bytes());
        push_item(&mut out, self.key_id.as_bytes());
        push_item(&mut out, self.draft_id.as_bytes());
        push_item(&mut out, self.box_type.as_bytes());
        push_item(&mut out, self.manifest_digest.as_bytes());
        push_item(&mut out, self.approver.as_bytes());
        push_item(&mut out, &self.issued_at.timestamp().to_be_bytes());
        push_item(&mut out, &self.deadline.timestamp().to_be_bytes());
        out
    }

    /// True when both times are whole seconds, i.e. fully covered by the signature.
    fn times_are_canonical(&self) -> bool {
        self.issued_at.timestamp_subsec_nanos() == 0 && self.deadline.timestamp_subsec_nanos() == 0
    }
}

/// Appends one length-prefixed item. A length that does not fit a u32 saturates; such an
/// item (4 GiB) cannot come out of any request, so injectivity holds for real inputs.
/// Shared with the principal assertion's canonical bytes.
pub fn push_item(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The claims plus the approval service's signature over their canonical bytes. This is
/// what travels (JSON) from the approval service to the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalToken {
    pub claims: ApprovalClaims,
    /// Lowercase hex of the 64-byte Ed25519 signature.
    pub signature: String,
}

/// `"sha256:<hex>"` of the canonical manifest JSON: the token binds the exact manifest that
/// was approved, so a manifest changed after approval does not activate.
pub fn manifest_digest(canonical_manifest_json: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(canonical_manifest_json)))
}

/// A public key with its id, as published by the approval service and kept by verifiers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicKeyEntry {
    pub key_id: String,
    /// Serialized as a 64-character hex string, so key files stay human-readable.
    #[serde(with = "hex32")]
    pub public_key: [u8; 32],
}

/// Serde for `[u8; 32]` as a hex string.
mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(text.as_bytes(), &mut out).map_err(|e| D::Error::custom(format!("public_key: expected 64 hex characters: {e}")))?;
        Ok(out)
    }
}

/// The approval service's signing key. Only the approval service builds one (R-APPROVE-4);
/// the secret comes from its caller, since this crate does no IO and makes no randomness.
pub struct ApprovalSigner {
    key_id: String,
    signing_key: SigningKey,
}

impl ApprovalSigner {
    /// Builds the signer from a 32-byte Ed25519 secret (seed).
    pub fn from_secret(key_id: String, secret: [u8; 32]) -> Self {
        Self { key_id, signing_key: SigningKey::from_bytes(&secret) }
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The entry verifiers put in their [`Keyring`].
    pub fn public_key(&self) -> PublicKeyEntry {
        PublicKeyEntry { key_id: self.key_id.clone(), public_key: self.signing_key.verifying_key().to_bytes() }
    }

    /// Signs an approval. `issued_at` is truncated to whole seconds because only unix seconds
    /// are signed; the deadline is `issued_at + ACTIVATION_WINDOW` (clamped at the end of
    /// representable time, which only shortens the window).
    pub fn issue(&self, draft_id: &str, box_type: &str, manifest_digest: &str, approver: &str, issued_at: DateTime<Utc>) -> ApprovalToken {
        let issued_at = issued_at.trunc_subsecs(0);
        let deadline = issued_at.checked_add_signed(ACTIVATION_WINDOW).unwrap_or(DateTime::<Utc>::MAX_UTC).trunc_subsecs(0);
        let claims = ApprovalClaims {
            key_id: self.key_id.clone(),
            draft_id: draft_id.to_owned(),
            box_type: box_type.to_owned(),
            manifest_digest: manifest_digest.to_owned(),
            approver: approver.to_owned(),
            issued_at,
            deadline,
        };
        let signature = self.signing_key.sign(&claims.canonical_bytes());
        ApprovalToken { claims, signature: hex::encode(signature.to_bytes()) }
    }
}

/// Never prints the secret: signers end up in logged configuration structs.
impl fmt::Debug for ApprovalSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApprovalSigner")
            .field("key_id", &self.key_id)
            .field("public_key", &hex::encode(self.signing_key.verifying_key().to_bytes()))
            .finish_non_exhaustive()
    }
}

/// Public keys by id. Rotation: a retired key stays here (public part only) so tokens and
/// audit rows it signed keep verifying; a key is removed only to revoke what it signed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyring {
    keys: BTreeMap<String, [u8; 32]>,
}

impl Keyring {
    /// Later entries with the same key id replace earlier ones.
    pub fn new(entries: Vec<PublicKeyEntry>) -> Self {
        let mut ring = Self::default();
        for entry in entries {
            ring.insert(entry);
        }
        ring
    }

    /// Adds (or replaces) the key under `entry.key_id`.
    pub fn insert(&mut self, entry: PublicKeyEntry) {
        self.keys.insert(entry.key_id, entry.public_key);
    }

    pub fn contains(&self, key_id: &str) -> bool {
        self.keys.contains_key(key_id)
    }

    /// Checks a token completely: known key, well-formed signature, whole-second times,
    /// strict Ed25519 verification, a window no longer than [`ACTIVATION_WINDOW`], and
    /// `now <= deadline`. Only then does it hand out a [`VerifiedApproval`]; the caller still
    /// binds it to the draft at hand with [`VerifiedApproval::check_binding`].
    pub fn verify(&self, token: &ApprovalToken, now: DateTime<Utc>) -> Result<VerifiedApproval, TokenError> {
        let claims = &token.claims;
        let key_bytes = self.keys.get(&claims.key_id).ok_or_else(|| TokenError::UnknownKeyId { key_id: claims.key_id.clone() })?;

        let mut sig_bytes = [0u8; SIGNATURE_LEN];
        hex::decode_to_slice(token.signature.as_bytes(), &mut sig_bytes).map_err(|_| TokenError::MalformedSignature)?;
        let signature = Signature::from_bytes(&sig_bytes);

        let verifying_key = VerifyingKey::from_bytes(key_bytes).map_err(|_| TokenError::InvalidPublicKey { key_id: claims.key_id.clone() })?;

        if !claims.times_are_canonical() {
            return Err(TokenError::NonCanonicalTime);
        }

        // verify_strict rejects small-order keys and non-canonical signatures, so one
        // approval has exactly one valid signature encoding.
        verifying_key.verify_strict(&claims.canonical_bytes(), &signature).map_err(|_| TokenError::BadSignature)?;

        if claims.deadline.signed_duration_since(claims.issued_at) > ACTIVATION_WINDOW {
            return Err(TokenError::OverlongWindow);
        }
        if now > claims.deadline {
            return Err(TokenError::Expired { deadline: claims.deadline });
        }
        Ok(VerifiedApproval { claims: claims.clone() })
    }
}

/// An approval token that passed [`Keyring::verify`]. Fields are private so that no other
/// code can make one: holding a `VerifiedApproval` is the proof of verification (R-BOX-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedApproval {
    claims: ApprovalClaims,
}

impl VerifiedApproval {
    pub fn claims(&self) -> &ApprovalClaims {
        &self.claims
    }

    /// A valid token for another draft, box_type or manifest must not activate this one:
    /// the caller passes what it is about to activate and gets the first differing field.
    pub fn check_binding(&self, draft_id: &str, box_type: &str, manifest_digest: &str) -> Result<(), TokenError> {
        if self.claims.draft_id != draft_id {
            return Err(TokenError::BindingMismatch { field: "draft_id" });
        }
        if self.claims.box_type != box_type {
            return Err(TokenError::BindingMismatch { field: "box_type" });
        }
        if self.claims.manifest_digest != manifest_digest {
            return Err(TokenError::BindingMismatch { field: "manifest_digest" });
        }
        Ok(())
    }
}

/// Why a token was refused. Each variant has a stable [`TokenError::reason`] code for audit
/// rows and error details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("approval token signed with unknown key id {key_id:?}")]
    UnknownKeyId { key_id: String },
    #[error("approval token signature is not 128 hex characters")]
    MalformedSignature,
    #[error("public key {key_id:?} in the keyring is not a valid Ed25519 point")]
    InvalidPublicKey { key_id: String },
    #[error("approval token times carry fractions of a second, which the signature does not cover")]
    NonCanonicalTime,
    #[error("approval token signature does not verify")]
    BadSignature,
    #[error("approval token window is longer than the activation window")]
    OverlongWindow,
    #[error("approval token expired at {deadline}")]
    Expired { deadline: DateTime<Utc> },
    #[error("approval token is for another {field}")]
    BindingMismatch { field: &'static str },
}

impl TokenError {
    /// Short snake_case code, stable across releases.
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::UnknownKeyId { .. } => "unknown_key_id",
            TokenError::MalformedSignature => "malformed_signature",
            TokenError::InvalidPublicKey { .. } => "invalid_public_key",
            TokenError::NonCanonicalTime => "non_canonical_time",
            TokenError::BadSignature => "bad_signature",
            TokenError::OverlongWindow => "overlong_window",
            TokenError::Expired { .. } => "expired",
            TokenError::BindingMismatch { .. } => "binding_mismatch",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET_A: [u8; 32] = [7u8; 32];
    const SECRET_B: [u8; 32] = [9u8; 32];

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).expect("valid timestamp")
    }

    fn now0() -> DateTime<Utc> {
        t(1_750_000_000)
    }

    fn signer(id: &str, secret: [u8; 32]) -> ApprovalSigner {
        ApprovalSigner::from_secret(id.to_owned(), secret)
    }

    fn digest() -> String {
        manifest_digest(br#"{"box_type":"invoice-reader","purpose":"read invoices"}"#)
    }

    fn sample_token(s: &ApprovalSigner) -> ApprovalToken {
        s.issue("draft-1", "invoice-reader", &digest(), "admin-1", now0())
    }

    fn sample_claims() -> ApprovalClaims {
        ApprovalClaims {
            key_id: "k1".into(),
            draft_id: "d".into(),
            box_type: "b".into(),
            manifest_digest: "sha256:00".into(),
            approver: "a".into(),
            issued_at: now0(),
            deadline: now0() + ACTIVATION_WINDOW,
        }
    }

    #[test]
    fn r_approve_4_issued_token_verifies_with_public_key() {
        // given a signer and a keyring holding only its public key
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        // when a token is issued and verified within the window
        let token = sample_token(&s);
        let verified = ring.verify(&token, now0() + TimeDelta::minutes(5));
        // then it verifies, carries the claims and binds to the draft
        let verified = verified.expect("valid token");
        assert_eq!(verified.claims(), &token.claims);
        assert_eq!(verified.claims().deadline, now0() + ACTIVATION_WINDOW);
        assert_eq!(verified.check_binding("draft-1", "invoice-reader", &digest()), Ok(()));
    }

    #[test]
    fn r_approve_4_token_survives_json_round_trip() {
        // given an issued token
        let s = signer("k1", SECRET_A);
        let token = sample_token(&s);
        // when it travels as JSON
        let json = serde_json::to_string(&token).expect("serialize");
        let back: ApprovalToken = serde_json::from_str(&json).expect("deserialize");
        // then it is unchanged and still verifies
        assert_eq!(back, token);
        assert!(Keyring::new(vec![s.public_key()]).verify(&back, now0()).is_ok());
    }

    #[test]
    fn r_approve_4_deadline_is_exactly_at_boundary_still_valid() {
        // given a token; when verified at exactly its deadline; then it is valid (now > deadline expires)
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        let token = sample_token(&s);
        assert!(ring.verify(&token, token.claims.deadline).is_ok());
    }

    #[test]
    fn r_approve_4_issue_truncates_subseconds() {
        // given an issue time with nanoseconds
        let s = signer("k1", SECRET_A);
        let issued = now0() + TimeDelta::milliseconds(750);
        // when issued
        let token = s.issue("d", "b", &digest(), "a", issued);
        // then times are whole seconds and the token verifies
        assert_eq!(token.claims.issued_at, now0());
        assert!(Keyring::new(vec![s.public_key()]).verify(&token, now0()).is_ok());
    }

    #[test]
    fn r_approve_4_retired_key_still_verifies() {
        // given a token signed by the old key, and a keyring with the new and the retired key
        let old = signer("k-old", SECRET_A);
        let new = signer("k-new", SECRET_B);
        let token = sample_token(&old);
        let mut ring = Keyring::new(vec![new.public_key()]);
        ring.insert(old.public_key());
        // when verified; then it is valid, and the new key's tokens too
        assert!(ring.verify(&token, now0()).is_ok());
        assert!(ring.verify(&sample_token(&new), now0()).is_ok());
    }

    #[test]
    fn r_approve_4_wrong_public_key_under_same_id_is_bad_signature() {
        // given a token by key A and a keyring with key B's public key under the same id
        let token = sample_token(&signer("k1", SECRET_A));
        let ring = Keyring::new(vec![signer("k1", SECRET_B).public_key()]);
        // when verified; then bad signature
        let err = ring.verify(&token, now0()).expect_err("wrong key");
        assert_eq!(err, TokenError::BadSignature);
        assert_eq!(err.reason(), "bad_signature");
    }

    #[test]
    fn r_approve_4_altered_claims_are_bad_signature() {
        // given a valid token
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        let token = sample_token(&s);
        type Alteration = (&'static str, fn(&mut ApprovalClaims));
        let alterations: Vec<Alteration> = vec![
            ("box_type", |c| c.box_type = "other-box".into()),
            ("manifest_digest", |c| c.manifest_digest = manifest_digest(b"{}")),
            ("deadline", |c| c.deadline -= TimeDelta::minutes(1)),
            ("draft_id", |c| c.draft_id = "draft-2".into()),
            ("approver", |c| c.approver = "mallory".into()),
            ("issued_at", |c| c.issued_at -= TimeDelta::seconds(1)),
        ];
        for (field, alter) in alterations {
            // when one claim is altered
            let mut forged = token.clone();
            alter(&mut forged.claims);
            // then the signature no longer verifies
            assert_eq!(ring.verify(&forged, now0()), Err(TokenError::BadSignature), "{field}");
        }
    }

    #[test]
    fn r_approve_4_subsecond_deadline_extension_is_refused() {
        // given a valid token whose deadline gets a fraction of a second added (not signed)
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        let mut token = sample_token(&s);
        token.claims.deadline += TimeDelta::milliseconds(999);
        // when verified; then refused as non-canonical
        let err = ring.verify(&token, now0()).expect_err("subsecond");
        assert_eq!(err.reason(), "non_canonical_time");
    }

    #[test]
    fn r_approve_4_past_deadline_is_expired() {
        // given a valid token; when verified one second after its deadline
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        let token = sample_token(&s);
        let err = ring.verify(&token, token.claims.deadline + TimeDelta::seconds(1));
        // then expired
        let err = err.expect_err("expired");
        assert_eq!(err, TokenError::Expired { deadline: token.claims.deadline });
        assert_eq!(err.reason(), "expired");
    }

    #[test]
    fn r_approve_4_overlong_window_is_refused_even_if_signed() {
        // given claims with a 1-hour window, properly signed by the key
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        let mut claims = sample_claims();
        claims.deadline = claims.issued_at + TimeDelta::hours(1);
        let sig = s.signing_key.sign(&claims.canonical_bytes());
        let token = ApprovalToken { claims, signature: hex::encode(sig.to_bytes()) };
        // when verified; then overlong
        let err = ring.verify(&token, now0()).expect_err("overlong");
        assert_eq!(err, TokenError::OverlongWindow);
        assert_eq!(err.reason(), "overlong_window");
    }

    #[test]
    fn r_approve_4_unknown_key_id_is_refused() {
        // given a token by k1 and a keyring with only k2
        let token = sample_token(&signer("k1", SECRET_A));
        let ring = Keyring::new(vec![signer("k2", SECRET_B).public_key()]);
        // when verified; then unknown key id
        let err = ring.verify(&token, now0()).expect_err("unknown");
        assert_eq!(err, TokenError::UnknownKeyId { key_id: "k1".into() });
        assert_eq!(err.reason(), "unknown_key_id");
    }

    #[test]
    fn r_approve_4_malformed_signature_hex_is_refused() {
        // given a token whose signature is not 64 bytes of hex
        let s = signer("k1", SECRET_A);
        let ring = Keyring::new(vec![s.public_key()]);
        for bad in ["", "zz", "ab", &"0".repeat(130)] {
            let mut token = sample_token(&s);
            token.signature = bad.to_owned();
            // when verified; then malformed signature
            let err = ring.verify(&token, now0()).expect_err("malformed");
            assert_eq!(err.reason(), "malformed_signature", "{bad:?}");
        }
    }

    #[test]
    fn r_box_1_check_binding_reports_each_mismatching_field() {
        // given a verified approval for draft-1 / invoice-reader / digest
        let s = signer("k1", SECRET_A);
        let verified = Keyring::new(vec![s.public_key()]).verify(&sample_token(&s), now0()).expect("valid");
        let d = digest();
        // when checked against another draft, box_type or manifest; then that field is named
        let cases = [
            (("draft-2", "invoice-reader", d.as_str()), "draft_id"),
            (("draft-1", "other-box", d.as_str()), "box_type"),
            (("draft-1", "invoice-reader", "sha256:00"), "manifest_digest"),
        ];
        for ((draft, box_type, dig), field) in cases {
            let err = verified.check_binding(draft, box_type, dig).expect_err("mismatch");
            assert_eq!(err, TokenError::BindingMismatch { field });
            assert_eq!(err.reason(), "binding_mismatch");
        }
    }

    #[test]
    fn r_approve_4_canonical_bytes_are_length_prefixed() {
        // given two claims whose box_type+draft_id concatenate to the same text
        let mut a = sample_claims();
        a.box_type = "ab".into();
        a.draft_id = "c".into();
        let mut b = sample_claims();
        b.box_type = "a".into();
        b.draft_id = "bc".into();
        // when encoded; then the bytes differ, and encoding is deterministic
        assert_ne!(a.canonical_bytes(), b.canonical_bytes());
        assert_eq!(a.canonical_bytes(), a.clone().canonical_bytes());
        // and the encoding starts with the length-prefixed purpose tag
        let bytes = a.canonical_bytes();
        assert_eq!(&bytes[..4], &(PURPOSE_TAG.len() as u32).to_be_bytes());
        assert_eq!(&bytes[4..4 + PURPOSE_TAG.len()], PURPOSE_TAG.as_bytes());
    }

    #[test]
    fn r_approve_4_manifest_digest_is_prefixed_sha256_hex() {
        // given the empty input; when digested; then the well-known SHA-256 with prefix
        assert_eq!(manifest_digest(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn r_approve_4_public_key_entry_serializes_key_as_hex() {
        // given a public key entry; when serialized; then the key is a hex string and round-trips
        let entry = signer("k1", SECRET_A).public_key();
        let json = serde_json::to_value(&entry).expect("serialize");
        assert_eq!(json["public_key"], serde_json::Value::String(hex::encode(entry.public_key)));
        let back: PublicKeyEntry = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back, entry);
        // and a short key is refused
        let bad = serde_json::json!({"key_id": "k1", "public_key": "abcd"});
        assert!(serde_json::from_value::<PublicKeyEntry>(bad).is_err());
    }

    #[test]
    fn r_approve_4_signer_debug_hides_secret() {
        // given a signer; when debug-printed; then neither the secret nor its hex appears
        let s = signer("k1", [0xAB; 32]);
        let text = format!("{s:?}");
        assert!(text.contains("k1"));
        assert!(!text.contains(&hex::encode([0xAB; 32])));
        assert!(!text.contains("171, 171"));
    }

    fn arb_time() -> impl Strategy<Value = DateTime<Utc>> {
        // Mostly whole seconds, so that arbitrary tokens also reach signature verification.
        let nanos = prop_oneof![3 => Just(0u32), 1 => 0u32..2_000_000_000u32];
        (-100_000_000_000i64..100_000_000_000i64, nanos).prop_map(|(s, n)| DateTime::from_timestamp(s, n).unwrap_or(DateTime::UNIX_EPOCH))
    }

    proptest! {
        // R-APPROVE-4: verification is total: arbitrary signatures and claims give Ok or a
        // typed error, never a panic; and forged tokens never verify.
        #[test]
        fn r_approve_4_verify_never_panics(
            signature in prop_oneof![".*", "[0-9a-f]{128}", "[0-9A-Fa-f]{0,140}"],
            key_id in prop_oneof![Just("k1".to_owned()), ".*"],
            draft_id in ".*",
            box_type in ".*",
            digest in ".*",
            approver in ".*",
            issued_at in arb_time(),
            deadline in arb_time(),
            now in arb_time(),
        ) {
            let s = signer("k1", SECRET_A);
            let ring = Keyring::new(vec![s.public_key()]);
            let token = ApprovalToken {
                claims: ApprovalClaims {
                    key_id, draft_id, box_type, manifest_digest: digest, approver, issued_at, deadline,
                },
                signature,
            };
            let result = ring.verify(&token, now);
            prop_assert!(result.is_err());
            if let Err(e) = result {
                prop_assert!(!e.reason().is_empty());
            }
        }

        // R-APPROVE-4: distinct claims give distinct canonical bytes.
        #[test]
        fn r_approve_4_canonical_bytes_injective(
            a in proptest::collection::vec(".{0,4}", 5),
            b in proptest::collection::vec(".{0,4}", 5),
            ta in -1000i64..1000, tb in -1000i64..1000,
        ) {
            let make = |v: &[String], s: i64| ApprovalClaims {
                key_id: v[0].clone(), draft_id: v[1].clone(), box_type: v[2].clone(),
                manifest_digest: v[3].clone(), approver: v[4].clone(),
                issued_at: t(s), deadline: t(s + 600),
            };
            let (ca, cb) = (make(&a, ta), make(&b, tb));
            prop_assert_eq!(ca == cb, ca.canonical_bytes() == cb.canonical_bytes());
        }
    }
}
