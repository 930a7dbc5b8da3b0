//! Given/when/then tests of the setups against real git and real files (R-PROV-1).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::*;

/// A directory removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_git(args: &[&str], cwd: &Path) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=atasira test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(cwd)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// What git prints for `args` in `cwd`, trimmed.
fn git_output(args: &[&str], cwd: &Path) -> String {
    let out = std::process::Command::new("git").args(args).current_dir(cwd).output().expect("git runs");
    assert!(out.status.success(), "git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A bare repository with one commit on `main`, made with `git init --bare` and a push
/// from a temporary clone; returns its path.
pub(crate) fn bare_repo_with_a_commit(root: &Path) -> PathBuf {
    let bare = root.join("origin.git");
    let seed = root.join("seed");
    let bare_s = bare.to_str().expect("utf-8 path");
    run_git(&["init", "--bare", "--quiet", bare_s], root);
    run_git(&["clone", "--quiet", bare_s, seed.to_str().expect("utf-8 path")], root);
    std::fs::write(seed.join("README.md"), "hello from the remote\n").expect("write");
    run_git(&["add", "README.md"], &seed);
    run_git(&["commit", "--quiet", "-m", "first"], &seed);
    run_git(&["push", "--quiet", "origin", "HEAD:refs/heads/main"], &seed);
    run_git(&["symbolic-ref", "HEAD", "refs/heads/main"], &bare);
    bare
}

fn sales() -> BoxType {
    BoxType::parse("sales").expect("box type")
}

fn git_remote(url: &str) -> RequiredAccess {
    RequiredAccess::GitRemote { url: url.to_owned() }
}

#[tokio::test]
async fn given_a_reachable_bare_repo_when_provisioned_twice_then_cloned_once_and_refetched() {
    // R-PROV-1: git_remote is ls-remote'd and cloned into workspaces/<box_type>; idempotent
    let tmp = TempDir::new("atasira-prov-git");
    let bare = bare_repo_with_a_commit(&tmp.0);
    let url = bare.to_str().expect("utf-8 path");
    let data = tmp.0.join("data");
    let setups = Setups::new(data.clone());

    let first = setups.perform(&sales(), &git_remote(url)).await.expect("cloned");
    assert_eq!(first, format!("cloned {url} into workspaces/sales"));
    let readme = data.join("workspaces/sales/README.md");
    assert_eq!(std::fs::read_to_string(&readme).expect("checked out"), "hello from the remote\n");
    for partial in ["git/.sales.git.partial", "git/.sales.workspace.partial"] {
        assert!(!data.join(partial).exists(), "{partial} was moved into place");
    }
    // The workspace is a clone of the remote, sharing nothing with the provisioner's own.
    assert_eq!(git_output(&["remote", "get-url", "origin"], &data.join("workspaces/sales")), url);
    assert!(!data.join("workspaces/sales/.git/objects/info/alternates").exists());
    assert_eq!(git_output(&["--git-dir", "git/sales.git", "config", "--get", "remote.origin.url"], &data), url);

    let second = setups.perform(&sales(), &git_remote(url)).await.expect("fetched");
    assert_eq!(second, format!("fetched {url}; workspaces/sales is in use and left as it is"));
    assert_eq!(std::fs::read_to_string(&readme).expect("still there"), "hello from the remote\n");

    // An emptied workspace is checked out again from what was fetched.
    std::fs::remove_dir_all(data.join("workspaces/sales")).expect("emptied");
    let third = setups.perform(&sales(), &git_remote(url)).await.expect("checked out");
    assert_eq!(third, format!("fetched {url} and checked it out into workspaces/sales"));
    assert_eq!(std::fs::read_to_string(&readme).expect("checked out"), "hello from the remote\n");

    let file_url = format!("file://{url}");
    let other = setups.perform(&sales(), &git_remote(&file_url)).await.expect_err("a different remote");
    assert!(matches!(other, SetupError::Permanent(ref r) if r.contains("already holds a clone of")), "{other:?}");
}

#[tokio::test]
async fn given_an_unreachable_url_when_tried_then_the_reason_is_gits_own_and_retrying_may_help() {
    // R-PROV-1: the failure reason includes git's stderr
    let tmp = TempDir::new("atasira-prov-git");
    let setups = Setups::new(tmp.0.join("data"));
    let err = setups.perform(&sales(), &git_remote("file:///nonexistent/repo.git")).await.expect_err("unreachable");
    let SetupError::Transient(reason) = &err else { panic!("expected a transient failure, got {err:?}") };
    assert!(reason.contains("/nonexistent/repo.git"), "{reason}");
    assert!(!reason.contains('\n'), "trimmed to one line: {reason}");
    assert!(!tmp.0.join("data/workspaces/sales").exists());
}

#[tokio::test]
async fn given_a_url_outside_the_allowed_forms_when_tried_then_refused_without_running_git() {
    // R-PROV-1: only https/http/ssh/git@/file URLs or absolute paths; no command injection
    let tmp = TempDir::new("atasira-prov-git");
    let pwned = tmp.0.join("pwned");
    // A git that cannot be run: had any of these reached it, the reason would say so.
    let setups = Setups::new(tmp.0.join("data")).with_git(tmp.0.join("no-such-git"));
    let hostile = [
        format!("ext::sh -c touch% {}", pwned.display()),
        "--upload-pack=touch /tmp/x".to_owned(),
        "relative/path.git".to_owned(),
        "fd::17".to_owned(),
        "https://example.com/repo.git\n--upload-pack=x".to_owned(),
    ];
    for url in hostile {
        let err = setups.perform(&sales(), &git_remote(&url)).await.expect_err("refused");
        assert!(matches!(err, SetupError::Permanent(_)), "{url:?}: {err:?}");
        assert!(!err.reason().contains("cannot run git"), "{url:?} reached git: {err:?}");
    }
    assert!(!pwned.exists());
    let reaches_git = setups.perform(&sales(), &git_remote("https://example.invalid/repo.git")).await.expect_err("no git");
    assert!(reaches_git.reason().contains("cannot run git"), "an allowed URL does reach git: {reaches_git:?}");
}

#[tokio::test]
async fn given_a_non_git_directory_in_the_workspace_when_provisioned_then_left_alone() {
    // R-PROV-1: best-effort, never destroys what is there
    let tmp = TempDir::new("atasira-prov-git");
    let bare = bare_repo_with_a_commit(&tmp.0);
    let data = tmp.0.join("data");
    std::fs::create_dir_all(data.join("workspaces/sales")).expect("dir");
    std::fs::write(data.join("workspaces/sales/notes.txt"), "mine").expect("write");
    let err = Setups::new(data.clone()).perform(&sales(), &git_remote(bare.to_str().expect("utf-8"))).await.expect_err("occupied");
    assert!(matches!(err, SetupError::Permanent(ref r) if r.contains("is not a git clone")), "{err:?}");
    assert_eq!(std::fs::read_to_string(data.join("workspaces/sales/notes.txt")).expect("kept"), "mine");
}

fn ssh(host: &str, user: &str, port: u16) -> RequiredAccess {
    RequiredAccess::SshTarget { host: host.to_owned(), user: user.to_owned(), port }
}

#[tokio::test]
async fn given_an_ssh_target_when_provisioned_twice_then_one_block_replaced_in_place_without_keys() {
    // R-PROV-1: ssh Host entry under the data dir, idempotent, no key material
    let tmp = TempDir::new("atasira-prov-ssh");
    let setups = Setups::new(tmp.0.clone());
    let detail = setups.perform(&sales(), &ssh("git.example.com", "deploy", 22)).await.expect("written");
    assert_eq!(detail, "Host sales-git.example.com in ssh/config");
    setups.perform(&BoxType::parse("support").expect("bt"), &ssh("db.example.com", "ops", 22)).await.expect("written");
    setups.perform(&sales(), &ssh("git.example.com", "deploy2", 2222)).await.expect("rewritten");

    let config = std::fs::read_to_string(tmp.0.join("ssh/config")).expect("config");
    assert_eq!(
        config,
        "# BEGIN atasira sales git.example.com\nHost sales-git.example.com\n    HostName git.example.com\n    User deploy2\n    Port 2222\n    IdentitiesOnly yes\n# END atasira sales git.example.com\n\
         # BEGIN atasira support db.example.com\nHost support-db.example.com\n    HostName db.example.com\n    User ops\n    Port 22\n    IdentitiesOnly yes\n# END atasira support db.example.com\n"
    );
    assert_eq!(config.matches("Host sales-").count(), 1);
    for key_material in ["IdentityFile", "PRIVATE KEY", "ssh-ed25519", "ssh-rsa"] {
        assert!(!config.contains(key_material), "{key_material}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(tmp.0.join("ssh")).expect("dir").filter(|e| e.as_ref().is_ok_and(|e| e.file_name() != "config")).collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[tokio::test]
async fn given_ssh_values_that_would_inject_config_when_provisioned_then_refused_and_nothing_written() {
    // R-PROV-1: no config injection through host or user
    let tmp = TempDir::new("atasira-prov-ssh");
    let setups = Setups::new(tmp.0.clone());
    for (host, user) in [
        ("evil.example.com\n    ProxyCommand sh -c x", "u"),
        ("h.example.com", "u ProxyCommand=x"),
        ("h.example.com", "u\tx"),
        ("*", "u"),
        ("-oProxyCommand=x", "u"),
        ("h.example.com", "%d"),
        ("", "u"),
    ] {
        let err = setups.perform(&sales(), &ssh(host, user, 22)).await.expect_err("refused");
        assert!(matches!(err, SetupError::Permanent(_)), "{host:?} {user:?}: {err:?}");
    }
    assert!(matches!(setups.perform(&sales(), &ssh("h.example.com", "u", 0)).await, Err(SetupError::Permanent(_))));
    assert!(!tmp.0.join("ssh/config").exists());
}

fn netrc(machine: &str, login: &str, vault: &str, item: &str) -> RequiredAccess {
    RequiredAccess::NetrcEntry { machine: machine.to_owned(), login: login.to_owned(), vault: vault.to_owned(), item: item.to_owned() }
}

#[tokio::test]
async fn given_a_netrc_entry_when_provisioned_twice_then_private_replaced_and_never_a_password() {
    // R-PROV-1: netrc under the data dir, mode 0600, only vault/item names
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("atasira-prov-netrc");
    let setups = Setups::new(tmp.0.clone());
    setups.perform(&sales(), &netrc("api.example.com", "bot", "Ops Vault", "api-token")).await.expect("written");
    let detail = setups.perform(&sales(), &netrc("api.example.com", "bot2", "ops", "api-token-2")).await.expect("rewritten");
    assert_eq!(detail, "machine api.example.com login bot2 in netrc (password from vault ops, item api-token-2)");

    let path = tmp.0.join("netrc");
    let text = std::fs::read_to_string(&path).expect("netrc");
    assert_eq!(
        text,
        "# BEGIN atasira sales api.example.com\n# atasira sales: password from vault ops, item api-token-2 (never stored here)\nmachine api.example.com login bot2\n# END atasira sales api.example.com\n"
    );
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.split_whitespace().any(|t| t == "password" || t == "passwd"), "{line}");
    }
    assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
}

#[tokio::test]
async fn given_netrc_values_that_would_inject_a_password_when_provisioned_then_refused() {
    // R-PROV-1: secrets are never stored; no token injection through any field
    let tmp = TempDir::new("atasira-prov-netrc");
    let setups = Setups::new(tmp.0.clone());
    for access in [
        netrc("m.example.com", "bot password hunter2", "ops", "i"),
        netrc("m.example.com password hunter2", "bot", "ops", "i"),
        netrc("m.example.com", "bot", "ops", "i\nmachine m.example.com login bot password hunter2"),
        netrc("m.example.com", "bot", "ops\r\npassword x", "i"),
        netrc("m.example.com", "\"bot\"", "ops", "i"),
    ] {
        let err = setups.perform(&sales(), &access).await.expect_err("refused");
        assert!(matches!(err, SetupError::Permanent(_)), "{access:?}: {err:?}");
    }
    assert!(!tmp.0.join("netrc").exists());
}

#[test]
fn given_a_file_with_other_content_and_a_stale_block_when_replaced_then_only_the_block_changes() {
    // R-PROV-1: re-runs replace by marker, never duplicate
    let block = Block { begin: "# BEGIN atasira sales h".into(), end: "# END atasira sales h".into(), body: vec!["new".into()], mode: 0o600 };
    let existing = "keep 1\n# BEGIN atasira sales h\nold\n# END atasira sales h\nkeep 2\n";
    assert_eq!(replace_block(existing, &block), "keep 1\n# BEGIN atasira sales h\nnew\n# END atasira sales h\nkeep 2\n");
    assert_eq!(replace_block("", &block), "# BEGIN atasira sales h\nnew\n# END atasira sales h\n");
    assert_eq!(replace_block("keep\n# BEGIN atasira sales h\nhalf", &block), "keep\n# BEGIN atasira sales h\nnew\n# END atasira sales h\n");
}

#[test]
fn given_git_stderr_when_quoted_then_first_two_lines_trimmed() {
    // R-PROV-1: the reason includes git's stderr, short
    assert_eq!(first_lines(b"\n  fatal: one  \n\nfatal: two\nfatal: three\n"), "fatal: one / fatal: two");
    assert_eq!(first_lines(&[b'x'; 1000]).len(), MAX_REASON_CHARS);
}

#[tokio::test]
async fn given_a_url_with_a_password_when_provisioned_then_refused_and_the_password_never_recorded() {
    // R-PROV-1: secrets are never stored (a clone would keep the URL in .git/config)
    let tmp = TempDir::new("atasira-prov-git");
    let setups = Setups::new(tmp.0.clone()).with_git(tmp.0.join("no-such-git"));
    let access = git_remote("https://bot:s3cret@git.example.com/team/repo.git");
    let err = setups.perform(&sales(), &access).await.expect_err("refused");
    assert!(matches!(err, SetupError::Permanent(_)), "{err:?}");
    assert!(!err.reason().contains("s3cret"), "{err:?}");
    assert_eq!(describe(&access), "git_remote https://bot:***@git.example.com/team/repo.git");
    for fine in ["ssh://git@git.example.com:2222/team/repo.git", "git@git.example.com:team/repo.git", "https://git.example.com/a:b@c"] {
        assert_eq!(password_span(fine), None, "{fine}");
        assert_eq!(describe(&git_remote(fine)), format!("git_remote {fine}"));
    }
}

/// An executable shell script at `path` that creates `marker` (then runs `then`).
fn script(path: &Path, marker: &Path, then: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\ntouch '{}'\n{then}\n", marker.display())).expect("script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[tokio::test]
async fn given_hooks_and_config_a_worker_planted_in_the_workspace_when_provisioned_again_then_none_of_it_runs() {
    // R-ARCH-13: a workspace is the Workers'; what they leave in its .git never runs as
    // the provisioner (before, a re-provision ran `git fetch` inside it).
    let tmp = TempDir::new("atasira-prov-plant");
    let bare = bare_repo_with_a_commit(&tmp.0);
    let url = bare.to_str().expect("utf-8 path");
    let data = tmp.0.join("data");
    let setups = Setups::new(data.clone());
    setups.perform(&sales(), &git_remote(url)).await.expect("cloned");
    // The remote moves on, so a fetch has refs to update.
    run_git(&["commit", "--quiet", "--allow-empty", "-m", "second"], &tmp.0.join("seed"));
    run_git(&["push", "--quiet", "origin", "HEAD:refs/heads/main"], &tmp.0.join("seed"));

    let (planted, markers) = (tmp.0.join("planted"), tmp.0.join("markers"));
    std::fs::create_dir_all(&planted).expect("dir");
    std::fs::create_dir_all(&markers).expect("dir");
    let dot_git = data.join("workspaces/sales/.git");
    for hook in ["reference-transaction", "post-checkout", "post-merge", "pre-auto-gc", "post-index-change", "fsmonitor-watchman"] {
        script(&dot_git.join("hooks").join(hook), &markers.join(hook), "exit 0");
    }
    script(&planted.join("fsmonitor"), &markers.join("fsmonitor"), "exit 0");
    script(&planted.join("ssh"), &markers.join("ssh"), "exit 1");
    script(&planted.join("upload-pack"), &markers.join("upload-pack"), "exec git-upload-pack \"$@\"");
    script(&planted.join("credential"), &markers.join("credential"), "exit 0");
    let mut config = std::fs::OpenOptions::new().append(true).open(dot_git.join("config")).expect("config");
    let p = |name: &str| planted.join(name).display().to_string();
    write!(
        config,
        "[core]\n\tfsmonitor = {}\n\tsshCommand = {}\n[remote \"origin\"]\n\tuploadpack = {}\n[credential]\n\thelper = {}\n",
        p("fsmonitor"),
        p("ssh"),
        p("upload-pack"),
        p("credential")
    )
    .expect("planted");
    drop(config);

    let again = setups.perform(&sales(), &git_remote(url)).await.expect("fetched");
    let ran: Vec<String> = std::fs::read_dir(&markers).expect("markers").map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(ran, Vec::<String>::new(), "planted code ran as the provisioner");
    assert_eq!(again, format!("fetched {url}; workspaces/sales is in use and left as it is"));
    // The provisioner's own repository has the remote's new commit.
    assert_eq!(git_output(&["--git-dir", "git/sales.git", "log", "-1", "--format=%s", "main"], &data), "second");

    // Not a vacuous plant: git run inside the workspace does run it.
    let _ = std::process::Command::new("git").args(["fetch", "--quiet", "origin"]).current_dir(data.join("workspaces/sales")).output().expect("git runs");
    assert!(markers.join("upload-pack").exists(), "the planted upload-pack would have run");
}

#[tokio::test]
async fn given_a_symlink_at_a_managed_file_or_workspace_when_provisioned_then_it_is_never_followed() {
    // R-ARCH-13: a link planted where the provisioner writes is refused, and what it
    // points at is neither read nor written.
    use std::os::unix::fs::symlink;
    let tmp = TempDir::new("atasira-prov-link");
    let outside = tmp.0.join("outside");
    std::fs::create_dir_all(&outside).expect("dir");
    let secret = outside.join("secret");
    std::fs::write(&secret, "outside secret\n").expect("write");
    let data = tmp.0.join("data");
    std::fs::create_dir_all(data.join("ssh")).expect("dir");
    symlink(&secret, data.join("ssh/config")).expect("link");
    symlink(&secret, data.join("netrc")).expect("link");
    let setups = Setups::new(data.clone());

    for access in [ssh("git.example.com", "deploy", 22), netrc("api.example.com", "bot", "ops", "token")] {
        let err = setups.perform(&sales(), &access).await.expect_err("a link is refused");
        assert!(matches!(err, SetupError::Permanent(ref r) if r.contains("symbolic link")), "{access:?}: {err:?}");
    }
    assert_eq!(std::fs::read_to_string(&secret).expect("kept"), "outside secret\n");
    for link in ["ssh/config", "netrc"] {
        assert!(std::fs::symlink_metadata(data.join(link)).expect("there").file_type().is_symlink(), "{link} left as it was");
    }

    // A workspace that is a link to elsewhere is not cloned into.
    let bare = bare_repo_with_a_commit(&tmp.0);
    let elsewhere = tmp.0.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("dir");
    std::fs::create_dir_all(data.join("workspaces")).expect("dir");
    symlink(&elsewhere, data.join("workspaces/sales")).expect("link");
    let err = setups.perform(&sales(), &git_remote(bare.to_str().expect("utf-8"))).await.expect_err("a link is refused");
    assert!(matches!(err, SetupError::Permanent(ref r) if r.contains("symbolic link")), "{err:?}");
    assert_eq!(std::fs::read_dir(&elsewhere).expect("dir").count(), 0);
}

#[tokio::test]
async fn given_a_symlink_at_the_old_temp_name_when_a_file_is_written_then_the_link_target_is_untouched() {
    // R-ARCH-13: temp names are unguessable, and a temp file must be new
    use std::os::unix::fs::symlink;
    let tmp = TempDir::new("atasira-prov-temp");
    let secret = tmp.0.join("secret");
    std::fs::write(&secret, "outside secret\n").expect("write");
    let data = tmp.0.join("data");
    std::fs::create_dir_all(data.join("ssh")).expect("dir");
    symlink(&secret, data.join("ssh/.config.atasira-tmp")).expect("link");
    Setups::new(data.clone()).perform(&sales(), &ssh("git.example.com", "deploy", 22)).await.expect("written");
    assert_eq!(std::fs::read_to_string(&secret).expect("kept"), "outside secret\n");
    assert!(std::fs::symlink_metadata(data.join("ssh/config")).expect("written").is_file());
    assert!(std::fs::read_to_string(data.join("ssh/config")).expect("config").starts_with("# BEGIN atasira sales git.example.com\n"));

    // Whatever the name: a link there, dangling or not, is never written through.
    let dangling = tmp.0.join("not-yet");
    for (link, target) in [(tmp.0.join("a"), &secret), (tmp.0.join("b"), &dangling)] {
        symlink(target, &link).expect("link");
        let err = write_new(&link, b"x", 0o600).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
    }
    assert_eq!(std::fs::read_to_string(&secret).expect("kept"), "outside secret\n");
    assert!(!dangling.exists());
}
