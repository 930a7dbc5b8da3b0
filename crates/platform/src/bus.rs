//! The bus: request-reply between services on `atasira.box.<from>.<to>` (R-ARCH-2). One
//! trait, two adapters with the same subjects, headers and protobuf bytes (R-ARCH-7):
//! NATS (services API, so `$SRV.PING|INFO|STATS` answer; R-ARCH-8) and in-process.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;

/// One request as a handler sees it.
#[derive(Debug, Clone)]
pub struct Message {
    pub subject: String,
    /// NATS headers; `traceparent` carries W3C trace context (R-OPS-1).
    pub headers: BTreeMap<String, String>,
    pub payload: Bytes,
}

/// Answers a request with reply bytes (an encoded `atasira.v1.Reply`).
pub type Handler = Arc<dyn Fn(Message) -> BoxFuture<'static, Bytes> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("no responder on {0}")]
    NoResponders(String),
    #[error("request on {0} timed out")]
    Timeout(String),
    #[error("bus failure: {0}")]
    Other(String),
}

/// A running endpoint; dropping it does not stop it, `stop` does.
#[derive(Debug)]
pub struct Endpoint {
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    pub fn stop(self) {
        self.task.abort();
    }
}

#[async_trait::async_trait]
pub trait Bus: Send + Sync {
    /// Sends a request and waits for the reply; the current span's trace context goes in
    /// its headers (`traceparent`, when spans are exported).
    async fn request(&self, subject: &str, headers: BTreeMap<String, String>, payload: Bytes, timeout: Duration) -> Result<Bytes, BusError>;

    /// Serves `subjects` (may contain `*` tokens) for `service`, registered under that name.
    async fn serve(&self, service: &str, subjects: &[String], handler: Handler) -> Result<Endpoint, BusError>;

    /// Publishes `payload` on `subject` for whoever listens, at most once (a Box's channels,
    /// R-HOST-2). In process nobody listens: nothing happens.
    async fn publish(&self, _subject: &str, _payload: Bytes) -> Result<(), BusError> {
        Ok(())
    }

    /// Whether the bus can carry messages now (readiness, `/readyz`); why not otherwise.
    /// The in-process bus always can.
    fn connected(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The embedded bus: same subjects and bytes, no server.
#[derive(Default)]
pub struct InprocBus {
    routes: RwLock<Vec<(String, Handler)>>,
}

impl std::fmt::Debug for InprocBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InprocBus")
    }
}

#[async_trait::async_trait]
impl Bus for InprocBus {
    async fn request(&self, subject: &str, mut headers: BTreeMap<String, String>, payload: Bytes, timeout: Duration) -> Result<Bytes, BusError> {
        crate::trace::inject(|k, v| {
            headers.insert(k.to_owned(), v);
        });
        let handler = {
            let routes = self.routes.read().map_err(|_| BusError::Other("route table poisoned".into()))?;
            routes.iter().find(|(p, _)| atasira_contracts::subjects::covers(p, subject)).map(|(_, h)| h.clone())
        };
        let handler = handler.ok_or_else(|| BusError::NoResponders(subject.to_owned()))?;
        let fut = handler(Message { subject: subject.to_owned(), headers, payload });
        // Run the handler on its own task, like a NATS responder: a caller that gives up
        // does not cancel work half-done.
        let task = tokio::spawn(fut);
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) => Err(BusError::Other(format!("handler failed: {e}"))),
            Err(_) => Err(BusError::Timeout(subject.to_owned())),
        }
    }

    async fn serve(&self, _service: &str, subjects: &[String], handler: Handler) -> Result<Endpoint, BusError> {
        let mut routes = self.routes.write().map_err(|_| BusError::Other("route table poisoned".into()))?;
        routes.extend(subjects.iter().map(|s| (s.clone(), handler.clone())));
        Ok(Endpoint { task: tokio::spawn(async {}) })
    }
}

/// A message a NATS publisher sent on a topic (an `event` Box's `trigger_event`).
#[derive(Debug, Clone)]
pub struct TopicMessage {
    pub topic: String,
    /// The publisher's `Nats-Msg-Id` header, if any: what makes a repeat one message.
    pub id: Option<String>,
    pub data: Bytes,
    /// Where the publisher waits for an answer, when it sent a request.
    pub reply: Option<String>,
}

/// The header a publisher names its message with (JetStream's de-duplication header).
pub const MESSAGE_ID_HEADER: &str = "Nats-Msg-Id";

/// Hears topics on NATS as the runtime registry's trigger listener (its own NATS user,
/// which may hear topics and answer publishers, nothing else).
#[derive(Debug, Clone)]
pub struct TopicListener {
    client: async_nats::Client,
}

impl TopicListener {
    pub fn new(client: async_nats::Client) -> Self {
        Self { client }
    }

