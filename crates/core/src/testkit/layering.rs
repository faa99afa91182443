//! The import order of a crate's modules, read from its sources: the
//! crates' `layering` tests fail when their modules import in a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which modules each module uses, by name.
pub type Uses = BTreeMap<String, BTreeSet<String>>;

/// The modules directly under `src` (a file or a directory each) and those
/// each uses through `prefix` paths (`crate::`, or `crate::group::` for
/// the modules of a group), outside comments and test modules. `lib.rs`
/// and `mod.rs` are left out.
pub fn module_dependencies(src: &Path, prefix: &str) -> Uses {
    let mut uses = Uses::new();
    for (relative, code) in production_code(src) {
        let module = relative.split(['/', '.']).next().unwrap().to_owned();
        if module == "lib" || module == "mod" {
            continue;
        }
        let used = uses.entry(module.clone()).or_default();
        for line in code.lines() {
            for (at, _) in line.match_indices(prefix) {
                let name: String = line[at + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    used.insert(name);
                }
            }
        }
    }
    uses
}

/// Each `.rs` file under `src` by its path relative to `src`, with its
/// comment lines and its inline test modules (which end a file) left out;
/// files of tests and the `testkit` are left out whole.
pub fn production_code(src: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    for path in rust_files(src) {
        let relative = path
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if relative.contains("tests") || relative.starts_with("testkit") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let end = text
            .match_indices("#[cfg(test)]\n")
            .map(|(at, _)| at)
            .find(|&at| {
                let item = text[at..].lines().nth(1).unwrap_or_default();
                item.contains("mod ") && item.ends_with('{')
            })
            .unwrap_or(text.len());
        let code = text[..end]
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        files.push((relative, code));
    }
    files
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// A module that reaches itself through others, with the path, if any.
pub fn import_cycle(uses: &Uses) -> Option<Vec<String>> {
    for start in uses.keys() {
        let mut paths = vec![vec![start.clone()]];
        let mut seen = BTreeSet::new();
        while let Some(path) = paths.pop() {
            let last = path.last().unwrap();
            for next in uses.get(last).into_iter().flatten() {
                if next == start {
                    return Some([path.clone(), vec![next.clone()]].concat());
                }
                if seen.insert(next.clone()) {
                    paths.push([path.clone(), vec![next.clone()]].concat());
                }
            }
        }
    }
    None
}

/// Fails naming the cycle, if `what` (the modules of `uses`) import in one.
#[track_caller]
pub fn assert_no_import_cycle(what: &str, uses: &Uses) {
    if let Some(cycle) = import_cycle(uses) {
        panic!("{what} import in a cycle: {}", cycle.join(" -> "));
    }
}
