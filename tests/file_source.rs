//! The topologies reading files through the split source, end to end:
//! every word of every file counted exactly once across injected
//! failures, a rescale from a savepoint, and a SIGKILL of a job that keeps
//! finding new files; event-time windows over files of other times.

use tidemark_testkit as common;
use tidemark_testkit::storage;

use common::{committed_lines, copy_tree, spawn_child_job};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidemark_cli::{self as cli, RunArgs, RunReport};

const CHILD: &str = "TIDEMARK_FILE_SOURCE_CHILD_ARGS";
const WORDS_PER_LINE: usize = 6;

/// `files` text files named `{batch}-{n}.txt` of `lines` lines of words
/// `w0`..`w499`, and how often each word occurs.
fn text_files(
    batch: &str,
    files: usize,
    lines: usize,
) -> (Vec<(String, String)>, HashMap<String, u64>) {
    let mut counts = HashMap::new();
    let mut out = Vec::new();
    for f in 0..files {
        let mut text = String::new();
        for l in 0..lines {
            let words: Vec<String> = (0..WORDS_PER_LINE)
                .map(|w| {
                    format!(
                        "w{}",
                        common::splitmix64((f * lines + l) as u64 * 7 + w as u64) % 500
                    )
                })
                .collect();
            for word in &words {
                *counts.entry(word.clone()).or_insert(0) += 1;
            }
            text.push_str(&words.join(" "));
            text.push('\n');
        }
        out.push((format!("{batch}-{f}.txt"), text));
    }
    (out, counts)
}

/// Writes [`text_files`] into `dir`, each under a hidden name first and
/// then moved in, as a producer must; returns the words' counts.
fn write_text(dir: &Path, batch: &str, files: usize, lines: usize) -> HashMap<String, u64> {
    let (files, counts) = text_files(batch, files, lines);
    for (name, text) in files {
        let hidden = dir.join(format!(".{name}"));
        std::fs::write(&hidden, text).unwrap();
        std::fs::rename(&hidden, dir.join(name)).unwrap();
    }
    counts
}

/// A temporary root with the job's input and output directories in it.
struct Dirs {
    root: tempfile::TempDir,
    input: PathBuf,
    output: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let (input, output) = (root.path().join("in"), root.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    std::fs::create_dir_all(&output).unwrap();
    Dirs {
        root,
        input,
        output,
    }
}

fn add(total: &mut HashMap<String, u64>, more: HashMap<String, u64>) {
    for (word, n) in more {
        *total.entry(word).or_insert(0) += n;
    }
}

/// Committed `word,count` updates, by word.
fn updates(output: &Path) -> HashMap<String, Vec<u64>> {
    let mut by_word: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, line) in committed_lines(output) {
        let (word, count) = line.rsplit_once(',').expect("word,count");
        by_word
            .entry(word.to_owned())
            .or_default()
            .push(count.parse().unwrap());
    }
    by_word
}

/// Every word's updates are 1, 2, .. up to its number of occurrences, each
/// committed once.
fn assert_updates_exactly_once(output: &Path, expected: &HashMap<String, u64>, context: &str) {
    let mut got = updates(output);
    assert_eq!(got.len(), expected.len(), "{context}: words");
    for (word, counts) in &mut got {
        counts.sort_unstable();
        let want: Vec<u64> = (1..=expected[word]).collect();
        assert!(*counts == want, "{context}: {word} has updates {counts:?}");
    }
    common::assert_no_uncommitted_files(output, context);
}

fn args(
    input: &Path,
    query: &str,
    output: &Path,
    checkpoints: &Path,
    extra: &[String],
) -> Vec<String> {
    let input = input.display().to_string();
    args_at(
        &input,
        query,
        output,
        &checkpoints.display().to_string(),
        extra,
    )
}

/// The arguments of a run reading `input`, a URL, with its checkpoints at
/// the URL `checkpoints`.
fn args_at(
    input: &str,
    query: &str,
    output: &Path,
    checkpoints: &str,
    extra: &[String],
) -> Vec<String> {
    let mut args = vec![
        "wordcount".to_string(),
        format!("--source={input}?{query}"),
        "--emit=updates".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={checkpoints}"),
        format!("--output={}", output.display()),
    ];
    args.extend_from_slice(extra);
    args
}

