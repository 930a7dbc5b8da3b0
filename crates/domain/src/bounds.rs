//! How much a request may carry: a bound on every list and every text that reaches an event
//! (R-ARCH-6: nothing poisons the pipeline). An event travels as one bus message (NATS:
//! at most 1 MiB), so a request that would make a larger one must be refused up front,
//! naming the key and its limit, instead of being stored and then never relayed.
//!
//! Lengths are counted in characters (Unicode code points), as JSON Schema's `maxLength`
//! counts them, so the OpenAPI document can state the same numbers. The draft request's
//! bounds are chosen so that a draft at every bound at once, written in the characters
//! JSON escapes widest (`\u0001`: six bytes each), still makes a `DraftSubmitted` and a
//! `BoxActivated` under 512 KiB (`crates/drafts/src/tests.rs` proves it on a real store).
//! Any manifest, whatever its path in, is at most [`MAX_MANIFEST_JSON_BYTES`] as JSON.
//!
//! Tables name keys by path: `a.b` is key `b` of mapping `a`, `a[].b` key `b` of each entry
//! of list `a`, `a.*.b` key `b` of each value of mapping `a`. A key over its own bound is
//! reported once, without its entries (so ten thousand entries are one error, not ten
//! thousand), and its other checks are skipped.

use serde_json::{Map, Value};

use crate::error::FieldError;

/// The most one value may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Text of at most this many characters.
    Text(usize),
    /// A list of at most `items` texts of at most `chars` characters each (a single text,
    /// where a list may also be written as one, counts as one item).
    Texts { items: usize, chars: usize },
    /// A list of at most this many entries, each bounded by its own keys.
    Entries(usize),
    /// A mapping of at most `entries` keys of at most `key_chars` characters each.
    Keys { entries: usize, key_chars: usize },
    /// Any JSON value of at most this many bytes, written compactly.
    Json(usize),
}

use Bound::{Entries, Json, Keys, Text, Texts};

/// Any manifest as compact JSON, whatever its path in: an event that carries one stays
/// under 512 KiB. A draft at every bound makes less (see the module's doc).
pub const MAX_MANIFEST_JSON_BYTES: usize = 448 * 1024;

/// A rejection reason (`DraftRejected`).
pub const REASON_CHARS: usize = 2_000;
/// A user id assigned to a Box (`BoxUserAssigned`).
pub const USER_ID_CHARS: usize = 256;
/// A task described for the feasibility check (R-FEAS-1): no event carries it, but the
/// keyword match reads all of it.
pub const TASK_DESCRIPTION_CHARS: usize = 10_000;

const BOX_TYPE: Bound = Text(64);
const NAME: Bound = Text(200);
const OS_OPERATIONS: Bound = Texts { items: 64, chars: 32 };
const TOOLS: Bound = Texts { items: 100, chars: 100 };
const ALLOWED_APPS: Bound = Texts { items: 50, chars: 100 };
const URL_ALLOWLIST: Bound = Texts { items: 64, chars: 200 };
const FILE_ACCESS: Bound = Texts { items: 50, chars: 200 };
const PROHIBITED_ACTIONS: Bound = Texts { items: 50, chars: 200 };
const REQUIRED_ACCESS: [(&str, Bound); 8] = [
    ("required_access", Entries(16)),
    ("required_access[].url", Text(512)),
    ("required_access[].host", Text(253)),
    ("required_access[].user", Text(64)),
    ("required_access[].machine", Text(253)),
    ("required_access[].login", Text(128)),
    ("required_access[].vault", Text(128)),
    ("required_access[].item", Text(128)),
];

/// `purpose` of a draft request; the manifest's purpose also holds the success criteria.
pub const DRAFT_PURPOSE_CHARS: usize = 8_000;
/// `success_criteria` of a draft request.
pub const SUCCESS_CRITERIA: Bound = Texts { items: 20, chars: 200 };

