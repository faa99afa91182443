//! How records become the bytes of a part file: CSV and JSON lines, from
//! a record's [`Row`] columns, or any encoding a job brings.

use crate::rows::{Column, JsonObjects, Row, Value};
use std::io::Write;
use std::sync::Arc;
use tidemark_core::UserError;

/// Writes records into a part file, as Flink's `Encoder` (a row format)
/// or `BulkWriter` (a columnar one, which holds rows back until the file
/// ends). One encoder serves one part file, so it may begin each file
/// with a header.
pub trait Encoder<T>: Send {
    /// Appends `record`, with its line end, to `out`, or holds it back.
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), UserError>;

    /// About how many bytes the records held back take: they count
    /// toward the roll size.
    fn held(&self) -> u64 {
        0
    }

    /// The file ends: appends what was held back, and any footer.
    fn finish(&mut self, _out: &mut Vec<u8>) -> Result<(), UserError> {
        Ok(())
    }
}

/// Makes the encoder of each new part file.
pub type EncoderFactory<T> = Arc<dyn Fn() -> Box<dyn Encoder<T>> + Send + Sync>;

/// Records as CSV rows in the order of their columns, fields quoted when
/// they hold a comma, a quote or a line break.
pub struct Csv {
    /// The header line still to write at the file's start.
    header: Option<Vec<Column>>,
    values: Vec<Value>,
}

impl Csv {
    /// With a header line of the column names when `header`.
    pub fn new<T: Row>(header: bool) -> Self {
        Csv {
            header: header.then(T::columns),
            values: Vec::new(),
        }
    }
}

impl<T: Row> Encoder<T> for Csv {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), UserError> {
        if let Some(columns) = self.header.take() {
            let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
            writeln!(out, "{}", names.join(","))?;
        }
        self.values.clear();
        record.values(&mut self.values)?;
        for (i, value) in self.values.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match value {
                Value::BigInt(n) => write!(out, "{n}")?,
                Value::Text(s) if s.contains([',', '"', '\n', '\r']) => {
                    write!(out, "\"{}\"", s.replace('"', "\"\""))?
                }
                Value::Text(s) => out.extend_from_slice(s.as_bytes()),
            }
        }
        out.push(b'\n');
        Ok(())
    }
}

/// Records as JSON objects, one per line, keyed by column name.
pub struct JsonLines(JsonObjects);

impl JsonLines {
    /// For records `T`.
    pub fn new<T: Row>() -> Self {
        JsonLines(JsonObjects::new::<T>())
    }
}

impl<T: Row> Encoder<T> for JsonLines {
    fn encode(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), UserError> {
        self.0.write(record, out)?;
        out.push(b'\n');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode<T: Row>(encoder: &mut dyn Encoder<T>, records: &[T]) -> String {
        let mut out = Vec::new();
        for record in records {
            encoder.encode(record, &mut out).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_quotes_what_would_split_a_field() {
        let records = [("plain".to_string(), 1u64), ("a,\"b\"".to_string(), 2)];
        assert_eq!(
            encode(&mut Csv::new::<(String, u64)>(true), &records),
            "key,count\nplain,1\n\"a,\"\"b\"\"\",2\n"
        );
        assert_eq!(
            encode(&mut Csv::new::<(u64, u64)>(false), &[(7u64, 3u64)]),
            "7,3\n"
        );
    }

    #[test]
    fn json_lines_are_objects_a_json_reader_reads_back() {
        let records = [("line\n\"quoted\"".to_string(), 5u64)];
        let text = encode(&mut JsonLines::new::<(String, u64)>(), &records);
        let back: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"key": "line\n\"quoted\"", "count": 5})
        );
        assert_eq!(text.lines().count(), 1);
    }
}
