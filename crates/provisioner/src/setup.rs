//! The three setups of R-PROV-1 (`git_remote`, `ssh_target`, `netrc_entry`), each
//! idempotent so that a redelivered activation can simply run it again, and each confined
//! to the data dir: nothing here ever touches `~/.ssh` or `~/.netrc`, and no secret is
//! ever written (only vault and item names).
//!
//! Values come from an approved manifest, but approval is not sanitisation: every value
//! that reaches a command line or a config file is checked first, commands get their
//! arguments as separate argv entries (never a shell), and files are replaced atomically
//! (temp file + rename) so a crash never leaves half a config behind.
//!
//! A workspace is handed to Workers, who write in it; nothing they leave there may act
//! as the provisioner. So git never runs inside a workspace: each remote is cloned and
//! fetched in the provisioner's own bare repository (`git/<box_type>.git`, which no
//! Worker is given), and a workspace is a fresh copy of it, made once; git runs without
//! hooks, system or user configuration. Managed files are never opened through a
//! symbolic link, and their temp files have unguessable names and must be new.

use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use atasira_domain::BoxType;
use atasira_domain::manifest::RequiredAccess;

/// How long one `git ls-remote` may take: long enough for a slow remote, short enough
/// that an unresponsive one does not stall the provisioner.
const LS_REMOTE_TIMEOUT: Duration = Duration::from_secs(30);
/// Clones and fetches move whole histories, so they get more time than a reachability
/// probe; a hung transfer is still killed (`kill_on_drop`).
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
/// The only protocols git may use (`GIT_ALLOW_PROTOCOL`): defence in depth behind the URL
/// check, so that even a URL that slipped through cannot reach `ext::` (a shell).
const GIT_PROTOCOLS: &str = "file:git:http:https:ssh";
/// URL prefixes worth trying; anything else (`ext::`, `fd::`, a bare relative path, an
/// option like `--upload-pack=...`) fails without running git.
const GIT_URL_PREFIXES: &[&str] = &["https://", "http://", "ssh://", "git@", "file://"];
/// Settings every git command runs with, whatever a repository's own configuration says:
/// no hooks (`hooksPath`), no file-system monitor command, ssh as itself, no `ext::`
/// transport (a shell). The file protocol stays: local paths and `file://` are remote
/// forms users may give, and a workspace is copied from a local repository.
const GIT_SAFETY: &[&str] = &["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.sshCommand=ssh", "-c", "protocol.ext.allow=never"];
/// A reason quotes at most this much of git's stderr: enough to tell why, short enough
/// for an event shown on the Box.
const MAX_REASON_CHARS: usize = 300;

/// Why one try of a setup did not work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetupError {
    /// Trying again cannot help (a refused value, a directory that holds something else).
    Permanent(String),
    /// Might work later (network, a remote that is down, a full disk).
    Transient(String),
}

impl SetupError {
    pub(crate) fn reason(&self) -> &str {
        match self {
            SetupError::Permanent(r) | SetupError::Transient(r) => r,
        }
    }
}

/// Performs setups under one data dir.
#[derive(Debug, Clone)]
pub(crate) struct Setups {
    data_dir: PathBuf,
    /// The git executable; a field so tests can prove that a refused URL never runs it.
    git: OsString,
}

impl Setups {
    pub(crate) fn new(data_dir: PathBuf) -> Self {
        Self { data_dir, git: OsString::from("git") }
    }

    #[cfg(test)]
    pub(crate) fn with_git(mut self, git: impl Into<OsString>) -> Self {
        self.git = git.into();
        self
    }

