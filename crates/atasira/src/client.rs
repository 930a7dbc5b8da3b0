//! Client verbs over the REST API (R-CLI-1): `atasira workers create|show|list`. They
//! speak to a running gateway (`--url`, `ATASIRA_BFF_URL`) with a personal access token
//! (`--token`, `ATASIRA_PAT`), print a table (or the API's JSON with `--json`) and exit 0
//! when the API answered with success, 1 when it refused, 2 on a usage error, 3 when the
//! gateway could not be reached.

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgMatches, Args, Subcommand};
use serde_json::{Value, json};

/// Exit codes of the client verbs.
pub const OK: u8 = 0;
pub const REFUSED: u8 = 1;
pub const USAGE: u8 = 2;
pub const UNREACHABLE: u8 = 3;

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Where the API is and who calls it, shared by every client verb.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the REST API (the gateway `atasira dev` or `atasira serve gateway` runs).
    #[arg(long, env = "ATASIRA_BFF_URL", default_value = "http://127.0.0.1:8080", value_name = "URL")]
    pub url: String,
    /// Personal access token to call the API with (`atasira tokens create` issues one).
    #[arg(long, env = "ATASIRA_PAT", hide_env_values = true, value_name = "PAT")]
    pub token: Option<String>,
    /// Print the API's JSON answer (refusals too) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `atasira workers ...`.
