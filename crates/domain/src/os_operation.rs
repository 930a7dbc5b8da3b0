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

/// R-DRAFT-8: over_limit from the declared `os_operations` and `tools` (not the effective
/// union: the rule is stated on the two declared lists).
pub fn over_limit(os_operations: &[OSOperation], tools: &[String]) -> OverLimit {
    let mut ops: Vec<String> = Vec::new();
    for op in os_operations.iter().filter(|op| op.is_over_limit()) {
        if !ops.iter().any(|o| o == op.as_str()) {
            ops.push(op.as_str().to_owned());
        }
    }
    let mut hit_tools: Vec<String> = Vec::new();
    for tool in tools.iter().filter(|t| OVER_LIMIT_TOOLS.contains(&t.as_str())) {
        if !hit_tools.contains(tool) {
            hit_tools.push(tool.clone());
        }
    }
    OverLimit { over_limit: !ops.is_empty() || !hit_tools.is_empty(), over_limit_ops: ops, over_limit_tools: hit_tools }
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
}
