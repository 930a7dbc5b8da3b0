//! `atasira nats-config`: nkeys for every process, a nats-server configuration that
//! authenticates them and grants each only what `contracts::subjects::permissions` allows
//! (R-ARCH-10), and reading a process's credentials file back for `serve`.
//!
//! The configuration uses nats-server's config mode: one account (`ATASIRA`) holding one
//! nkey user per process, the system account, and the auth callout (run by the gateway,
//! with the issuer key in `gateway.creds`) for everyone else: NATS publishers with a PAT.
//! Every connection is TLS (a private CA, `ca.pem`, also inside every credentials file),
//! routes included, and the callout's requests are encrypted to the gateway's xkey.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use atasira_contracts::subjects::{self, ACCOUNT, Permissions};

/// The system account.
pub const SYSTEM_ACCOUNT: &str = "SYS";
/// The configuration file in the output directory.
pub const CONF_FILE: &str = "nats-server.conf";

/// The private CA's certificate, for NATS clients (it is inside every credentials file too).
pub const CA_FILE: &str = "ca.pem";

const USER_SEED: &str = "USER NKEY SEED";
const ACCOUNT_SEED: &str = "ACCOUNT NKEY SEED";
const CURVE_SEED: &str = "CURVE NKEY SEED";
/// The trigger listener's user seed, in the runtime registry's credentials file.
const TRIGGER_SEED: &str = "TRIGGER LISTENER USER NKEY SEED";

/// The credentials file of a process identity in `dir`.
pub fn creds_path(dir: &Path, identity: &str) -> PathBuf {
    dir.join(format!("{identity}.creds"))
}

/// Every NATS user the configuration names: the processes of the cluster, the operator
/// (who sets up JetStream with `atasira nats-setup`), the runtime registry's trigger
/// listener, then each execution host (`host-<name>`).
fn users(hosts: &[String]) -> Vec<String> {
    subjects::IDENTITIES
        .iter()
        .copied()
        .chain([subjects::OPERATOR, subjects::TRIGGER_LISTENER])
        .map(str::to_owned)
        .chain(hosts.iter().map(|h| subjects::host_identity(h)))
        .collect()
}

/// The users with a credentials file of their own (the trigger listener's seed is in the
/// runtime registry's).
fn creds_users(hosts: &[String]) -> Vec<String> {
    users(hosts).into_iter().filter(|u| u != subjects::TRIGGER_LISTENER).collect()
}

/// What the configuration needs to know about the keys (public halves only).
#[derive(Debug, Clone)]
pub struct PublicKeys {
    /// (identity, user public key `U...`), in `users()` order.
    pub users: Vec<(String, String)>,
    /// The auth callout's issuer (account public key `A...`).
    pub callout_issuer: String,
    /// The key the server encrypts the callout's requests to (curve public key `X...`).
    pub callout_xkey: String,
}

/// Where nats-server reads its TLS material.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The files of one server (`node`: of a cluster, from 1) in `dir`.
    pub fn in_dir(dir: &Path, node: Option<usize>) -> TlsFiles {
        let stem = node.map_or_else(|| "server".to_owned(), |n| format!("server-{n}"));
        TlsFiles { cert: dir.join(format!("{stem}-cert.pem")), key: dir.join(format!("{stem}-key.pem")), ca: dir.join(CA_FILE) }
    }
}

/// `path` as a quoted string of the configuration, or why not.
fn quoted_path(path: &Path, what: &str) -> anyhow::Result<String> {
    path.to_str().and_then(quoted).ok_or_else(|| anyhow::anyhow!("the {what} {} cannot be written to the configuration", path.display()))
}

/// A quoted string in nats-server's configuration syntax; `None` when `s` holds
/// something the syntax would not keep literally (quotes, backslashes, control or space
/// characters). Subjects and keys never do.
fn quoted(s: &str) -> Option<String> {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '\\');
    plain.then(|| format!("\"{s}\""))
}

fn quoted_list(items: &[String]) -> anyhow::Result<String> {
    let quoted: Option<Vec<String>> = items.iter().map(|s| quoted(s)).collect();
    let quoted = quoted.ok_or_else(|| anyhow::anyhow!("a subject of the permission table cannot be written to the configuration: {items:?}"))?;
    Ok(format!("[{}]", quoted.join(", ")))
}