/// Every bounded key of a draft request (`POST /api/v1/boxes/box-drafts`, `SubmitDraft`).
/// The keys it shares with the manifest have the manifest's bounds.
pub const DRAFT_REQUEST: &[(&str, Bound)] = &[
    ("box_type", BOX_TYPE),
    ("purpose", Text(DRAFT_PURPOSE_CHARS)),
    ("name", NAME),
    ("success_criteria", SUCCESS_CRITERIA),
    ("os_operations", OS_OPERATIONS),
    ("tools", TOOLS),
    ("allowed_apps", ALLOWED_APPS),
    ("url_allowlist", URL_ALLOWLIST),
    ("file_access", FILE_ACCESS),
    ("prohibited_actions", PROHIBITED_ACTIONS),
    REQUIRED_ACCESS[0],
    REQUIRED_ACCESS[1],
    REQUIRED_ACCESS[2],
    REQUIRED_ACCESS[3],
    REQUIRED_ACCESS[4],
    REQUIRED_ACCESS[5],
    REQUIRED_ACCESS[6],
    REQUIRED_ACCESS[7],
];

/// Every bounded key of a manifest, in the schema's order.
pub const MANIFEST: &[(&str, Bound)] = &[
    ("box_type", BOX_TYPE),
    ("version", Text(64)),
    ("name", NAME),
    ("description", Text(4_000)),
    ("capabilities", Texts { items: 64, chars: 100 }),
    ("resource_limits", Json(4 * 1024)),
    ("tool_policies", Json(16 * 1024)),
    ("config_defaults", Json(32 * 1024)),
    ("tools", TOOLS),
    ("os_operations", OS_OPERATIONS),
    ("file_access", FILE_ACCESS),
    ("url_allowlist", URL_ALLOWLIST),
    ("allowed_apps", ALLOWED_APPS),
    ("dangerous_tool_overrides", Keys { entries: 100, key_chars: 100 }),
    ("trigger_schedule", Text(100)),
    ("trigger_event", Text(200)),
    ("purpose", Text(16_000)),
    ("prohibited_actions", PROHIBITED_ACTIONS),
    ("business_procedure", Entries(50)),
    ("business_procedure[].description", Text(2_000)),
    ("business_procedure[].tool", Text(100)),
    ("business_procedure[].args_schema", Json(4 * 1024)),
    ("outputs", Texts { items: 50, chars: 200 }),
    ("llm.provider", Text(100)),
    ("llm.node", Text(100)),
    ("llm.min_tier", Json(100)),
    REQUIRED_ACCESS[0],
    REQUIRED_ACCESS[1],
    REQUIRED_ACCESS[2],
    REQUIRED_ACCESS[3],
    REQUIRED_ACCESS[4],
    REQUIRED_ACCESS[5],
    REQUIRED_ACCESS[6],
    REQUIRED_ACCESS[7],
    ("credentials.allowed_vaults", Texts { items: 50, chars: 128 }),
    ("credentials.token_env_var", Text(128)),
    ("shell.allowed_commands", Texts { items: 100, chars: 256 }),
    ("shell.allowed_cwd", Texts { items: 50, chars: 256 }),
    ("notify", Keys { entries: 8, key_chars: 64 }),
    ("notify.*.vault", Text(128)),
    ("notify.*.item", Text(128)),
    ("notify.*.recipients", Texts { items: 50, chars: 256 }),
    ("browser.approval_required_selectors", Texts { items: 50, chars: 256 }),
    ("browser.approval_required_text_patterns", Texts { items: 50, chars: 256 }),
];

