//! The sink against a local directory and an in-memory store's multipart
//! uploads: what is visible when, and what a restore leaves.

use super::*;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use tidemark_core::model::ids::SubtaskIndex;

fn ctx(subtask: u32) -> SinkContext {
    SinkContext {
        subtask: SubtaskIndex(subtask),
        parallelism: 2,
        attempt: tidemark_core::model::ids::Attempt::default(),
    }
}

fn config(url: &str, query: &str) -> FileSinkConfig {
    FileSinkConfig::from_url(&format!("{url}?{query}")).unwrap()
}

fn sink(config: &FileSinkConfig, run: &str) -> Box<dyn Sink<(u64, u64)>> {
    Box::new(FileSink::new(config, run, ctx(0)))
}

/// Every object or file under the sink's directory, with its contents:
/// what a reader listing it would see, hidden names included.
fn listing(config: &FileSinkConfig) -> Vec<(String, String)> {
    let Location { store, prefix, .. } = Location::open(config.url(), false).unwrap();
    let mut out: Vec<(String, String)> = futures::executor::block_on(async {
        let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
        let mut out = Vec::new();
        for meta in listed {
            let bytes = store
                .get(&meta.location)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            let relative = meta.location.prefix_match(&prefix).unwrap();
            let name = relative
                .map(|p| p.as_ref().to_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((name, String::from_utf8(bytes.to_vec()).unwrap()));
        }
        out
    });
    out.sort();
    out
}

/// The committed files: no component hidden by `.` or `_`.
fn visible(config: &FileSinkConfig) -> Vec<(String, String)> {
    listing(config)
        .into_iter()
        .filter(|(name, _)| !name.split('/').any(|c| c.starts_with(['.', '_'])))
        .collect()
}

/// A local directory and an in-memory store, each with a unique name.
fn directories() -> Vec<(String, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    // Tests run in parallel, several in the same millisecond.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!(
        "memory://sink-{}-{}-{n}/out",
        std::process::id(),
        millis(SystemTime::now())
    );
    vec![
        (dir.path().to_str().unwrap().to_owned(), Some(dir)),
        (name, None),
    ]
}

#[test]
fn nothing_is_visible_before_its_checkpoint_completes() {
    for (url, _dir) in directories() {
        let config = config(&url, "format=csv");
        let _hold = Location::open(&url, true).unwrap();
        let mut s = sink(&config, "r1");
        s.write(&mut vec![(1, 1)]).unwrap();
        s.pre_commit(CheckpointId(1)).unwrap();
        s.write(&mut vec![(1, 2)]).unwrap();
        s.pre_commit(CheckpointId(2)).unwrap();
        assert!(visible(&config).is_empty(), "{url}");
        s.commit(CheckpointId(1)).unwrap();
        assert_eq!(
            visible(&config),
            [("part-0-r1-0.csv".into(), "1,1\n".into())],
            "{url}"
        );
        s.commit(CheckpointId(2)).unwrap();
        assert_eq!(visible(&config).len(), 2, "{url}");
        assert_eq!(listing(&config).len(), 2, "{url}: nothing hidden is left");
    }
}

/// A rescale removed subtask 0's index and a later one added it back in
/// the same run: the new sink, without state, writes beside the old
/// one's committed file instead of over it, and aborts only what was
/// never committed.
#[test]
fn a_sink_added_back_by_a_rescale_keeps_the_committed_files_of_its_index() {
    for (url, _dir) in directories() {
        let config = config(&url, "format=csv");
        let _hold = Location::open(&url, true).unwrap();
        let mut removed = sink(&config, "r");
        removed.write(&mut vec![(1, 1)]).unwrap();
        removed.pre_commit(CheckpointId(1)).unwrap();
        removed.commit(CheckpointId(1)).unwrap();
        removed.write(&mut vec![(1, 2)]).unwrap();
        drop(removed);
        // Added back once before, in attempt 2, and failed before its
        // first checkpoint: what it left is aborted too.
        let earlier = SinkContext {
            attempt: tidemark_core::model::ids::Attempt(2),
            ..ctx(0)
        };
        let mut failed: Box<dyn Sink<(u64, u64)>> = Box::new(FileSink::new(&config, "r", earlier));
        failed.write(&mut vec![(9, 9)]).unwrap();
        failed.pre_commit(CheckpointId(2)).unwrap();
        drop(failed);
        let later = SinkContext {
            attempt: tidemark_core::model::ids::Attempt(3),
            ..ctx(0)
        };
        let mut added: Box<dyn Sink<(u64, u64)>> = Box::new(FileSink::new(&config, "r", later));
        added.restore(None).unwrap();
        added.write(&mut vec![(2, 1)]).unwrap();
        added.finish().unwrap();
        assert_eq!(
            listing(&config),
            [
                ("part-0-r-0.csv".into(), "1,1\n".into()),
                ("part-0-r.3-0.csv".into(), "2,1\n".into()),
            ],
            "{url}"
        );
    }
}

