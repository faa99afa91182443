use super::keys::KEYS;
use super::*;
use crate::RunArgs;
use std::time::Duration;
use tidemark_core::checkpoint::CheckpointConfig;
use tidemark_core::cluster::election::ElectionTiming;
use tidemark_core::cluster::restart::RestartStrategy;

/// The settings `yaml` makes over the defaults, unchecked, for comparing.
fn from_file(yaml: &str) -> String {
    let mut options = Options::default();
    file(yaml)
        .apply(&mut options, |_| false)
        .unwrap_or_else(|e| panic!("{yaml}: {e}"));
    described(&options)
}

/// The settings the flags make, for comparing.
fn from_flags(flags: &[&str]) -> String {
    let args = RunArgs::parse(["wordcount"].iter().chain(flags).copied())
        .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
    described(&args.options)
}

/// The job's settings and the run's leader election and REST token,
/// which are not the job's.
fn described(options: &Options) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        options.job_config(),
        options.leader_lease,
        options.leader_namespace,
        options.leader_identity,
        options.election_timing(),
        options.zookeeper_quorum,
        options.zookeeper_root,
        options.cluster_id,
        options.zookeeper_session_timeout,
        options.http_token_file,
        options.tls_files(&Origins::default()),
        options.http_tls_files(&Origins::default()),
    )
}

