//! The layering the crates promise, read from `cargo tree`: the core does
//! no IO (no async runtime, object store, database, actor system or HTTP
//! stack), and the storage and RocksDB crates each bring only their own;
//! and the core's modules, read from its sources, import in no cycle.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates `package` depends on when built (normal edges), by name.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}", "-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn assert_free_of(package: &str, forbidden: &[&str]) {
    let found: Vec<String> = normal_dependencies(package)
        .into_iter()
        .filter(|name| forbidden.contains(&name.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "{package} must not depend on {found:?}: see docs/layout.md"
    );
}

#[test]
fn the_core_depends_on_nothing_that_does_io() {
    let deps = normal_dependencies("tidemark-core");
    assert!(
        deps.iter().any(|d| d == "serde"),
        "the tree was read: {deps:?}"
    );
    assert_free_of(
        "tidemark-core",
        &[
            "tokio",
            "object_store",
            "rocksdb",
            "librocksdb-sys",
            "actix",
            "actix-rt",
            "reqwest",
            "hyper",
            "tonic",
            "tempfile",
        ],
    );
}

#[test]
fn storage_and_rocksdb_bring_only_their_own_io() {
    assert_free_of(
        "tidemark-storage",
        &["rocksdb", "librocksdb-sys", "actix", "actix-rt", "tonic"],
    );
    assert_free_of(
        "tidemark-rocksdb",
        &[
            "tokio",
            "object_store",
            "actix",
            "actix-rt",
            "reqwest",
            "hyper",
            "tonic",
        ],
    );
}

/// The top-level modules of the core each file under `src/` uses through
/// `crate::…` paths, outside comments and test modules.
fn module_dependencies() -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.clone()];
    let mut uses = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let relative = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let module = relative.split(['/', '.']).next().unwrap().to_owned();
        let test_only = relative.contains("tests") || module == "testkit";
        if test_only || module == "lib" || !relative.ends_with(".rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap();
        let used = uses.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..]
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

/// A module that reaches itself through others, with the path, if any.
fn cycle(uses: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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

#[test]
fn the_cores_modules_form_no_import_cycle() {
    let uses = module_dependencies();
    assert!(uses.contains_key("checkpoint") && uses["job"].contains("dataflow"));
    if let Some(cycle) = cycle(&uses) {
        panic!(
            "the core's modules import in a cycle: {}",
            cycle.join(" -> ")
        );
    }
}