    /// One try of one entry; the success value is the detail recorded in the event.
    pub(crate) async fn perform(&self, box_type: &BoxType, access: &RequiredAccess) -> Result<String, SetupError> {
        match access {
            RequiredAccess::GitRemote { url } => self.git_remote(box_type, url).await,
            RequiredAccess::SshTarget { host, user, port } => {
                let (path, block) = (self.data_dir.join("ssh").join("config"), ssh_block(box_type, host, user, *port)?);
                upsert_in_background(path, block).await?;
                Ok(format!("Host {box_type}-{host} in ssh/config"))
            }
            RequiredAccess::NetrcEntry { machine, login, vault, item } => {
                let (path, block) = (self.data_dir.join("netrc"), netrc_block(box_type, machine, login, vault, item)?);
                upsert_in_background(path, block).await?;
                Ok(format!("machine {machine} login {login} in netrc (password from vault {vault}, item {item})"))
            }
        }
    }

    /// `ls-remote` proves the remote answers; then the provisioner's own bare repository
    /// of the Box type is cloned (atomically, via a partial directory renamed into place)
    /// or, when it already holds a clone of the same URL, fetched; an absent or empty
    /// workspace gets a copy of it (a clone whose origin is the remote). A workspace with
    /// anything in it is the Workers' and left as it is: git never runs there.
    async fn git_remote(&self, box_type: &BoxType, url: &str) -> Result<String, SetupError> {
        check_git_url(url)?;
        let repos = self.data_dir.join("git");
        create_private_dir_async(&repos).await?;
        self.git(&repos, ["ls-remote", "--", url].map(OsStr::new), LS_REMOTE_TIMEOUT).await.map_err(SetupError::Transient)?;
        let root = self.data_dir.join("workspaces");
        tokio::fs::create_dir_all(&root).await.map_err(|e| SetupError::Transient(format!("cannot create {}: {e}", root.display())))?;
        let dest = root.join(box_type.as_str());
        let shown = format!("workspaces/{box_type}");
        let mirror = repos.join(format!("{box_type}.git"));
        let fetched = if tokio::fs::try_exists(&mirror).await.unwrap_or(false) {
            let git_dir = [OsStr::new("--git-dir"), mirror.as_os_str()];
            let origin = self.git(&repos, git_dir.into_iter().chain(["config", "--get", "remote.origin.url"].map(OsStr::new)), LS_REMOTE_TIMEOUT).await;
            let origin = origin.map_err(SetupError::Transient)?;
            let origin = origin.trim();
            if origin != url {
                return Err(SetupError::Permanent(format!("{shown} already holds a clone of {origin}, not of {url}")));
            }
            let fetch = ["fetch", "--quiet", "--prune", "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"].map(OsStr::new);
            self.git(&repos, git_dir.into_iter().chain(fetch), TRANSFER_TIMEOUT).await.map_err(SetupError::Transient)?;
            true
        } else {
            if !is_absent_or_empty_dir(&dest).await? {
                return Err(SetupError::Permanent(format!("{shown} exists and is not a git clone the provisioner made; refusing to overwrite it")));
            }
            // A crash mid-clone leaves only this partial directory, never a half-cloned repository.
            let partial = repos.join(format!(".{box_type}.git.partial"));
            remove_dir_if_present(&partial).await.map_err(|e| SetupError::Transient(format!("cannot clear {}: {e}", partial.display())))?;
            let clone = ["clone", "--bare", "--quiet", "--", url].map(OsStr::new);
            self.git(&repos, clone.into_iter().chain([partial.as_os_str()]), TRANSFER_TIMEOUT).await.map_err(SetupError::Transient)?;
            tokio::fs::rename(&partial, &mirror).await.map_err(|e| SetupError::Transient(format!("cannot move the clone of {url} into place: {e}")))?;
            false
        };
        if !is_absent_or_empty_dir(&dest).await? {
            return Ok(format!("fetched {url}; {shown} is in use and left as it is"));
        }
        self.check_out(&repos, &mirror, url, box_type, &dest).await?;
        Ok(if fetched { format!("fetched {url} and checked it out into {shown}") } else { format!("cloned {url} into {shown}") })
    }

