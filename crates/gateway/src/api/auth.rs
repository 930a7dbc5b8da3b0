//! Authentication: principal assertions for NATS publishers, whoami.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Admin,
    Member,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Human,
    Agent,
}

/// Who holds the token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PrincipalView {
    pub user_id: String,
    pub role: Role,
    pub kind: Kind,
}

/// The gateway's signed statement "this call comes from this principal", for one request.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Assertion {
    pub key_id: String,
    pub principal: PrincipalView,
    pub subject: String,
    pub message_type: String,
    /// 64 lowercase hex digits.
    pub payload_sha256: String,
    pub correlation_id: String,
    /// Empty: the request carries none.
    pub idempotency_key: String,
    pub expires_at: DateTime<Utc>,
    /// Lowercase hex of the gateway's Ed25519 signature (64 bytes).
    pub signature: String,
}

/// 200 of `POST /api/v1/auth/nats-assertion`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AssertionIssued {
    pub correlation_id: String,
    pub expires_at: DateTime<Utc>,
    pub assertion: Assertion,
    /// The assertion as an `atasira.v1.PrincipalAssertion` protobuf, hex: put it in the
    /// envelope of the one request it is for. Services accept it once.
    pub assertion_protobuf_hex: String,
}

impl AssertionIssued {
    pub fn new(assertion: &PrincipalAssertion, protobuf: &[u8]) -> Self {
        let principal = PrincipalView::from(&assertion.principal);
        let binding = &assertion.binding;
        Self {
            correlation_id: binding.correlation_id.clone(),
            expires_at: assertion.expires_at,
            assertion: Assertion {
                key_id: assertion.key_id.clone(),
                principal,
                subject: binding.subject.clone(),
                message_type: binding.message_type.clone(),
                payload_sha256: binding.payload_sha256.to_hex(),
                correlation_id: binding.correlation_id.clone(),
                idempotency_key: binding.idempotency_key.clone(),
                expires_at: assertion.expires_at,
                signature: assertion.signature.clone(),
            },
            assertion_protobuf_hex: hex::encode(protobuf),
        }
    }
}

impl From<&atasira_domain::Principal> for PrincipalView {
    fn from(p: &atasira_domain::Principal) -> Self {
        PrincipalView {
            user_id: p.user_id.clone(),
            role: match p.role {
                atasira_domain::Role::Admin => Role::Admin,
                atasira_domain::Role::Member => Role::Member,
            },
            kind: match p.kind {
                atasira_domain::Kind::Human => Kind::Human,
                atasira_domain::Kind::Agent => Kind::Agent,
            },
        }
    }
}
