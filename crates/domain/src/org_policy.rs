//! The organisation's own rules as code (R-POLICY-1): Cedar policies an operator loads,
//! evaluated deterministically on every draft, change request, config edit, Worker launch
//! and runtime approval. See ADR 16.
//!
//! - A request is `principal` (`User::"<user id>"` with `kind`, `role`, `admin`, `human`),
//!   `action` (`Action::"draft" | "change" | "config_edit" | "launch" | "runtime_approval"`),
//!   `resource` (`Box::"<box_type>"` whose attributes are its manifest's keys, as the seed
//!   names them) and a `context` the action fills in (`over_limit`, `over_limit_ops`,
//!   `box_id`, the edited keys, the launch's labels, the tool call...).
//! - Everything is permitted unless a `forbid` rule matches: the refusal names the rule
//!   (its `@id`) and says its `@reason`. A `forbid` rule that cannot be evaluated refuses
//!   too (fail closed).
//! - A matching `permit` rule may ask for more: `@approvals("N")` distinct human admins,
//!   `@confirm("true")` the second confirmation at approval.
//!
//! The verdict is recorded with the event it allowed, with the policy version; a replay
//! reads the verdict, never evaluates again, so a later policy never changes a past
//! decision.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;

use cedar_policy::{Authorizer, Context, Decision, Effect, Entities, EntityUid, Policy, PolicyId, PolicySet, Request};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::manifest::BoxManifest;
use crate::os_operation::OverLimit;
use crate::principal::{Kind, Principal, Role};

/// How long a policy text may be.
pub const MAX_TEXT_BYTES: usize = 65_536;
/// How many distinct human admins a rule may require at most.
pub const MAX_APPROVALS: u32 = 10;
/// How long a rule's `@reason` may be.
pub const MAX_REASON_CHARS: usize = 200;
/// The rule that permits what no rule forbids (never named in a verdict).
const DEFAULT_PERMIT: &str = "atasira-default-permit";

/// What is being decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A draft of a new Box (its requester).
    Draft,
    /// A change request of a Box (its requester).
    Change,
    /// A config edit of a Box (the editor; the manifest as it would be after).
    ConfigEdit,
    /// A Worker launch (whoever launches it, a trigger's principal included).
    Launch,
    /// A human admin's decision on a Worker's tool-use request.
    RuntimeApproval,
}

impl Action {
    pub const ALL: [Action; 5] = [Action::Draft, Action::Change, Action::ConfigEdit, Action::Launch, Action::RuntimeApproval];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Draft => "draft",
            Action::Change => "change",
            Action::ConfigEdit => "config_edit",
            Action::Launch => "launch",
            Action::RuntimeApproval => "runtime_approval",
        }
    }
}

/// One rule of a policy, as the operator wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Its `@id`, or `policyN` by its place in the text.
    pub id: String,
    /// `permit` or `forbid`.
    pub effect: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `@approvals("N")` of a permit rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<u32>,
    /// `@confirm("true")` of a permit rule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirm: bool,
}

/// Why a policy text cannot be loaded (422).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("the policy text is empty")]
    Empty,
    #[error("the policy text is {0} bytes; at most {MAX_TEXT_BYTES} are taken")]
    TooLong(usize),
    #[error("the policy text does not parse: {0}")]
    Parse(String),
    #[error("templates are not supported: write each rule out")]
    Template,
    #[error("rule {rule}: {problem}")]
    Rule { rule: String, problem: String },
}

/// A loaded policy: the text and its rules, ready to evaluate.
#[derive(Debug, Clone)]
pub struct PolicyDocument {
    set: PolicySet,
    rules: Vec<Rule>,
    /// Cedar's id of each rule -> its index in `rules`.
    index: HashMap<PolicyId, usize>,
    digest: String,
}

