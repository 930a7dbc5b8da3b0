//! Tidy: workspace invariants checked by plain `cargo test`, in the style of
//! rust-analyzer's `xtask/src/tidy.rs`.
//!
//! Every rule is a pure function from parsed inputs (one `toml::Table` per crate
//! manifest, or the text of source files) to a list of violations. Each rule is
//! therefore tested twice: the real workspace must pass it, and a synthetic input
//! that breaks it must be reported, which proves that the check can fail at all.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

use toml::{Table, Value};

/// Package name of the pure core.
const DOMAIN_PACKAGE: &str = "atasira-domain";

/// Architecture Invariant: the domain crate does no IO. It must not depend directly
/// (normal or build dependencies; dev-dependencies are for its tests only) on a
/// runtime, a transport, a database driver, a wire format or an event-store adapter.
/// `cqrs-es` itself is allowed: its `Aggregate` trait is how the domain is shaped.
const DOMAIN_FORBIDDEN_DEPS: &[&str] =
    &["tokio", "async-nats", "sqlx", "prost", "prost-build", "axum", "hyper", "tonic", "reqwest", "postgres-es", "sqlite-es"];

/// Architecture Invariant: services never depend on each other; they talk only over
/// the bus. The gateway counts as a service here: it too reaches services only over
/// the bus. Package name and the directory the crate lives in, relative to the root.
const SERVICES: &[(&str, &str)] = &[
    ("atasira-drafts", "crates/drafts"),
    ("atasira-approval", "crates/approval"),
    ("atasira-provisioner", "crates/provisioner"),
    ("atasira-runtime-registry", "crates/runtime-registry"),
    ("atasira-audit", "crates/audit"),
    ("atasira-gateway", "crates/gateway"),
];

/// Source patterns that hide a test or a missing piece of code. They are assembled
/// with `concat!` so that this file does not contain them and can be scanned too.
const FORBIDDEN_PATTERNS: &[(&str, &str)] = &[
    (concat!("#[", "ignore"), "a test that does not run proves nothing: fix it or delete it"),
    (concat!("todo", "!("), "unfinished code panics at run time: return an error instead"),
    (concat!("unimplemented", "!("), "unfinished code panics at run time: return an error instead"),
    (concat!("#[", "should_panic"), "assert on the returned error (and its kind) instead of expecting a panic"),
];

/// The binary's crate: the one place that reads the environment (its clap config).
const BINARY_DIR: &str = "crates/atasira";

/// Calls that read the process environment at run time (`env!` is compile time).
const ENV_READS: &[&str] = &["env::var(", "env::var_os(", "env::vars(", "env::vars_os("];

/// Environment reads a library may make: (file, variable). The provisioner only checks
/// whether the user set `GIT_SSH_COMMAND` for the git it runs, which inherits it; it is
/// git's setting, not ours.
const ENV_READS_ALLOWED: &[(&str, &str)] = &[("crates/provisioner/src/setup.rs", "GIT_SSH_COMMAND")];

/// One workspace member as the checks see it.
#[derive(Debug, Clone)]
struct Member {
    /// Directory relative to the workspace root, e.g. `crates/domain`.
    dir: PathBuf,
    /// The parsed `Cargo.toml` of the member.
    manifest: Table,
}

impl Member {
    fn package_name(&self) -> Option<&str> {
        self.manifest.get("package")?.get("name")?.as_str()
    }

    /// Name used in violation messages: the package name, or the manifest path.
    fn label(&self) -> String {
        let manifest = self.dir.join("Cargo.toml");
        match self.package_name() {
            Some(name) => format!("{} ({name})", manifest.display()),
            None => manifest.display().to_string(),
        }
    }
}

/// Which dependency tables a check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DepKind {
    Normal,
    Build,
    Dev,
}

impl DepKind {
    /// Section names, including the old underscore spellings Cargo still accepts.
    fn sections(self) -> &'static [&'static str] {
        match self {
            DepKind::Normal => &["dependencies"],
            DepKind::Build => &["build-dependencies", "build_dependencies"],
            DepKind::Dev => &["dev-dependencies", "dev_dependencies"],
        }
    }
}

/// One dependency entry, resolved as far as the manifests allow.
#[derive(Debug, Clone)]
struct Dep {
    /// Where it was declared, e.g. `[dependencies]` or `[target.'cfg(unix)'.dependencies]`.
    section: String,
    /// The key in that table (the name the code imports it under).
    key: String,
    /// The package it points at, with `package = "..."` renames honoured, also
    /// through `[workspace.dependencies]` for `workspace = true` entries.
    package: String,
    /// Workspace-relative, lexically normalized directory of a path dependency.
    path: Option<PathBuf>,
}

/// All dependencies of `member` of the given kinds, including target-specific ones.
/// `workspace_deps` is the root `[workspace.dependencies]` table, used to resolve
/// `foo.workspace = true` and `foo = { workspace = true }` entries.
fn dependencies(member: &Member, workspace_deps: &Table, kinds: &[DepKind]) -> Vec<Dep> {
    let mut tables: Vec<(String, &Table)> = Vec::new();
    for kind in kinds {
        for section in kind.sections() {
            if let Some(table) = member.manifest.get(*section).and_then(Value::as_table) {
                tables.push((format!("[{section}]"), table));
            }
            let targets = member.manifest.get("target").and_then(Value::as_table);
            for (cfg, target) in targets.into_iter().flatten() {
                if let Some(table) = target.get(*section).and_then(Value::as_table) {
                    tables.push((format!("[target.'{cfg}'.{section}]"), table));
                }
            }
        }
    }

    let mut deps = Vec::new();
    for (section, table) in tables {
        for (key, value) in table {
            let (package, path) = resolve(key, value, &member.dir, workspace_deps);
            deps.push(Dep { section: section.clone(), key: key.clone(), package, path });
        }
    }
    deps
}

