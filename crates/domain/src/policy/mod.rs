//! Policies: pure decisions over manifests after activation (R-EDIT-1..3).

pub mod config_edit;
pub mod mentor_edit;

pub use config_edit::{config_edit, ConfigEditError};
pub use mentor_edit::{mentor_edit, MentorEditError, MENTOR_EDITABLE_KEYS, MENTOR_PROHIBITED_KEYS};
