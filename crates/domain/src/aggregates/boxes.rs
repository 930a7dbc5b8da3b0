//! The Box aggregate (SPEC §5, §9): activated only with a verified approval token, then
//! assigned, edited, stopped, resumed and archived.
//!
//! Architecture Invariant: `Activate` is the only command that creates a Box and it takes a
//! [`VerifiedApproval`], a value only `Keyring::verify` can make (R-BOX-1, INV-1/INV-2).
//! Slot accounting for stop/resume/archive lives in the namespace aggregate; the registry
//! changes the namespace first and the Box second.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::aggregates::aggregate_via_decide;
use crate::change::{CapabilityDiff, capability_diff};
use crate::error::{ErrorCode, FieldError};
use crate::manifest::BoxManifest;
use crate::policy::{ConfigEditError, MentorEditError, config_edit, mentor_edit};
use crate::principal::Principal;
use crate::token::{TokenError, VerifiedApproval};

/// The Box id of a draft's activation: derived, so a replayed activation finds the same
/// Box (R-APPROVE-7 (3)).
pub fn box_id_for(draft_id: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6174_6173_6972_612d_626f_782d_6964_7331);
    uuid::Uuid::new_v5(&NAMESPACE, draft_id.as_bytes()).to_string()
}

/// R-BOX-4, R-BOX-7: `idle` is the active state a Box starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoxState {
    Idle,
    Stopped,
    Archived,
}

