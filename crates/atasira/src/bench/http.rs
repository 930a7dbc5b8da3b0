//! The benchmark's HTTP client: HTTP/1.1 keep-alive connections (hyper) driven as tasks of
//! the benchmark's own runtime. A request costs the client a write and a read on a socket
//! the runtime already polls; a blocking client would add a hand-off to a thread of its own
//! and back for every request, CPU and wake-ups the measured system would pay for on a
//! small host.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::{SendRequest, handshake};
use hyper::{HeaderMap, Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;

/// An answer, read to its end.
#[derive(Debug)]
pub(super) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Connections to one address: a request takes an idle one (or opens one) and gives it back
/// once its answer is read, so `c` requests in flight hold `c` connections.
#[derive(Debug)]
pub(super) struct Http {
    addr: SocketAddr,
    authorization: String,
    timeout: Duration,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Http {
    /// A client that sends `Authorization: Bearer <token>` with every request.
    pub(super) fn new(addr: SocketAddr, token: &str, timeout: Duration) -> Arc<Http> {
        Arc::new(Http { addr, authorization: format!("Bearer {token}"), timeout, idle: Mutex::default() })
    }

    /// `POST path` with a JSON body.
    pub(super) async fn post_json(&self, path: &str, body: String) -> anyhow::Result<Answer> {
        self.send(Method::POST, path, Some(body)).await
    }

    /// `GET path`.
    pub(super) async fn get(&self, path: &str) -> anyhow::Result<Answer> {
        self.send(Method::GET, path, None).await
    }

    async fn send(&self, method: Method, path: &str, json: Option<String>) -> anyhow::Result<Answer> {
        let what = format!("{method} {path}");
        tokio::time::timeout(self.timeout, self.exchange(method, path, json))
            .await
            .with_context(|| format!("{what}: no answer within {:?}", self.timeout))?
            .with_context(|| format!("{what} failed"))
    }

    async fn exchange(&self, method: Method, path: &str, json: Option<String>) -> anyhow::Result<Answer> {
        let idle = self.idle.lock().expect("the idle list is never poisoned").pop();
        let mut sender = match idle {
            Some(sender) if !sender.is_closed() => sender,
            _ => self.open().await?,
        };
        let mut request =
            Request::builder().method(method).uri(path).header(header::HOST, self.addr.to_string()).header(header::AUTHORIZATION, &self.authorization);
        if json.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(Bytes::from(json.unwrap_or_default())))?;
        sender.ready().await?;
        let (parts, body) = sender.send_request(request).await?.into_parts();
        let body = body.collect().await?.to_bytes();
        self.idle.lock().expect("the idle list is never poisoned").push(sender);
        Ok(Answer { status: parts.status, headers: parts.headers, body })
    }

    async fn open(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(self.addr).await.with_context(|| format!("cannot connect to {}", self.addr))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = handshake(TokioIo::new(stream)).await?;
        // The connection's reads and writes run as a task of their own until it closes.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request reaches a real server with its method, path, token and body, and the
    /// answer comes back whole; the connection is kept and used again.
    #[tokio::test]
    async fn a_request_reaches_the_server_and_its_connection_is_kept() {
        use axum::routing::post;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let app = axum::Router::new().route(
            "/echo",
            post(|headers: HeaderMap, body: String| async move {
                let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                (StatusCode::CREATED, [("x-seen", auth)], body)
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let http = Http::new(addr, "t0ken", Duration::from_secs(5));
        for i in 0..3 {
            let answer = http.post_json("/echo", format!("{{\"i\":{i}}}")).await.expect("answered");
            assert_eq!(answer.status, StatusCode::CREATED);
            assert_eq!(answer.headers["x-seen"], "Bearer t0ken");
            assert_eq!(answer.body, format!("{{\"i\":{i}}}"));
        }
        assert_eq!(http.idle.lock().expect("idle").len(), 1, "one request at a time needs one connection");
        assert_eq!(http.get("/missing").await.expect("answered").status, StatusCode::NOT_FOUND);
    }
}