/// A permission block; an empty allow list would mean "anything" to nats-server, so it is
/// written as a denial of everything instead. A deny list wins over the allow list.
fn render_permissions(p: &Permissions) -> anyhow::Result<String> {
    let side = |subjects: &[String], deny: &[String]| -> anyhow::Result<String> {
        match (subjects.is_empty(), deny.is_empty()) {
            (true, _) => Ok("{ deny: [\">\"] }".to_owned()),
            (false, true) => Ok(format!("{{ allow: {} }}", quoted_list(subjects)?)),
            (false, false) => Ok(format!("{{ allow: {}, deny: {} }}", quoted_list(subjects)?, quoted_list(deny)?)),
        }
    };
    Ok(format!("{{ publish: {}, subscribe: {}, allow_responses: {} }}", side(&p.publish, &[])?, side(&p.subscribe, &p.deny_subscribe)?, p.allow_responses))
}

/// The cluster name every node's configuration carries.
pub const CLUSTER_NAME: &str = "atasira";
/// The user routes between the nodes authenticate as.
const ROUTE_USER: &str = "route";

/// One node of a NATS cluster, as its configuration needs it.
#[derive(Clone)]
pub struct Node {
    /// `atasira-<n>`: the server name JetStream's clustering needs, unique per node.
    pub name: String,
    /// Where it listens for routes.
    pub listen: String,
    /// The host of its route address (the other nodes reach it by this name).
    pub host: String,
    /// The route addresses (HOST:PORT) of the other nodes.
    pub peers: Vec<String>,
    /// The routes' password (shared by every node).
    pub route_secret: String,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).field("listen", &self.listen).field("peers", &self.peers).finish_non_exhaustive()
    }
}

/// A route address given as HOST:PORT: its host and port, or why not.
fn split_route(route: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = route.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("--route {route:?}: give HOST:PORT"))?;
    let port: u16 = port.parse().map_err(|_| anyhow::anyhow!("--route {route:?}: {port:?} is not a port"))?;
    let plain = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'));
    if !plain || port == 0 {
        anyhow::bail!("--route {route:?}: give HOST:PORT (a host name or IP address and a port)");
    }
    Ok((host.to_owned(), port))
}

/// The nodes of a cluster whose route addresses are `routes` (pure but for nothing: the
/// secret is given).
pub fn cluster_nodes(routes: &[String], route_secret: &str) -> anyhow::Result<Vec<Node>> {
    let parsed: Vec<(String, u16)> = routes.iter().map(|r| split_route(r)).collect::<anyhow::Result<_>>()?;
    let mut seen = std::collections::BTreeSet::new();
    for (host, port) in &parsed {
        if !seen.insert((host.clone(), *port)) {
            anyhow::bail!("--route {host}:{port} is given twice: give each node's route address once");
        }
    }
    if parsed.len() < 2 {
        anyhow::bail!("a cluster needs the route addresses of at least two nodes (three for JetStream to survive losing one)");
    }
    Ok(parsed
        .iter()
        .enumerate()
        .map(|(i, (host, port))| {
            // An IP is listened on as given; a name (a container's host name) on every interface.
            let listen_host = if host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok() { host.as_str() } else { "0.0.0.0" };
            Node {
                name: format!("atasira-{}", i + 1),
                listen: format!("{listen_host}:{port}"),
                host: host.trim_matches(['[', ']']).to_owned(),
                peers: parsed.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, (h, p))| format!("{h}:{p}")).collect(),
                route_secret: route_secret.to_owned(),
            }
        })
        .collect())
}