impl PolicyDocument {
    /// Parses and checks a policy text: Cedar syntax, no templates, unique `@id`s of
    /// letters, digits, `-`, `_`, `.`, `:`, annotations that mean something here.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        if text.len() > MAX_TEXT_BYTES {
            return Err(PolicyError::TooLong(text.len()));
        }
        if text.trim().is_empty() {
            return Err(PolicyError::Empty);
        }
        let mut set = PolicySet::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        if set.templates().next().is_some() {
            return Err(PolicyError::Template);
        }
        // Rules in the order they are written (Cedar numbers them `policy0`, `policy1`...).
        let mut written: Vec<&Policy> = set.policies().collect();
        written.sort_by_key(|p| p.id().to_string().trim_start_matches("policy").parse::<usize>().unwrap_or(usize::MAX));
        let mut rules = Vec::with_capacity(written.len());
        let mut index = HashMap::new();
        let mut seen = BTreeSet::new();
        for policy in written {
            let rule = rule_of(policy)?;
            if !seen.insert(rule.id.clone()) {
                return Err(PolicyError::Rule { rule: rule.id, problem: "another rule has this @id".into() });
            }
            index.insert(policy.id().clone(), rules.len());
            rules.push(rule);
        }
        let default =
            Policy::parse(Some(PolicyId::new(DEFAULT_PERMIT)), "permit(principal, action, resource);").map_err(|e| PolicyError::Parse(e.to_string()))?;
        set.add(default).map_err(|e| PolicyError::Parse(e.to_string()))?;
        Ok(Self { set, rules, index, digest: digest_of(text) })
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// `sha256:<hex>` of the text.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The verdict of version `version` of this policy on `input`.
    ///
    /// Cedar refuses a rule it evaluates with under 100 KiB of stack left (its recursion
    /// guard), and a forbid rule that cannot be evaluated refuses: deep in a service's call
    /// stack that would refuse a request for want of stack, not by a rule. So the
    /// evaluation runs on a stack of its own when the caller's is running low.
    pub fn evaluate(&self, version: u64, input: &Input) -> Verdict {
        stacker::maybe_grow(EVALUATION_STACK_LEFT, EVALUATION_STACK, || self.evaluate_here(version, input))
    }

    fn evaluate_here(&self, version: u64, input: &Input) -> Verdict {
        let refuse_input = |problem: String| Verdict {
            version,
            decision: PolicyDecision::Deny,
            rules: vec!["input".into()],
            reason: Some(format!("the request could not be put to the policy: {problem}")),
            approvals_required: 1,
            confirm: false,
        };
        let (request, entities) = match input.cedar() {
            Ok(parts) => parts,
            Err(problem) => return refuse_input(problem),
        };
        let response = Authorizer::new().is_authorized(&request, &self.set, &entities);
        let diagnostics = response.diagnostics();
        // A forbid rule that errs refuses: a rule that cannot say no must not say yes.
        let errored: BTreeSet<usize> = diagnostics
            .errors()
            .filter_map(|cedar_policy::AuthorizationError::PolicyEvaluationError(e)| self.index.get(e.policy_id()).copied())
            .filter(|i| self.rules[*i].effect == "forbid")
            .collect();
        let matched: BTreeSet<usize> = diagnostics.reason().filter_map(|id| self.index.get(id).copied()).collect();
        if response.decision() == Decision::Deny || !errored.is_empty() {
            let denying: Vec<usize> = matched.union(&errored).copied().filter(|i| self.rules[*i].effect == "forbid").collect();
            let reason = denying.first().map(|i| match (&self.rules[*i].reason, errored.contains(i)) {
                (_, true) => "the rule could not be evaluated on this request, so it refuses".to_owned(),
                (Some(reason), false) => reason.clone(),
                (None, false) => "forbidden by the organisation's policy".to_owned(),
            });
            return Verdict {
                version,
                decision: PolicyDecision::Deny,
                rules: denying.iter().map(|i| self.rules[*i].id.clone()).collect(),
                reason,
                approvals_required: 1,
                confirm: false,
            };
        }
        let asking: Vec<&Rule> = matched.iter().map(|i| &self.rules[*i]).filter(|r| r.approvals.is_some() || r.confirm).collect();
        Verdict {
            version,
            decision: PolicyDecision::Allow,
            rules: asking.iter().map(|r| r.id.clone()).collect(),
            reason: None,
            approvals_required: asking.iter().filter_map(|r| r.approvals).max().unwrap_or(1),
            confirm: asking.iter().any(|r| r.confirm),
        }
    }
}

