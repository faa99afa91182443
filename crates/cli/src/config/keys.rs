//! The keys of a configuration file and the options they set: Flink's name
//! where Flink has the setting (its deprecated names too), `tidemark.…`
//! otherwise. A key that names something Tidemark cannot do is refused
//! with the reason, never ignored.

use super::apply::Applier;
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

/// A key that reads its value with `$parse` and sets the option of the
/// same name (in `Some` where the option is optional): the option is named
/// once, so the key cannot set another option than its flag sets.
macro_rules! sets {
    ($name:literal, [$($alias:literal),*], $option:ident = Some($parse:expr)) => {
        Key {
            name: $name,
            aliases: &[$($alias),*],
            apply: |a, v| {
                let value = $parse(v)?;
                a.set(stringify!($option), |o| o.$option = Some(value))
            },
        }
    };
    ($name:literal, [$($alias:literal),*], $option:ident = $parse:expr) => {
        Key {
            name: $name,
            aliases: &[$($alias),*],
            apply: |a, v| {
                let value = $parse(v)?;
                a.set(stringify!($option), |o| o.$option = value)
            },
        }
    };
}

/// Refuses a key Tidemark knows but cannot honour.
fn unsupported(why: &'static str) -> Result<(), Problem> {
    Err(Problem::Value(why.into()))
}

/// A Flink SSL key of the Java keystores, which Tidemark reads as PEM.
const fn pem_only(name: &'static str) -> Key {
    Key {
        name,
        aliases: &[],
        apply: |_, _| {
            unsupported("Tidemark reads PEM files, not Java keystores: give security.ssl.internal.cert-file, security.ssl.internal.key-file and security.ssl.internal.ca-file, and security.ssl.rest.cert-file and security.ssl.rest.key-file for the REST API")
        },
    }
}

const NO_FAILURE_RATE: &str =
    "Tidemark has no failure-rate restart strategy; use fixed-delay or exponential-delay";