/// The largest draft request the bounds admit: every key at its bound, texts made of `fill`
/// (box_type of `b`, os_operations valid names), `required_access` of the widest kind of
/// entry. `over` names one path of [`DRAFT_REQUEST`] to take one past its bound (its
/// count; `key[]` for its entries' length), for tests of the refusal. The size proofs
/// build on it.
pub fn draft_at_bounds(fill: char, over: Option<&str>) -> Value {
    let past = |path: &str, n: usize| if over == Some(path) { n + 1 } else { n };
    let text = |path: &str, n: usize| {
        let n = past(path, n);
        if path == "box_type" { "b".repeat(n) } else { fill.to_string().repeat(n) }
    };
    let mut body = Map::new();
    for (path, bound) in DRAFT_REQUEST {
        let value = match *bound {
            Text(n) if !path.contains('.') => Value::from(text(path, n)),
            Texts { items, chars } => {
                let ops = crate::OSOperation::ALL;
                let item = |i: usize| match *path {
                    "os_operations" => Value::from(ops[i % ops.len()].as_str()),
                    _ => Value::from(text(&format!("{path}[]"), chars)),
                };
                Value::Array((0..past(path, items)).map(item).collect())
            }
            Entries(n) => {
                let field = |key: &str| {
                    let at = format!("{path}[].{key}");
                    match of(DRAFT_REQUEST, &at) {
                        Some(Text(max)) => Value::from(text(&at, max)),
                        _ => Value::from(fill.to_string()),
                    }
                };
                let netrc = serde_json::json!({"type": "netrc_entry", "machine": field("machine"), "login": field("login"), "vault": field("vault"), "item": field("item")});
                // First the kind of entry that holds the key to take past its bound.
                let first = match over.and_then(|o| o.strip_prefix("required_access[].")) {
                    Some("url") => serde_json::json!({"type": "git_remote", "url": field("url")}),
                    Some("host" | "user") => serde_json::json!({"type": "ssh_target", "host": field("host"), "user": field("user")}),
                    _ => netrc.clone(),
                };
                let n = past(path, n);
                Value::Array(std::iter::once(first).chain(std::iter::repeat_n(netrc, n.saturating_sub(1))).collect())
            }
            _ => continue,
        };
        body.insert((*path).to_owned(), value);
    }
    body.insert("allow_network".into(), Value::from(true));
    Value::Object(body)
}

/// The bound of `path` in `table`, if it has one.
pub fn of(table: &[(&str, Bound)], path: &str) -> Option<Bound> {
    table.iter().find(|(p, _)| *p == path).map(|(_, b)| *b)
}

/// Everything over its bound in `obj`, each naming its key and the limit.
pub fn check(table: &[(&str, Bound)], obj: &Map<String, Value>) -> Vec<FieldError> {
    let mut keys: Vec<&str> = table.iter().map(|(path, _)| top(path)).collect();
    keys.dedup();
    keys.into_iter().filter_map(|key| obj.get(key).map(|value| check_key(table, key, value))).flatten().collect()
}

