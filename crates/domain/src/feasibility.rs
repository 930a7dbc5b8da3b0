//! The feasibility pre-check of R-FEAS-1 (seed 000 §3): can an existing Box take on a task
//! within what a human already approved (`/box-fulfill`), or does the task need a capability
//! the Box lacks, so that a new C9 draft must be submitted (`/box-create`)?
//!
//! The check is read-only, makes no LLM call and is deterministic: the task description is
//! matched against a fixed table of English and Japanese keywords ([`KEYWORD_TABLE`]), and
//! every capability whose keywords appear is compared with what the Box declares
//! (`os_operations`, effective `tools`, `network`, `url_allowlist`; `shell` and
//! `file_access` add notes). Being keyword-based it is a strong signal, not a guarantee: a
//! recognised-but-missing capability is a reliable "submit a new draft", while an empty
//! result only means nothing in the table was recognised.
//!
//! Matching rules (chosen so that the table stays plain data and the results are stable):
//! - The task is first width-folded: full-width ASCII (`ＣＳＶ`, `ＬＩＮＥ`) and the
//!   ideographic space become their ASCII forms, since Japanese text often mixes them in.
//! - [`Keyword::Fold`] matches ASCII case-insensitively. A keyword that starts with an ASCII
//!   letter or digit must start a word (the preceding character is not an ASCII letter or
//!   digit) so that `kill` does not fire on "skill" nor `script` on "AppleScript"; it may be
//!   followed by anything, so that inflections ("emails", "scheduled", "screenshots") match.
//!   A keyword that starts with Japanese text matches as a plain substring, because Japanese
//!   has no spaces to mark word boundaries.
//! - [`Keyword::Exact`] matches case-sensitively as a whole word. It exists for `LINE` (the
//!   messenger): matched case-insensitively or inside words, "online", "deadline" or "a line
//!   of text" would all ask for `notify:line`.
//! - A match lying inside a longer match of a *different* capability is discarded: "create a
//!   password" asks for `op:create`, not also for `op:read` (`password`); "double-click" asks
//!   for `gui:mouse_click`, not also for `browser:click`; "アップルスクリプト" asks for
//!   `applescript:execute`, not also for `shell:exec` (`スクリプト`).
//! - Output follows the table order (then order of first appearance for URL hosts), without
//!   duplicates, so the same input always gives the same JSON.

use serde::{Deserialize, Serialize};

use crate::manifest::{BoxManifest, Network};
use crate::os_operation::OSOperation;

use self::Keyword::{Exact, Fold};

/// Something a task may need from a Box.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// A declared OS operation (R-MAN-1).
    Op(OSOperation),
    /// At least this `network` level. Not an OS operation, but raising it is a capability
    /// change that needs a new C9 draft (seed 000 §3), so it is reported the same way.
    Network(Network),
}

impl Capability {
    /// The wire form used in `missing_capabilities`: the OS operation's own string, or
    /// `network:<level>` for the network pseudo-capability.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Op(op) => op.as_str(),
            Capability::Network(Network::None) => "network:none",
            Capability::Network(Network::Local) => "network:local",
            Capability::Network(Network::Filtered) => "network:filtered",
            Capability::Network(Network::Full) => "network:full",
        }
    }

    /// R-DRAFT-8: a draft adding this capability needs the second over_limit confirmation.
    pub fn is_over_limit(self) -> bool {
        match self {
            Capability::Op(op) => op.is_over_limit(),
            Capability::Network(_) => false,
        }
    }
}

/// One keyword of [`KEYWORD_TABLE`]; see the module documentation for the matching rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyword {
    /// ASCII case-insensitive, at a word start; Japanese text as a plain substring. Written
    /// in lower case in the table.
    Fold(&'static str),
    /// Case-sensitive whole word, for names that collide with ordinary words (`LINE`).
    Exact(&'static str),
}

impl Keyword {
    pub fn text(self) -> &'static str {
        match self {
            Fold(s) | Exact(s) => s,
        }
    }
}

/// One row of [`KEYWORD_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapabilityKeywords {
    pub capability: Capability,
    pub keywords: &'static [Keyword],
    /// Tool names that already grant the capability. Only `shell:exec` and the file
    /// operations have them: `Bash`/`shell` are the tool spellings R-DRAFT-8 puts next to
    /// `shell:exec`, and `Read`/`Write` are the whitelist's file tools (R-MAN-2 examples).
    /// Without them a Box with `tools: [Bash]` would be sent to draft a capability it has.
    pub covered_by_tools: &'static [&'static str],
}