    /// Makes the workspace `dest` a copy of the bare repository `mirror` (files copied, no
    /// links into it) whose origin is `url`, assembled beside `mirror` and renamed into place.
    async fn check_out(&self, repos: &Path, mirror: &Path, url: &str, box_type: &BoxType, dest: &Path) -> Result<(), SetupError> {
        let partial = repos.join(format!(".{box_type}.workspace.partial"));
        remove_dir_if_present(&partial).await.map_err(|e| SetupError::Transient(format!("cannot clear {}: {e}", partial.display())))?;
        let clone = ["clone", "--quiet", "--no-hardlinks", "--"].map(OsStr::new);
        self.git(repos, clone.into_iter().chain([mirror.as_os_str(), partial.as_os_str()]), TRANSFER_TIMEOUT).await.map_err(SetupError::Transient)?;
        let git_dir = partial.join(".git");
        let set_url = ["remote", "set-url", "origin", url].map(OsStr::new);
        self.git(repos, [OsStr::new("--git-dir"), git_dir.as_os_str()].into_iter().chain(set_url), LS_REMOTE_TIMEOUT).await.map_err(SetupError::Transient)?;
        // rename(2) replaces an empty directory, so an empty leftover `dest` is fine.
        tokio::fs::rename(&partial, dest).await.map_err(|e| SetupError::Transient(format!("cannot move the checkout into workspaces/{box_type}: {e}")))
    }

    /// Runs git in `cwd` (a directory of the provisioner's) without a shell, a terminal or
    /// stdin, killed when `timeout` passes; the error is the first lines of its stderr.
    /// Only the repository it is pointed at configures it: no system or user
    /// configuration, no hooks, no file-system monitor, no `ext::` transport; git does not
    /// look for a repository above `cwd`.
    async fn git<'a>(&self, cwd: &Path, args: impl IntoIterator<Item = &'a OsStr>, timeout: Duration) -> Result<String, String> {
        let mut command = tokio::process::Command::new(&self.git);
        command
            .args(GIT_SAFETY)
            .args(args)
            .current_dir(cwd)
            .env("GIT_CEILING_DIRECTORIES", cwd)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ALLOW_PROTOCOL", GIT_PROTOCOLS)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // An ssh remote must not wait for a passphrase or a host-key answer nobody gives.
        if std::env::var_os("GIT_SSH_COMMAND").is_none() {
            command.env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        }
        let output = match tokio::time::timeout(timeout, command.output()).await {
            Err(_) => return Err(format!("git did not finish within {} s", timeout.as_secs())),
            Ok(Err(e)) => return Err(format!("cannot run git: {e}")),
            Ok(Ok(output)) => output,
        };
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let said = first_lines(&output.stderr);
        Err(if said.is_empty() { format!("git failed ({})", output.status) } else { said })
    }
}

/// The URL forms R-PROV-1 allows: a known scheme, scp-like `git@`, or an absolute path.
fn check_git_url(url: &str) -> Result<(), SetupError> {
    if url.chars().any(char::is_control) {
        return Err(SetupError::Permanent("git_remote url contains control characters".into()));
    }
    if password_span(url).is_some() {
        // Cloning would store it in the workspace's git config (R-PROV-1: no secrets).
        return Err(SetupError::Permanent("git_remote url carries a password; name the credential in a netrc_entry (vault and item) instead".into()));
    }
    if GIT_URL_PREFIXES.iter().any(|p| url.starts_with(p)) || url.starts_with('/') {
        return Ok(());
    }
    Err(SetupError::Permanent(format!("git_remote url {url:?} is refused: only https://, http://, ssh://, git@, file:// or an absolute path are provisioned")))
}

/// Where the password of a `scheme://user:password@host/...` URL is, if it has one.
fn password_span(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let authority_end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    let at = url[start..authority_end].rfind('@')? + start;
    let colon = url[start..at].find(':')? + start;
    Some(colon + 1..at)
}

/// The entry as recorded in events and logs: [`RequiredAccess::describe`], with a
/// password in a git URL (refused anyway) masked so it is not stored by the refusal.
pub(crate) fn describe(access: &RequiredAccess) -> String {
    match access {
        RequiredAccess::GitRemote { url } => match password_span(url) {
            Some(span) => format!("git_remote {}***{}", &url[..span.start], &url[span.end..]),
            None => access.describe(),
        },
        other => other.describe(),
    }
}