fn run(args: Vec<String>) -> RunReport {
    let context = format!("{args:?}");
    cli::run(&RunArgs::parse(args).unwrap()).unwrap_or_else(|e| panic!("{context}: {e}"))
}

/// The child's entry point; a no-op when the test runs normally.
#[test]
fn child_runs_the_job() {
    common::run_child_job(CHILD);
}

#[test]
fn every_word_of_every_file_is_counted_once_across_injected_failures() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let expected = write_text(&input, "a", 12, 4_000);
    let report = run(args(
        &input,
        "format=text&split-size=20000",
        &output,
        &root.path().join("checkpoints"),
        &[
            "--parallelism=2".into(),
            // The kills are spread over the lines read, and reading them
            // takes long enough for every kill to land.
            "--records=24000".into(),
            "--rate=40000".into(),
            "--inject-failures=3".into(),
        ],
    ));
    assert_eq!(report.restarts, 3);
    assert_updates_exactly_once(&output, &expected, "text lines, three failures");
}

#[test]
fn without_checkpoints_the_supervisor_hands_out_the_splits() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let expected = write_text(&input, "a", 5, 1_000);
    let mut args = args(
        &input,
        "format=text&split-size=5000",
        &output,
        &root.path().join("checkpoints"),
        &["--parallelism=3".into()],
    );
    args.retain(|a| !a.starts_with("--checkpoint-interval") && !a.starts_with("--emit"));
    args.extend(["--checkpoint-interval=off".into(), "--emit=final".into()]);
    run(args);
    let mut got = HashMap::new();
    for (_, line) in committed_lines(&output) {
        let (word, count) = line.rsplit_once(',').unwrap();
        assert!(got
            .insert(word.to_owned(), count.parse::<u64>().unwrap())
            .is_none());
    }
    assert_eq!(got, expected);
}

#[test]
fn files_in_s3_are_counted_once_across_injected_failures() {
    let Some(s3) = storage::TestStorage::s3("file_source") else {
        return;
    };
    let input = format!("{}/input", s3.url);
    let dir = tidemark::storage::CheckpointStorage::open_directory(&input, true).unwrap();
    let (files, expected) = text_files("a", 8, 2_000);
    for (name, text) in files {
        storage::block_on(dir.put(&name, text.into())).unwrap();
    }
    let output = tempfile::tempdir().unwrap();
    let report = run(args_at(
        &input,
        "format=text&split-size=20000",
        output.path(),
        &s3.url,
        &[
            "--parallelism=2".into(),
            "--records=16000".into(),
            "--rate=13000".into(),
            "--inject-failures=2".into(),
        ],
    ));
    assert_eq!(report.restarts, 2);
    assert_updates_exactly_once(output.path(), &expected, "text lines in S3, two failures");
}

#[test]
fn json_lines_are_counted_by_their_key_field_across_injected_failures() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let mut expected = HashMap::new();
    for f in 0..6 {
        let mut text = String::new();
        for i in 0..5_000u64 {
            let n = common::splitmix64(f * 5_000 + i) % 300;
            // Keys are strings or numbers; a number is counted as its JSON.
            let (line, key) = if n.is_multiple_of(2) {
                (
                    format!("{{\"key\":\"k{n}\",\"ts\":{i}}}\n"),
                    format!("k{n}"),
                )
            } else {
                (format!("{{\"ts\":{i},\"key\":{n}}}\n"), n.to_string())
            };
            *expected.entry(key).or_insert(0) += 1;
            text.push_str(&line);
        }
        std::fs::write(input.join(format!("{f}.jsonl")), text).unwrap();
    }
    let report = run(args(
        &input,
        "format=jsonl&split-size=50000",
        &output,
        &root.path().join("checkpoints"),
        &[
            "--parallelism=3".into(),
            "--records=30000".into(),
            "--rate=25000".into(),
            "--inject-failures=2".into(),
        ],
    ));
    assert_eq!(report.restarts, 2);
    assert_updates_exactly_once(&output, &expected, "JSON lines, two failures");
}