#[derive(Debug, Subcommand)]
pub enum WorkersCommand {
    /// Launch a Worker of an active Box in one request. Give the input as segments, in
    /// order: --text, --ticket and --objective, each as often as needed (at least one).
    /// Running it again with the same --launch-id and the same input answers the same
    /// Worker; the same --launch-id with other input is refused.
    Create {
        /// The Box to launch the Worker of (its box_id).
        #[arg(long = "box", value_name = "BOX_ID")]
        box_id: String,
        /// Names this launch, so that retrying it never makes a second Worker: 1 to 128
        /// letters, digits, '-', '_', '.', ':'.
        #[arg(long, value_name = "ID")]
        launch_id: String,
        /// The Worker's role, a name of your choosing (optional; none by default).
        #[arg(long, value_name = "ROLE")]
        role: Option<String>,
        /// A label KEY=VALUE of the Worker (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// A text segment of the Worker's initial input (repeatable).
        #[arg(long, value_name = "TEXT")]
        text: Vec<String>,
        /// A ticket the Worker is to work on, by reference (repeatable).
        #[arg(long, value_name = "TICKET")]
        ticket: Vec<String>,
        /// An objective the Worker is to work towards, by reference (repeatable).
        #[arg(long, value_name = "OBJECTIVE")]
        objective: Vec<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show a Worker with its transcript, or with --provenance the chain from the human
    /// approval of its Box to the configuration it runs.
    Show {
        /// The Worker's id (wkr_...).
        worker_id: String,
        /// Show where the Worker's configuration comes from: the approval, the activation,
        /// each recorded edit, the bundle and the Worker, with their events and audit rows.
        #[arg(long)]
        provenance: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// List a Box's Workers, oldest first.
    List {
        /// The Box whose Workers to list (its box_id).
        #[arg(long = "box", value_name = "BOX_ID")]
        box_id: String,
        /// At most this many Workers (default 50, at most 200).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// Continue after this cursor (the "next page" a previous list printed).
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
}

/// A finished client verb: its exit code (see the module documentation).
pub fn workers(command: WorkersCommand, matches: Option<&ArgMatches>) -> ExitCode {
    ExitCode::from(run(command, matches))
}

fn run(command: WorkersCommand, matches: Option<&ArgMatches>) -> u8 {
    match command {
        WorkersCommand::Create { box_id, launch_id, role, labels, text, ticket, objective, connection } => {
            let input = match ordered_input(matches, &text, &ticket, &objective) {
                Ok(input) => input,
                Err(message) => return usage(&message),
            };
            let labels = match parse_labels(&labels) {
                Ok(labels) => labels,
                Err(message) => return usage(&message),
            };
            let mut body = json!({"launch_id": launch_id, "input": input});
            if let Some(role) = role {
                body["role"] = json!(role);
            }
            if !labels.is_empty() {
                body["labels"] = json!(labels);
            }
            let path = format!("/api/v1/boxes/{}/workers", segment(&box_id));
            call(&connection, "POST", &path, Some(&body), |status, worker| {
                println!("{}", if status == 201 { "launched" } else { "launched before (same launch_id and request)" });
                print_worker(worker);
            })
        }
        WorkersCommand::Show { worker_id, provenance, connection } => {
            if provenance {
                call(&connection, "GET", &format!("/api/v1/workers/{}/provenance", segment(&worker_id)), None, |_, p| print_provenance(p))
            } else {
                call(&connection, "GET", &format!("/api/v1/workers/{}", segment(&worker_id)), None, |_, w| print_worker(w))
            }
        }
        WorkersCommand::List { box_id, limit, cursor, connection } => {
            let mut query = Vec::new();
            if let Some(limit) = limit {
                query.push(format!("limit={limit}"));
            }
            if let Some(cursor) = cursor {
                query.push(format!("cursor={}", segment(&cursor)));
            }
            let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
            call(&connection, "GET", &format!("/api/v1/boxes/{}/workers{query}", segment(&box_id)), None, |_, page| print_list(page))
        }
    }
}

fn usage(message: &str) -> u8 {
    eprintln!("atasira: {message}");
    USAGE
}

/// The input segments in the order they were given on the command line (clap keeps each
/// flag's values apart; their indices tell the order).
fn ordered_input(matches: Option<&ArgMatches>, text: &[String], ticket: &[String], objective: &[String]) -> Result<Vec<Value>, String> {
    let mut segments: Vec<(usize, &str, &str)> = Vec::new();
    for (id, kind, values) in [("text", "text", text), ("ticket", "ticket_ref", ticket), ("objective", "objective_ref", objective)] {
        let indices: Vec<usize> = matches.and_then(|m| m.indices_of(id)).map(Iterator::collect).unwrap_or_default();
        for (i, value) in values.iter().enumerate() {
            // Without indices (a caller that built the command itself), the kinds follow
            // one another in this order.
            let at = indices.get(i).copied().unwrap_or(usize::MAX / 2 + segments.len());
            segments.push((at, kind, value));
        }
    }
    if segments.is_empty() {
        return Err("give the Worker some input: --text, --ticket or --objective (at least one)".to_owned());
    }
    segments.sort_by_key(|(at, _, _)| *at);
    Ok(segments.into_iter().map(|(_, kind, value)| json!({"kind": kind, "value": value})).collect())
}

fn parse_labels(labels: &[String]) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut out = std::collections::BTreeMap::new();
    for label in labels {
        let (key, value) = label.split_once('=').ok_or_else(|| format!("--label {label:?} is not KEY=VALUE"))?;
        if out.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("--label {key} is given more than once"));
        }
    }
    Ok(out)
}

