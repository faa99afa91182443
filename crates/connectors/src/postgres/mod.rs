//! An exactly-once sink into a PostgreSQL table, by two-phase commit, as
//! Flink's JDBC sink with XA transactions.
//!
//! Each sink subtask writes the records since the last barrier into an
//! open transaction; at the barrier of checkpoint `c` it runs `PREPARE
//! TRANSACTION '{prefix}:{subtask}:{c}'` (durable, invisible), and when `c`
//! completes `COMMIT PREPARED` on every transaction prepared up to `c`. A
//! restore finds this sink's transactions in `pg_prepared_xacts`, commits
//! those the restored checkpoint lists as prepared and not yet committed,
//! and rolls back every other one, so the table holds each result exactly
//! once after any failure.
//!
//! In upsert mode (`INSERT … ON CONFLICT … DO UPDATE`, the key as primary
//! key) a prepared transaction keeps its rows locked until it commits, and
//! a later write of the same key would wait for it while the barrier after
//! that write waits for the write: the sink therefore holds the rows of the
//! next transaction in memory, keyed, until the earlier one commits, and a
//! barrier that comes first puts the held rows into the checkpoint instead
//! of a transaction. Each key must be written by one sink subtask (the sink
//! follows a keyed operator, as in every topology).

#[cfg(test)]
mod against_server;
mod sink;
mod transactions;

pub use crate::rows::{Column, Row, SqlField, SqlType, Value};
pub use sink::PostgresSink;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;
use thiserror::Error;

/// How rows go into the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `INSERT … ON CONFLICT (key) DO UPDATE`: the table holds the latest
    /// row per key.
    Upsert,
    /// Plain `INSERT`: every record is a row.
    Append,
}

/// A sink's settings, from a `postgres://` URL or the builder.
#[derive(Clone)]
pub struct PostgresOptions {
    /// How to connect (host, port, user, database, …).
    pub connection: tokio_postgres::Config,
    /// Where the rows go, `name` or `schema.name`; created if absent.
    pub table: Table,
    /// How rows go in.
    pub mode: Mode,
    /// Names this sink's prepared transactions, and nothing else's: a
    /// restore rolls back every newer transaction under it. Unique per job
    /// writing into the server (default `tidemark-DB-TABLE`).
    pub transaction_prefix: String,
}

impl fmt::Debug for PostgresOptions {
    /// Without the connection's password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("hosts", &self.connection.get_hosts())
            .field("user", &self.connection.get_user())
            .field("dbname", &self.connection.get_dbname())
            .field("table", &self.table)
            .field("mode", &self.mode)
            .field("transaction_prefix", &self.transaction_prefix)
            .finish()
    }
}

/// What is wrong with a `postgres://` URL.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PostgresUrlError {
    /// Not `postgres://` or `postgresql://`: what came before `://`.
    #[error("`{0}://…` is not a postgres:// URL")]
    Scheme(String),
    /// No `table=` option.
    #[error("a PostgreSQL sink needs `?table=NAME`")]
    NoTable,
    /// An option of ours with a value it cannot take.
    #[error("`{key}={value}`: {problem}")]
    Option {
        key: String,
        value: String,
        problem: String,
    },
    /// What tokio-postgres refused in the rest of the URL.
    #[error("{0}")]
    Connection(String),
}

impl FromStr for PostgresOptions {
    type Err = PostgresUrlError;

    /// `postgres://USER[:PASSWORD]@HOST:PORT/DB?table=NAME[&mode=upsert|
    /// append][&transaction-prefix=P]`; other query options
    /// (`connect_timeout`, `application_name`, …) go to the connection.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            // Not the URL: it may hold a password.
            let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
            return Err(PostgresUrlError::Scheme(scheme.to_owned()));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut table, mut mode, mut prefix) = (None, Mode::Upsert, None);
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |problem: &str| PostgresUrlError::Option {
                key: key.to_owned(),
                value: value.to_owned(),
                problem: problem.to_owned(),
            };
            match key {
                "table" => table = Some(value.parse::<Table>().map_err(|e| bad(&e))?),
                "mode" => {
                    mode = match value {
                        "upsert" => Mode::Upsert,
                        "append" => Mode::Append,
                        _ => return Err(bad("the mode is upsert or append")),
                    }
                }
                "transaction-prefix" => {
                    prefix = Some(transaction_prefix(value).map_err(|e| bad(&e))?)
                }
                _ => rest.push(pair),
            }
        }
        let table = table.ok_or(PostgresUrlError::NoTable)?;
        let connection = match rest.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", rest.join("&")),
        };
        let mut connection = tokio_postgres::Config::from_str(&connection)
            .map_err(|e| PostgresUrlError::Connection(with_sources(&e)))?;
        // A subtask waits on the server: a server gone silent (a partition,
        // a dead host) fails it within about a minute, not TCP's hours.
        let given = |key: &str| rest.iter().any(|p| p.starts_with(&format!("{key}=")));
        if !given("keepalives_idle") {
            connection.keepalives_idle(Duration::from_secs(30));
        }
        if !given("tcp_user_timeout") {
            connection.tcp_user_timeout(Duration::from_secs(60));
        }
        // Names of prepared transactions are the server's, not a
        // database's.
        let database = connection
            .get_dbname()
            .or(connection.get_user())
            .unwrap_or("postgres");
        let prefix = match prefix {
            Some(prefix) => prefix,
            None => transaction_prefix(&format!("tidemark-{database}-{}", table.plain())).map_err(
                |e| PostgresUrlError::Option {
                    key: "transaction-prefix".into(),
                    value: String::new(),
                    problem: format!("the default from the database's name: {e}"),
                },
            )?,
        };
        Ok(PostgresOptions {
            connection,
            transaction_prefix: prefix,
            table,
            mode,
        })
    }
}

