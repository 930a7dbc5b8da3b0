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

/// Where a process's store connection tells the others that it appended events (the
/// doorbell: the aggregate types, never an event; a woken process reads the store).
pub fn doorbell(identity: &str) -> String {
    format!("atasira.bell.{identity}")
}

/// Every process's doorbell: what each process listens to.
pub const DOORBELLS: &str = "atasira.bell.*";

/// The NATS account atasira's processes and NATS publishers share (`atasira nats-config`).
pub const ACCOUNT: &str = "ATASIRA";

/// Every process identity of cluster mode: each has its own NATS credentials.
pub const IDENTITIES: &[&str] = &[GATEWAY, DRAFTS, APPROVAL, PROVISIONER, RUNTIME_REGISTRY, AUDIT];

/// The requests that exist between atasira's processes, as (from, to): the only subjects
/// `request(from, to)` a process may publish. `tests/tidy.rs` checks that the code sends no
/// other.
pub const ROUTES: &[(&str, &str)] = &[
    (GATEWAY, DRAFTS),
    (GATEWAY, APPROVAL),
    (GATEWAY, RUNTIME_REGISTRY),
    (GATEWAY, AUDIT),
    (GATEWAY, PROVISIONER),
    // ReserveBoxType, ReleaseReservation, and the read-your-writes wait for activation.
    // Nobody asks approval for its keys: it publishes them as events in the store.
    (APPROVAL, RUNTIME_REGISTRY),
    // ConsumeBinding: CreateWorker claims the execution binding it was handed.
    (RUNTIME_REGISTRY, PROVISIONER),
];

/// The services a NATS publisher (a person or an agent with a PAT) may address, and
/// whether only an admin may.
pub const CLIENT_ROUTES: &[(&str, bool)] = &[(DRAFTS, false), (RUNTIME_REGISTRY, false), (AUDIT, true)];

/// The middle token of an execution host's subjects: `atasira.box.host.<name>.<service>`
/// (five tokens, like a NATS publisher's; no process is called that).
pub const HOST: &str = "host";

/// The services an execution host addresses: the registry (heartbeats, bundles, reports)
/// and the provisioner (resolving a binding).
pub const HOST_ROUTES: &[&str] = &[RUNTIME_REGISTRY, PROVISIONER];

/// A Box's channels (R-HOST-2, seed 000): `atasira.box.<box_type>.<channel>`. Only the
/// registry publishes them, for the host that runs a Worker of the Box: `heartbeat`, `log`
/// and `result` as the host reports them, `pause`, `resume` and `kill` as users ask, and
/// `escalation` when a Worker of a Box that escalates fails.
pub const CHANNELS: &[&str] = &["heartbeat", "log", "result", "pause", "resume", "kill", "escalation"];

/// Where the audit service announces decisions waiting for approvers (R-NOTIFY-1): pending
/// drafts and changes, tool calls waiting for a human, failed provisioning, escalations.
/// Admin NATS publishers may subscribe.
pub const APPROVERS: &str = "atasira.box.audit.approvers";

/// A Box's channel subject.
pub fn channel(box_type: &str, channel: &str) -> String {
    format!("atasira.box.{box_type}.{channel}")
}

/// Whether `name` may name an execution host: 1 to 32 lowercase letters, digits and `-`,
/// starting with a letter or digit (one subject token, no wildcard).
pub fn is_host_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().next().is_some_and(|b| b != b'-')
}

/// An execution host's request to `to`.
pub fn host_request(name: &str, to: &str) -> String {
    format!("atasira.box.{HOST}.{name}.{to}")
}

/// An execution host's reply inbox prefix.
pub fn host_inbox(name: &str) -> String {
    format!("_INBOX.{HOST}.{name}")
}

/// The reply inbox prefix of a NATS user of `atasira nats-config`: a process's, or an
/// execution host's (`host-<name>`).
pub fn inbox_of(identity: &str) -> String {
    match identity.strip_prefix("host-").filter(|name| is_host_name(name)) {
        Some(name) => host_inbox(name),
        None => inbox_prefix(identity),
    }
}

/// The permissions of a NATS user of `atasira nats-config`: a process's, the operator's,
/// or an execution host's (`host-<name>`).
pub fn permissions_of(identity: &str) -> Permissions {
    if identity == TRIGGER_LISTENER {
        return trigger_listener_permissions();
    }
    match identity.strip_prefix("host-").and_then(host_permissions) {
        Some(p) => p,
        None => permissions(identity),
    }
}

