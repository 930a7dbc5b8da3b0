//! Shared helpers for workspace-wide tests: tidy, a harness that runs the real
//! `atasira` binary in embedded mode (`atasira dev`) or as a cluster (`atasira serve
//! drafts` + `atasira serve gateway` as separate OS processes on a real nats-server with
//! JetStream and a real PostgreSQL database), and fixtures many test files share.
//!
//! The cluster needs what `scripts/test` provides: `ATASIRA_TEST_NATS_SERVER` (path of a
//! nats-server 2.10+) and `ATASIRA_TEST_DATABASE_URL` (a PostgreSQL URL whose user may
//! create databases). Each environment gets its own nats-server on a free port, its own
//! database and its own temp dir, all removed on drop.

pub mod fixtures;
pub mod harness;

use std::path::{Path, PathBuf};

/// The workspace root: the directory holding the virtual `Cargo.toml`.
///
/// Tests run with the package directory (`tests/`) as their working directory, so
/// every workspace-relative path has to be anchored here rather than on `.`.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
