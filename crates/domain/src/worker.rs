//! Runtime Workers (SPEC §10, seed 003): the pure rules every side of a launch shares —
//! the initial input segments and their bounds, who may launch, the launch fingerprint and
//! Worker id, the ConfigBundle's canonical bytes and digest, and the binding lease.
//!
//! ConfigBundle canonical form (R-WORKER-2): the UTF-8 JSON text, with no insignificant
//! whitespace and every object's keys sorted, of
//! `{"box_id": <box id>, "format": "atasira.config-bundle/1", "manifest": <effective manifest>}`,
//! where the effective manifest is the Box's current manifest (the approved one plus every
//! recorded mentor and config edit) with `tools` replaced by the effective tools. Its
//! digest is `sha256:<lowercase hex>` of those bytes. Equal manifests of one Box give equal
//! digests; any edit gives a new one.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::FieldError;
use crate::manifest::BoxManifest;
use crate::principal::Principal;

/// The `format` of a ConfigBundle's canonical bytes.
pub const BUNDLE_FORMAT: &str = "atasira.config-bundle/1";

/// How much one launch may carry, so a `WorkerCreated` event always fits the bus.
pub const LAUNCH_ID_CHARS: usize = 128;
pub const ROLE_CHARS: usize = 64;
pub const LABELS: usize = 32;
pub const LABEL_KEY_CHARS: usize = 63;
pub const LABEL_VALUE_CHARS: usize = 256;
pub const INPUT_SEGMENTS: usize = 64;
pub const SEGMENT_TEXT_CHARS: usize = 16_384;
pub const SEGMENT_REF_CHARS: usize = 256;

/// How much a Worker's transcript keeps of what it wrote: lines per report, characters per
/// line, bytes of log in all, characters of its result.
pub const LOG_LINES: usize = 64;
pub const LOG_LINE_CHARS: usize = 2_000;
pub const LOG_BYTES: usize = 256 * 1024;
pub const RESULT_CHARS: usize = 16_384;

/// Where a Worker is in its life (R-HOST-2). `created` until an execution host claims it;
/// `succeeded`, `failed`, `killed` and `lost` are ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    #[default]
    Created,
    Starting,
    Running,
    Paused,
    Succeeded,
    Failed,
    Killed,
    Lost,
}

impl WorkerState {
    pub const ALL: [WorkerState; 8] = [
        WorkerState::Created,
        WorkerState::Starting,
        WorkerState::Running,
        WorkerState::Paused,
        WorkerState::Succeeded,
        WorkerState::Failed,
        WorkerState::Killed,
        WorkerState::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Created => "created",
            WorkerState::Starting => "starting",
            WorkerState::Running => "running",
            WorkerState::Paused => "paused",
            WorkerState::Succeeded => "succeeded",
            WorkerState::Failed => "failed",
            WorkerState::Killed => "killed",
            WorkerState::Lost => "lost",
        }
    }

    pub fn parse(text: &str) -> Option<WorkerState> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Nothing more happens to it.
    pub fn is_ended(self) -> bool {
        matches!(self, WorkerState::Succeeded | WorkerState::Failed | WorkerState::Killed | WorkerState::Lost)
    }

    /// A host holds it: its Box is `running`.
    pub fn is_live(self) -> bool {
        matches!(self, WorkerState::Starting | WorkerState::Running | WorkerState::Paused)
    }
}

impl std::fmt::Display for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The default lease of an execution binding (`ATASIRA_BINDING_TTL`).
pub const DEFAULT_BINDING_TTL: Duration = Duration::from_secs(600);

/// One piece of a Worker's initial input (R-WORKER-5). There is no `system` kind: role
/// prompts come from the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Segment {
    Text(String),
    TicketRef(String),
    ObjectiveRef(String),
}

impl Segment {
    pub fn kind(&self) -> &'static str {
        match self {
            Segment::Text(_) => "text",
            Segment::TicketRef(_) => "ticket_ref",
            Segment::ObjectiveRef(_) => "objective_ref",
        }
    }

    pub fn value(&self) -> &str {
        match self {
            Segment::Text(v) | Segment::TicketRef(v) | Segment::ObjectiveRef(v) => v,
        }
    }
}

/// What a launch asks for, as the caller sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRequest {
    pub launch_id: String,
    pub box_id: String,
    pub role: String,
    pub labels: BTreeMap<String, String>,
    pub input: Vec<Segment>,
}

fn text_ok(s: &str, max: usize) -> bool {
    !s.trim().is_empty() && s.chars().count() <= max && !s.contains('\0')
}

