//! The layering the crates promise, read from `cargo tree`: the core does
//! no IO (no async runtime, object store, database, actor system or HTTP
//! stack), and the storage and RocksDB crates each bring only their own;
//! and, read from the core's sources, it reads no host fact and its modules
//! import in no cycle.

use std::process::Command;
use tidemark_core::testkit::layering::{
    assert_no_import_cycle, module_dependencies, production_code,
};

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

/// The calls that read the host: callers pass the clock, entropy, cores,
/// files and environment in, so that a simulated run sees only what its
/// seed gives it.
const HOST_FACTS: &[&str] = &[
    "SystemTime::now",
    "Instant::now",
    "available_parallelism",
    "process::id",
    "RandomState",
    "std::env",
    "std::fs",
    "std::net",
    "temp_dir",
    "thread::spawn",
    "thread::Builder",
    "thread::sleep",
];

#[test]
fn the_core_reads_no_host_fact_outside_tests() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = production_code(&src);
    assert!(
        files.iter().any(|(path, _)| path == "job/mod.rs"),
        "the sources were read"
    );
    let found: Vec<String> = files
        .iter()
        .flat_map(|(path, code)| {
            HOST_FACTS
                .iter()
                .filter(|fact| code.contains(**fact))
                .map(move |fact| format!("{path}: {fact}"))
        })
        .collect();
    assert!(found.is_empty(), "the core reads the host: {found:?}");
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

#[test]
fn the_cores_modules_form_no_import_cycle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uses = module_dependencies(&src, "crate::");
    assert!(uses.contains_key("checkpoint") && uses["job"].contains("dataflow"));
    assert_no_import_cycle("the core's modules", &uses);
}
