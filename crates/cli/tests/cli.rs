//! The `tidemark` binary as a user runs it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};
use tidemark_actors::runtime::job_id;

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

/// The report `--json` prints as the last line of stdout.
fn report(out: &Output) -> serde_json::Value {
    let stdout = std::str::from_utf8(&out.stdout).expect("stdout is text");
    serde_json::from_str(stdout.lines().last().expect("a report")).expect("the report is JSON")
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
    let report = report(&out);
    assert_eq!(report["records_in"], 50_000);
    assert_eq!(report["parallelism"], 2);
    assert!(report["elapsed_s"].as_f64().unwrap() > 0.0);
    assert!(report["throughput_rps"].as_f64().unwrap() > 0.0);
    assert!(report["objects_created"].as_u64().unwrap() > 0);
    assert!(report["bytes_uploaded"].as_u64().unwrap() > 0);
    assert!(report["objects_deleted"].as_u64().is_some());
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
        (
            &["run", "wordcount", "--checkpoint-dir=ftp://host/x"][..],
            "--checkpoint-dir",
        ),
        (
            &["run", "wordcount", "--checkpoint-dir=s3:///x"][..],
            "--checkpoint-dir",
        ),
        (
            &[
                "run",
                "wordcount",
                "--checkpoint-dir=/tmp/x",
                &format!(
                    "--savepoint-dir=/tmp/y/../x/{}/savepoints",
                    job_id("wordcount")
                ),
            ][..],
            "--savepoint-dir",
        ),
        (
            &[
                "run",
                "wordcount",
                "--checkpoint-dir=s3://b/x/",
                &format!("--savepoint-dir=s3://b/x/{}", job_id("wordcount")),
            ][..],
            "--savepoint-dir",
        ),
        (&["cleanup"][..], "--checkpoint-dir"),
        (
            &["cleanup", "--checkpoint-dir=ftp://host/x"][..],
            "--checkpoint-dir",
        ),
        (
            &["cleanup", "--checkpoint-dir=/tmp/x", "--grace=soon"][..],
            "--grace",
        ),
        (
            &["cleanup", "--checkpoint-dir=/tmp/x", "--grace=3600"][..],
            "--grace",
        ),
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

/// The directory of the only job under `checkpoints`.
fn job_dir(checkpoints: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(checkpoints)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "one job directory: {dirs:?}");
    dirs[0].clone()
}

/// A `chk-N` directory of the only job under `checkpoints`.
fn retained_checkpoint(checkpoints: &Path) -> PathBuf {
    std::fs::read_dir(job_dir(checkpoints))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("chk-"))
        .expect("the run left a retained checkpoint")
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
    let chk = retained_checkpoint(checkpoints.path());
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

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let relative = path.strip_prefix(base).unwrap();
                out.insert(relative.to_str().unwrap().to_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Writes `dir/relative`, last modified `age` ago.
fn write_aged(dir: &Path, relative: &str, age: Duration) {
    let path = dir.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"orphan").unwrap();
    age_file(&path, age);
}

fn age_file(path: &Path, age: Duration) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap();
}

const TWO_HOURS: Duration = Duration::from_secs(2 * 3600);