/// Every key a file may hold.
pub(super) const KEYS: &[Key] = &[
    sets!(
        "parallelism.default",
        [],
        parallelism = Some(values::parallelism)
    ),
    sets!(
        "execution.checkpointing.interval",
        [],
        checkpoint_interval = values::interval
    ),
    sets!(
        "execution.checkpointing.timeout",
        [],
        timeout = values::duration
    ),
    sets!(
        "execution.checkpointing.min-pause",
        [],
        min_pause = values::duration
    ),
    sets!(
        "execution.checkpointing.max-concurrent-checkpoints",
        [],
        max_concurrent = values::positive
    ),
    sets!(
        "execution.checkpointing.tolerable-failed-checkpoints",
        [],
        tolerable_failures = values::count
    ),
    sets!(
        "execution.checkpointing.num-retained",
        ["state.checkpoints.num-retained"],
        retain = values::positive
    ),
    sets!(
        "execution.checkpointing.dir",
        ["state.checkpoints.dir"],
        checkpoint_dir = values::text
    ),
    sets!(
        "execution.checkpointing.savepoint-dir",
        ["state.savepoints.dir"],
        savepoint_dir = Some(values::text)
    ),
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
    sets!(
        "execution.checkpointing.incremental",
        ["state.backend.incremental"],
        incremental = values::boolean
    ),
    sets!(
        "execution.checkpointing.data-inline-threshold",
        [
            "state.storage.fs.memory-threshold",
            "state.backend.fs.memory-threshold"
        ],
        inline_threshold = values::inline_threshold
    ),
    sets!(
        "execution.checkpointing.file-merging.enabled",
        [],
        file_merging = values::boolean
    ),
    sets!(
        "execution.checkpointing.file-merging.max-file-size",
        [],
        max_merged_file_size = Some(values::size)
    ),
    sets!(
        "execution.checkpointing.file-merging.max-space-amplification",
        [],
        max_space_amplification = Some(values::amplification)
    ),
    sets!(
        "state.backend.type",
        ["state.backend"],
        state = values::state_kind
    ),
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
    sets!(
        "tidemark.state.cache-entries",
        [],
        state_cache_entries = Some(values::cache_entries)
    ),
    sets!("tidemark.source.rate", [], rate = Some(values::rate)),
    sets!("tidemark.lease.ttl", [], lease_ttl = values::lease_ttl),
    sets!(
        "tidemark.leader-election.lease",
        [],
        leader_lease = Some(values::text)
    ),
    sets!(
        "kubernetes.namespace",
        [],
        leader_namespace = Some(values::text)
    ),
    sets!(
        "tidemark.leader-election.identity",
        [],
        leader_identity = Some(values::text)
    ),
    sets!(
        "high-availability.kubernetes.leader-election.lease-duration",
        [],
        leader_lease_duration = values::duration
    ),
    sets!(
        "high-availability.kubernetes.leader-election.renew-deadline",
        [],
        leader_renew_deadline = values::duration
    ),
    sets!(
        "high-availability.kubernetes.leader-election.retry-period",
        [],
        leader_retry_period = values::duration
    ),
    sets!(
        "high-availability.type",
        [],
        ha_type = Some(values::ha_type)
    ),
    sets!(
        "high-availability.zookeeper.quorum",
        [],
        zookeeper_quorum = Some(values::text)
    ),
    sets!(
        "high-availability.zookeeper.path.root",
        [],
        zookeeper_root = values::text
    ),
    sets!(
        "high-availability.cluster-id",
        [],
        cluster_id = values::text
    ),
    sets!(
        "high-availability.zookeeper.client.session-timeout",
        [],
        zookeeper_session_timeout = values::duration
    ),
    sets!(
        "high-availability.zookeeper.client.connection-timeout",
        [],
        zookeeper_connection_timeout = values::duration
    ),
    sets!(
        "web.checkpoints.history",
        [],
        checkpoint_history = values::positive
    ),
    sets!(
        "tidemark.storage.multipart-threshold",
        [],
        multipart_threshold = values::size
    ),
    sets!(
        "tidemark.storage.upload-part-size",
        [],
        upload_part_size = values::part_size
    ),
    sets!(
        "tidemark.lease.take-over",
        [],
        take_over_lease = values::boolean
    ),
    sets!(
        "rest.auth.token-file",
        [],
        http_token_file = Some(values::path)
    ),
    Key {
        name: "security.ssl.internal.enabled",
        aliases: &[],
        apply: |a, v| {
            let enabled = values::boolean(v)?;
            a.set("tls_enabled", |o| o.tls_enabled = Some(enabled))
        },
    },
    Key {
        name: "security.ssl.internal.cert-file",
        aliases: &[],
        apply: |a, v| {
            let path = values::path(v)?;
            a.set("tls_cert", |o| o.tls.tls_cert = Some(path))
        },
    },
    Key {
        name: "security.ssl.internal.key-file",
        aliases: &[],
        apply: |a, v| {
            let path = values::path(v)?;
            a.set("tls_key", |o| o.tls.tls_key = Some(path))
        },
    },
    Key {
        name: "security.ssl.internal.ca-file",
        aliases: &[],
        apply: |a, v| {
            let path = values::path(v)?;
            a.set("tls_ca", |o| o.tls.tls_ca = Some(path))
        },
    },
    Key {
        name: "security.ssl.rest.enabled",
        aliases: &[],
        apply: |a, v| {
            let enabled = values::boolean(v)?;
            a.set("http_tls_enabled", |o| o.http_tls_enabled = Some(enabled))
        },
    },
    sets!(
        "security.ssl.rest.cert-file",
        [],
        http_tls_cert = Some(values::path)
    ),
    sets!(
        "security.ssl.rest.key-file",
        [],
        http_tls_key = Some(values::path)
    ),
    pem_only("security.ssl.rest.keystore"),
    pem_only("security.ssl.rest.truststore"),
    pem_only("security.ssl.internal.keystore"),
    pem_only("security.ssl.internal.keystore-password"),
    pem_only("security.ssl.internal.key-password"),
    pem_only("security.ssl.internal.truststore"),
    pem_only("security.ssl.internal.truststore-password"),
    pem_only("security.ssl.internal.cert.fingerprint"),
    pem_only("security.ssl.keystore"),
    pem_only("security.ssl.keystore-password"),
    pem_only("security.ssl.key-password"),
    pem_only("security.ssl.truststore"),
    pem_only("security.ssl.truststore-password"),
    sets!(
        "execution.state-recovery.path",
        ["execution.savepoint.path"],
        restore = Some(values::restore)
    ),
    sets!(
        "execution.state-recovery.claim-mode",
        ["execution.savepoint-restore-mode"],
        restore_mode = values::restore_mode
    ),
    sets!(
        "execution.state-recovery.ignore-unclaimed-state",
        ["execution.savepoint.ignore-unclaimed-state"],
        allow_non_restored_state = values::boolean
    ),
    Key {
        name: "restart-strategy.type",
        aliases: &["restart-strategy"],
        apply: |a, v| match v.trim().to_lowercase().as_str() {
            "none" | "off" | "disable" => {
                a.restart_type("none");
                a.set("max_restarts", |o| o.max_restarts = Some(0))
            }
            "fixed-delay" | "fixeddelay" => {
                a.restart_type("fixed-delay");
                a.set("restart_backoff", |o| o.restart_backoff = false)
            }
            "exponential-delay" | "exponentialdelay" => {
                a.restart_type("exponential-delay");
                a.set("restart_backoff", |o| o.restart_backoff = true)
            }
            "failure-rate" | "failurerate" => unsupported(NO_FAILURE_RATE),
            _ => Err(format!("expected none, fixed-delay or exponential-delay, got {v:?}").into()),
        },
    },
    sets!(
        "restart-strategy.fixed-delay.attempts",
        [],
        max_restarts = Some(values::count)
    ),
    sets!(
        "restart-strategy.fixed-delay.delay",
        [],
        restart_delay = values::duration
    ),
    sets!(
        "restart-strategy.exponential-delay.initial-backoff",
        [],
        restart_delay = values::duration
    ),
    sets!(
        "restart-strategy.exponential-delay.max-backoff",
        [],
        max_restart_delay = values::duration
    ),
    sets!(
        "restart-strategy.exponential-delay.backoff-multiplier",
        [],
        restart_backoff_multiplier = values::multiplier
    ),
    sets!(
        "restart-strategy.exponential-delay.attempts-before-reset-backoff",
        [],
        max_restarts = Some(values::count)
    ),
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