fn rule_of(policy: &Policy) -> Result<Rule, PolicyError> {
    let id = policy.annotation("id").map_or_else(|| policy.id().to_string(), str::to_owned);
    let problem = |problem: &str| PolicyError::Rule { rule: id.clone(), problem: problem.to_owned() };
    if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')) {
        return Err(problem("@id must be 1 to 64 letters, digits, '-', '_', '.' or ':'"));
    }
    if id == DEFAULT_PERMIT || id == "input" {
        return Err(problem("this @id is reserved"));
    }
    let effect = match policy.effect() {
        Effect::Permit => "permit",
        Effect::Forbid => "forbid",
    };
    let reason = policy.annotation("reason").map(str::to_owned);
    if reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON_CHARS || r.chars().any(char::is_control)) {
        return Err(problem(&format!("@reason must be at most {MAX_REASON_CHARS} characters on one line")));
    }
    let approvals = match policy.annotation("approvals") {
        None => None,
        Some(n) => match n.parse::<u32>() {
            Ok(n) if (1..=MAX_APPROVALS).contains(&n) => Some(n),
            _ => return Err(problem(&format!("@approvals must be a number from 1 to {MAX_APPROVALS}"))),
        },
    };
    let confirm = match policy.annotation("confirm") {
        None | Some("false") => false,
        Some("true" | "") => true,
        Some(_) => return Err(problem("@confirm must be \"true\" or \"false\"")),
    };
    if effect == "forbid" && (approvals.is_some() || confirm) {
        return Err(problem("@approvals and @confirm belong on permit rules; a forbid rule refuses"));
    }
    if let Some(unknown) = policy.annotations().map(|(k, _)| k).find(|k| !matches!(*k, "id" | "reason" | "approvals" | "confirm")) {
        return Err(problem(&format!("unknown annotation @{unknown} (known: @id, @reason, @approvals, @confirm)")));
    }
    Ok(Rule { id, effect: effect.to_owned(), reason, approvals, confirm })
}

/// `sha256:<hex>` of a policy text.
pub fn digest_of(text: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyDecision {
    Allow,
    Deny,
}

/// What a policy version decided on one request: recorded with the event it allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The policy version that decided (0: no policy was loaded).
    pub version: u64,
    pub decision: PolicyDecision,
    /// The rules that decided: the forbidding ones of a denial, the asking ones of an
    /// allowance (`@approvals`, `@confirm`); empty when nothing but the default allowed.
    #[serde(default)]
    pub rules: Vec<String>,
    /// A denial's reason (the first rule's `@reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Distinct human admins the rules require (1 when none asks for more).
    #[serde(default = "one")]
    pub approvals_required: u32,
    /// Whether the rules require the second confirmation at approval.
    #[serde(default)]
    pub confirm: bool,
}

fn one() -> u32 {
    1
}

impl Verdict {
    /// The verdict when no policy is loaded: allowed, nothing more asked.
    pub fn unpoliced() -> Self {
        Self { version: 0, decision: PolicyDecision::Allow, rules: vec![], reason: None, approvals_required: 1, confirm: false }
    }

    pub fn denied(&self) -> bool {
        self.decision == PolicyDecision::Deny
    }

    /// A denial in words: the policy version, the rule, the reason.
    pub fn refusal(&self) -> String {
        let rule = self.rules.first().map_or("?", String::as_str);
        let reason = self.reason.as_deref().unwrap_or("forbidden by the organisation's policy");
        format!("policy version {}, rule {rule}: {reason}", self.version)
    }
}

/// One request to put to the policy.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    pub action: Action,
    pub principal: &'a Principal,
    pub manifest: &'a BoxManifest,
    /// What the action adds to the request (see the module's documentation).
    pub context: Map<String, Value>,
}

impl<'a> Input<'a> {
    /// A draft of a new Box.
    pub fn draft(principal: &'a Principal, manifest: &'a BoxManifest, over_limit: &OverLimit) -> Self {
        Self { action: Action::Draft, principal, manifest, context: over_limit_context(over_limit) }
    }

    /// A change request of Box `box_id` to `manifest`; `adds` are the capabilities it adds.
    pub fn change(principal: &'a Principal, manifest: &'a BoxManifest, over_limit: &OverLimit, box_id: &str, adds: &[String]) -> Self {
        let mut context = over_limit_context(over_limit);
        context.insert("box_id".into(), json!(box_id));
        context.insert("adds".into(), json!(adds));
        Self { action: Action::Change, principal, manifest, context }
    }

    /// A config edit of Box `box_id` changing `keys` (of `config_defaults` and the like);
    /// `manifest` is the manifest as it would be after.
    pub fn config_edit(principal: &'a Principal, manifest: &'a BoxManifest, box_id: &str, keys: &[String]) -> Self {
        let context = Map::from_iter([("box_id".to_owned(), json!(box_id)), ("keys".to_owned(), json!(keys))]);
        Self { action: Action::ConfigEdit, principal, manifest, context }
    }

