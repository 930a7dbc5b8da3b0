//! Sending a request to the REST API with ureq: the connection settings, the bearer token,
//! timeouts, progress on a terminal while an answer is slow, percent-encoded path segments
//! and query strings, a success answer read as the gateway's API type, and a refusal said
//! on stderr ([`refused`]). The exit codes are [`super::exit`]'s.

use std::io::IsTerminal;
use std::time::Duration;

use atasira_domain::FieldError;
use atasira_gateway::api::ErrorBody;
use clap::Args;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::exit::{OK, REFUSED, UNREACHABLE, usage};
use super::print;

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
    /// For an https:// URL: the CA certificate(s) (PEM) to check the gateway's certificate
    /// against, instead of the well-known public CAs.
    #[arg(long, env = "ATASIRA_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl Connection {
    /// An HTTP client for this connection (trusting `--ca-file` alone when given); the exit
    /// code of a CA file that cannot be used.
    fn agent(&self) -> Result<ureq::Agent, u8> {
        self.agent_from(ureq::AgentBuilder::new().timeout(TIMEOUT))
    }

    /// An HTTP client for this connection from `builder`.
    fn agent_from(&self, builder: ureq::AgentBuilder) -> Result<ureq::Agent, u8> {
        let Some(path) = &self.ca_file else { return Ok(builder.build()) };
        let trusted = std::fs::read_to_string(path)
            .map_err(anyhow::Error::from)
            .and_then(|pem| crate::tls::client_config(&pem))
            .map_err(|e| usage(&format!("--ca-file {}: {e:#}", path.display())))?;
        Ok(builder.tls_config(std::sync::Arc::new(trusted)).build())
    }
}

/// `?a=1&b=2` of the given pairs (absent ones left out), values percent-encoded.
pub(super) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", segment(v)))).collect();
    if parts.is_empty() { String::new() } else { format!("?{}", parts.join("&")) }
}

/// A path segment, percent-encoded (every byte but unreserved characters).
pub(super) fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// Sends one request and prints its answer: with `--json` the API's JSON as received, else
/// `show` with a success read as the API type `T` (its HTTP status too); the error for a
/// refusal.
pub(super) fn call<T: DeserializeOwned>(connection: &Connection, method: &str, path: &str, body: Option<&Value>, show: impl FnOnce(u16, &T)) -> u8 {
    let (status, value) = match send(connection, method, path, body) {
        Ok(answer) => answer,
        Err(code) => return code,
    };
    if connection.json {
        print::json(&value);
    }
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    if connection.json {
        return OK;
    }
    match typed(value) {
        Ok(answer) => {
            show(status, &answer);
            OK
        }
        Err(code) => code,
    }
}

/// A success answer read as the API type `T`, or the exit code of one that is not (said on
/// stderr): the gateway answered something this client does not understand.
pub(super) fn typed<T: DeserializeOwned>(value: Value) -> Result<T, u8> {
    serde_json::from_value(value).map_err(|e| {
        eprintln!("atasira: the API's answer could not be read: {e}");
        UNREACHABLE
    })
}

/// The URL of `path` and the token to send, or the exit code of a missing token.
fn target<'a>(connection: &'a Connection, path: &str) -> Result<(String, &'a str), u8> {
    let Some(token) = connection.token.as_deref().filter(|t| !t.is_empty()) else {
        return Err(usage("no token: pass --token or set ATASIRA_PAT"));
    };
    Ok((format!("{}{path}", connection.url.trim_end_matches('/')), token))
}

