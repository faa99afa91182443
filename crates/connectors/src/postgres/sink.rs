//! The sink's IO, on the connectors' runtime: one connection writes the
//! open transaction, a second commits prepared ones (`COMMIT PREPARED`
//! cannot run inside the open transaction) and resolves them at a restore.
//! A write is sent without waiting for it; the next statement waits first,
//! so one is in flight while the subtask prepares the next.

use super::transactions::{
    resolve, AtBarrier, ColumnValues, Committable, Resolution, Rows, Transactions,
};
use super::{Column, Mode, PostgresOptions, Row, SqlType, Value};
use crate::io::wait;
use std::marker::PhantomData;
use std::sync::Arc;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::{Sink, SinkContext, UserError};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

/// Rows per statement: a statement binds each column as one array.
const BATCH: usize = 8192;

/// A PostgreSQL sink subtask (see [the module](super)).
pub struct PostgresSink<T> {
    options: Arc<PostgresOptions>,
    ctx: SinkContext,
    transactions: Transactions,
    rows: Rows,
    columns: Vec<Column>,
    /// One record's values, on their way into `rows`.
    row: Vec<Value>,
    /// Opened by [`Sink::restore`], before any write.
    connections: Option<Connections>,
    in_flight: Option<JoinHandle<Result<u64, tokio_postgres::Error>>>,
    records: PhantomData<fn(T)>,
}

struct Connections {
    writer: Arc<Client>,
    committer: Arc<Client>,
    /// The insert, prepared on the writer.
    insert: Statement,
}

impl<T: Row> PostgresSink<T> {
    /// Connects when the job starts or restores, not here.
    pub fn new(options: Arc<PostgresOptions>, ctx: SinkContext) -> Self {
        let columns = T::columns();
        PostgresSink {
            transactions: Transactions::new(
                options.mode,
                &options.transaction_prefix,
                ctx.subtask.0,
            ),
            rows: Rows::new(columns.len(), options.mode, T::key_columns()),
            row: Vec::with_capacity(columns.len()),
            columns,
            options,
            ctx,
            connections: None,
            in_flight: None,
            records: PhantomData,
        }
    }

    fn connections(&self) -> Result<&Connections, UserError> {
        self.connections
            .as_ref()
            .ok_or_else(|| "the PostgreSQL sink wrote before it was restored".into())
    }

    /// `what` failed on the server: the error names the server and table.
    fn failed(&self, what: &str, error: tokio_postgres::Error) -> UserError {
        describe(&self.options, what, &error)
    }

    /// Connects both connections, checks the server, creates the table if
    /// absent and prepares the insert.
    fn open(&mut self) -> Result<(), UserError> {
        let options = self.options.clone();
        let (columns, key) = (self.columns.clone(), T::key_columns());
        super::check(&options, &columns, key)
            .map_err(|e| format!("PostgreSQL sink into {}: {e}", options.table.plain()))?;
        let opened = wait(async move {
            let writer = connect(&options.connection).await?;
            let committer = connect(&options.connection).await?;
            check_prepared_transactions(&committer).await?;
            create_table(&committer, &options, &columns, key).await?;
            let insert = writer
                .prepare(&insert_statement(&options, &columns, key))
                .await
                .map_err(|e| Failure::Db("cannot prepare the insert", e))?;
            Ok::<_, Failure>(Connections {
                writer: Arc::new(writer),
                committer: Arc::new(committer),
                insert,
            })
        })?;
        self.connections = Some(opened.map_err(|f| f.into_error(&self.options))?);
        Ok(())
    }

    /// Waits for the write in flight.
    fn settle(&mut self) -> Result<(), UserError> {
        if let Some(write) = self.in_flight.take() {
            futures::executor::block_on(write)
                .map_err(|e| format!("the PostgreSQL sink's write task failed: {e}"))?
                .map_err(|e| self.failed("cannot write rows", e))?;
        }
        Ok(())
    }

    /// Sends the rows buffered into the open transaction (beginning it).
    fn send(&mut self) -> Result<(), UserError> {
        if self.rows.len() == 0 {
            return Ok(());
        }
        self.settle()?;
        let begin = self.transactions.write();
        let types: Vec<SqlType> = self.columns.iter().map(|c| c.sql_type).collect();
        let columns = self.rows.take_columns(&types)?;
        let connections = self.connections()?;
        let (writer, insert) = (connections.writer.clone(), connections.insert.clone());
        self.in_flight = Some(crate::io::spawn(async move {
            if begin {
                writer.batch_execute("BEGIN").await?;
            }
            writer.execute(&insert, &parameters(&columns)).await
        }));
        Ok(())
    }

    /// Runs `statement` on the committer.
    fn commit_statement(&self, statement: String) -> Result<(), UserError> {
        let committer = self.connections()?.committer.clone();
        let run = statement.clone();
        wait(async move { committer.batch_execute(&run).await })?
            .map_err(|e| self.failed(&format!("`{statement}` failed"), e))
    }