const fn op(op: OSOperation, keywords: &'static [Keyword]) -> CapabilityKeywords {
    CapabilityKeywords { capability: Capability::Op(op), keywords, covered_by_tools: &[] }
}

const fn op_or_tools(op: OSOperation, keywords: &'static [Keyword], tools: &'static [&'static str]) -> CapabilityKeywords {
    CapabilityKeywords { capability: Capability::Op(op), keywords, covered_by_tools: tools }
}

/// The keyword table: every OS operation in R-MAN-1 order, then the network
/// pseudo-capability. Keywords were picked to be specific rather than complete: a false
/// "missing" sends someone to draft needlessly, a false hit on a common word ("run",
/// "tab" in "table", "drop", "line") would do that for many ordinary tasks. Bare "run " and
/// "execute" are left out of `shell:exec` for that reason ("run every Monday").
pub const KEYWORD_TABLE: &[CapabilityKeywords] = &[
    op(
        OSOperation::BrowserNavigate,
        &[
            Fold("browse"),
            Fold("website"),
            Fold("web site"),
            Fold("web page"),
            Fold("webpage"),
            Fold("url"),
            Fold("http://"),
            Fold("https://"),
            Fold("open the site"),
            Fold("open the page"),
            Fold("visit"),
            Fold("navigate"),
            Fold("ブラウザ"),
            Fold("サイト"),
            Fold("ウェブ"),
            Fold("webページ"),
            Fold("ホームページ"),
            Fold("ページを開"),
            Fold("閲覧"),
        ],
    ),
    op(OSOperation::BrowserClick, &[Fold("click"), Fold("press the button"), Fold("クリック"), Fold("ボタンを押")]),
    op(
        OSOperation::BrowserType,
        &[
            Fold("fill in"),
            Fold("fill out"),
            Fold("type into"),
            Fold("enter text"),
            Fold("input field"),
            Fold("submit the form"),
            Fold("web form"),
            Fold("入力"),
            Fold("フォーム"),
        ],
    ),
    op(OSOperation::BrowserScroll, &[Fold("scroll"), Fold("スクロール")]),
    op(
        OSOperation::BrowserScreenshot,
        &[
            Fold("page screenshot"),
            Fold("screenshot of the page"),
            Fold("screenshot of the web"),
            Fold("screenshot of the site"),
            Fold("ページのスクリーンショット"),
            Fold("ページのスクショ"),
            Fold("サイトのスクリーンショット"),
            Fold("サイトのスクショ"),
        ],
    ),
    op(
        OSOperation::BrowserTabManage,
        &[
            Fold("new tab"),
            Fold("browser tab"),
            Fold("tabs"),
            Fold("switch tab"),
            Fold("close the tab"),
            Fold("open a tab"),
            Fold("新しいタブ"),
            Fold("別タブ"),
            Fold("タブを開"),
            Fold("タブを切"),
            Fold("タブを閉"),
        ],
    ),
    op(OSOperation::ApplescriptExecute, &[Fold("applescript"), Fold("apple script"), Fold("osascript"), Fold("アップルスクリプト")]),
    op(
        OSOperation::ApplescriptOpenApp,
        &[
            Fold("open app"),
            Fold("open the app"),
            Fold("launch"),
            Fold("start the app"),
            Fold("アプリを開"),
            Fold("アプリを起動"),
            Fold("アプリケーションを開"),
            Fold("アプリケーションを起動"),
        ],
    ),
    op(OSOperation::ApplescriptMenuClick, &[Fold("menu"), Fold("メニュー")]),
    op(
        OSOperation::GuiMouseClick,
        &[
            Fold("mouse click"),
            Fold("click the mouse"),
            Fold("right-click"),
            Fold("right click"),
            Fold("double-click"),
            Fold("double click"),
            Fold("マウスでクリック"),
            Fold("マウスクリック"),
            Fold("右クリック"),
            Fold("ダブルクリック"),
        ],
    ),
    op(OSOperation::GuiMouseMove, &[Fold("mouse"), Fold("move the mouse"), Fold("cursor"), Fold("マウス"), Fold("カーソル")]),
    op(OSOperation::GuiKeyboardType, &[Fold("keyboard"), Fold("keystroke"), Fold("キーボード"), Fold("キー入力")]),
    op(OSOperation::GuiKeyboardHotkey, &[Fold("hotkey"), Fold("shortcut"), Fold("keyboard shortcut"), Fold("ショートカット"), Fold("ホットキー")]),
    op(OSOperation::GuiDragDrop, &[Fold("drag"), Fold("ドラッグ")]),
    op_or_tools(
        OSOperation::FileRead,
        &[
            Fold("read file"),
            Fold("read the file"),
            Fold("read a file"),
            Fold("open the file"),
            Fold("load the file"),
            Fold("from the file"),
            Fold("csv"),
            Fold("spreadsheet"),
            Fold("excel"),
            Fold("ファイルを読"),
            Fold("読み込"),
            Fold("読み取"),
            Fold("ファイルを開"),
            Fold("ファイルから"),
        ],
        &["Read"],
    ),
    op_or_tools(
        OSOperation::FileWrite,
        &[
            Fold("write file"),
            Fold("write the file"),
            Fold("write a file"),
            Fold("write to"),
            Fold("save"),
            Fold("export"),
            Fold("保存"),
            Fold("書き出"),
            Fold("書き込"),
            Fold("ファイルに書"),
        ],
        &["Write"],
    ),
    op(OSOperation::FileCopy, &[Fold("copy"), Fold("duplicate the file"), Fold("コピー"), Fold("複製")]),
    op(OSOperation::FileMove, &[Fold("move"), Fold("rename"), Fold("移動"), Fold("ファイル名を変更"), Fold("リネーム")]),
    op(
        OSOperation::ScreenshotCapture,
        &[
            Fold("screenshot"),
            Fold("screen shot"),
            Fold("screen capture"),
            Fold("capture the screen"),
            Fold("スクリーンショット"),
            Fold("スクショ"),
            Fold("画面キャプチャ"),
        ],
    ),
    op(
        OSOperation::ScreenshotRegion,
        &[
            Fold("region screenshot"),
            Fold("screenshot of a region"),
            Fold("screenshot of part"),
            Fold("region of the screen"),
            Fold("part of the screen"),
            Fold("area of the screen"),
            Fold("画面の一部"),
            Fold("範囲のスクリーンショット"),
            Fold("部分キャプチャ"),
        ],
    ),
    op(
        OSOperation::CronSchedule,
        &[
            Fold("every day"),
            Fold("every week"),
            Fold("every month"),
            Fold("every hour"),
            Fold("every minute"),
            Fold("every morning"),
            Fold("every evening"),
            Fold("every night"),
            Fold("every monday"),
            Fold("every tuesday"),
            Fold("every wednesday"),
            Fold("every thursday"),
            Fold("every friday"),
            Fold("every saturday"),
            Fold("every sunday"),
            Fold("schedule"),
            Fold("cron"),
            Fold("daily"),
            Fold("weekly"),
            Fold("monthly"),
            Fold("hourly"),
            Fold("periodically"),
            Fold("毎日"),
            Fold("毎週"),
            Fold("毎月"),
            Fold("毎時"),
            Fold("毎朝"),
            Fold("毎晩"),
            Fold("毎夜"),
            Fold("定期"),
            Fold("スケジュール"),
            Fold("時間ごと"),
            Fold("分ごと"),
        ],
    ),
    op(
        OSOperation::ProcessKill,
        &[
            Fold("kill"),
            Fold("terminate process"),
            Fold("terminate the process"),
            Fold("stop the process"),
            Fold("end the process"),
            Fold("プロセスを終了"),
            Fold("プロセスを停止"),
            Fold("強制終了"),
        ],
    ),
    op_or_tools(
        OSOperation::ShellExec,
        &[
            Fold("shell"),
            Fold("command"),
            Fold("script"),
            Fold("terminal"),
            Fold("bash"),
            Fold("シェル"),
            Fold("コマンド"),
            Fold("スクリプト"),
            Fold("ターミナル"),
        ],
        &["Bash", "shell"],
    ),
    op(
        OSOperation::OpRead,
        &[
            Fold("password"),
            Fold("1password"),
            Fold("secret"),
            Fold("credential"),
            Fold("api key"),
            Fold("vault"),
            Fold("パスワード"),
            Fold("認証情報"),
            Fold("シークレット"),
            Fold("ログイン情報"),
        ],
    ),
    op(
        OSOperation::OpCreate,
        &[
            Fold("create a password"),
            Fold("create password"),
            Fold("generate a password"),
            Fold("new password"),
            Fold("save the password"),
            Fold("store secret"),
            Fold("store a secret"),
            Fold("store the secret"),
            Fold("パスワードを作成"),
            Fold("パスワードを生成"),
            Fold("パスワードを保存"),
            Fold("認証情報を保存"),
        ],
    ),
    op(OSOperation::NotifyEmail, &[Fold("email"), Fold("e-mail"), Fold("mail"), Fold("gmail"), Fold("メール")]),
    op(
        OSOperation::NotifyLine,
        &[Exact("LINE"), Fold("line message"), Fold("line messaging"), Fold("line notify"), Fold("line official account"), Fold("line bot")],
    ),
    CapabilityKeywords {
        capability: Capability::Network(Network::Filtered),
        keywords: &[
            Fold("internet"),
            Fold("online"),
            Fold("website"),
            Fold("web site"),
            Fold("web page"),
            Fold("webpage"),
            Fold("url"),
            Fold("http://"),
            Fold("https://"),
            Fold("browse"),
            Fold("download"),
            Fold("upload"),
            Fold("web api"),
            Fold("rest api"),
            Fold("インターネット"),
            Fold("オンライン"),
            Fold("ウェブ"),
            Fold("サイト"),
            Fold("webページ"),
            Fold("ホームページ"),
            Fold("ダウンロード"),
            Fold("アップロード"),
        ],
        covered_by_tools: &[],
    },
];

/// The answer of `POST /api/v1/boxes/feasibility` (R-FEAS-1), field order as in the spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feasibility {
    /// `missing_capabilities` is empty.
    pub feasible: bool,
    /// The declared `os_operations`, wire strings, in declaration order.
    pub available_operations: Vec<String>,
    /// The effective tools (R-MAN-2).
    pub available_tools: Vec<String>,
    /// Recognised but not declared; non-empty means "submit a new draft" (`/box-create`).
    pub missing_capabilities: Vec<String>,
    /// One line per missing capability: what approval adding it takes.
    pub required_approvals: Vec<String>,
    /// One English sentence.
    pub summary: String,
    /// Why: which keywords matched, and limits of the Box worth knowing.
    pub notes: Vec<String>,
}

