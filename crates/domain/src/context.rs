//! The agent context (R-MAN-6, seed 000 §2.1): the XML block that carries a Box's manifest
//! into its system prompt, and the `config_defaults` placeholder substitution that feeds it.
//!
//! `config_defaults` is never dumped into the context: operating parameters reach the agent
//! only where a human wrote a `{key}` or `<key>` placeholder into a `business_procedure`
//! step. The seed renders substituted values with Python's `str()`, so [`python_str`]
//! reproduces that rendering byte for byte (agents and prompts written against the seed see
//! the same text).
//!
//! # Layout
//!
//! [`BoxManifest::to_agent_context_xml`] writes one element per line, indented by two spaces
//! per nesting level, with no trailing newline. Leaf elements (`purpose`, `action`, `tool`,
//! `description`, `args_schema`) keep their text on the element's line (text is written
//! verbatim, so a multi-line purpose stays multi-line). A list container with no entries is
//! written as an open and close tag on one line (`<tools></tools>`), so that "nothing
//! allowed" is visible rather than absent.
//!
//! ```text
//! <box_context box_type="market-watch" version="1.0.0">
//!   <purpose>Watch prices</purpose>
//!   <prohibited_actions>
//!     <action>Never buy</action>
//!   </prohibited_actions>
//!   <tools>
//!     <tool>browser:navigate</tool>
//!   </tools>
//!   <business_procedure>
//!     <step number="1" tool="browser:navigate">
//!       <description>Check ['x']</description>
//!       <args_schema>{&quot;url&quot;:&quot;https://example.com&quot;}</args_schema>
//!     </step>
//!   </business_procedure>
//! </box_context>
//! ```

use std::fmt::Write as _;

use quick_xml::escape::escape;
use serde_json::{Map, Number, Value};

use crate::manifest::BoxManifest;

/// Two spaces per nesting level (see the module docs for the layout).
const INDENT: &str = "  ";

/// Python `str()` of a JSON value, as the seed renders `config_defaults` values into
/// placeholders: a top-level string as is, everything else as Python `repr()` (`True`,
/// `None`, `1.0`, `1e+16`, `['x', 1]`, `{'a': 1}`). Dict keys follow the map's iteration
/// order.
pub fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            write_python_repr(&mut out, other);
            out
        }
    }
}

/// Python `repr()`: the form values take inside lists and dicts.
fn write_python_repr(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&python_number(n)),
        Value::String(s) => write_python_str_repr(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_repr(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, value)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_str_repr(out, key);
                out.push_str(": ");
                write_python_repr(out, value);
            }
            out.push('}');
        }
    }
}

/// Integers print as their digits; floats as Python's shortest round-trip `repr`.
fn python_number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    match n.as_f64() {
        Some(f) => python_float_repr(f),
        None => n.to_string(),
    }
}

/// Python `float.__repr__`: the shortest digits that round-trip (Rust's `{:e}` gives the
/// same digits), positional when the decimal exponent is in `-4..16`, otherwise
/// scientific with a signed, at least two-digit exponent (`1e+16`, `1.5e-05`).
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".to_owned() } else { "-inf".to_owned() };
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if f == 0.0 {
        return format!("{sign}0.0");
    }
    let sci = format!("{:e}", f.abs());
    let Some((mantissa, exponent)) = sci.split_once('e') else {
        return f.to_string();
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return f.to_string();
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // Position of the decimal point relative to the start of `digits` (Python's `decpt`).
    let decpt = exponent + 1;
    if !(-4 < decpt && decpt <= 16) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.unsigned_abs());
    }
    let len = digits.len() as i32;
    let body = if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat(decpt.unsigned_abs() as usize))
    } else if decpt < len {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{int}.{frac}")
    } else {
        format!("{digits}{}.0", "0".repeat((decpt - len) as usize))
    };
    format!("{sign}{body}")
}