/// Resolves one dependency entry to (package name, workspace-relative path).
fn resolve(key: &str, value: &Value, member_dir: &Path, workspace_deps: &Table) -> (String, Option<PathBuf>) {
    let Some(entry) = value.as_table() else {
        // `foo = "1"`: a registry dependency on package `foo`.
        return (key.to_owned(), None);
    };
    let inherited = entry.get("workspace").and_then(Value::as_bool) == Some(true);
    if inherited {
        // Paths in `[workspace.dependencies]` are relative to the workspace root.
        return match workspace_deps.get(key) {
            Some(Value::Table(ws)) => (package_of(key, ws), ws.get("path").and_then(Value::as_str).map(|p| normalize(Path::new(p)))),
            _ => (key.to_owned(), None),
        };
    }
    (package_of(key, entry), entry.get("path").and_then(Value::as_str).map(|p| normalize(&member_dir.join(p))))
}

fn package_of(key: &str, entry: &Table) -> String {
    entry.get("package").and_then(Value::as_str).unwrap_or(key).to_owned()
}

/// Lexical normalization (`crates/drafts/../approval` -> `crates/approval`), so that
/// path dependencies compare equal to member directories without touching the disk.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Architecture Invariant: the domain crate (`atasira-domain`) has no IO dependencies.
/// See [`DOMAIN_FORBIDDEN_DEPS`].
fn check_domain_has_no_io_deps(members: &[Member], workspace_deps: &Table) -> Vec<String> {
    let mut violations = Vec::new();
    for member in members.iter().filter(|m| m.package_name() == Some(DOMAIN_PACKAGE)) {
        for dep in dependencies(member, workspace_deps, &[DepKind::Normal, DepKind::Build]) {
            let forbidden = DOMAIN_FORBIDDEN_DEPS.iter().find(|name| **name == dep.package || **name == dep.key);
            if let Some(name) = forbidden {
                violations.push(format!(
                    "{}: {} `{}` pulls in `{name}`; Architecture Invariant: the domain crate does no IO, \
                     move this to an adapter crate (platform, contracts, a service)",
                    member.label(),
                    dep.section,
                    dep.key,
                ));
            }
        }
    }
    violations
}

/// Architecture Invariant: no service crate depends on another service crate, by name
/// or by a path into its directory; services talk only over the bus. Dev-dependencies
/// count too: a test that needs two services belongs in `tests/`.
fn check_services_are_independent(members: &[Member], workspace_deps: &Table) -> Vec<String> {
    let service_names: BTreeSet<&str> = SERVICES.iter().map(|(name, _)| *name).collect();
    // The conventional directories, plus wherever a service crate actually lives.
    let mut service_dirs: BTreeSet<PathBuf> = SERVICES.iter().map(|(_, dir)| PathBuf::from(dir)).collect();
    for member in members {
        if member.package_name().is_some_and(|n| service_names.contains(n)) {
            service_dirs.insert(normalize(&member.dir));
        }
    }

    let mut violations = Vec::new();
    let services = members.iter().filter(|m| m.package_name().is_some_and(|n| service_names.contains(n)));
    for member in services {
        let own_dir = normalize(&member.dir);
        let kinds = [DepKind::Normal, DepKind::Build, DepKind::Dev];
        for dep in dependencies(member, workspace_deps, &kinds) {
            let by_name = service_names.contains(dep.package.as_str());
            let by_path = dep.path.as_ref().is_some_and(|p| *p != own_dir && service_dirs.contains(p));
            if by_name || by_path {
                let target = match &dep.path {
                    Some(path) => format!("`{}` (path {})", dep.package, path.display()),
                    None => format!("`{}`", dep.package),
                };
                violations.push(format!(
                    "{}: {} `{}` is the service {target}; Architecture Invariant: services never \
                     depend on each other, they talk only over the bus",
                    member.label(),
                    dep.section,
                    dep.key,
                ));
            }
        }
    }
    violations
}

/// No test is switched off and no code is left unfinished: see [`FORBIDDEN_PATTERNS`].
/// `files` holds (workspace-relative path, contents) pairs.
fn check_forbidden_patterns(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files {
        for (line_no, line) in text.lines().enumerate() {
            for (pattern, why) in FORBIDDEN_PATTERNS {
                if line.contains(pattern) {
                    violations.push(format!("{}:{}: `{pattern}`: {why}\n    {}", path.display(), line_no + 1, line.trim(),));
                }
            }
        }
    }
    violations
}

/// No two modules of a crate import each other, directly or around a circle. A node is a
/// crate's top-level module (`src/<m>.rs` or `src/<m>/`); its non-test code naming
/// `crate::<other>` (or `crate::{<other>, ...}`) is an edge. Returns each circle found, as
/// `crate: a -> b -> ... -> a`.
fn check_no_import_circles(files: &[(PathBuf, String)]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut crates: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (path, text) in files {
        let parts: Vec<String> = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let ["crates", krate, "src", rest @ ..] = parts.as_slice() else { continue };
        let Some(first) = rest.first() else { continue };
        let module = first.trim_end_matches(".rs");
        let krate = *krate;
        if rest.len() == 1 && ["lib", "main"].contains(&module) {
            continue;
        }
        crates.entry(krate.to_owned()).or_default().entry(module.to_owned()).or_default().push_str(&non_test_code(path, text));
    }
    let mut violations = Vec::new();
    for (krate, modules) in &crates {
        let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
        let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (module, code) in modules {
            let targets = edges.entry(module.as_str()).or_default();
            for after in code.split("crate::").skip(1) {
                let named: Vec<&str> = match after.strip_prefix('{') {
                    Some(group) => {
                        group.split('}').next().unwrap_or_default().split(',').map(|item| item.trim().split("::").next().unwrap_or_default()).collect()
                    }
                    None => vec![after.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or_default()],
                };
                for name in named {
                    if let Some(&other) = names.get(name)
                        && other != module
                    {
                        targets.insert(other);
                    }
                }
            }
        }
        // A circle through `start`: a path from one of its targets back to it.
        let mut reported = BTreeSet::new();
        for &start in &names {
            let mut stack: Vec<Vec<&str>> = vec![vec![start]];
            let mut seen = BTreeSet::new();
            while let Some(path) = stack.pop() {
                let last = *path.last().unwrap_or(&start);
                for &next in edges.get(last).into_iter().flatten() {
                    if next == start {
                        let mut circle: Vec<&str> = path.clone();
                        let members: BTreeSet<&str> = circle.iter().copied().collect();
                        if reported.insert(members) {
                            circle.push(start);
                            violations.push(format!("{krate}: {}", circle.join(" -> ")));
                        }
                    } else if seen.insert(next) {
                        let mut longer = path.clone();
                        longer.push(next);
                        stack.push(longer);
                    }
                }
            }
        }
    }
    violations
}