/// R-FEAS-1: assesses `task_description` against `manifest`. Pure and deterministic.
pub fn assess(manifest: &BoxManifest, task_description: &str) -> Feasibility {
    let available_operations = dedup(manifest.os_operations.iter().map(|op| op.as_str().to_owned()));
    let available_tools = manifest.effective_tools();
    let text = width_fold(task_description);
    let matched = matched_keywords(&text);

    let mut needed: Vec<Capability> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut required_approvals: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();

    for (row, keywords) in KEYWORD_TABLE.iter().zip(&matched) {
        if keywords.is_empty() {
            continue;
        }
        let capability = row.capability;
        needed.push(capability);
        let quoted: Vec<String> = keywords.iter().map(|k| format!("{k:?}")).collect();
        notes.push(format!("{} needed: the task mentions {}", capability.as_str(), quoted.join(", ")));
        match coverage(manifest, &available_tools, row) {
            Coverage::Declared => {}
            Coverage::ByTool(tool) => notes.push(format!("{} is covered by the declared tool `{tool}`", capability.as_str())),
            Coverage::Missing => {
                missing.push(capability.as_str().to_owned());
                required_approvals.push(approval_line(manifest, capability));
            }
        }
    }

    // URL hosts: with `network: filtered` only `url_allowlist` hosts are reachable, and that
    // list is a capability key (mentor edits may not touch it, R-EDIT-2), so an unlisted
    // host is a missing capability too. `full` reaches everything.
    if manifest.network != Network::Full {
        for host in url_hosts(&text) {
            if !manifest.url_allowlist.iter().any(|entry| allowlist_covers(entry, &host)) {
                notes.push(format!("the task names host {host:?}, which url_allowlist does not list"));
                let capability = format!("url_allowlist:{host}");
                required_approvals.push(format!(
                    "{capability}: reaching {host:?} needs it in url_allowlist, which only a new C9 draft (/box-create) approved by a human admin can add"
                ));
                missing.push(capability);
            }
        }
    }

    notes.extend(box_notes(manifest, &available_tools, &needed));
    if needed.is_empty() {
        notes.push("no capability keywords recognised; the check is keyword-based and not a guarantee".to_owned());
    }

    let summary = summary(manifest, &needed, &missing);
    Feasibility { feasible: missing.is_empty(), available_operations, available_tools, missing_capabilities: missing, required_approvals, summary, notes }
}