/// Python `str.__repr__`: single quotes unless the text has `'` and no `"`; backslash,
/// the chosen quote, `\t`, `\n`, `\r` escaped; other non-printable characters as `\xNN`,
/// `\uNNNN` or `\UNNNNNNNN`.
fn write_python_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_python_printable(c) => out.push(c),
            c => {
                let code = u32::from(c);
                // Writing to a String cannot fail.
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else if code < 0x1_0000 {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character: false for control (Cc), format (Cf),
/// private-use (Co), line/paragraph separator (Zl, Zp) and space separators (Zs) other
/// than the ASCII space, and for unassigned code points (Cn).
///
/// The crate carries no Unicode category database, so Cf and Zs are listed from Unicode
/// 15, and Cn covers only the noncharacters and the wholly unassigned planes 4-13 and gaps
/// of plane 14; a code point unassigned elsewhere is treated as printable (Python would
/// escape it). Every assigned character renders as Python renders it.
fn is_python_printable(c: char) -> bool {
    let code = u32::from(c);
    if c == ' ' {
        return true;
    }
    if c.is_control() {
        return false;
    }
    let not_printable = matches!(
        code,
        // Zs (space separators other than U+0020), Zl, Zp
        0x00A0 | 0x1680 | 0x2000..=0x200A | 0x202F | 0x205F | 0x3000 | 0x2028 | 0x2029
        // Cf (format)
        | 0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2
        | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
        | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F
        | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F
        // Co (private use)
        | 0xE000..=0xF8FF | 0xF_0000..=0xF_FFFD | 0x10_0000..=0x10_FFFD
        // Cn: noncharacters, unassigned planes 4-13 and the unassigned parts of plane 14
        | 0xFDD0..=0xFDEF | 0x4_0000..=0xD_FFFF | 0xE0000 | 0xE0002..=0xE001F
        | 0xE0080..=0xE00FF | 0xE01F0..=0xE_FFFF
    ) || (code & 0xFFFE) == 0xFFFE;
    !not_printable
}

/// Replaces each `{key}` and `<key>` whose key is a top-level `config_defaults` key with
/// [`python_str`] of its value, the only way `config_defaults` reaches the agent context
/// (R-MAN-6, seed 000 §2.1).
///
/// A key holds no delimiter of its own kind (`{a{b}` can only match `{b}`), unknown keys
/// and unbalanced delimiters stay as written, and the scan is a single pass: substituted
/// text is never scanned again, so a value that itself looks like a placeholder is inert.
/// Runs in linear time, so a hostile manifest full of `{` cannot stall rendering.
pub fn substitute_placeholders(text: &str, config_defaults: &Map<String, Value>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    while let Some(offset) = text[pos..].find(['{', '<']) {
        let open = pos + offset;
        out.push_str(&text[pos..open]);
        let (opener, closer) = if text.as_bytes()[open] == b'{' { ('{', '}') } else { ('<', '>') };
        let body_start = open + 1;
        // All delimiters are ASCII, so every index found here is a char boundary.
        let placeholder = text[body_start..].find([opener, closer]).and_then(|len| {
            let end = body_start + len;
            if text[end..].starts_with(closer) { config_defaults.get(&text[body_start..end]).map(|value| (end, value)) } else { None }
        });
        match placeholder {
            Some((end, value)) => {
                out.push_str(&python_str(value));
                pos = end + closer.len_utf8();
            }
            None => {
                // Only the opener is consumed: a placeholder may still start inside.
                out.push(opener);
                pos = body_start;
            }
        }
    }
    out.push_str(&text[pos..]);
    out
}

/// Substitutes placeholders in every string value, at any depth; keys are left alone
/// because they name arguments, not parameters.
fn substitute_in_value(value: &Value, config_defaults: &Map<String, Value>) -> Value {
    match value {
        Value::String(s) => Value::String(substitute_placeholders(s, config_defaults)),
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute_in_value(v, config_defaults)).collect()),
        Value::Object(map) => Value::Object(substitute_in_map(map, config_defaults)),
        other => other.clone(),
    }
}

fn substitute_in_map(map: &Map<String, Value>, config_defaults: &Map<String, Value>) -> Map<String, Value> {
    map.iter().map(|(k, v)| (k.clone(), substitute_in_value(v, config_defaults))).collect()
}

/// Appends `<name>text</name>` on its own line, text escaped.
fn push_leaf(out: &mut String, depth: usize, name: &str, text: &str) {
    push_line_start(out, depth);
    let _ = write!(out, "<{name}>{}</{name}>", escape(text));
}