/// The integration tests start commands only with a bound (`harness::OutputWithin`): a
/// hung tool fails its test instead of hanging the suite.
fn check_subprocesses_are_bounded(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files.iter().filter(|(p, _)| p.starts_with("tests") && !p.ends_with("tidy.rs")) {
        for (line_no, line) in text.lines().enumerate() {
            if line.contains(".output()") {
                violations.push(format!(
                    "{}:{}: `.output()` waits for ever; use `.output_within(SUBPROCESS_LIMIT)` (harness::OutputWithin)",
                    path.display(),
                    line_no + 1
                ));
            }
        }
    }
    violations
}

/// Every member inherits `[workspace.lints]` (`[lints] workspace = true`), so that the
/// lint policy lives in one place and a new crate cannot silently opt out of it.
fn check_lints_inherited(members: &[Member]) -> Vec<String> {
    members
        .iter()
        .filter(|m| {
            let inherits = m.manifest.get("lints").and_then(|lints| lints.get("workspace")).and_then(Value::as_bool);
            inherits != Some(true)
        })
        .map(|m| format!("{}: missing `[lints] workspace = true`", m.label()))
        .collect()
}

/// Crates are flat under `crates/` and named like their directory (`crates/foo` is
/// `atasira-foo`, the binary `crates/atasira` is `atasira`). The service rule relies
/// on it: a service crate under another name would slip past [`SERVICES`].
fn check_crate_names_match_dirs(members: &[Member]) -> Vec<String> {
    let mut violations = Vec::new();
    for member in members {
        let mut components = member.dir.components();
        let (Some(Component::Normal(parent)), Some(Component::Normal(dir)), None) = (components.next(), components.next(), components.next()) else {
            continue;
        };
        if parent != "crates" {
            continue;
        }
        let dir = dir.to_string_lossy();
        let expected = if dir == "atasira" { "atasira".to_owned() } else { format!("atasira-{dir}") };
        if member.package_name() != Some(expected.as_str()) {
            violations.push(format!("{}: the package in `{}` should be named `{expected}`", member.label(), member.dir.display(),));
        }
    }
    violations
}

/// Every `tests/*.rs` file is a test target. The tests package keeps its files at its
/// root, where Cargo discovers nothing by itself: a file without a `[[test]]` entry in
/// `tests/Cargo.toml` is never compiled, so its tests silently never run. Exempt are the
/// package's library (`[lib] path`) and the modules that library declares (`mod x;`).
/// `files` are the file names in `tests/`; `lib_rs` is the library's source.
fn check_test_files_registered(manifest: &Table, files: &[String], lib_rs: &str) -> Vec<String> {
    let lib = manifest.get("lib").and_then(|lib| lib.get("path")).and_then(Value::as_str).unwrap_or("lib.rs");
    let modules: BTreeSet<String> = declared_modules(lib_rs).into_iter().map(|m| format!("{m}.rs")).collect();
    let registered: BTreeSet<PathBuf> = manifest
        .get("test")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|target| target.get("path").and_then(Value::as_str))
        .map(|path| normalize(Path::new(path)))
        .collect();
    files
        .iter()
        .filter(|file| file.ends_with(".rs"))
        .filter(|file| normalize(Path::new(file.as_str())) != normalize(Path::new(lib)) && !modules.contains(file.as_str()))
        .filter(|file| !registered.contains(&normalize(Path::new(file.as_str()))))
        .map(|file| {
            let name = file.trim_end_matches(".rs");
            format!(
                "tests/{file} is not a test target, so it never runs: add\n    [[test]]\n    name = \"{name}\"\n    path = \"{file}\"\n  \
                 to tests/Cargo.toml (or declare it as a module in tests/{lib})"
            )
        })
        .collect()
}

/// The names of the modules `source` declares in files of their own (`mod x;`,
/// `pub mod x;`, `pub(crate) mod x;`); inline modules (`mod x { ... }`) have no file.
fn declared_modules(source: &str) -> Vec<String> {
    let mut modules = Vec::new();
    for line in source.lines() {
        let mut rest = line.trim();
        if let Some(after) = rest.strip_prefix("pub") {
            rest = after.trim_start();
            if rest.starts_with('(') {
                let Some(close) = rest.find(')') else { continue };
                rest = rest[close + 1..].trim_start();
            }
        }
        let Some(after) = rest.strip_prefix("mod ") else { continue };
        if let Some(name) = after.trim().strip_suffix(';') {
            modules.push(name.trim().to_owned());
        }
    }
    modules
}

/// Libraries take their settings as parameters: only the binary (`crates/atasira`)
/// reads the environment, through its clap config, so that `atasira <cmd> --help` lists
/// every setting. Checked in `crates/*/src/` (build scripts and a crate's own `tests/`
/// may read what Cargo or the test runner sets). `(file, variable)` pairs in [`ENV_READS_ALLOWED`] are exempt.
/// `files` holds (workspace-relative path, contents) pairs.
fn check_libraries_read_no_env(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files {
        let mut components = path.components().map(|c| c.as_os_str().to_string_lossy());
        let in_library_src = components.next().as_deref() == Some("crates") && components.nth(1).as_deref() == Some("src");
        if !in_library_src || path.starts_with(BINARY_DIR) {
            continue;
        }
        for (line_no, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if !ENV_READS.iter().any(|pattern| code.contains(pattern)) {
                continue;
            }
            let allowed = ENV_READS_ALLOWED.iter().any(|(file, var)| path == Path::new(file) && code.contains(&format!("\"{var}\"")));
            if !allowed {
                violations.push(format!(
                    "{}:{}: a library reads the environment; take the setting as a parameter and give the binary's \
                     clap config an `env = \"ATASIRA_...\"` argument for it\n    {}",
                    path.display(),
                    line_no + 1,
                    line.trim(),
                ));
            }
        }
    }
    violations
}

