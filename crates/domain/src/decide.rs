//! The decision before every tool call (R-DECIDE-1): given a Worker's bundle (its effective
//! manifest) and binding (its workspace and tool scope), is `{tool, input}` allowed, denied
//! or does it need a human admin (`ask`)? Each answer names the manifest rule that decided.
//!
//! One pure function, [`decide`]. The execution host resolves what only the filesystem
//! knows (where a path really leads, through symbolic links) before calling it, and passes
//! that in [`Facts`]; nothing else comes from outside the bundle and the binding.
//!
//! The rules, in the order they apply:
//! 1. `publish` (a message on a topic) is decided by `outputs` alone.
//! 2. `dangerous_tool_overrides.<tool>: false` switches the tool off.
//! 3. `tools`: a tool outside the Box's effective tools and the binding's tool scope is
//!    denied (an empty list: nothing may be called).
//! 4. What the tool touches: files by `file_access` and the workspace (no `..`, no link
//!    out of them); URLs by `network` and `url_allowlist`; shell commands by
//!    `shell.allowed_commands` and `shell.allowed_cwd` (outside them `ask` when
//!    `require_approval_outside_allowlist`, else deny); browser clicks and typing by the
//!    `browser` approval gates; notifications by `notify.<channel>` and its recipients.
//! 5. A dangerous tool (`process:kill`, `applescript:execute`, `op:create`) asks a human
//!    unless `dangerous_tool_overrides.<tool>: true`.
//! 6. Otherwise allowed by `tools`.
//!
//! Tool names are the manifest's: OS operations (`file:write`, `shell:exec`, ...) and the
//! tools agent CLIs call (`Read`, `Write`, `Edit`, `Bash`, `WebFetch`, ...), which are
//! checked by what they touch like the operations they stand for.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::manifest::{BoxManifest, Network};

/// The tool `publish`: a message on one of the Box's `outputs` topics.
pub const PUBLISH: &str = "publish";

/// Tools that ask a human every time unless `dangerous_tool_overrides` says `true`.
pub const DANGEROUS: &[&str] = &["process:kill", "applescript:execute", "op:create"];

/// How large a call's input may be (its JSON text); larger is denied unread.
pub const INPUT_BYTES: usize = 64 * 1024;

/// The answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny,
    /// A human admin decides (a runtime approval request).
    Ask,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Ask => "ask",
        }
    }
}

/// A decision and the manifest rule that made it (`tools`, `file_access`,
/// `shell.allowed_commands`, `notify.email.recipients`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub decision: Verdict,
    pub rule: String,
    pub reason: String,
}

impl Decision {
    fn new(decision: Verdict, rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { decision, rule: rule.into(), reason: reason.into() }
    }
    fn allow(rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(Verdict::Allow, rule, reason)
    }
    fn deny(rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(Verdict::Deny, rule, reason)
    }
    fn ask(rule: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(Verdict::Ask, rule, reason)
    }
}

/// What a Worker wants to call. Agent CLIs' pre-tool-use hooks send `tool_name` and
/// `tool_input`; both spellings are read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(alias = "tool_name")]
    pub tool: String,
    #[serde(default, alias = "tool_input")]
    pub input: Value,
}

/// What the Worker's bundle and binding say (R-DECIDE-1: nothing else decides).
#[derive(Debug, Clone, Copy)]
pub struct Grant<'a> {
    /// The bundle's manifest (effective tools in `tools`).
    pub manifest: &'a BoxManifest,
    /// The binding's workspace: the Worker's directory (absolute).
    pub workspace: &'a str,
    /// The binding's tool scope.
    pub tool_scope: &'a [String],
}

/// What the host looked up for this call: where each path of [`paths_of`] really leads
/// (symbolic links resolved). A path missing here is judged as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub real_paths: BTreeMap<String, String>,
}

/// How a tool touches the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    /// Reads its source, writes its destination (`move` also removes the source: write).
    Copy {
        source_write: bool,
    },
    Shell,
    Url,
    Browser,
    Notify(&'static str),
    Other,
}

