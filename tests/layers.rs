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
    ("events", 7),
    ("registry", 6),
    ("rpc", 6),
    ("jobdb", 5),
    ("archive", 4),
    ("metrics", 3),
    ("delivery", 2),
    ("faults", 1),
    ("job", 1),
    ("secret", 1),
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