/// The NATS user of an execution host in `atasira nats-config` (`host-<name>.creds`).
pub fn host_identity(name: &str) -> String {
    format!("{HOST}-{name}")
}

/// The permissions of execution host `name`: its own requests to the registry and the
/// provisioner, and its own inbox. Nothing else: it publishes no channel (the registry does,
/// for the host that runs the Worker) and answers nothing. `None` for a bad name.
pub fn host_permissions(name: &str) -> Option<Permissions> {
    if !is_host_name(name) {
        return None;
    }
    Some(Permissions {
        publish: HOST_ROUTES.iter().map(|to| host_request(name, to)).collect(),
        subscribe: vec![format!("{}.>", host_inbox(name))],
        ..Permissions::default()
    })
}

/// The middle token of a NATS publisher's subjects. No process is called that, and a
/// client subject has five tokens where a Box subject has four.
pub const CLIENT: &str = "client";

/// The one-off operator identity `atasira nats-config` writes (`operator.creds`): the only
/// NATS user that may create, change, purge or delete streams and consumers. `atasira
/// nats-setup` uses it to create the events stream and the sentinel's consumer; no
/// process of the cluster holds it.
pub const OPERATOR: &str = "operator";

/// The whole JetStream API: the operator's alone.
pub const JETSTREAM_API: &str = "$JS.API.>";

/// The audit sentinel's durable pull consumer on the events stream (created by the
/// operator, read by the audit service).
pub const SENTINEL_CONSUMER: &str = "sentinel";

/// The JetStream API calls `identity`'s code makes, each on one named stream or consumer
/// (R-ARCH-13): every service looks the events stream up before it relays (its publishes
/// are acknowledged into its own inbox); the audit service also reads and acknowledges
/// the sentinel's consumer. Nobody but the operator may create, update, purge or delete a
/// stream or consumer, delete a message, or make the server deliver anywhere (a stream's
/// republish, mirror or sources, a push consumer's deliver subject).
pub fn jetstream_grants(identity: &str) -> Vec<String> {
    if identity == OPERATOR {
        return vec![JETSTREAM_API.to_owned()];
    }
    if !SERVICES.contains(&identity) {
        return Vec::new();
    }
    let mut grants = vec![format!("$JS.API.STREAM.INFO.{EVENTS_STREAM}")];
    if identity == AUDIT {
        grants.push(format!("$JS.API.CONSUMER.INFO.{EVENTS_STREAM}.{SENTINEL_CONSUMER}"));
        grants.push(format!("$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{SENTINEL_CONSUMER}"));
        grants.push(format!("$JS.ACK.{EVENTS_STREAM}.{SENTINEL_CONSUMER}.>"));
    }
    grants
}

/// The NATS user the runtime registry listens for `event` Boxes' messages as (R-TRIG-1):
/// its seed is in the registry's credentials file, beside the registry's own. A Box's
/// `trigger_event` topic is any subject outside atasira's and NATS's namespaces, so this
/// user may subscribe to anything but those ([`TRIGGER_LISTENER_DENY`]); it publishes
/// only answers into NATS publishers' inboxes (a publish sent as a request learns which
/// Workers it launched). It is not a process and makes no request.
pub const TRIGGER_LISTENER: &str = "triggers";

/// What the trigger listener may never hear: atasira's own subjects (requests carry
/// principal assertions), every reply inbox, and NATS's `$` namespaces (the auth callout's
/// requests carry publishers' tokens). A `trigger_event` topic is never in one of them
/// (`atasira_domain::manifest::validate_topic`).
pub const TRIGGER_LISTENER_DENY: &[&str] = &["atasira.>", "_INBOX.>", "$SYS.>", "$JS.>", "$JSC.>", "$SRV.>", "$KV.>", "$O.>", "$NRG.>", "$G.>"];

/// The permissions of the trigger listener.
pub fn trigger_listener_permissions() -> Permissions {
    Permissions {
        publish: vec![format!("{}.>", client_inbox("*"))],
        subscribe: vec![">".to_owned()],
        deny_subscribe: TRIGGER_LISTENER_DENY.iter().map(|s| (*s).to_owned()).collect(),
        allow_responses: false,
    }
}

/// The NATS services API (`$SRV.PING|INFO|STATS`), where every process registers.
pub const SERVICES_API: &str = "$SRV.>";

