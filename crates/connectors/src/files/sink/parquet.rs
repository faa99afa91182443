//! Records as Parquet: each part file is one row group of a record's
//! [`Row`] columns (`bigint` as INT64, `text` as UTF8), snappy-compressed,
//! written when the file is sealed.

use super::encode::Encoder;
use crate::rows::{Row, SqlType, Value};
use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::sync::Arc;
use tidemark_core::UserError;

enum Column {
    BigInt(Int64Builder),
    Text(StringBuilder),
}

/// A part file's rows, held in columns until it is sealed.
pub struct Parquet {
    schema: Arc<Schema>,
    columns: Vec<Column>,
    rows: usize,
    /// Roughly what the held rows take, for the roll size.
    held: u64,
    values: Vec<Value>,
}

impl Parquet {
    /// For records `T`.
    pub fn new<T: Row>() -> Self {
        let columns = T::columns();
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| {
                let data_type = match c.sql_type {
                    SqlType::BigInt => DataType::Int64,
                    SqlType::Text => DataType::Utf8,
                };
                Field::new(c.name, data_type, false)
            })
            .collect();
        Parquet {
            schema: Arc::new(Schema::new(fields)),
            columns: columns
                .iter()
                .map(|c| match c.sql_type {
                    SqlType::BigInt => Column::BigInt(Int64Builder::new()),
                    SqlType::Text => Column::Text(StringBuilder::new()),
                })
                .collect(),
            rows: 0,
            held: 0,
            values: Vec::new(),
        }
    }
}

impl<T: Row> Encoder<T> for Parquet {
    fn encode(&mut self, record: &T, _out: &mut Vec<u8>) -> Result<(), UserError> {
        self.values.clear();
        record.values(&mut self.values)?;
        for (column, value) in self.columns.iter_mut().zip(self.values.drain(..)) {
            match (column, value) {
                (Column::BigInt(b), Value::BigInt(n)) => {
                    b.append_value(n);
                    self.held += 8;
                }
                (Column::Text(b), Value::Text(s)) => {
                    b.append_value(&s);
                    self.held += s.len() as u64 + 4;
                }
                _ => return Err("a record's value does not have its column's type".into()),
            }
        }
        self.rows += 1;
        Ok(())
    }

    fn held(&self) -> u64 {
        self.held
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), UserError> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|c| -> ArrayRef {
                match c {
                    Column::BigInt(b) => Arc::new(b.finish()),
                    Column::Text(b) => Arc::new(b.finish()),
                }
            })
            .collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)?;
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(self.rows.max(1)))
            .build();
        let mut writer =
            ArrowWriter::try_new(std::mem::take(out), self.schema.clone(), Some(properties))?;
        writer.write(&batch)?;
        *out = writer.into_inner()?;
        (self.rows, self.held) = (0, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn a_file_is_one_row_group_a_parquet_reader_reads_back() {
        let mut encoder = Parquet::new::<(String, u64)>();
        let mut out = Vec::new();
        for (key, count) in [("a", 1u64), ("b,\"c\"", 2)] {
            Encoder::<(String, u64)>::encode(&mut encoder, &(key.to_string(), count), &mut out)
                .unwrap();
        }
        assert!(out.is_empty(), "rows are held until the file ends");
        assert!(Encoder::<(String, u64)>::held(&encoder) > 0);
        Encoder::<(String, u64)>::finish(&mut encoder, &mut out).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(out)).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 1);
        let batches: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
        let batch = &batches[0];
        assert_eq!(batch.schema().field(0).name(), "key");
        let keys: Vec<&str> = batch
            .column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        let counts: Vec<i64> = batch
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!((keys, counts), (vec!["a", "b,\"c\""], vec![1, 2]));
    }
}