#[test]
fn parquet_files_a_job_wrote_are_counted_by_another_across_injected_failures() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let (records, keys, seed) = (20_000, 300, 11);
    // The first job writes its (key, count) updates as Parquet, one row
    // group per file: key k appears in c(k) rows.
    run(vec![
        "wordcount".into(),
        format!("--records={records}"),
        format!("--keys={keys}"),
        format!("--seed={seed}"),
        "--emit=updates".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={}", root.path().join("first").display()),
        format!("--sink={}?format=parquet&roll-size=16000", input.display()),
    ]);
    let files = std::fs::read_dir(&input).unwrap().count();
    assert!(files > 2, "only {files} Parquet files");
    let expected: HashMap<String, u64> = common::expected_counts(records, keys, seed)
        .into_iter()
        .map(|(key, count)| (key.to_string(), count))
        .collect();
    let report = run(args(
        &input,
        "format=parquet",
        &output,
        &root.path().join("checkpoints"),
        &[
            "--parallelism=3".into(),
            format!("--records={}", expected.values().sum::<u64>()),
            "--rate=40000".into(),
            "--inject-failures=2".into(),
        ],
    ));
    assert_eq!(report.restarts, 2);
    assert_updates_exactly_once(&output, &expected, "Parquet, two failures");
}

/// Writes 4 files of 6,000 `common::timed_records` each, file f spanning
/// event time from `f * span` ms, as JSON lines or CSV; returns the
/// records.
fn timed_files(dir: &Path, csv: bool, seed: u64, span: u64) -> Vec<(String, u64)> {
    let mut records = Vec::new();
    for f in 0..4u64 {
        let mut text = if csv {
            "ts,key\n".to_string()
        } else {
            String::new()
        };
        for (key, ts) in common::timed_records(seed + f * 6_000, 6_000, f * span, span) {
            text.push_str(&match csv {
                true => format!("{ts},{key}\n"),
                false => format!("{{\"key\":\"{key}\",\"ts\":{ts}}}\n"),
            });
            records.push((key, ts));
        }
        let name = format!("{f}.{}", if csv { "csv" } else { "jsonl" });
        std::fs::write(dir.join(name), text).unwrap();
    }
    records
}

#[test]
fn windows_over_files_of_other_times_count_every_record_once() {
    for (format, csv) in [("jsonl", false), ("csv", true)] {
        let Dirs {
            root,
            input,
            output,
        } = dirs();
        let mut expected = HashMap::new();
        for (key, ts) in timed_files(&input, csv, 0, 50_000) {
            *expected.entry((key, ts / 1_000 * 1_000)).or_insert(0) += 1;
        }
        let mut args = common::event_time_args("windows", root.path(), &output, 24_000);
        args.extend([
            format!(
                "--source={}?format={format}&split-size=40000",
                input.display()
            ),
            "--window=tumbling:1s".into(),
        ]);
        let report = run(args);
        assert_eq!(report.restarts, 2, "{format}");
        let mut got = HashMap::new();
        for (_, line) in committed_lines(&output) {
            let fields: Vec<&str> = line.split(',').collect();
            let (key, start, count) = (fields[0], fields[1], fields[3]);
            let window = (key.to_owned(), start.parse::<u64>().unwrap());
            assert!(
                got.insert(window, count.parse::<u64>().unwrap()).is_none(),
                "{line}"
            );
        }
        // Every window of every file, once: none of the records within the
        // disorder came late, across the kills.
        assert_eq!(got, expected, "{format}");
    }
}