enum Coverage {
    Declared,
    ByTool(&'static str),
    Missing,
}

/// An operation counts as declared when it is in `os_operations` or, by its wire name, in
/// the effective tools; failing that, one of the row's tool aliases may cover it.
fn coverage(manifest: &BoxManifest, tools: &[String], row: &CapabilityKeywords) -> Coverage {
    match row.capability {
        Capability::Op(op) => {
            if manifest.os_operations.contains(&op) || tools.iter().any(|t| t == op.as_str()) {
                Coverage::Declared
            } else if let Some(tool) = row.covered_by_tools.iter().find(|alias| tools.iter().any(|t| t == *alias)) {
                Coverage::ByTool(tool)
            } else {
                Coverage::Missing
            }
        }
        Capability::Network(level) => {
            if manifest.network >= level {
                Coverage::Declared
            } else {
                Coverage::Missing
            }
        }
    }
}

fn approval_line(manifest: &BoxManifest, capability: Capability) -> String {
    let what = match capability {
        Capability::Op(_) => "not declared by this Box".to_owned(),
        Capability::Network(_) => format!("the Box's network is `{}`", network_name(manifest.network)),
    };
    let mut line = format!("{}: {what}; adding it needs a new C9 draft (/box-create) approved by a human admin", capability.as_str());
    if capability.is_over_limit() {
        line.push_str("; it is over_limit, so the approval also needs the second over_limit confirmation (confirm_over_limit: true)");
    }
    line
}

fn network_name(network: Network) -> &'static str {
    match network {
        Network::None => "none",
        Network::Local => "local",
        Network::Filtered => "filtered",
        Network::Full => "full",
    }
}