/// R-BOX-6: a user's role in one Box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoxRole {
    Primary,
    Member,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoxData {
    pub box_id: String,
    pub draft_id: String,
    pub manifest: BoxManifest,
    /// The manifest the approval token bound: the bound of every config edit (R-EDIT-3).
    pub approved_manifest: BoxManifest,
    pub state: BoxState,
    pub approved_by: String,
    pub activated_at: DateTime<Utc>,
    /// `(user_id, role)` in assignment order; one entry per user.
    pub assignments: Vec<(String, BoxRole)>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoxAggregate {
    pub data: Option<BoxData>,
}

#[derive(Debug, Clone)]
pub enum BoxCommand {
    /// R-BOX-1, R-APPROVE-4: driven by `DraftApproved`; `manifest` is the draft's.
    Activate { box_id: String, draft_id: String, manifest: BoxManifest, approval: VerifiedApproval, at: DateTime<Utc> },
    /// R-BOX-6.
    AssignUser { by: Principal, user_id: String, role_in_box: BoxRole, at: DateTime<Utc> },
    /// R-EDIT-1, R-EDIT-2.
    MentorEdit { by: Principal, patch: Map<String, Value>, at: DateTime<Utc> },
    /// R-EDIT-3.
    /// `policy`: the organisation's policy's verdict, recorded with the edit (R-POLICY-1).
    ConfigEdit { by: Principal, patch: Value, at: DateTime<Utc>, policy: Option<crate::org_policy::Verdict> },
    /// R-BOX-7 (after the namespace freed the slot).
    Stop { by: Principal, at: DateTime<Utc> },
    /// R-BOX-7 (after the namespace granted a slot).
    Resume { by: Principal, at: DateTime<Utc> },
    /// R-BOX-7: terminal.
    Archive { by: Principal, at: DateTime<Utc> },
    /// R-BOX-6: removes an assignment (who may: as for assigning).
    UnassignUser { by: Principal, user_id: String, at: DateTime<Utc> },
    /// R-CHANGE-1: driven by the `DraftApproved` of a change request: the approved manifest
    /// replaces the Box's, if the Box still has the manifest the change was planned on.
    ApplyChange { draft_id: String, manifest: BoxManifest, base_digest: String, approval: VerifiedApproval, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BoxEvent {
    BoxActivated {
        box_id: String,
        box_type: String,
        draft_id: String,
        manifest: BoxManifest,
        manifest_digest: String,
        approved_by: String,
        approval_key_id: String,
        activated_at: DateTime<Utc>,
    },
    BoxUserAssigned {
        box_id: String,
        user_id: String,
        role_in_box: BoxRole,
        assigned_by: String,
        at: DateTime<Utc>,
    },
    BoxManifestEdited {
        box_id: String,
        manifest: BoxManifest,
        changed_keys: Vec<String>,
        edited_by: String,
        at: DateTime<Utc>,
    },
    BoxConfigEdited {
        box_id: String,
        manifest: BoxManifest,
        changed_keys: Vec<String>,
        edited_by: String,
        at: DateTime<Utc>,
        /// R-POLICY-1: the organisation's policy's verdict on the edit; absent when no
        /// policy was loaded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<crate::org_policy::Verdict>,
    },
    BoxStopped {
        box_id: String,
        box_type: String,
        by: String,
        at: DateTime<Utc>,
    },
    BoxResumed {
        box_id: String,
        box_type: String,
        by: String,
        at: DateTime<Utc>,
    },
    BoxArchived {
        box_id: String,
        box_type: String,
        by: String,
        at: DateTime<Utc>,
    },
    BoxUserUnassigned {
        box_id: String,
        user_id: String,
        /// The role the user had.
        role_in_box: BoxRole,
        unassigned_by: String,
        at: DateTime<Utc>,
    },
    /// R-CHANGE-1: an approved change request: the new approved manifest (major version
    /// bumped) with what it changed; new Workers get its bundle.
    BoxManifestChanged {
        box_id: String,
        box_type: String,
        /// The change request's draft, whose approval token binds `manifest_digest`.
        draft_id: String,
        manifest: BoxManifest,
        manifest_digest: String,
        diff: CapabilityDiff,
        approved_by: String,
        approval_key_id: String,
        at: DateTime<Utc>,
    },
}

impl BoxEvent {
    pub fn name(&self) -> &'static str {
        match self {
            BoxEvent::BoxActivated { .. } => "BoxActivated",
            BoxEvent::BoxUserAssigned { .. } => "BoxUserAssigned",
            BoxEvent::BoxManifestEdited { .. } => "BoxManifestEdited",
            BoxEvent::BoxConfigEdited { .. } => "BoxConfigEdited",
            BoxEvent::BoxStopped { .. } => "BoxStopped",
            BoxEvent::BoxResumed { .. } => "BoxResumed",
            BoxEvent::BoxArchived { .. } => "BoxArchived",
            BoxEvent::BoxUserUnassigned { .. } => "BoxUserUnassigned",
            BoxEvent::BoxManifestChanged { .. } => "BoxManifestChanged",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoxError {
    /// 409 and a security violation: the token does not bind this activation.
    #[error("approval token refused: {0}")]
    InvalidApprovalToken(TokenError),
    /// 422: the approved manifest no longer validates (R-APPROVE-4 re-validation).
    #[error("the approved manifest is invalid: {}", crate::error::joined(&.0))]
    ManifestInvalid(Vec<FieldError>),
    /// 409: this Box id already belongs to another draft's activation.
    #[error("box id is taken by another activation")]
    BoxIdTaken,
    /// 404.
    #[error("no such Box")]
    NotFound,
    /// 403 (R-AUTH-2).
    #[error("this action needs {0}")]
    Forbidden(&'static str),
    /// 409: archived Boxes accept nothing.
    #[error("the Box is archived")]
    Archived,
    /// 422: an assignment without a user (empty, text with a NUL character, or longer
    /// than its bound).
    #[error("user_id must be non-empty text of at most {} characters without NUL characters", crate::bounds::USER_ID_CHARS)]
    InvalidUserId,
    #[error(transparent)]
    MentorEdit(MentorEditError),
    #[error(transparent)]
    ConfigEdit(ConfigEditError),
    /// 404: the user has no assignment on this Box.
    #[error("the user is not assigned to this Box")]
    NotAssigned,
    /// 409: the Box's manifest is no longer the one the change was planned on.
    #[error("the Box's manifest changed since this change request was made; request the change again")]
    ChangeOutdated,
}

impl BoxError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BoxError::InvalidApprovalToken(_) => ErrorCode::InvalidApprovalToken,
            BoxError::ManifestInvalid(_) => ErrorCode::BoxManifestValidation,
            BoxError::BoxIdTaken => ErrorCode::BoxTypeExists,
            BoxError::NotFound => ErrorCode::BoxNotFound,
            BoxError::Forbidden(_) => ErrorCode::Forbidden,
            BoxError::Archived => ErrorCode::BoxNotActive,
            BoxError::InvalidUserId => ErrorCode::InvalidRequest,
            BoxError::MentorEdit(e) => e.code(),
            BoxError::ConfigEdit(e) => e.code(),
            BoxError::NotAssigned => ErrorCode::AssignmentNotFound,
            BoxError::ChangeOutdated => ErrorCode::ChangeBaseOutdated,
        }
    }
}

const HUMAN_ADMIN: &str = "role admin and kind human";

/// Why a Worker may not be launched on a Box (R-WORKER-1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchRefused {
    /// 409 `box_not_active`: no such Box (or not yet active).
    #[error("no active Box {0:?}")]
    NoActiveBox(String),
    /// 403 `forbidden`.
    #[error("only human admins and the Box's assigned users launch its Workers")]
    Forbidden,
    /// 409 `box_not_active`.
    #[error("the Box is stopped: an admin must resume it first")]
    Stopped,
    /// 409 `box_not_active`.
    #[error("the Box is archived")]
    Archived,
}

/// [`BoxAggregate::launchable`] on a Box's data (`None`: no such Box).
pub fn launchable<'a>(data: Option<&'a BoxData>, principal: &Principal, box_id: &str) -> Result<&'a BoxData, LaunchRefused> {
    let data = data.ok_or_else(|| LaunchRefused::NoActiveBox(box_id.to_owned()))?;
    if !crate::worker::may_launch(principal, box_id, &data.assignments) {
        return Err(LaunchRefused::Forbidden);
    }
    match data.state {
        BoxState::Idle => Ok(data),
        BoxState::Stopped => Err(LaunchRefused::Stopped),
        BoxState::Archived => Err(LaunchRefused::Archived),
    }
}

