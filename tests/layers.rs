//! The arrows point down. Every top-level module of the library has a rank (`RANKS`, highest
//! first, as `src/lib.rs` lists them); a module may name only modules of a lower rank, never
//! one of its own rank (peers stay apart) nor one above. A name counts wherever it appears:
//! a `use`, a path in code, a doc link (`crate::x`, `spindle::x`, `use crate::{x, y}`). The
//! test fails with the file, line and both modules of every upward arrow, and when a module
//! exists that has no rank (a new module must be placed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module and its rank: the top of the house first. The services (Director,
/// router, manager, drainer, dashboard) are peers: none names another; what two of them share
/// lives below them.
const RANKS: &[(&str, u8)] = &[
    ("cli", 10),
    ("dashboard", 8),
    ("director", 8),
    ("drainer", 8),
    ("manager", 8),
    ("router", 8),
    ("archiver", 7),
    ("erasure", 7),
    ("events", 7),
    ("ledger", 7),
    ("registry", 6),
    ("rpc", 6),
    ("jobdb", 5),
    ("archive", 4),
    ("metrics", 3),
    ("delivery", 2),
    ("faults", 1),
    ("job", 1),
    ("secret", 1),
    ("telemetry", 0),
];

fn rank(module: &str) -> Option<u8> {
    RANKS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The library's top-level modules and their files (`src/x.rs` or `src/x/**.rs`).
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            if !files.is_empty() {
                found.insert(name, files);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            found.insert(name, vec![path]);
        }
    }
    found
}

fn ident_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// Every top-level module `text` names, with the byte offset of each name: `crate::x`,
/// `spindle::x`, and each item of `crate::{x, y::z}` at the group's top level (a group may
/// span lines, as rustfmt writes long ones).
fn named_modules(text: &str) -> Vec<(usize, String)> {
    let mut names = Vec::new();
    for prefix in ["crate::", "spindle::"] {
        let mut from = 0;
        while let Some(found) = text[from..].find(prefix) {
            let at = from + found;
            from = at + prefix.len();
            // `spindle_client::` and `my_crate::` are other crates.
            let glued = text[..at]
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            if glued {
                continue;
            }
            let rest = &text[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let base = from + 1;
                let mut depth = 0usize;
                let mut item_start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if c.is_whitespace() => {}
                        _ if item_start && depth == 0 => {
                            item_start = false;
                            let name = ident_at(&group[i..]);
                            if !name.is_empty() && name != "self" {
                                names.push((base + i, name.to_string()));
                            }
                        }
                        _ => {}
                    }
                }
            } else {
                let name = ident_at(rest);
                if !name.is_empty() {
                    names.push((from, name.to_string()));
                }
            }
        }
    }
    names
}

/// Every arrow in `file` (of module `from`) to a module not below it.
fn upward_references(from: &str, file: &Path) -> Vec<String> {
    let Some(own) = rank(from) else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(file).expect("read source");
    let mut found = Vec::new();
    for (at, to) in named_modules(&text) {
        if to == from {
            continue;
        }
        if let Some(theirs) = rank(&to) {
            if theirs >= own {
                let line = text[..at].matches('\n').count();
                let shown = text.lines().nth(line).unwrap_or_default().trim();
                found.push(format!(
                    "{}:{}: {from} ({own}) names {to} ({theirs}): {shown}",
                    file.display(),
                    line + 1,
                ));
            }
        }
    }
    found
}

#[test]
fn every_module_names_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let unranked: Vec<_> = modules.keys().filter(|m| rank(m).is_none()).collect();
    assert!(
        unranked.is_empty(),
        "modules without a rank in tests/layers.rs (place them): {unranked:?}"
    );
    let mut offences = Vec::new();
    for (module, files) in &modules {
        for file in files {
            offences.extend(upward_references(module, file));
        }
    }
    assert!(
        offences.is_empty(),
        "modules name modules at or above their rank:\n{}",
        offences.join("\n")
    );
}

#[test]
fn every_rank_is_a_module_and_lib_rs_lists_them_in_rank_order() {
    // The table and the library agree: no stale entry, and `src/lib.rs` declares the modules
    // (its `pub mod` lines are alphabetical; its layout comment is what a reader follows, so
    // each ranked module must be linked there).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let modules = modules(&root.join("src"));
    for (module, _) in RANKS {
        assert!(
            modules.contains_key(*module),
            "ranked module {module} has no source"
        );
    }
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("read lib.rs");
    let layout: String = lib.lines().filter(|l| l.starts_with("//!")).collect();
    for (module, _) in RANKS {
        assert!(
            layout.contains(&format!("[`{module}`]")) || *module == "faults",
            "src/lib.rs's layout comment does not name [`{module}`]"
        );
    }
}