    /// Hears `topic` in queue group `queue` (one listener of the group gets each message),
    /// sending each message to `to`, until the returned task is aborted (which unsubscribes).
    pub async fn listen(&self, topic: &str, queue: &str, to: tokio::sync::mpsc::Sender<TopicMessage>) -> Result<tokio::task::JoinHandle<()>, BusError> {
        let mut subscriber = self.client.queue_subscribe(topic.to_owned(), queue.to_owned()).await.map_err(|e| BusError::Other(e.to_string()))?;
        self.client.flush().await.map_err(|e| BusError::Other(e.to_string()))?;
        let topic = topic.to_owned();
        Ok(tokio::spawn(async move {
            while let Some(m) = subscriber.next().await {
                let id = m.headers.as_ref().and_then(|h| h.get(MESSAGE_ID_HEADER)).map(|v| v.as_str().to_owned());
                let message = TopicMessage { topic: topic.clone(), id, data: m.payload, reply: m.reply.map(|r| r.to_string()) };
                if to.send(message).await.is_err() {
                    return;
                }
            }
        }))
    }

    /// Answers a publisher's request.
    pub async fn answer(&self, reply: &str, body: Bytes) -> Result<(), BusError> {
        self.client.publish(reply.to_owned(), body).await.map_err(|e| BusError::Other(e.to_string()))
    }
}

/// The cluster bus on a NATS connection.
#[derive(Debug, Clone)]
pub struct NatsBus {
    client: async_nats::Client,
}

impl NatsBus {
    pub fn new(client: async_nats::Client) -> Self {
        Self { client }
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

#[async_trait::async_trait]
impl Bus for NatsBus {
    async fn request(&self, subject: &str, headers: BTreeMap<String, String>, payload: Bytes, timeout: Duration) -> Result<Bytes, BusError> {
        let mut h = async_nats::HeaderMap::new();
        for (k, v) in &headers {
            h.insert(k.as_str(), v.as_str());
        }
        // The caller's trace context (R-OPS-1); it replaces any the caller set.
        crate::trace::inject(|k, v| h.insert(k, v.as_str()));
        let request = async_nats::Request::new().payload(payload).headers(h).timeout(Some(timeout));
        match self.client.send_request(subject.to_owned(), request).await {
            Ok(msg) => Ok(msg.payload),
            Err(e) => Err(match e.kind() {
                async_nats::RequestErrorKind::NoResponders => BusError::NoResponders(subject.to_owned()),
                async_nats::RequestErrorKind::TimedOut => BusError::Timeout(subject.to_owned()),
                _ => BusError::Other(e.to_string()),
            }),
        }
    }

    async fn publish(&self, subject: &str, payload: Bytes) -> Result<(), BusError> {
        self.client.publish(subject.to_owned(), payload).await.map_err(|e| BusError::Other(e.to_string()))
    }

    fn connected(&self) -> Result<(), String> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(format!("not connected to NATS ({state})")),
        }
    }

    async fn serve(&self, service: &str, subjects: &[String], handler: Handler) -> Result<Endpoint, BusError> {
        use async_nats::service::ServiceExt;
        let svc = self
            .client
            .service_builder()
            .description(format!("atasira {service} service"))
            .start(service, env!("CARGO_PKG_VERSION"))
            .await
            .map_err(|e| BusError::Other(format!("cannot register service {service}: {e}")))?;
        let mut endpoints = Vec::new();
        for (i, subject) in subjects.iter().enumerate() {
            let name = if i == 0 { "requests".to_owned() } else { format!("requests-{i}") };
            endpoints.push(svc.endpoint_builder().name(name).add(subject.clone()).await.map_err(|e| BusError::Other(e.to_string()))?);
        }
        // The server has the subscriptions before this returns: a process that says it
        // serves (and a readiness probe that believes it) gets the next request.
        self.client.flush().await.map_err(|e| BusError::Other(format!("cannot register service {service}: {e}")))?;
        let mut requests = futures::stream::select_all(endpoints);
        let task = tokio::spawn(async move {
            // Keeps the service (and its $SRV handlers) alive as long as the endpoint runs.
            let _svc = svc;
            while let Some(request) = requests.next().await {
                let handler = handler.clone();
                tokio::spawn(async move {
                    let mut headers = BTreeMap::new();
                    if let Some(h) = &request.message.headers {
                        for (k, v) in h.iter() {
                            if let Some(first) = v.first() {
                                headers.insert(k.to_string(), first.to_string());
                            }
                        }
                    }
                    let msg = Message { subject: request.message.subject.to_string(), headers, payload: request.message.payload.clone() };
                    let reply = handler(msg).await;
                    if let Err(e) = request.respond(Ok(reply)).await {
                        tracing::warn!(error = %e, "failed to respond");
                    }
                });
            }
        });
        Ok(Endpoint { task })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_inproc_bus_routes_requests_and_reports_no_responders() {
        let bus = InprocBus::default();
        let handler: Handler = Arc::new(|m: Message| Box::pin(async move { Bytes::from([b"re:".as_slice(), &m.payload].concat()) }));
        bus.serve("drafts", &["atasira.box.*.drafts".to_owned()], handler).await.expect("serves");
        let reply = bus.request("atasira.box.gateway.drafts", BTreeMap::new(), Bytes::from_static(b"hi"), Duration::from_secs(1)).await.expect("replies");
        assert_eq!(&reply[..], b"re:hi");
        assert!(matches!(
            bus.request("atasira.box.gateway.audit", BTreeMap::new(), Bytes::new(), Duration::from_secs(1)).await,
            Err(BusError::NoResponders(_))
        ));
    }
}