fn file(yaml: &str) -> ConfigFile {
    ConfigFile::parse("tidemark.yaml", yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn error(yaml: &str) -> ConfigError {
    let mut options = Options::default();
    ConfigFile::parse("tidemark.yaml", yaml)
        .and_then(|f| f.apply(&mut options, |_| false))
        .expect_err(yaml)
}

/// Files, each with the flags that mean the same. Every key of the table
/// appears in one of them or in `REFUSED`.
const SAME_AS_FLAGS: &[(&str, &[&str])] = &[
    ("parallelism.default: 3", &["--parallelism=3"]),
    ("tidemark.lease.ttl: 2 min", &["--lease-ttl=2min"]),
    ("web.checkpoints.history: 20", &["--checkpoint-history=20"]),
    ("tidemark.lease.take-over: true", &["--take-over-lease"]),
    (
        "rest.auth.token-file: /run/secrets/token",
        &["--http-token-file=/run/secrets/token"],
    ),
    (
        "security.ssl.internal:\n  enabled: true\n  cert-file: /pki/node.pem\n  key-file: /pki/node-key.pem\n  ca-file: /pki/ca.pem\n",
        &["--tls-cert=/pki/node.pem", "--tls-key=/pki/node-key.pem", "--tls-ca=/pki/ca.pem"],
    ),
    (
        "security.ssl.rest:\n  enabled: true\n  cert-file: /pki/rest.pem\n  key-file: /pki/rest-key.pem\n",
        &["--http-tls-cert=/pki/rest.pem", "--http-tls-key=/pki/rest-key.pem"],
    ),
    ("tidemark.leader-election.lease: wc", &["--leader-lease=wc"]),
    (
        "tidemark.leader-election.lease: wc\ntidemark.leader-election.identity: a",
        &["--leader-lease=wc", "--leader-identity=a"],
    ),
    ("kubernetes.namespace: jobs", &["--leader-namespace=jobs"]),
    (
        "high-availability.kubernetes.leader-election.lease-duration: 20 s",
        &["--leader-lease-duration=20s"],
    ),
    (
        "high-availability.kubernetes.leader-election.renew-deadline: 5 s",
        &["--leader-renew-deadline=5s"],
    ),
    (
        "high-availability.kubernetes.leader-election.retry-period: 1 s",
        &["--leader-retry-period=1s"],
    ),
    (
        "high-availability.type: zookeeper\nhigh-availability.zookeeper.quorum: zk-0:2181,zk-1:2181",
        &["--zookeeper-quorum=zk-0:2181,zk-1:2181"],
    ),
    ("high-availability.zookeeper.path.root: /jobs", &["--zookeeper-root=/jobs"]),
    ("high-availability.cluster-id: wc", &["--cluster-id=wc"]),
    (
        "high-availability.zookeeper.client.session-timeout: 10 s",
        &["--zookeeper-session-timeout=10s"],
    ),
    ("tidemark.storage.multipart-threshold: 64 mb", &["--multipart-threshold=64MiB"]),
    ("tidemark.storage.upload-part-size: 5 mb", &["--upload-part-size=5MiB"]),
    ("execution.checkpointing.interval: 250 ms", &["--checkpoint-interval=250ms"]),
    ("execution.checkpointing.interval: off", &["--checkpoint-interval=off"]),
    ("execution.checkpointing.timeout: 2 min", &["--timeout=2min"]),
    ("execution.checkpointing.min-pause: 500", &["--min-pause=500ms"]),
    ("execution.checkpointing.max-concurrent-checkpoints: 3", &["--max-concurrent=3"]),
    ("execution.checkpointing.tolerable-failed-checkpoints: 4", &["--tolerable-failures=4"]),
    ("execution.checkpointing.num-retained: 3", &["--retain=3"]),
    ("state.checkpoints.num-retained: 3", &["--retain=3"]),
    ("execution.checkpointing.dir: s3://bucket/ck", &["--checkpoint-dir=s3://bucket/ck"]),
    ("state.checkpoints.dir: /data/ck", &["--checkpoint-dir=/data/ck"]),
    ("execution.checkpointing.savepoint-dir: /data/sp", &["--savepoint-dir=/data/sp"]),
    ("state.savepoints.dir: /data/sp", &["--savepoint-dir=/data/sp"]),
    ("execution.checkpointing.unaligned.enabled: true", &["--mode=unaligned"]),
    ("execution.checkpointing.unaligned: true", &["--mode=unaligned"]),
    ("execution.checkpointing.unaligned.enabled: false", &["--mode=aligned"]),
    (
        "execution.checkpointing.unaligned.enabled: true\nexecution.checkpointing.aligned-checkpoint-timeout: 30 s",
        &["--aligned-timeout=30s"],
    ),
    (
        "execution.checkpointing.unaligned.enabled: true\nexecution.checkpointing.alignment-timeout: 0",
        &["--mode=unaligned"],
    ),
    ("execution.checkpointing.data-inline-threshold: 1 kb", &["--inline-threshold=1KiB"]),
    ("state.storage.fs.memory-threshold: 0", &["--inline-threshold=0"]),
    ("state.backend.fs.memory-threshold: 2kb", &["--inline-threshold=2048"]),
    ("execution.checkpointing.file-merging.enabled: true", &["--file-merging"]),
    (
        "execution.checkpointing.file-merging:\n  enabled: true\n  max-file-size: 8 mb\n  max-space-amplification: 2.5",
        &["--file-merging", "--max-merged-file-size=8MiB", "--max-space-amplification=2.5"],
    ),
    ("state.backend.type: hashmap", &["--state=heap"]),
    ("state.backend: heap", &["--state=heap"]),
    ("tidemark.source.rate: 5000", &["--rate=5000"]),
    ("execution.state-recovery.path: latest", &["--restore=latest"]),
    ("execution.savepoint.path: /data/sp/savepoint-1", &["--restore=/data/sp/savepoint-1"]),
    (
        "execution.state-recovery:\n  path: chk-4\n  claim-mode: CLAIM\n  ignore-unclaimed-state: true",
        &["--restore=chk-4", "--restore-mode=claim", "--allow-non-restored-state"],
    ),
    (
        "execution.savepoint.path: latest\nexecution.savepoint-restore-mode: NO_CLAIM\nexecution.savepoint.ignore-unclaimed-state: true",
        &["--restore=latest", "--restore-mode=no-claim", "--allow-non-restored-state"],
    ),
    ("restart-strategy.type: none", &["--max-restarts=0"]),
    ("restart-strategy: disable", &["--max-restarts=0"]),
    ("restart-strategy.type: fixed-delay", &["--restart-backoff=false"]),
    ("restart-strategy.type: exponential-delay", &["--restart-backoff"]),
    (
        "restart-strategy:\n  type: fixed-delay\n  fixed-delay:\n    attempts: 3\n    delay: 1 s",
        &["--max-restarts=3", "--restart-delay=1s"],
    ),
    (
        "restart-strategy.type: exponentialdelay\nrestart-strategy.exponential-delay.initial-backoff: 20ms\nrestart-strategy.exponential-delay.attempts-before-reset-backoff: 4\nrestart-strategy.exponential-delay.jitter-factor: 0",
        &["--restart-backoff", "--restart-delay=20ms", "--max-restarts=4"],
    ),
    #[cfg(feature = "rocksdb")]
    (
        "state.backend.type: rocksdb\nstate.backend.rocksdb.localdir: /var/tmp/db\ntidemark.state.cache-entries: 1000\nexecution.checkpointing.incremental: true",
        &["--state=rocksdb", "--state-dir=/var/tmp/db", "--state-cache-entries=1000", "--incremental"],
    ),
    #[cfg(feature = "rocksdb")]
    (
        "state.backend: rocksdb\nstate.backend.incremental: true",
        &["--state=rocksdb", "--incremental"],
    ),
];

/// Keys that name what Tidemark cannot do, each with a value and a word
/// of the reason it gives.
const REFUSED: &[(&str, &str)] = &[
    ("restart-strategy.type: failure-rate", "failure-rate"),
    (
        "restart-strategy.failure-rate.max-failures-per-interval: 3",
        "failure-rate",
    ),
    (
        "restart-strategy.failure-rate.failure-rate-interval: 1 min",
        "failure-rate",
    ),
    ("restart-strategy.failure-rate.delay: 1 s", "failure-rate"),
    (
        "restart-strategy.exponential-delay.reset-backoff-threshold: 1 h",
        "never resets",
    ),
    (
        "restart-strategy.exponential-delay.jitter-factor: 0.1",
        "jitter",
    ),
    ("execution.state-recovery.claim-mode: LEGACY", "legacy"),
    ("state.backend.rocksdb.localdir: /a,/b", "one directory"),
    ("state.backend.type: forst", "hashmap or rocksdb"),
    ("security.ssl.internal.keystore: /pki/node.jks", "PEM"),
    ("security.ssl.internal.keystore-password: secret", "PEM"),
    ("security.ssl.internal.key-password: secret", "PEM"),
    ("security.ssl.internal.truststore: /pki/trust.jks", "PEM"),
    ("security.ssl.internal.truststore-password: secret", "PEM"),
    ("security.ssl.internal.cert.fingerprint: AB:CD", "PEM"),
    (
        "security.ssl.keystore: /pki/node.jks",
        "security.ssl.internal.cert-file",
    ),
    ("security.ssl.keystore-password: secret", "PEM"),
    ("security.ssl.key-password: secret", "PEM"),
    (
        "security.ssl.truststore: /pki/trust.jks",
        "security.ssl.internal.ca-file",
    ),
    ("security.ssl.truststore-password: secret", "PEM"),
    (
        "security.ssl.rest.keystore: /pki/rest.jks",
        "security.ssl.rest.cert-file",
    ),
    ("security.ssl.rest.truststore: /pki/trust.jks", "PEM"),
];

/// Rows of `SAME_AS_FLAGS` that set what is the default anyway.
const RESTATE_DEFAULTS: &[&str] = &[
    "execution.checkpointing.unaligned.enabled: false",
    "state.backend.type: hashmap",
    "state.backend: heap",
    "restart-strategy.type: fixed-delay",
];

#[test]
fn every_key_sets_what_its_flag_sets() {
    let default = from_flags(&[]);
    for (yaml, flags) in SAME_AS_FLAGS {
        let settings = from_file(yaml);
        assert_eq!(settings, from_flags(flags), "{yaml}");
        if RESTATE_DEFAULTS.contains(yaml) {
            let origins = file(yaml)
                .apply(&mut Options::default(), |_| false)
                .unwrap();
            assert!(!origins.set.is_empty(), "{yaml} sets an option");
        } else {
            assert_ne!(settings, default, "{yaml} changes something");
        }
    }
}

/// The keys that have no flag.
const BACKOFF: &str = "restart-strategy:\n  type: exponential-delay\n  exponential-delay:\n    max-backoff: 1 min\n    backoff-multiplier: 1.5\n";

#[test]
fn keys_without_a_flag_set_the_backoff() {
    let mut options = Options::default();
    file(BACKOFF).apply(&mut options, |_| false).unwrap();
    assert_eq!(
        options.job_config().restart,
        RestartStrategy::ExponentialBackoff {
            initial: RestartStrategy::DEFAULT_DELAY,
            max: Duration::from_secs(60),
            multiplier: 1.5,
            max_attempts: RestartStrategy::DEFAULT_MAX_ATTEMPTS,
        }
    );
}

const ZOOKEEPER_CONNECTION: &str = "high-availability.zookeeper.client.connection-timeout: 3 s";

#[test]
fn keys_without_a_flag_set_the_zookeeper_connection_timeout() {
    let mut options = Options::default();
    file(ZOOKEEPER_CONNECTION)
        .apply(&mut options, |_| false)
        .unwrap();
    assert_eq!(options.zookeeper_connection_timeout, Duration::from_secs(3));
}

/// One service elects, the one `high-availability.type` names, and only
/// where a new leader has a checkpoint to restore.
#[test]
fn an_election_is_refused_where_it_could_not_work() {
    let refusal = |flags: &[&str]| {
        let args = RunArgs::parse(["wordcount"].iter().chain(flags).copied()).unwrap();
        args.options.validate(&Origins::default()).unwrap_err()
    };
    let both = refusal(&["--zookeeper-quorum=zk:2181", "--leader-lease=wc"]);
    assert_eq!(both.option, "zookeeper_quorum");
    assert!(both.problem.contains("--leader-lease") && both.problem.contains("choose one"));
    let unsaved = refusal(&["--zookeeper-quorum=zk:2181", "--checkpoint-interval=off"]);
    assert_eq!(unsaved.option, "zookeeper_quorum");
    assert!(
        unsaved.problem.contains("needs checkpointing"),
        "{unsaved:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tidemark.yaml");
    for (yaml, problem) in [
        (
            "high-availability.type: zookeeper\n",
            "high-availability.type: needs --zookeeper-quorum or high-availability.zookeeper.quorum",
        ),
        (
            "high-availability.type: kubernetes\nhigh-availability.zookeeper.quorum: zk:2181\n",
            "high-availability.type: is kubernetes, but high-availability.zookeeper.quorum (",
        ),
    ] {
        std::fs::write(&path, yaml).unwrap();
        let text = load(&path).unwrap_err().to_string();
        assert!(text.contains(problem), "{yaml}: {text}");
    }
}

/// Flink's switch turns TLS off with its files given, and on only with
/// all three; a missing file is named as the user would give it.
#[test]
fn tls_takes_all_three_files_or_none() {
    let files = "security.ssl.internal.cert-file: /pki/node.pem\nsecurity.ssl.internal.key-file: /pki/node-key.pem\nsecurity.ssl.internal.ca-file: /pki/ca.pem\n";
    let settings = |yaml: &str| {
        let mut options = Options::default();
        let origins = file(yaml).apply(&mut options, |_| false).unwrap();
        options.tls_files(&origins)
    };
    assert_eq!(
        settings(&format!("{files}security.ssl.internal.enabled: false\n")),
        Ok(None)
    );
    assert!(matches!(settings(files), Ok(Some(_))));
    let refused = settings("security.ssl.internal.enabled: true\n").unwrap_err();
    assert_eq!(refused.option, "tls_enabled");
    assert!(
        refused.problem.contains("security.ssl.internal.cert-file"),
        "{refused:?}"
    );
    let partial = settings("security.ssl.internal.cert-file: /pki/node.pem\n").unwrap_err();
    assert_eq!(partial.option, "tls_key");
    let flags = RunArgs::parse([
        "wordcount",
        "--tls-cert=/pki/node.pem",
        "--tls-key=/pki/k.pem",
    ])
    .unwrap();
    let missing = flags.options.tls_files(&Origins::default()).unwrap_err();
    assert_eq!(missing.option, "tls_ca");
    assert!(
        missing
            .problem
            .contains("--tls-cert, --tls-key and --tls-ca"),
        "{missing:?}"
    );
}

#[test]
fn every_key_and_every_deprecated_name_is_tested() {
    let tested: std::collections::BTreeSet<String> = SAME_AS_FLAGS
        .iter()
        .map(|(yaml, _)| *yaml)
        .chain(REFUSED.iter().map(|(yaml, _)| *yaml))
        .chain([BACKOFF, ZOOKEEPER_CONNECTION])
        .flat_map(|yaml| file(yaml).entries)
        .map(|entry| entry.key)
        .collect();
    for key in KEYS {
        #[cfg(not(feature = "rocksdb"))]
        if [
            "state.backend.rocksdb.localdir",
            "tidemark.state.cache-entries",
            "execution.checkpointing.incremental",
        ]
        .contains(&key.name)
        {
            continue;
        }
        for name in [key.name].iter().chain(key.aliases) {
            assert!(tested.contains(*name), "{name} is tested");
        }
    }
}

#[test]
fn keys_tidemark_cannot_honour_are_refused_with_the_reason() {
    for (yaml, reason) in REFUSED {
        match error(yaml) {
            ConfigError::BadValue {
                key, problem, line, ..
            } => {
                assert!(yaml.starts_with(&key), "{yaml}: {key}");
                assert!(problem.contains(reason), "{yaml}: {problem}");
                assert_eq!(line, 1);
            }
            other => panic!("{yaml}: {other}"),
        }
    }
}

#[test]
fn nested_keys_are_flat_keys() {
    let nested = "execution:\n  checkpointing:\n    interval: 1min\n    file-merging:\n      enabled: true\nparallelism:\n  default: 2\n";
    let flat = "execution.checkpointing.interval: 1min\nexecution.checkpointing.file-merging.enabled: true\nparallelism.default: 2\n";
    let mixed = "execution.checkpointing:\n  interval: 60000\n  file-merging.enabled: true\nparallelism.default: 2\n";
    assert_eq!(from_file(nested), from_file(flat));
    assert_eq!(from_file(mixed), from_file(flat));
    assert_ne!(from_file(flat), from_file(""));
}

#[test]
fn the_defaults_are_the_embedding_apis_but_for_the_hosts_cores() {
    let config = Options::default().job_config();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let embedded = JobConfig::default()
        .parallelism(cores)
        .checkpointing(CheckpointConfig::default());
    assert_eq!(format!("{config:?}"), format!("{embedded:?}"));
    assert_eq!(from_file("# nothing\n"), described(&Options::default()));
    assert_eq!(
        Options::default().election_timing(),
        ElectionTiming::default()
    );
}

/// `tidemark run wordcount FLAGS` with `yaml` as its configuration file.
fn run_settings(yaml: &str, flags: &[&str]) -> (Options, Origins) {
    let args = RunArgs::parse(["wordcount"].iter().chain(flags).copied()).unwrap();
    let mut options = args.options.clone();
    let origins = file(yaml)
        .apply(&mut options, |id| args.given.contains(id))
        .unwrap();
    (options, origins)
}

#[test]
fn flags_given_win_over_the_file_and_defaults_do_not() {
    let yaml = "parallelism.default: 3\nexecution.checkpointing.timeout: 1 min\nexecution.checkpointing.file-merging.enabled: true\nrestart-strategy.type: exponential-delay\n";
    let (options, origins) = run_settings(
        yaml,
        &["--parallelism=2", "--file-merging=false", "--timeout=10min"],
    );
    assert_eq!(options.parallelism, Some(2));
    assert!(!options.file_merging);
    assert_eq!(
        options.timeout,
        Duration::from_secs(600),
        "given, though equal to the default"
    );
    assert!(options.restart_backoff, "the file's, over the default");
    assert_eq!(origins.name("parallelism"), "--parallelism");
    assert_eq!(
        origins.name("restart_backoff"),
        "restart-strategy.type (tidemark.yaml:4)"
    );
    assert_eq!(
        origins.located("restart_backoff"),
        Some(&Located {
            key: "restart-strategy.type".into(),
            line: 4
        })
    );
}

#[test]
fn an_alignment_flag_replaces_both_alignment_keys() {
    let yaml = "execution.checkpointing.unaligned.enabled: true\nexecution.checkpointing.aligned-checkpoint-timeout: 30 s\n";
    let (options, _) = run_settings(yaml, &["--mode=unaligned"]);
    assert_eq!(
        (options.mode, options.aligned_timeout),
        (Mode::Unaligned, None)
    );
    let (options, _) = run_settings(yaml, &["--aligned-timeout=5s"]);
    assert_eq!(
        (options.mode, options.aligned_timeout),
        (Mode::Aligned, Some(Duration::from_secs(5)))
    );
    let (options, _) = run_settings(yaml, &[]);
    assert_eq!(
        (options.mode, options.aligned_timeout),
        (Mode::Aligned, Some(Duration::from_secs(30)))
    );
}

#[test]
fn unknown_keys_and_bad_values_name_the_key_the_file_and_the_line() {
    let e = error("parallelism.default: 2\nexecution:\n  checkpointing:\n    intervall: 1 s\n");
    assert!(
        matches!(&e, ConfigError::UnknownKey { key, line: 4, .. } if key == "execution.checkpointing.intervall"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "tidemark.yaml:4: unknown key execution.checkpointing.intervall"
    );
    for (yaml, key) in [
        (
            "execution.checkpointing.timeout: soon",
            "execution.checkpointing.timeout",
        ),
        (
            "execution.checkpointing.interval: 0 s",
            "execution.checkpointing.interval",
        ),
        (
            "execution.checkpointing.num-retained: 0",
            "execution.checkpointing.num-retained",
        ),
        (
            "execution.checkpointing.data-inline-threshold: 20 kilo",
            "execution.checkpointing.data-inline-threshold",
        ),
        (
            "execution.checkpointing.incremental: yes",
            "execution.checkpointing.incremental",
        ),
        ("parallelism.default: 129", "parallelism.default"),
        (
            "execution.checkpointing.file-merging.max-space-amplification: 1",
            "execution.checkpointing.file-merging.max-space-amplification",
        ),
        (
            "restart-strategy.exponential-delay.backoff-multiplier: 0.5",
            "restart-strategy.exponential-delay.backoff-multiplier",
        ),
        ("restart-strategy.type: sometimes", "restart-strategy.type"),
        (
            "execution.state-recovery.path: /",
            "execution.state-recovery.path",
        ),
        (
            "tidemark.state.cache-entries: 0",
            "tidemark.state.cache-entries",
        ),
        ("tidemark.source.rate: -3", "tidemark.source.rate"),
        (
            "execution.checkpointing.timeout:",
            "execution.checkpointing.timeout",
        ),
        (
            "execution.checkpointing.timeout: [1 s]",
            "execution.checkpointing.timeout",
        ),
    ] {
        let e = error(&format!("# settings\n{yaml}\n"));
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("tidemark.yaml:2: {key}: ")),
            "{yaml}: {text}"
        );
    }
}

#[test]
fn a_setting_given_twice_is_a_conflict() {
    for (yaml, key, other) in [
        (
            "state.checkpoints.dir: /a\nexecution.checkpointing.dir: /b\n",
            "execution.checkpointing.dir",
            "state.checkpoints.dir",
        ),
        (
            "execution.checkpointing.interval: 1 s\nexecution:\n  checkpointing:\n    interval: 2 s\n",
            "execution.checkpointing.interval",
            "execution.checkpointing.interval",
        ),
        (
            "restart-strategy.type: none\nrestart-strategy.fixed-delay.attempts: 3\n",
            "restart-strategy.fixed-delay.attempts",
            "restart-strategy.type",
        ),
    ] {
        match error(yaml) {
            ConfigError::Conflict { key: k, other: o, other_line: 1, .. } => {
                assert_eq!((k.as_str(), o.as_str()), (key, other), "{yaml}")
            }
            e => panic!("{yaml}: {e}"),
        }
    }
}

#[test]
fn keys_that_would_be_ignored_are_refused() {
    for (yaml, key, problem) in [
        (
            "execution.checkpointing.aligned-checkpoint-timeout: 1 s\n",
            "execution.checkpointing.aligned-checkpoint-timeout",
            "unaligned.enabled: true",
        ),
        (
            "restart-strategy.type: fixed-delay\nrestart-strategy.exponential-delay.max-backoff: 1 s\n",
            "restart-strategy.exponential-delay.max-backoff",
            "exponential-delay, and the restart strategy is fixed-delay",
        ),
        (
            "restart-strategy.type: none\nrestart-strategy.fixed-delay.delay: 1 s\n",
            "restart-strategy.fixed-delay.delay",
            "fixed-delay, and the restart strategy is none",
        ),
    ] {
        match error(yaml) {
            ConfigError::BadValue { key: k, problem: p, .. } => {
                assert_eq!(k, key, "{yaml}");
                assert!(p.contains(problem), "{yaml}: {p}");
            }
            e => panic!("{yaml}: {e}"),
        }
    }
}

#[test]
fn a_file_that_is_not_a_map_of_keys_is_refused() {
    for (yaml, line) in [
        ("- a\n- b\n", 1),
        ("a: [1\n", 2),
        ("a: 1\n---\nb: 2\n", 3),
        ("? [a]\n: 1\n", 1),
    ] {
        match ConfigFile::parse("tidemark.yaml", yaml) {
            Err(ConfigError::Syntax { line: l, .. }) => assert_eq!(l, line, "{yaml}"),
            other => panic!("{yaml}: {other:?}"),
        }
    }
}

#[test]
fn load_refuses_settings_that_do_not_work_together_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tidemark.yaml");
    std::fs::write(
        &path,
        "parallelism.default: 2\nexecution.checkpointing.file-merging.max-file-size: 1 mb\n",
    )
    .unwrap();
    let e = load(&path).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "{}:2: execution.checkpointing.file-merging.max-file-size: applies to file merging",
            path.display()
        )),
        "{text}"
    );

    std::fs::write(
        &path,
        "parallelism.default: 2\nexecution.checkpointing.num-retained: 4\n",
    )
    .unwrap();
    let config = load(&path).unwrap();
    assert_eq!(config.parallelism, 2);
    assert_eq!(config.checkpointing.unwrap().policy.retain, 4);

    let missing = dir.path().join("missing.yaml");
    assert!(matches!(load(&missing), Err(ConfigError::Read { path, .. }) if path == missing));

    // A checkpoint path elsewhere would be read from the job's own
    // directory instead: refused, as `chk-N` alone is taken.
    std::fs::write(
        &path,
        "execution.state-recovery.path: /elsewhere/job/chk-7
",
    )
    .unwrap();
    let text = load(&path).unwrap_err().to_string();
    assert!(
        text.starts_with(&format!(
            "{}:1: execution.state-recovery.path: give chk-N alone",
            path.display()
        )),
        "{text}"
    );
    std::fs::write(
        &path,
        "execution.state-recovery.path: chk-7
",
    )
    .unwrap();
    let restore = load(&path).unwrap().checkpointing.unwrap().restore;
    assert_eq!(
        restore,
        tidemark_core::checkpoint::Restore::Checkpoint(tidemark_core::model::ids::CheckpointId(7))
    );
}

