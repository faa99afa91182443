//! The keys of a configuration file and the options they set: Flink's name
//! where Flink has the setting (its deprecated names too), `tidemark.…`
//! otherwise. A key that names something Tidemark cannot do is refused
//! with the reason, never ignored.

use super::apply::Applier;
use super::options::StateKind;
use super::{values, Located};

/// What is wrong with one key of a file.
pub(super) enum Problem {
    /// The value does not read, or cannot be honoured.
    Value(String),
    /// An earlier key of the file already set the same option.
    Conflict(Located),
}

impl From<String> for Problem {
    fn from(problem: String) -> Self {
        Problem::Value(problem)
    }
}

/// Reads a key's value and sets the options it means.
pub(super) type Apply = fn(&mut Applier<'_>, &str) -> Result<(), Problem>;

/// One key: its name, the deprecated Flink names that mean the same, and
/// how its value sets options.
pub(super) struct Key {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub apply: Apply,
}

/// Refuses a key Tidemark knows but cannot honour.
fn unsupported(why: &'static str) -> Result<(), Problem> {
    Err(Problem::Value(why.into()))
}

const NO_FAILURE_RATE: &str =
    "Tidemark has no failure-rate restart strategy; use fixed-delay or exponential-delay";

/// Every key a file may hold.
pub(super) const KEYS: &[Key] = &[
    Key {
        name: "parallelism.default",
        aliases: &[],
        apply: |a, v| {
            let p = values::parallelism(v)?;
            a.set("parallelism", |o| o.parallelism = Some(p))
        },
    },
    Key {
        name: "execution.checkpointing.interval",
        aliases: &[],
        apply: |a, v| {
            let i = values::interval(v)?;
            a.set("checkpoint_interval", |o| o.checkpoint_interval = i)
        },
    },
    Key {
        name: "execution.checkpointing.timeout",
        aliases: &[],
        apply: |a, v| {
            let d = values::duration(v)?;
            a.set("timeout", |o| o.timeout = d)
        },
    },
    Key {
        name: "execution.checkpointing.min-pause",
        aliases: &[],
        apply: |a, v| {
            let d = values::duration(v)?;
            a.set("min_pause", |o| o.min_pause = d)
        },
    },
    Key {
        name: "execution.checkpointing.max-concurrent-checkpoints",
        aliases: &[],
        apply: |a, v| {
            let n = values::positive(v)?;
            a.set("max_concurrent", |o| o.max_concurrent = n)
        },
    },
    Key {
        name: "execution.checkpointing.tolerable-failed-checkpoints",
        aliases: &[],
        apply: |a, v| {
            let n = values::count(v)?;
            a.set("tolerable_failures", |o| o.tolerable_failures = n)
        },
    },
    Key {
        name: "execution.checkpointing.num-retained",
        aliases: &["state.checkpoints.num-retained"],
        apply: |a, v| {
            let n = values::positive(v)?;
            a.set("retain", |o| o.retain = n)
        },
    },
    Key {
        name: "execution.checkpointing.dir",
        aliases: &["state.checkpoints.dir"],
        apply: |a, v| {
            let dir = v.to_owned();
            a.set("checkpoint_dir", |o| o.checkpoint_dir = dir)
        },
    },
    Key {
        name: "execution.checkpointing.savepoint-dir",
        aliases: &["state.savepoints.dir"],
        apply: |a, v| {
            let dir = v.to_owned();
            a.set("savepoint_dir", |o| o.savepoint_dir = Some(dir))
        },
    },
    Key {
        name: "execution.checkpointing.unaligned.enabled",
        aliases: &["execution.checkpointing.unaligned"],
        apply: |a, v| {
            a.unaligned(values::boolean(v)?);
            Ok(())
        },
    },
    Key {
        name: "execution.checkpointing.aligned-checkpoint-timeout",
        aliases: &["execution.checkpointing.alignment-timeout"],
        apply: |a, v| {
            a.aligned_timeout(values::duration(v)?);
            Ok(())
        },
    },
    Key {
        name: "execution.checkpointing.incremental",
        aliases: &["state.backend.incremental"],
        apply: |a, v| {
            let on = values::boolean(v)?;
            a.set("incremental", |o| o.incremental = on)
        },
    },
    Key {
        name: "execution.checkpointing.data-inline-threshold",
        aliases: &[
            "state.storage.fs.memory-threshold",
            "state.backend.fs.memory-threshold",
        ],
        apply: |a, v| {
            let bytes = values::size(v)?;
            a.set("inline_threshold", |o| o.inline_threshold = bytes)
        },
    },
    Key {
        name: "execution.checkpointing.file-merging.enabled",
        aliases: &[],
        apply: |a, v| {
            let on = values::boolean(v)?;
            a.set("file_merging", |o| o.file_merging = on)
        },
    },
    Key {
        name: "execution.checkpointing.file-merging.max-file-size",
        aliases: &[],
        apply: |a, v| {
            let bytes = values::size(v)?;
            a.set("max_merged_file_size", |o| {
                o.max_merged_file_size = Some(bytes)
            })
        },
    },
    Key {
        name: "execution.checkpointing.file-merging.max-space-amplification",
        aliases: &[],
        apply: |a, v| {
            let f = values::amplification(v)?;
            a.set("max_space_amplification", |o| {
                o.max_space_amplification = Some(f)
            })
        },
    },
    Key {
        name: "state.backend.type",
        aliases: &["state.backend"],
        apply: |a, v| {
            let kind = match v.trim().to_lowercase().as_str() {
                "hashmap" | "heap" => StateKind::Heap,
                "rocksdb" => StateKind::Rocksdb,
                _ => return Err(format!("expected hashmap or rocksdb, got {v:?}").into()),
            };
            a.set("state", |o| o.state = kind)
        },
    },
    Key {
        name: "state.backend.rocksdb.localdir",
        aliases: &[],
        apply: |a, v| {
            if v.contains(',') {
                return unsupported("Tidemark takes one directory, not a list");
            }
            let dir = v.into();
            a.set("state_dir", |o| o.state_dir = Some(dir))
        },
    },
    Key {
        name: "tidemark.state.cache-entries",
        aliases: &[],
        apply: |a, v| {
            let n = values::cache_entries(v)?;
            a.set("state_cache_entries", |o| o.state_cache_entries = Some(n))
        },
    },
    Key {
        name: "tidemark.source.rate",
        aliases: &[],
        apply: |a, v| {
            let rate = values::rate(v)?;
            a.set("rate", |o| o.rate = Some(rate))
        },
    },
    Key {
        name: "execution.state-recovery.path",
        aliases: &["execution.savepoint.path"],
        apply: |a, v| {
            let restore = values::restore(v)?;
            a.set("restore", |o| o.restore = Some(restore))
        },
    },
    Key {
        name: "execution.state-recovery.claim-mode",
        aliases: &["execution.savepoint-restore-mode"],
        apply: |a, v| {
            let mode = values::restore_mode(v)?;
            a.set("restore_mode", |o| o.restore_mode = mode)
        },
    },
    Key {
        name: "execution.state-recovery.ignore-unclaimed-state",
        aliases: &["execution.savepoint.ignore-unclaimed-state"],
        apply: |a, v| {
            let allow = values::boolean(v)?;
            a.set("allow_non_restored_state", |o| {
                o.allow_non_restored_state = allow
            })
        },
    },
    Key {
        name: "restart-strategy.type",
        aliases: &["restart-strategy"],
        apply: |a, v| match v.trim().to_lowercase().as_str() {
            "none" | "off" | "disable" => a.set("max_restarts", |o| o.max_restarts = Some(0)),
            "fixed-delay" | "fixeddelay" => a.set("restart_backoff", |o| o.restart_backoff = false),
            "exponential-delay" | "exponentialdelay" => {
                a.set("restart_backoff", |o| o.restart_backoff = true)
            }
            "failure-rate" | "failurerate" => unsupported(NO_FAILURE_RATE),
            _ => Err(format!("expected none, fixed-delay or exponential-delay, got {v:?}").into()),
        },
    },
    Key {
        name: "restart-strategy.fixed-delay.attempts",
        aliases: &[],
        apply: |a, v| {
            let n = values::count(v)?;
            a.set("max_restarts", |o| o.max_restarts = Some(n))
        },
    },
    Key {
        name: "restart-strategy.fixed-delay.delay",
        aliases: &[],
        apply: |a, v| {
            let d = values::duration(v)?;
            a.set("restart_delay", |o| o.restart_delay = d)
        },
    },
    Key {
        name: "restart-strategy.exponential-delay.initial-backoff",
        aliases: &[],
        apply: |a, v| {
            let d = values::duration(v)?;
            a.set("restart_delay", |o| o.restart_delay = d)
        },
    },
    Key {
        name: "restart-strategy.exponential-delay.max-backoff",
        aliases: &[],
        apply: |a, v| {
            let d = values::duration(v)?;
            a.set("max_restart_delay", |o| o.max_restart_delay = d)
        },
    },
    Key {
        name: "restart-strategy.exponential-delay.backoff-multiplier",
        aliases: &[],
        apply: |a, v| {
            let f = values::multiplier(v)?;
            a.set("restart_backoff_multiplier", |o| {
                o.restart_backoff_multiplier = f
            })
        },
    },
    Key {
        name: "restart-strategy.exponential-delay.attempts-before-reset-backoff",
        aliases: &[],
        apply: |a, v| {
            let n = values::count(v)?;
            a.set("max_restarts", |o| o.max_restarts = Some(n))
        },
    },
    Key {
        name: "restart-strategy.exponential-delay.reset-backoff-threshold",
        aliases: &[],
        apply: |_, _| {
            unsupported("Tidemark's backoff never resets; attempts-before-reset-backoff bounds all restarts")
        },
    },
    Key {
        name: "restart-strategy.exponential-delay.jitter-factor",
        aliases: &[],
        apply: |_, v| match v.trim().parse::<f64>() {
            Ok(0.0) => Ok(()),
            _ => unsupported("Tidemark's backoff has no jitter; only 0 can be honoured"),
        },
    },
    Key {
        name: "restart-strategy.failure-rate.max-failures-per-interval",
        aliases: &[],
        apply: |_, _| unsupported(NO_FAILURE_RATE),
    },
    Key {
        name: "restart-strategy.failure-rate.failure-rate-interval",
        aliases: &[],
        apply: |_, _| unsupported(NO_FAILURE_RATE),
    },
    Key {
        name: "restart-strategy.failure-rate.delay",
        aliases: &[],
        apply: |_, _| unsupported(NO_FAILURE_RATE),
    },
];

/// The key a file's key names, by its name or a deprecated one.
pub(super) fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.name == name || k.aliases.contains(&name))
}