/// The launch's own rules (bounds and shapes); each error names its field. A segment
/// problem is reported under `input[i]`.
pub fn validate_launch(request: &LaunchRequest) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let id_ok = request.launch_id.chars().count() <= LAUNCH_ID_CHARS
        && !request.launch_id.is_empty()
        && request.launch_id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if !id_ok {
        errors.push(FieldError::new("launch_id", format!("1 to {LAUNCH_ID_CHARS} characters: letters, digits, '-', '_', '.', ':'")));
    }
    if !request.role.is_empty() && !text_ok(&request.role, ROLE_CHARS) {
        errors.push(FieldError::new("role", format!("at most {ROLE_CHARS} characters, not blank")));
    }
    if request.labels.len() > LABELS {
        errors.push(FieldError::new("labels", format!("at most {LABELS} labels")));
    }
    for (k, v) in &request.labels {
        if !text_ok(k, LABEL_KEY_CHARS) || v.chars().count() > LABEL_VALUE_CHARS || v.contains('\0') {
            errors.push(FieldError::new(
                format!("labels.{}", k.chars().take(LABEL_KEY_CHARS).collect::<String>()),
                format!("keys 1 to {LABEL_KEY_CHARS} characters, values at most {LABEL_VALUE_CHARS}"),
            ));
        }
    }
    errors.extend(segment_errors(&request.input));
    errors
}

/// The input's bounds: 1 to `INPUT_SEGMENTS` segments, text up to `SEGMENT_TEXT_CHARS`,
/// references up to `SEGMENT_REF_CHARS`, none blank.
pub fn segment_errors(input: &[Segment]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if input.is_empty() || input.len() > INPUT_SEGMENTS {
        errors.push(FieldError::new("input", format!("1 to {INPUT_SEGMENTS} segments")));
    }
    for (i, segment) in input.iter().enumerate() {
        let max = if matches!(segment, Segment::Text(_)) { SEGMENT_TEXT_CHARS } else { SEGMENT_REF_CHARS };
        if !text_ok(segment.value(), max) {
            errors.push(FieldError::new(format!("input[{i}]"), format!("a {} segment holds 1 to {max} characters", segment.kind())));
        }
    }
    errors
}

/// The Worker id a launch gets: derived from the launch_id, so every retry of a launch
/// names the same Worker stream (R-WORKER-4).
pub fn worker_id_for(launch_id: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6174_6173_6972_612d_776f_726b_6572_7331);
    format!("wkr_{}", uuid::Uuid::new_v5(&NAMESPACE, launch_id.as_bytes()).simple())
}

