use super::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Instant;
use tidemark_core::dataflow::source::{Discovery, SourceStatus};

#[derive(Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord, Clone)]
struct Event {
    key: String,
    ts: u64,
}

fn write(dir: &std::path::Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn events(from: u64, to: u64) -> String {
    (from..to)
        .map(|i| format!("{{\"key\":\"k{}\",\"ts\":{i}}}\n", i % 5))
        .collect()
}

fn source<T>(dir: &std::path::Path, query: &str) -> FileSource<T> {
    FileSource::from_url(&format!("{}?{query}", dir.display())).unwrap()
}

async fn discover<T: Send + 'static>(
    source: &FileSource<T>,
    seen: SeenFiles,
) -> Discovery<FileSplit, SeenFiles> {
    source.discover(seen, 2).await.unwrap()
}

/// Reads `split` to its end, or `limit` records; the records and where
/// the reader stood.
fn read<T: DeserializeOwned + Send + 'static>(
    source: &FileSource<T>,
    split: FileSplit,
    limit: usize,
) -> Result<(Vec<T>, FileSplit), String> {
    let mut reader = source.open(split).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < limit {
        let max = (limit - out.len()).min(3);
        match reader.read(&mut out, max).map_err(|e| e.to_string())? {
            SourceStatus::Finished => break,
            SourceStatus::Running => {
                assert!(Instant::now() < deadline, "the split was never read");
                std::thread::yield_now();
            }
        }
    }
    Ok((out, reader.split()))
}

#[tokio::test]
async fn every_record_of_every_visible_file_is_read_once_whatever_the_split_size() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.jsonl", &events(0, 40));
    write(dir.path(), "day=1/b.jsonl", &events(40, 45));
    write(dir.path(), ".b.jsonl.inprogress", &events(100, 110));
    write(dir.path(), "_SUCCESS", "");
    write(dir.path(), "_temporary/c.jsonl", &events(200, 210));
    for split_size in [7, 100, 1 << 20] {
        let source = source::<Event>(dir.path(), &format!("format=jsonl&split-size={split_size}"));
        let found = discover(&source, SeenFiles::default()).await;
        let files: std::collections::BTreeSet<&str> =
            found.splits.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(files.len(), 2, "{files:?}");
        let mut ts = Vec::new();
        for split in found.splits {
            ts.extend(
                read(&source, split, usize::MAX)
                    .unwrap()
                    .0
                    .iter()
                    .map(|e| e.ts),
            );
        }
        ts.sort();
        assert_eq!(ts, (0..45).collect::<Vec<_>>(), "split size {split_size}");
    }
}

#[tokio::test]
async fn a_split_reopened_at_its_position_reads_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.jsonl", &events(0, 30));
    let source = source::<Event>(dir.path(), "format=jsonl&split-size=200");
    let splits = discover(&source, SeenFiles::default()).await.splits;
    assert!(splits.len() > 1);
    let mut ts = Vec::new();
    for split in splits {
        let (first, at) = read(&source, split, 2).unwrap();
        let (rest, end) = read(&source, at.clone(), usize::MAX).unwrap();
        assert!(end.offset >= at.offset);
        ts.extend(first.into_iter().chain(rest).map(|e| e.ts));
    }
    ts.sort();
    assert_eq!(ts, (0..30).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_continuous_source_finds_only_new_files_and_forgets_old_names() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "1.jsonl", &events(0, 1));
    // Stamped well before any listing's time, whatever the clock's grain.
    let earlier = std::time::SystemTime::now() - Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(dir.path().join("1.jsonl"))
        .unwrap()
        .set_modified(earlier)
        .unwrap();
    let source = source::<Event>(dir.path(), "format=jsonl&monitor-interval=1s&late-files=0s");
    let first = discover(&source, SeenFiles::default()).await;
    assert_eq!(first.splits.len(), 1);
    let again = discover(&source, first.state.clone()).await;
    assert!(again.splits.is_empty(), "{:?}", again.splits);
    // A later file (its modification time set past the first's).
    write(dir.path(), "2.jsonl", &events(1, 2));
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(dir.path().join("2.jsonl"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    let next = discover(&source, first.state).await;
    assert_eq!(next.splits.len(), 1);
    assert_eq!(next.splits[0].path, "2.jsonl");
    // With no lateness allowed, only the newest file is remembered by name.
    assert_eq!(next.state.recent.keys().collect::<Vec<_>>(), ["2.jsonl"]);
    assert_eq!(source.monitor_interval(), Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn a_malformed_line_fails_naming_file_and_offset_or_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.jsonl",
        "{\"key\":\"a\",\"ts\":1}\n{\"key\":\n\n{\"key\":\"b\",\"ts\":2}\n",
    );
    let failing = source::<Event>(dir.path(), "format=jsonl");
    let split = discover(&failing, SeenFiles::default())
        .await
        .splits
        .remove(0);
    let error = read(&failing, split.clone(), usize::MAX).unwrap_err();
    assert!(
        error.starts_with("a.jsonl, byte 19: not a JSON record"),
        "{error}"
    );
    let skipping = source::<Event>(dir.path(), "format=jsonl&on-error=skip");
    let (read, _) = read(&skipping, split, usize::MAX).unwrap();
    assert_eq!(read.iter().map(|e| e.ts).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(skipping.skipped(), 1);
}

#[tokio::test]
async fn csv_rows_are_named_by_the_header_in_every_split() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..20).map(|i| format!("k{i},{i}\r\n")).collect();
    write(dir.path(), "a.csv", &format!("key,ts\r\n{rows}"));
    let source = source::<Event>(dir.path(), "format=csv&split-size=16");
    let splits = discover(&source, SeenFiles::default()).await.splits;
    assert!(splits.len() > 3);
    let mut got = BTreeMap::new();
    for split in splits {
        for e in read(&source, split, usize::MAX).unwrap().0 {
            assert!(got.insert(e.ts, e.key).is_none());
        }
    }
    assert_eq!(got.len(), 20);
    assert_eq!(got[&7], "k7");
}