/// `error: its source: …`, since tokio-postgres says what is wrong in
/// the source.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text += &format!(": {cause}");
        source = cause.source();
    }
    text
}

/// A transaction prefix leaves room in PostgreSQL's 200 bytes of a
/// transaction's name for `:SUBTASK:CHECKPOINT`, and holds no `:`, so that
/// no prefix's names are also another's.
fn transaction_prefix(prefix: &str) -> Result<String, String> {
    match prefix.len() {
        1..=150
            if prefix
                .chars()
                .all(|c| c.is_ascii_graphic() && !"':\\".contains(c)) =>
        {
            Ok(prefix.to_owned())
        }
        _ => Err("a prefix is 1 to 150 printable ASCII characters other than ', \\ and :".into()),
    }
}

/// A table's name, checked to be plain identifiers so that it can be
/// quoted into statements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    schema: Option<String>,
    name: String,
}

impl Table {
    /// `"schema"."name"`, as statements name it.
    fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// `schema.name`, as given.
    fn plain(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.name),
            None => self.name.clone(),
        }
    }
}

impl FromStr for Table {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (schema, name) = match s.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, s),
        };
        if !identifier(name) || !schema.is_none_or(identifier) {
            return Err(
                "a table is NAME or SCHEMA.NAME, each letters, digits and _ (at most 63)".into(),
            );
        }
        Ok(Table {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }
}

/// A plain identifier, which statements may quote as it is.
fn identifier(part: &str) -> bool {
    let mut chars = part.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && part.len() <= 63
}

/// Checks what statements quote or name before the sink opens: the
/// prefix (a public field, perhaps not from a URL) and a row's columns.
fn check(options: &PostgresOptions, columns: &[Column], key: usize) -> Result<(), String> {
    transaction_prefix(&options.transaction_prefix)
        .map_err(|e| format!("transaction prefix `{}`: {e}", options.transaction_prefix))?;
    if let Some(bad) = columns.iter().find(|c| !identifier(c.name)) {
        return Err(format!(
            "column `{}` is not letters, digits and _",
            bad.name
        ));
    }
    if columns.is_empty() || key == 0 || key > columns.len() {
        return Err(format!(
            "a row of {} columns with {key} key columns",
            columns.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_the_table_the_mode_and_the_connection() {
        let options: PostgresOptions =
            "postgres://alice:secret@127.0.0.1:5433/shop?table=public.counts&mode=append&connect_timeout=5"
                .parse()
                .unwrap();
        assert_eq!(options.table.quoted(), "\"public\".\"counts\"");
        assert_eq!(options.mode, Mode::Append);
        assert_eq!(options.transaction_prefix, "tidemark-shop-public.counts");
        assert_eq!(options.connection.get_user(), Some("alice"));
        assert_eq!(options.connection.get_dbname(), Some("shop"));
        assert_eq!(options.connection.get_ports(), [5433]);
        assert_eq!(
            options.connection.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        assert_eq!(
            options.connection.get_keepalives_idle(),
            Duration::from_secs(30)
        );
        assert_eq!(
            options.connection.get_tcp_user_timeout(),
            Some(&Duration::from_secs(60))
        );
        assert!(!format!("{options:?}").contains("secret"));
        let upsert: PostgresOptions = "postgresql://u@h/db?table=t&transaction-prefix=job-7"
            .parse()
            .unwrap();
        assert_eq!(upsert.mode, Mode::Upsert);
        assert_eq!(upsert.transaction_prefix, "job-7");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let error = |url: &str| url.parse::<PostgresOptions>().unwrap_err().to_string();
        assert_eq!(
            error("mysql://u:secret@h/db?table=t"),
            "`mysql://…` is not a postgres:// URL"
        );
        assert_eq!(
            error("postgres://h/db"),
            "a PostgreSQL sink needs `?table=NAME`"
        );
        assert!(error("postgres://h/db?table=t;drop").contains("`table=t;drop`: a table is NAME"));
        assert!(error("postgres://h/db?table=t&mode=merge").contains("upsert or append"));
        for prefix in ["a'b", "a:b", "a\\b", ""] {
            let url = format!("postgres://h/db?table=t&transaction-prefix={prefix}");
            assert!(error(&url).contains("printable ASCII"), "{prefix}");
        }
        assert!(error("postgres://h/db?table=t&bogus=1").contains("bogus"));
    }
}
