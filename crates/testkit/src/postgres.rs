//! The PostgreSQL server `cargo xtask test` starts, as the tests that
//! write into it see it: one table and its sink's prepared transactions.

/// The server's URL in `var`; `None` skips the test, unless
/// `TIDEMARK_REQUIRE_POSTGRES` says the PostgreSQL cases must run.
pub fn server(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) => {
            let required =
                std::env::var("TIDEMARK_REQUIRE_POSTGRES").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "TIDEMARK_REQUIRE_POSTGRES is set but {var} is not"
            );
            eprintln!("skipped: {var} is not set (cargo xtask test sets it)");
            None
        }
    }
}

/// A client of the server, looking at one table as a reader would.
pub struct Table {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    pub name: String,
}

impl Table {
    /// Drops what an earlier run of the test left of `name`.
    pub fn new(url: &str, name: &str) -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
        });
        let table = Table {
            runtime,
            client,
            name: name.to_owned(),
        };
        for gid in table.prepared() {
            table.execute(&format!("ROLLBACK PREPARED '{gid}'"));
        }
        table.execute(&format!("DROP TABLE IF EXISTS {name}"));
        table
    }

    fn execute(&self, statement: &str) {
        self.runtime
            .block_on(self.client.batch_execute(statement))
            .unwrap();
    }

    /// The committed rows of `columns`, each as `bigint`s; none if the
    /// table is not there yet.
    pub fn rows(&self, columns: &str) -> Vec<Vec<i64>> {
        let query = format!("SELECT {columns} FROM {}", self.name);
        match self.runtime.block_on(self.client.query(&query, &[])) {
            Ok(rows) => rows
                .iter()
                .map(|r| (0..r.len()).map(|i| r.get(i)).collect())
                .collect(),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                Vec::new()
            }
            Err(e) => panic!("{query}: {e:?}"),
        }
    }

    /// The prepared transactions of the table's sink (under its default
    /// prefix, in database `postgres`).
    pub fn prepared(&self) -> Vec<String> {
        let rows = self
            .runtime
            .block_on(self.client.query(
                "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1)",
                &[&format!("tidemark-postgres-{}:", self.name)],
            ))
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }
}