#[test]
fn a_restore_commits_its_checkpoint_and_aborts_the_rest() {
    for (url, _dir) in directories() {
        let config = config(&url, "format=jsonl");
        let _hold = Location::open(&url, true).unwrap();
        let mut crashed = sink(&config, "r1");
        crashed.write(&mut vec![(1, 1)]).unwrap();
        let state = crashed.pre_commit(CheckpointId(1)).unwrap();
        // Pre-committed for 2, never completed; then a file in progress.
        crashed.write(&mut vec![(1, 2)]).unwrap();
        crashed.pre_commit(CheckpointId(2)).unwrap();
        crashed.write(&mut vec![(1, 3)]).unwrap();
        drop(crashed);

        let mut restored = sink(&config, "r2");
        restored.restore(Some(&state)).unwrap();
        let first = (
            "part-0-r1-0.jsonl".to_owned(),
            "{\"key\":1,\"count\":1}\n".to_owned(),
        );
        assert_eq!(
            listing(&config),
            std::slice::from_ref(&first),
            "{url}: only the restored checkpoint's file"
        );
        // The restored sink goes on in the run and numbering it was restored from.
        restored.write(&mut vec![(1, 2)]).unwrap();
        restored.finish().unwrap();
        let second = (
            "part-0-r1-1.jsonl".to_owned(),
            "{\"key\":1,\"count\":2}\n".to_owned(),
        );
        assert_eq!(listing(&config), [first.clone(), second.clone()], "{url}");
        // Restoring twice is harmless: committed stays committed.
        sink(&config, "r3").restore(Some(&state)).unwrap();
        assert_eq!(listing(&config), [first, second], "{url}");
    }
}

#[test]
fn a_restart_before_any_checkpoint_drops_what_the_failed_attempt_wrote() {
    for (url, _dir) in directories() {
        let config = config(&url, "format=csv");
        let _hold = Location::open(&url, true).unwrap();
        let mut failed = sink(&config, "r1");
        failed.write(&mut vec![(1, 1)]).unwrap();
        failed.pre_commit(CheckpointId(1)).unwrap();
        failed.write(&mut vec![(1, 2)]).unwrap();
        drop(failed);
        sink(&config, "r1").restore(None).unwrap();
        assert!(listing(&config).is_empty(), "{url}: {:?}", listing(&config));
    }
}

#[test]
fn files_roll_by_size_in_parts_and_buckets_by_record() {
    let url = format!("memory://sink-roll-{}/out", std::process::id());
    let _hold = Location::open(&url, true).unwrap();
    // 4-byte lines: parts of 8 bytes, files of 12.
    let config = config(&url, "format=csv&part-size=8&roll-size=12");
    let mut s = FileSink::<(u64, u64)>::new(&config, "r", ctx(1))
        .bucket_by(Arc::new(|(key, _)| format!("key={key}")));
    s.write(&mut (0..4).map(|i| (1, i)).collect()).unwrap();
    s.write(&mut vec![(2, 9)]).unwrap();
    let uploads = listing(&config)
        .into_iter()
        .filter(|(name, _)| name.starts_with(UPLOADS))
        .count();
    assert_eq!(uploads, 1, "only key 1's first file has uploaded parts yet");
    s.pre_commit(CheckpointId(1)).unwrap();
    s.commit(CheckpointId(1)).unwrap();
    assert_eq!(
        listing(&config),
        [
            ("key=1/part-1-r-0.csv".into(), "1,0\n1,1\n1,2\n".into()),
            ("key=1/part-1-r-1.csv".into(), "1,3\n".into()),
            ("key=2/part-1-r-2.csv".into(), "2,9\n".into()),
        ]
    );
}

#[test]
fn a_rescale_commits_what_a_removed_subtask_pre_committed() {
    for (url, _dir) in directories() {
        let config = config(&url, "format=csv");
        let _hold = Location::open(&url, true).unwrap();
        let mut removed = FileSink::<(u64, u64)>::new(&config, "r", ctx(1));
        removed.write(&mut vec![(5, 1)]).unwrap();
        let state = removed.pre_commit(CheckpointId(1)).unwrap();
        removed.write(&mut vec![(5, 2)]).unwrap();
        removed.pre_commit(CheckpointId(2)).unwrap();
        drop(removed);
        let mut kept = sink(&config, "r");
        kept.restore(None).unwrap();
        kept.adopt(&state).unwrap();
        assert_eq!(
            listing(&config),
            [("part-1-r-0.csv".into(), "5,1\n".into())],
            "{url}"
        );
    }
}

