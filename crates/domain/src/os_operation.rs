//! The closed set of OS operations a Box may declare (R-MAN-1) and the over_limit rule
//! that makes approval need a second confirmation (R-DRAFT-8).

use serde::{Deserialize, Serialize};

macro_rules! os_operations {
    ($($variant:ident => $wire:literal),+ $(,)?) => {
        /// One OS operation. The wire form is `family:action`, e.g. `shell:exec`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum OSOperation {
            $(#[serde(rename = $wire)] $variant,)+
        }

        impl OSOperation {
            /// Every member, in the spec's order.
            pub const ALL: &'static [OSOperation] = &[$(OSOperation::$variant,)+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(OSOperation::$variant => $wire,)+
                }
            }

            /// Parses the wire form; `None` for anything not in the enum.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some(OSOperation::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

os_operations! {
    BrowserNavigate => "browser:navigate",
    BrowserClick => "browser:click",
    BrowserType => "browser:type",
    BrowserScroll => "browser:scroll",
    BrowserScreenshot => "browser:screenshot",
    BrowserTabManage => "browser:tab_manage",
    ApplescriptExecute => "applescript:execute",
    ApplescriptOpenApp => "applescript:open_app",
    ApplescriptMenuClick => "applescript:menu_click",
    GuiMouseClick => "gui:mouse_click",
    GuiMouseMove => "gui:mouse_move",
    GuiKeyboardType => "gui:keyboard_type",
    GuiKeyboardHotkey => "gui:keyboard_hotkey",
    GuiDragDrop => "gui:drag_drop",
    FileRead => "file:read",
    FileWrite => "file:write",
    FileCopy => "file:copy",
    FileMove => "file:move",
    ScreenshotCapture => "screenshot:capture",
    ScreenshotRegion => "screenshot:region",
    CronSchedule => "cron:schedule",
    ProcessKill => "process:kill",
    ShellExec => "shell:exec",
    OpRead => "op:read",
    OpCreate => "op:create",
    NotifyEmail => "notify:email",
    NotifyLine => "notify:line",
}

/// R-DRAFT-8: OS operations whose presence makes a draft over_limit.
pub const OVER_LIMIT_OPS: &[OSOperation] = &[
    OSOperation::ShellExec,
    OSOperation::ApplescriptExecute,
    OSOperation::ApplescriptOpenApp,
    OSOperation::ApplescriptMenuClick,
    OSOperation::FileWrite,
    OSOperation::FileMove,
    OSOperation::FileCopy,
    OSOperation::ProcessKill,
    OSOperation::OpCreate,
    OSOperation::OpRead,
    OSOperation::CronSchedule,
];

/// R-DRAFT-8: tool names whose presence makes a draft over_limit.
pub const OVER_LIMIT_TOOLS: &[&str] = &["Bash", "op:create", "op:read", "shell", "process:kill"];

impl OSOperation {
    pub fn is_over_limit(self) -> bool {
        OVER_LIMIT_OPS.contains(&self)
    }
}

impl std::fmt::Display for OSOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The over_limit verdict of R-DRAFT-8 with the hits, in declaration order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverLimit {
    pub over_limit: bool,
    pub over_limit_ops: Vec<String>,
    pub over_limit_tools: Vec<String>,
}

/// Where a grant was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    OsOperations,
    Tools,
}

/// One thing a Box may call: an entry of `os_operations` or of `tools`, with the OS
/// operation it grants. A `tools` entry that names an OS operation (`shell:exec`) grants
/// that operation exactly as if it were declared in `os_operations`: the runtime's
/// effective tool list holds both lists (R-MAN-2), so the name is callable either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub name: String,
    pub declared: Declared,
    pub operation: Option<OSOperation>,
}

impl Grant {
    /// R-DRAFT-8: an over-limit OS operation (however declared) or an over-limit tool.
    pub fn is_over_limit(&self) -> bool {
        match self.operation {
            Some(op) => op.is_over_limit(),
            None => OVER_LIMIT_TOOLS.contains(&self.name.as_str()),
        }
    }
}

/// What a set of declared `os_operations` and `tools` grants: the one capability rule
/// (R-MAN-2, R-DRAFT-8, R-EDIT-3). Draft-time over_limit and edit-time "widens
/// capability" both read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants(pub Vec<Grant>);

impl Grants {
    /// The grants of the two declared lists, in declaration order (`os_operations` first),
    /// each name once per list.
    pub fn of(os_operations: &[OSOperation], tools: &[String]) -> Grants {
        let mut out: Vec<Grant> = Vec::new();
        for op in os_operations {
            if !out.iter().any(|g| g.declared == Declared::OsOperations && g.operation == Some(*op)) {
                out.push(Grant { name: op.as_str().to_owned(), declared: Declared::OsOperations, operation: Some(*op) });
            }
        }
        for tool in tools {
            if !out.iter().any(|g| g.declared == Declared::Tools && g.name == *tool) {
                out.push(Grant { name: tool.clone(), declared: Declared::Tools, operation: OSOperation::parse(tool) });
            }
        }
        Grants(out)
    }

    /// Whether `op` is granted, by `os_operations` or by naming it in `tools`.
    pub fn allows(&self, op: OSOperation) -> bool {
        self.0.iter().any(|g| g.operation == Some(op))
    }

    /// The OS operations granted, however declared.
    pub fn operations(&self) -> std::collections::BTreeSet<OSOperation> {
        self.0.iter().filter_map(|g| g.operation).collect()
    }

    /// The tools granted that are not OS operations.
    pub fn plain_tools(&self) -> std::collections::BTreeSet<&str> {
        self.0.iter().filter(|g| g.operation.is_none()).map(|g| g.name.as_str()).collect()
    }