/// The contract between processes is typed: no message in `proto/` carries a JSON document
/// in a `bytes`/`string` field named `..._json`, except the stored event payload of
/// `EventNotification` (events are stored as JSON by the event store). `files` holds
/// (workspace-relative path, contents) pairs of `.proto` files.
fn check_proto_has_no_json_fields(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (path, text) in files {
        let mut message = String::new();
        for (line_no, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default().trim();
            if let Some(rest) = code.strip_prefix("message ") {
                message = rest.split_whitespace().next().unwrap_or_default().to_owned();
            }
            let mut words = code.split_whitespace().filter(|w| *w != "repeated" && *w != "optional");
            let (Some(kind), Some(name)) = (words.next(), words.next()) else { continue };
            let allowed = message == "EventNotification" && name == "payload_json";
            if matches!(kind, "bytes" | "string") && name.ends_with("_json") && !allowed {
                violations.push(format!("{}:{}: {message}.{name} carries JSON; give it a typed message", path.display(), line_no + 1));
            }
        }
    }
    violations
}

/// The subject constants of `atasira_contracts::subjects` naming a process, and the
/// identity each names.
const PROCESS_CONSTANTS: &[(&str, &str)] = &[
    ("DRAFTS", "drafts"),
    ("APPROVAL", "approval"),
    ("PROVISIONER", "provisioner"),
    ("RUNTIME_REGISTRY", "runtime-registry"),
    ("AUDIT", "audit"),
    ("GATEWAY", "gateway"),
];

/// Code outside tests: a file's text before its first `#[cfg(test)]`, and no `tests.rs`.
fn non_test_code(path: &Path, text: &str) -> String {
    if path.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    text.split("#[cfg(test)]").next().unwrap_or_default().to_owned()
}

/// R-ARCH-10: the NATS permissions are derived from `subjects::ROUTES`, so a request the
/// code sends outside it would be refused by nats-server in cluster mode. In each service
/// crate (`crates/<identity>`) that builds a request subject (`subjects::request(`), the
/// sender is the crate's own identity (`SERVICE` or its own constant), and every other
/// process the code names (`subjects::DRAFTS`, ...) is a route from it. `files` holds
/// (workspace-relative path, contents) pairs.
fn check_requests_follow_routes(files: &[(PathBuf, String)], routes: &[(&str, &str)]) -> Vec<String> {
    let mut violations = Vec::new();
    for (_, dir) in SERVICES {
        let identity = dir.trim_start_matches("crates/");
        let own = PROCESS_CONSTANTS.iter().find(|(_, name)| *name == identity).map(|(c, _)| *c).unwrap_or_default();
        let code: Vec<(&PathBuf, String)> = files.iter().filter(|(p, _)| p.starts_with(dir)).map(|(p, t)| (p, non_test_code(p, t))).collect();
        // A process sends through its `Client` (or names a request subject itself).
        let sends = ["subjects::request(", "Client::new("];
        if !code.iter().any(|(_, c)| sends.iter().any(|s| c.contains(s))) {
            continue;
        }
        for (path, text) in &code {
            for (line_no, line) in text.lines().enumerate() {
                let line = line.split("//").next().unwrap_or_default();
                for call in sends.iter().flat_map(|s| line.split(s).skip(1)) {
                    let from = call.split(',').next().unwrap_or_default().trim();
                    if from != "SERVICE" && from != format!("subjects::{own}") {
                        violations.push(format!("{}:{}: {identity} sends a request as `{from}`; it may only speak as itself", path.display(), line_no + 1));
                    }
                }
                // Naming who may send a request (`Call::only_from`) is no request.
                if line.contains("only_from(") {
                    continue;
                }
                for (constant, to) in PROCESS_CONSTANTS.iter().filter(|(_, name)| *name != identity) {
                    let mentioned = line
                        .match_indices(&format!("subjects::{constant}"))
                        .any(|(i, m)| !line[i + m.len()..].starts_with(|c: char| c == '_' || c.is_ascii_alphanumeric()));
                    if mentioned && !routes.contains(&(identity, *to)) {
                        violations.push(format!(
                            "{}:{}: {identity} names the {to} service, but ({identity:?}, {to:?}) is not in subjects::ROUTES: \
                             nats-server would refuse the request; add the route (and say why) or do not send it",
                            path.display(),
                            line_no + 1
                        ));
                    }
                }
            }
        }
    }
    violations
}

/// ARCHITECTURE.md shows the NATS permission table between these markers; it must be
/// exactly what `permission_table` renders from `contracts::subjects`.
const TABLE_START: &str = "<!-- permission table: generated from crates/contracts/src/subjects.rs; tests/tidy.rs checks it -->";
const TABLE_END: &str = "<!-- end of permission table -->";

