//! Schemas the derive cannot express.

use super::*;

pub(crate) fn any_value(description: &str) -> Object {
    ObjectBuilder::new().schema_type(SchemaType::AnyValue).description(Some(description)).build()
}

pub(crate) fn details_schema() -> Object {
    any_value(
        "More about the error when there is more: the field errors of a `box_manifest_validation` (a list of `{key, message}`), the `parameter` of an `invalid_query`.",
    )
}

pub(crate) fn min_tier_schema() -> Object {
    any_value("A tier name or number, kept as given.")
}

pub(crate) fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::Type(Type::String))
}

/// One kind of `required_access` entry: `type` and exactly these keys.
pub(crate) fn access_kind(kind: &str, required: &[&str], optional: &[(&str, Object)]) -> Object {
    let mut object = ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property("type", string().enum_values(Some([kind])))
        .required("type")
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)));
    for key in required {
        // R-ARCH-6: as long as the domain's bound allows.
        let max_length = match atasira_domain::bounds::of(atasira_domain::bounds::DRAFT_REQUEST, &format!("required_access[].{key}")) {
            Some(atasira_domain::bounds::Bound::Text(chars)) => Some(chars),
            _ => None,
        };
        object = object.property(*key, string().max_length(max_length)).required(*key);
    }
    for (key, schema) in optional {
        object = object.property(*key, schema.clone());
    }
    object.build()
}

impl utoipa::PartialSchema for RequiredAccess {
    fn schema() -> RefOr<Schema> {
        let port =
            ObjectBuilder::new().schema_type(SchemaType::Type(Type::Integer)).minimum(Some(0)).maximum(Some(65535)).description(Some("Default 22.")).build();
        OneOfBuilder::new()
            .item(access_kind("git_remote", &["url"], &[]))
            .item(access_kind("ssh_target", &["host", "user"], &[("port", port)]))
            .item(access_kind("netrc_entry", &["machine", "login", "vault", "item"], &[]))
            .description(Some(
                "An external resource the provisioner sets up after activation. Never a secret: only vault and item names. Other keys are refused.",
            ))
            .into()
    }
}

impl ToSchema for RequiredAccess {}

/// A JSON object this document can promise the API takes: a few keys of NUL-free text
/// holding NUL-free text, numbers (whole ones within ±2^53, which a double carries
/// exactly; beyond is 422) or booleans. The API takes any JSON object within the
/// key's bound (nested values too); the document states a part of it so that every
/// example it describes is one the API takes.
pub(crate) fn small_json_object_builder() -> ObjectBuilder {
    let nul_free = || string().pattern(Some(NUL_FREE));
    let scalar = ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Number, Type::Boolean]))
        .pattern(Some(NUL_FREE))
        .max_length(Some(16))
        .minimum(Some(-9007199254740991_i64))
        .maximum(Some(9007199254740991_i64));
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property_names(Some(nul_free().max_length(Some(8))))
        .additional_properties(Some(scalar))
        .max_properties(Some(1))
}

pub(crate) fn small_json_object() -> Object {
    small_json_object_builder().build()
}

pub(crate) fn small_json_object_nullable() -> Object {
    small_json_object_builder().schema_type(SchemaType::from_iter([Type::Object, Type::Null])).build()
}

/// `trigger_schedule` in a config patch: the documented cron form, or null (which
/// deletes it).
pub(crate) fn cron_schema() -> Object {
    ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null])).pattern(Some(CRON_PATTERN)).build()
}

/// `notify` in a config patch: channel names to channel patches (or null, which deletes a
/// channel).
pub(crate) fn notify_patch_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(string().pattern(Some(NUL_FREE)).max_length(Some(64))))
        .additional_properties(Some(utoipa::openapi::Ref::from_schema_name("NotifyChannelPatch")))
        .max_properties(Some(8))
        .build()
}

/// Text that is not blank: a character that is neither NUL nor Unicode white space (what
/// the domain's checks call blank), and no NUL anywhere.
pub(crate) const NOT_BLANK: &str = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$";

/// `role` of a launch: empty (none), or text within its bound; or null.
pub(crate) fn role_schema() -> Object {
    use atasira_domain::worker::ROLE_CHARS;
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .pattern(Some(format!("^$|{NOT_BLANK}")))
        .max_length(Some(ROLE_CHARS))
        .build()
}

/// `labels` of a launch: a few keys of text, each holding text; or null.
pub(crate) fn labels_schema() -> Object {
    use atasira_domain::worker::{LABEL_KEY_CHARS, LABEL_VALUE_CHARS, LABELS};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(string().pattern(Some(NOT_BLANK)).max_length(Some(LABEL_KEY_CHARS))))
        .additional_properties(Some(string().pattern(Some(NUL_FREE)).max_length(Some(LABEL_VALUE_CHARS))))
        .max_properties(Some(LABELS))
        .build()
}

/// One kind of segment: `kind` one of `kinds`, `value` text within `chars`, nothing else.
pub(crate) fn segment_schema(kinds: &[&str], chars: usize) -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property("kind", string().enum_values(Some(kinds.to_vec())))
        .required("kind")
        .property("value", string().pattern(Some(NOT_BLANK)).max_length(Some(chars)))
        .required("value")
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
        .build()
}

/// `input` of a launch: 1 to 64 segments.
pub(crate) fn input_schema() -> impl Into<RefOr<Schema>> {
    use atasira_domain::worker::{INPUT_SEGMENTS, SEGMENT_REF_CHARS, SEGMENT_TEXT_CHARS};
    let segment = OneOfBuilder::new()
        .item(segment_schema(&["text"], SEGMENT_TEXT_CHARS))
        .item(segment_schema(&["ticket_ref", "objective_ref"], SEGMENT_REF_CHARS))
        .description(Some("A segment: `text`, or a reference to a ticket or an objective. There is no `system` segment."));
    ArrayBuilder::new().items(segment).min_items(Some(1)).max_items(Some(INPUT_SEGMENTS))
}

/// The box_type pattern, reserved words excluded.
pub(crate) fn box_type_schema() -> impl Into<RefOr<Schema>> {
    let reserved = RESERVED_BOX_TYPES.iter().map(|w| w.replace('-', "\\-")).collect::<Vec<_>>().join("|");
    let shape = BOX_TYPE_PATTERN.trim_start_matches('^');
    ObjectBuilder::new().schema_type(SchemaType::Type(Type::String)).pattern(Some(format!("^(?!(?:{reserved})$){shape}"))).max_length(Some(64))
}

pub(crate) fn os_operation_schema() -> ObjectBuilder {
    string().enum_values(Some(OSOperation::ALL.iter().map(|op| op.as_str())))
}

/// A list of OS operation names.
pub(crate) fn os_operations_schema() -> impl Into<RefOr<Schema>> {
    ArrayBuilder::new().items(os_operation_schema())
}

/// A list of OS operation names, or null.
pub(crate) fn os_operations_schema_nullable() -> impl Into<RefOr<Schema>> {
    ArrayBuilder::new().schema_type(SchemaType::from_iter([Type::Array, Type::Null])).items(os_operation_schema())
}
