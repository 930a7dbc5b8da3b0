//! Shared helpers for workspace-wide tests.