/// The permission table as Markdown, from `contracts::subjects` (the one source).
fn permission_table() -> String {
    use atasira_contracts::subjects;
    let list = |subjects: &[String]| subjects.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
    let mut table = String::from("| NATS user | may publish | may subscribe |\n|---|---|---|\n");
    for identity in subjects::IDENTITIES.iter().chain([&subjects::OPERATOR]) {
        let p = subjects::permissions(identity);
        table.push_str(&format!("| `{identity}` | {} | {} |\n", list(&p.publish), list(&p.subscribe)));
    }
    let hash = "H";
    let shown = |p: subjects::Permissions| subjects::Permissions {
        publish: p.publish.iter().map(|s| s.replace(&"0".repeat(64), hash)).collect(),
        subscribe: p.subscribe.iter().map(|s| s.replace(&"0".repeat(64), hash)).collect(),
        ..p
    };
    let listener = subjects::permissions_of(subjects::TRIGGER_LISTENER);
    table.push_str(&format!(
        "| `{}` (the runtime registry's second connection) | {} | {}, never {} |\n",
        subjects::TRIGGER_LISTENER,
        list(&listener.publish),
        list(&listener.subscribe),
        list(&listener.deny_subscribe)
    ));
    let topics = ["T".to_owned()];
    for (who, admin) in [
        ("NATS publisher, member (PAT hash `H`; `T`: each topic of the event Boxes it may start)", false),
        ("NATS publisher, admin (PAT hash `H`; `T` likewise)", true),
    ] {
        let p = shown(subjects::client_permissions(&"0".repeat(64), admin, &topics).expect("a hash"));
        table.push_str(&format!("| {who} | {} | {} |\n", list(&p.publish), list(&p.subscribe)));
    }
    let p = subjects::host_permissions("host-name").expect("a host name");
    let named = |s: &[String]| list(&s.iter().map(|s| s.replace("host-name", "N")).collect::<Vec<_>>());
    table.push_str(&format!("| execution host `N` (`host-N`) | {} | {} |\n", named(&p.publish), named(&p.subscribe)));
    table
}

/// The text between the table markers of ARCHITECTURE.md, if both are there.
fn documented_table(architecture: &str) -> Option<&str> {
    let start = architecture.find(TABLE_START)? + TABLE_START.len();
    let end = architecture[start..].find(TABLE_END)? + start;
    Some(architecture[start..end].trim_matches('\n'))
}

fn proto_files() -> Vec<(PathBuf, String)> {
    let dir = root().join("proto/atasira/v1");
    let mut files: Vec<(PathBuf, String)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .map(|p| (p.strip_prefix(root()).unwrap_or(&p).to_path_buf(), read(&p)))
        .collect();
    files.sort();
    files
}

// ---------------------------------------------------------------------------------
// Loading the real workspace.

fn root() -> PathBuf {
    atasira_tests::workspace_root()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()))
}

fn parse(path: &Path, text: &str) -> Table {
    text.parse::<Table>().unwrap_or_else(|e| panic!("failed to parse {}: {e}", path.display()))
}

/// `crates/*/Cargo.toml` and `tests/Cargo.toml`, sorted by directory.
fn workspace_members() -> Vec<Member> {
    let root = root();
    let crates = root.join("crates");
    let entries = fs::read_dir(&crates).unwrap_or_else(|e| panic!("failed to list {}: {e}", crates.display()));
    let mut dirs: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap_or_else(|e| panic!("failed to list {}: {e}", crates.display())))
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| PathBuf::from("crates").join(entry.file_name()))
        .collect();
    dirs.sort();
    dirs.push(PathBuf::from("tests"));

    dirs.into_iter()
        .map(|dir| {
            let path = root.join(&dir).join("Cargo.toml");
            let manifest = parse(&path, &read(&path));
            Member { dir, manifest }
        })
        .collect()
}

/// The root `[workspace.dependencies]` table.
fn workspace_deps() -> Table {
    let path = root().join("Cargo.toml");
    let manifest = parse(&path, &read(&path));
    manifest.get("workspace").and_then(|ws| ws.get("dependencies")).and_then(Value::as_table).cloned().unwrap_or_default()
}

/// Every `.rs` file under `crates/` and `tests/`, skipping build output.
fn workspace_sources() -> Vec<(PathBuf, String)> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, String)>) {
        let dir = root.join(rel);
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display()));
            let name = entry.file_name();
            let name_str = name.to_string_lossy();
            if name_str.starts_with('.') || name_str == "target" {
                continue;
            }
            let rel = rel.join(&name);
            let file_type = entry.file_type().unwrap_or_else(|e| panic!("failed to stat {}: {e}", rel.display()));
            if file_type.is_dir() {
                walk(root, &rel, out);
            } else if name_str.ends_with(".rs") {
                let text = read(&root.join(&rel));
                out.push((rel, text));
            }
        }
    }

    let root = root();
    let mut files = Vec::new();
    for top in ["crates", "tests"] {
        walk(&root, Path::new(top), &mut files);
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// The `.rs` files directly in `tests/` (names only), sorted.
fn test_dir_files() -> Vec<String> {
    let dir = root().join("tests");
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display()));
    let mut files: Vec<String> = entries
        .map(|entry| entry.unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display())))
        .filter(|entry| entry.path().is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rs"))
        .collect();
    files.sort();
    files
}

#[track_caller]
fn assert_clean(rule: &str, violations: &[String]) {
    assert!(violations.is_empty(), "{rule}: {} violation(s):\n{}", violations.len(), violations.join("\n"));
}

/// Asserts that `violations` has one entry per needle and every needle is mentioned.
#[track_caller]
fn assert_reported(violations: &[String], needles: &[&str]) {
    assert_eq!(violations.len(), needles.len(), "expected {} violation(s) mentioning {needles:?}, got:\n{}", needles.len(), violations.join("\n"));
    for needle in needles {
        assert!(violations.iter().any(|v| v.contains(needle)), "expected a violation mentioning `{needle}`, got:\n{}", violations.join("\n"));
    }
}

/// A synthetic member for the negative tests.
fn member(dir: &str, manifest: &str) -> Member {
    Member { dir: PathBuf::from(dir), manifest: parse(Path::new(dir), manifest) }
}

fn table(text: &str) -> Table {
    parse(Path::new("<synthetic workspace>"), text)
}

// ---------------------------------------------------------------------------------
// The real workspace passes.