fn kind_of(tool: &str) -> Kind {
    match tool {
        "file:read" | "Read" | "Glob" | "Grep" | "LS" | "NotebookRead" => Kind::Read,
        "file:write" | "Write" | "Edit" | "MultiEdit" | "NotebookEdit" => Kind::Write,
        "file:copy" => Kind::Copy { source_write: false },
        "file:move" => Kind::Copy { source_write: true },
        "shell:exec" | "Bash" | "shell" => Kind::Shell,
        "browser:navigate" | "WebFetch" => Kind::Url,
        "browser:click" | "browser:type" => Kind::Browser,
        "notify:email" => Kind::Notify("email"),
        "notify:line" => Kind::Notify("line"),
        _ => Kind::Other,
    }
}

fn text<'v>(input: &'v Value, keys: &[&str]) -> Option<&'v str> {
    keys.iter().find_map(|k| input.get(*k).and_then(Value::as_str))
}

const PATH_KEYS: &[&str] = &["path", "file_path", "notebook_path"];
const SOURCE_KEYS: &[&str] = &["source", "from", "src"];
const DESTINATION_KEYS: &[&str] = &["destination", "to", "dest"];

/// The paths a call names, as written (what the host resolves into [`Facts`]): a file
/// tool's path, a copy's source and destination, a shell command's `cwd`.
pub fn paths_of(call: &ToolCall) -> Vec<String> {
    let keys: &[&str] = match kind_of(&call.tool) {
        Kind::Read | Kind::Write => PATH_KEYS,
        Kind::Copy { .. } => &["source", "from", "src", "destination", "to", "dest"],
        Kind::Shell => &["cwd"],
        _ => &[],
    };
    keys.iter().filter_map(|k| call.input.get(*k).and_then(Value::as_str)).map(str::to_owned).collect()
}

/// R-DECIDE-1: the decision for one call (see the module documentation for the rules).
pub fn decide(grant: Grant<'_>, call: &ToolCall, facts: &Facts) -> Decision {
    let m = grant.manifest;
    let tool = call.tool.as_str();
    if tool.trim().is_empty() {
        return Decision::deny("tools", "the call names no tool");
    }
    if serde_json::to_string(&call.input).map_or(true, |s| s.len() > INPUT_BYTES) {
        return Decision::deny("tools", format!("the input of {tool} is over {INPUT_BYTES} bytes"));
    }
    if tool == PUBLISH {
        return publish(m, &call.input);
    }
    if m.dangerous_tool_overrides.get(tool) == Some(&false) {
        return Decision::deny(format!("dangerous_tool_overrides.{tool}"), format!("{tool} is switched off for this Box"));
    }
    let effective = m.effective_tools();
    if !effective.iter().any(|t| t == tool) || !grant.tool_scope.iter().any(|t| t == tool) {
        let why = if effective.is_empty() { "this Box may call no tool".to_owned() } else { format!("{tool} is not one of this Box's tools") };
        return Decision::deny("tools", why);
    }
    let workspace = Path::new(grant.workspace);
    let checked = match kind_of(tool) {
        Kind::Read => file(m, workspace, facts, text(&call.input, PATH_KEYS), Access::Read, tool),
        Kind::Write => file(m, workspace, facts, text(&call.input, PATH_KEYS), Access::Write, tool),
        Kind::Copy { source_write } => {
            let source = if source_write { Access::Write } else { Access::Read };
            file(m, workspace, facts, text(&call.input, SOURCE_KEYS), source, tool)
                .or_else(|| file(m, workspace, facts, text(&call.input, DESTINATION_KEYS), Access::Write, tool))
        }
        Kind::Shell => shell(m, workspace, facts, &call.input),
        Kind::Url => url(m, text(&call.input, &["url"])),
        Kind::Browser => browser(m, &call.input),
        Kind::Notify(channel) => notify(m, channel, &call.input),
        Kind::Other => None,
    };
    if let Some(decision) = checked {
        return decision;
    }
    if DANGEROUS.contains(&tool) && m.dangerous_tool_overrides.get(tool) != Some(&true) {
        return Decision::ask(format!("dangerous_tool_overrides.{tool}"), format!("{tool} needs a human admin each time"));
    }
    Decision::allow("tools", format!("{tool} is one of this Box's tools"))
}