    /// Commits or rolls back the prepared transactions a restore of
    /// `restored` resolves (see [`resolve`]).
    fn resolve(&self, restored: Option<&Committable>) -> Result<(), UserError> {
        let committer = self.connections()?.committer.clone();
        let pattern = format!("{}:", self.options.transaction_prefix);
        let found = wait(async move {
            let rows = committer
                .query(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)",
                    &[&pattern],
                )
                .await?;
            Ok::<Vec<String>, tokio_postgres::Error>(rows.iter().map(|r| r.get(0)).collect())
        })?
        .map_err(|e| self.failed("cannot list prepared transactions", e))?;
        let prefix = &self.options.transaction_prefix;
        for (name, resolution) in resolve(&found, prefix, restored, self.ctx) {
            let verb = match resolution {
                Resolution::Commit => "COMMIT",
                Resolution::RollBack => "ROLLBACK",
            };
            tracing::info!(
                transaction = name,
                verb,
                "resolving a prepared transaction at restore"
            );
            let committer = self.connections()?.committer.clone();
            let statement = format!("{verb} PREPARED '{name}'");
            let run = statement.clone();
            match wait(async move { committer.batch_execute(&run).await })? {
                // Another subtask resolved it first.
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
                done => done.map_err(|e| self.failed(&format!("`{statement}` failed"), e))?,
            }
        }
        Ok(())
    }

    /// Writes and commits rows a checkpoint held: they were before its
    /// barrier, and it completed.
    fn commit_held(&self, held: Vec<Value>) -> Result<(), UserError> {
        if held.is_empty() {
            return Ok(());
        }
        let mut rows = Rows::new(self.columns.len(), self.options.mode, T::key_columns());
        for mut row in held.chunks(self.columns.len()).map(<[Value]>::to_vec) {
            rows.push(&mut row)?;
        }
        let types: Vec<SqlType> = self.columns.iter().map(|c| c.sql_type).collect();
        let columns = rows.take_columns(&types)?;
        let committer = self.connections()?.committer.clone();
        let insert = insert_statement(&self.options, &self.columns, T::key_columns());
        wait(async move {
            committer.batch_execute("BEGIN").await?;
            committer.execute(&insert, &parameters(&columns)).await?;
            committer.batch_execute("COMMIT").await
        })?
        .map_err(|e| self.failed("cannot write the rows a checkpoint held", e))
    }
}

impl<T: Row> Sink<T> for PostgresSink<T> {
    fn write(&mut self, records: &mut Vec<T>) -> Result<(), UserError> {
        for record in records.iter() {
            record.values(&mut self.row)?;
            self.rows.push(&mut self.row)?;
        }
        if self.transactions.may_write() && self.rows.len() >= BATCH {
            self.send()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), UserError> {
        self.settle()?;
        for name in self.transactions.completed(CheckpointId(u64::MAX)) {
            self.commit_statement(format!("COMMIT PREPARED '{name}'"))?;
        }
        self.send()?;
        self.settle()?;
        if self.transactions.close() {
            let writer = self.connections()?.writer.clone();
            wait(async move { writer.batch_execute("COMMIT").await })?
                .map_err(|e| self.failed("cannot commit the last rows", e))?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Vec<u8>, UserError> {
        if self.transactions.may_write() {
            self.send()?;
        }
        self.settle()?;
        let held = match self.transactions.barrier(checkpoint) {
            AtBarrier::Prepare(name) => {
                let writer = self.connections()?.writer.clone();
                let prepare = format!("PREPARE TRANSACTION '{name}'");
                wait(async move { writer.batch_execute(&prepare).await })?
                    .map_err(|e| self.failed(&format!("cannot prepare transaction {name}"), e))?;
                Vec::new()
            }
            AtBarrier::Nothing => Vec::new(),
            AtBarrier::Hold => self.rows.flat().to_vec(),
        };
        Ok(rmp_serde::to_vec(&Committable {
            subtask: self.ctx.subtask.0,
            checkpoint: checkpoint.0,
            prepared: self.transactions.prepared(),
            held,
        })?)
    }

    fn commit(&mut self, checkpoint: CheckpointId) -> Result<(), UserError> {
        for name in self.transactions.completed(checkpoint) {
            self.commit_statement(format!("COMMIT PREPARED '{name}'"))?;
        }
        if self.transactions.may_write() {
            self.send()?;
        }
        Ok(())
    }

    fn restore(&mut self, state: Option<&[u8]>) -> Result<(), UserError> {
        self.open()?;
        let committable: Option<Committable> = state
            .map(rmp_serde::from_slice)
            .transpose()
            .map_err(|e| format!("a PostgreSQL sink's checkpointed state is not its own: {e}"))?;
        self.resolve(committable.as_ref())?;
        self.commit_held(committable.map(|c| c.held).unwrap_or_default())
    }

    /// The transactions and held rows of a subtask a rescale removed.
    fn adopt(&mut self, state: &[u8]) -> Result<(), UserError> {
        let committable: Committable = rmp_serde::from_slice(state)
            .map_err(|e| format!("a PostgreSQL sink's checkpointed state is not its own: {e}"))?;
        self.resolve(Some(&committable))?;
        self.commit_held(committable.held)
    }
}

/// `HOST:PORT/DB`, as errors name the server.
fn server(options: &PostgresOptions) -> String {
    let c = &options.connection;
    let host = match c.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = c.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{host}:{port}/{}",
        c.get_dbname().or(c.get_user()).unwrap_or("")
    )
}

/// `what` failed: names the server, the table and the server's reason.
fn describe(options: &PostgresOptions, what: &str, error: &tokio_postgres::Error) -> UserError {
    format!(
        "{what} (PostgreSQL {}, table {}): {}",
        server(options),
        options.table.plain(),
        super::with_sources(error)
    )
    .into()
}

/// What opening the sink ran into.
enum Failure {
    Db(&'static str, tokio_postgres::Error),
    Setting(String),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Failure::Db("cannot connect", error)
    }
}

impl Failure {
    fn into_error(self, options: &PostgresOptions) -> UserError {
        match self {
            Failure::Db(what, e) => describe(options, what, &e),
            Failure::Setting(problem) => {
                format!("PostgreSQL {}: {problem}", server(options)).into()
            }
        }
    }
}

/// Connects; a lock wait the sink never means to get into (a key written
/// by two sink subtasks, a foreign prepared transaction) fails after a
/// minute instead of hanging, unless the URL's `options` set
/// `lock_timeout`.
async fn connect(config: &tokio_postgres::Config) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "a PostgreSQL sink's connection failed");
        }
    });
    if !config
        .get_options()
        .is_some_and(|o| o.contains("lock_timeout"))
    {
        client.batch_execute("SET lock_timeout = '60s'").await?;
    }
    Ok(client)
}