/// What an admin's tooling may ask the services API (discovery, R-ARCH-8).
pub const SERVICES_API_QUERIES: &[&str] = &["$SRV.PING", "$SRV.PING.>", "$SRV.INFO", "$SRV.INFO.>", "$SRV.STATS", "$SRV.STATS.>"];

/// Where nats-server asks the auth callout to authenticate a client (the gateway answers).
pub const AUTH_CALLOUT: &str = "$SYS.REQ.USER.AUTH";

/// Where nats-server expects the auth callout's answers.
pub const AUTH_CALLOUT_REPLIES: &str = "$SYS._INBOX.>";

/// The reply inbox prefix of a process identity: its replies arrive below it, and nobody
/// else may subscribe there.
pub fn inbox_prefix(identity: &str) -> String {
    format!("_INBOX.{identity}")
}

/// A NATS publisher's request to `to`; `token_hash` is the SHA-256 (hex) of its PAT.
pub fn client_request(token_hash: &str, to: &str) -> String {
    format!("atasira.box.{CLIENT}.{token_hash}.{to}")
}

/// A NATS publisher's reply inbox prefix.
pub fn client_inbox(token_hash: &str) -> String {
    format!("_INBOX.{CLIENT}.{token_hash}")
}

/// Whether `token_hash` looks like what `client_request` and `client_permissions` expect:
/// 64 lowercase hex digits (so it is one subject token and no wildcard).
pub fn is_token_hash(token_hash: &str) -> bool {
    token_hash.len() == 64 && token_hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The subjects `service` listens on for requests: from the processes (and Boxes) on
/// `atasira.box.<from>.<service>`, and from NATS publishers on
/// `atasira.box.client.<hash>.<service>` when they may address it.
pub fn listen_subjects(service: &str) -> Vec<String> {
    let mut subjects = vec![request("*", service)];
    if CLIENT_ROUTES.iter().any(|(to, _)| *to == service) {
        subjects.push(client_request("*", service));
    }
    if HOST_ROUTES.contains(&service) {
        subjects.push(host_request("*", service));
    }
    subjects
}

/// What one NATS user may do: the subjects (wildcards allowed) it may publish to and
/// subscribe to, what of the latter it may never hear (`deny_subscribe`, which wins), and
/// whether it may also publish on the reply subject of any request it receives
/// (`allow_responses`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    pub deny_subscribe: Vec<String>,
    pub allow_responses: bool,
}

/// The permissions of a process identity (R-ARCH-10), derived from `ROUTES`: it publishes
/// its own requests, its own events (services relay them), its own doorbell and the
/// JetStream API calls its code makes (`jetstream_grants`); it listens on its own
/// subjects, every doorbell, the services API and its own inbox.
///
/// It answers requests by publishing into its callers' inboxes: those of the processes
/// routed to it, and those of NATS publishers (every process answers an admin's services
/// API queries; services in `CLIENT_ROUTES` answer their requests too). Never with
/// `allow_responses`: nats-server lets a responder publish on whatever reply subject a
/// request names (even one its deny list names), so a NATS publisher could make a service
/// "answer" on `atasira.box.approval.runtime-registry` and speak as approval. The gateway
/// also answers the auth callout.
///
/// The operator may use the whole JetStream API and hear its answers, nothing else.
///
/// An unknown identity may do nothing (empty lists).
pub fn permissions(identity: &str) -> Permissions {
    if identity == OPERATOR {
        return Permissions { publish: jetstream_grants(OPERATOR), subscribe: vec![format!("{}.>", inbox_prefix(OPERATOR))], ..Permissions::default() };
    }
    if !IDENTITIES.contains(&identity) {
        return Permissions::default();
    }
    let mut publish: Vec<String> = ROUTES.iter().filter(|(from, _)| *from == identity).map(|(from, to)| request(from, to)).collect();
    publish.extend(ROUTES.iter().filter(|(_, to)| *to == identity).map(|(from, _)| format!("{}.>", inbox_prefix(from))));
    publish.push(format!("{}.>", client_inbox("*")));
    if HOST_ROUTES.contains(&identity) {
        publish.push(format!("{}.>", host_inbox("*")));
    }
    if identity == RUNTIME_REGISTRY {
        publish.extend(CHANNELS.iter().map(|c| channel("*", c)));
    }
    if identity == AUDIT {
        publish.push(APPROVERS.to_owned());
    }
    let mut subscribe = listen_subjects(identity);
    if SERVICES.contains(&identity) {
        publish.push(events(identity));
        publish.extend(jetstream_grants(identity));
    }
    publish.push(doorbell(identity));
    subscribe.push(DOORBELLS.to_owned());
    subscribe.push(SERVICES_API.to_owned());
    subscribe.push(format!("{}.>", inbox_prefix(identity)));
    if identity == GATEWAY {
        subscribe.push(AUTH_CALLOUT.to_owned());
        publish.push(AUTH_CALLOUT_REPLIES.to_owned());
    }
    Permissions { publish, subscribe, ..Permissions::default() }
}