/// Notes about the Box's own limits that decide whether a declared capability is usable.
fn box_notes(manifest: &BoxManifest, tools: &[String], needed: &[Capability]) -> Vec<String> {
    let mut notes = Vec::new();
    let needs = |op: OSOperation| needed.contains(&Capability::Op(op));

    if needs(OSOperation::CronSchedule) && manifest.trigger_type == crate::manifest::TriggerType::Schedule {
        notes.push(format!(
            "the Box already runs on trigger_schedule {:?}; changing that schedule is a /box-fulfill edit, but cron:schedule itself must be declared for the agent to schedule work",
            manifest.trigger_schedule
        ));
    }

    let shell_declared = manifest.os_operations.contains(&OSOperation::ShellExec) || tools.iter().any(|t| t == "shell:exec");
    if shell_declared {
        if manifest.shell.allowed_commands.is_empty() {
            notes.push("shell:exec is declared but shell.allowed_commands is empty: the Box is fail-closed and every command is refused".to_owned());
        } else if needs(OSOperation::ShellExec) {
            notes.push(format!("shell:exec is limited to shell.allowed_commands: {}", manifest.shell.allowed_commands.join(", ")));
        }
    }

    let file_ops = [OSOperation::FileRead, OSOperation::FileWrite, OSOperation::FileCopy, OSOperation::FileMove];
    let needed_file_ops: Vec<&str> = file_ops.iter().filter(|op| needs(**op)).map(|op| op.as_str()).collect();
    if !needed_file_ops.is_empty() {
        if manifest.file_access.is_empty() {
            notes.push(format!(
                "the task needs file operations ({}) but file_access is empty: no path is allowed (file_access is a capability key: changing it needs a new C9 draft)",
                needed_file_ops.join(", ")
            ));
        } else {
            notes.push(format!("file operations are limited to file_access: {}", manifest.file_access.join(", ")));
        }
    }

    if tools.is_empty() {
        notes.push("the Box declares no tools: it is fail-closed and can call nothing".to_owned());
    }
    notes
}

fn summary(manifest: &BoxManifest, needed: &[Capability], missing: &[String]) -> String {
    let box_type = manifest.box_type.as_str();
    if !missing.is_empty() {
        let noun = if missing.len() == 1 { "capability" } else { "capabilities" };
        format!(
            "Box `{box_type}` lacks {} {noun} the task needs ({}), so submit a new C9 draft with /box-create instead of /box-fulfill.",
            missing.len(),
            missing.join(", ")
        )
    } else if !needed.is_empty() {
        let list: Vec<&str> = needed.iter().map(|c| c.as_str()).collect();
        format!(
            "Box `{box_type}` already declares every capability the task appears to need ({}), so /box-fulfill can proceed within its approved scope.",
            list.join(", ")
        )
    } else {
        format!("No capability keywords were recognised in the task, so nothing is known to be missing from Box `{box_type}`.")
    }
}