/// What is over its bound in the value of the top-level `key`. The key's own bound comes
/// first; when it fails, nothing inside is looked at. A key's path is written out only for
/// what is over (a request is checked on every submission, and is nearly always within).
pub fn check_key(table: &[(&str, Bound)], key: &str, value: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut at = Vec::new();
    for (path, bound) in table.iter().filter(|(path, _)| starts_with_key(path, key)) {
        let mut segments = path.split('.');
        let (name, each) = split_each(segments.next().unwrap_or_default());
        let rest: Vec<&str> = segments.collect();
        let mut found = |at: &[Seg<'_>], v: &Value| errors.extend(over(&|| written(at), v, *bound));
        at.clear();
        at.push(Seg::Key(name));
        if each {
            if let Value::Array(items) = value {
                for (i, item) in items.iter().enumerate() {
                    at.push(Seg::Index(i));
                    values_at(item, &rest, &mut at, &mut found);
                    at.pop();
                }
            }
        } else {
            values_at(value, &rest, &mut at, &mut found);
        }
        if rest.is_empty() && !each && !errors.is_empty() {
            // The key itself is over: its entries are not worth reading.
            return errors;
        }
    }
    errors
}

/// The top-level key a path starts with.
fn top(path: &str) -> &str {
    path.split(['.', '[']).next().unwrap_or(path)
}

/// Whether `path` starts with the top-level `key` (`top(path) == key`, without splitting:
/// every key of a manifest is looked up in the whole table).
fn starts_with_key(path: &str, key: &str) -> bool {
    let (path, key) = (path.as_bytes(), key.as_bytes());
    // The first byte rules out most entries before a comparison of the whole key.
    path.first() == key.first() && path.starts_with(key) && matches!(path.get(key.len()), None | Some(b'.' | b'['))
}

/// `name[]` -> (`name`, true).
fn split_each(segment: &str) -> (&str, bool) {
    match segment.strip_suffix("[]") {
        Some(name) => (name, true),
        None => (segment, false),
    }
}

/// One step of the path to a value: a mapping's key or a list's index.
#[derive(Debug, Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// The path as errors name it: `a.b`, `a[2].b`.
fn written(at: &[Seg<'_>]) -> String {
    let mut out = String::new();
    for seg in at {
        match seg {
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Seg::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

/// Hands `found` every value at `segments` below `value` (which `at` leads to), with its
/// path.
fn values_at<'a>(value: &'a Value, segments: &[&'a str], at: &mut Vec<Seg<'a>>, found: &mut dyn FnMut(&[Seg<'a>], &'a Value)) {
    let Some((first, rest)) = segments.split_first() else {
        found(at, value);
        return;
    };
    let Value::Object(map) = value else { return };
    if *first == "*" {
        for (k, v) in map {
            at.push(Seg::Key(k));
            values_at(v, rest, at, found);
            at.pop();
        }
        return;
    }
    let (name, each) = split_each(first);
    match map.get(name) {
        Some(Value::Array(items)) if each => {
            at.push(Seg::Key(name));
            for (i, item) in items.iter().enumerate() {
                at.push(Seg::Index(i));
                values_at(item, rest, at, found);
                at.pop();
            }
            at.pop();
        }
        Some(v) if !each => {
            at.push(Seg::Key(name));
            values_at(v, rest, at, found);
            at.pop();
        }
        _ => {}
    }
}

/// The characters of `text`, when they are more than `max` (a text of at most `max` bytes
/// is not counted: it has at most as many characters).
fn chars_over(text: &str, max: usize) -> Option<usize> {
    if text.len() <= max {
        return None;
    }
    Some(text.chars().count()).filter(|n| *n > max)
}

/// Bytes written, nothing kept: a value's size as compact JSON.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The errors of one value (which `at` names) against its bound; values of another type
/// are left to the type checks.
fn over(at: &dyn Fn() -> String, value: &Value, bound: Bound) -> Vec<FieldError> {
    let too_long = |key: String, max: usize, n: usize| FieldError::new(key, format!("is {n} characters long; at most {max} are allowed"));
    match (bound, value) {
        (Text(max) | Texts { chars: max, .. }, Value::String(s)) => chars_over(s, max).map(|n| too_long(at(), max, n)).into_iter().collect(),
        (Texts { items, .. } | Entries(items), Value::Array(list)) if list.len() > items => {
            vec![FieldError::new(at(), format!("has {} entries; at most {items} are allowed", list.len()))]
        }
        (Texts { chars: max, .. }, Value::Array(list)) => list
            .iter()
            .enumerate()
            .filter_map(|(i, item)| item.as_str().and_then(|s| chars_over(s, max)).map(|n| too_long(format!("{}[{i}]", at()), max, n)))
            .collect(),
        (Keys { entries, .. }, Value::Object(map)) if map.len() > entries => {
            vec![FieldError::new(at(), format!("has {} keys; at most {entries} are allowed", map.len()))]
        }
        (Keys { key_chars, .. }, Value::Object(map)) => match map.keys().filter_map(|k| chars_over(k, key_chars)).max() {
            Some(n) => vec![FieldError::new(at(), format!("has a key {n} characters long; at most {key_chars} are allowed"))],
            None => vec![],
        },
        (Json(max), v) => {
            let mut counted = Counted(0);
            let n = serde_json::to_writer(&mut counted, v).map_or(usize::MAX, |()| counted.0);
            if n > max { vec![FieldError::new(at(), format!("is {n} bytes as JSON; at most {max} are allowed"))] } else { vec![] }
        }
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keys(table: &[(&str, Bound)], v: Value) -> Vec<String> {
        let Value::Object(obj) = v else { panic!("an object") };
        check(table, &obj).into_iter().map(|e| e.key).collect()
    }

    #[test]
    fn a_path_starts_with_a_key_only_at_a_whole_segment() {
        // given paths of the manifest's table, then each belongs to its top-level key only
        for (path, key, expected) in [
            ("tools", "tools", true),
            ("tools", "tool", false),
            ("tool_policies", "tools", false),
            ("llm.provider", "llm", true),
            ("required_access[].url", "required_access", true),
            ("required_access[].url", "required", false),
            ("notify.*.vault", "notify", true),
        ] {
            assert_eq!(starts_with_key(path, key), expected, "{path} under {key}");
            assert_eq!(top(path) == key, expected, "{path}: the same answer as splitting it");
        }
    }

    #[test]
    fn a_key_over_its_count_is_one_error_naming_the_key_and_the_limit() {
        let many: Vec<Value> = (0..10_000).map(|i| json!({"type": "git_remote", "url": "x".repeat(600 + i % 2)})).collect();
        let obj = json!({"required_access": many});
        let errors = check(DRAFT_REQUEST, obj.as_object().expect("object"));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].key, "required_access");
        assert!(errors[0].message.contains("10000") && errors[0].message.contains("16"), "{}", errors[0].message);
    }

    #[test]
    fn texts_entries_keys_and_json_are_named_where_they_are_over() {
        let long = |n: usize| "あ".repeat(n);
        assert_eq!(keys(MANIFEST, json!({"purpose": long(16_000), "name": long(200)})), Vec::<String>::new(), "characters, not bytes");
        assert_eq!(keys(MANIFEST, json!({"purpose": long(16_001), "tools": ["Read", long(101), "Bash", long(101)]})), ["tools[1]", "tools[3]", "purpose"]);
        assert_eq!(
            keys(MANIFEST, json!({"required_access": [{"type": "git_remote", "url": "u"}, {"type": "ssh_target", "host": long(254), "user": "u"}]})),
            ["required_access[1].host"]
        );
        assert_eq!(
            keys(MANIFEST, json!({"notify": {"email": {"recipients": vec!["a"; 51]}, "line": {"vault": long(129)}}})),
            ["notify.line.vault", "notify.email.recipients"]
        );
        assert_eq!(keys(MANIFEST, json!({"notify": {long(65): {}}})), ["notify"]);
        assert_eq!(keys(MANIFEST, json!({"shell": {"allowed_cwd": long(257)}})), ["shell.allowed_cwd"], "one text where a list may be one");
        assert_eq!(keys(MANIFEST, json!({"config_defaults": {"k": "x".repeat(32 * 1024)}})), ["config_defaults"]);
        assert_eq!(keys(MANIFEST, json!({"business_procedure": [{"step": 1, "args_schema": {"a": "x".repeat(5000)}}]})), ["business_procedure[0].args_schema"]);
        assert_eq!(keys(MANIFEST, json!({"tools": 5, "purpose": ["not text"]})), Vec::<String>::new(), "wrong types are the type checks' to name");
    }

    #[test]
    fn a_draft_request_shares_the_manifests_bounds_but_for_purpose_and_its_criteria() {
        for (path, bound) in DRAFT_REQUEST {
            match *path {
                "purpose" => {
                    // The manifest's purpose holds the request's and every criterion.
                    let Some(Text(manifest_purpose)) = of(MANIFEST, "purpose") else { panic!("purpose is text") };
                    let Texts { items, chars } = SUCCESS_CRITERIA else { panic!("criteria are texts") };
                    let heading = crate::draft_request::SUCCESS_CRITERIA_HEADING.chars().count();
                    assert!(DRAFT_PURPOSE_CHARS + heading + items * (chars + 3) <= manifest_purpose);
                }
                "success_criteria" => assert_eq!(of(MANIFEST, path), None),
                _ => assert_eq!(of(MANIFEST, path), Some(*bound), "{path}"),
            }
        }
        let longest = crate::OSOperation::ALL.iter().map(|op| op.as_str().len()).max().unwrap_or_default();
        assert!(matches!(OS_OPERATIONS, Texts { chars, .. } if chars >= longest));
        assert!(matches!(BOX_TYPE, Text(64)), "the box_type pattern's length");
    }

    #[test]
    fn every_manifest_key_named_is_a_key_of_the_schema() {
        for (path, _) in MANIFEST {
            assert!(crate::manifest::MANIFEST_KEYS.contains(&top(path)), "{path}");
        }
    }
}