#[test]
fn the_check_catches_every_form_of_an_upward_name() {
    // The scanner itself must see the forms an arrow takes, and only those.
    let dir = std::env::temp_dir().join(format!("spindle-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("probe.rs");
    for (from, line) in [
        ("jobdb", "use crate::director::writer::WriteOp;"),
        ("jobdb", "use crate::{job, director};"),
        ("jobdb", "use crate::{\n    job::Job,\n    router::x};"),
        ("rpc", "    crate::router::service::openapi_document()"),
        ("delivery", "/// See [`crate::cli::Cli`]."),
        ("router", "let x = spindle::drainer::run;"),
        ("manager", "use crate::drainer::Drainer;"),
    ] {
        std::fs::write(&file, line).expect("write probe");
        let found = upward_references(from, &file);
        assert_eq!(found.len(), 1, "{from}: {line}: {found:?}");
    }
    for (from, line) in [
        ("director", "use crate::jobdb::JobDb; // directory, routers"),
        ("director", "use spindle_client::router::Thing;"),
        ("director", "use crate::{job, jobdb::{JobDb, write::Head}};"),
        ("cli", "use crate::director::Director;"),
    ] {
        std::fs::write(&file, line).expect("write probe");
        assert!(upward_references(from, &file).is_empty(), "{line}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A file's module path under `src/`: `src/jobdb/write.rs` is `jobdb::write`, a folder's
/// `mod.rs` is the folder's module.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// `text` without its comments (line, doc and block comments): what the code itself names.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_str = !in_str;
                out.push(c);
            }
            '\\' if in_str => {
                out.push(c);
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            }
            '/' if !in_str && chars.peek() == Some(&'/') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if !in_str && chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for n in chars.by_ref() {
                    if last == '*' && n == '/' {
                        break;
                    }
                    last = n;
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The paths `code` names from `at` on, after a `::`: `a::b`, or the items of a group
/// `{a::b, c::{d, e}}`, each as its segments (`self` in a group is the group's own path).
fn paths_after(code: &str, at: usize, base: Vec<String>, out: &mut Vec<(usize, Vec<String>)>) {
    let rest = &code[at..];
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0usize;
        let mut item = at + 1;
        let mut items = Vec::new();
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    items.push(item);
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(item);
                    item = at + 1 + i + 1;
                }
                _ => {}
            }
        }
        for start in items {
            let skip = code[start..].len() - code[start..].trim_start().len();
            paths_after(code, start + skip, base.clone(), out);
        }
        return;
    }
    let mut segments = base;
    let mut pos = at;
    loop {
        let name = ident_at(&code[pos..]);
        if name.is_empty() {
            break;
        }
        if name != "self" {
            segments.push(name.to_string());
        }
        pos += name.len();
        if code[pos..].starts_with("::{") {
            return paths_after(code, pos + 2, segments, out);
        }
        match code[pos..].strip_prefix("::") {
            Some(_) => pos += 2,
            None => break,
        }
    }
    out.push((at, segments));
}

/// Every absolute module path the code of module `own`'s file names: `crate::`,
/// `$crate::`, `spindle::`, `super::` and `self::` paths and their groups.
fn named_paths(own: &[String], code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let glued = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let head = ["$crate::", "crate::", "spindle::", "super::", "self::"]
            .into_iter()
            .find(|h| code[i..].starts_with(h));
        let (Some(head), false) = (head, glued) else {
            i += code[i..].chars().next().map_or(1, char::len_utf8);
            continue;
        };
        // `self` is the file's own module (a `mod.rs`'s is its folder's), `super` its parent.
        let mut base: Vec<String> = match head {
            "super::" | "self::" => own.to_vec(),
            _ => Vec::new(),
        };
        let mut pos = i + head.len();
        if head == "super::" {
            base.pop();
            while code[pos..].starts_with("super::") {
                base.pop();
                pos += "super::".len();
            }
        }
        paths_after(code, pos, base, &mut out);
        i = pos;
    }
    out
}

/// Which child module of its folder's module each item a `mod.rs` re-exports comes from
/// (`pub use child::{A, B}`), keyed by the item's path through the folder's module.
fn re_exports(src: &Path, files: &[PathBuf]) -> BTreeMap<Vec<String>, Vec<String>> {
    let mut out = BTreeMap::new();
    for file in files.iter().filter(|f| f.ends_with("mod.rs")) {
        let own = module_path(src, file);
        let code = code_of(&std::fs::read_to_string(file).expect("read source"));
        for line in code.split(';') {
            let Some(at) = line.find("pub use ") else {
                continue;
            };
            let mut paths = Vec::new();
            let text = &line[at + "pub use ".len()..];
            paths_after(text, 0, Vec::new(), &mut paths);
            for (_, path) in paths {
                let Some((item, from)) = path.split_last() else {
                    continue;
                };
                if from.is_empty() || from[0] == "crate" || from[0] == "super" {
                    continue;
                }
                let mut key = own.clone();
                key.push(item.clone());
                let mut child = own.clone();
                child.extend(from.iter().cloned());
                out.insert(key, child);
            }
        }
    }
    out
}

