//! Personal access tokens.

use super::*;

/// Whether a token works now, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    Active,
    Expired,
    Revoked,
}

/// A personal access token as admins see it: never the token or its hash.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    /// The token's public id (`tok_...`).
    pub token_id: String,
    pub user_id: String,
    pub role: Role,
    pub kind: Kind,
    pub state: TokenState,
    pub created_at: DateTime<Utc>,
    /// `null`: never expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// To the minute; `null`: never used.
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<&atasira_platform::auth::TokenInfo> for TokenView {
    fn from(t: &atasira_platform::auth::TokenInfo) -> Self {
        let p = PrincipalView::from(&t.principal);
        TokenView {
            token_id: t.token_id.clone(),
            user_id: p.user_id,
            role: p.role,
            kind: p.kind,
            state: match t.state {
                atasira_platform::auth::TokenState::Active => TokenState::Active,
                atasira_platform::auth::TokenState::Expired => TokenState::Expired,
                atasira_platform::auth::TokenState::Revoked => TokenState::Revoked,
            },
            created_at: t.created_at,
            expires_at: t.expires_at,
            last_used_at: t.last_used_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// 200 of `GET /api/v1/auth/tokens`: oldest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// 200 of a revocation: the ids of the tokens it revoked (empty when they were revoked
/// already).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokensRevoked {
    pub revoked: Vec<String>,
}
