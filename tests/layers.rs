//! The arrows point down: the store (`jobdb`), delivery, the archive and the intake toolkit
//! (`rpc`) are used by the Director, the router and the CLI, never the other way round. A
//! lower module that names a higher one (in a `use`, a path, or a doc link) fails here, with
//! the file and line.

use std::path::{Path, PathBuf};

/// Modules that must not look up, and the modules above them.
const LOWER: [&str; 4] = ["rpc", "archive", "jobdb", "delivery"];
const UPPER: [&str; 5] = ["director", "router", "cli", "dev", "drainer"];

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

/// Every line of `file` that names `crate::<upper>` (comments count: a doc link is an arrow
/// too).
fn upward_references(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("read source");
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for upper in UPPER {
            let named = [
                format!("crate::{upper}::"),
                format!("crate::{upper}}}"),
                format!("crate::{upper};"),
                format!("crate::{{{upper}"),
                format!("spindle::{upper}::"),
            ];
            if named.iter().any(|n| line.contains(n.as_str())) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn lower_modules_import_nothing_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offences = Vec::new();
    for lower in LOWER {
        let mut files = Vec::new();
        let dir = src.join(lower);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
        let single = src.join(format!("{lower}.rs"));
        if single.is_file() {
            files.push(single);
        }
        assert!(!files.is_empty(), "no source found for module {lower}");
        for file in files {
            offences.extend(upward_references(&file));
        }
    }
    assert!(
        offences.is_empty(),
        "lower modules name modules above them:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_check_catches_an_upward_import() {
    // The scanner itself must see the forms an upward arrow takes.
    let dir = std::env::temp_dir().join(format!("spindle-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("probe.rs");
    for line in [
        "use crate::director::writer::WriteOp;",
        "use crate::{director, job};",
        "    crate::router::service::openapi_document()",
        "/// See [`crate::cli::Cli`].",
    ] {
        std::fs::write(&file, line).expect("write probe");
        assert_eq!(upward_references(&file).len(), 1, "missed: {line}");
    }
    std::fs::write(&file, "use crate::jobdb::JobDb; // directory, routers").expect("probe");
    assert!(upward_references(&file).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
