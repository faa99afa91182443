//! The `tidemark` binary as a user runs it.

use std::process::{Command, Output};

fn tidemark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// `tidemark run wordcount --checkpoint-dir DIR ARGS…`
fn wordcount(checkpoints: &std::path::Path, args: &[&str]) -> Output {
    let dir = checkpoints.to_str().unwrap();
    let mut all = vec!["run", "wordcount", "--checkpoint-dir", dir];
    all.extend_from_slice(args);
    tidemark(&all)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn json_report_is_the_last_line_of_stdout() {
    let checkpoints = tempfile::tempdir().unwrap();
    let out = tidemark(&[
        "run",
        "wordcount",
        "--checkpoint-dir",
        checkpoints.path().to_str().unwrap(),
        "--records",
        "50000",
        "--keys",
        "100",
        "--parallelism",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().expect("a report");
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(report["records_in"], 50_000);
    assert_eq!(report["parallelism"], 2);
    assert!(report["elapsed_s"].as_f64().unwrap() > 0.0);
    assert!(report["throughput_rps"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    for (args, argument) in [
        (&["run", "wordcount", "--keys", "0"][..], "--keys"),
        (
            &["run", "wordcount", "--parallelism", "0"][..],
            "--parallelism",
        ),
        (
            &["run", "wordcount", "--parallelism", "129"][..],
            "--parallelism",
        ),
        (&["run", "wordcount", "--records=-5"][..], "--records"),
        (&["run", "wordcount", "--records", "many"][..], "--records"),
        (&["run", "wordcount", "--rate", "0"][..], "--rate"),
        (&["run", "wordcount", "--rate", "fast"][..], "--rate"),
        (&["run", "wordcount", "--emit", "sometimes"][..], "--emit"),
        (
            &["run", "wordcount", "--checkpoint-interval", "0s"][..],
            "--checkpoint-interval",
        ),
        (
            &["run", "wordcount", "--checkpoint-interval", "soon"][..],
            "--checkpoint-interval",
        ),
        (
            &["run", "wordcount", "--no-such-flag"][..],
            "--no-such-flag",
        ),
        (&["run", "pagerank"][..], "pagerank"),
        (
            &["run", "wordcount", "--inject-fault", "sync-snapshot:2:1"][..],
            "--inject-fault",
        ),
        (
            &["run", "wordcount", "--inject-fault", "boom:2:1:0"][..],
            "--inject-fault",
        ),
        (
            &["run", "wordcount", "--restore", "yesterday"][..],
            "--restore",
        ),
        (
            &[
                "run",
                "wordcount",
                "--checkpoint-interval=off",
                "--inject-failures=2",
            ][..],
            "--inject-failures",
        ),
        (&["run", "wordcount", "--mode", "sideways"][..], "--mode"),
        (&["run", "wordcount", "--incremental"][..], "--incremental"),
        (&["run", "wordcount", "--state", "disk"][..], "--state"),
        (
            &["run", "wordcount", "--state-cache-entries=1000"][..],
            "--state-cache-entries",
        ),
        (
            &[
                "run",
                "wordcount",
                "--state=rocksdb",
                "--state-cache-entries=0",
            ][..],
            "--state-cache-entries",
        ),
        (
            &[
                "run",
                "wordcount",
                "--mode=unaligned",
                "--aligned-timeout=1s",
            ][..],
            "--aligned-timeout",
        ),
        (
            &["run", "wordcount", "--mode=unaligned", "--max-concurrent=2"][..],
            "--max-concurrent",
        ),
        (
            &[
                "run",
                "wordcount",
                "--parallelism=2",
                "--slow-subtask=2",
                "--slow-ns=5",
            ][..],
            "--slow-subtask",
        ),
        (&["run", "wordcount", "--slow-subtask=0"][..], "--slow-ns"),
    ] {
        let out = tidemark(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(argument),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn an_output_path_that_is_a_file_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = tidemark(&[
        "run",
        "wordcount",
        "--records",
        "10",
        "--output",
        file.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--output"), "{}", stderr(&out));
}

#[test]
fn a_restore_path_outside_the_checkpoint_directory_is_refused() {
    let checkpoints = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let chk = elsewhere.path().join("chk-3");
    std::fs::create_dir(&chk).unwrap();
    let out = wordcount(
        checkpoints.path(),
        &["--records=10", "--restore", chk.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--restore"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a checkpoint directory of this job"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn restoring_a_missing_checkpoint_names_it_and_fails() {
    let checkpoints = tempfile::tempdir().unwrap();
    let out = wordcount(checkpoints.path(), &["--records=10", "--restore=chk-42"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("chk-42/_metadata"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_corrupted_checkpoint_is_refused_with_the_reason() {
    let checkpoints = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["--records=1000", "--keys=10"];
        args.extend_from_slice(extra);
        wordcount(checkpoints.path(), &args)
    };
    assert!(run(&[]).status.success());
    let job_dir = std::fs::read_dir(checkpoints.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let chk = std::fs::read_dir(&job_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("chk-"))
        .expect("the run left its last checkpoint");
    let metadata = chk.join("_metadata");
    let mut bytes = std::fs::read(&metadata).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&metadata, &bytes).unwrap();
    let out = run(&["--restore=latest"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("checksum"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&metadata).unwrap(),
        bytes,
        "nothing was rewritten"
    );
}

#[test]
fn a_fault_aimed_at_a_missing_subtask_is_refused() {
    let checkpoints = tempfile::tempdir().unwrap();
    let out = wordcount(
        checkpoints.path(),
        &[
            "--records=10",
            "--parallelism=2",
            "--inject-fault=after-ack:1:1:7",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("op-1#7"), "{}", stderr(&out));
}