/// Appends a container of leaves, or `<name></name>` when there are none.
fn push_list(out: &mut String, depth: usize, name: &str, item: &str, items: &[String]) {
    push_line_start(out, depth);
    if items.is_empty() {
        let _ = write!(out, "<{name}></{name}>");
        return;
    }
    let _ = write!(out, "<{name}>");
    for text in items {
        push_leaf(out, depth + 1, item, text);
    }
    push_line_start(out, depth);
    let _ = write!(out, "</{name}>");
}

/// A newline (except at the very start) and the indentation for `depth`.
fn push_line_start(out: &mut String, depth: usize) {
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(&INDENT.repeat(depth));
}

impl BoxManifest {
    /// R-MAN-6: the manifest as the agent sees it: purpose, prohibited actions, effective
    /// tools (the whitelist actually enforced, not just the declared `tools`) and the
    /// business procedure, every text and attribute XML-escaped. Step descriptions and
    /// string values inside `args_schema` have their `config_defaults` placeholders
    /// substituted; `config_defaults` itself is never written. `args_schema` is compact
    /// JSON. See the module docs for the exact layout.
    pub fn to_agent_context_xml(&self) -> String {
        let mut out = String::new();
        push_line_start(&mut out, 0);
        let _ = write!(out, "<box_context box_type=\"{}\" version=\"{}\">", escape(self.box_type.to_string()), escape(self.version.as_str()));
        push_leaf(&mut out, 1, "purpose", &self.purpose);
        push_list(&mut out, 1, "prohibited_actions", "action", &self.prohibited_actions);
        push_list(&mut out, 1, "tools", "tool", &self.effective_tools());

        push_line_start(&mut out, 1);
        if self.business_procedure.is_empty() {
            out.push_str("<business_procedure></business_procedure>");
        } else {
            out.push_str("<business_procedure>");
            for step in &self.business_procedure {
                push_line_start(&mut out, 2);
                let _ = write!(out, "<step number=\"{}\" tool=\"{}\">", step.step, escape(step.tool.as_str()));
                let description = substitute_placeholders(&step.description, &self.config_defaults);
                push_leaf(&mut out, 3, "description", &description);
                let args = substitute_in_map(&step.args_schema, &self.config_defaults);
                // A map of JSON values always serializes; the fallback only keeps this total.
                let json = serde_json::to_string(&args).unwrap_or_else(|_| "{}".to_owned());
                push_leaf(&mut out, 3, "args_schema", &json);
                push_line_start(&mut out, 2);
                out.push_str("</step>");
            }
            push_line_start(&mut out, 1);
            out.push_str("</business_procedure>");
        }
        push_line_start(&mut out, 0);
        out.push_str("</box_context>");
        out
    }
}

