//! The exit codes of the client verbs, shared by the verbs and the requests they send: 0
//! when the API answered with success, 1 when it refused, 2 on a usage error, 3 when the
//! gateway could not be reached (or its answer could not be read).

pub(super) const OK: u8 = 0;
pub(super) const REFUSED: u8 = 1;
pub(super) const USAGE: u8 = 2;
pub(super) const UNREACHABLE: u8 = 3;

/// Says what is wrong with the command (on stderr); the exit code of a usage error.
pub(super) fn usage(message: &str) -> u8 {
    eprintln!("atasira: {message}");
    USAGE
}