/// The problem `tidemark run` gives for `flags`, which must be refused.
fn refused(topology: &str, flags: &[&str]) -> String {
    RunArgs::parse([topology].iter().chain(flags).copied())
        .map(|_| ())
        .expect_err(&format!("{flags:?} is refused"))
        .to_string()
}

const TOO_LONG: &[&str] = &[
    "366 d",
    "8761 h",
    "99999999 d",
    "18446744073709551615 ns",
    "18446744073709551615 ms",
    "18446744073709551615 d",
    "99999999999999999999999999 s",
];

#[test]
fn durations_past_a_year_are_refused_naming_the_flag_and_the_range() {
    for flag in [
        "--checkpoint-interval",
        "--timeout",
        "--min-pause",
        "--aligned-timeout",
        "--restart-delay",
        "--max-disorder",
        "--interval",
        "--savepoint-after",
        "--stop-with-savepoint-after",
    ] {
        let year = format!("{flag}=365d");
        RunArgs::parse(["wordcount", &year]).unwrap_or_else(|e| panic!("{year}: {e}"));
        for value in TOO_LONG {
            let text = refused("wordcount", &[&format!("{flag}={value}")]);
            assert!(
                text.contains(flag) && text.contains("at most 365 d"),
                "{flag}={value}: {text}"
            );
        }
    }
    for window in [
        "tumbling:366d",
        "session:18446744073709551615ms",
        "sliding:1d/99999999999999999999d",
    ] {
        let text = refused("windows", &[&format!("--window={window}")]);
        assert!(text.contains("at most 365 d"), "{window}: {text}");
    }
    let text = refused("windows", &["--window=sliding:365d/1ms"]);
    assert!(text.contains("more than 1000 windows"), "{text}");
    RunArgs::parse(["windows", "--window=sliding:1000s/1s"]).unwrap();
}

