//! The wire is encrypted (R-ARCH-10, R-AUTH-5): NATS speaks TLS only, checked against the
//! private CA `atasira nats-config` makes; the auth callout's requests, which carry the
//! publisher's token, are encrypted to the gateway's xkey; and the gateway serves HTTPS
//! when given a certificate.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::subjects;
use atasira_tests::fixtures::block_on;
use atasira_tests::harness::{Mode, Nats, OutputWithin, Proc, SUBPROCESS_LIMIT, System, TempDir, atasira_bin, pat_options};
use futures::StreamExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::rustls;

/// What a plain-text client reads after it speaks NATS's protocol in clear: the server's
/// INFO line, then whatever comes back (until the server closes, or 5 s).
fn plain_text_session(port: u16) -> (String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut info = Vec::new();
    let mut byte = [0u8; 1];
    while !info.ends_with(b"\r\n") && stream.read(&mut byte).expect("the server greets") == 1 {
        info.push(byte[0]);
    }
    let _ = stream.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"auth_token\":\"anything\"}\r\nPING\r\nSUB > 1\r\n");
    let mut rest = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        rest.extend_from_slice(&buf[..n]);
    }
    (String::from_utf8_lossy(&info).into_owned(), String::from_utf8_lossy(&rest).into_owned())
}

#[test]
fn a_plain_text_nats_connection_is_refused_and_so_is_a_client_that_does_not_trust_the_ca() {
    // R-ARCH-10: tokens and seeds never cross the network in clear.
    let dir = TempDir::new("atasira-wire");
    let nats = Nats::start_authenticated(&dir.0);
    let (info, answer) = plain_text_session(nats.port());
    assert!(info.starts_with("INFO ") && info.contains("\"tls_required\":true"), "the server asks for TLS first: {info}");
    assert!(!answer.contains("PONG") && !answer.contains("+OK"), "a plain-text client gets nothing done: {answer:?}");

    // TLS against a CA the client does not know (the system's roots): refused by the client.
    block_on(async {
        let refused = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5)).connect(nats.url()).await;
        let error = refused.expect_err("the server's certificate is not trusted").to_string().to_lowercase();
        assert!(error.contains("certificate") || error.contains("tls") || error.contains("handshake") || error.contains("io"), "{error}");
    });
}

#[test]
fn the_auth_callout_request_is_encrypted_and_the_publisher_still_connects() {
    // R-AUTH-5: the request carrying a publisher's token is encrypted to the gateway's xkey,
    // so nobody who may read the callout's subject learns the token.
    let sys = System::start(Mode::Cluster);
    block_on(async {
        let gateway = sys.nats_options(subjects::GATEWAY).connect(sys.nats_url()).await.expect("connects as the gateway");
        let mut requests = gateway.subscribe(subjects::AUTH_CALLOUT).await.expect("the gateway may read its callout's subject");
        gateway.flush().await.expect("flush");
        let publisher = pat_options(&sys.agent).connect(sys.nats_url()).await.expect("the agent's PAT connects through the encrypted callout");
        let request = tokio::time::timeout(Duration::from_secs(10), requests.next()).await.expect("a callout request").expect("a message");
        let server_key = request.headers.as_ref().and_then(|h| h.get("Nats-Server-Xkey")).map(|v| v.as_str().to_owned());
        assert!(server_key.is_some_and(|k| k.starts_with('X')), "the server names its curve key: {:?}", request.headers);
        let payload = request.payload.to_vec();
        assert!(!payload.starts_with(b"eyJ"), "not a JWT in clear");
        assert!(!payload.windows(sys.agent.len()).any(|w| w == sys.agent.as_bytes()), "the token is not in the request");
        assert!(!String::from_utf8_lossy(&payload).contains("auth_token"), "no connect options in clear");
        drop(publisher);
    });
}