/// The permissions of a NATS publisher whose PAT hashes to `token_hash`: requests on its
/// own client subjects to the services in `CLIENT_ROUTES` (audit for admins only), the
/// services API's discovery queries and the Boxes' channels for admins, its own inbox,
/// and the `trigger_topics` of the `event` Boxes it may start (those that are not a topic
/// of a Box's are left out). It answers nothing.
/// `None` when `token_hash` is not a token hash (see `is_token_hash`).
pub fn client_permissions(token_hash: &str, role_is_admin: bool, trigger_topics: &[String]) -> Option<Permissions> {
    if !is_token_hash(token_hash) {
        return None;
    }
    let mut publish: Vec<String> =
        CLIENT_ROUTES.iter().filter(|(_, admin_only)| role_is_admin || !admin_only).map(|(to, _)| client_request(token_hash, to)).collect();
    let mut subscribe = vec![format!("{}.>", client_inbox(token_hash))];
    if role_is_admin {
        publish.extend(SERVICES_API_QUERIES.iter().map(|s| (*s).to_owned()));
        // Admins read every Worker: they may follow the Boxes' channels; and they hear
        // what waits for approvers.
        subscribe.extend(CHANNELS.iter().map(|c| channel("*", c)));
        subscribe.push(APPROVERS.to_owned());
    }
    publish.extend(trigger_topics.iter().filter(|t| atasira_domain::manifest::validate_topic(t).is_ok()).cloned());
    Some(Permissions { publish, subscribe, ..Permissions::default() })
}

impl Permissions {
    /// Whether these permissions let a client publish on `subject` (a subject without
    /// wildcards), not counting replies under `allow_responses`.
    pub fn may_publish(&self, subject: &str) -> bool {
        self.publish.iter().any(|p| covers(p, subject))
    }

    /// Whether these permissions let a client subscribe to `subject` (wildcards allowed:
    /// every subject it matches must be allowed).
    pub fn may_subscribe(&self, subject: &str) -> bool {
        self.subscribe.iter().any(|p| covers(p, subject)) && !self.deny_subscribe.iter().any(|d| overlaps(d, subject))
    }
}