/// The nats-server configuration for these keys and TLS files (pure); with `node`, that
/// node's of a cluster.
pub fn render_conf(keys: &PublicKeys, port: u16, store_dir: &Path, node: Option<&Node>, tls: &TlsFiles) -> anyhow::Result<String> {
    let store_dir = match node {
        Some(n) => store_dir.join(&n.name),
        None => store_dir.to_path_buf(),
    };
    let store = store_dir
        .to_str()
        .and_then(quoted)
        .ok_or_else(|| anyhow::anyhow!("the store directory {} cannot be written to the configuration", store_dir.display()))?;
    let mut conf = String::new();
    let _ = writeln!(conf, "# nats-server configuration for atasira, written by `atasira nats-config`.");
    let _ = writeln!(conf, "# Every process of atasira connects with its own nkey (its .creds file next to this");
    let _ = writeln!(conf, "# file) and may publish and subscribe only where its permissions say; everyone else");
    let _ = writeln!(conf, "# is authenticated by the auth callout that the gateway answers (a PAT as the token).");
    let _ = writeln!(conf, "# The permissions come from atasira's subject map; regenerate rather than edit.");
    let _ = writeln!(conf);
    let _ = writeln!(conf, "port: {port}");
    let _ = writeln!(conf);
    let (cert, key, ca) = (quoted_path(&tls.cert, "certificate")?, quoted_path(&tls.key, "private key")?, quoted_path(&tls.ca, "CA certificate")?);
    let _ = writeln!(conf, "# Clients speak TLS only; they trust the private CA in {CA_FILE} (and in their credentials).");
    let _ = writeln!(conf, "tls {{");
    let _ = writeln!(conf, "  cert_file: {cert}");
    let _ = writeln!(conf, "  key_file: {key}");
    let _ = writeln!(conf, "  timeout: 5");
    let _ = writeln!(conf, "}}");
    let _ = writeln!(conf);
    if let Some(node) = node {
        let bad = |what: &str| anyhow::anyhow!("the {what} of node {} cannot be written to the configuration", node.name);
        let _ = writeln!(conf, "# Node {} of the cluster {CLUSTER_NAME}: routes to the other nodes, authenticated.", node.name);
        let _ = writeln!(conf, "server_name: {}", quoted(&node.name).ok_or_else(|| bad("name"))?);
        let _ = writeln!(conf, "cluster {{");
        let _ = writeln!(conf, "  name: {}", quoted(CLUSTER_NAME).ok_or_else(|| bad("cluster name"))?);
        let _ = writeln!(conf, "  listen: {}", quoted(&node.listen).ok_or_else(|| bad("route address"))?);
        let _ = writeln!(conf, "  authorization {{ user: \"{ROUTE_USER}\", password: {} }}", quoted(&node.route_secret).ok_or_else(|| bad("route password"))?);
        let routes: Vec<String> = node.peers.iter().map(|p| format!("nats-route://{ROUTE_USER}:{}@{p}", node.route_secret)).collect();
        let _ = writeln!(conf, "  routes: {}", quoted_list(&routes).map_err(|_| bad("routes"))?);
        let _ = writeln!(conf, "  # Routes speak TLS both ways, each node proving itself with a certificate of the CA.");
        let _ = writeln!(conf, "  tls {{ cert_file: {cert}, key_file: {key}, ca_file: {ca}, verify: true, timeout: 5 }}");
        let _ = writeln!(conf, "}}");
        let _ = writeln!(conf);
    }
    let _ = writeln!(conf, "# The stream is written to disk every second; the outbox relay publishes again what a");
    let _ = writeln!(conf, "# crash of this host could lose (it stores its checkpoint only past what is on disk).");
    let _ = writeln!(conf, "jetstream {{");
    let _ = writeln!(conf, "  store_dir: {store}");
    // Written to disk every second, not after every message: the outbox relay stores
    // its checkpoint only past what is on disk by then, and publishes again after a
    // reconnect, so a crash of this host loses no event from the stream.
    let _ = writeln!(conf, "  sync_interval: \"{}s\"", atasira_platform::relay::JETSTREAM_SYNC_INTERVAL.as_secs());
    let _ = writeln!(conf, "}}");
    let _ = writeln!(conf);
    let _ = writeln!(conf, "accounts {{");
    let _ = writeln!(conf, "  {ACCOUNT} {{");
    let _ = writeln!(conf, "    jetstream: enabled");
    let _ = writeln!(conf, "    users: [");
    for (identity, public) in &keys.users {
        let nkey = quoted(public).ok_or_else(|| anyhow::anyhow!("malformed public key for {identity}"))?;
        let _ = writeln!(conf, "      # {identity}");
        let _ = writeln!(conf, "      {{ nkey: {nkey}, permissions: {} }}", render_permissions(&subjects::permissions_of(identity))?);
    }
    let _ = writeln!(conf, "    ]");
    let _ = writeln!(conf, "  }}");
    let _ = writeln!(conf, "  {SYSTEM_ACCOUNT} {{ }}");
    let _ = writeln!(conf, "}}");
    let _ = writeln!(conf, "system_account: {SYSTEM_ACCOUNT}");
    let _ = writeln!(conf);
    let issuer = quoted(&keys.callout_issuer).ok_or_else(|| anyhow::anyhow!("malformed callout issuer key"))?;
    let auth_users: Vec<String> = keys.users.iter().map(|(_, public)| public.clone()).collect();
    let _ = writeln!(conf, "# Connections without one of the nkeys above go to the auth callout.");
    let _ = writeln!(conf, "authorization {{");
    let _ = writeln!(conf, "  auth_callout {{");
    let _ = writeln!(conf, "    issuer: {issuer}");
    let _ = writeln!(conf, "    # Requests (which carry the connecting publisher's token) are encrypted to this key.");
    let _ = writeln!(conf, "    xkey: {}", quoted(&keys.callout_xkey).ok_or_else(|| anyhow::anyhow!("malformed callout xkey"))?);
    let _ = writeln!(conf, "    account: {ACCOUNT}");
    let _ = writeln!(conf, "    auth_users: {}", quoted_list(&auth_users)?);
    let _ = writeln!(conf, "  }}");
    let _ = writeln!(conf, "}}");
    Ok(conf)
}