/// A self-signed certificate for 127.0.0.1 in `dir`: (certificate, key) paths, the key with
/// `key_mode`.
fn certificate(dir: &Path, key_mode: u32) -> (std::path::PathBuf, std::path::PathBuf, String) {
    use std::os::unix::fs::PermissionsExt as _;
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).expect("params").self_signed(&key).expect("cert");
    let (cert_path, key_path) = (dir.join("gateway.pem"), dir.join("gateway-key.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("cert file");
    std::fs::write(&key_path, key.serialize_pem()).expect("key file");
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(key_mode)).expect("mode");
    (cert_path, key_path, cert.pem())
}

/// One HTTPS request to `port` (trusting `ca_pem` only); the whole answer as text.
async fn https_get(port: u16, ca_pem: &str, path: &str, token: Option<&str>) -> String {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("pem")).expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connects");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("TLS handshake with the gateway");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n").as_bytes()).await.expect("request");
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.expect("answer");
    answer
}

#[test]
fn the_gateway_serves_https_with_a_certificate_and_nothing_in_clear() {
    // R-ARCH-10: --tls-cert/--tls-key make the REST API HTTPS.
    let dir = TempDir::new("atasira-https");
    let (cert, key, cert_pem) = certificate(&dir.0, 0o600);
    let data = dir.0.join("data");
    let args = ["dev", "--data-dir", data.to_str().expect("utf-8"), "--listen", "127.0.0.1:0"];
    let tls_args = ["--tls-cert", cert.to_str().expect("utf-8"), "--tls-key", key.to_str().expect("utf-8")];
    let all: Vec<&str> = args.iter().chain(&tls_args).copied().collect();
    let mut dev = Proc::spawn("atasira dev (https)", &atasira_bin(), &all, &[("RUST_LOG", "warn".to_owned())]);
    let line = dev.wait_stderr("listening on https://", Duration::from_secs(30));
    let port: u16 = line.split("https://127.0.0.1:").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse().ok()).expect("a port");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let admin = loop {
        let out = dev.stdout.lock().expect("lines").clone();
        if let Some(t) = out.iter().find_map(|l| l.strip_prefix("admin PAT: ")) {
            break t.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no admin PAT printed");
        std::thread::sleep(Duration::from_millis(20));
    };
    block_on(async {
        let health = https_get(port, &cert_pem, "/healthz", None).await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        let boxes = https_get(port, &cert_pem, "/api/v1/boxes", Some(&admin)).await;
        assert!(boxes.starts_with("HTTP/1.1 200") && boxes.contains("\"boxes\""), "{boxes}");
    });
    // The command line speaks HTTPS too: with the CA it trusts, and only with it.
    let url = format!("https://127.0.0.1:{port}");
    let cli = |extra: &[&str]| {
        let out = std::process::Command::new(atasira_bin())
            .args(["drafts", "pending", "--url", &url, "--token", &admin, "--json"])
            .args(extra)
            .env_remove("ATASIRA_CA_FILE")
            .output_within(SUBPROCESS_LIMIT)
            .expect("the CLI runs");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stdout, stderr) = cli(&["--ca-file", cert.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("\"drafts\""), "{stdout}");
    let (code, _, stderr) = cli(&[]);
    assert_eq!(code, Some(3), "an unknown CA is unreachable: {stderr}");
    assert!(stderr.contains("cannot reach the API"), "{stderr}");
    // Plain HTTP on the same port gets no answer.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    plain.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").expect("writes");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "plain HTTP is not served: {}", String::from_utf8_lossy(&answer));
    drop(dev);

    // A key file others may read is refused before anything starts, naming the fix.
    let loose = TempDir::new("atasira-https-loose");
    let (cert, key, _) = certificate(&loose.0, 0o644);
    let out = std::process::Command::new(atasira_bin())
        .args(["dev", "--data-dir", loose.0.join("data").to_str().expect("utf-8"), "--listen", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .output_within(SUBPROCESS_LIMIT)
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("chmod 600"), "{err}");
    assert!(!err.contains("PRIVATE KEY"), "the key is never shown: {err}");
}
