//! Broadcast state end to end: `tidemark run rules`, rules broadcast to a
//! keyed count, alerts every key once for every rule its count reaches,
//! checked from the committed files alone, across injected failures on
//! both state backends and with unaligned checkpoints, and across rescales
//! from savepoints.

use tidemark_testkit as common;

use std::collections::BTreeMap;
use std::path::Path;
use tidemark_cli::topologies::rules::Rules;
use tidemark_cli::topologies::wordcount::Keys;

const RECORDS: u64 = 200_000;
const KEYS: u64 = 1_000;
const RULES: u64 = 16;

/// The rules job at p=2 into `output`, checkpointing every 50 ms under
/// `root/checkpoints`, slow enough (about 1 s) that several checkpoints,
/// and most rules, fall inside.
fn args(seed: u64, root: &Path, output: &Path) -> Vec<String> {
    vec![
        "rules".to_string(),
        format!("--records={RECORDS}"),
        format!("--keys={KEYS}"),
        format!("--rules={RULES}"),
        format!("--seed={seed}"),
        "--parallelism=2".into(),
        "--rate=200000".into(),
        "--checkpoint-interval=50ms".into(),
        format!("--checkpoint-dir={}", root.join("checkpoints").display()),
        format!("--output={}", output.display()),
    ]
}

/// Every `key,rule,threshold` alert of the run, from the rules and the
/// keys' final counts: a key alerts once for every rule whose threshold
/// its count reaches, whenever the rule arrived.
fn expected(seed: u64) -> Vec<String> {
    let counts = common::expected_counts(RECORDS, KEYS, seed);
    let rules = Rules {
        records: RECORDS,
        keys: Keys { keys: KEYS, seed },
        rules: RULES,
        sink: tidemark_cli::sinks::Target::Discard,
    };
    let mut alerts: Vec<String> = rules
        .all()
        .iter()
        .flat_map(|rule| {
            let over = counts.iter().filter(|(_, &c)| c >= rule.threshold);
            over.map(|(key, _)| format!("{key},{},{}", rule.id, rule.threshold))
        })
        .collect();
    alerts.sort_unstable();
    alerts
}

/// The committed alerts under `output` are `expected`, each once.
fn assert_alerts_exactly_once(output: &Path, expected: &[String], context: &str) {
    let mut seen = BTreeMap::<&str, u32>::new();
    let lines = common::committed_lines(output);
    for (_, line) in &lines {
        *seen.entry(line).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).take(3).collect();
    assert!(
        twice.is_empty(),
        "{context}: alerts more than once: {twice:?}"
    );
    let missing: Vec<_> = expected
        .iter()
        .filter(|a| !seen.contains_key(a.as_str()))
        .take(3)
        .collect();
    assert!(
        missing.is_empty() && seen.len() == expected.len(),
        "{context}: {} alerts, expected {}; missing {missing:?}",
        seen.len(),
        expected.len()
    );
    common::assert_no_uncommitted_files(output, context);
}

#[test]
fn rules_alert_every_key_once_per_rule_across_injected_failures() {
    let cases = [
        (1, "--state=heap"),
        (2, "--state=rocksdb"),
        // Broadcast records overtaken by the barrier become channel state.
        (3, "--mode=unaligned"),
    ];
    for (seed, flag) in cases {
        let root = tempfile::tempdir().unwrap();
        let output = root.path().join("out");
        let mut args = args(seed, root.path(), &output);
        args.extend(["--inject-failures=3".into(), flag.into()]);
        let report = common::run(&args);
        assert!(report.restarts >= 1, "{flag}: no failure was injected");
        assert_alerts_exactly_once(&output, &expected(seed), flag);
    }
}

#[test]
fn broadcast_state_survives_rescales_from_savepoints_2_3_1() {
    let seed = 3;
    let root = tempfile::tempdir().unwrap();
    let output = root.path().join("out");
    let args = args(seed, root.path(), &output);
    let savepoints = format!(
        "--savepoint-dir={}",
        root.path().join("savepoints").display()
    );
    let mut restore: Vec<String> = Vec::new();
    for (step, parallelism) in [2, 3].into_iter().enumerate() {
        let mut extra = restore.clone();
        extra.extend([
            format!("--parallelism={parallelism}"),
            savepoints.clone(),
            "--stop-with-savepoint-after=300ms".into(),
            format!(
                "--checkpoint-dir={}",
                root.path().join(format!("run-{step}")).display()
            ),
        ]);
        let stopped = common::run_overriding(args.clone(), &extra)
            .unwrap_or_else(|e| panic!("p={parallelism}: {e}"));
        assert!(
            stopped.records_in < RECORDS,
            "p={parallelism}: the job ended early"
        );
        let savepoint = stopped.savepoint.expect("the savepoint completed");
        restore = vec![format!("--restore={savepoint}")];
    }
    restore.extend([
        "--parallelism=1".into(),
        format!("--checkpoint-dir={}", root.path().join("run-2").display()),
    ]);
    common::run_overriding(args, &restore).unwrap_or_else(|e| panic!("p=1: {e}"));
    assert_alerts_exactly_once(&output, &expected(seed), "p=2 → 3 → 1");
}