/// One decorated seed block, as NATS tools write them.
fn seed_block(kind: &str, seed: &str) -> String {
    format!("-----BEGIN {kind}-----\n{seed}\n------END {kind}------\n")
}

/// The gateway's secrets for the auth callout.
struct CalloutSeeds<'a> {
    /// The issuer's account seed (`SA...`).
    issuer: &'a str,
    /// The curve seed (`SX...`) the callout's requests are decrypted with.
    xkey: &'a str,
}

/// The text of a credentials file: the user seed, the gateway's callout seeds or the
/// registry's trigger listener seed, and the CA certificate NATS's TLS is checked against.
fn render_creds(identity: &str, user_seed: &str, callout: Option<&CalloutSeeds>, trigger_seed: Option<&str>, ca_pem: &str) -> String {
    let mut text = format!(
        "# NATS credentials of atasira's {identity} process, written by `atasira nats-config`.\n\
         # Secret: keep this file readable by the {identity} process's user only (mode 0600).\n\n"
    );
    text.push_str(&seed_block(USER_SEED, user_seed));
    if let Some(seeds) = callout {
        text.push_str("\n# The auth callout's issuer key: the gateway signs NATS publishers' permissions with it.\n");
        text.push_str(&seed_block(ACCOUNT_SEED, seeds.issuer));
        text.push_str("\n# The auth callout's encryption key: nats-server encrypts its requests to it.\n");
        text.push_str(&seed_block(CURVE_SEED, seeds.xkey));
    }
    if let Some(seed) = trigger_seed {
        text.push_str("\n# The trigger listener's key: the registry hears event Boxes' topics with it.\n");
        text.push_str(&seed_block(TRIGGER_SEED, seed));
    }
    text.push_str("\n# The private CA that NATS's certificate is checked against (public).\n");
    text.push_str(ca_pem);
    text
}

/// A process's credentials, read from its file. Debug never shows the seeds.
#[derive(Clone)]
pub struct Creds {
    /// The user nkey seed (`SU...`).
    pub user_seed: String,
    /// The auth callout issuer's account seed (`SA...`); only in the gateway's file.
    pub account_seed: Option<String>,
    /// The auth callout's curve seed (`SX...`); only in the gateway's file.
    pub xkey_seed: Option<String>,
    /// The trigger listener's user seed (`SU...`); only in the runtime registry's file.
    pub trigger_seed: Option<String>,
    /// The CA certificate(s) NATS's TLS is checked against (PEM), if the file has any.
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creds")
            .field("user_seed", &"<secret>")
            .field("account_seed", &self.account_seed.as_ref().map(|_| "<secret>"))
            .field("xkey_seed", &self.xkey_seed.as_ref().map(|_| "<secret>"))
            .field("trigger_seed", &self.trigger_seed.as_ref().map(|_| "<secret>"))
            .field("ca", &self.ca_pem.is_some())
            .finish()
    }
}

/// The line after the `kind` block's BEGIN line in `text`, if there is such a block.
fn block_line<'a>(text: &'a str, kind: &str) -> Option<&'a str> {
    let begin = format!("-----BEGIN {kind}-----");
    let mut lines = text.lines().map(str::trim);
    lines.any(|l| l == begin).then(|| lines.find(|l| !l.is_empty()).unwrap_or_default())
}

/// The seed inside the `kind` block of `text`, if any; `Err` names what is wrong without
/// ever showing the seed.
fn find_seed(text: &str, kind: &str, expected: nkeys::KeyPairType) -> Result<Option<String>, String> {
    let Some(seed) = block_line(text, kind) else { return Ok(None) };
    match nkeys::KeyPair::from_seed(seed) {
        Ok(pair) if pair.key_pair_type() == expected => Ok(Some(seed.to_owned())),
        Ok(_) => Err(format!("its {} block holds another kind of key", kind.to_lowercase())),
        Err(_) => Err(format!("its {} block holds no valid seed", kind.to_lowercase())),
    }
}

/// The curve seed (the auth callout's xkey) in `text`, if any (never shown in an error).
fn find_xkey_seed(text: &str) -> Result<Option<String>, String> {
    let Some(seed) = block_line(text, CURVE_SEED) else { return Ok(None) };
    match nkeys::XKey::from_seed(seed) {
        Ok(_) => Ok(Some(seed.to_owned())),
        Err(_) => Err(format!("its {} block holds no valid seed", CURVE_SEED.to_lowercase())),
    }
}