/// What makes two launches "the same request": the Box, role, labels, input and the
/// caller (not the bundle or the binding: a retried browser call prepares a fresh binding).
pub fn launch_fingerprint(request: &LaunchRequest, caller: &str) -> String {
    let value = json!({
        "box_id": request.box_id,
        "caller": caller,
        "input": request.input,
        "labels": request.labels,
        "launch_id": request.launch_id,
        "role": request.role,
    });
    let bytes = serde_json::to_vec(&crate::manifest::canonical(value)).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// R-WORKER (who may launch): human admins, the Box's assigned users (primary or member),
/// agents included only when assigned, and the Box's own trigger (R-TRIG-1).
pub fn may_launch<R>(principal: &Principal, box_id: &str, assignments: &[(String, R)]) -> bool {
    principal.is_human_admin() || crate::principal::is_trigger_of(principal, box_id) || assignments.iter().any(|(user, _)| *user == principal.user_id)
}

/// A ConfigBundle's canonical bytes (see the module documentation).
pub fn bundle_bytes(box_id: &str, manifest: &BoxManifest) -> Vec<u8> {
    let value = json!({ "box_id": box_id, "format": BUNDLE_FORMAT, "manifest": manifest.effective() });
    serde_json::to_vec(&crate::manifest::canonical(value)).unwrap_or_default()
}

/// `sha256:<hex>` of [`bundle_bytes`].
pub fn bundle_digest(box_id: &str, manifest: &BoxManifest) -> String {
    digest_of(&bundle_bytes(box_id, manifest))
}

/// `sha256:<lowercase hex>` of `bytes`: what a bundle's digest is of its canonical bytes.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Parses a lease like `600`, `90s`, `10m`, `1h` or `250ms` (whole milliseconds, seconds,
/// minutes or hours; more than zero).
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration such as 600, 90s, 10m or 1h"))?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is not a duration such as 600, 90s, 10m or 1h"))?;
    if millis == 0 {
        return Err("a duration must be more than zero".to_owned());
    }
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::boxes::BoxRole;
    use crate::principal::{Kind, Role};

    fn launch() -> LaunchRequest {
        LaunchRequest {
            launch_id: "launch-1".into(),
            box_id: "b1".into(),
            role: String::new(),
            labels: BTreeMap::new(),
            input: vec![Segment::Text("hello".into()), Segment::TicketRef("T-1".into())],
        }
    }

    #[test]
    fn r_worker_5_segments_serialize_with_their_kind() {
        let json = serde_json::to_value(&launch().input).expect("json");
        assert_eq!(json, json!([{"kind": "text", "value": "hello"}, {"kind": "ticket_ref", "value": "T-1"}]));
        // given a system segment; then it is not a segment at all
        assert!(serde_json::from_value::<Segment>(json!({"kind": "system", "value": "x"})).is_err());
    }

    #[test]
    fn r_worker_4_a_launch_within_bounds_validates_and_each_bound_names_its_field() {
        assert!(validate_launch(&launch()).is_empty());
        let keys = |r: &LaunchRequest| validate_launch(r).into_iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(keys(&LaunchRequest { launch_id: "a b".into(), ..launch() }), ["launch_id"]);
        assert_eq!(keys(&LaunchRequest { input: vec![], ..launch() }), ["input"]);
        assert_eq!(keys(&LaunchRequest { input: vec![Segment::Text(" ".into())], ..launch() }), ["input[0]"]);
        assert_eq!(keys(&LaunchRequest { input: vec![Segment::ObjectiveRef("x".repeat(SEGMENT_REF_CHARS + 1))], ..launch() }), ["input[0]"]);
        assert_eq!(keys(&LaunchRequest { role: "r".repeat(ROLE_CHARS + 1), ..launch() }), ["role"]);
        let many: BTreeMap<String, String> = (0..=LABELS).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(keys(&LaunchRequest { labels: many, ..launch() }), ["labels"]);
    }

    #[test]
    fn r_worker_4_the_worker_id_and_fingerprint_are_stable_and_tell_requests_apart() {
        assert_eq!(worker_id_for("launch-1"), worker_id_for("launch-1"));
        assert_ne!(worker_id_for("launch-1"), worker_id_for("launch-2"));
        assert!(worker_id_for("x").starts_with("wkr_"));
        let a = launch_fingerprint(&launch(), "alice");
        assert_eq!(a, launch_fingerprint(&launch(), "alice"));
        assert_ne!(a, launch_fingerprint(&launch(), "bob"));
        assert_ne!(a, launch_fingerprint(&LaunchRequest { role: "reviewer".into(), ..launch() }, "alice"));
        assert_ne!(a, launch_fingerprint(&LaunchRequest { input: vec![Segment::Text("other".into())], ..launch() }, "alice"));
    }

    #[test]
    fn who_may_launch_human_admins_assigned_users_and_the_boxs_own_trigger_only() {
        let p = |role, kind, user: &str| Principal { user_id: user.into(), role, kind };
        let assigned = vec![("agent-1".to_owned(), BoxRole::Member), ("erin".to_owned(), BoxRole::Primary)];
        assert!(may_launch::<BoxRole>(&p(Role::Admin, Kind::Human, "alice"), "b1", &[]));
        assert!(may_launch(&p(Role::Member, Kind::Human, "erin"), "b1", &assigned));
        assert!(may_launch(&p(Role::Member, Kind::Agent, "agent-1"), "b1", &assigned));
        assert!(!may_launch(&p(Role::Admin, Kind::Agent, "agent-2"), "b1", &assigned), "an agent admin must be assigned");
        assert!(!may_launch(&p(Role::Member, Kind::Human, "mallory"), "b1", &assigned));
        // R-TRIG-1: a Box's trigger launches that Box, no other.
        assert!(may_launch::<BoxRole>(&crate::principal::trigger_principal("b1"), "b1", &[]));
        assert!(!may_launch::<BoxRole>(&crate::principal::trigger_principal("b2"), "b1", &[]));
    }

    #[test]
    fn r_worker_2_the_bundle_digest_follows_the_effective_manifest_and_the_box() {
        let manifest: BoxManifest = serde_json::from_value(json!({"box_type": "release-notes", "purpose": "write notes"})).expect("manifest");
        let d = bundle_digest("b1", &manifest);
        assert!(d.starts_with("sha256:") && d.len() == 7 + 64);
        assert_eq!(d, bundle_digest("b1", &manifest.clone()), "unchanged manifest, same digest");
        assert_ne!(d, bundle_digest("b2", &manifest), "another Box, another bundle");
        let edited = BoxManifest { purpose: "write better notes".into(), ..manifest.clone() };
        assert_ne!(d, bundle_digest("b1", &edited), "an edit gives a new digest");
        let text = String::from_utf8(bundle_bytes("b1", &manifest)).expect("utf-8");
        assert!(text.starts_with(r#"{"box_id":"b1","format":"atasira.config-bundle/1","manifest":{"#), "{text}");
    }

    #[test]
    fn r_worker_3_leases_parse_in_seconds_minutes_and_hours() {
        assert_eq!(parse_ttl("600"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_ttl("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_ttl("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_ttl("10m"), Ok(DEFAULT_BINDING_TTL));
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "0", "-1", "1d", "ten", "1.5m"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