fn publish(m: &BoxManifest, input: &Value) -> Decision {
    match text(input, &["topic", "subject"]) {
        Some(topic) if m.outputs.iter().any(|o| o == topic) => Decision::allow("outputs", format!("{topic:?} is one of this Box's outputs")),
        Some(topic) => Decision::deny("outputs", format!("{:?} is not one of this Box's outputs", clip(topic))),
        None => Decision::deny("outputs", "publish needs a topic"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// `None` when the path may be touched this way; else the decision that refuses it.
fn file(m: &BoxManifest, workspace: &Path, facts: &Facts, path: Option<&str>, access: Access, tool: &str) -> Option<Decision> {
    let Some(written) = path else {
        // Tools that search (Glob, Grep, LS) default to the workspace.
        return if matches!(tool, "Glob" | "Grep" | "LS") { None } else { Some(Decision::deny("file_access", format!("{tool} needs a path"))) };
    };
    let mut candidates = vec![written.to_owned()];
    if let Some(real) = facts.real_paths.get(written) {
        candidates.push(real.clone());
    }
    for candidate in candidates {
        let Some(path) = normal(workspace, &candidate) else {
            return Some(Decision::deny("file_access", format!("{:?} climbs out with '..'", clip(written))));
        };
        if !file_allowed(m, workspace, &path, access) {
            let how = if access == Access::Write { "write" } else { "read" };
            let shown = if candidate == written { format!("{:?}", clip(written)) } else { format!("{:?} (a link to {:?})", clip(written), clip(&candidate)) };
            return Some(Decision::deny("file_access", format!("{tool} may not {how} {shown}: outside the workspace and file_access")));
        }
    }
    None
}

/// The path made absolute against the workspace, `.` removed; `None` when it has `..`.
fn normal(workspace: &Path, path: &str) -> Option<PathBuf> {
    let joined = if Path::new(path).is_absolute() { PathBuf::from(path) } else { workspace.join(path) };
    let mut out = PathBuf::new();
    for component in joined.components() {
        match component {
            Component::ParentDir => return None,
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

fn file_allowed(m: &BoxManifest, workspace: &Path, path: &Path, access: Access) -> bool {
    if path.starts_with(workspace) {
        return true;
    }
    m.file_access.iter().any(|entry| {
        let (mode, pattern) = match entry.split_once(':') {
            Some(("read", p)) => (Some(Access::Read), p),
            Some(("write", p)) => (Some(Access::Write), p),
            _ => (None, entry.as_str()),
        };
        mode.is_none_or(|mode| mode == access) && path_matches(pattern, path)
    })
}

/// A `file_access` pattern: `*` any characters, `?` one; a pattern without either names a
/// file or a directory and everything below it.
fn path_matches(pattern: &str, path: &Path) -> bool {
    if !pattern.contains(['*', '?']) {
        return Path::new(pattern).is_absolute() && normal(Path::new("/"), pattern).is_some_and(|p| path.starts_with(p));
    }
    let mut re = String::from("^");
    for c in pattern.chars() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    regex::Regex::new(&re).is_ok_and(|re| re.is_match(&path.to_string_lossy()))
}

/// What a shell may not be trusted with: command substitution, redirection, new lines.
const SHELL_OPAQUE: &[&str] = &["`", "$(", ">", "<", "\n", "\r"];

fn shell(m: &BoxManifest, workspace: &Path, facts: &Facts, input: &Value) -> Option<Decision> {
    let Some(command) = text(input, &["command", "cmd"]).map(str::trim).filter(|c| !c.is_empty()) else {
        return Some(Decision::deny("shell.allowed_commands", "the call names no command"));
    };
    let outside = |rule: &str, reason: String| {
        if m.shell.require_approval_outside_allowlist { Decision::ask(rule, format!("{reason}; a human admin decides")) } else { Decision::deny(rule, reason) }
    };
    if m.shell.allowed_commands.is_empty() {
        return Some(Decision::deny("shell.allowed_commands", "this Box's shell may run no command"));
    }
    if let Some(opaque) = SHELL_OPAQUE.iter().find(|o| command.contains(**o)) {
        return Some(outside("shell.allowed_commands", format!("{:?} uses {opaque:?}, which the allowlist cannot vouch for", clip(command))));
    }
    for part in command.split(['&', '|', ';']).map(str::trim).filter(|p| !p.is_empty()) {
        let program = part.split_whitespace().find(|word| !is_assignment(word)).unwrap_or("");
        let name = program.rsplit('/').next().unwrap_or(program);
        if !m.shell.allowed_commands.iter().any(|a| a == program || a == name) {
            return Some(outside("shell.allowed_commands", format!("{:?} is not an allowed command", clip(program))));
        }
    }
    let cwd = text(input, &["cwd"]);
    let mut dirs = vec![cwd.map_or_else(|| workspace.to_string_lossy().into_owned(), str::to_owned)];
    if let Some(real) = cwd.and_then(|c| facts.real_paths.get(c)) {
        dirs.push(real.clone());
    }
    for dir in dirs {
        let inside = normal(workspace, &dir).is_some_and(|d| d.starts_with(workspace) || m.shell.allowed_cwd.iter().any(|a| path_matches(a, &d)));
        if !inside {
            return Some(outside("shell.allowed_cwd", format!("the command would run in {:?}, outside the workspace and allowed_cwd", clip(&dir))));
        }
    }
    None
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

fn url(m: &BoxManifest, url: Option<&str>) -> Option<Decision> {
    let Some(text) = url else {
        return Some(Decision::deny("network", "the call names no URL"));
    };
    let parsed = match url::Url::parse(text) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => u,
        _ => return Some(Decision::deny("network", format!("{:?} is not an http or https URL", clip(text)))),
    };
    let host = parsed.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    match m.network {
        Network::Full => None,
        Network::None => Some(Decision::deny("network", "this Box may not reach the network")),
        Network::Local => {
            let local = host == "localhost" || host.ends_with(".localhost") || host == "::1" || host.starts_with("127.");
            (!local).then(|| Decision::deny("network", format!("{host:?} is not this machine, and this Box reaches only local addresses")))
        }
        Network::Filtered => {
            let listed = m.url_allowlist.iter().any(|entry| host_listed(entry, &host));
            (!listed).then(|| Decision::deny("url_allowlist", format!("{host:?} is not in this Box's url_allowlist")))
        }
    }
}

/// An allowlist entry is a host name (its subdomains included), `*.` and a domain, or a
/// URL whose host is taken.
fn host_listed(entry: &str, host: &str) -> bool {
    let entry = entry.trim().to_ascii_lowercase();
    let entry = url::Url::parse(&entry).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or(entry);
    let domain = entry.strip_prefix("*.").unwrap_or(&entry);
    !domain.is_empty() && (host == domain || host.strip_suffix(domain).is_some_and(|rest| rest.ends_with('.')))
}

fn browser(m: &BoxManifest, input: &Value) -> Option<Decision> {
    if let Some(selector) = text(input, &["selector"])
        && let Some(gate) = m.browser.approval_required_selectors.iter().find(|s| !s.is_empty() && selector.contains(s.as_str()))
    {
        return Some(Decision::ask("browser.approval_required_selectors", format!("{:?} matches the gate {gate:?}", clip(selector))));
    }
    let texts: Vec<&str> = ["text", "label", "value"].iter().filter_map(|k| input.get(*k).and_then(Value::as_str)).collect();
    for pattern in &m.browser.approval_required_text_patterns {
        let matched = match regex::RegexBuilder::new(pattern).case_insensitive(true).size_limit(1 << 16).build() {
            Ok(re) => texts.iter().any(|t| re.is_match(t)),
            Err(_) => texts.iter().any(|t| t.to_lowercase().contains(&pattern.to_lowercase())),
        };
        if matched {
            return Some(Decision::ask("browser.approval_required_text_patterns", format!("the text matches the gate {pattern:?}")));
        }
    }
    None
}

fn notify(m: &BoxManifest, channel: &'static str, input: &Value) -> Option<Decision> {
    let Some(declared) = m.notify.get(channel) else {
        return Some(Decision::deny(format!("notify.{channel}"), format!("this Box declares no {channel} notifications")));
    };
    let broadcast = input.get("broadcast").and_then(Value::as_bool).unwrap_or(false);
    if broadcast && !declared.broadcast {
        return Some(Decision::deny(format!("notify.{channel}.broadcast"), "this Box may not broadcast"));
    }
    let to: Vec<&str> = match input.get("to").or_else(|| input.get("recipients")) {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if to.is_empty() && !broadcast {
        return Some(Decision::deny(format!("notify.{channel}.recipients"), "the call names no recipient"));
    }
    if !declared.recipients.is_empty()
        && let Some(stranger) = to.iter().find(|r| !declared.recipients.iter().any(|d| d == *r))
    {
        return Some(Decision::deny(format!("notify.{channel}.recipients"), format!("{:?} is not one of this Box's recipients", clip(stranger))));
    }
    None
}

/// Caller text quoted in a reason: at most 200 characters.
fn clip(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests;
