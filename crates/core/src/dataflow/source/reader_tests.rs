use super::*;
use crate::dataflow::source::splits::{DiscoveryFuture, SourceSplit, SplitEnumerator};
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

/// Named lists of records; each a split, and the positions of each
/// completed checkpoint it was told of. Its enumerator is unused here.
struct Lists<T>(HashMap<String, Vec<T>>, std::sync::Mutex<Vec<Vec<Part>>>);

impl<T: Clone + Send + Sync + 'static> SplitEnumerator for Lists<T> {
    type Split = Part;
    type State = ();

    fn discover(&self, _: (), _: u32) -> DiscoveryFuture<Part, ()> {
        unreachable!("readers do not discover")
    }

    fn monitor_interval(&self) -> Option<Duration> {
        None
    }
}

struct PartReader<T> {
    part: Part,
    records: Vec<T>,
}

impl<T: Clone + Send> SplitReader<T, Part> for PartReader<T> {
    fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<SourceStatus, UserError> {
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

impl<T: Clone + Send + Sync + 'static> SplitSource<T> for Lists<T> {
    fn open(&self, part: Part) -> Result<Box<dyn SplitReader<T, Part>>, UserError> {
        let records = self
            .0
            .get(&part.name)
            .ok_or_else(|| format!("no list {}", part.name))?
            .clone();
        Ok(Box::new(PartReader { part, records }))
    }

    fn checkpoint_complete(&self, splits: &[Part]) -> Result<(), UserError> {
        self.1.lock().unwrap().push(splits.to_vec());
        Ok(())
    }
}

fn source() -> Arc<Lists<u64>> {
    Arc::new(Lists(
        HashMap::from([
            ("a".to_owned(), vec![1, 2, 3]),
            ("b".to_owned(), vec![10, 20]),
        ]),
        Default::default(),
    ))
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
fn a_completed_checkpoint_hands_the_source_the_positions_its_snapshot_held() {
    let lists = source();
    let mut reader = SourceReader::new(lists.clone());
    reader.add_splits(vec![split("a", 0)]).unwrap();
    let part = |next| Part {
        name: "a".into(),
        next,
    };
    let mut out = Vec::new();
    for (checkpoint, read) in [(1, 1), (2, 1), (3, 0)] {
        reader.read(&mut out, read).unwrap();
        reader
            .snapshot(CheckpointId(checkpoint), &mut BTreeMap::new())
            .unwrap();
    }
    // 1 is superseded by 2, whose positions are not those read since.
    reader.read(&mut out, 1).unwrap();
    reader.notify_complete(CheckpointId(2)).unwrap();
    reader.notify_complete(CheckpointId(1)).unwrap();
    assert_eq!(*lists.1.lock().unwrap(), [vec![part(2)]]);
    reader.notify_complete(CheckpointId(3)).unwrap();
    assert_eq!(*lists.1.lock().unwrap(), [vec![part(2)], vec![part(2)]]);
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
    reader.snapshot(CheckpointId(1), &mut entries).unwrap();
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

#[test]
fn state_of_the_other_kind_of_source_is_refused_not_read_again() {
    let mut reader = SourceReader::new(source());
    reader.add_splits(vec![split("a", 0)]).unwrap();
    let mut splits = BTreeMap::new();
    reader.snapshot(CheckpointId(1), &mut splits).unwrap();
    let items = std::sync::Arc::new(vec![1u64, 2, 3]);
    let ctx = crate::dataflow::source::SourceContext {
        subtask: crate::model::ids::SubtaskIndex(0),
        parallelism: 1,
        start: None,
    };
    let mut indexed = Indexed::<u64>(Box::new(crate::dataflow::source::Items::new(items, ctx)));
    let error = indexed.restore(&splits).unwrap_err().to_string();
    assert!(error.contains("holds splits of a split source"), "{error}");

    let mut position = BTreeMap::new();
    indexed.snapshot(CheckpointId(1), &mut position).unwrap();
    let error = SourceReader::new(source())
        .restore(&position)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("holds an index source's position"),
        "{error}"
    );
}

/// A record at an event time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct At(u64);

impl crate::time::Timestamped for At {
    fn timestamp(&self) -> u64 {
        self.0
    }
}

#[test]
fn reading_one_split_ahead_makes_no_record_of_another_late() {
    use crate::dataflow::operator::{RecordWriter, Route};
    use crate::dataflow::task::{ChainTask, Task};
    use crate::time::{WatermarkEvent, WatermarkStrategy};
    // A morning and an afternoon, read in turn two records at a time.
    let lists = Lists(
        HashMap::from([
            (
                "morning".to_owned(),
                (0..10).map(|i| At(1_000 + i)).collect(),
            ),
            (
                "afternoon".to_owned(),
                (0..10).map(|i| At(9_000 + i)).collect(),
            ),
        ]),
        Default::default(),
    );
    let reader = Box::new(SourceReader::new(Arc::new(lists)));
    let writer = Box::new(RecordWriter::<At>::new(Route::Forward, 0, 1, 1 << 10));
    let strategy = WatermarkStrategy::monotonous();
    let mut task = ChainTask::source_with_watermarks(reader, strategy, Arc::default(), writer);
    task.add_splits(vec![split("morning", 0), split("afternoon", 0)])
        .unwrap();
    let (mut watermark, mut events, mut read) = (None, Vec::new(), 0);
    for now in 0..20 {
        let mut out = Vec::new();
        task.produce(2, now, &mut out).unwrap();
        for (_, batch) in out {
            for At(ts) in batch.into_records::<At>().unwrap() {
                assert!(
                    Some(ts) > watermark,
                    "{ts} came after watermark {watermark:?}"
                );
                read += 1;
            }
        }
        task.take_watermarks(&mut events);
        for event in events.drain(..) {
            if let WatermarkEvent::Watermark(w) = event {
                watermark = Some(w);
            }
        }
    }
    assert_eq!(read, 20);
    // Once both are read, the last record counts.
    assert_eq!(watermark, Some(9_008));
}