/// git's own words, trimmed: the first two non-empty lines of stderr.
fn first_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).take(2).collect();
    lines.join(" / ").chars().take(MAX_REASON_CHARS).collect()
}

/// Whether `path` is absent or an empty directory; a symbolic link there (to anywhere)
/// is refused, never followed.
async fn is_absent_or_empty_dir(path: &Path) -> Result<bool, SetupError> {
    match tokio::fs::symlink_metadata(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(SetupError::Transient(format!("cannot look at {}: {e}", path.display()))),
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(SetupError::Permanent(format!("{} is a symbolic link; refusing to follow it", path.display())));
        }
        Ok(meta) if !meta.is_dir() => return Ok(false),
        Ok(_) => {}
    }
    match tokio::fs::read_dir(path).await {
        Ok(mut entries) => Ok(matches!(entries.next_entry().await, Ok(None))),
        Err(e) => Err(SetupError::Transient(format!("cannot read {}: {e}", path.display()))),
    }
}

async fn remove_dir_if_present(path: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_dir_all(path).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A value that becomes one token of a config line: no whitespace or control characters
/// (a newline would start a line of the attacker's choosing), no quoting or comment
/// characters, no ssh `%` tokens, no leading `-`.
fn check_token(field: &str, value: &str, also_forbidden: &[char]) -> Result<(), SetupError> {
    let bad = value.is_empty()
        || value.starts_with('-')
        || value.chars().any(|c| c.is_whitespace() || c.is_control() || "\"'\\#=%".contains(c) || also_forbidden.contains(&c));
    if bad {
        return Err(SetupError::Permanent(format!(
            "{field} {value:?} is refused: it must be one word without whitespace, quotes, '#', '=', '%' or a leading '-'"
        )));
    }
    Ok(())
}

/// A value that only appears inside a comment: anything but a line break (or another
/// control character) is harmless there.
fn check_comment_text(field: &str, value: &str) -> Result<(), SetupError> {
    if value.is_empty() || value.chars().any(char::is_control) {
        return Err(SetupError::Permanent(format!("{field} {value:?} is refused: it must be non-empty text on one line")));
    }
    Ok(())
}

/// One managed block of a config file; `begin`/`end` are its marker lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Block {
    begin: String,
    end: String,
    body: Vec<String>,
    /// Unix mode of the whole file (netrc must be private or clients ignore it).
    mode: u32,
}

/// The `Host <box_type>-<host>` block; identities are the operator's business, never
/// written here (`IdentitiesOnly yes` keeps ssh from offering every key it knows).
fn ssh_block(box_type: &BoxType, host: &str, user: &str, port: u16) -> Result<Block, SetupError> {
    // Pattern characters in a Host line would widen the alias to other hosts.
    check_token("ssh_target host", host, &['*', '?', '!', ','])?;
    check_token("ssh_target user", user, &[])?;
    if port == 0 {
        return Err(SetupError::Permanent("ssh_target port 0 is refused".into()));
    }
    Ok(Block {
        begin: format!("# BEGIN atasira {box_type} {host}"),
        end: format!("# END atasira {box_type} {host}"),
        body: vec![
            format!("Host {box_type}-{host}"),
            format!("    HostName {host}"),
            format!("    User {user}"),
            format!("    Port {port}"),
            "    IdentitiesOnly yes".to_owned(),
        ],
        mode: 0o600,
    })
}

