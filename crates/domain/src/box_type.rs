//! `BoxType`: the unique id of a Box, parsed once (R-DRAFT-2, R-DRAFT-3, R-DRAFT-4).
//!
//! A box_type is also the 4th token of NATS subjects (`atasira.box.<box_type>.<channel>`),
//! which is why service names and channel words are reserved.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// R-DRAFT-2: the shape of a box_type.
pub const BOX_TYPE_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,63}$";

/// R-DRAFT-3: channel words and every service/subject token of the cluster.
pub const RESERVED_BOX_TYPES: &[&str] = &[
    "heartbeat",
    "task",
    "log",
    "result",
    "pause",
    "resume",
    "kill",
    "escalation",
    "events",
    "drafts",
    "approval",
    "provisioner",
    "runtime-registry",
    "audit",
    "gateway",
];

/// R-DRAFT-4 (INV-5): box_types whose drafts would be self-privilege escalation.
pub const SELF_PRIVILEGE_BOX_TYPES: &[&str] = &["admin-pm", "admin-ops"];

static PATTERN: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a constant pattern, covered by tests
    Regex::new(BOX_TYPE_PATTERN).unwrap()
});

/// Why a string is not a box_type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoxTypeError {
    #[error("box_type {0:?} does not match {BOX_TYPE_PATTERN}")]
    Pattern(String),
    #[error("box_type {0:?} is a reserved word")]
    Reserved(String),
}

/// A valid box_type. The field is private: the only way in is [`BoxType::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BoxType(String);

impl BoxType {
    /// Accepts exactly the strings that match the pattern and are not reserved.
    /// `admin-pm`/`admin-ops` parse (they exist as Boxes); drafting them is refused
    /// separately, see [`BoxType::is_self_privilege`].
    pub fn parse(s: &str) -> Result<Self, BoxTypeError> {
        if !PATTERN.is_match(s) {
            return Err(BoxTypeError::Pattern(s.to_owned()));
        }
        if RESERVED_BOX_TYPES.contains(&s) {
            return Err(BoxTypeError::Reserved(s.to_owned()));
        }
        Ok(BoxType(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// R-DRAFT-4: drafting this box_type is refused with 403.
    pub fn is_self_privilege(&self) -> bool {
        SELF_PRIVILEGE_BOX_TYPES.contains(&self.0.as_str())
    }
}

impl TryFrom<String> for BoxType {
    type Error = BoxTypeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        BoxType::parse(&s)
    }
}

impl From<BoxType> for String {
    fn from(b: BoxType) -> String {
        b.0
    }
}

impl std::fmt::Display for BoxType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_the_seed_examples() {
        // R-DRAFT-2
        for ok in ["sales-report", "market-watch", "a", "0", "a_b-c", &"a".repeat(64)] {
            assert!(BoxType::parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_what_the_pattern_refuses() {
        // R-DRAFT-2
        for bad in ["", "-a", "_a", "A", "Sales", "a.b", "a b", "a/b", &"a".repeat(65), "é", "a\n"] {
            assert!(matches!(BoxType::parse(bad), Err(BoxTypeError::Pattern(_))), "{bad:?}");
        }
    }

    #[test]
    fn refuses_every_reserved_word() {
        // R-DRAFT-3
        assert_eq!(RESERVED_BOX_TYPES.len(), 15);
        for word in RESERVED_BOX_TYPES {
            assert_eq!(BoxType::parse(word), Err(BoxTypeError::Reserved((*word).into())));
        }
    }

    #[test]
    fn self_privilege_types_parse_but_are_flagged() {
        // R-DRAFT-4
        assert!(BoxType::parse("admin-pm").expect("parses").is_self_privilege());
        assert!(BoxType::parse("admin-ops").expect("parses").is_self_privilege());
        assert!(!BoxType::parse("admin-pmx").expect("parses").is_self_privilege());
    }

    #[test]
    fn deserializing_goes_through_parse() {
        // R-DRAFT-3
        assert!(serde_json::from_str::<BoxType>("\"audit\"").is_err());
        assert_eq!(serde_json::from_str::<BoxType>("\"sales\"").expect("valid").as_str(), "sales");
    }

    proptest! {
        /// R-DRAFT-2, R-DRAFT-3: anything BoxType accepts matches the regex and is not reserved.
        #[test]
        fn accepted_values_match_and_are_not_reserved(s in "\\PC{0,70}|[a-z0-9_-]{0,66}") {
            if let Ok(bt) = BoxType::parse(&s) {
                prop_assert!(Regex::new(BOX_TYPE_PATTERN).expect("pattern").is_match(bt.as_str()));
                prop_assert!(!RESERVED_BOX_TYPES.contains(&bt.as_str()));
                prop_assert_eq!(bt.as_str(), s.as_str());
            }
        }
    }
}
