//! The ZooKeeper server `cargo xtask test` starts.

/// `host:port` of the server; `None` skips the test, unless
/// `TIDEMARK_REQUIRE_ZOOKEEPER` says the ZooKeeper cases must run.
pub fn quorum() -> Option<String> {
    const VAR: &str = "TIDEMARK_TEST_ZOOKEEPER";
    match std::env::var(VAR) {
        Ok(quorum) => Some(quorum),
        Err(_) => {
            let required = std::env::var("TIDEMARK_REQUIRE_ZOOKEEPER")
                .is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "TIDEMARK_REQUIRE_ZOOKEEPER is set but {VAR} is not"
            );
            eprintln!("skipped: {VAR} is not set (cargo xtask test sets it)");
            None
        }
    }
}