/// The `machine <m> login <l>` entry; the password stays in the vault and the comment
/// says where (R-PROV-1: secrets are never stored, only vault/item names).
fn netrc_block(box_type: &BoxType, machine: &str, login: &str, vault: &str, item: &str) -> Result<Block, SetupError> {
    check_token("netrc_entry machine", machine, &[])?;
    check_token("netrc_entry login", login, &[])?;
    check_comment_text("netrc_entry vault", vault)?;
    check_comment_text("netrc_entry item", item)?;
    Ok(Block {
        begin: format!("# BEGIN atasira {box_type} {machine}"),
        end: format!("# END atasira {box_type} {machine}"),
        body: vec![format!("# atasira {box_type}: password from vault {vault}, item {item} (never stored here)"), format!("machine {machine} login {login}")],
        mode: 0o600,
    })
}

/// `existing` with `block` in place of its previous version (same marker), or appended.
/// A begin marker without its end (only a hand edit can do that: writes are atomic) is
/// taken to run to the end of the file.
pub(crate) fn replace_block(existing: &str, block: &Block) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut replaced = false;
    let mut inside = false;
    let rendered: Vec<&str> =
        std::iter::once(block.begin.as_str()).chain(block.body.iter().map(String::as_str)).chain(std::iter::once(block.end.as_str())).collect();
    for line in existing.lines() {
        if inside {
            inside = line != block.end;
            continue;
        }
        if line == block.begin {
            inside = true;
            if !replaced {
                out.extend(&rendered);
                replaced = true;
            }
            continue;
        }
        out.push(line);
    }
    if !replaced {
        out.extend(&rendered);
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}

/// File IO off the async workers; the setup is small but may hit a slow disk.
async fn upsert_in_background(path: PathBuf, block: Block) -> Result<(), SetupError> {
    tokio::task::spawn_blocking(move || {
        upsert_block(&path, &block).map_err(|e| {
            let reason = format!("cannot write {}: {e}", path.display());
            if e.kind() == std::io::ErrorKind::InvalidInput { SetupError::Permanent(reason) } else { SetupError::Transient(reason) }
        })
    })
    .await
    .map_err(|e| SetupError::Transient(format!("file writer failed: {e}")))?
}

/// Replaces (or adds) `block` in the file at `path`: write a private temp file with an
/// unguessable name beside it, flush it to disk, rename it over the old one. A symbolic
/// link at `path` is refused, never read through.
fn upsert_block(path: &Path, block: &Block) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("a managed file needs a parent directory"))?;
    create_private_dir(dir)?;
    let text = replace_block(&read_managed(path)?, block);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.atasira-tmp", uuid::Uuid::new_v4().simple()));
    if let Err(e) = write_new(&temp, text.as_bytes(), block.mode) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            let _ = std::fs::remove_file(&temp);
        }
        return Err(e);
    }
    std::fs::rename(&temp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}

/// Opening flags that refuse a symbolic link as the last component (`ELOOP`) and do not
/// wait on a FIFO someone put in a file's place.
#[cfg(unix)]
const NO_FOLLOW: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK;

/// The text of the managed file at `path` ("" when there is none yet); a symbolic link or
/// anything but a regular file there is an error.
fn read_managed(path: &Path) -> std::io::Result<String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, NO_FOLLOW);
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(refused("it is a symbolic link; refusing to follow it")),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(refused("it is not a regular file"));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text)?;
    Ok(text)
}

/// What trying again cannot change ([`upsert_in_background`] makes it permanent).
fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, why)
}

/// Creates the file `path`, which must not exist (a symbolic link there is not followed),
/// with `mode`, and writes `bytes` to disk.
pub(crate) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, NO_FOLLOW);
    }
    let mut file = options.open(path)?;
    // The umask may have narrowed `mode`; the file is ours, set it exactly.
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// [`create_private_dir`] off the async workers, for a setup.
async fn create_private_dir_async(dir: &Path) -> Result<(), SetupError> {
    let owned = dir.to_path_buf();
    tokio::task::spawn_blocking(move || create_private_dir(&owned))
        .await
        .map_err(|e| SetupError::Transient(format!("file writer failed: {e}")))?
        .map_err(|e| SetupError::Transient(format!("cannot create {}: {e}", dir.display())))
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[cfg(test)]
pub(crate) mod tests;
