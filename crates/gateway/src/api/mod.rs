//! The HTTP shapes of the API: every request and response body, owned by the gateway and
//! described in the OpenAPI document by these types (`ToSchema`).
//!
//! The services answer over the bus with typed protobuf replies; `from_wire.rs` turns each
//! into its HTTP type, one `TryFrom` per (reply, HTTP type), and nowhere else.

use std::collections::BTreeMap;

use atasira_domain::assertion::{Binding, PayloadDigest, PrincipalAssertion};
use atasira_domain::box_type::{BOX_TYPE_PATTERN, RESERVED_BOX_TYPES};
use atasira_domain::{FieldError, OSOperation};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AdditionalProperties, ArrayBuilder, Object, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};

/// Text that requests may carry: anything but NUL (which PostgreSQL cannot store, so the
/// gateway refuses it in every request; see `extract.rs`).
pub const NUL_FREE: &str = r"^[^\u0000]*$";

mod audit;
mod auth;
mod boxes;
mod drafts;
mod edits;
mod errors;
mod events;
mod manifest;
mod policies;
mod requests;
mod schemas;
mod tokens;
mod webhooks;
mod workers;

pub use audit::*;
pub use auth::*;
pub use boxes::*;
pub use drafts::*;
pub use edits::*;
pub use errors::*;
pub use events::*;
pub use manifest::*;
pub use policies::*;
pub use requests::*;
pub(crate) use schemas::*;
pub use tokens::*;
pub use webhooks::*;
pub use workers::*;

#[cfg(test)]
mod edit_tests {
    use super::CRON_PATTERN;

