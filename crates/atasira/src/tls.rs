//! TLS: the private CA and server certificates `atasira nats-config` writes (rcgen), the
//! NATS clients that trust that CA, and the gateway's HTTPS listener (tokio-rustls).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

/// How long the CA of `nats-config` is valid.
const CA_DAYS: i64 = 3650;
/// How long a NATS server certificate is valid (regenerate with `nats-config --force`).
const SERVER_DAYS: i64 = 825;
/// Names every server certificate carries, so clients on the same host can connect.
pub const LOCAL_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A server's certificate and private key, PEM.
#[derive(Clone)]
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCert").field("key_pem", &"<secret>").finish_non_exhaustive()
    }
}

/// A private CA's certificate and the certificates it issued; the CA's key is not kept
/// (to add a host, run `nats-config --force` again).
#[derive(Debug, Clone)]
pub struct Issued {
    pub ca_pem: String,
    pub servers: Vec<ServerCert>,
}

/// `not_before` a day ago (clocks differ), `not_after` `days` from now.
fn validity(params: &mut CertificateParams, days: i64) {
    use chrono::Datelike as _;
    let at = |t: chrono::DateTime<chrono::Utc>| rcgen::date_time_ymd(t.year(), t.month() as u8, t.day() as u8);
    let now = chrono::Utc::now();
    params.not_before = at(now - chrono::TimeDelta::days(1));
    params.not_after = at(now + chrono::TimeDelta::days(days));
}

/// A new CA and one certificate per entry of `hosts` (the names and addresses clients and
/// routes reach that server by), usable for both sides of a TLS connection (routes verify
/// each other).
pub fn issue(what: &str, hosts: &[Vec<String>]) -> anyhow::Result<Issued> {
    let ca_key = KeyPair::generate().context("cannot generate the CA's key")?;
    let mut ca = CertificateParams::default();
    // A name of its own: clients that trust several CAs (two clusters) tell them apart by it.
    let tag = hex::encode(&atasira_platform::auth::random_secret()[..6]);
    ca.distinguished_name.push(DnType::CommonName, format!("atasira {what} CA {tag}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut ca, CA_DAYS);
    let ca_pem = ca.self_signed(&ca_key).context("cannot sign the CA's certificate")?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let servers = hosts
        .iter()
        .enumerate()
        .map(|(i, names)| {
            let mut params = CertificateParams::new(names.clone()).with_context(|| format!("{names:?} are not host names or IP addresses"))?;
            params.distinguished_name.push(DnType::CommonName, format!("atasira {what} {}", i + 1));
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            params.use_authority_key_identifier_extension = true;
            validity(&mut params, SERVER_DAYS);
            let key = KeyPair::generate().context("cannot generate a server key")?;
            let cert = params.signed_by(&key, &issuer).context("cannot sign a server certificate")?;
            Ok(ServerCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Issued { ca_pem, servers })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in `pem` (one or more `CERTIFICATE` blocks); `what` names them in errors.
fn certificates(pem: &[u8], what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().map_err(|e| anyhow::anyhow!("{what} is not PEM: {e}"))?;
    anyhow::ensure!(!certs.is_empty(), "{what} holds no certificate (-----BEGIN CERTIFICATE-----)");
    Ok(certs)
}

/// A TLS client configuration that trusts the CA certificate(s) in `ca_pem` alone.
pub fn client_config(ca_pem: &str) -> anyhow::Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_pem.as_bytes(), "the NATS CA certificate")? {
        roots.add(cert).context("the NATS CA certificate cannot be trusted")?;
    }
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The `CERTIFICATE` blocks of `text` (a credentials file or a CA file), as PEM, if any.
pub fn certificate_blocks(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line == "-----BEGIN CERTIFICATE-----" {
            inside = true;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
        if line == "-----END CERTIFICATE-----" {
            inside = false;
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The gateway's HTTPS configuration: the certificate chain in `cert` and the private key in
/// `key` (PEM; the key file readable by its owner only).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let chain_pem = std::fs::read(cert).with_context(|| format!("cannot read the TLS certificate {}", cert.display()))?;
    let chain = certificates(&chain_pem, &format!("the TLS certificate {}", cert.display()))?;
    let key_pem = crate::files::read_private(key, "TLS private key", "a private key")?;
    let key_der =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|_| anyhow::anyhow!("the TLS private key {} holds no PEM private key", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .with_context(|| format!("the TLS private key {} does not fit the certificate {}", key.display(), cert.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// TLS handshakes in progress at most; further connections wait to be accepted.
const MAX_HANDSHAKES: usize = 256;
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener for `axum::serve` that hands over connections once their TLS handshake is
/// done; handshakes run side by side, so a slow client holds up nobody else.
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let tls = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTPS: cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            drop(slot);
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "HTTPS: TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "HTTPS: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready, acceptor })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_rustls::rustls::client::danger::ServerCertVerifier as _;

    #[test]
    fn given_hosts_when_issued_then_a_client_trusting_the_ca_accepts_each_server_certificate() {
        let issued = issue("NATS", &[vec!["localhost".into(), "127.0.0.1".into()], vec!["nats-2".into()]]).expect("issued");
        assert_eq!(issued.servers.len(), 2);
        assert!(issued.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.servers[0].key_pem.contains("PRIVATE KEY"));
        assert!(!format!("{:?}", issued.servers[0]).contains("PRIVATE KEY"), "Debug hides the key");
        client_config(&issued.ca_pem).expect("the CA is trusted");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new({
                let mut roots = RootCertStore::empty();
                roots.add(certificates(issued.ca_pem.as_bytes(), "ca").expect("ca").remove(0)).expect("root");
                roots
            }),
            provider(),
        )
        .build()
        .expect("verifier");
        let now = rustls::pki_types::UnixTime::now();
        for (server, host) in issued.servers.iter().zip(["127.0.0.1", "nats-2"]) {
            let cert = certificates(server.cert_pem.as_bytes(), "server").expect("cert").remove(0);
            let name = rustls::pki_types::ServerName::try_from(host).expect("name");
            verifier.verify_server_cert(&cert, &[], &name, &[], now).unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        let other = certificates(issued.servers[1].cert_pem.as_bytes(), "server").expect("cert").remove(0);
        let wrong = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        assert!(verifier.verify_server_cert(&other, &[], &wrong, &[], now).is_err(), "a certificate names only its own hosts");
    }

    #[test]
    fn certificate_blocks_are_found_among_other_text() {
        let text =
            "# creds\n-----BEGIN USER NKEY SEED-----\nSU\n------END USER NKEY SEED------\n\n-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(certificate_blocks(text).as_deref(), Some("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"));
        assert_eq!(certificate_blocks("nothing"), None);
        assert!(client_config("not a certificate").is_err());
    }
}