/// The files of the library under `src/`.
fn library_files(src: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
}

/// Every circle of files and folders inside `folder` (`src/<folder>`), at each level: the
/// files and sub-folders of one folder (its `mod.rs` apart, their parent) must name one
/// another in one direction only. Each circle is shown with a named path per arrow.
fn circles_in(src: &Path, folder: &str) -> Vec<String> {
    let files = library_files(src);
    let modules: std::collections::BTreeSet<Vec<String>> =
        files.iter().map(|f| module_path(src, f)).collect();
    let exported = re_exports(src, &files);
    // Resolves a named path to the module (file) it lands in: its longest prefix that is a
    // module, through a `mod.rs`'s re-export when the next segment is one.
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        let mut best = None;
        for n in (1..=path.len()).rev() {
            if modules.contains(&path[..n]) {
                best = Some(n);
                break;
            }
        }
        let n = best?;
        let mut module = path[..n].to_vec();
        if let Some(item) = path.get(n) {
            let mut key = module.clone();
            key.push(item.clone());
            if let Some(child) = exported.get(&key) {
                module = child.clone();
            }
        }
        Some(module)
    };
    let mut arrows: BTreeMap<(Vec<String>, Vec<String>), String> = BTreeMap::new();
    for file in &files {
        let own = module_path(src, file);
        if own.first().map(String::as_str) != Some(folder) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read source");
        let code = code_of(&text);
        for (at, path) in named_paths(&own, &code) {
            let Some(to) = resolve(&path) else { continue };
            // The deepest folder holding both: the level at which the arrow is checked.
            let common = own.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common >= own.len() || common >= to.len() {
                continue; // a module and its own parent or child
            }
            let (from_unit, to_unit) = (own[..=common].to_vec(), to[..=common].to_vec());
            let line = code[..at].matches('\n').count() + 1;
            arrows
                .entry((from_unit, to_unit))
                .or_insert_with(|| format!("{}:{line} names {}", file.display(), path.join("::")));
        }
    }
    // A circle: a unit that reaches itself again.
    let mut found = Vec::new();
    let units: std::collections::BTreeSet<Vec<String>> = arrows
        .keys()
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    for start in &units {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for ((a, b), _) in arrows.range((at.clone(), Vec::new())..) {
                if *a != at {
                    break;
                }
                if b == start && trail.len() > 1 && trail.iter().min() == Some(start) {
                    let mut shown: Vec<String> = Vec::new();
                    for pair in trail.windows(2).chain(std::iter::once(
                        &[trail[trail.len() - 1].clone(), start.clone()][..],
                    )) {
                        shown.push(arrows[&(pair[0].clone(), pair[1].clone())].clone());
                    }
                    let names: Vec<String> = trail.iter().map(|u| u.join("/")).collect();
                    found.push(format!(
                        "{}:\n    {}",
                        names.join(" → "),
                        shown.join("\n    ")
                    ));
                } else if !trail.contains(b) && seen.insert((at.clone(), b.clone())) {
                    let mut next = trail.clone();
                    next.push(b.clone());
                    stack.push((b.clone(), next));
                }
            }
        }
    }
    found
}

#[test]
fn no_circle_of_files_in_the_director_or_the_store() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = circles_in(&src, "director");
    found.extend(circles_in(&src, "jobdb"));
    assert!(
        found.is_empty(),
        "files of one folder that name one another both ways:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_circle_check_sees_names_groups_parents_and_re_exports() {
    let own = vec![
        "director".to_string(),
        "writer".to_string(),
        "commit".to_string(),
    ];
    let code = code_of(
        "use super::{batch::Batch, Writer};\nuse crate::director::{mailbox::WriteOp, ordering::{plan::Plan, Done}};\n// crate::director::campaign::x\nlet s = \"crate::director::http\";\nsuper::super::scheduler::Event::X;",
    );
    let named: Vec<String> = named_paths(&own, &code)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    assert_eq!(
        named,
        [
            "director::writer::batch::Batch",
            "director::writer::Writer",
            "director::mailbox::WriteOp",
            "director::ordering::plan::Plan",
            "director::ordering::Done",
            "director::http",
            "director::scheduler::Event::X",
        ],
        "comments are not code (a string is read, harmlessly)"
    );
    // A mod.rs's `super` is its folder's parent.
    let named = named_paths(
        &["director".into(), "ordering".into()],
        "super::mailbox::WriteOp",
    );
    assert_eq!(named[0].1, ["director", "mailbox", "WriteOp"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exported = re_exports(&src, &library_files(&src));
    assert_eq!(
        exported.get(&vec!["jobdb".to_string(), "BlockedKey".to_string()]),
        Some(&vec!["jobdb".to_string(), "ordering".to_string()]),
        "a name re-exported by a mod.rs resolves to the file it comes from"
    );
}