#[test]
fn workspace_domain_has_no_io_deps() {
    let members = workspace_members();
    assert!(
        members.iter().any(|m| m.package_name() == Some(DOMAIN_PACKAGE)),
        "no `{DOMAIN_PACKAGE}` found among {:?}: the domain rule would check nothing",
        members.iter().map(|m| m.dir.display().to_string()).collect::<Vec<_>>()
    );
    assert_clean("Architecture Invariant: the domain crate does no IO", &check_domain_has_no_io_deps(&members, &workspace_deps()));
}

#[test]
fn workspace_services_are_independent() {
    assert_clean("Architecture Invariant: services never depend on each other", &check_services_are_independent(&workspace_members(), &workspace_deps()));
}

#[test]
fn workspace_has_no_ignored_or_unfinished_code() {
    let files = workspace_sources();
    assert!(files.iter().any(|(path, _)| path.ends_with("tidy.rs")), "the source walk missed tests/tidy.rs; it scanned {} file(s)", files.len());
    assert_clean("no ignored tests, expected panics or unfinished code", &check_forbidden_patterns(&files));
}

#[test]
fn workspace_modules_import_each_other_in_no_circle() {
    let files = workspace_sources();
    assert!(files.iter().any(|(p, t)| p.starts_with("crates/gateway/src") && t.contains("use crate::api")), "the gateway's modules were not found");
    assert_clean("no two modules of a crate import each other, directly or around a circle", &check_no_import_circles(&files));
    let circle = [
        (PathBuf::from("crates/x/src/a.rs"), "use crate::b::B;\n".to_owned()),
        (PathBuf::from("crates/x/src/b/mod.rs"), "use crate::{c, d};\n".to_owned()),
        (PathBuf::from("crates/x/src/c.rs"), "fn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests { use crate::b; }\n".to_owned()),
        (PathBuf::from("crates/x/src/d.rs"), "// nothing\n".to_owned()),
        (PathBuf::from("crates/x/src/lib.rs"), "pub mod a; use crate::b;\n".to_owned()),
    ];
    assert_reported(&check_no_import_circles(&circle), &["x: "]);
    let v = check_no_import_circles(&circle);
    assert_eq!(v.len(), 1, "one circle, reported once: {v:?}");
    assert!(["a", "b", "c"].iter().all(|m| v[0].contains(m)) && !v[0].contains('d'), "{v:?}");
    // The same modules without the edge back: no circle.
    let line = [(PathBuf::from("crates/x/src/a.rs"), "use crate::b::B;\n".to_owned()), (PathBuf::from("crates/x/src/b.rs"), "use crate::{c};\n".to_owned())];
    assert!(check_no_import_circles(&line).is_empty());
}

#[test]
fn workspace_test_subprocesses_are_bounded() {
    let files = workspace_sources();
    assert!(files.iter().any(|(p, t)| p.starts_with("tests") && t.contains(".output_within(")), "the tests' commands were not found");
    assert_clean("every command a test starts has a time limit", &check_subprocesses_are_bounded(&files));
    let unbounded = [(PathBuf::from("tests/x.rs"), "let out = Command::new(\"python\").output().expect(\"runs\");".to_owned())];
    assert_reported(&check_subprocesses_are_bounded(&unbounded), &["tests/x.rs:1"]);
}

#[test]
fn workspace_crates_inherit_lints() {
    assert_clean("every crate inherits [workspace.lints]", &check_lints_inherited(&workspace_members()));
}

#[test]
fn workspace_crates_are_named_like_their_dirs() {
    assert_clean("crates are named like their directory", &check_crate_names_match_dirs(&workspace_members()));
}

#[test]
fn workspace_test_files_are_registered() {
    let path = root().join("tests/Cargo.toml");
    let manifest = parse(&path, &read(&path));
    let lib = manifest.get("lib").and_then(|lib| lib.get("path")).and_then(Value::as_str).unwrap_or("lib.rs");
    let lib_rs = read(&root().join("tests").join(lib));
    let files = test_dir_files();
    assert!(files.iter().any(|f| f == "tidy.rs"), "the listing of tests/ missed tidy.rs: {files:?}");
    assert!(!declared_modules(&lib_rs).is_empty(), "tests/{lib} declares no module; the exemption would cover nothing");
    assert_clean("every tests/*.rs file is a test target", &check_test_files_registered(&manifest, &files, &lib_rs));
}

#[test]
fn proto_messages_carry_no_json_but_the_event_payload() {
    let files = proto_files();
    assert!(files.len() >= 5, "found only {files:?}");
    assert_clean("typed messages in proto/", &check_proto_has_no_json_fields(&files));
}

#[test]
fn a_json_field_in_a_proto_message_is_reported() {
    let proto = "message DecisionReply {\n  bytes body_json = 1; // the answer\n}\nmessage EventNotification {\n  bytes payload_json = 8;\n  repeated string rows_json = 9;\n}\n";
    let v = check_proto_has_no_json_fields(&[(PathBuf::from("x.proto"), proto.to_owned())]);
    assert_reported(&v, &["DecisionReply.body_json", "EventNotification.rows_json"]);
}

#[test]
fn workspace_requests_follow_the_routes_nats_permits() {
    let files = workspace_sources();
    assert!(files.iter().any(|(p, t)| p.starts_with("crates/gateway") && t.contains("Client::new(subjects::GATEWAY")), "the gateway's requests were not found");
    assert_clean("requests follow subjects::ROUTES", &check_requests_follow_routes(&files, atasira_contracts::subjects::ROUTES));
}

#[test]
fn architecture_shows_the_permission_table_the_code_has() {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    let expected = permission_table();
    let documented = documented_table(&architecture).unwrap_or_else(|| panic!("ARCHITECTURE.md has no {TABLE_START} ... {TABLE_END} section"));
    assert_eq!(documented, expected.trim_end(), "ARCHITECTURE.md's permission table is stale; put this between the markers:\n{expected}");
}

