//! cqrs-es 0.5 aggregates. Each has `Services = ()` and a `handle` that only calls a pure
//! `decide(&state, command) -> Result<Vec<Event>, Error>` and writes the events; look-ups
//! (clock, ids, keys, file checks, configuration) happen before the command is built and
//! travel inside it.
//!
//! Event names are the catalog of R-ARCH-9; every event carries `event_version` "1".

pub mod access;
pub mod approval_keys;
pub mod assertion_keys;
pub mod audit_ledger;
pub mod binding;
pub mod boxes;
pub mod bundle;
pub mod draft;
pub mod namespace;
pub mod notification;
pub mod org_policy;
pub mod pat;
pub mod security;
pub mod webhook;
pub mod worker;

/// The aggregate types: the names the store, the subjects and the feeds share. Every
/// aggregate's `TYPE` is one of these; anything else is not an atasira aggregate.
pub mod types {
    pub const DRAFT: &str = "draft";
    pub const BOX: &str = "box";
    pub const BOX_TYPE_NAMESPACE: &str = "box_type_namespace";
    pub const ACCESS: &str = "access";
    pub const AUDIT_LEDGER: &str = "audit_ledger";
    /// The approval service's published public keys.
    pub const APPROVAL_KEYS: &str = "approval_keys";
    pub const APPROVAL_SECURITY: &str = "approval_security";
    pub const REGISTRY_SECURITY: &str = "registry_security";
    pub const DRAFTS_SECURITY: &str = "drafts_security";
    pub const AUDIT_SECURITY: &str = "audit_security";
    pub const PROVISIONER_SECURITY: &str = "provisioner_security";
    /// Personal access tokens, issued and revoked (appended by the gateway and the operator
    /// CLI, published by the audit service).
    pub const PAT: &str = "pat";
    /// Runtime Workers, one stream per Worker (launches and refused launches), owned by the
    /// runtime registry.
    pub const WORKER: &str = "worker";
    /// ConfigBundles, one stream per digest, owned by the runtime registry.
    pub const CONFIG_BUNDLE: &str = "config_bundle";
    /// Execution bindings, one stream per handle, owned by the provisioner (the execution
    /// host side).
    pub const EXECUTION_BINDING: &str = "execution_binding";
    /// Principal assertion keys, one type per signing process, one stream per key id: the
    /// gateway's (published by the audit service, like tokens: the gateway has no
    /// JetStream), approval's and the runtime registry's.
    pub const GATEWAY_ASSERTION_KEYS: &str = "gateway_assertion_keys";
    pub const APPROVAL_ASSERTION_KEYS: &str = "approval_assertion_keys";
    pub const REGISTRY_ASSERTION_KEYS: &str = "registry_assertion_keys";
    /// Webhooks approvers' announcements go to, one stream per webhook, owned by the audit
    /// service (R-NOTIFY-1).
    pub const WEBHOOK: &str = "webhook";
    /// A Box's notifications as the audit service delivered them (or not), one stream per
    /// notification, owned by the audit service (R-NOTIFY-1).
    pub const NOTIFICATION: &str = "notification";
    /// The organisation's policy, one stream, owned by the approval service (R-POLICY-1).
    pub const ORG_POLICY: &str = "org_policy";
    /// Every service's security violations (R-AUDIT-5), one type per refusing service.
    pub const SECURITY: &[&str] = &[APPROVAL_SECURITY, REGISTRY_SECURITY, DRAFTS_SECURITY, AUDIT_SECURITY, PROVISIONER_SECURITY];
    pub const ALL: &[&str] = &[
        DRAFT,
        BOX,
        BOX_TYPE_NAMESPACE,
        ACCESS,
        AUDIT_LEDGER,
        APPROVAL_KEYS,
        APPROVAL_SECURITY,
        REGISTRY_SECURITY,
        DRAFTS_SECURITY,
        AUDIT_SECURITY,
        PROVISIONER_SECURITY,
        PAT,
        WORKER,
        CONFIG_BUNDLE,
        EXECUTION_BINDING,
        GATEWAY_ASSERTION_KEYS,
        APPROVAL_ASSERTION_KEYS,
        REGISTRY_ASSERTION_KEYS,
        WEBHOOK,
        NOTIFICATION,
        ORG_POLICY,
    ];
}

/// Version of every event payload defined today; bump and upcast when a payload changes.
pub const EVENT_VERSION: &str = "1";

/// Implements `cqrs_es::Aggregate` by delegating to the aggregate's pure `decide`.
macro_rules! aggregate_via_decide {
    ($agg:ty, $type_name:expr, $cmd:ty, $event:ty, $err:ty) => {
        $crate::aggregates::aggregate_via_decide!(@aggregate $agg, $type_name, $cmd, $event, $err);

        impl cqrs_es::DomainEvent for $event {
            fn event_type(&self) -> String {
                self.name().to_owned()
            }
            fn event_version(&self) -> String {
                $crate::aggregates::EVENT_VERSION.to_owned()
            }
        }
    };
    // The `cqrs_es::Aggregate` impl alone (events shared by several aggregate types).
    (@aggregate $agg:ty, $type_name:expr, $cmd:ty, $event:ty, $err:ty) => {
        impl cqrs_es::Aggregate for $agg {
            const TYPE: &'static str = $type_name;
            type Command = $cmd;
            type Event = $event;
            type Error = $err;
            type Services = ();

            async fn handle(
                &mut self,
                command: Self::Command,
                _services: &Self::Services,
                sink: &cqrs_es::event_sink::EventSink<Self>,
            ) -> Result<(), Self::Error> {
                for event in self.decide(command)? {
                    sink.write(event, self).await;
                }
                Ok(())
            }

            fn apply(&mut self, event: Self::Event) {
                self.evolve(event);
            }
        }
    };
}
pub(crate) use aggregate_via_decide;

/// Aggregates that are one record under several aggregate types (one per owning service):
/// each newtype delegates `decide` and `evolve` to the record it wraps and implements
/// `cqrs_es::Aggregate` with its own type name.
macro_rules! record_aggregates {
    ($cmd:ty, $event:ty, $err:ty; $($agg:ident => $type_name:expr),+ $(,)?) => {$(
        impl $agg {
            pub fn decide(&self, c: $cmd) -> Result<Vec<$event>, $err> {
                self.0.decide(c)
            }
            pub fn evolve(&mut self, e: $event) {
                self.0.evolve(e)
            }
        }

        $crate::aggregates::aggregate_via_decide!(@aggregate $agg, $type_name, $cmd, $event, $err);
    )+};
}
pub(crate) use record_aggregates;

/// Test support: runs commands through the real `cqrs_es::Aggregate::handle` (not just
/// `decide`), so the wiring is covered too.
#[cfg(test)]
pub(crate) mod testing {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use cqrs_es::Aggregate;
    use cqrs_es::event_sink::EventSink;

    /// Drives a future that never waits on IO (our `handle` only locks an uncontended
    /// mutex) to completion without an async runtime.
    fn block_on<F: Future>(fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    /// given `events`, when `command`, then the result of `handle`.
    pub fn given_when<A: Aggregate<Services = ()>>(events: Vec<A::Event>, command: A::Command) -> Result<Vec<A::Event>, A::Error> {
        let mut aggregate = A::default();
        for event in events {
            aggregate.apply(event);
        }
        let sink = EventSink::<A>::default();
        block_on(async {
            aggregate.handle(command, &(), &sink).await?;
            Ok(sink.collect().await)
        })
    }
}