/// A Worker's input as its runner reads it after the context (R-HOST-1): one `<input>`
/// element per transcript entry, each segment a `<segment kind="text|ticket_ref|
/// objective_ref">` with its value XML-escaped, every element on its own line:
/// `<input>\n<segment kind="text">...</segment>\n</input>\n`.
pub fn input_xml(segments: &[crate::worker::Segment]) -> String {
    let mut out = String::from("<input>\n");
    for segment in segments {
        let _ = writeln!(out, "<segment kind=\"{}\">{}</segment>", segment.kind(), escape(segment.value()));
    }
    out.push_str("</input>\n");
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn manifest(yaml: &str) -> BoxManifest {
        BoxManifest::from_yaml_str(yaml).expect("test manifest is valid").manifest
    }

    fn config(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("test config must be an object, got {other}"),
        }
    }

    // ---- python_str -------------------------------------------------------------------

    #[test]
    fn given_scalars_when_python_str_then_python_spelling() {
        assert_eq!(python_str(&json!("plain 'text'")), "plain 'text'");
        assert_eq!(python_str(&json!(true)), "True");
        assert_eq!(python_str(&json!(false)), "False");
        assert_eq!(python_str(&Value::Null), "None");
        assert_eq!(python_str(&json!(42)), "42");
        assert_eq!(python_str(&json!(-7)), "-7");
        assert_eq!(python_str(&json!(u64::MAX)), "18446744073709551615");
    }

    #[test]
    fn given_floats_when_python_str_then_python_float_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1.5, "1.5"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
        ];
        for (f, expected) in cases {
            assert_eq!(python_str(&json!(f)), expected, "repr of {f:e}");
        }
    }

    #[test]
    fn given_containers_when_python_str_then_python_repr() {
        assert_eq!(python_str(&json!(["x", 1])), "['x', 1]");
        assert_eq!(python_str(&json!({"a": 1, "b": [true, null]})), "{'a': 1, 'b': [True, None]}");
        assert_eq!(python_str(&json!([])), "[]");
        assert_eq!(python_str(&json!({})), "{}");
        assert_eq!(python_str(&json!([[1.0], {"k": false}])), "[[1.0], {'k': False}]");
    }

    #[test]
    fn given_strings_inside_containers_when_python_str_then_python_string_repr() {
        assert_eq!(python_str(&json!(["it's"])), r#"["it's"]"#);
        assert_eq!(python_str(&json!(["say \"hi\""])), r#"['say "hi"']"#);
        assert_eq!(python_str(&json!(["it's \"both\""])), r#"['it\'s "both"']"#);
        assert_eq!(python_str(&json!(["a\\b\n\r\t"])), r"['a\\b\n\r\t']");
        assert_eq!(python_str(&json!(["\u{0}\u{7f}\u{85}\u{a0}"])), r"['\x00\x7f\x85\xa0']");
        assert_eq!(python_str(&json!(["\u{200b}\u{2028}\u{feff}"])), r"['\u200b\u2028\ufeff']");
        assert_eq!(python_str(&json!(["\u{e0001}\u{10fffd}"])), r"['\U000e0001\U0010fffd']");
        assert_eq!(python_str(&json!(["日本語 é 😀 "])), "['日本語 é 😀 ']");
        assert_eq!(python_str(&json!({"k'ey": "v"})), r#"{"k'ey": 'v'}"#);
    }

    // ---- substitute_placeholders ------------------------------------------------------

    #[test]
    fn given_brace_and_angle_placeholders_when_substituting_then_both_replaced() {
        let cfg = config(json!({"items": ["x"], "limit": 3}));
        assert_eq!(substitute_placeholders("watch {items} up to <limit>", &cfg), "watch ['x'] up to 3");
    }

    #[test]
    fn given_nested_values_when_substituting_then_python_repr() {
        let cfg = config(json!({"d": {"a": 1}, "l": ["x"], "t": true, "n": null, "f": 1.5, "s": "plain"}));
        assert_eq!(substitute_placeholders("{d}|{l}|{t}|{n}|{f}|{s}", &cfg), "{'a': 1}|['x']|True|None|1.5|plain");
    }

    #[test]
    fn given_unknown_or_unbalanced_placeholders_when_substituting_then_left_as_is() {
        let cfg = config(json!({"a": 1}));
        for text in ["{unknown}", "<unknown>", "{a", "a}", "<a", "{ a }", "{}", "<>", "}{a", "{a>", "<a}"] {
            assert_eq!(substitute_placeholders(text, &cfg), text);
        }
    }

    #[test]
    fn given_doubled_or_mixed_delimiters_when_substituting_then_innermost_placeholder_replaced() {
        let cfg = config(json!({"a": 1, "b": "B"}));
        assert_eq!(substitute_placeholders("{{a}}", &cfg), "{1}");
        assert_eq!(substitute_placeholders("<<a>>", &cfg), "<1>");
        assert_eq!(substitute_placeholders("{x<a>y}", &cfg), "{x1y}");
        assert_eq!(substitute_placeholders("<{b}>", &cfg), "<B>");
        assert_eq!(substitute_placeholders("{a}{b}<a><b>", &cfg), "1B1B");
    }

    #[test]
    fn given_value_that_looks_like_a_placeholder_when_substituting_then_single_pass() {
        let cfg = config(json!({"a": "{b}", "b": "SECOND"}));
        assert_eq!(substitute_placeholders("{a}", &cfg), "{b}");
    }

    #[test]
    fn given_multibyte_text_when_substituting_then_replaced_around_it() {
        let cfg = config(json!({"品目": ["株"], "a": "é"}));
        assert_eq!(substitute_placeholders("監視 {品目} と <a>「{未知}」", &cfg), "監視 ['株'] と é「{未知}」");
    }

    #[test]
    fn given_nested_config_key_when_substituting_then_only_top_level_keys_count() {
        let cfg = config(json!({"outer": {"inner": 1}}));
        assert_eq!(substitute_placeholders("{inner} {outer.inner}", &cfg), "{inner} {outer.inner}");
    }

    // ---- to_agent_context_xml (R-MAN-6) -----------------------------------------------

    #[test]
    fn given_small_manifest_when_rendering_context_then_exact_r_man_6_xml() {
        let m = manifest(
            r#"
box_type: market-watch
version: "1.2.0"
purpose: Watch prices
prohibited_actions:
  - Never buy
tools: [Read]
os_operations: ["browser:navigate"]
config_defaults:
  watch_items: ["x"]
  threshold: 1.5
business_procedure:
  - step: 1
    description: "Check {watch_items} below <threshold>"
    tool: "browser:navigate"
    args_schema:
      url: "https://example.com/{watch_items}"
      limit: 3
  - step: 2
    tool: Read
"#,
        );
        let expected = r#"<box_context box_type="market-watch" version="1.2.0">
  <purpose>Watch prices</purpose>
  <prohibited_actions>
    <action>Never buy</action>
  </prohibited_actions>
  <tools>
    <tool>Read</tool>
    <tool>browser:navigate</tool>
  </tools>
  <business_procedure>
    <step number="1" tool="browser:navigate">
      <description>Check [&apos;x&apos;] below 1.5</description>
      <args_schema>{&quot;url&quot;:&quot;https://example.com/[&apos;x&apos;]&quot;,&quot;limit&quot;:3}</args_schema>
    </step>
    <step number="2" tool="Read">
      <description></description>
      <args_schema>{}</args_schema>
    </step>
  </business_procedure>
</box_context>"#;
        assert_eq!(m.to_agent_context_xml(), expected);
    }

    #[test]
    fn given_empty_lists_when_rendering_context_then_empty_containers_on_one_line() {
        let m = manifest("box_type: idle-box\npurpose: Nothing yet\n");
        let expected = "<box_context box_type=\"idle-box\" version=\"1.0.0\">\n  <purpose>Nothing yet</purpose>\n  <prohibited_actions></prohibited_actions>\n  <tools></tools>\n  <business_procedure></business_procedure>\n</box_context>";
        assert_eq!(m.to_agent_context_xml(), expected);
    }

    #[test]
    fn given_xml_special_characters_when_rendering_context_then_text_and_attributes_escaped() {
        // R-MAN-6: everything is escaped, so manifest text cannot close or forge elements.
        let m = manifest(
            r#"
box_type: esc-box
version: "1.0.0"
purpose: "a < b & c \"q\" </purpose><injected/>"
prohibited_actions: ["never <delete> & \"drop\""]
tools: ["x<y&\"z\""]
business_procedure:
  - step: 7
    tool: "t\"<&>"
    description: "<b> & {nothing}"
    args_schema: {"k<": "v&\""}
"#,
        );
        let xml = m.to_agent_context_xml();
        assert!(xml.contains("<purpose>a &lt; b &amp; c &quot;q&quot; &lt;/purpose&gt;&lt;injected/&gt;</purpose>"), "{xml}");
        assert!(xml.contains("<action>never &lt;delete&gt; &amp; &quot;drop&quot;</action>"), "{xml}");
        assert!(xml.contains("<tool>x&lt;y&amp;&quot;z&quot;</tool>"), "{xml}");
        assert!(xml.contains("<step number=\"7\" tool=\"t&quot;&lt;&amp;&gt;\">"), "{xml}");
        assert!(xml.contains("<description>&lt;b&gt; &amp; {nothing}</description>"), "{xml}");
        assert!(xml.contains("<args_schema>{&quot;k&lt;&quot;:&quot;v&amp;\\&quot;&quot;}</args_schema>"), "{xml}");
        assert!(!xml.contains("<injected/>"));
    }

    #[test]
    fn given_secret_looking_config_defaults_when_not_referenced_then_absent_from_context() {
        // R-MAN-6 / seed 000 §2.1: config_defaults is never dumped into the context.
        let m = manifest(
            r#"
box_type: secret-box
purpose: Do work
config_defaults:
  api_hint: "sk-live-DO-NOT-LEAK-4242"
  nested: {deep: "ZZ-NESTED-SECRET-ZZ"}
business_procedure:
  - step: 1
    tool: Read
    description: "Use {unknown} only"
    args_schema: {"q": "<also_unknown>"}
"#,
        );
        let xml = m.to_agent_context_xml();
        for leaked in ["sk-live-DO-NOT-LEAK-4242", "ZZ-NESTED-SECRET-ZZ", "config_defaults", "api_hint", "nested"] {
            assert!(!xml.contains(leaked), "{leaked} leaked into {xml}");
        }
        assert!(xml.contains("<description>Use {unknown} only</description>"), "{xml}");
        assert!(xml.contains("&lt;also_unknown&gt;"), "{xml}");
    }

    #[test]
    fn given_referenced_config_default_when_rendering_context_then_only_that_value_appears() {
        // R-MAN-6: the placeholder is the one way a config_defaults value reaches the agent.
        let m = manifest(
            r#"
box_type: ref-box
purpose: Do work
config_defaults:
  region: "EU-WEST-MARKER"
  other: "OTHER-MARKER"
business_procedure:
  - step: 1
    tool: Read
    description: "Region {region}"
"#,
        );
        let xml = m.to_agent_context_xml();
        assert!(xml.contains("<description>Region EU-WEST-MARKER</description>"), "{xml}");
        assert!(!xml.contains("OTHER-MARKER"), "{xml}");
    }

    #[test]
    fn given_nested_args_schema_when_rendering_context_then_every_string_value_substituted() {
        // R-MAN-6: substitution reaches string values at any depth; keys stay as written.
        let m = manifest(
            r#"
box_type: nest-box
purpose: Do work
config_defaults:
  flag: true
  opts: {a: 1}
  none: null
business_procedure:
  - step: 1
    tool: Read
    args_schema:
      "{flag}": "<none>"
      list: ["{opts}", 5, {inner: "{flag}"}]
"#,
        );
        let xml = m.to_agent_context_xml();
        let expected = "<args_schema>{&quot;{flag}&quot;:&quot;None&quot;,&quot;list&quot;:[&quot;{&apos;a&apos;: 1}&quot;,5,{&quot;inner&quot;:&quot;True&quot;}]}</args_schema>";
        assert!(xml.contains(expected), "{xml}");
    }

    // ---- properties -------------------------------------------------------------------

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c{}<>]{0,3}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn config_map() -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::btree_map("([a-c{}<>]|\\PC){0,3}", json_value(), 0..5).prop_map(|m| m.into_iter().collect())
    }

    /// Text dense in delimiters and short keys, so that placeholders actually occur.
    fn placeholder_text() -> impl Strategy<Value = String> {
        "([{}<>]|[a-c]|\\{[a-c]\\}|<[a-c]>|\\PC){0,40}"
    }

    proptest! {
        #[test]
        fn given_any_text_and_config_when_substituting_then_never_panics(
            text in prop_oneof![placeholder_text(), "\\PC*", ".*"],
            cfg in config_map(),
        ) {
            let _ = substitute_placeholders(&text, &cfg);
        }

        #[test]
        fn given_text_without_openers_when_substituting_then_unchanged(text in "[^{<]*", cfg in config_map()) {
            prop_assert_eq!(substitute_placeholders(&text, &cfg), text);
        }

        #[test]
        fn given_empty_config_when_substituting_then_unchanged(text in placeholder_text()) {
            prop_assert_eq!(substitute_placeholders(&text, &Map::new()), text);
        }

        #[test]
        fn given_any_value_when_python_str_then_never_panics(v in json_value()) {
            let _ = python_str(&v);
        }

        #[test]
        fn given_any_finite_float_when_python_str_then_it_round_trips(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            // Python's repr is the shortest text that parses back to the same float.
            let text = python_float_repr(f);
            prop_assert_eq!(text.parse::<f64>().ok(), Some(f), "{}", text);
        }
    }
}