#[test]
fn a_request_outside_the_routes_is_reported() {
    let code = "fn f() {\n    bus.request(&subjects::request(SERVICE, subjects::AUDIT), h, p, t);\n    subjects::request(subjects::GATEWAY, x);\n}\n\
                #[cfg(test)]\nmod tests { fn g() { subjects::request(subjects::GATEWAY, subjects::DRAFTS); } }\n";
    let files = [(PathBuf::from("crates/approval/src/lib.rs"), code.to_owned()), (PathBuf::from("crates/approval/src/tests.rs"), code.to_owned())];
    let routes = [("approval", "runtime-registry")];
    assert_reported(&check_requests_follow_routes(&files, &routes), &["names the audit service", "as `subjects::GATEWAY`", "names the gateway service"]);
    // RUNTIME_REGISTRY is a route; a longer constant sharing a prefix is not a process.
    let fine = "subjects::request(SERVICE, subjects::RUNTIME_REGISTRY); subjects::AUDIT_LOG;\ncall.only_from(&[subjects::GATEWAY], \"deciding\")?;";
    assert_clean("routes", &check_requests_follow_routes(&[(PathBuf::from("crates/approval/src/lib.rs"), fine.to_owned())], &routes));
    // A process's client speaks as the process, and what it calls is held to the routes too.
    let client = "let c = Client::new(subjects::GATEWAY, bus, keys, t);\nc.call(subjects::AUDIT, p, &r, \"\").await;";
    let files = [(PathBuf::from("crates/approval/src/lib.rs"), client.to_owned())];
    assert_reported(&check_requests_follow_routes(&files, &routes), &["as `subjects::GATEWAY`", "names the audit service", "names the gateway service"]);
}

#[test]
fn workspace_libraries_read_no_env() {
    assert_clean("only the binary reads the environment", &check_libraries_read_no_env(&workspace_sources()));
}

// ---------------------------------------------------------------------------------
// Each check can fail.

#[test]
fn domain_with_tokio_version_is_reported() {
    let domain = member(
        "crates/domain",
        r#"
        [package]
        name = "atasira-domain"

        [dependencies]
        serde = "1"
        tokio = "1"
        "#,
    );
    let violations = check_domain_has_no_io_deps(&[domain], &Table::new());
    assert_reported(&violations, &["`tokio`"]);
}

#[test]
fn domain_with_workspace_inherited_io_deps_is_reported() {
    let domain = member(
        "crates/domain",
        r#"
        [package]
        name = "atasira-domain"

        [dependencies]
        cqrs-es.workspace = true
        sqlx.workspace = true
        axum = { workspace = true }

        [build-dependencies]
        prost-build = { workspace = true }
        "#,
    );
    let ws = table(
        r#"
        cqrs-es = "0.5"
        sqlx = { version = "0.8", features = ["postgres"] }
        axum = "0.8"
        prost-build = "0.13"
        "#,
    );
    let violations = check_domain_has_no_io_deps(&[domain], &ws);
    assert_reported(&violations, &["`sqlx`", "`axum`", "`prost-build`"]);
}

