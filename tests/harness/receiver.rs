//! A plain HTTP/1.1 receiver on a free loopback port, for the tests that stand on the
//! other end of an outgoing request: the OTLP collector, the webhook receivers. It keeps
//! every request and answers each with the status line its `answer` gives.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// By lowercase name.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Received {
    /// The header `name` (any case), or "".
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(&name.to_ascii_lowercase()).map_or("", String::as_str)
    }

    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Says the status line (`"204 No Content"`) of a request, given the requests before it.
pub type Answer = dyn Fn(&Received, &[Received]) -> &'static str + Send + Sync;

/// The receiver, running until the test ends.
#[derive(Debug)]
pub struct Receiver {
    pub port: u16,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub fn start(answer: impl Fn(&Received, &[Received]) -> &'static str + Send + Sync + 'static) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (kept, answer): (_, Arc<Answer>) = (got.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (kept, answer) = (kept.clone(), answer.clone());
                std::thread::spawn(move || serve(stream, &kept, answer.as_ref()));
            }
        });
        Receiver { port, got }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.got.lock().expect("requests").clone()
    }

    /// The requests so far to `path`.
    pub fn at(&self, path: &str) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.path == path).collect()
    }
}

/// Answers the requests of one connection (keep-alive), each as `answer` says.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Received>>, answer: &Answer) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = BTreeMap::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        let length = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let mut words = request_line.split_whitespace();
        let (method, path) = (words.next().unwrap_or_default().to_owned(), words.next().unwrap_or_default().to_owned());
        let request = Received { method, path, headers, body };
        let status = {
            let mut got = kept.lock().expect("requests");
            let status = answer(&request, &got);
            got.push(request);
            status
        };
        let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
        if stream.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// One message an [`SmtpSink`] received.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    /// Headers and body as sent (dot-unstuffed).
    pub data: String,
}

/// An SMTP server on a free loopback port that accepts every message and keeps it (no TLS,
/// no authentication): the other end of the tests' email notifications.
#[derive(Debug)]
pub struct SmtpSink {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    pub fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mails = Arc::new(Mutex::new(Vec::new()));
        let kept = mails.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let _ = smtp_session(stream, &kept);
                });
            }
        });
        SmtpSink { port, mails }
    }

    /// `smtp://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().expect("mails").clone()
    }
}

fn smtp_session(stream: TcpStream, kept: &Mutex<Vec<Mail>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    out.write_all(b"220 sink ESMTP\r\n")?;
    let (mut from, mut to) = (String::new(), Vec::new());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let command = line.trim_end().to_owned();
        let upper = command.to_ascii_uppercase();
        let address =
            |c: &str| c.split_once(':').map(|(_, a)| a.trim().trim_start_matches('<').split('>').next().unwrap_or_default().to_owned()).unwrap_or_default();
        if upper.starts_with("EHLO") {
            out.write_all(b"250-sink\r\n250 8BITMIME\r\n")?;
        } else if upper.starts_with("HELO") || upper.starts_with("NOOP") {
            out.write_all(b"250 OK\r\n")?;
        } else if upper.starts_with("MAIL FROM") {
            from = address(&command);
            to.clear();
            out.write_all(b"250 OK\r\n")?;
        } else if upper.starts_with("RCPT TO") {
            to.push(address(&command));
            out.write_all(b"250 OK\r\n")?;
        } else if upper == "DATA" {
            out.write_all(b"354 go on\r\n")?;
            let mut data = String::new();
            loop {
                let mut l = String::new();
                if reader.read_line(&mut l)? == 0 {
                    return Ok(());
                }
                if l.trim_end_matches(['\r', '\n']) == "." {
                    break;
                }
                data.push_str(l.strip_prefix('.').unwrap_or(&l));
            }
            kept.lock().expect("mails").push(Mail { from: from.clone(), to: to.clone(), data });
            out.write_all(b"250 OK queued\r\n")?;
        } else if upper == "RSET" {
            to.clear();
            out.write_all(b"250 OK\r\n")?;
        } else if upper == "QUIT" {
            out.write_all(b"221 bye\r\n")?;
            return Ok(());
        } else {
            out.write_all(b"502 not implemented\r\n")?;
        }
    }
}
