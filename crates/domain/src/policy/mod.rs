//! Policies: pure decisions over manifests after activation (R-EDIT-1..3).

pub mod config_edit;
pub mod mentor_edit;

pub use config_edit::{ConfigEditError, config_edit};
pub use mentor_edit::{MENTOR_EDITABLE_KEYS, MENTOR_PROHIBITED_KEYS, MentorEditError, mentor_edit};