/// A finished wordcount run's checkpoint root and its job directory, every
/// file in it two hours old, and what the run left there.
fn finished_run() -> (tempfile::TempDir, PathBuf, BTreeSet<String>) {
    let checkpoints = tempfile::tempdir().unwrap();
    let out = wordcount(
        checkpoints.path(),
        &["--records=20000", "--keys=100", "--parallelism=2"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_dir(checkpoints.path());
    let left = files(&job);
    assert!(left.iter().any(|f| f.ends_with("/_metadata")), "{left:?}");
    for file in &left {
        age_file(&job.join(file), TWO_HOURS);
    }
    (checkpoints, job, left)
}

fn cleanup(root: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["cleanup", "--checkpoint-dir", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    tidemark(&args)
}

#[test]
fn cleanup_reports_old_orphans_and_deletes_only_them_when_asked() {
    let (checkpoints, job, referenced) = finished_run();
    let root = checkpoints.path();
    let old = ["chk-999/op-1-0-keyed", "shared/op-1-1-7-000042.sst"];
    for orphan in old {
        write_aged(&job, orphan, TWO_HOURS);
    }
    write_aged(&job, "chk-1000/op-1-0-keyed", Duration::ZERO);
    write_aged(root, "other-job/chk-1/x", TWO_HOURS);
    write_aged(root, "stray", TWO_HOURS);
    let before = files(root);

    // Without --delete (or with the old --dry-run) it only reports.
    for report in [&[][..], &["--dry-run"]] {
        let out = cleanup(root, report);
        assert!(out.status.success(), "{}", stderr(&out));
        let stdout = String::from_utf8(out.stdout).unwrap();
        for orphan in old {
            assert!(stdout.contains(orphan), "{stdout}");
        }
        assert!(!stdout.contains("chk-1000"), "{stdout}");
        assert!(stdout.contains("would delete 2 orphans"), "{stdout}");
        assert!(stdout.contains("pass --delete"), "{stdout}");
        assert_eq!(files(root), before, "a report deletes nothing");
    }

    let out = cleanup(root, &["--delete", "--grace=1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut expected = without_lease(referenced);
    expected.insert("chk-1000/op-1-0-keyed".into());
    assert_eq!(without_lease(files(&job)), expected);
    for outside in ["other-job/chk-1/x", "stray"] {
        assert!(root.join(outside).exists(), "{outside}");
    }
}

#[test]
fn cleanup_refuses_corrupted_metadata_unless_told_to_ignore_it() {
    let (checkpoints, job, referenced) = finished_run();
    let root = checkpoints.path();
    let metadata = referenced
        .iter()
        .find(|f| f.ends_with("/_metadata"))
        .unwrap()
        .clone();
    write_aged(&job, &metadata, TWO_HOURS);
    write_aged(&job, "chk-999/op-1-0-keyed", TWO_HOURS);
    let before = files(root);

    let out = cleanup(root, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&metadata), "{}", stderr(&out));
    assert!(stderr(&out).contains("corrupted"), "{}", stderr(&out));
    assert_eq!(files(root), before, "nothing deleted");

    let out = cleanup(root, &["--ignore-corrupted-metadata", "--delete"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        without_lease(files(&job)),
        BTreeSet::from(["checkpoint-id-counter".into()])
    );
}

/// A sweep that deletes leases the job directory for its duration, which
/// leaves a released lease of a new epoch behind.
fn without_lease(files: BTreeSet<String>) -> BTreeSet<String> {
    files
        .into_iter()
        .filter(|f| !f.starts_with("_leases/"))
        .collect()
}

#[test]
fn inspect_shows_a_savepoint_and_a_checkpoint_for_people_and_as_json() {
    let (checkpoints, savepoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = wordcount(
        checkpoints.path(),
        &[
            "--records=300000",
            "--keys=1000",
            "--parallelism=2",
            "--rate=200000",
            "--inline-threshold=0",
            "--checkpoint-interval=100ms",
            "--savepoint-dir",
            savepoints.path().to_str().unwrap(),
            // Late enough for a periodic checkpoint to complete first, on
            // a loaded machine too; the input lasts 1.5 s.
            "--stop-with-savepoint-after=600ms",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report = report(&out);
    let savepoint = report["savepoint"]
        .as_str()
        .expect("a savepoint")
        .to_owned();

    let text = tidemark(&["inspect", &savepoint]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8(text.stdout).unwrap();
    for expected in [
        "savepoint ",
        "format: self-contained (metadata version",
        "uid",
        "max parallelism 128",
        "key groups 0..64",
        "key groups 64..128",
        "operator state",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }

    let json = tidemark(&["inspect", &format!("{savepoint}/_metadata"), "--json"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["kind"], "savepoint");
    assert_eq!(json["format"], "self-contained");
    let operators = json["operators"].as_array().unwrap();
    assert_eq!(operators.len(), 2);
    assert!(operators
        .iter()
        .all(|op| op["parallelism"] == 2 && op["max_parallelism"] == 128 && op["uid"].is_string()));
    let keyed: Vec<&serde_json::Value> = json["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["key_groups"].is_null())
        .collect();
    assert_eq!(keyed.len(), 2);
    for subtask in keyed {
        let files = subtask["files"].as_array().unwrap();
        assert!(!files.is_empty());
        for file in files {
            let size = file["size"].as_u64().unwrap();
            let on_disk =
                std::fs::metadata(Path::new(&savepoint).join(file["path"].as_str().unwrap()))
                    .unwrap()
                    .len();
            assert_eq!(size, on_disk);
        }
    }

    let chk = retained_checkpoint(checkpoints.path());
    let json = tidemark(&["inspect", chk.to_str().unwrap(), "--json"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["kind"], "checkpoint");
    assert_eq!(json["format"], "job-directory");

    let out = tidemark(&["inspect", savepoints.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("_metadata"), "{}", stderr(&out));
}

/// Writes `yaml` as `tidemark.yaml` in `dir`.
fn config_file(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("tidemark.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn a_configuration_file_sets_the_job_and_a_flag_given_wins_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let config = config_file(
        dir.path(),
        &format!(
            "parallelism.default: 3\nexecution:\n  checkpointing:\n    interval: 100 ms\n    dir: {}\n",
            checkpoints.display()
        ),
    );
    let out = tidemark(&[
        "run",
        "wordcount",
        "--records=20000",
        "--keys=100",
        "--config",
        config.to_str().unwrap(),
        "--parallelism=2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = report(&out);
    assert_eq!(report["parallelism"], 2, "the flag, not the file's 3");
    assert!(
        job_dir(&checkpoints).ends_with(job_id("wordcount").to_string()),
        "checkpoints where the file says"
    );
}

#[test]
fn a_bad_configuration_file_exits_2_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for (yaml, named) in [
        (
            "parallelism.default: 2\nexecution.checkpointing.timeout: soon\n",
            "tidemark.yaml:2: execution.checkpointing.timeout",
        ),
        (
            "execution:\n  checkpointing:\n    intervall: 1 s\n",
            "tidemark.yaml:3: unknown key execution.checkpointing.intervall",
        ),
        (
            "execution.checkpointing.incremental: true\n",
            "tidemark.yaml:1: execution.checkpointing.incremental: applies to RocksDB state",
        ),
    ] {
        let config = config_file(dir.path(), yaml);
        let out = tidemark(&["run", "wordcount", "--config", config.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {}", stderr(&out));
        assert!(stderr(&out).contains(named), "{yaml}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(config.to_str().unwrap()),
            "{yaml}: {}",
            stderr(&out)
        );
    }
}

/// The Kubernetes example runs commands this binary accepts, against as
/// many workers as the StatefulSet has, on the ports its Service names.
#[test]
fn the_kubernetes_example_runs_commands_the_binary_accepts() {
    use saphyr::{LoadableYamlNode, Yaml};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes");
    let load = |name: &str| {
        Yaml::load_from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    };
    let args = |doc: &Yaml| -> Vec<String> {
        doc["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .expect("a container's args")
            .iter()
            .map(|a| {
                a.as_str()
                    .unwrap()
                    .replace("$(POD_NAME)", "tidemark-worker-0")
            })
            .collect()
    };
    let (workers, drivers) = (load("workers.yaml"), load("driver.yaml"));
    let kind = |k: &str| {
        drivers
            .iter()
            .find(|doc| doc["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("driver.yaml has a {k}"))
    };
    let (service, statefulset) = (&workers[0], &workers[1]);
    let ports: Vec<i64> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_integer().unwrap())
        .collect();
    let worker = args(statefulset);
    let job = kind("Job");
    let driver = args(job);
    for command in [&worker, &driver] {
        let argv = std::iter::once("tidemark".to_string()).chain(command.iter().cloned());
        if let Err(e) = tidemark_cli::Cli::try_parse_from(argv) {
            panic!("{command:?}: {e}");
        }
    }
    for port in &ports {
        assert!(
            worker.iter().any(|a| a.ends_with(&format!(":{port}"))),
            "port {port}"
        );
    }
    let replicas = statefulset["spec"]["replicas"].as_integer().unwrap() as usize;
    let addrs = driver
        .iter()
        .find_map(|a| a.strip_prefix("--worker-addrs="))
        .expect("the driver names its workers");
    let names: Vec<String> = (0..replicas)
        .map(|i| format!("tidemark-worker-{i}.tidemark-workers:{}", ports[0]))
        .collect();
    assert_eq!(addrs, names.join(","));
    // Workers listen beyond loopback, so over mutual TLS, which the driver
    // speaks too, from the files its Secret mounts.
    for command in [&worker, &driver] {
        assert!(!command.iter().any(|a| a == "--insecure"));
        for flag in ["--tls-cert=", "--tls-key=", "--tls-ca="] {
            assert!(
                command
                    .iter()
                    .any(|a| a.starts_with(flag) && a.contains("/var/run/secrets/tidemark-tls/")),
                "{command:?} has {flag}"
            );
        }
    }
    // Only the drivers reach the control port, only workers the data port.
    let policy = &load("network-policy.yaml")[0];
    let app = |labels: &Yaml| labels["app"].as_str().map(str::to_owned);
    let labels = |doc: &Yaml| app(&doc["spec"]["template"]["metadata"]["labels"]);
    assert_eq!(
        app(&policy["spec"]["podSelector"]["matchLabels"]),
        labels(statefulset)
    );
    let rules = policy["spec"]["ingress"].as_sequence().unwrap();
    let admitted: Vec<(Option<String>, i64)> = rules
        .iter()
        .map(|rule| {
            let ports = rule["ports"].as_sequence().unwrap();
            assert_eq!(ports.len(), 1, "one port a rule");
            (
                app(&rule["from"][0]["podSelector"]["matchLabels"]),
                ports[0]["port"].as_integer().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        admitted,
        [(labels(job), ports[0]), (labels(statefulset), ports[1])]
    );
    // The REST API beyond loopback has its token and TLS.
    for flag in ["--http-token-file=", "--http-tls-cert=", "--http-tls-key="] {
        assert!(driver.iter().any(|a| a.starts_with(flag)), "{flag}");
    }
    // The workers take the drivers' checkpoint directory, and no other.
    let roots: Vec<String> = worker
        .iter()
        .filter_map(|a| a.strip_prefix("--root="))
        .map(str::to_owned)
        .collect();
    let roots = tidemark_cli::roots::Roots::new(&roots).unwrap();
    let checkpoints = driver
        .iter()
        .find_map(|a| a.strip_prefix("--checkpoint-dir="))
        .expect("the driver names its checkpoint directory");
    roots.check("--checkpoint-dir", checkpoints).unwrap();
    assert!(roots.check("--checkpoint-dir", "s3://elsewhere").is_err());

    // The drivers elect their leader through a Lease their service account
    // may get, create and update.
    assert!(driver.iter().any(|a| a.starts_with("--leader-lease=")));
    assert!(job["spec"]["parallelism"].as_integer().unwrap() >= 2);
    let account = job["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let binding = kind("RoleBinding");
    assert_eq!(binding["subjects"][0]["name"].as_str(), Some(account));
    let role = kind("Role");
    assert_eq!(
        binding["roleRef"]["name"].as_str(),
        role["metadata"]["name"].as_str()
    );
    let rule = &role["rules"][0];
    let listed = |field: &str| -> Vec<&str> {
        rule[field]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect()
    };
    assert_eq!(listed("apiGroups"), ["coordination.k8s.io"]);
    assert_eq!(listed("resources"), ["leases"]);
    for verb in ["get", "create", "update"] {
        assert!(listed("verbs").contains(&verb), "{verb}");
    }
}

/// Leader election is refused where it could not work, naming why, before
/// any job starts.
#[test]
fn leader_election_without_checkpoints_or_a_cluster_is_refused() {
    let checkpoints = tempfile::tempdir().unwrap();
    let out = tidemark(&[
        "run",
        "wordcount",
        "--records=1000",
        "--leader-lease=x",
        "--checkpoint-interval=off",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--leader-lease") && stderr(&out).contains("checkpointing"),
        "{}",
        stderr(&out)
    );
    let out = tidemark(&[
        "run",
        "wordcount",
        "--records=1000",
        "--leader-lease=x",
        "--leader-renew-deadline=20s",
        "--checkpoint-interval=1s",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--leader-renew-deadline"),
        "{}",
        stderr(&out)
    );

    // No kubeconfig and not in a pod: the run names what it looked for.
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", "wordcount", "--records=1000", "--leader-lease=x"])
        .arg("--checkpoint-interval=1s")
        .arg(format!("--checkpoint-dir={}", checkpoints.path().display()))
        .env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("leader election needs the Kubernetes API"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_dir(checkpoints.path()).unwrap().count(),
        0,
        "nothing ran"
    );
}

/// A ZooKeeper that does not answer is named, within the session
/// timeout, and nothing runs.
#[test]
fn leader_election_through_a_zookeeper_that_does_not_answer_is_refused() {
    let checkpoints = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let quorum = format!("127.0.0.1:{port}");
    let out = tidemark(&[
        "run",
        "wordcount",
        "--records=1000",
        &format!("--zookeeper-quorum={quorum}"),
        "--zookeeper-session-timeout=1s",
        "--checkpoint-interval=1s",
        &format!("--checkpoint-dir={}", checkpoints.path().display()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("through ZooKeeper at {quorum} failed")),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_dir(checkpoints.path()).unwrap().count(),
        0,
        "nothing ran"
    );
}

/// An injected failure is expected: even with `RUST_BACKTRACE` set it
/// shows as one line naming the subtask and the failure's number, never as
/// a panic with a backtrace; the report sums the restart strategy's waits.
#[test]
fn injected_failures_log_one_line_each_and_the_report_sums_restart_waits() {
    let checkpoints = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", "wordcount", "--records=300000", "--keys=100"])
        .args([
            "--parallelism=2",
            "--rate=600000",
            "--checkpoint-interval=50ms",
        ])
        .args(["--inject-failures=3", "--restart-delay=20ms", "--json"])
        .arg(format!("--checkpoint-dir={}", checkpoints.path().display()))
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    let report = report(&out);
    let restarts = report["restarts"].as_u64().unwrap();
    assert!(restarts >= 1, "no failure was injected: {err}");
    assert_eq!(
        report["restart_wait_ms"],
        restarts as f64 * 20.0,
        "{report}"
    );
    // A kill aimed at a subtask that had already finished costs no restart:
    // each restart is one injected failure, each logged once.
    let failures: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("injected failure"))
        .collect();
    assert_eq!(failures.len() as u64, restarts, "{err}");
    for line in failures {
        let number = line
            .split("injected failure: ")
            .nth(1)
            .and_then(|rest| rest.split(" of 3").next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no failure number in {line:?}"));
        assert!((1..=3).contains(&number), "{line}");
        assert!(line.contains("subtask op-"), "no subtask named in {line:?}");
    }
    // `--help` says where the backoff stops.
    let help = String::from_utf8(tidemark(&["run", "--help"]).stdout).unwrap();
    let backoff: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--restart-backoff"))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('-'))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(
        backoff.join(" ").contains("at most 1 s a restart"),
        "{help}"
    );
}

/// The README's opening list names every command of the binary, and its
/// "Not yet" paragraph names none of them.
#[test]
fn the_readme_features_and_not_yet_agree_with_the_commands() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let opening = readme.split("\n## ").next().unwrap();
    let (features, not_yet) = opening
        .split_once("\nNot yet:")
        .expect("the README's opening has a \"Not yet:\" paragraph");
    let not_yet = not_yet.split("\n\n").next().unwrap().to_lowercase();
    let help = String::from_utf8(tidemark(&["--help"]).stdout).unwrap();
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .expect("--help lists the commands")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"worker"), "{help}");
    for command in commands {
        assert!(
            features.contains(&format!("`{command}`"))
                || features.contains(&format!("`tidemark {command}")),
            "the README's features do not name the command `{command}`"
        );
        assert!(
            !not_yet
                .split(|c: char| !c.is_alphanumeric())
                .any(|word| word == command),
            "the README says `{command}` is not there yet: {not_yet}"
        );
    }
}

/// `run timers` fires every record's timer once, `--timer-delay` after its
/// timestamp, on the heap and on RocksDB, through failures that restore
/// timers held in checkpoints: the committed lines are exactly the
/// generator's distinct (key, timestamp + delay).
#[test]
fn timers_fire_once_each_after_their_delay_through_failures() {
    use tidemark_cli::topologies::windows::Events;
    use tidemark_cli::topologies::wordcount::Records;
    let (records, delay) = (40_000, 300);
    let events = Events {
        keys: 500,
        seed: 7,
        events_per_ms: 10,
        max_disorder: 100,
    };
    let expected: BTreeSet<String> = (0..records)
        .map(|i| events.record(i))
        .map(|e| format!("{},{}", e.key, e.timestamp + delay))
        .collect();
    for state in [
        &["--state=heap"][..],
        &["--state=rocksdb", "--state-dir=db"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["run", "timers", "--keys=500", "--seed=7"])
            .arg(format!("--records={records}"))
            .arg(format!("--timer-delay={delay}ms"))
            .args(["--events-per-ms=10", "--max-disorder=100ms"])
            .args(["--parallelism=2", "--rate=100000"])
            .args(["--checkpoint-interval=50ms", "--inject-failures=2"])
            .args(["--restart-delay=20ms", "--json"])
            .args(state)
            .current_dir(dir.path())
            .arg(format!(
                "--checkpoint-dir={}",
                dir.path().join("ck").display()
            ))
            .arg(format!("--output={}", dir.path().join("out").display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{state:?}: {}", stderr(&out));
        let report = report(&out);
        // The restores had timers to bring back.
        assert_eq!(report["restarts"], 2, "{state:?}");
        assert!(
            report["timers_in_checkpoint_max"].as_u64().unwrap() > 0,
            "{state:?}: no checkpoint held a timer"
        );
        let lines: Vec<String> = tidemark_testkit::committed_lines(&dir.path().join("out"))
            .into_iter()
            .map(|(_, line)| line)
            .collect();
        assert_eq!(
            lines.len(),
            expected.len(),
            "{state:?}: a timer fired twice or never"
        );
        assert_eq!(
            lines.into_iter().collect::<BTreeSet<_>>(),
            expected,
            "{state:?}"
        );
    }
}