#[tokio::test]
async fn text_lines_are_strings() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.txt", "to be\nor not\n");
    let source = source::<String>(dir.path(), "format=text");
    let split = discover(&source, SeenFiles::default())
        .await
        .splits
        .remove(0);
    assert_eq!(
        read(&source, split, usize::MAX).unwrap().0,
        ["to be", "or not"]
    );
}

#[test]
fn bad_urls_are_refused_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let error = |query: &str| {
        FileSource::<String>::from_url(&format!("{}?{query}", dir.path().display()))
            .err()
            .unwrap()
            .to_string()
    };
    assert!(error("format=xml").ends_with("format=xml: expected text, jsonl, csv or parquet"));
    assert!(error("split-size=0").ends_with("split-size=0: expected bytes > 0"));
    assert!(error("monitor-interval=soon").contains("monitor-interval=soon"));
    assert!(error("colour=red").ends_with("unknown option \"colour\""));
    let missing = FileSource::<String>::from_url("/no/such/dir?format=text")
        .err()
        .unwrap()
        .to_string();
    assert!(missing.contains("/no/such/dir"), "{missing}");
}

/// A Parquet file of `Event`s `from..to` in row groups of `group` rows.
#[cfg(feature = "parquet")]
fn write_parquet(dir: &std::path::Path, name: &str, from: u64, to: u64, group: usize) {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    let keys: StringArray = (from..to).map(|i| Some(format!("k{}", i % 5))).collect();
    let ts = Int64Array::from_iter_values((from..to).map(|i| i as i64));
    let batch = RecordBatch::try_from_iter([
        ("key", Arc::new(keys) as ArrayRef),
        ("ts", Arc::new(ts) as ArrayRef),
    ])
    .unwrap();
    let properties = ::parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(group))
        .build();
    let file = std::fs::File::create(dir.join(name)).unwrap();
    let mut writer =
        ::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

#[cfg(feature = "parquet")]
#[tokio::test]
async fn a_parquet_row_group_is_a_split_reopened_at_its_row() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(dir.path(), "a.parquet", 0, 25, 10);
    let source: FileSource<Event> = source(dir.path(), "format=parquet");
    let splits = discover(&source, SeenFiles::default()).await.splits;
    let rows: Vec<(Option<usize>, u64)> = splits.iter().map(|s| (s.row_group, s.end)).collect();
    assert_eq!(rows, [(Some(0), 10), (Some(1), 10), (Some(2), 5)]);
    // Read 4 rows of the second group, then reopen where the reader stood.
    let (first, at) = read(&source, splits[1].clone(), 4).unwrap();
    assert_eq!(at.offset, 4);
    let (rest, end) = read(&source, at, usize::MAX).unwrap();
    let ts: Vec<u64> = first.iter().chain(&rest).map(|e| e.ts).collect();
    assert_eq!(ts, (10..20).collect::<Vec<_>>());
    assert_eq!(end.offset, 10);
    assert_eq!(
        rest[0],
        Event {
            key: "k4".into(),
            ts: 14
        }
    );
}

#[cfg(feature = "parquet")]
#[tokio::test]
async fn a_file_that_is_not_parquet_fails_naming_it_or_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(dir.path(), "good.parquet", 0, 5, 10);
    let bytes = std::fs::read(dir.path().join("good.parquet")).unwrap();
    std::fs::write(dir.path().join("cut.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let failing: FileSource<Event> = source(dir.path(), "format=parquet");
    let Err(err) = failing.discover(SeenFiles::default(), 2).await else {
        panic!("a cut Parquet file was listed");
    };
    assert!(err.to_string().contains("cut.parquet"), "{err}");
    let skipping: FileSource<Event> = source(dir.path(), "format=parquet&on-error=skip");
    let splits = discover(&skipping, SeenFiles::default()).await.splits;
    assert_eq!(splits.len(), 1);
    assert_eq!(skipping.skipped(), 1);
}