#[test]
fn numbers_out_of_range_are_refused_naming_the_flag_and_the_range() {
    for (flag, values, range) in [
        (
            "--parallelism",
            &["0", "129", "-1", "18446744073709551616"][..],
            "from 1 to 128",
        ),
        (
            "--max-restarts",
            &["2147483648", "4294967295", "-1"],
            "from 0 to 2147483647",
        ),
        (
            "--tolerable-failures",
            &["2147483648", "99999999999999999999"],
            "from 0 to 2147483647",
        ),
        ("--retain", &["0", "2147483648"], "from 1 to 2147483647"),
        (
            "--max-concurrent",
            &["0", "4294967296"],
            "from 1 to 2147483647",
        ),
        ("--state-cache-entries", &["0"], "at least 1"),
        (
            "--rate",
            &["0", "-5", "NaN", "inf", "-inf", "1e309"],
            "positive",
        ),
        ("--max-space-amplification", &["1", "NaN", "inf"], "above 1"),
        (
            "--inline-threshold",
            &["1025 kb", "2MiB", "4096 tb"],
            "at most 1 MiB",
        ),
        (
            "--max-merged-file-size",
            &["16777216 tb", "99999999999999999999"],
            "below 16 EiB",
        ),
        (
            "--upload-part-size",
            &["0", "5369709120", "6 GiB"],
            "from 1 byte to 5 GiB",
        ),
        (
            "--slow-ns",
            &["0", "1000000001", "18446744073709551615"],
            "1..=1000000000",
        ),
        ("--inject-failures", &["1001", "4294967295"], "0..=1000"),
        ("--lease-ttl", &["999ms", "2d", "0s"], "from 1 s to 1 d"),
    ] {
        for value in values {
            let mut flags = vec![format!("{flag}={value}")];
            if flag == "--slow-ns" {
                flags.push("--slow-subtask=0".into());
            }
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let text = refused("wordcount", &flags);
            assert!(
                text.contains(flag) && text.contains(range),
                "{flag}={value}: {text}"
            );
        }
    }
}

