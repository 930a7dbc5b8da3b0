//! Shared helpers for workspace-wide tests (tidy today, real NATS and PostgreSQL later).

use std::path::{Path, PathBuf};

/// The workspace root: the directory holding the virtual `Cargo.toml`.
///
/// Tests run with the package directory (`tests/`) as their working directory, so
/// every workspace-relative path has to be anchored here rather than on `.`.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