#[test]
fn domain_with_renamed_or_target_specific_io_deps_is_reported() {
    let domain = member(
        "crates/domain",
        r#"
        [package]
        name = "atasira-domain"

        [dependencies]
        db = { package = "sqlx", version = "0.8" }
        bus.workspace = true

        [target.'cfg(unix)'.dependencies]
        tokio = { version = "1", features = ["rt"] }
        "#,
    );
    let ws = table(r#"bus = { package = "async-nats", version = "0.40" }"#);
    let violations = check_domain_has_no_io_deps(&[domain], &ws);
    assert_reported(&violations, &["`sqlx`", "`async-nats`", "`tokio`"]);
}

#[test]
fn domain_may_use_cqrs_es_and_io_in_dev_deps_only() {
    let domain = member(
        "crates/domain",
        r#"
        [package]
        name = "atasira-domain"

        [dependencies]
        cqrs-es = "0.5"

        [dev-dependencies]
        tokio = { version = "1", features = ["macros", "rt"] }
        "#,
    );
    let adapter = member(
        "crates/platform",
        r#"
        [package]
        name = "atasira-platform"

        [dependencies]
        tokio = "1"
        sqlx = "0.8"
        "#,
    );
    assert_clean("dev-deps of the domain and deps of other crates are allowed", &check_domain_has_no_io_deps(&[domain, adapter], &Table::new()));
}

#[test]
fn service_depending_on_service_by_path_is_reported() {
    let drafts = member(
        "crates/drafts",
        r#"
        [package]
        name = "atasira-drafts"

        [dependencies]
        atasira-domain = { path = "../domain" }
        atasira-approval = { path = "../approval" }
        approval-impl = { path = "../approval/" }
        "#,
    );
    let violations = check_services_are_independent(&[drafts], &Table::new());
    assert_reported(&violations, &["`atasira-approval`", "`approval-impl`"]);
}

#[test]
fn service_depending_on_service_via_workspace_is_reported() {
    let drafts = member(
        "crates/drafts",
        r#"
        [package]
        name = "atasira-drafts"

        [dependencies]
        atasira-approval.workspace = true
        "#,
    );
    let gateway = member(
        "crates/gateway",
        r#"
        [package]
        name = "atasira-gateway"

        [dev-dependencies]
        audit = { workspace = true }
        "#,
    );
    // A workspace entry that hides the service behind another key and a moved path.
    let ws = table(
        r#"
        atasira-approval = { path = "crates/approval" }
        audit = { path = "services/audit", package = "atasira-audit" }
        "#,
    );
    let violations = check_services_are_independent(&[drafts, gateway], &ws);
    assert_reported(&violations, &["`atasira-approval`", "`atasira-audit`"]);
}

#[test]
fn service_depending_on_moved_service_dir_is_reported() {
    // The provisioner lives somewhere unconventional; a path into it still counts.
    let provisioner = member(
        "services/provisioner",
        r#"
        [package]
        name = "atasira-provisioner"
        "#,
    );
    let registry = member(
        "crates/runtime-registry",
        r#"
        [package]
        name = "atasira-runtime-registry"

        [build-dependencies]
        helper = { path = "../../services/provisioner" }
        "#,
    );
    let violations = check_services_are_independent(&[provisioner, registry], &Table::new());
    assert_reported(&violations, &["`helper`"]);
}

#[test]
fn non_services_may_depend_on_services() {
    let binary = member(
        "crates/atasira",
        r#"
        [package]
        name = "atasira"

        [dependencies]
        atasira-drafts = { path = "../drafts" }
        atasira-gateway.workspace = true
        "#,
    );
    let audit = member(
        "crates/audit",
        r#"
        [package]
        name = "atasira-audit"

        [dependencies]
        atasira-domain.workspace = true
        atasira-platform = { path = "../platform" }
        "#,
    );
    let ws = table(r#"atasira-gateway = { path = "crates/gateway" }"#);
    assert_clean("the binary may wire services together; services may use shared crates", &check_services_are_independent(&[binary, audit], &ws));
}

#[test]
fn forbidden_patterns_are_reported_with_location() {
    // Built at run time for the same reason as FORBIDDEN_PATTERNS.
    let ignore = concat!("#[", "ignore", "]");
    let should_panic = concat!("#[", "should_panic", "(expected = \"boom\")]");
    let todo = concat!("todo", "!()");
    let unimplemented = concat!("unimplemented", "!(\"later\")");
    let bad = format!(
        "#[test]\n{ignore}\nfn slow() {{}}\n\n#[test]\n{should_panic}\nfn boom() {{}}\n\
         fn a() {{ {todo} }}\nfn b() {{ {unimplemented} }}\n"
    );
    let good = "//! Fine.\nfn ignore_case() -> bool { true }\n".to_owned();
    let files = vec![(PathBuf::from("crates/x/src/lib.rs"), bad), (PathBuf::from("crates/x/src/ok.rs"), good)];
    let violations = check_forbidden_patterns(&files);
    assert_reported(&violations, &["crates/x/src/lib.rs:2:", "crates/x/src/lib.rs:6:", "crates/x/src/lib.rs:8:", "crates/x/src/lib.rs:9:"]);
}

#[test]
fn crate_without_workspace_lints_is_reported() {
    let missing = member("crates/a", "[package]\nname = \"atasira-a\"\n");
    let own = member("crates/b", "[package]\nname = \"atasira-b\"\n[lints.rust]\nunsafe_code = \"forbid\"\n");
    let off = member("crates/c", "[package]\nname = \"atasira-c\"\n[lints]\nworkspace = false\n");
    let dotted = member("crates/d", "lints.workspace = true\n[package]\nname = \"atasira-d\"\n");
    let violations = check_lints_inherited(&[missing, own, off, dotted]);
    assert_reported(&violations, &["atasira-a", "atasira-b", "atasira-c"]);
}

#[test]
fn crate_named_unlike_its_dir_is_reported() {
    let renamed = member("crates/drafts", "[package]\nname = \"drafts-service\"\n");
    let binary = member("crates/atasira", "[package]\nname = \"atasira\"\n");
    let tests = member("tests", "[package]\nname = \"atasira-tests\"\n");
    let violations = check_crate_names_match_dirs(&[renamed, binary, tests]);
    assert_reported(&violations, &["`atasira-drafts`"]);
}

#[test]
fn unregistered_test_file_is_reported() {
    let manifest = table(
        r#"
        [lib]
        path = "lib.rs"

        [[test]]
        name = "tidy"
        path = "tidy.rs"

        [[test]]
        name = "drafts"
        path = "./drafts.rs"
        "#,
    );
    let lib_rs = "//! Helpers.\n\npub mod harness;\nmod fixtures;\npub(crate) mod wire;\nmod inline {\n}\n// mod commented;\n";
    let files: Vec<String> =
        ["lib.rs", "harness.rs", "fixtures.rs", "wire.rs", "tidy.rs", "drafts.rs", "forgotten.rs", "inline.rs", "README.md"].map(String::from).to_vec();
    let violations = check_test_files_registered(&manifest, &files, lib_rs);
    assert_reported(&violations, &["tests/forgotten.rs", "tests/inline.rs"]);
    assert!(violations[0].contains("path = \"forgotten.rs\""), "the message shows the entry to add: {}", violations[0]);
}

#[test]
fn test_file_without_any_test_targets_is_reported() {
    let manifest = table("[lib]\npath = \"lib.rs\"\n");
    let violations = check_test_files_registered(&manifest, &["lib.rs".to_owned(), "c9.rs".to_owned()], "");
    assert_reported(&violations, &["tests/c9.rs"]);
}

#[test]
fn library_reading_env_is_reported() {
    let lib = "fn timeout() -> u64 {\n    std::env::var(\"ATASIRA_TIMEOUT\").ok().and_then(|v| v.parse().ok()).unwrap_or(5)\n}\n\
               fn dir() -> Option<std::ffi::OsString> { env::var_os(\"HOME\") }\n\
               // std::env::var(\"IN_A_COMMENT\") is fine\n\
               const VERSION: &str = env!(\"CARGO_PKG_VERSION\");\n";
    let setup = "if std::env::var_os(\"GIT_SSH_COMMAND\").is_none() {}\nlet _ = std::env::var(\"GIT_DIR\");\n";
    let binary = "let key = std::env::var(\"ATASIRA_AUDIT_KEY\");\n";
    let files = vec![
        (PathBuf::from("crates/platform/src/lib.rs"), lib.to_owned()),
        (PathBuf::from("crates/provisioner/src/setup.rs"), setup.to_owned()),
        (PathBuf::from("crates/atasira/src/main.rs"), binary.to_owned()),
        (PathBuf::from("tests/harness/proc.rs"), binary.to_owned()),
        (PathBuf::from("crates/contracts/build.rs"), "let out = std::env::var(\"OUT_DIR\");\n".to_owned()),
    ];
    let violations = check_libraries_read_no_env(&files);
    assert_reported(&violations, &["crates/platform/src/lib.rs:2:", "crates/platform/src/lib.rs:4:", "crates/provisioner/src/setup.rs:2:"]);
}