#[test]
fn keys_out_of_range_are_refused_naming_the_key_and_the_range() {
    for (yaml, range) in [
        ("execution.checkpointing.interval: 366 d", "at most 365 d"),
        (
            "execution.checkpointing.timeout: 99999999 d",
            "at most 365 d",
        ),
        (
            "execution.checkpointing.min-pause: 18446744073709551615",
            "at most 365 d",
        ),
        (
            "execution.checkpointing.aligned-checkpoint-timeout: 18446744073709551615 d",
            "at most 365 d",
        ),
        (
            "restart-strategy.fixed-delay.delay: 9999 d",
            "at most 365 d",
        ),
        (
            "restart-strategy.exponential-delay.initial-backoff: 9999 d",
            "at most 365 d",
        ),
        (
            "restart-strategy.exponential-delay.max-backoff: 9999 d",
            "at most 365 d",
        ),
        ("parallelism.default: 0", "from 1 to 128"),
        ("parallelism.default: 18446744073709551616", "from 1 to 128"),
        (
            "restart-strategy.fixed-delay.attempts: 2147483648",
            "2147483647",
        ),
        (
            "execution.checkpointing.tolerable-failed-checkpoints: 4294967295",
            "2147483647",
        ),
        ("tidemark.source.rate: .nan", "positive"),
        ("tidemark.source.rate: .inf", "positive"),
        ("tidemark.source.rate: 0", "positive"),
        (
            "restart-strategy.exponential-delay.backoff-multiplier: .inf",
            "at least 1",
        ),
        (
            "restart-strategy.exponential-delay.backoff-multiplier: .nan",
            "at least 1",
        ),
        (
            "execution.checkpointing.file-merging.max-space-amplification: .nan",
            "above 1",
        ),
        (
            "execution.checkpointing.data-inline-threshold: 2 mb",
            "at most 1 MiB",
        ),
        (
            "tidemark.storage.upload-part-size: 0",
            "from 1 byte to 5 GiB",
        ),
        (
            "state.storage.fs.memory-threshold: 99999999999 tb",
            "below 16 EiB",
        ),
        (
            "restart-strategy.exponential-delay.jitter-factor: .nan",
            "jitter",
        ),
    ] {
        let text = error(&format!("# settings\n{yaml}\n")).to_string();
        let key = yaml.split(':').next().unwrap();
        assert!(
            text.starts_with(&format!("tidemark.yaml:2: {key}: ")) && text.contains(range),
            "{yaml}: {text}"
        );
    }
}

