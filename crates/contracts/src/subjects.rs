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

/// Which service publishes events of an aggregate type (R-ARCH-9); `None` for a type that
/// is not one of atasira's aggregates.
pub fn owner_of(aggregate_type: &str) -> Option<&'static str> {
    use atasira_domain::aggregates::types;
    Some(match aggregate_type {
        types::DRAFT => DRAFTS,
        types::BOX | types::BOX_TYPE_NAMESPACE | types::REGISTRY_SECURITY => RUNTIME_REGISTRY,
        types::AUDIT_LEDGER => AUDIT,
        types::ACCESS => PROVISIONER,
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
    fn every_aggregate_type_has_one_publisher_and_nothing_else_has_one() {
        for t in atasira_domain::aggregates::types::ALL {
            assert!(owner_of(t).is_some(), "{t}");
        }
        assert_eq!(owner_of("drafts"), None);
        assert_eq!(owner_of(""), None);
    }
}