/// Full-width ASCII (U+FF01..U+FF5E) and the ideographic space to ASCII; everything else
/// unchanged.
fn width_fold(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\u{3000}' => ' ',
            '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
            other => other,
        })
        .collect()
}

/// One keyword occurrence in the task.
struct Hit {
    row: usize,
    keyword: usize,
    start: usize,
    end: usize,
}

/// For each table row, the keywords that matched (table order, no duplicates), after
/// discarding matches that lie inside a longer match of another row.
fn matched_keywords(text: &str) -> Vec<Vec<&'static str>> {
    // `to_ascii_lowercase` keeps byte offsets, so spans are comparable across both forms.
    let lower = text.to_ascii_lowercase();
    let mut hits: Vec<Hit> = Vec::new();
    for (row, entry) in KEYWORD_TABLE.iter().enumerate() {
        for (keyword, kw) in entry.keywords.iter().enumerate() {
            let (haystack, needle, whole_word) = match kw {
                Fold(s) => (lower.as_str(), s.to_ascii_lowercase(), false),
                Exact(s) => (text, (*s).to_owned(), true),
            };
            if needle.is_empty() {
                continue;
            }
            for (start, _) in haystack.match_indices(needle.as_str()) {
                let end = start + needle.len();
                if at_word_start(haystack, start, &needle) && (!whole_word || at_word_end(haystack, end, &needle)) {
                    hits.push(Hit { row, keyword, start, end });
                }
            }
        }
    }
    let kept = |h: &Hit| !hits.iter().any(|o| o.row != h.row && o.start <= h.start && h.end <= o.end && o.end - o.start > h.end - h.start);
    let mut out: Vec<Vec<&'static str>> = vec![Vec::new(); KEYWORD_TABLE.len()];
    let mut surviving: Vec<(usize, usize)> = hits.iter().filter(|h| kept(h)).map(|h| (h.row, h.keyword)).collect();
    surviving.sort_unstable();
    surviving.dedup();
    for (row, keyword) in surviving {
        out[row].push(KEYWORD_TABLE[row].keywords[keyword].text());
    }
    out
}

/// A keyword beginning with an ASCII letter or digit must not continue a preceding word.
fn at_word_start(haystack: &str, start: usize, needle: &str) -> bool {
    if !needle.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return true;
    }
    !haystack[..start].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// A whole-word keyword ending with an ASCII letter or digit must not run into a following