#[test]
fn the_most_every_option_accepts_runs_into_no_overflow() {
    let year = "365d";
    let flags = [
        "--checkpoint-interval",
        "--timeout",
        "--min-pause",
        "--aligned-timeout",
        "--restart-delay",
    ]
    .map(|flag| format!("{flag}={year}"));
    let mut options = RunArgs::parse(
        [
            "wordcount",
            "--restart-backoff",
            "--max-restarts=2147483647",
            "--rate=1e-300",
        ]
        .into_iter()
        .chain(flags.iter().map(String::as_str)),
    )
    .unwrap()
    .options;
    let yaml =
        "restart-strategy.exponential-delay:\n  max-backoff: 365 d\n  backoff-multiplier: 1e308\n";
    file(yaml).apply(&mut options, |_| false).unwrap();
    let config = options.job_config();
    config.validate().unwrap();
    let settings = config.checkpointing.as_ref().unwrap();
    // The coordinator adds these to instants: a year always fits.
    let now = std::time::Instant::now();
    for d in [
        settings.policy.interval.unwrap(),
        settings.policy.timeout,
        settings.policy.min_pause,
    ] {
        assert!(now.checked_add(d).is_some(), "{d:?}");
    }
    for restart in [1, 2, 1000, i32::MAX as u32, u32::MAX] {
        let delay = config.restart.delay(restart);
        assert!(
            delay.is_none_or(|d| d <= values::MAX_DURATION),
            "{restart}: {delay:?}"
        );
    }
    let mut limiter =
        tidemark_core::dataflow::rate::RateLimiter::new(config.source_rate.unwrap(), 1, now);
    assert_eq!(
        limiter.acquire(1, now),
        Err(tidemark_core::dataflow::rate::MAX_WAIT)
    );
}