    /// A Worker launch of Box `box_id`.
    pub fn launch(
        principal: &'a Principal,
        manifest: &'a BoxManifest,
        box_id: &str,
        launch_id: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        let trigger = labels.get("trigger").cloned().unwrap_or_else(|| "manual".to_owned());
        let context = Map::from_iter([
            ("box_id".to_owned(), json!(box_id)),
            ("launch_id".to_owned(), json!(launch_id)),
            ("trigger".to_owned(), json!(trigger)),
            ("labels".to_owned(), json!(labels)),
        ]);
        Self { action: Action::Launch, principal, manifest, context }
    }

    /// A human admin approving (`approve`) or rejecting a Worker's request to call `tool`.
    pub fn runtime_approval(principal: &'a Principal, manifest: &'a BoxManifest, box_id: &str, worker_id: &str, tool: &str, approve: bool) -> Self {
        let context = Map::from_iter([
            ("box_id".to_owned(), json!(box_id)),
            ("worker_id".to_owned(), json!(worker_id)),
            ("tool".to_owned(), json!(tool)),
            ("approve".to_owned(), json!(approve)),
        ]);
        Self { action: Action::RuntimeApproval, principal, manifest, context }
    }

    /// The Cedar request and entities.
    fn cedar(&self) -> Result<(Request, Entities), String> {
        let user = json!({"type": "User", "id": self.principal.user_id});
        let boxed = json!({"type": "Box", "id": self.manifest.box_type.as_str()});
        let kind = match self.principal.kind {
            Kind::Human => "human",
            Kind::Agent => "agent",
        };
        let role = match self.principal.role {
            Role::Admin => "admin",
            Role::Member => "member",
        };
        let entities = json!([
            {"uid": user, "attrs": {"kind": kind, "role": role, "admin": self.principal.is_admin(), "human": self.principal.kind == Kind::Human}, "parents": []},
            {"uid": boxed, "attrs": cedar_value(Value::Object(self.manifest.to_object())).unwrap_or_else(|| json!({})), "parents": []},
        ]);
        let entities = Entities::from_json_value(entities, None).map_err(|e| e.to_string())?;
        let uid = |v: &Value| EntityUid::from_json(v.clone()).map_err(|e| e.to_string());
        let action = uid(&json!({"type": "Action", "id": self.action.as_str()}))?;
        let context =
            Context::from_json_value(cedar_value(Value::Object(self.context.clone())).unwrap_or_else(|| json!({})), None).map_err(|e| e.to_string())?;
        let request = Request::new(uid(&user)?, action, uid(&boxed)?, context, None).map_err(|e| e.to_string())?;
        Ok((request, entities))
    }
}

fn over_limit_context(over_limit: &OverLimit) -> Map<String, Value> {
    Map::from_iter([
        ("over_limit".to_owned(), json!(over_limit.over_limit)),
        ("over_limit_ops".to_owned(), json!(over_limit.over_limit_ops)),
        ("over_limit_tools".to_owned(), json!(over_limit.over_limit_tools)),
    ])
}

/// The stack an evaluation needs left: Cedar's own guard asks for 100 KiB at every step,
/// and building the request and evaluating it take several hundred KiB more in a build
/// without optimisations.
const EVALUATION_STACK_LEFT: usize = 1024 * 1024;

/// The stack an evaluation gets when the caller's has less than that left (mapped, not
/// touched: only what it uses is memory).
const EVALUATION_STACK: usize = 4 * 1024 * 1024;

/// JSON as Cedar's entity format takes it: no nulls, no fractions (as text), whole
/// numbers within i64, no `__`-keys (Cedar's escapes), arrays as sets.
fn cedar_value(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Number(n) if n.is_i64() => Some(Value::Number(n)),
        Value::Number(n) => Some(Value::String(n.to_string())),
        Value::Array(items) => Some(Value::Array(items.into_iter().filter_map(cedar_value).collect())),
        Value::Object(map) => {
            Some(Value::Object(map.into_iter().filter(|(k, _)| !k.starts_with("__")).filter_map(|(k, v)| cedar_value(v).map(|v| (k, v))).collect()))
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests;
