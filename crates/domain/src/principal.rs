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

/// The start of a trigger principal's user id: `trigger:<box_id>`. No token can be
/// issued for such a user id.
pub const TRIGGER_USER_PREFIX: &str = "trigger:";

/// Who launches a triggered Worker: the Box's own trigger (an agent, a member).
pub fn trigger_principal(box_id: &str) -> Principal {
    Principal::new(format!("{TRIGGER_USER_PREFIX}{box_id}"), Role::Member, Kind::Agent)
}

/// Whether `principal` is the trigger of Box `box_id`.
pub fn is_trigger_of(principal: &Principal, box_id: &str) -> bool {
    principal.kind == Kind::Agent && principal.user_id.strip_prefix(TRIGGER_USER_PREFIX) == Some(box_id)
}

/// Whether `user_id` is a trigger's (reserved: no person or agent token has one).
pub fn is_trigger_user(user_id: &str) -> bool {
    user_id.starts_with(TRIGGER_USER_PREFIX)
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
