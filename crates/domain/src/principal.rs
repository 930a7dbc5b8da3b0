//! Who calls: a user id with a role and a kind (SPEC §0, R-AUTH-2).

use serde::{Deserialize, Serialize};

/// What a principal may do by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Admin,
    Member,
}

/// Whether a person or an agent holds the token. Only humans may decide on drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Human,
    Agent,
}

/// The calling principal, as authenticated by the gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Principal {
    /// Stable user id; the requester of a draft is compared against it (R-AUTH-3).
    pub user_id: String,
    pub role: Role,
    pub kind: Kind,
}

impl Principal {
    pub fn new(user_id: impl Into<String>, role: Role, kind: Kind) -> Self {
        Self { user_id: user_id.into(), role, kind }
    }

    /// R-AUTH-2: approve, reject, mentor-edit, stop, resume and archive need role admin AND
    /// kind human; an agent never qualifies, whatever its role.
    pub fn is_human_admin(&self) -> bool {
        self.role == Role::Admin && self.kind == Kind::Human
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Admin => "admin",
            Role::Member => "member",
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Human => "human",
            Kind::Agent => "agent",
        })
    }
}
