//! The actors' modules, read from their sources, import in one direction:
//! the shared vocabulary (`messages`, `control`, `job`, `clock`, `metrics`)
//! under `dataflow`, under `checkpoint`, under `cluster`, under `runtime`
//! and `http`; and so do the modules inside each of the three groups.

use std::path::Path;
use tidemark_core::testkit::layering::{assert_no_import_cycle, module_dependencies};

#[test]
fn the_actors_modules_form_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uses = module_dependencies(&src, "crate::");
    assert!(uses["cluster"].contains("checkpoint") && uses["checkpoint"].contains("dataflow"));
    assert_no_import_cycle("the actors' modules", &uses);
    for group in ["dataflow", "checkpoint", "cluster"] {
        let uses = module_dependencies(&src.join(group), &format!("crate::{group}::"));
        assert!(!uses.is_empty(), "{group} was read");
        assert_no_import_cycle(&format!("the modules of `{group}`"), &uses);
    }
}