/// Sends one request: the status and the JSON answer, or the exit code of a request that
/// could not be made (no token, no gateway).
pub(super) fn send(connection: &Connection, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), u8> {
    let (url, token) = target(connection, path)?;
    let agent = connection.agent()?;
    let request = agent.request(method, &url).set("Authorization", &format!("Bearer {token}"));
    let progress = Progress::start(std::io::stderr().is_terminal());
    let answer = match body {
        Some(body) => request.send_json(body.clone()),
        None => request.call(),
    };
    drop(progress);
    let (status, response) = match answer {
        Ok(response) => (response.status(), response),
        Err(ureq::Error::Status(status, response)) => (status, response),
        Err(ureq::Error::Transport(e)) => {
            eprintln!("atasira: cannot reach the API at {}: {e}", connection.url);
            return Err(UNREACHABLE);
        }
    };
    let text = match response.into_string() {
        Ok(text) => text,
        Err(e) => {
            eprintln!("atasira: the API's answer could not be read: {e}");
            return Err(UNREACHABLE);
        }
    };
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

/// GETs `path` and copies the answer's body into `out` as it arrives (an export may be
/// large): the bytes written, or the exit code of a refusal (said on stderr) or of a
/// request that could not be made.
pub(super) fn download(connection: &Connection, path: &str, out: &mut dyn std::io::Write) -> Result<u64, u8> {
    let (url, token) = target(connection, path)?;
    // No bound on the whole answer, only on each wait for more of it.
    let agent = connection.agent_from(ureq::AgentBuilder::new().timeout_connect(TIMEOUT).timeout_read(TIMEOUT))?;
    let response = match agent.get(&url).set("Authorization", &format!("Bearer {token}")).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(status, response)) => {
            let text = response.into_string().unwrap_or_default();
            return Err(refused(status, &serde_json::from_str(&text).unwrap_or(Value::String(text))));
        }
        Err(ureq::Error::Transport(e)) => {
            eprintln!("atasira: cannot reach the API at {url}: {e}");
            return Err(UNREACHABLE);
        }
    };
    std::io::copy(&mut response.into_reader(), out).map_err(|e| {
        eprintln!("atasira: the export stopped before its end: {e}");
        UNREACHABLE
    })
}

/// A request still waiting after this long shows progress (on a terminal).
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// "waiting for the gateway… 3s" on stderr, updated every second while a request takes
/// longer than [`PROGRESS_AFTER`], and cleared when it is dropped (the answer arrived).
/// Only on a terminal: a pipe or file never sees it.
struct Progress {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(terminal: bool) -> Progress {
        if !terminal {
            return Progress { done: None, thread: None };
        }
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            use std::io::Write;
            let started = std::time::Instant::now();
            let mut shown = false;
            let mut wait = PROGRESS_AFTER;
            // Wakes once a second until the sender is dropped (or sends).
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(wait) {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2Katasira: waiting for the gateway\u{2026} {}s", started.elapsed().as_secs());
                let _ = err.flush();
                shown = true;
                wait = Duration::from_secs(1);
            }
            if shown {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            }
        });
        Progress { done: Some(done), thread: Some(thread) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread; it clears its line before this returns, so
        // nothing printed after the answer lands on the progress line.
        self.done.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Says why the API refused (on stderr): its error code and message and the keys at fault
/// ([`ErrorBody`]), or the answer itself when it is no error body; the exit code of a refusal.
pub(super) fn refused(status: u16, value: &Value) -> u8 {
    match ErrorBody::deserialize(value) {
        Ok(error) => {
            eprintln!("atasira: refused ({status} {}): {}", error.error, error.message);
            // `details` lists the keys at fault when it is a list (other refusals give an
            // object, not shown).
            for d in error.details.and_then(|d| Vec::<FieldError>::deserialize(d).ok()).unwrap_or_default() {
                eprintln!("  {}: {}", d.key, d.message);
            }
        }
        Err(_) => eprintln!("atasira: refused ({status} error): {value}"),
    }
    REFUSED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_cli_path_segments_are_encoded() {
        assert_eq!(segment("b-1_x.y~z"), "b-1_x.y~z");
        assert_eq!(segment("a/b c?"), "a%2Fb%20c%3F");
    }

    #[test]
    fn r_cli_progress_never_shows_off_a_terminal() {
        let progress = Progress::start(false);
        assert!(progress.thread.is_none() && progress.done.is_none());
    }
}
