use super::*;
use crate::source::splits::{DiscoveryFuture, SourceSplit, SplitEnumerator};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;

/// Split `name` of a [`Lists`] source, read up to `next`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Part {
    name: String,
    next: usize,
}

impl SourceSplit for Part {
    fn split_id(&self) -> String {
        self.name.clone()
    }
}

/// Named lists of numbers; each a split. Its enumerator is unused here.
struct Lists(HashMap<String, Vec<u64>>);

impl SplitEnumerator for Lists {
    type Split = Part;
    type State = ();

    fn discover(&self, _: ()) -> DiscoveryFuture<Part, ()> {
        unreachable!("readers do not discover")
    }

    fn monitor_interval(&self) -> Option<Duration> {
        None
    }
}

struct PartReader {
    part: Part,
    records: Vec<u64>,
}

impl SplitReader<u64, Part> for PartReader {
    fn read(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourceStatus, UserError> {
        let end = (self.part.next + max).min(self.records.len());
        out.extend_from_slice(&self.records[self.part.next..end]);
        self.part.next = end;
        Ok(if end == self.records.len() {
            SourceStatus::Finished
        } else {
            SourceStatus::Running
        })
    }

    fn split(&self) -> Part {
        self.part.clone()
    }
}

impl SplitSource<u64> for Lists {
    fn open(&self, part: Part) -> Result<Box<dyn SplitReader<u64, Part>>, UserError> {
        let records = self
            .0
            .get(&part.name)
            .ok_or_else(|| format!("no list {}", part.name))?
            .clone();
        Ok(Box::new(PartReader { part, records }))
    }
}

fn source() -> Arc<Lists> {
    Arc::new(Lists(HashMap::from([
        ("a".to_owned(), vec![1, 2, 3]),
        ("b".to_owned(), vec![10, 20]),
    ])))
}

fn split(name: &str, next: usize) -> SplitBytes {
    SplitBytes::encode(&Part {
        name: name.into(),
        next,
    })
    .unwrap()
}

#[test]
fn reads_its_splits_in_turn_asks_once_when_empty_and_ends_when_told() {
    let mut reader = SourceReader::new(source());
    let mut out = Vec::new();
    assert_eq!(reader.read(&mut out, 2).unwrap(), SourceStatus::Running);
    assert!(reader.take_request(), "it holds nothing: it asks");
    assert_eq!(reader.read(&mut out, 2).unwrap(), SourceStatus::Running);
    assert!(!reader.take_request(), "one request until splits come");
    reader
        .add_splits(vec![split("a", 0), split("b", 0)])
        .unwrap();
    for _ in 0..3 {
        assert_eq!(reader.read(&mut out, 2).unwrap(), SourceStatus::Running);
    }
    assert_eq!(out, [1, 2, 10, 20, 3]);
    assert!(reader.take_request(), "both read: it asks again");
    reader.no_more_splits().unwrap();
    assert_eq!(reader.read(&mut out, 2).unwrap(), SourceStatus::Finished);
}

#[test]
fn a_restored_reader_resumes_each_split_after_the_records_read() {
    let mut reader = SourceReader::new(source());
    reader
        .add_splits(vec![split("a", 0), split("b", 0)])
        .unwrap();
    let mut out = Vec::new();
    reader.read(&mut out, 2).unwrap();
    let mut entries = BTreeMap::new();
    reader.snapshot(&mut entries).unwrap();
    assert_eq!(reader.splits().unwrap(), [split("b", 0), split("a", 2)]);

    let mut restored = SourceReader::new(source());
    restored.restore(&entries).unwrap();
    let mut after = Vec::new();
    while restored.read(&mut after, 10).unwrap() == SourceStatus::Running {
        if restored.take_request() {
            restored.no_more_splits().unwrap();
        }
    }
    assert_eq!(out, [1, 2]);
    assert_eq!(after, [10, 20, 3]);
}

#[test]
fn a_split_of_another_source_is_refused_with_its_id() {
    let mut reader = SourceReader::new(source());
    let foreign = SplitBytes {
        id: "topic-0".into(),
        bytes: vec![0xc1],
    };
    let error = reader.add_splits(vec![foreign]).unwrap_err().to_string();
    assert!(
        error.contains("split topic-0 is not one of this source's"),
        "{error}"
    );
    let error = reader
        .add_splits(vec![split("c", 0)])
        .unwrap_err()
        .to_string();
    assert_eq!(error, "source failed: cannot open split c: no list c");
}