/// Parses a credentials file's text.
pub fn parse_creds(text: &str) -> Result<Creds, String> {
    let user_seed = find_seed(text, USER_SEED, nkeys::KeyPairType::User)?.ok_or_else(|| format!("it holds no {} block", USER_SEED.to_lowercase()))?;
    let account_seed = find_seed(text, ACCOUNT_SEED, nkeys::KeyPairType::Account)?;
    let xkey_seed = find_xkey_seed(text)?;
    let trigger_seed = find_seed(text, TRIGGER_SEED, nkeys::KeyPairType::User)?;
    Ok(Creds { user_seed, account_seed, xkey_seed, trigger_seed, ca_pem: crate::tls::certificate_blocks(text) })
}

/// Reads a credentials file; refuses one that group or others may read (a seed is a
/// password) and never shows a seed in an error.
pub fn read_creds(path: &Path) -> anyhow::Result<Creds> {
    let text = crate::files::read_private(path, "NATS credentials file", "a secret key")?;
    parse_creds(&text).map_err(|why| anyhow::anyhow!("{} is not a credentials file written by `atasira nats-config`: {why}", path.display()))
}

/// `atasira nats-config` settings.
#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    pub port: u16,
    pub store_dir: Option<PathBuf>,
    /// `--route`: the route address of every node of a cluster (none: one server).
    pub routes: Vec<String>,
    /// `--tls-host`: names and addresses clients reach NATS by, beyond loopback.
    pub tls_hosts: Vec<String>,
    /// `--cert-dir`: where nats-server will read its certificate and key (default `out`).
    pub cert_dir: Option<PathBuf>,
    /// `--host`: the execution hosts that get credentials (`host-<name>.creds`).
    pub hosts: Vec<String>,
    pub force: bool,
}

/// The configuration file of cluster node `n` (from 1).
pub fn node_conf_file(n: usize) -> String {
    format!("nats-server-{n}.conf")
}

