//! NATS subjects (R-ARCH-2): requests on `atasira.box.<from>.<to>`, events on
//! `atasira.box.<service>.events`, all in one JetStream stream.

/// The service names, which are also reserved box_types (R-DRAFT-3).
pub const DRAFTS: &str = "drafts";
pub const APPROVAL: &str = "approval";
pub const PROVISIONER: &str = "provisioner";
pub const RUNTIME_REGISTRY: &str = "runtime-registry";
pub const AUDIT: &str = "audit";
pub const GATEWAY: &str = "gateway";

pub const SERVICES: &[&str] = &[DRAFTS, APPROVAL, PROVISIONER, RUNTIME_REGISTRY, AUDIT];

/// The JetStream stream holding every service's events.
pub const EVENTS_STREAM: &str = "ATASIRA_EVENTS";

/// Subjects the events stream captures.
pub const EVENTS_WILDCARD: &str = "atasira.box.*.events";

/// A request from `from` to `to`.
pub fn request(from: &str, to: &str) -> String {
    format!("atasira.box.{from}.{to}")
}

/// Where `service` publishes its events.
pub fn events(service: &str) -> String {
    format!("atasira.box.{service}.events")
}

/// The subject token that marks a request from a NATS publisher authenticated with a PAT:
/// `atasira.box.client.<token hash>.<to>` (five tokens, so never a Box's subject).
pub const CLIENT: &str = "client";

/// Who sent a request, as its subject says. In cluster mode NATS permissions make the
/// subject an identity: only a service may publish on `atasira.box.<service>.<to>`, and only
/// the holder of a PAT on `atasira.box.client.<its hash>.<to>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// One of atasira's processes (a service or the gateway).
    Service(&'static str),
    /// A NATS publisher, known by the SHA-256 (hex) of its PAT.
    Client { token_hash: String },
}

/// The origin of a request on `subject` addressed to `to`; `None` for any other subject.
pub fn origin(subject: &str, to: &str) -> Option<Origin> {
    let rest = subject.strip_prefix("atasira.box.")?;
    let from = rest.strip_suffix(to)?.strip_suffix('.')?;
    if let Some(hash) = from.strip_prefix("client.") {
        let valid = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        return valid.then(|| Origin::Client { token_hash: hash.to_owned() });
    }
    std::iter::once(GATEWAY).chain(SERVICES.iter().copied()).find(|s| *s == from).map(Origin::Service)
}

/// The subject on which `to` serves NATS publishers.
pub fn client_requests(to: &str) -> String {
    format!("atasira.box.{CLIENT}.*.{to}")
}

/// Which service publishes events of an aggregate type (R-ARCH-9); `None` for a type that
/// is not one of atasira's aggregates.
pub fn owner_of(aggregate_type: &str) -> Option<&'static str> {
    use atasira_domain::aggregates::types;
    Some(match aggregate_type {
        types::DRAFT | types::DRAFTS_SECURITY => DRAFTS,
        types::BOX | types::BOX_TYPE_NAMESPACE | types::REGISTRY_SECURITY => RUNTIME_REGISTRY,
        types::AUDIT_LEDGER | types::AUDIT_SECURITY => AUDIT,
        types::ACCESS | types::PROVISIONER_SECURITY => PROVISIONER,
        types::APPROVAL_SECURITY => APPROVAL,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_r_arch_2() {
        assert_eq!(request(GATEWAY, DRAFTS), "atasira.box.gateway.drafts");
        assert_eq!(request(APPROVAL, RUNTIME_REGISTRY), "atasira.box.approval.runtime-registry");
        assert_eq!(events(DRAFTS), "atasira.box.drafts.events");
    }

    #[test]
    fn the_origin_of_a_request_is_its_sender_token() {
        assert_eq!(origin("atasira.box.gateway.drafts", DRAFTS), Some(Origin::Service(GATEWAY)));
        assert_eq!(origin("atasira.box.approval.runtime-registry", RUNTIME_REGISTRY), Some(Origin::Service(APPROVAL)));
        let hash = "ab".repeat(32);
        assert_eq!(origin(&format!("atasira.box.client.{hash}.drafts"), DRAFTS), Some(Origin::Client { token_hash: hash.clone() }));
        // Anything else has no origin: a Box, a malformed hash, another addressee.
        assert_eq!(origin("atasira.box.my-box.drafts", DRAFTS), None);
        assert_eq!(origin("atasira.box.client.xyz.drafts", DRAFTS), None);
        assert_eq!(origin(&format!("atasira.box.client.{}.drafts", "AB".repeat(32)), DRAFTS), None);
        assert_eq!(origin("atasira.box.gateway.drafts", AUDIT), None);
        assert_eq!(origin("atasira.box.drafts", DRAFTS), None);
        assert_eq!(origin("other.box.gateway.drafts", DRAFTS), None);
    }

    #[test]
    fn every_aggregate_type_has_one_publisher_and_nothing_else_has_one() {
        for t in atasira_domain::aggregates::types::ALL {
            assert!(owner_of(t).is_some(), "{t}");
        }
        assert_eq!(owner_of("drafts"), None);
        assert_eq!(owner_of(""), None);
    }
}
