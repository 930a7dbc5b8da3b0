//! One HTTP request, and its answer.

use std::time::Duration;

use serde_json::Value;

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub raw: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One HTTP request; non-2xx answers are answers, not errors.
pub fn http(method: &str, url: &str, token: Option<&str>, headers: &[(&str, &str)], body: Option<&[u8]>) -> Answer {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(30)).build();
    let mut req = agent.request(method, url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    // JSON unless the caller names another Content-Type.
    if body.is_some() && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
        req = req.set("Content-Type", "application/json");
    }
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let result = match body {
        Some(b) => req.send_bytes(b),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        // The server went away mid-request (crash tests): status 0.
        Err(e) => return Answer { status: 0, headers: vec![], body: Value::Null, raw: e.to_string() },
    };
    let status = response.status();
    let headers = response.headers_names().into_iter().filter_map(|n| response.header(&n).map(|v| (n.clone(), v.to_owned()))).collect();
    let raw = response.into_string().unwrap_or_default();
    let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
    Answer { status, headers, body, raw }
}
