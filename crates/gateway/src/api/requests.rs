//! Request bodies.

use super::*;

/// `POST /api/v1/boxes/box-drafts`: what an agent or a person asks for. The drafts service
/// turns it into a manifest, always pending approval. Unknown fields are refused (422
/// `invalid_request`); `null` means "not given". The domain's parser checks the body's
/// shape (so every entry point reports the same errors); this type documents it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BoxDraftCreateRequest {
    /// The Box's unique id: lowercase letters, digits, `_` and `-`, at most 64 characters,
    /// not a reserved word (a NATS subject token). `admin-pm` and `admin-ops` are refused
    /// with 403 `self_privilege_forbidden`.
    #[schema(schema_with = box_type_schema)]
    pub box_type: String,
    /// The standing role of the Box; must not be blank (the pattern: a character that is
    /// neither NUL nor Unicode white space).
    #[schema(pattern = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
    pub purpose: String,
    pub name: Option<String>,
    /// Appended to `purpose` under "## Success criteria", one line per item.
    pub success_criteria: Option<Vec<String>>,
    /// OS operations the Box may perform.
    #[schema(schema_with = os_operations_schema_nullable)]
    pub os_operations: Option<Vec<String>>,
    /// Tools the Box may call. An OS operation named here (`shell:exec`) grants that
    /// operation exactly as if it were in `os_operations`, and counts for `over_limit`.
    pub tools: Option<Vec<String>>,
    pub allowed_apps: Option<Vec<String>>,
    pub url_allowlist: Option<Vec<String>>,
    pub file_access: Option<Vec<String>>,
    pub prohibited_actions: Option<Vec<String>>,
    /// `true`: the manifest's network is `filtered`; `false` or absent: `none`.
    pub allow_network: Option<bool>,
    /// External resources the provisioner sets up after activation (never secrets: only
    /// vault and item names).
    pub required_access: Option<Vec<RequiredAccess>>,
}

/// `POST .../approve`. An empty body is `{}`. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    /// Must be `true` to approve an over_limit draft (the second confirmation).
    #[serde(default)]
    pub confirm_over_limit: bool,
}

/// `POST .../reject`. An empty body is `{}`. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// Shown to the requester with the decision.
    #[serde(default)]
    pub reason: String,
}

/// The body of actions that take no input (withdraw, stop, resume, archive): empty or `{}`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

/// A user's role in one Box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoleInBox {
    Primary,
    Member,
}

/// `POST /api/v1/boxes/{box_id}/user-assignments`. Unknown fields are refused.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignRequest {
    /// Must not be blank.
    #[schema(pattern = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
    pub user_id: String,
    pub role_in_box: RoleInBox,
}

/// `POST /api/v1/auth/nats-assertion`: the one NATS request the assertion is for. Unknown
/// fields are refused; a missing or malformed field is 422 `invalid_request` with one
/// entry per field in `details`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssertionRequest {
    /// The subject the request is sent on: `atasira.box.<sender>.<service>`, the sender
    /// being `gateway` or a service, e.g. `atasira.box.gateway.drafts`.
    #[serde(default)]
    #[schema(
        required = true,
        pattern = r"^atasira\.box\.(gateway|drafts|approval|provisioner|runtime-registry|audit)\.(drafts|approval|provisioner|runtime-registry|audit)$"
    )]
    pub subject: String,
    /// The envelope's `message_type`, e.g. `atasira.v1.ListPendingDrafts`.
    #[serde(default)]
    #[schema(required = true, pattern = r"^atasira\.v1\.[A-Z][A-Za-z0-9]{0,99}$")]
    pub message_type: String,
    /// The SHA-256 of the envelope's `payload` bytes: 64 lowercase hex digits.
    #[serde(default)]
    #[schema(required = true, pattern = "^[0-9a-f]{64}$")]
    pub payload_sha256: String,
    /// The correlation id the request carries; one is generated when absent or empty.
    #[serde(default)]
    pub correlation_id: Option<String>,
    /// The idempotency key the envelope carries (absent or empty: none), at most 255
    /// visible ASCII characters. The drafts service derives a submitted draft's id from it.
    #[serde(default)]
    #[schema(pattern = "^[!-~]{0,255}$")]
    pub idempotency_key: Option<String>,
}

impl AssertionRequest {
    /// The request the assertion is for (the correlation id as given, possibly empty), or
    /// every field that is missing or malformed.
    pub fn binding(&self) -> Result<Binding, Vec<FieldError>> {
        let mut errors = Vec::new();
        let to = self.subject.rsplit('.').next().unwrap_or_default();
        let known = atasira_contracts::subjects::SERVICES.contains(&to)
            && matches!(atasira_contracts::subjects::origin(&self.subject, to), Some(atasira_contracts::subjects::Origin::Service(_)));
        if !known {
            errors.push(FieldError::new(
                "subject",
                "must be atasira.box.<sender>.<service>, the sender being gateway or a service, e.g. atasira.box.gateway.drafts",
            ));
        }
        let name = self.message_type.strip_prefix("atasira.v1.").unwrap_or_default();
        let well_formed = name.len() <= 100 && name.bytes().next().is_some_and(|b| b.is_ascii_uppercase()) && name.bytes().all(|b| b.is_ascii_alphanumeric());
        if !well_formed {
            errors.push(FieldError::new("message_type", "must be a message name such as atasira.v1.ListPendingDrafts"));
        }
        let digest = PayloadDigest::from_hex(&self.payload_sha256);
        if digest.is_none() {
            errors.push(FieldError::new("payload_sha256", "must be the SHA-256 of the payload bytes as 64 lowercase hex digits"));
        }
        let idempotency_key = self.idempotency_key.clone().unwrap_or_default();
        if idempotency_key.len() > 255 || !idempotency_key.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
            errors.push(FieldError::new("idempotency_key", "must be at most 255 visible ASCII characters without spaces"));
        }
        match digest {
            Some(payload_sha256) if errors.is_empty() => Ok(Binding {
                subject: self.subject.clone(),
                message_type: self.message_type.clone(),
                payload_sha256,
                correlation_id: self.correlation_id.clone().unwrap_or_default(),
                idempotency_key,
            }),
            _ => Err(errors),
        }
    }
}