mod properties {
    use super::super::values::{self, MAX_DURATION};
    use proptest::prelude::*;
    use std::time::Instant;

    /// Units of durations, with their nanoseconds.
    const UNITS: &[(&str, u128)] = &[
        ("", 1_000_000),
        ("d", 86_400_000_000_000),
        ("days", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("min", 60_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("µs", 1_000),
        ("ns", 1),
    ];

    proptest! {
        /// A duration is read exactly, up to a year, which fits an instant;
        /// above, it is refused.
        #[test]
        fn any_duration_is_exact_or_refused(
            digits in "[0-9]{1,45}",
            space in prop::bool::ANY,
            (unit, nanos) in prop::sample::select(UNITS),
        ) {
            let text = format!("{digits}{}{unit}", if space { " " } else { "" });
            let expected = digits.parse::<u128>().ok().and_then(|n| n.checked_mul(nanos));
            match values::duration(&text) {
                Ok(d) => {
                    prop_assert_eq!(Some(d.as_nanos()), expected);
                    prop_assert!(Instant::now().checked_add(d).is_some());
                }
                Err(e) => {
                    prop_assert!(expected.is_none_or(|n| n > MAX_DURATION.as_nanos()), "{}", e);
                    prop_assert!(e.contains("at most 365 d"), "{}", e);
                }
            }
        }

        /// A size is read exactly, or refused if it is 2^64 bytes or more.
        #[test]
        fn any_size_is_exact_or_refused(
            digits in "[0-9]{1,45}",
            (unit, shift) in prop::sample::select(&[
                ("", 0), ("b", 0), ("kb", 10), ("KiB", 10), ("m", 20), ("mb", 20),
                ("g", 30), ("GiB", 30), ("t", 40), ("tb", 40),
            ][..]),
        ) {
            let text = format!("{digits} {unit}");
            let expected = digits
                .parse::<u128>()
                .ok()
                .and_then(|n| n.checked_mul(1 << shift))
                .and_then(|n| u64::try_from(n).ok());
            match values::size(&text) {
                Ok(n) => prop_assert_eq!(Some(n), expected),
                Err(e) => prop_assert!(expected.is_none() && e.contains("below 16 EiB"), "{}", e),
            }
        }

        /// No text makes a value parser panic.
        #[test]
        fn no_text_panics_a_parser(text in "\\PC{0,40}") {
            let _ = values::duration(&text);
            let _ = values::flag_duration(&text);
            let _ = values::interval(&text);
            let _ = values::size(&text);
            let _ = values::inline_threshold(&text);
            let _ = values::part_size(&text);
            let _ = values::parallelism(&text);
            let _ = values::count(&text);
            let _ = values::rate(&text);
            let _ = values::multiplier(&text);
            let _ = values::amplification(&text);
            let _ = values::restore(&text);
            let _ = crate::topologies::windows::parse_window(&text);
        }
    }
}
