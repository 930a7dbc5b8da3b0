//! Personal access tokens (R-AUTH-1, R-AUTH-4): every issue and every revocation is an
//! event, so the audit ledger records it like any other (R-AUDIT-1). One stream per token,
//! its id the token's public id (`tok_...`), never the token or its hash: the events are
//! public (the JetStream feed), the hash names a NATS publisher's subjects.
//!
//! Who appends: the gateway (admins over REST) and the operator CLI (`atasira tokens`),
//! both working on the gateway's token table; the audit service publishes the events on its
//! subject (`subjects::owner_of`), since the gateway has no JetStream.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::{Kind, Role};

/// Prefix of a token's public id.
pub const TOKEN_ID_PREFIX: &str = "tok_";

/// Who acted when no principal did: an operator at the command line (`atasira tokens`).
pub const OPERATOR: &str = "operator";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PersonalAccessToken {
    pub issued: bool,
    pub revoked: bool,
}

#[derive(Debug, Clone)]
pub enum PatCommand {
    Issue {
        token_id: String,
        user_id: String,
        role: Role,
        kind: Kind,
        expires_at: Option<DateTime<Utc>>,
        by: String,
        at: DateTime<Utc>,
    },
    /// `user_id` is the token's owner (from the token table: tokens issued before tokens
    /// were events have no `TokenIssued`, and can be revoked all the same).
    Revoke {
        token_id: String,
        user_id: String,
        by: String,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PatEvent {
    TokenIssued {
        token_id: String,
        user_id: String,
        role: Role,
        kind: Kind,
        expires_at: Option<DateTime<Utc>>,
        /// The admin who issued it, or [`OPERATOR`].
        issued_by: String,
        at: DateTime<Utc>,
    },
    TokenRevoked {
        token_id: String,
        user_id: String,
        /// The admin who revoked it, or [`OPERATOR`].
        revoked_by: String,
        at: DateTime<Utc>,
    },
}

impl PatEvent {
    pub fn name(&self) -> &'static str {
        match self {
            PatEvent::TokenIssued { .. } => "TokenIssued",
            PatEvent::TokenRevoked { .. } => "TokenRevoked",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatError {
    /// Token ids are random; a second issue under one id is a bug or a replay.
    #[error("a token with this id was issued already")]
    AlreadyIssued,
    #[error("a revoked token stays revoked")]
    Revoked,
    /// User ids beginning `trigger:` are the Boxes' own triggers (R-TRIG-1).
    #[error("user ids beginning with \"trigger:\" belong to Boxes' schedules and events; choose another")]
    ReservedUserId,
}

impl PatError {
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            PatError::ReservedUserId => crate::ErrorCode::InvalidRequest,
            _ => crate::ErrorCode::Conflict,
        }
    }
}

impl PersonalAccessToken {
    /// Issue once; revoke once (revoking a revoked token adds nothing, so a retried
    /// revocation is harmless).
    pub fn decide(&self, command: PatCommand) -> Result<Vec<PatEvent>, PatError> {
        match command {
            PatCommand::Issue { .. } if self.revoked => Err(PatError::Revoked),
            PatCommand::Issue { .. } if self.issued => Err(PatError::AlreadyIssued),
            PatCommand::Issue { user_id, .. } if crate::principal::is_trigger_user(&user_id) => Err(PatError::ReservedUserId),
            PatCommand::Issue { token_id, user_id, role, kind, expires_at, by, at } => {
                Ok(vec![PatEvent::TokenIssued { token_id, user_id, role, kind, expires_at, issued_by: by, at }])
            }
            PatCommand::Revoke { .. } if self.revoked => Ok(vec![]),
            PatCommand::Revoke { token_id, user_id, by, at } => Ok(vec![PatEvent::TokenRevoked { token_id, user_id, revoked_by: by, at }]),
        }
    }

    pub fn evolve(&mut self, event: PatEvent) {
        match event {
            PatEvent::TokenIssued { .. } => self.issued = true,
            PatEvent::TokenRevoked { .. } => self.revoked = true,
        }
    }
}

aggregate_via_decide!(PersonalAccessToken, super::types::PAT, PatCommand, PatEvent, PatError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_765_000_000, 0).expect("valid time")
    }

    fn issue() -> PatCommand {
        PatCommand::Issue {
            token_id: "tok_1".into(),
            user_id: "alice".into(),
            role: Role::Admin,
            kind: Kind::Human,
            expires_at: None,
            by: OPERATOR.into(),
            at: at(),
        }
    }

    fn revoke(by: &str) -> PatCommand {
        PatCommand::Revoke { token_id: "tok_1".into(), user_id: "alice".into(), by: by.into(), at: at() }
    }

    #[test]
    fn r_auth_4_given_nothing_when_issued_then_token_issued_names_owner_and_issuer() {
        let events = given_when::<PersonalAccessToken>(vec![], issue()).expect("issued");
        assert_eq!(events.len(), 1);
        assert!(matches!(&events[0], PatEvent::TokenIssued { user_id, issued_by, .. } if user_id == "alice" && issued_by == OPERATOR));
        // and a second issue under the same id is refused
        assert_eq!(given_when::<PersonalAccessToken>(events, issue()), Err(PatError::AlreadyIssued));
    }

    #[test]
    fn r_trig_1_no_token_is_issued_for_a_boxs_trigger() {
        let PatCommand::Issue { token_id, role, kind, expires_at, by, at, .. } = issue() else { unreachable!() };
        let command = PatCommand::Issue { token_id, user_id: "trigger:b1".into(), role, kind, expires_at, by, at };
        assert_eq!(given_when::<PersonalAccessToken>(vec![], command), Err(PatError::ReservedUserId));
    }

    #[test]
    fn r_auth_4_given_issued_when_revoked_twice_then_one_token_revoked() {
        let issued = given_when::<PersonalAccessToken>(vec![], issue()).expect("issued");
        let revoked = given_when::<PersonalAccessToken>(issued.clone(), revoke("root")).expect("revoked");
        assert!(matches!(&revoked[..], [PatEvent::TokenRevoked { revoked_by, .. }] if revoked_by == "root"));
        let history: Vec<PatEvent> = issued.into_iter().chain(revoked).collect();
        assert_eq!(given_when::<PersonalAccessToken>(history.clone(), revoke("root")), Ok(vec![]));
        // and a revoked token is never issued again
        assert_eq!(given_when::<PersonalAccessToken>(history, issue()), Err(PatError::Revoked));
    }

    #[test]
    fn r_auth_4_a_token_from_before_token_events_can_be_revoked() {
        // given no TokenIssued (the token table knows the token); when revoked; then recorded
        let events = given_when::<PersonalAccessToken>(vec![], revoke(OPERATOR)).expect("revoked");
        assert_eq!(events.iter().map(PatEvent::name).collect::<Vec<_>>(), ["TokenRevoked"]);
    }
}
