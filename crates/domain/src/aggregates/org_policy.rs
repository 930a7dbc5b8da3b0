//! The organisation's policy (R-POLICY-1): one stream, [`STREAM_ID`], appended by the
//! approval service; each published version an event (and so a ledger row), numbered from
//! one. Only a human admin publishes; the text must load ([`crate::org_policy`]).
//! Publishing the text in force again changes nothing.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::org_policy::{PolicyDocument, PolicyError, Rule};
use crate::{ErrorCode, Principal};

/// The one stream of the organisation's policy.
pub const STREAM_ID: &str = "org-policy";

/// The version in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyVersion {
    pub version: u64,
    pub text: String,
    pub digest: String,
    pub rules: Vec<Rule>,
    pub published_by: String,
    pub published_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OrgPolicy {
    pub current: Option<PolicyVersion>,
}

#[derive(Debug, Clone)]
pub enum OrgPolicyCommand {
    Publish { text: String, by: Principal, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OrgPolicyEvent {
    PolicyPublished { version: u64, text: String, digest: String, rules: Vec<Rule>, published_by: String, published_at: DateTime<Utc> },
}

impl OrgPolicyEvent {
    pub fn name(&self) -> &'static str {
        "PolicyPublished"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrgPolicyError {
    #[error("only a human admin may publish the organisation's policy")]
    NotHumanAdmin,
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

impl OrgPolicyError {
    pub fn code(&self) -> ErrorCode {
        match self {
            OrgPolicyError::NotHumanAdmin => ErrorCode::Forbidden,
            OrgPolicyError::Invalid(_) => ErrorCode::InvalidRequest,
        }
    }
}

impl OrgPolicy {
    pub fn decide(&self, command: OrgPolicyCommand) -> Result<Vec<OrgPolicyEvent>, OrgPolicyError> {
        let OrgPolicyCommand::Publish { text, by, at } = command;
        if !by.is_human_admin() {
            return Err(OrgPolicyError::NotHumanAdmin);
        }
        let document = PolicyDocument::parse(&text)?;
        if self.current.as_ref().is_some_and(|c| c.digest == document.digest()) {
            return Ok(vec![]);
        }
        Ok(vec![OrgPolicyEvent::PolicyPublished {
            version: self.current.as_ref().map_or(1, |c| c.version + 1),
            digest: document.digest().to_owned(),
            rules: document.rules().to_vec(),
            text,
            published_by: by.user_id,
            published_at: at,
        }])
    }

    pub fn evolve(&mut self, event: OrgPolicyEvent) {
        let OrgPolicyEvent::PolicyPublished { version, text, digest, rules, published_by, published_at } = event;
        self.current = Some(PolicyVersion { version, text, digest, rules, published_by, published_at });
    }
}

aggregate_via_decide!(OrgPolicy, super::types::ORG_POLICY, OrgPolicyCommand, OrgPolicyEvent, OrgPolicyError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;
    use crate::{Kind, Role};

    const TEXT: &str = r#"@id("no-full-network") forbid(principal, action, resource) when { resource.network == "full" };"#;

    fn publish(text: &str, by: Principal) -> OrgPolicyCommand {
        OrgPolicyCommand::Publish { text: text.into(), by, at: Utc::now() }
    }

    fn alice() -> Principal {
        Principal::new("alice", Role::Admin, Kind::Human)
    }

    #[test]
    fn r_policy_1_given_none_when_a_human_admin_publishes_then_version_1_with_its_rules() {
        let events = given_when::<OrgPolicy>(vec![], publish(TEXT, alice())).expect("published");
        let [OrgPolicyEvent::PolicyPublished { version: 1, rules, published_by, .. }] = &events[..] else { panic!("{events:?}") };
        assert_eq!((rules[0].id.as_str(), published_by.as_str()), ("no-full-network", "alice"));
    }

    #[test]
    fn r_policy_1_given_version_1_when_another_text_is_published_then_version_2_and_the_same_again_changes_nothing() {
        let first = given_when::<OrgPolicy>(vec![], publish(TEXT, alice())).expect("published");
        let other = "permit(principal, action, resource);";
        let second = given_when::<OrgPolicy>(first.clone(), publish(other, alice())).expect("published");
        assert!(matches!(&second[..], [OrgPolicyEvent::PolicyPublished { version: 2, .. }]), "{second:?}");
        assert!(given_when::<OrgPolicy>(first, publish(TEXT, alice())).expect("accepted").is_empty());
    }

    #[test]
    fn r_policy_1_given_an_agent_or_a_bad_text_when_published_then_refused() {
        let agent = Principal::new("bot", Role::Admin, Kind::Agent);
        assert_eq!(given_when::<OrgPolicy>(vec![], publish(TEXT, agent)).expect_err("agent").code(), ErrorCode::Forbidden);
        assert_eq!(given_when::<OrgPolicy>(vec![], publish("forbid(", alice())).expect_err("bad").code(), ErrorCode::InvalidRequest);
    }
}