/// `atasira nats-config`.
pub fn run(options: &Options) -> anyhow::Result<()> {
    let out = &options.out;
    let nodes = if options.routes.is_empty() { Vec::new() } else { cluster_nodes(&options.routes, &hex::encode(atasira_platform::auth::random_secret()))? };
    let conf_files: Vec<PathBuf> = if nodes.is_empty() { vec![out.join(CONF_FILE)] } else { (1..=nodes.len()).map(|n| out.join(node_conf_file(n))).collect() };
    let node_numbers: Vec<Option<usize>> = if nodes.is_empty() { vec![None] } else { (1..=nodes.len()).map(Some).collect() };
    let tls_in_out: Vec<TlsFiles> = node_numbers.iter().map(|n| TlsFiles::in_dir(out, *n)).collect();
    let existing: Vec<PathBuf> = conf_files
        .iter()
        .cloned()
        .chain(creds_users(&options.hosts).iter().map(|i| creds_path(out, i)))
        .chain(tls_in_out.iter().flat_map(|t| [t.cert.clone(), t.key.clone()]))
        .chain([out.join(CA_FILE)])
        .filter(|p| p.exists())
        .collect();
    if !existing.is_empty() && !options.force {
        anyhow::bail!(
            "{} already holds a NATS configuration ({}); pass --force to replace it with new keys \
             (every process then needs its new credentials file and nats-server the new configuration)",
            out.display(),
            existing.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect::<Vec<_>>().join(", ")
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o700)).with_context(|| format!("cannot restrict {} to its owner", out.display()))?;
    }
    let out = std::fs::canonicalize(out).with_context(|| format!("cannot resolve {}", out.display()))?;
    let store_dir = match &options.store_dir {
        Some(dir) if dir.is_absolute() => dir.clone(),
        Some(dir) => std::env::current_dir().context("cannot resolve the current directory")?.join(dir),
        None => out.join("jetstream"),
    };

    let cert_dir = match &options.cert_dir {
        Some(dir) if dir.is_absolute() => dir.clone(),
        Some(dir) => std::env::current_dir().context("cannot resolve the current directory")?.join(dir),
        None => out.clone(),
    };

    // TLS: a private CA and one certificate per server, naming loopback, --tls-host and
    // (a cluster's node) its route host.
    let hosts: Vec<Vec<String>> = node_numbers
        .iter()
        .map(|n| {
            let route_host = n.and_then(|n| nodes.get(n - 1)).map(|node| node.host.clone());
            let mut names: Vec<String> = crate::tls::LOCAL_HOSTS.iter().map(|h| (*h).to_owned()).collect();
            for host in options.tls_hosts.iter().cloned().chain(route_host) {
                if !names.contains(&host) {
                    names.push(host);
                }
            }
            names
        })
        .collect();
    let issued = crate::tls::issue("NATS", &hosts)?;

    let issuer = nkeys::KeyPair::new_account();
    let xkey = nkeys::XKey::new();
    if let Some(bad) = options.hosts.iter().find(|h| !subjects::is_host_name(h)) {
        anyhow::bail!("--host {bad:?}: a host name is 1 to 32 lowercase letters, digits and '-'");
    }
    let users: Vec<(String, nkeys::KeyPair)> = users(&options.hosts).into_iter().map(|i| (i, nkeys::KeyPair::new_user())).collect();
    let public = PublicKeys {
        users: users.iter().map(|(i, k)| (i.clone(), k.public_key())).collect(),
        callout_issuer: issuer.public_key(),
        callout_xkey: xkey.public_key(),
    };
    let seed = |k: &nkeys::KeyPair| k.seed().map_err(|_| anyhow::anyhow!("a generated key has no seed"));
    let (issuer_seed, xkey_seed) = (seed(&issuer)?, xkey.seed().map_err(|_| anyhow::anyhow!("a generated key has no seed"))?);

    let listener_seed = match users.iter().find(|(identity, _)| identity == subjects::TRIGGER_LISTENER) {
        Some((_, key)) => seed(key)?,
        None => anyhow::bail!("the trigger listener has no key"),
    };
    let mut written = Vec::new();
    for (identity, key) in users.iter().filter(|(identity, _)| identity != subjects::TRIGGER_LISTENER) {
        let callout = (identity == subjects::GATEWAY).then_some(CalloutSeeds { issuer: &issuer_seed, xkey: &xkey_seed });
        let trigger = (identity == subjects::RUNTIME_REGISTRY).then_some(listener_seed.as_str());
        let path = creds_path(&out, identity);
        crate::files::write_file(&path, &render_creds(identity, &seed(key)?, callout.as_ref(), trigger, &issued.ca_pem), 0o600)?;
        written.push((path, identity.clone()));
    }
    // The CA and the certificates are public; the servers' keys for nats-server alone.
    let ca_path = out.join(CA_FILE);
    crate::files::write_file(&ca_path, &issued.ca_pem, 0o644)?;
    for (files, server) in tls_in_out.iter().zip(&issued.servers) {
        crate::files::write_file(&files.cert, &server.cert_pem, 0o644)?;
        crate::files::write_file(&files.key, &server.key_pem, 0o600)?;
    }
    let tls_files: Vec<TlsFiles> = node_numbers.iter().map(|n| TlsFiles::in_dir(&cert_dir, *n)).collect();
    if nodes.is_empty() {
        // The configuration holds public keys only; nats-server may run as another user.
        let conf_path = out.join(CONF_FILE);
        crate::files::write_file(&conf_path, &render_conf(&public, options.port, &store_dir, None, &tls_files[0])?, 0o644)?;
        eprintln!("atasira nats-config: wrote {} (port {}, JetStream store {})", conf_path.display(), options.port, store_dir.display());
    } else {
        // Each node's file holds the routes' password: its owner only.
        for ((node, path), tls) in nodes.iter().zip(&conf_files).zip(&tls_files) {
            crate::files::write_file(path, &render_conf(&public, options.port, &store_dir, Some(node), tls)?, 0o600)?;
            eprintln!(
                "atasira nats-config: wrote {} (node {}, port {}, routes on {}, JetStream store {}; mode 0600: it holds the routes' password)",
                path.display(),
                node.name,
                options.port,
                node.listen,
                store_dir.join(&node.name).display()
            );
        }
    }
    for (files, names) in tls_in_out.iter().zip(&hosts) {
        eprintln!("  {} and {} (TLS for {}; the key mode 0600, for nats-server alone)", files.cert.display(), files.key.display(), names.join(", "));
    }
    eprintln!("  {} (the private CA: NATS clients trust it; every credentials file holds it too)", ca_path.display());
    for (path, identity) in &written {
        let what = match identity.as_str() {
            subjects::GATEWAY => "gateway, with the auth callout's issuer and encryption keys".to_owned(),
            subjects::RUNTIME_REGISTRY => "runtime-registry, with the key it hears event Boxes' topics with".to_owned(),
            subjects::OPERATOR => "operator: sets up JetStream; give it to no process".to_owned(),
            host if host.starts_with("host-") => format!("execution host {}", &host[5..]),
            other => other.to_owned(),
        };
        eprintln!("  {} ({what}; mode 0600)", path.display());
    }
    for path in &conf_files {
        eprintln!("next: nats-server -c {}", path.display());
    }
    let url = format!("tls://{}:{}", options.tls_hosts.first().map_or("127.0.0.1", String::as_str), options.port);
    eprintln!("      atasira nats-setup --nats-url {url} --nats-creds {}", creds_path(&out, subjects::OPERATOR).display());
    eprintln!("      atasira serve <service> --nats-url {url} --nats-creds {}", creds_path(&out, "<service>").display());
    eprintln!("      other NATS clients connect to {url} trusting {}", ca_path.display());
    if cert_dir != out {
        eprintln!("      (the configuration reads the certificate and key from {}: put them there)", cert_dir.display());
    }
    if !nodes.is_empty() {
        eprintln!("      with --nats-url listing the nodes' client addresses, separated by commas, and (nats-setup)");
        eprintln!("      --stream-replicas {} so the events stream survives losing a node", nodes.len().min(3));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> PublicKeys {
        PublicKeys {
            users: users(&["h1".to_owned()]).into_iter().map(|i| (i, nkeys::KeyPair::new_user().public_key())).collect(),
            callout_issuer: nkeys::KeyPair::new_account().public_key(),
            callout_xkey: nkeys::XKey::new().public_key(),
        }
    }

    fn tls() -> TlsFiles {
        TlsFiles::in_dir(Path::new("/etc/nats"), None)
    }

    #[test]
    fn the_configuration_quotes_every_subject_and_lists_every_identity() {
        let keys = keys();
        let conf = render_conf(&keys, 4333, Path::new("/var/lib/nats"), None, &tls()).expect("renders");
        assert!(conf.contains("tls {\n  cert_file: \"/etc/nats/server-cert.pem\"\n  key_file: \"/etc/nats/server-key.pem\""), "clients speak TLS: {conf}");
        assert!(conf.contains(&format!("xkey: \"{}\"", keys.callout_xkey)), "the callout's requests are encrypted: {conf}");
        assert!(conf.contains("port: 4333"));
        assert!(conf.contains("store_dir: \"/var/lib/nats\""));
        assert!(conf.contains("sync_interval: \"1s\""), "the relay counts on a sync every second: {conf}");
        assert_eq!(conf.matches("\"$JS.API.>\"").count(), 1, "the operator's alone: {conf}");
        assert!(conf.contains("\"$JS.API.STREAM.INFO.ATASIRA_EVENTS\""), "{conf}");
        assert!(conf.contains("\"$SYS.REQ.USER.AUTH\""));
        assert!(!conf.contains(" $"), "no unquoted subject (nats-server would read a variable): {conf}");
        for (identity, public) in &keys.users {
            assert!(conf.contains(&format!("# {identity}\n      {{ nkey: \"{public}\"")), "{identity}");
        }
        assert!(conf.contains(&format!("issuer: \"{}\"", keys.callout_issuer)));
        assert_eq!(conf.matches("allow_responses: false").count(), subjects::IDENTITIES.len() + 3, "replies go to the callers' inboxes only");
        // The trigger listener hears topics, never atasira's subjects, inboxes or NATS's own.
        assert!(conf.contains("# triggers\n"), "{conf}");
        assert!(conf.contains("subscribe: { allow: [\">\"], deny: [\"atasira.>\", \"_INBOX.>\", \"$SYS.>\""), "{conf}");
        assert!(conf.contains("# host-h1\n"), "an execution host has a user of its own: {conf}");
        assert!(conf.contains("\"atasira.box.host.h1.runtime-registry\""), "{conf}");
    }

    #[test]
    fn an_empty_allow_list_denies_everything_and_odd_text_is_refused() {
        let none = render_permissions(&Permissions::default()).expect("renders");
        assert_eq!(none, "{ publish: { deny: [\">\"] }, subscribe: { deny: [\">\"] }, allow_responses: false }");
        let odd = Permissions { publish: vec!["a\" b".into()], subscribe: vec!["x".into()], ..Permissions::default() };
        assert!(render_permissions(&odd).is_err());
        assert!(render_conf(&keys(), 4222, Path::new("/with space"), None, &tls()).is_err());
        assert!(render_conf(&keys(), 4222, Path::new("/var"), None, &TlsFiles::in_dir(Path::new("/a b"), None)).is_err());
    }

    #[test]
    fn given_three_route_addresses_when_rendered_then_each_node_routes_to_the_two_others_with_the_password() {
        let routes: Vec<String> = ["127.0.0.1:6001", "127.0.0.1:6002", "nats-3:6222"].map(String::from).to_vec();
        let nodes = cluster_nodes(&routes, "s3cret").expect("nodes");
        assert_eq!(nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["atasira-1", "atasira-2", "atasira-3"]);
        assert_eq!(nodes[0].listen, "127.0.0.1:6001", "an IP is listened on as given");
        assert_eq!(nodes[2].listen, "0.0.0.0:6222", "a host name on every interface");
        assert_eq!(nodes[1].peers, ["127.0.0.1:6001", "nats-3:6222"]);
        assert!(!format!("{:?}", nodes[0]).contains("s3cret"), "Debug hides the password");

        assert_eq!(nodes[2].host, "nats-3", "the name the others reach it by (its certificate names it)");
        let conf =
            render_conf(&keys(), 4222, Path::new("/var/lib/nats"), Some(&nodes[0]), &TlsFiles::in_dir(Path::new("/etc/nats"), Some(1))).expect("renders");
        assert!(
            conf.contains(
                "tls { cert_file: \"/etc/nats/server-1-cert.pem\", key_file: \"/etc/nats/server-1-key.pem\", ca_file: \"/etc/nats/ca.pem\", verify: true"
            ),
            "routes speak TLS and verify each other: {conf}"
        );
        assert!(conf.contains("server_name: \"atasira-1\""), "{conf}");
        assert!(conf.contains("store_dir: \"/var/lib/nats/atasira-1\""), "a store per node: {conf}");
        assert!(conf.contains("authorization { user: \"route\", password: \"s3cret\" }"), "{conf}");
        assert!(conf.contains("routes: [\"nats-route://route:s3cret@127.0.0.1:6002\", \"nats-route://route:s3cret@nats-3:6222\"]"), "{conf}");
        assert!(conf.contains("auth_callout"), "the same accounts and callout as one server");
    }

    #[test]
    fn given_bad_route_addresses_then_they_are_refused_naming_them() {
        for bad in [vec!["127.0.0.1:6001"], vec!["a:1", "a:1"], vec!["a", "b:2"], vec!["a:x", "b:2"], vec!["a b:1", "b:2"]] {
            let routes: Vec<String> = bad.iter().map(|r| (*r).to_owned()).collect();
            assert!(cluster_nodes(&routes, "s").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn credentials_round_trip_and_errors_never_show_the_seed() {
        let user = nkeys::KeyPair::new_user().seed().expect("seed");
        let account = nkeys::KeyPair::new_account().seed().expect("seed");
        let xkey = nkeys::XKey::new().seed().expect("seed");
        let ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let callout = CalloutSeeds { issuer: &account, xkey: &xkey };
        let gateway = parse_creds(&render_creds("gateway", &user, Some(&callout), None, ca)).expect("parses");
        assert_eq!((gateway.user_seed.as_str(), gateway.account_seed.as_deref()), (user.as_str(), Some(account.as_str())));
        assert_eq!((gateway.xkey_seed.as_deref(), gateway.ca_pem.as_deref()), (Some(xkey.as_str()), Some(ca)));
        let drafts = parse_creds(&render_creds("drafts", &user, None, None, ca)).expect("parses");
        assert_eq!((drafts.account_seed, drafts.xkey_seed), (None, None));
        assert_eq!(drafts.ca_pem.as_deref(), Some(ca), "every process trusts the CA");
        assert_eq!(drafts.trigger_seed, None);
        let listener = nkeys::KeyPair::new_user().seed().expect("seed");
        let registry = parse_creds(&render_creds("runtime-registry", &user, None, Some(&listener), ca)).expect("parses");
        assert_eq!((registry.user_seed.as_str(), registry.trigger_seed.as_deref()), (user.as_str(), Some(listener.as_str())));
        assert!(!format!("{registry:?}").contains(&listener[2..]), "Debug hides the seeds");
        let debug = format!("{gateway:?}");
        assert!(!debug.contains(&user[2..]) && !debug.contains(&xkey[2..]), "Debug hides the seeds");

        let swapped = render_creds("drafts", &account, None, None, ca);
        let e = parse_creds(&swapped).expect_err("an account seed in the user block");
        assert!(!e.contains(&account[2..]) && e.contains("another kind of key"), "{e}");
        let mangled = render_creds("drafts", &format!("{}X", &user[..user.len() - 1]), None, None, ca);
        let e = parse_creds(&mangled).expect_err("bad checksum");
        assert!(!e.contains(&user[2..user.len() - 1]), "{e}");
        assert!(parse_creds("").is_err());
    }
}