/// Two-phase commit needs prepared transactions, which PostgreSQL turns
/// off by default.
async fn check_prepared_transactions(client: &Client) -> Result<(), Failure> {
    let row = client
        .query_one("SHOW max_prepared_transactions", &[])
        .await
        .map_err(|e| Failure::Db("cannot read max_prepared_transactions", e))?;
    let value: String = row.get(0);
    match value.parse::<u32>() {
        Ok(0) => Err(Failure::Setting(
            "max_prepared_transactions is 0, so the exactly-once sink cannot prepare a transaction at each checkpoint; set max_prepared_transactions in postgresql.conf to at least the sink's parallelism times the checkpoints in flight plus one (say 64), and restart the server".into(),
        )),
        _ => Ok(()),
    }
}

/// Creates the table if absent: columns named as the record's fields, the
/// key as primary key in upsert mode. Sink subtasks race to it; the
/// losers find it made.
async fn create_table(
    client: &Client,
    options: &PostgresOptions,
    columns: &[Column],
    key: usize,
) -> Result<(), Failure> {
    let mut definition: Vec<String> = columns
        .iter()
        .map(|c| format!("\"{}\" {} NOT NULL", c.name, c.sql_type.name()))
        .collect();
    if options.mode == Mode::Upsert {
        definition.push(format!("PRIMARY KEY ({})", names(&columns[..key])));
    }
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        options.table.quoted(),
        definition.join(", ")
    );
    match client.batch_execute(&create).await {
        Err(e)
            if [&SqlState::UNIQUE_VIOLATION, &SqlState::DUPLICATE_TABLE]
                .contains(&e.code().unwrap_or(&SqlState::INTERNAL_ERROR)) =>
        {
            Ok(())
        }
        other => other.map_err(|e| Failure::Db("cannot create the table", e)),
    }
}

fn names(columns: &[Column]) -> String {
    columns
        .iter()
        .map(|c| format!("\"{}\"", c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An insert of rows bound as one array per column; in upsert mode a row
/// whose key is there replaces it.
fn insert_statement(options: &PostgresOptions, columns: &[Column], key: usize) -> String {
    let arrays: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("${}::{}[]", i + 1, c.sql_type.name()))
        .collect();
    let mut insert = format!(
        "INSERT INTO {} ({}) SELECT * FROM UNNEST({})",
        options.table.quoted(),
        names(columns),
        arrays.join(", ")
    );
    if options.mode == Mode::Upsert {
        let updates: Vec<String> = columns[key..]
            .iter()
            .map(|c| format!("\"{0}\" = EXCLUDED.\"{0}\"", c.name))
            .collect();
        insert += &match updates.is_empty() {
            true => format!(" ON CONFLICT ({}) DO NOTHING", names(&columns[..key])),
            false => format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                names(&columns[..key]),
                updates.join(", ")
            ),
        };
    }
    insert
}

fn parameters(columns: &[ColumnValues]) -> Vec<&(dyn ToSql + Sync)> {
    columns
        .iter()
        .map(|c| match c {
            ColumnValues::BigInt(values) => values as &(dyn ToSql + Sync),
            ColumnValues::Text(values) => values as &(dyn ToSql + Sync),
        })
        .collect()
}
