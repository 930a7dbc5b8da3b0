//! Files that hold secrets: read only when no other user may read them, written whole
//! (through a rename) and never readable by others on the way.

use std::path::Path;

use anyhow::Context as _;

/// The text of `path`, a `what` holding `holds`; refused when group or others may read it
/// (the error names the file and what to run, never its content).
pub fn read_private(path: &Path, what: &str, holds: &str) -> anyhow::Result<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).with_context(|| format!("cannot read the {what} {}", path.display()))?.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "the {what} {} may be read by other users (mode {:o}); it holds {holds}: run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
    }
    #[cfg(not(unix))]
    let _ = holds;
    std::fs::read_to_string(path).with_context(|| format!("cannot read the {what} {}", path.display()))
}

/// Writes `text` to `path` with `mode`, replacing an existing file only through a rename
/// (so nobody ever reads half a file) and never through a file another user may read.
pub fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}