    /// What `after` grants that `self` does not (an operation or a tool name), in
    /// `after`'s declaration order: empty means `after` is no wider.
    pub fn widened_by(&self, after: &Grants) -> Vec<String> {
        let (ops, tools) = (self.operations(), self.plain_tools());
        let mut out: Vec<String> = Vec::new();
        for g in &after.0 {
            let new = match g.operation {
                Some(op) => !ops.contains(&op),
                None => !tools.contains(g.name.as_str()),
            };
            if new && !out.contains(&g.name) {
                out.push(g.name.clone());
            }
        }
        out
    }

    /// R-DRAFT-8: the over_limit verdict. `over_limit_ops` names the over-limit entries of
    /// `os_operations`; `over_limit_tools` the over-limit entries of `tools`, among them
    /// those naming an over-limit OS operation.
    pub fn over_limit(&self) -> OverLimit {
        let hits =
            |declared: Declared| -> Vec<String> { self.0.iter().filter(|g| g.declared == declared && g.is_over_limit()).map(|g| g.name.clone()).collect() };
        let (ops, tools) = (hits(Declared::OsOperations), hits(Declared::Tools));
        OverLimit { over_limit: !ops.is_empty() || !tools.is_empty(), over_limit_ops: ops, over_limit_tools: tools }
    }
}

/// R-DRAFT-8: over_limit from the declared `os_operations` and `tools` (the rule is
/// stated on the two declared lists; see [`Grants`]).
pub fn over_limit(os_operations: &[OSOperation], tools: &[String]) -> OverLimit {
    Grants::of(os_operations, tools).over_limit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_enum_has_the_27_members_of_r_man_1() {
        // R-MAN-1
        assert_eq!(OSOperation::ALL.len(), 27);
        for op in OSOperation::ALL {
            assert_eq!(OSOperation::parse(op.as_str()), Some(*op));
            let json = serde_json::to_string(op).expect("serializes");
            assert_eq!(json, format!("\"{}\"", op.as_str()));
        }
        assert_eq!(OSOperation::parse("shell:execute"), None);
        assert_eq!(OSOperation::parse("Shell:exec"), None);
    }

    #[test]
    fn given_an_over_limit_op_when_checked_then_it_is_listed() {
        // R-DRAFT-8: the eleven ops
        assert_eq!(OVER_LIMIT_OPS.len(), 11);
        let verdict = over_limit(&[OSOperation::BrowserNavigate, OSOperation::ShellExec, OSOperation::CronSchedule], &[]);
        assert!(verdict.over_limit);
        assert_eq!(verdict.over_limit_ops, vec!["shell:exec", "cron:schedule"]);
        assert!(verdict.over_limit_tools.is_empty());
    }

    #[test]
    fn given_an_over_limit_tool_when_checked_then_it_is_listed() {
        // R-DRAFT-8: the five tools, case-sensitive like the seed
        let tools: Vec<String> = ["Read", "Bash", "bash", "shell", "Bash"].iter().map(|s| s.to_string()).collect();
        let verdict = over_limit(&[], &tools);
        assert!(verdict.over_limit);
        assert_eq!(verdict.over_limit_tools, vec!["Bash", "shell"]);
    }

    #[test]
    fn given_only_safe_capabilities_when_checked_then_not_over_limit() {
        // R-DRAFT-8
        let safe: Vec<OSOperation> = OSOperation::ALL.iter().copied().filter(|op| !OVER_LIMIT_OPS.contains(op)).collect();
        assert_eq!(safe.len(), 16);
        let verdict = over_limit(&safe, &["Read".to_string(), "Write".to_string()]);
        assert_eq!(verdict, OverLimit::default());
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn given_an_os_operation_named_in_tools_then_it_grants_that_operation_and_counts_for_over_limit() {
        // R-DRAFT-8, R-MAN-2 (issue 10 item 7): `tools: [shell:exec, file:write]` is the
        // same capability as declaring them in os_operations
        let verdict = over_limit(&[], &names(&["shell:exec", "file:write", "Read"]));
        assert!(verdict.over_limit);
        assert!(verdict.over_limit_ops.is_empty());
        assert_eq!(verdict.over_limit_tools, vec!["shell:exec", "file:write"]);
        let grants = Grants::of(&[], &names(&["shell:exec"]));
        assert!(grants.allows(OSOperation::ShellExec));
        assert!(!grants.allows(OSOperation::FileWrite));
        // a safe operation named in tools grants it and is not over limit
        assert_eq!(over_limit(&[], &names(&["browser:navigate"])), OverLimit::default());
        assert!(Grants::of(&[], &names(&["browser:navigate"])).allows(OSOperation::BrowserNavigate));
    }

    #[test]
    fn given_two_declarations_when_compared_then_only_new_grants_widen() {
        // R-EDIT-3 (issue 10 item 7): the same operation moved between the lists is no
        // wider; a new operation or tool is
        let before = Grants::of(&[OSOperation::ShellExec], &names(&["Read"]));
        assert!(before.widened_by(&Grants::of(&[], &names(&["shell:exec", "Read"]))).is_empty());
        assert!(before.widened_by(&Grants::of(&[], &[])).is_empty(), "removing is narrowing");
        assert_eq!(before.widened_by(&Grants::of(&[OSOperation::ShellExec, OSOperation::FileWrite], &names(&["Read", "Bash"]))), vec!["file:write", "Bash"]);
        assert_eq!(before.widened_by(&Grants::of(&[], &names(&["op:read"]))), vec!["op:read"]);
    }
}
