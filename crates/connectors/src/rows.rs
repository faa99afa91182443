//! Records as rows of a table, for the sinks that write tables: the
//! columns a record type has and the values a record gives them. Apart from
//! any one system's feature, so that code generic over its sink's records
//! needs no database crate.

use serde::{Deserialize, Serialize};
use tidemark_core::UserError;

/// A column's SQL type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlType {
    /// `bigint`.
    BigInt,
    /// `text`.
    Text,
}

impl SqlType {
    /// Its name in SQL.
    pub fn name(self) -> &'static str {
        match self {
            SqlType::BigInt => "bigint",
            SqlType::Text => "text",
        }
    }
}

/// A column of a [`Row`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Its name, as the record's field.
    pub name: &'static str,
    /// Its type.
    pub sql_type: SqlType,
}

/// One field of a row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Value {
    /// A `bigint`.
    BigInt(i64),
    /// A `text`.
    Text(String),
}

/// A record as a row of the table.
pub trait Row: Send + 'static {
    /// The columns, the key's first.
    fn columns() -> Vec<Column>;
    /// How many of the first columns are the key: the primary key in
    /// upsert mode.
    fn key_columns() -> usize;
    /// Appends the record's fields, in the order of [`columns`](Row::columns).
    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError>;
}

/// A field of a record as a column.
pub trait SqlField {
    /// Its type.
    const SQL_TYPE: SqlType;
    /// Its value.
    fn value(&self) -> Result<Value, UserError>;
}

/// As `bigint`, refused past its range.
impl SqlField for u64 {
    const SQL_TYPE: SqlType = SqlType::BigInt;

    fn value(&self) -> Result<Value, UserError> {
        i64::try_from(*self)
            .map(Value::BigInt)
            .map_err(|_| format!("{self} does not fit PostgreSQL's bigint").into())
    }
}

impl SqlField for i64 {
    const SQL_TYPE: SqlType = SqlType::BigInt;

    fn value(&self) -> Result<Value, UserError> {
        Ok(Value::BigInt(*self))
    }
}

impl SqlField for String {
    const SQL_TYPE: SqlType = SqlType::Text;

    fn value(&self) -> Result<Value, UserError> {
        Ok(Value::Text(self.clone()))
    }
}

/// A count per key, as wordcount writes it: columns `key` and `count`.
impl<K: SqlField + Send + 'static> Row for (K, u64) {
    fn columns() -> Vec<Column> {
        vec![
            Column {
                name: "key",
                sql_type: K::SQL_TYPE,
            },
            Column {
                name: "count",
                sql_type: SqlType::BigInt,
            },
        ]
    }

    fn key_columns() -> usize {
        1
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        out.push(self.0.value()?);
        out.push(self.1.value()?);
        Ok(())
    }
}

/// Rows as JSON objects keyed by column name (`{"key":"a","count":3}`):
/// the lines of JSON-lines files and the values of Kafka records.
#[cfg(any(feature = "files", feature = "kafka"))]
pub struct JsonObjects {
    /// Each column's name as a JSON string and a colon: `"key":`.
    names: Vec<String>,
    keys: usize,
    values: Vec<Value>,
}

#[cfg(any(feature = "files", feature = "kafka"))]
impl JsonObjects {
    /// For records `T`.
    pub fn new<T: Row>() -> Self {
        let names = T::columns()
            .iter()
            .map(|c| format!("{}:", serde_json::Value::from(c.name)))
            .collect();
        JsonObjects {
            names,
            keys: T::key_columns(),
            values: Vec::new(),
        }
    }

    /// Appends `record` as an object.
    pub fn write<T: Row>(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), UserError> {
        use std::io::Write;
        self.values.clear();
        record.values(&mut self.values)?;
        out.push(b'{');
        for (i, (name, value)) in self.names.iter().zip(&self.values).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(name.as_bytes());
            match value {
                Value::BigInt(n) => write!(out, "{n}")?,
                Value::Text(s) => serde_json::to_writer(&mut *out, s)?,
            }
        }
        out.push(b'}');
        Ok(())
    }

    /// Appends the key of the record written last: one key column as its
    /// text, several as a JSON array.
    pub fn write_key(&self, out: &mut Vec<u8>) -> Result<(), UserError> {
        let keys = &self.values[..self.keys.min(self.values.len())];
        match keys {
            [Value::Text(text)] => out.extend_from_slice(text.as_bytes()),
            [Value::BigInt(n)] => out.extend_from_slice(n.to_string().as_bytes()),
            several => {
                let json: Vec<serde_json::Value> = several
                    .iter()
                    .map(|value| match value {
                        Value::BigInt(n) => (*n).into(),
                        Value::Text(s) => s.as_str().into(),
                    })
                    .collect();
                serde_json::to_writer(&mut *out, &json)?;
            }
        }
        Ok(())
    }
}