/// A path segment, percent-encoded (every byte but unreserved characters).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// Sends one request and prints its answer: `show` for a success, the error for a refusal.
fn call(connection: &Connection, method: &str, path: &str, body: Option<&Value>, show: impl FnOnce(u16, &Value)) -> u8 {
    let Some(token) = connection.token.as_deref().filter(|t| !t.is_empty()) else {
        return usage("no token: pass --token or set ATASIRA_PAT");
    };
    let url = format!("{}{path}", connection.url.trim_end_matches('/'));
    let agent = ureq::AgentBuilder::new().timeout(TIMEOUT).build();
    let request = agent.request(method, &url).set("Authorization", &format!("Bearer {token}"));
    let answer = match body {
        Some(body) => request.send_json(body.clone()),
        None => request.call(),
    };
    let (status, response) = match answer {
        Ok(response) => (response.status(), response),
        Err(ureq::Error::Status(status, response)) => (status, response),
        Err(ureq::Error::Transport(e)) => {
            eprintln!("atasira: cannot reach the API at {}: {e}", connection.url);
            return UNREACHABLE;
        }
    };
    let text = match response.into_string() {
        Ok(text) => text,
        Err(e) => {
            eprintln!("atasira: the API's answer could not be read: {e}");
            return UNREACHABLE;
        }
    };
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if connection.json {
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
    }
    if (200..300).contains(&status) {
        if !connection.json {
            show(status, &value);
        }
        return OK;
    }
    let code = value["error"].as_str().unwrap_or("error");
    let message = value["message"].as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
    eprintln!("atasira: refused ({status} {code}): {message}");
    if let Some(details) = value.get("details").and_then(Value::as_array) {
        for d in details {
            eprintln!("  {}: {}", d["key"].as_str().unwrap_or_default(), d["message"].as_str().unwrap_or_default());
        }
    }
    REFUSED
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn labels_text(labels: &Value) -> String {
    let pairs: Vec<String> = labels.as_object().into_iter().flatten().map(|(k, v)| format!("{k}={}", text(v))).collect();
    if pairs.is_empty() { "-".to_owned() } else { pairs.join(", ") }
}

fn role_text(role: &Value) -> &str {
    match text(role) {
        "" => "(the Box's default)",
        role => role,
    }
}

fn print_worker(w: &Value) {
    let rows = [
        ("worker_id", text(&w["worker_id"]).to_owned()),
        ("launch_id", text(&w["launch_id"]).to_owned()),
        ("box", format!("{} ({})", text(&w["box_type"]), text(&w["box_id"]))),
        ("role", role_text(&w["role"]).to_owned()),
        ("labels", labels_text(&w["labels"])),
        ("created_by", text(&w["created_by"]).to_owned()),
        ("created_at", text(&w["created_at"]).to_owned()),
    ];
    for (name, value) in rows {
        println!("{name:<11} {value}");
    }
    println!("transcript:");
    for entry in w["transcript"].as_array().into_iter().flatten() {
        println!("  #{} {} at {}", entry["seq"], text(&entry["author"]), text(&entry["at"]));
        for s in entry["segments"].as_array().into_iter().flatten() {
            println!("    {:<13} {}", text(&s["kind"]), text(&s["value"]));
        }
    }
}

fn print_list(page: &Value) {
    let workers = page["workers"].as_array().cloned().unwrap_or_default();
    if workers.is_empty() {
        println!("no Workers");
    } else {
        let launch = workers.iter().map(|w| text(&w["launch_id"]).len()).max().unwrap_or(0).max(9);
        let role = workers.iter().map(|w| text(&w["role"]).len()).max().unwrap_or(0).max(4);
        let by = workers.iter().map(|w| text(&w["created_by"]).len()).max().unwrap_or(0).max(10);
        println!("{:<36} {:<launch$} {:<role$} {:<by$} {:<30} LABELS", "WORKER_ID", "LAUNCH_ID", "ROLE", "CREATED_BY", "CREATED_AT");
        for w in &workers {
            let r = if text(&w["role"]).is_empty() { "-" } else { text(&w["role"]) };
            println!(
                "{:<36} {:<launch$} {:<role$} {:<by$} {:<30} {}",
                text(&w["worker_id"]),
                text(&w["launch_id"]),
                r,
                text(&w["created_by"]),
                text(&w["created_at"]),
                labels_text(&w["labels"])
            );
        }
    }
    if let Some(next) = page["next_cursor"].as_str() {
        println!("next page: --cursor {next}");
    }
}

fn print_provenance(p: &Value) {
    println!("worker_id   {}", text(&p["worker_id"]));
    println!("box_id      {}", text(&p["box_id"]));
    println!("bundle      {}", text(&p["bundle_digest"]));
    let verified = if p["approval_verified"].as_bool() == Some(true) { "verified now with public keys" } else { "DOES NOT VERIFY" };
    println!("approval    signed by key {} ({verified})", text(&p["approval_key_id"]));
    println!();
    let steps = p["steps"].as_array().cloned().unwrap_or_default();
    let width = steps.iter().map(|s| text(&s["event_id"]).len()).max().unwrap_or(0).max(5);
    println!("{:<14} {:<width$} {:>8} {:>5}  {:<30} {:<16} DIGEST / VERSION", "STEP", "EVENT", "POSITION", "AUDIT", "AT", "ACTOR");
    for s in &steps {
        let audit = s["audit_seq"].as_i64().map_or_else(|| "-".to_owned(), |seq| seq.to_string());
        let mut what = text(&s["digest"]).to_owned();
        if let Some(version) = s["manifest_version"].as_str() {
            what = if what.is_empty() { format!("v{version}") } else { format!("{what} v{version}") };
        }
        println!(
            "{:<14} {:<width$} {:>8} {:>5}  {:<30} {:<16} {what}",
            text(&s["kind"]),
            text(&s["event_id"]),
            s["position"].to_string(),
            audit,
            text(&s["at"]),
            text(&s["actor"])
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: WorkersCommand,
    }

    fn parsed(args: &[&str]) -> (WorkersCommand, ArgMatches) {
        let matches = Cli::command().try_get_matches_from(args).expect("parses");
        let cli = Cli::from_arg_matches(&matches).expect("typed");
        let sub = matches.subcommand().map(|(_, m)| m.clone()).expect("subcommand");
        (cli.command, sub)
    }

    #[test]
    fn r_cli_segments_keep_the_order_they_were_given_in() {
        let (command, matches) =
            parsed(&["w", "create", "--box", "b", "--launch-id", "l", "--ticket", "T-1", "--text", "a", "--objective", "O", "--text", "b"]);
        let WorkersCommand::Create { text, ticket, objective, .. } = command else { panic!("create") };
        let input = ordered_input(Some(&matches), &text, &ticket, &objective).expect("input");
        let kinds: Vec<(&str, &str)> = input.iter().map(|s| (s["kind"].as_str().unwrap_or(""), s["value"].as_str().unwrap_or(""))).collect();
        assert_eq!(kinds, [("ticket_ref", "T-1"), ("text", "a"), ("objective_ref", "O"), ("text", "b")]);
        assert!(ordered_input(Some(&matches), &[], &[], &[]).is_err(), "no input is a usage error");
    }

    #[test]
    fn r_cli_labels_are_key_value_pairs() {
        assert_eq!(parse_labels(&["a=1".into(), "b=x=y".into(), "c=".into()]).expect("labels").get("b").map(String::as_str), Some("x=y"));
        assert!(parse_labels(&["nokey".into()]).is_err());
        assert!(parse_labels(&["a=1".into(), "a=2".into()]).is_err());
    }

    #[test]
    fn r_cli_path_segments_are_encoded() {
        assert_eq!(segment("b-1_x.y~z"), "b-1_x.y~z");
        assert_eq!(segment("a/b c?"), "a%2Fb%20c%3F");
    }

    #[test]
    fn r_cli_exit_codes_no_token_is_usage_and_no_gateway_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let url = format!("http://127.0.0.1:{port}");
        let (no_token, m) = parsed(&["w", "show", "wkr_1", "--url", &url, "--token", ""]);
        assert_eq!(run(no_token, Some(&m)), USAGE);
        let (nobody, m) = parsed(&["w", "list", "--box", "b", "--url", &url, "--token", "pat"]);
        assert_eq!(run(nobody, Some(&m)), UNREACHABLE);
        let (bad_label, m) = parsed(&["w", "create", "--box", "b", "--launch-id", "l", "--text", "t", "--label", "x", "--url", &url, "--token", "pat"]);
        assert_eq!(run(bad_label, Some(&m)), USAGE);
    }

    #[test]
    fn r_cli_every_flag_has_help() {
        let command = Cli::command();
        for sub in command.get_subcommands() {
            assert!(sub.get_about().is_some(), "{}", sub.get_name());
            for arg in sub.get_arguments() {
                assert!(arg.get_help().is_some(), "{} --{}", sub.get_name(), arg.get_id());
            }
        }
    }
}