impl crate::Refusing for LaunchRefused {
    fn error_code(&self) -> ErrorCode {
        match self {
            LaunchRefused::Forbidden => ErrorCode::Forbidden,
            LaunchRefused::NoActiveBox(_) | LaunchRefused::Stopped | LaunchRefused::Archived => ErrorCode::BoxNotActive,
        }
    }
}

impl BoxAggregate {
    /// Whether `principal` may launch a Worker of this Box now (R-WORKER-1): the Box is
    /// active (idle), and the principal a human admin or assigned to it; the Box's data
    /// when so. Pure: the registry and the provisioner ask it before any effect.
    pub fn launchable(&self, principal: &Principal, box_id: &str) -> Result<&BoxData, LaunchRefused> {
        launchable(self.data.as_ref(), principal, box_id)
    }

    pub fn decide(&self, command: BoxCommand) -> Result<Vec<BoxEvent>, BoxError> {
        match command {
            BoxCommand::Activate { box_id, draft_id, manifest, approval, at } => {
                if let Some(existing) = &self.data {
                    return if existing.draft_id == draft_id { Ok(vec![]) } else { Err(BoxError::BoxIdTaken) };
                }
                let digest = manifest.digest();
                approval.check_binding(&draft_id, manifest.box_type.as_str(), &digest).map_err(BoxError::InvalidApprovalToken)?;
                let errors = manifest.validate();
                if !errors.is_empty() {
                    return Err(BoxError::ManifestInvalid(errors));
                }
                let claims = approval.claims();
                Ok(vec![BoxEvent::BoxActivated {
                    box_id,
                    box_type: manifest.box_type.to_string(),
                    draft_id,
                    manifest,
                    manifest_digest: digest,
                    approved_by: claims.approver.clone(),
                    approval_key_id: claims.key_id.clone(),
                    activated_at: at,
                }])
            }
            BoxCommand::AssignUser { by, user_id, role_in_box, at } => {
                let d = self.live()?;
                if user_id.trim().is_empty() || user_id.contains('\0') || user_id.chars().count() > crate::bounds::USER_ID_CHARS {
                    return Err(BoxError::InvalidUserId);
                }
                let is_primary = d.assignments.iter().any(|(u, r)| *u == by.user_id && *r == BoxRole::Primary);
                if !(by.is_human_admin() || is_primary) {
                    return Err(BoxError::Forbidden("a human admin or the Box's primary"));
                }
                if d.assignments.iter().any(|(u, r)| *u == user_id && *r == role_in_box) {
                    return Ok(vec![]);
                }
                Ok(vec![BoxEvent::BoxUserAssigned { box_id: d.box_id.clone(), user_id, role_in_box, assigned_by: by.user_id, at }])
            }
            BoxCommand::MentorEdit { by, patch, at } => {
                if !by.is_human_admin() {
                    return Err(BoxError::Forbidden(HUMAN_ADMIN));
                }
                let d = self.live()?;
                let manifest = mentor_edit(&d.manifest, &patch).map_err(BoxError::MentorEdit)?;
                if manifest == d.manifest {
                    return Ok(vec![]);
                }
                let changed_keys = patch.keys().cloned().collect();
                Ok(vec![BoxEvent::BoxManifestEdited { box_id: d.box_id.clone(), manifest, changed_keys, edited_by: by.user_id, at }])
            }
            BoxCommand::ConfigEdit { by, patch, at, policy } => {
                // Who may comes first (403 before 404): nobody is the primary of no Box. A
                // primary, agent or human, edits within the same limits as an admin.
                let is_primary = self.data.as_ref().is_some_and(|d| d.assignments.iter().any(|(u, r)| *u == by.user_id && *r == BoxRole::Primary));
                if !(by.is_human_admin() || is_primary) {
                    return Err(BoxError::Forbidden("a human admin or the Box's primary"));
                }
                let d = self.live()?;
                let manifest = config_edit(&d.approved_manifest, &d.manifest, &patch).map_err(BoxError::ConfigEdit)?;
                if manifest == d.manifest {
                    return Ok(vec![]);
                }
                let changed_keys = patch.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
                Ok(vec![BoxEvent::BoxConfigEdited { box_id: d.box_id.clone(), manifest, changed_keys, edited_by: by.user_id, at, policy }])
            }
            BoxCommand::ApplyChange { draft_id, manifest, base_digest, approval, at } => {
                let d = self.live()?;
                if d.draft_id == draft_id {
                    // Applied already (a replayed approval).
                    return Ok(vec![]);
                }
                let digest = manifest.digest();
                approval.check_binding(&draft_id, manifest.box_type.as_str(), &digest).map_err(BoxError::InvalidApprovalToken)?;
                if manifest.box_type != d.manifest.box_type || d.manifest.digest() != base_digest {
                    return Err(BoxError::ChangeOutdated);
                }
                let errors = manifest.validate();
                if !errors.is_empty() {
                    return Err(BoxError::ManifestInvalid(errors));
                }
                let claims = approval.claims();
                Ok(vec![BoxEvent::BoxManifestChanged {
                    box_id: d.box_id.clone(),
                    box_type: manifest.box_type.to_string(),
                    draft_id,
                    diff: capability_diff(&d.manifest, &manifest),
                    manifest,
                    manifest_digest: digest,
                    approved_by: claims.approver.clone(),
                    approval_key_id: claims.key_id.clone(),
                    at,
                }])
            }
            BoxCommand::UnassignUser { by, user_id, at } => {
                let d = self.live()?;
                let is_primary = d.assignments.iter().any(|(u, r)| *u == by.user_id && *r == BoxRole::Primary);
                if !(by.is_human_admin() || is_primary) {
                    return Err(BoxError::Forbidden("a human admin or the Box's primary"));
                }
                let (_, role_in_box) = d.assignments.iter().find(|(u, _)| *u == user_id).ok_or(BoxError::NotAssigned)?;
                Ok(vec![BoxEvent::BoxUserUnassigned { box_id: d.box_id.clone(), user_id, role_in_box: *role_in_box, unassigned_by: by.user_id, at }])
            }
            BoxCommand::Stop { by, at } => self.transition(by, at, BoxState::Idle, BoxState::Stopped),
            BoxCommand::Resume { by, at } => self.transition(by, at, BoxState::Stopped, BoxState::Idle),
            BoxCommand::Archive { by, at } => {
                if !by.is_human_admin() {
                    return Err(BoxError::Forbidden(HUMAN_ADMIN));
                }
                let d = self.data.as_ref().ok_or(BoxError::NotFound)?;
                if d.state == BoxState::Archived {
                    return Ok(vec![]);
                }
                Ok(vec![BoxEvent::BoxArchived { box_id: d.box_id.clone(), box_type: d.manifest.box_type.to_string(), by: by.user_id, at }])
            }
        }
    }