#[test]
fn a_join_of_two_file_sources_emits_every_pair_once_across_injected_failures() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let right_input = root.path().join("right");
    std::fs::create_dir_all(&right_input).unwrap();
    let left = timed_files(&input, false, 0, 9_000);
    let right = timed_files(&right_input, true, 1 << 40, 9_000);
    let expected = common::expected_pairs(&left, &right, 30);
    assert!(expected.len() > 5_000, "{} pairs", expected.len());
    let mut args = common::event_time_args("join", root.path(), &output, 24_000);
    args.extend([
        format!("--source={}?format=jsonl&split-size=40000", input.display()),
        format!("--right-source={}?format=csv", right_input.display()),
        "--interval=30ms".into(),
    ]);
    let report = run(args);
    assert_eq!(report.restarts, 2);
    // Each pair once: no record of either side came late or twice, across
    // the kills.
    common::assert_pairs_exactly_once(&output, &expected, "join of two file sources");
}

#[test]
fn a_savepoint_of_a_file_source_at_p2_restores_at_p3_and_p1_exactly_once() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let savepoints = root.path().join("savepoints");
    let expected = write_text(&input, "a", 10, 4_000);
    let query = "format=text&split-size=30000";
    let stopped = run(args(
        &input,
        query,
        &output,
        &root.path().join("checkpoints"),
        &[
            "--parallelism=2".into(),
            // Slow enough (2 s) that the savepoint falls inside the run.
            "--rate=20000".into(),
            format!("--savepoint-dir={}", savepoints.display()),
            "--stop-with-savepoint-after=700ms".into(),
        ],
    ));
    assert!(stopped.records_in < 40_000, "the job stopped early");
    let savepoint = PathBuf::from(stopped.savepoint.expect("the savepoint completed"));
    for p in [3, 1] {
        let out = root.path().join(format!("out-{p}"));
        copy_tree(&output, &out);
        let restored = run(args(
            &input,
            query,
            &out,
            &root.path().join(format!("checkpoints-{p}")),
            &[
                format!("--parallelism={p}"),
                format!("--restore={}", savepoint.display()),
            ],
        ));
        assert!(restored.records_in < 40_000, "p={p}: read everything again");
        assert_updates_exactly_once(&out, &expected, &format!("from p=2 to p={p}"));
    }
}

/// Committed updates, in all.
fn committed_updates(output: &Path) -> u64 {
    committed_lines(output).len() as u64
}

/// Waits until `output` holds `updates` committed updates.
fn wait_for_updates(output: &Path, updates: u64, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_updates(output) < updates {
        assert!(
            Instant::now() < deadline,
            "the files were not all read within a minute"
        );
        assert!(child.try_wait().unwrap().is_none(), "the job ended");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_continuous_file_source_reads_files_added_before_and_after_a_sigkill_once() {
    let Dirs {
        root,
        input,
        output,
    } = dirs();
    let checkpoints = root.path().join("checkpoints");
    let args = args(
        &input,
        "format=text&monitor-interval=50ms",
        &output,
        &checkpoints,
        &["--parallelism=2".into()],
    );
    let mut expected = write_text(&input, "a", 3, 2_000);
    let mut child = spawn_child_job(CHILD, &args);
    let first: u64 = expected.values().sum();
    wait_for_updates(&output, first, &mut child);
    // Found while the job runs, which is killed while it reads them.
    add(&mut expected, write_text(&input, "b", 3, 2_000));
    wait_for_updates(&output, first + 1, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    // Added while no job runs: found by the restored one.
    add(&mut expected, write_text(&input, "c", 3, 2_000));
    let mut resumed = args.clone();
    resumed.push("--restore=latest".into());
    let mut child = spawn_child_job(CHILD, &resumed);
    let all: u64 = expected.values().sum();
    wait_for_updates(&output, all, &mut child);
    // A file added now is read by the restored job too.
    add(&mut expected, write_text(&input, "d", 1, 500));
    let all: u64 = expected.values().sum();
    wait_for_updates(&output, all, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    let mut got = updates(&output);
    assert_eq!(got.len(), expected.len());
    for (word, counts) in &mut got {
        counts.sort_unstable();
        let want: Vec<u64> = (1..=expected[word]).collect();
        assert!(*counts == want, "{word} has updates {counts:?}");
    }
}