    #[test]
    fn the_documented_cron_form_is_always_a_valid_schedule() {
        // R-MAN-5: every expression of the form the OpenAPI document promises is taken:
        // per field `*`, `*/n` (minute, hour) or one value in the field's range. The fields
        // are independent, so each field's every alternative is tried with `*` elsewhere.
        let star = || std::iter::once("*".to_owned());
        let steps = |max: u32| (1..=max).map(|n| format!("*/{n}"));
        let values = |lo: u32, hi: u32| (lo..=hi).map(|n| n.to_string());
        let fields: [(Vec<String>, &str); 5] = [
            (star().chain(steps(59)).chain(values(0, 59)).collect(), r"(\*|\*/([1-9]|[1-5][0-9])|[0-9]|[1-5][0-9])"),
            (star().chain(steps(23)).chain(values(0, 23)).collect(), r"(\*|\*/([1-9]|1[0-9]|2[0-3])|[0-9]|1[0-9]|2[0-3])"),
            (star().chain(values(1, 31)).collect(), r"(\*|[1-9]|[12][0-9]|3[01])"),
            (star().chain(values(1, 12)).collect(), r"(\*|[1-9]|1[0-2])"),
            (star().chain(values(0, 6)).collect(), r"(\*|[0-6])"),
        ];
        let documented = fields.iter().map(|(_, p)| *p).collect::<Vec<_>>().join(" ");
        assert_eq!(CRON_PATTERN, format!("^$|^{documented}$"), "the pattern states exactly these fields");
        for (i, (alternatives, _)) in fields.iter().enumerate() {
            for value in alternatives {
                let mut parts = ["*"; 5];
                parts[i] = value;
                let expr = parts.join(" ");
                assert_eq!(atasira_domain::manifest::validate_cron(&expr), Ok(()), "{expr}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_assertion_request_names_one_request_or_every_field_at_fault() {
        // R-AUTH-5: subject, message type and payload digest are required and checked
        let digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let ok = AssertionRequest {
            subject: "atasira.box.gateway.drafts".into(),
            message_type: "atasira.v1.ListPendingDrafts".into(),
            payload_sha256: digest.into(),
            correlation_id: Some("c1".into()),
            idempotency_key: None,
        };
        let binding = ok.binding().expect("valid");
        assert_eq!(
            (binding.subject.as_str(), binding.payload_sha256.to_hex().as_str(), binding.correlation_id.as_str()),
            ("atasira.box.gateway.drafts", digest, "c1")
        );
        for sender in std::iter::once(atasira_contracts::subjects::GATEWAY).chain(atasira_contracts::subjects::SERVICES.iter().copied()) {
            for to in atasira_contracts::subjects::SERVICES {
                let r = AssertionRequest { subject: format!("atasira.box.{sender}.{to}"), correlation_id: None, ..ok.clone() };
                assert!(r.binding().is_ok(), "{}", r.subject);
            }
        }
        let keys = |r: &AssertionRequest| r.binding().expect_err("refused").into_iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(keys(&AssertionRequest::default()), ["subject", "message_type", "payload_sha256"]);
        for subject in [
            "atasira.box.gateway.gateway",
            "atasira.box.client.drafts",
            "atasira.box.someone.drafts",
            "atasira.box.*.drafts",
            "atasira.box.gateway.drafts.x",
            "x",
        ] {
            assert_eq!(keys(&AssertionRequest { subject: subject.into(), ..ok.clone() }), ["subject"], "{subject}");
        }
        for message_type in
            ["ListPendingDrafts", "atasira.v1.", "atasira.v1.listPending", "atasira.v1.List.Pending", &format!("atasira.v1.A{}", "a".repeat(100))]
        {
            assert_eq!(keys(&AssertionRequest { message_type: message_type.into(), ..ok.clone() }), ["message_type"], "{message_type}");
        }
        for payload_sha256 in ["", "e3b0", &digest.to_uppercase(), &format!("{digest}00"), &"z".repeat(64)] {
            assert_eq!(keys(&AssertionRequest { payload_sha256: payload_sha256.into(), ..ok.clone() }), ["payload_sha256"], "{payload_sha256}");
        }
        // the envelope's idempotency key is bound too: visible ASCII, at most 255
        let keyed = AssertionRequest { idempotency_key: Some("retry-1".into()), ..ok.clone() };
        assert_eq!(keyed.binding().expect("valid").idempotency_key, "retry-1");
        assert_eq!(ok.binding().expect("valid").idempotency_key, "");
        for key in ["a b", "é", &"k".repeat(256)] {
            assert_eq!(keys(&AssertionRequest { idempotency_key: Some(key.into()), ..ok.clone() }), ["idempotency_key"], "{key}");
        }
    }

    /// Reading the API's JSON into the HTTP type and writing it again changes nothing.
    fn same<T: DeserializeOwned + Serialize>(value: Value) {
        let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"));
        assert_eq!(serde_json::to_value(typed).expect("serializes"), value);
    }

    fn manifest() -> Value {
        json!({"box_type": "sales", "version": "1.0.0", "name": "", "description": "", "capabilities": [], "agent_kind": "worker",
            "resource_limits": {"cpu": 2}, "tool_policies": {}, "config_defaults": {"k": [1, "x"]}, "tools": ["Bash"], "os_operations": ["shell:exec"],
            "file_access": [], "network": "filtered", "url_allowlist": ["https://a"], "allowed_apps": [], "dangerous_tool_overrides": {"Bash": true},
            "trigger_type": "manual", "trigger_schedule": "", "trigger_event": "", "purpose": "p", "prohibited_actions": [],
            "loop_control": {"max_iterations": 30, "timeout_s": 300.0, "escalate_on_failure": true},
            "business_procedure": [{"step": 1, "description": "d", "tool": "t", "args_schema": {"a": "{k}"}}], "outputs": [],
            "llm": {"provider": "x", "min_tier": 2},
            "required_access": [{"type": "git_remote", "url": "u"}, {"type": "ssh_target", "host": "h", "user": "u", "port": 22},
                {"type": "netrc_entry", "machine": "m", "login": "l", "vault": "v", "item": "i"}],
            "credentials": {"allowed_vaults": ["v"], "token_env_var": ""},
            "shell": {"allowed_commands": [], "allowed_cwd": [], "require_approval_outside_allowlist": true},
            "notify": {"email": {"vault": "v", "item": "i", "recipients": [], "broadcast": false}},
            "browser": {"approval_required_selectors": [], "approval_required_text_patterns": []}})
    }

    fn draft(decision: Value, status: &str) -> Value {
        json!({"draft_id": "d", "box_type": "sales", "name": "", "purpose": "p", "os_operations": ["shell:exec"], "tools": [], "url_allowlist": [],
            "prohibited": [], "over_limit": true, "over_limit_ops": ["shell:exec"], "over_limit_tools": [], "warnings": ["w"], "requested_by": "agent",
            "status": status, "created_at": "2026-12-01T11:27:26.695062222Z", "network": "none", "file_access": [], "allowed_apps": [],
            "required_access": [], "decision": decision, "box_id": null, "kind": "new", "version": "1.0.0", "added": [], "removed": [],
            "approvals": [], "approvals_required": 1, "revision": null, "policy": null})
    }

    #[test]
    fn drafts_read_and_write_unchanged() {
        let at = "2026-12-01T11:27:27.333043491Z";
        for (decision, status) in [
            (Value::Null, "pending_approval"),
            (json!({"by": "admin", "at": at, "approved": true}), "approved"),
            (json!({"by": "admin", "at": at, "approved": false, "reason": "no"}), "rejected"),
            (json!({"withdrawn_by": "agent", "at": at}), "withdrawn"),
            (json!({"at": at}), "expired"),
        ] {
            same::<DraftSummary>(draft(decision.clone(), status));
            let mut detail = draft(decision, status);
            detail["manifest"] = manifest();
            same::<DraftDetail>(detail);
        }
        same::<Approved>(json!({"draft_id": "d", "status": "active", "box_id": "b", "box_type": "sales", "approved_by": "admin", "approved_at": at,
            "approvals": [], "approvals_required": 1}));
        same::<DraftStatusChanged>(json!({"draft_id": "d", "status": "rejected"}));
        same::<ChangeRequested>(json!({"draft_id": "c", "box_id": "b", "box_type": "sales", "status": "pending_approval", "over_limit": true,
            "over_limit_ops": ["shell:exec"], "over_limit_tools": [], "added": ["os_operations: shell:exec"], "removed": [], "version": "2.0.0"}));
    }

    #[test]
    fn boxes_audit_rows_and_verification_read_and_write_unchanged() {
        let at = "2026-12-01T11:27:27.333043491Z";
        same::<BoxDetail>(json!({"box_id": "b", "box_type": "sales", "name": "", "state": "idle", "manifest_version": "1.0.0", "created_at": at,
            "draft_id": "d", "approved_by": "admin", "manifest": manifest(), "assignments": [{"user_id": "u", "role_in_box": "primary"}],
            "provisioning": [{"index": 0, "access": "git_remote u", "status": "provisioned", "detail": "ok", "attempts": 1, "at": at},
                {"index": 1, "access": "ssh_target u@h:22", "status": "failed", "reason": "down", "attempts": 5, "at": at}],
            "manifest_drift": false}));
        same::<BoxList>(
            json!({"boxes": [{"box_id": "b", "box_type": "sales", "name": "", "state": "idle", "manifest_version": "1.0.0", "created_at": at}], "next_cursor": "7"}),
        );
        same::<BoxList>(json!({"boxes": [], "next_cursor": null}));
        same::<BoxHistory>(json!({"box_id": "b", "entries": [
            {"event_id": "box/b/1", "position": 11, "at": at, "actor": "admin", "kind": "activated", "draft_id": "d", "box_type": "sales", "approved_by": "admin",
                "manifest_version": "1.0.0", "manifest_digest": "sha256:00", "approval_key_id": "approval-1"},
            {"event_id": "box/b/2", "position": 12, "at": at, "actor": "admin", "kind": "user_unassigned", "user_id": "u", "role_in_box": "member"},
            {"event_id": "box/b/3", "position": 13, "at": at, "actor": "admin", "kind": "config_edited", "changed_keys": ["trigger_schedule"], "manifest_version": "1.0.1"},
            {"event_id": "box/b/4", "position": 14, "at": at, "actor": "admin", "kind": "stopped", "state": "stopped"},
            {"event_id": "box/b/5", "position": 15, "at": at, "actor": "admin", "kind": "manifest_changed", "draft_id": "c", "approved_by": "admin",
                "manifest_version": "2.0.0", "manifest_digest": "sha256:01", "approval_key_id": "approval-1", "added": ["tools: Bash"], "removed": []},
            {"event_id": "access/b/0/1", "position": 16, "at": at, "actor": "system", "kind": "access_provision_failed", "index": 0, "access": "git_remote u", "reason": "down", "attempts": 5}],
            "next_cursor": "0.12"}));
        same::<FeasibilityAnswer>(json!({"feasible": false, "available_operations": ["file:read"], "available_tools": ["Read"],
            "missing_capabilities": ["notify:email"], "required_approvals": ["x"], "summary": "s", "notes": [], "box_id": "b"}));
        same::<AuditRows>(json!({"rows": [{"seq": 1, "time": "2026-12-01T11:27:26.700Z", "action": "box_draft.create", "actor": "agent", "target": "d",
            "event_id": "draft/d/1", "payload_digest": "sha256:00", "detail": "submitted d", "key_id": "audit-1", "mac": "ab"}], "next_cursor": "1"}));
        same::<VerifyResult>(json!({"ok": true, "rows": 4}));
        same::<VerifyResult>(json!({"ok": false, "first_bad_seq": 3, "reason": "modified"}));
        same::<ErrorBody>(json!({"error": "invalid_query", "message": "m", "details": {"parameter": "since"}}));
        same::<ErrorBody>(json!({"error": "box_manifest_validation", "message": "m", "details": [{"key": "purpose", "message": "blank"}]}));
    }
}