/// word ("LINES" is not "LINE"; "LINEで" is).
fn at_word_end(haystack: &str, end: usize, needle: &str) -> bool {
    if !needle.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return true;
    }
    !haystack[end..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// Hosts of `http://` / `https://` URLs in the task, lower-cased, in order of first
/// appearance. Bare domains without a scheme are not recognised.
fn url_hosts(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let mut found: Vec<(usize, String)> = Vec::new();
    for scheme in ["http://", "https://"] {
        for (start, _) in lower.match_indices(scheme) {
            let rest = &lower[start + scheme.len()..];
            let host: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-').collect();
            let host = host.trim_end_matches('.');
            if !host.is_empty() {
                found.push((start, host.to_owned()));
            }
        }
    }
    // Both schemes were scanned separately: put the hosts back in text order.
    found.sort();
    dedup(found.into_iter().map(|(_, host)| host))
}

/// An allowlist entry covers a host when it names it (an entry written as a URL or with a
/// port is reduced to its host first), or when it is `*.domain` and the host is below it.
fn allowlist_covers(entry: &str, host: &str) -> bool {
    let entry = entry.trim().to_ascii_lowercase();
    let entry = entry.strip_prefix("https://").or_else(|| entry.strip_prefix("http://")).unwrap_or(&entry);
    let entry = entry.split(['/', ':']).next().unwrap_or_default();
    match entry.strip_prefix("*.") {
        Some(domain) => host.len() > domain.len() && host.ends_with(domain) && host[..host.len() - domain.len()].ends_with('.'),
        None => entry == host,
    }
}

fn dedup(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn manifest(os_operations: &str, extra: &str) -> BoxManifest {
        let yaml = format!("box_type: sales-report\npurpose: p\nos_operations: [{os_operations}]\n{extra}");
        BoxManifest::from_yaml_str(&yaml).expect("test manifest is valid").manifest
    }

    #[test]
    fn the_table_lists_every_os_operation_once_in_spec_order_with_well_formed_keywords() {
        // R-FEAS-1, R-MAN-1
        let ops: Vec<OSOperation> = KEYWORD_TABLE
            .iter()
            .filter_map(|row| match row.capability {
                Capability::Op(op) => Some(op),
                Capability::Network(_) => None,
            })
            .collect();
        assert_eq!(ops, OSOperation::ALL);
        for row in KEYWORD_TABLE {
            assert!(!row.keywords.is_empty(), "{} has keywords", row.capability.as_str());
            let unique: BTreeSet<&str> = row.keywords.iter().map(|k| k.text()).collect();
            assert_eq!(unique.len(), row.keywords.len(), "{} has no duplicate keywords", row.capability.as_str());
            for kw in row.keywords {
                match kw {
                    Fold(s) => assert_eq!(*s, s.to_lowercase(), "Fold keywords are written in lower case"),
                    Exact(s) => assert!(s.is_ascii() && !s.is_empty()),
                }
            }
        }
    }

    #[test]
    fn given_an_english_task_needing_an_undeclared_capability_when_assessed_then_not_feasible() {
        // R-FEAS-1
        let m = manifest("browser:navigate", "network: filtered\nurl_allowlist: [example.com]\n");
        let f = assess(&m, "Take a screenshot of the dashboard and send it by email");
        assert!(!f.feasible);
        assert_eq!(f.missing_capabilities, vec!["screenshot:capture", "notify:email"]);
        assert_eq!(f.available_operations, vec!["browser:navigate"]);
        assert_eq!(f.available_tools, vec!["browser:navigate"]);
        assert_eq!(f.required_approvals.len(), 2);
        assert!(f.required_approvals.iter().all(|a| a.contains("new C9 draft")));
        assert!(f.summary.contains("/box-create"));
        assert!(f.notes.iter().any(|n| n.contains("notify:email") && n.contains("\"email\"")));
    }

    #[test]
    fn given_a_japanese_task_needing_undeclared_capabilities_when_assessed_then_they_are_missing() {
        // R-FEAS-1: English AND Japanese keywords
        let m = manifest("browser:navigate, file:read", "");
        let f = assess(&m, "毎週月曜に売上レポートをメールで送る");
        assert!(!f.feasible);
        assert_eq!(f.missing_capabilities, vec!["cron:schedule", "notify:email"]);
        assert!(f.notes.iter().any(|n| n.starts_with("cron:schedule") && n.contains("毎週")));
        assert!(f.notes.iter().any(|n| n.starts_with("notify:email") && n.contains("メール")));
    }

    #[test]
    fn given_a_fully_covered_task_when_assessed_then_feasible_with_nothing_missing() {
        // R-FEAS-1
        let m = manifest("browser:navigate, browser:click, cron:schedule, notify:email", "network: filtered\nurl_allowlist: [\"*.example.com\"]\n");
        let f = assess(&m, "Every Monday, open https://shop.example.com/sales, click the first row and e-mail the totals");
        assert!(f.feasible, "{f:?}");
        assert!(f.missing_capabilities.is_empty());
        assert!(f.required_approvals.is_empty());
        assert!(f.summary.contains("/box-fulfill"));
    }

    #[test]
    fn given_a_missing_over_limit_capability_when_assessed_then_the_second_confirmation_is_required() {
        // R-FEAS-1, R-DRAFT-8
        let m = manifest("browser:navigate", "");
        let f = assess(&m, "Run the backup shell script and kill the stuck process");
        assert_eq!(f.missing_capabilities, vec!["process:kill", "shell:exec"]);
        assert!(f.required_approvals.iter().all(|a| a.contains("second over_limit confirmation")));
        let not_over = assess(&m, "メールで通知する");
        assert_eq!(not_over.missing_capabilities, vec!["notify:email"]);
        assert!(!not_over.required_approvals[0].contains("over_limit"));
    }

    #[test]
    fn given_online_or_a_line_of_text_when_assessed_then_notify_line_is_not_needed() {
        // R-FEAS-1: `LINE` is case-sensitive and whole-word
        let m = manifest("", "network: filtered\n");
        for task in ["Check the online store", "CHECK THE ONLINE STORE", "Count each line of text", "Meet the deadline"] {
            let f = assess(&m, task);
            assert!(!f.missing_capabilities.iter().any(|c| c == "notify:line"), "{task}: {f:?}");
        }
        let f = assess(&m, "結果をLINEで通知する");
        assert_eq!(f.missing_capabilities, vec!["notify:line"]);
        let f = assess(&m, "結果をＬＩＮＥで通知する");
        assert_eq!(f.missing_capabilities, vec!["notify:line"], "full-width is folded");
    }

    #[test]
    fn given_the_same_input_twice_when_assessed_then_the_json_is_identical() {
        // R-FEAS-1: deterministic
        let m = manifest("file:read", "file_access: [\"read:/data/*\"]\n");
        let task = "毎日 https://b.example.org と http://a.example.net を閲覧し、CSVを保存してメールとLINEで送る";
        let first = serde_json::to_string(&assess(&m, task)).expect("serializes");
        let second = serde_json::to_string(&assess(&m, task)).expect("serializes");
        assert_eq!(first, second);
        let f = assess(&m, task);
        assert_eq!(
            f.missing_capabilities,
            vec![
                "browser:navigate",
                "file:write",
                "cron:schedule",
                "notify:email",
                "notify:line",
                "network:filtered",
                "url_allowlist:b.example.org",
                "url_allowlist:a.example.net",
            ]
        );
    }

    #[test]
    fn given_an_assessment_when_serialized_then_it_has_exactly_the_seven_keys() {
        // R-FEAS-1
        let value = serde_json::to_value(assess(&manifest("", ""), "anything")).expect("serializes");
        let keys: BTreeSet<&str> = value.as_object().expect("an object").keys().map(String::as_str).collect();
        let expected: BTreeSet<&str> =
            ["feasible", "available_operations", "available_tools", "missing_capabilities", "required_approvals", "summary", "notes"].into_iter().collect();
        assert_eq!(keys, expected);
    }

    #[test]
    fn given_no_recognised_keyword_when_assessed_then_feasible_with_a_caveat() {
        // R-FEAS-1
        let f = assess(&manifest("", ""), "Summarise last quarter");
        assert!(f.feasible);
        assert!(f.notes.iter().any(|n| n == "no capability keywords recognised; the check is keyword-based and not a guarantee"));
        assert!(f.notes.iter().any(|n| n.contains("fail-closed")), "empty tools");
    }

    #[test]
    fn given_shell_declared_without_allowed_commands_when_assessed_then_a_fail_closed_note_is_given() {
        // R-FEAS-1, R-MAN-1: empty allowed_commands is fail-closed
        let f = assess(&manifest("shell:exec", ""), "Run the deploy command");
        assert!(f.feasible);
        assert!(f.notes.iter().any(|n| n.contains("shell.allowed_commands is empty")));
        let f = assess(&manifest("shell:exec", "shell: {allowed_commands: [git, ls]}\n"), "Run the deploy command");
        assert!(f.notes.iter().any(|n| n.contains("allowed_commands: git, ls")));
    }

    #[test]
    fn given_file_ops_needed_and_empty_file_access_when_assessed_then_a_note_is_given() {
        // R-FEAS-1
        let f = assess(&manifest("file:read", ""), "売上CSVを読み込む");
        assert!(f.feasible);
        assert!(f.notes.iter().any(|n| n.contains("file_access is empty")));
    }

    #[test]
    fn given_tool_aliases_when_assessed_then_they_cover_the_operation() {
        // R-FEAS-1, R-DRAFT-8: `Bash` is the tool spelling of shell:exec
        let f = assess(&manifest("", "tools: [Bash]\n"), "run a shell command");
        assert!(f.feasible);
        assert!(f.notes.iter().any(|n| n.contains("covered by the declared tool `Bash`")));
    }

    #[test]
    fn given_a_longer_keyword_of_another_capability_when_matched_then_the_inner_one_is_dropped() {
        // R-FEAS-1
        let m = manifest("", "");
        assert_eq!(assess(&m, "create a password for the new account").missing_capabilities, vec!["op:create"]);
        assert_eq!(assess(&m, "Double-click the icon").missing_capabilities, vec!["gui:mouse_click"]);
        assert_eq!(assess(&m, "アップルスクリプトを使う").missing_capabilities, vec!["applescript:execute"]);
        assert_eq!(assess(&m, "improve the team's skill").missing_capabilities, Vec::<String>::new());
    }

    #[test]
    fn given_network_none_and_a_web_task_when_assessed_then_network_filtered_is_missing() {
        // R-FEAS-1, seed 000 §3: raising network needs a new draft
        let f = assess(&manifest("browser:navigate", ""), "ウェブサイトで価格を確認");
        assert_eq!(f.missing_capabilities, vec!["network:filtered"]);
        assert!(f.required_approvals[0].contains("network is `none`"));
    }
}