/// Whether every subject that `subject` matches also matches `pattern`, with NATS
/// wildcards (`*` one token, `>` one or more trailing tokens) on both sides.
pub fn covers(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some(_), Some(">")) => return false,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b && b != "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether some subject matches both `a` and `b` (NATS wildcards on both sides).
pub fn overlaps(a: &str, b: &str) -> bool {
    let mut a = a.split('.');
    let mut b = b.split('.');
    loop {
        match (a.next(), b.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == y || x == "*" || y == "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Who sent a request, as its subject says. In cluster mode NATS permissions make the
/// subject an identity: only a service may publish on `atasira.box.<service>.<to>`, and only
/// the holder of a PAT on `atasira.box.client.<its hash>.<to>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// One of atasira's processes (a service or the gateway).
    Service(&'static str),
    /// A NATS publisher, known by the SHA-256 (hex) of its PAT.
    Client { token_hash: String },
    /// An execution host, known by its name.
    Host { name: String },
}

/// The origin of a request on `subject` addressed to `to`; `None` for any other subject.
pub fn origin(subject: &str, to: &str) -> Option<Origin> {
    let rest = subject.strip_prefix("atasira.box.")?;
    let from = rest.strip_suffix(to)?.strip_suffix('.')?;
    if let Some(hash) = from.strip_prefix(CLIENT).and_then(|rest| rest.strip_prefix('.')) {
        return is_token_hash(hash).then(|| Origin::Client { token_hash: hash.to_owned() });
    }
    if let Some(name) = from.strip_prefix(HOST).and_then(|rest| rest.strip_prefix('.')) {
        return (is_host_name(name) && HOST_ROUTES.contains(&to)).then(|| Origin::Host { name: name.to_owned() });
    }
    IDENTITIES.iter().copied().find(|s| *s == from).map(Origin::Service)
}

/// Which service publishes events of an aggregate type (R-ARCH-9); `None` for a type that
/// is not one of atasira's aggregates.
pub fn owner_of(aggregate_type: &str) -> Option<&'static str> {
    use atasira_domain::aggregates::types;
    Some(match aggregate_type {
        types::DRAFT | types::DRAFTS_SECURITY => DRAFTS,
        types::BOX | types::BOX_TYPE_NAMESPACE | types::REGISTRY_SECURITY | types::WORKER | types::CONFIG_BUNDLE | types::REGISTRY_ASSERTION_KEYS => {
            RUNTIME_REGISTRY
        }
        // Token events and the gateway's assertion keys are appended by the gateway (tokens
        // also by the operator CLI; the token table is the gateway's), and published by the
        // audit service: the gateway has no JetStream.
        types::AUDIT_LEDGER | types::AUDIT_SECURITY | types::PAT | types::GATEWAY_ASSERTION_KEYS | types::WEBHOOK | types::NOTIFICATION => AUDIT,
        types::ACCESS | types::PROVISIONER_SECURITY | types::EXECUTION_BINDING => PROVISIONER,
        types::APPROVAL_KEYS | types::APPROVAL_SECURITY | types::APPROVAL_ASSERTION_KEYS | types::ORG_POLICY => APPROVAL,
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

    const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// The identities whose permissions allow publishing `subject`.
    fn publishers(subject: &str) -> Vec<&'static str> {
        IDENTITIES.iter().copied().filter(|i| permissions(i).may_publish(subject)).collect()
    }

    /// The identities whose permissions allow subscribing to `subject`.
    fn subscribers(subject: &str) -> Vec<&'static str> {
        IDENTITIES.iter().copied().filter(|i| permissions(i).may_subscribe(subject)).collect()
    }

    #[test]
    fn wildcards_cover_what_nats_would_match() {
        assert!(covers("atasira.box.*.drafts", "atasira.box.gateway.drafts"));
        assert!(covers("atasira.box.*.drafts", "atasira.box.*.drafts"));
        assert!(!covers("atasira.box.*.drafts", "atasira.box.client.h.drafts"));
        assert!(!covers("atasira.box.*.drafts", "atasira.box.>"));
        assert!(!covers("atasira.box.gateway.drafts", "atasira.box.*.drafts"));
        assert!(covers("_INBOX.drafts.>", "_INBOX.drafts.abc.1"));
        assert!(!covers("_INBOX.drafts.>", "_INBOX.drafts"));
        assert!(!covers("_INBOX.drafts.>", "_INBOX.>"));
        assert!(covers("$JS.API.>", "$JS.API.STREAM.PURGE.ATASIRA_EVENTS"));
        assert!(covers(">", "anything.at.all"));
        assert!(!covers("a.b", "a.b.c"));
        assert!(!covers("a.b.c", "a.b"));
    }

    #[test]
    fn only_approval_reserves_and_releases_and_only_approval_answers_approval_subjects() {
        // R-ARCH-10, issue 8: ReserveBoxType/ReleaseReservation travel on this subject.
        assert_eq!(publishers("atasira.box.approval.runtime-registry"), [APPROVAL]);
        assert_eq!(subscribers("atasira.box.*.approval"), [APPROVAL]);
        assert_eq!(subscribers("atasira.box.runtime-registry.approval"), [APPROVAL]);
        // Nobody asks approval anything but the gateway: the registry reads approval's
        // public keys from the store, so no NATS responder can offer it keys.
        assert!(publishers("atasira.box.runtime-registry.approval").is_empty());
        assert_eq!(publishers("atasira.box.gateway.approval"), [GATEWAY]);
        for service in SERVICES {
            assert_eq!(subscribers(&request("*", service)), [*service], "only {service} listens on its subjects");
            assert_eq!(publishers(&request(GATEWAY, service)), [GATEWAY], "only the gateway speaks as the gateway");
        }
    }

    #[test]
    fn only_a_service_publishes_its_own_events_and_only_services_use_jetstream() {
        for service in SERVICES {
            assert_eq!(publishers(&events(service)), [*service]);
        }
        assert!(publishers(&events(GATEWAY)).is_empty());
        assert!(publishers("atasira.box.nats-publisher.events").is_empty());
        assert_eq!(publishers("$JS.API.STREAM.INFO.ATASIRA_EVENTS"), SERVICES, "the gateway has no JetStream");
        assert!(!permissions(GATEWAY).may_publish("$JS.ACK.ATASIRA_EVENTS.c.1.1.1.1.1"));
    }

    #[test]
    fn given_any_process_identity_then_it_may_not_change_streams_or_consumers_or_make_the_server_deliver() {
        // R-ARCH-13: only the operator manages JetStream; a process calls what it reads.
        let refused = [
            "$JS.API.STREAM.CREATE.ATASIRA_EVENTS",
            "$JS.API.STREAM.CREATE.EVIL",
            "$JS.API.STREAM.UPDATE.ATASIRA_EVENTS",
            "$JS.API.STREAM.DELETE.ATASIRA_EVENTS",
            "$JS.API.STREAM.PURGE.ATASIRA_EVENTS",
            "$JS.API.STREAM.MSG.DELETE.ATASIRA_EVENTS",
            "$JS.API.STREAM.MSG.GET.ATASIRA_EVENTS",
            "$JS.API.STREAM.LIST",
            "$JS.API.STREAM.NAMES",
            "$JS.API.STREAM.INFO.EVIL",
            "$JS.API.CONSUMER.CREATE.ATASIRA_EVENTS",
            "$JS.API.CONSUMER.CREATE.ATASIRA_EVENTS.sentinel",
            "$JS.API.CONSUMER.CREATE.ATASIRA_EVENTS.push.atasira.box.*.events",
            "$JS.API.CONSUMER.DURABLE.CREATE.ATASIRA_EVENTS.push",
            "$JS.API.CONSUMER.DELETE.ATASIRA_EVENTS.sentinel",
            "$JS.API.CONSUMER.MSG.NEXT.ATASIRA_EVENTS.other",
            "$JS.API.CONSUMER.MSG.NEXT.EVIL.sentinel",
            "$JS.API.CONSUMER.PAUSE.ATASIRA_EVENTS.sentinel",
            "$JS.API.DIRECT.GET.ATASIRA_EVENTS",
            "$JS.API.ACCOUNT.PURGE.ATASIRA",
            "$JS.API.META.LEADER.STEPDOWN",
            "$JS.ACK.ATASIRA_EVENTS.other.1.1.1.1.1",
        ];
        for subject in refused {
            assert!(publishers(subject).is_empty(), "{subject}: {:?}", publishers(subject));
        }
        assert_eq!(publishers("$JS.API.CONSUMER.MSG.NEXT.ATASIRA_EVENTS.sentinel"), [AUDIT]);
        assert_eq!(publishers("$JS.ACK.ATASIRA_EVENTS.sentinel.1.1.1.1.1"), [AUDIT]);
        for identity in IDENTITIES {
            assert!(!permissions(identity).may_subscribe("$JS.API.>") && !permissions(identity).may_subscribe("$JS.EVENT.>"));
        }
        let operator = permissions(OPERATOR);
        assert!(operator.may_publish("$JS.API.STREAM.CREATE.ATASIRA_EVENTS") && operator.may_publish("$JS.API.CONSUMER.CREATE.ATASIRA_EVENTS.sentinel"));
        assert!(!operator.may_publish(&request(GATEWAY, APPROVAL)) && !operator.may_publish(&events(DRAFTS)), "the operator speaks for no process");
        assert_eq!(operator.subscribe, ["_INBOX.operator.>"]);
        assert!(!IDENTITIES.contains(&OPERATOR), "no process runs as the operator");
    }

    #[test]
    fn inboxes_are_private_and_nobody_listens_on_everything() {
        for identity in IDENTITIES {
            let prefix = inbox_prefix(identity);
            assert_eq!(subscribers(&format!("{prefix}.x.1")), [*identity]);
        }
        assert!(subscribers("atasira.box.>").is_empty());
        assert!(subscribers("_INBOX.>").is_empty());
        assert!(subscribers(&format!("{}.x", client_inbox(HASH))).is_empty());
        assert!(subscribers(">").is_empty());
        assert_eq!(subscribers(AUTH_CALLOUT), [GATEWAY]);
        assert_eq!(subscribers("$SRV.PING"), IDENTITIES);
        assert!(publishers("$SRV.PING").is_empty(), "processes do not ping each other");
    }

    #[test]
    fn replies_go_only_to_the_callers_inboxes() {
        // allow_responses would let a request name any reply subject, e.g. a request
        // subject of another service, and have the responder publish there.
        for identity in IDENTITIES {
            assert!(!permissions(identity).allow_responses, "{identity}");
        }
        for (from, to) in ROUTES {
            assert!(permissions(to).may_publish(&format!("{}.ab.1", inbox_prefix(from))), "{to} answers {from}");
        }
        assert_eq!(publishers("_INBOX.runtime-registry.ab.1"), [PROVISIONER], "the registry asks only the provisioner (to claim a binding)");
        assert_eq!(publishers("_INBOX.approval.ab.1"), [RUNTIME_REGISTRY]);
        assert!(publishers("_INBOX.drafts.ab.1").is_empty(), "drafts asks nobody anything");
        assert_eq!(publishers(&format!("{}.ab.1", client_inbox(HASH))), IDENTITIES, "every process answers an admin's discovery");
        assert_eq!(publishers("$SYS._INBOX.srv.1"), [GATEWAY], "the auth callout's answers");
        assert_eq!(publishers("_INBOX.gateway.ab.1"), [DRAFTS, APPROVAL, PROVISIONER, RUNTIME_REGISTRY, AUDIT], "every service answers the gateway");
    }

    #[test]
    fn every_route_is_a_permission_and_nothing_else_is_a_request() {
        for (from, to) in ROUTES {
            assert_eq!(publishers(&request(from, to)), [*from]);
            assert!(permissions(to).may_subscribe(&request(from, to)));
        }
        for from in IDENTITIES {
            for to in IDENTITIES {
                let allowed = ROUTES.contains(&(*from, *to));
                assert_eq!(permissions(from).may_publish(&request(from, to)), allowed, "{from} -> {to}");
            }
        }
        assert_eq!(permissions("nats-publisher"), Permissions::default(), "an unknown identity may do nothing");
    }

    #[test]
    fn a_client_reaches_only_its_own_subjects() {
        let member = client_permissions(HASH, false, &[]).expect("a token hash");
        assert_eq!(member.publish, [client_request(HASH, DRAFTS), client_request(HASH, RUNTIME_REGISTRY)]);
        assert_eq!(member.subscribe, [format!("_INBOX.client.{HASH}.>")]);
        assert!(!member.allow_responses);
        let admin = client_permissions(HASH, true, &[]).expect("a token hash");
        assert!(admin.may_publish(&client_request(HASH, AUDIT)));
        assert!(admin.may_publish("$SRV.PING") && admin.may_publish("$SRV.INFO.drafts"));
        assert!(admin.may_subscribe("atasira.box.release-notes.log") && !member.may_subscribe("atasira.box.release-notes.log"), "admins follow channels");
        assert!(!admin.may_publish("atasira.box.release-notes.log") && !admin.may_subscribe("atasira.box.gateway.approval"));
        assert!(!member.may_publish(&client_request(HASH, AUDIT)) && !member.may_publish("$SRV.PING"));
        let other = "f".repeat(64);
        for p in [&member, &admin] {
            assert!(!p.may_publish(&client_request(&other, DRAFTS)), "another client's subject");
            assert!(!p.may_subscribe(&format!("{}.>", client_inbox(&other))));
            assert!(!p.may_publish("$JS.API.STREAM.PURGE.ATASIRA_EVENTS"));
            assert!(!p.may_subscribe("$JS.API.>") && !p.may_subscribe("atasira.box.>"));
            assert!(!p.may_publish(&client_request(HASH, APPROVAL)) && !p.may_publish(&request(APPROVAL, RUNTIME_REGISTRY)));
            for service in SERVICES {
                assert!(!p.may_publish(&request(GATEWAY, service)) && !p.may_publish(&events(service)));
                assert!(!p.may_subscribe(&request("*", service)));
            }
        }
        assert_eq!(client_permissions("*", true, &[]), None);
        assert_eq!(client_permissions(&format!("{}.x", &HASH[2..]), true, &[]), None);
        assert_eq!(client_permissions(&HASH.to_uppercase(), false, &[]), None);
    }

    #[test]
    fn r_trig_1_a_publisher_may_publish_on_the_topics_granted_and_only_those() {
        let topics = vec!["sales.csv.arrived".to_owned(), "atasira.box.gateway.approval".to_owned(), "x.*".to_owned(), "_INBOX.x".to_owned()];
        let member = client_permissions(HASH, false, &topics).expect("a token hash");
        assert!(member.may_publish("sales.csv.arrived"));
        // What is not a topic a Box may declare is never granted, whatever the caller says.
        assert!(!member.may_publish("atasira.box.gateway.approval") && !member.may_publish("x.y") && !member.may_publish("_INBOX.x"));
        assert!(!member.may_publish("sales.csv.other"));
    }

    #[test]
    fn r_trig_1_the_trigger_listener_hears_topics_and_nothing_of_atasira_or_nats() {
        let p = permissions_of(TRIGGER_LISTENER);
        assert!(p.may_subscribe("sales.csv.arrived") && p.may_subscribe("orders.new"));
        for secret in [
            "atasira.box.gateway.approval",
            "atasira.box.*.events",
            "_INBOX.gateway.x",
            "_INBOX.client.h.x",
            AUTH_CALLOUT,
            "$JS.API.STREAM.INFO.X",
            "$SRV.PING",
            ">",
            "*.>",
        ] {
            assert!(!p.may_subscribe(secret), "{secret}");
        }
        // It answers publishers' requests, and publishes nothing else.
        assert!(p.may_publish(&format!("{}.x", client_inbox(HASH))));
        for subject in
            ["sales.csv.arrived", &request(RUNTIME_REGISTRY, PROVISIONER), &events(RUNTIME_REGISTRY), "$JS.API.STREAM.INFO.ATASIRA_EVENTS", "_INBOX.gateway.x"]
        {
            assert!(!p.may_publish(subject), "{subject}");
        }
        assert!(!IDENTITIES.contains(&TRIGGER_LISTENER) && !SERVICES.contains(&TRIGGER_LISTENER));
    }

    #[test]
    fn client_subjects_never_collide_with_process_or_box_subjects() {
        // A Box subject has four tokens; a client subject five.
        assert_eq!(client_request(HASH, DRAFTS).split('.').count(), 5);
        assert!(!covers(&request("*", DRAFTS), &client_request(HASH, DRAFTS)));
        assert!(!IDENTITIES.contains(&CLIENT));
        assert_eq!(listen_subjects(DRAFTS), ["atasira.box.*.drafts", "atasira.box.client.*.drafts"]);
        assert_eq!(listen_subjects(APPROVAL), ["atasira.box.*.approval"]);
        assert!(covers(&listen_subjects(AUDIT)[1], &client_request(HASH, AUDIT)));
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
    fn r_host_2_a_host_speaks_only_as_itself_and_only_the_registry_publishes_channels() {
        let a = host_permissions("host-a").expect("a host name");
        assert_eq!(a.publish, ["atasira.box.host.host-a.runtime-registry", "atasira.box.host.host-a.provisioner"]);
        assert_eq!(a.subscribe, ["_INBOX.host.host-a.>"]);
        assert!(!a.allow_responses);
        for subject in [
            "atasira.box.host.host-b.runtime-registry",
            "atasira.box.release-notes.log",
            "atasira.box.release-notes.heartbeat",
            "atasira.box.release-notes.result",
            "atasira.box.gateway.runtime-registry",
            "atasira.box.host.host-a.approval",
            "atasira.box.host.host-a.drafts",
            "$JS.API.STREAM.INFO.ATASIRA_EVENTS",
        ] {
            assert!(!a.may_publish(subject), "{subject}");
        }
        assert!(!a.may_subscribe("_INBOX.host.host-b.x") && !a.may_subscribe("atasira.box.>"));
        for c in CHANNELS {
            assert_eq!(publishers(&channel("release-notes", c)), [RUNTIME_REGISTRY], "{c}");
        }
        assert_eq!(publishers("_INBOX.host.host-a.x.1"), [PROVISIONER, RUNTIME_REGISTRY], "the services a host asks answer it");
        for bad in ["", "Host", "a.b", "*", ">", "-a", &"a".repeat(33)] {
            assert!(host_permissions(bad).is_none(), "{bad:?}");
        }
        assert_eq!(origin("atasira.box.host.host-a.runtime-registry", RUNTIME_REGISTRY), Some(Origin::Host { name: "host-a".into() }));
        assert_eq!(origin("atasira.box.host.host-a.drafts", DRAFTS), None, "a host addresses the registry and the provisioner only");
        assert_eq!(origin("atasira.box.host.A.provisioner", PROVISIONER), None);
        assert_eq!(listen_subjects(PROVISIONER), ["atasira.box.*.provisioner", "atasira.box.host.*.provisioner"]);
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