    /// The Box, if it exists and is not archived.
    fn live(&self) -> Result<&BoxData, BoxError> {
        let d = self.data.as_ref().ok_or(BoxError::NotFound)?;
        if d.state == BoxState::Archived {
            return Err(BoxError::Archived);
        }
        Ok(d)
    }

    /// Stop and resume: human admins; repeating a finished transition is a no-op.
    fn transition(&self, by: Principal, at: DateTime<Utc>, from: BoxState, to: BoxState) -> Result<Vec<BoxEvent>, BoxError> {
        if !by.is_human_admin() {
            return Err(BoxError::Forbidden(HUMAN_ADMIN));
        }
        let d = self.live()?;
        if d.state == to {
            return Ok(vec![]);
        }
        debug_assert_eq!(d.state, from);
        let (box_id, box_type) = (d.box_id.clone(), d.manifest.box_type.to_string());
        Ok(vec![match to {
            BoxState::Stopped => BoxEvent::BoxStopped { box_id, box_type, by: by.user_id, at },
            _ => BoxEvent::BoxResumed { box_id, box_type, by: by.user_id, at },
        }])
    }

    pub fn evolve(&mut self, event: BoxEvent) {
        match event {
            BoxEvent::BoxActivated { box_id, draft_id, manifest, approved_by, activated_at, .. } => {
                self.data = Some(BoxData {
                    box_id,
                    draft_id,
                    approved_manifest: manifest.clone(),
                    manifest,
                    state: BoxState::Idle,
                    approved_by,
                    activated_at,
                    assignments: Vec::new(),
                });
            }
            BoxEvent::BoxUserAssigned { user_id, role_in_box, .. } => {
                if let Some(d) = self.data.as_mut() {
                    d.assignments.retain(|(u, _)| *u != user_id);
                    d.assignments.push((user_id, role_in_box));
                }
            }
            BoxEvent::BoxManifestEdited { manifest, .. } | BoxEvent::BoxConfigEdited { manifest, .. } => {
                if let Some(d) = self.data.as_mut() {
                    d.manifest = manifest;
                }
            }
            BoxEvent::BoxManifestChanged { draft_id, manifest, approved_by, .. } => {
                if let Some(d) = self.data.as_mut() {
                    d.draft_id = draft_id;
                    d.approved_manifest = manifest.clone();
                    d.manifest = manifest;
                    d.approved_by = approved_by;
                }
            }
            BoxEvent::BoxStopped { .. } => self.set_state(BoxState::Stopped),
            BoxEvent::BoxResumed { .. } => self.set_state(BoxState::Idle),
            BoxEvent::BoxArchived { .. } => self.set_state(BoxState::Archived),
            BoxEvent::BoxUserUnassigned { user_id, .. } => {
                if let Some(d) = self.data.as_mut() {
                    d.assignments.retain(|(u, _)| *u != user_id);
                }
            }
        }
    }

    fn set_state(&mut self, state: BoxState) {
        if let Some(d) = self.data.as_mut() {
            d.state = state;
        }
    }
}

aggregate_via_decide!(BoxAggregate, super::types::BOX, BoxCommand, BoxEvent, BoxError);

#[cfg(test)]
mod tests;
