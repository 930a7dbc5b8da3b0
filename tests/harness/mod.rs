//! The system under test, started as a user would: the real binary, real servers.
//!
//! One file per job; everything is used as `harness::<name>`:
//! - `binary`: the `atasira` binary (fresh, or refused), commands with a time limit, held failpoints;
//! - `proc`: what a test process has of its own: the environment `scripts/test` gives it,
//!   temporary directories, free ports, the child processes it starts;
//! - `http`: one HTTP request and its answer;
//! - `nats`: nats-server (one or a cluster) and how the tests' clients connect to it;
//! - `postgres`: a test's own database, or a PostgreSQL server of its own;
//! - `system`: the product running, in either mode.
//!
//! They depend on each other in one direction only: `system` on all the others, `nats` on
//! `binary`, `proc` and `http`, `postgres` on `binary` and `proc`, `binary` on `proc`
//! (`system` and `postgres` also on `crate::fixtures`, which uses no harness). None uses
//! this file, which only re-exports: so `Mode` and `in_both_modes` live in `system`.

mod binary;
mod http;
mod nats;
mod postgres;
mod proc;
pub mod receiver;
mod system;

pub use self::binary::{Hold, OutputWithin, SUBPROCESS_LIMIT, atasira_bin};
pub use self::http::{Answer, http};
pub use self::nats::{Nats, creds_block_seed, creds_seed, nats_tls, pat_options, reporting_server_errors};
pub use self::postgres::{Database, PrivatePostgres};
pub use self::proc::{Proc, TempDir, free_port, free_ports, listening_url};
pub use self::system::{CLUSTER_SERVICES, HOSTS, Mode, System, example_runner, in_both_modes};