#[test]
fn bad_settings_and_foreign_state_are_errors_naming_them() {
    let error = |url: &str| FileSinkConfig::from_url(url).unwrap_err().to_string();
    assert!(error("/tmp/x?format=text").contains("format=text"));
    assert!(error("/tmp/x?format=avro").contains("format=avro"));
    assert!(error("/tmp/x?bucket=%Q").contains("bucket=%Q"));
    assert!(error("/tmp/x?bucket=../up").contains("\"..\""));
    assert!(error("/tmp/x?roll-size=0").contains("roll-size=0"));
    assert!(error("/tmp/x?colour=red").contains("colour"));
    let dir = tempfile::tempdir().unwrap();
    let mut s = sink(&config(dir.path().to_str().unwrap(), ""), "r");
    let err = s.restore(Some(b"not a sink's state")).unwrap_err();
    assert!(
        err.to_string().contains("file sink's checkpointed state"),
        "{err}"
    );
}

#[test]
fn a_missing_pre_committed_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path().to_str().unwrap(), "");
    let mut s = sink(&config, "r1");
    s.write(&mut vec![(1, 1)]).unwrap();
    let state = s.pre_commit(CheckpointId(1)).unwrap();
    std::fs::remove_file(dir.path().join(".pending-part-0-r1-0.csv")).unwrap();
    let err = sink(&config, "r2").restore(Some(&state)).unwrap_err();
    assert!(
        err.to_string().contains(".pending-part-0-r1-0.csv"),
        "{err}"
    );
}

#[test]
fn time_buckets_follow_the_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path().to_str().unwrap(), "bucket=dt=%Y-%m-%d/hour=%H");
    let bucket = || {
        chrono::Utc::now()
            .format("dt=%Y-%m-%d/hour=%H/")
            .to_string()
    };
    let before = bucket();
    let mut s = sink(&config, "r");
    s.write(&mut vec![(1, 1)]).unwrap();
    s.finish().unwrap();
    let (after, names) = (bucket(), visible(&config));
    assert!(
        names[0].0.starts_with(&before) || names[0].0.starts_with(&after),
        "{names:?}"
    );
}

#[test]
fn the_uploads_a_crashed_run_left_are_listed_and_aborted() {
    let url = format!("memory://sink-leftovers-{}/out", std::process::id());
    let _hold = Location::open(&url, true).unwrap();
    let config = config(&url, "format=csv&part-size=4");
    let mut crashed = sink(&config, "r");
    crashed.write(&mut vec![(1, 1)]).unwrap();
    let state = crashed.pre_commit(CheckpointId(1)).unwrap();
    crashed.write(&mut vec![(2, 2)]).unwrap();
    drop(crashed);
    let open = futures::executor::block_on(config.open_uploads()).unwrap();
    let paths: Vec<&str> = open.iter().map(|u| u.path.as_str()).collect();
    assert_eq!(paths, ["part-0-r-0.csv", "part-0-r-1.csv"]);
    assert_eq!(
        pending_uploads(&state).unwrap(),
        [open[0].id.clone()],
        "the checkpoint names the upload it pre-committed"
    );
    futures::executor::block_on(config.abort(&open[1])).unwrap();
    let left = futures::executor::block_on(config.open_uploads()).unwrap();
    assert_eq!(left, [open[0].clone()]);
    assert_eq!(pending_uploads(b"\x93not a sink"), None);
}

#[cfg(feature = "parquet")]
#[test]
fn parquet_files_are_committed_whole_and_roll_by_their_held_rows() {
    use ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let url = format!("memory://sink-parquet-{}/out", std::process::id());
    let _hold = Location::open(&url, true).unwrap();
    // Two 16-byte rows reach the roll size.
    let config = config(&url, "format=parquet&roll-size=32");
    let mut s = sink(&config, "r");
    s.write(&mut (0..3).map(|i| (i, i * 10)).collect()).unwrap();
    s.pre_commit(CheckpointId(1)).unwrap();
    s.commit(CheckpointId(1)).unwrap();
    let Location { store, prefix, .. } = Location::open(&url, false).unwrap();
    let mut rows = Vec::new();
    for name in ["part-0-r-0.parquet", "part-0-r-1.parquet"] {
        let bytes = futures::executor::block_on(async {
            store
                .get(&prefix.clone().join(name))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
        });
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 1, "{name}");
        for batch in reader.build().unwrap() {
            rows.push(batch.unwrap().num_rows());
        }
    }
    assert_eq!(rows, [2, 1]);
}
