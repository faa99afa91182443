//! Values in the formats of Flink's configuration, read by the same
//! function whether a flag or a configuration file gives them: one format
//! per kind of value. Each returns the problem as text, which clap and the
//! file reader put next to the flag or key.

use super::options::{CheckpointInterval, RestoreArg, StateKind};
use clap::ValueEnum;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tidemark_core::checkpoint::RestoreMode;
use tidemark_core::model::ids::CheckpointId;
use tidemark_core::model::key_group::DEFAULT_MAX_PARALLELISM;
use tidemark_storage::METADATA;

/// The longest duration any setting takes: a year. Settings such as the
/// checkpoint timeout are added to instants, which cannot count far.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

/// Splits `1 s`, `20kb` or `500` into its digits and its lower-case unit,
/// as Flink's `TimeUtils` and `MemorySize` do. Digits past `u128::MAX` read
/// as `u128::MAX`, which every caller refuses as out of range.
fn number_and_unit(s: &str) -> Option<(u128, String)> {
    let s = s.trim();
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let number = match digits {
        0 => return None,
        _ => s[..digits].parse().unwrap_or(u128::MAX),
    };
    Some((number, s[digits..].trim().to_lowercase()))
}

/// Flink's `TimeUtils.parseDuration`: a whole number and a unit (`d`, `h`,
/// `min` or `m`, `s`, `ms`, `µs`, `ns`, or their long names such as
/// `minutes`), with or without a space; a bare number is milliseconds. At
/// most [`MAX_DURATION`].
pub fn duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("expected a duration such as 100 ms, 2s or 10 min, got {s:?}");
    let (n, unit) = number_and_unit(s).ok_or_else(bad)?;
    let nanos_per: u128 = match unit.as_str() {
        "d" | "day" | "days" => 86_400_000_000_000,
        "h" | "hour" | "hours" => 3_600_000_000_000,
        "min" | "m" | "minute" | "minutes" => 60_000_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => 1_000_000,
        "µs" | "micro" | "micros" | "microsecond" | "microseconds" => 1_000,
        "ns" | "nano" | "nanos" | "nanosecond" | "nanoseconds" => 1,
        _ => return Err(bad()),
    };
    // In nanoseconds every duration up to MAX_DURATION fits a u64.
    n.checked_mul(nanos_per)
        .and_then(|nanos| u64::try_from(nanos).ok())
        .map(Duration::from_nanos)
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| {
            let days = MAX_DURATION.as_secs() / 86_400;
            format!("expected a duration of at most {days} d, got {s:?}")
        })
}

/// A duration on the command line: as in a file, but with its unit. A bare
/// number was never a duration flag, and read as milliseconds it would make
/// `cleanup --grace 3600` 3.6 s, short enough to delete what a running
/// checkpoint still writes.
pub fn flag_duration(s: &str) -> Result<Duration, String> {
    require_unit(s)?;
    duration(s)
}

/// `--state-ttl`: a flag duration of at least a millisecond (a state's
/// TTL cannot be 0: every value would be expired as it is written).
pub fn state_ttl(s: &str) -> Result<Duration, String> {
    let ttl = flag_duration(s)?;
    if ttl < Duration::from_millis(1) {
        return Err(format!("a state's TTL is at least 1 ms, got {s:?}"));
    }
    Ok(ttl)
}

fn require_unit(s: &str) -> Result<(), String> {
    match number_and_unit(s) {
        Some((_, unit)) if unit.is_empty() => Err(format!(
            "expected a duration with its unit, such as 100 ms, 2s or 10 min, got {s:?}"
        )),
        _ => Ok(()),
    }
}

/// Flink's `MemorySize`: a whole number of bytes with an optional binary
/// unit (`b`, `k`/`kb`, `m`/`mb`, `g`/`gb`, `t`/`tb` and their long names;
/// `KiB`, `MiB`, `GiB`, `TiB` too), any case, with or without a space.
pub fn size(s: &str) -> Result<u64, String> {
    let bad = || format!("expected a size such as 4096, 20 kb or 32MiB, got {s:?}");
    let (n, unit) = number_and_unit(s).ok_or_else(bad)?;
    let shift = match unit.as_str() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" | "kibibytes" => 10,
        "m" | "mb" | "mib" | "mebibytes" => 20,
        "g" | "gb" | "gib" | "gibibytes" => 30,
        "t" | "tb" | "tib" | "tebibytes" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift)
        .and_then(|bytes| u64::try_from(bytes).ok())
        .ok_or_else(|| format!("expected a size below 16 EiB, got {s:?}"))
}

/// How long a job directory's lease lasts without renewal: between
/// [`MIN_TTL`](tidemark_core::checkpoint::lease::MIN_TTL) and
/// [`MAX_TTL`](tidemark_core::checkpoint::lease::MAX_TTL), in a file without a unit
/// too.
pub fn lease_ttl(s: &str) -> Result<Duration, String> {
    use tidemark_core::checkpoint::lease::{MAX_TTL, MIN_TTL};
    match duration(s)? {
        ttl if (MIN_TTL..=MAX_TTL).contains(&ttl) => Ok(ttl),
        _ => Err(format!(
            "expected a lease time to live from 1 s to 1 d, got {s:?}"
        )),
    }
}

/// The lease time to live on the command line, with its unit.
pub fn flag_lease_ttl(s: &str) -> Result<Duration, String> {
    require_unit(s)?;
    lease_ttl(s)
}

/// The most `execution.checkpointing.data-inline-threshold` takes: 1 MiB,
/// Flink's maximum, since inline state travels in acknowledgements and
/// `_metadata`.
pub const MAX_INLINE_THRESHOLD: u64 = 1 << 20;

/// The size below which a state object travels inline: at most
/// [`MAX_INLINE_THRESHOLD`].
pub fn inline_threshold(s: &str) -> Result<u64, String> {
    match size(s)? {
        n if n <= MAX_INLINE_THRESHOLD => Ok(n),
        _ => Err(format!("expected a size of at most 1 MiB, got {s:?}")),
    }
}

/// The largest part of a multipart upload: 5 GiB, S3's limit.
pub const MAX_PART_SIZE: u64 = 5 << 30;

/// The size of a multipart upload's parts: 1 byte to [`MAX_PART_SIZE`].
/// S3 refuses parts below 5 MiB but the last; other stores take any.
pub fn part_size(s: &str) -> Result<usize, String> {
    match size(s)? {
        n if (1..=MAX_PART_SIZE).contains(&n) => Ok(n as usize),
        _ => Err(format!(
            "expected a part size from 1 byte to 5 GiB, got {s:?}"
        )),
    }
}

/// `true` or `false`, any case, as Flink reads booleans.
pub fn boolean(s: &str) -> Result<bool, String> {
    match s.trim().to_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected true or false, got {s:?}")),
    }
}

/// A path or URL, as written.
pub fn text(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

/// Flink's `high-availability.type`.
pub fn ha_type(s: &str) -> Result<super::options::HaType, String> {
    use super::options::HaType;
    match s.to_ascii_lowercase().as_str() {
        "none" | "" => Ok(HaType::None),
        "kubernetes" => Ok(HaType::Kubernetes),
        "zookeeper" => Ok(HaType::ZooKeeper),
        _ => Err(format!("expected zookeeper, kubernetes or none, got {s:?}")),
    }
}

/// A file's path, as written.
pub fn path(s: &str) -> Result<std::path::PathBuf, String> {
    Ok(s.into())
}

/// Flink's `state.backend.type`, read as `--state` reads it.
pub fn state_kind(s: &str) -> Result<StateKind, String> {
    StateKind::from_str(s.trim(), true)
        .map_err(|_| format!("expected hashmap or rocksdb, got {s:?}"))
}

/// A whole number within `range`.
fn whole(s: &str, range: RangeInclusive<u64>) -> Result<u64, String> {
    s.trim()
        .parse()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| match range.end() {
            &u64::MAX => format!(
                "expected a whole number of at least {}, got {s:?}",
                range.start()
            ),
            end => format!(
                "expected a whole number from {} to {end}, got {s:?}",
                range.start()
            ),
        })
}

/// Subtasks per operator: at least one, at most the default max
/// parallelism, since every subtask needs a key group.
pub fn parallelism(s: &str) -> Result<u32, String> {
    whole(s, 1..=u64::from(DEFAULT_MAX_PARALLELISM)).map(|n| n as u32)
}

/// The largest count: Flink's counts are Java `int`s.
const MAX_COUNT: u64 = i32::MAX as u64;

/// A count that must be at least one.
pub fn positive(s: &str) -> Result<u32, String> {
    whole(s, 1..=MAX_COUNT).map(|n| n as u32)
}

/// A count that may be zero.
pub fn count(s: &str) -> Result<u32, String> {
    whole(s, 0..=MAX_COUNT).map(|n| n as u32)
}

/// Values the RocksDB backend keeps decoded: at least one.
pub fn cache_entries(s: &str) -> Result<usize, String> {
    whole(s, 1..=usize::MAX as u64).map(|n| n as usize)
}

/// A finite number above zero.
fn positive_real(s: &str) -> Option<f64> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// Records per second over all sources.
pub fn rate(s: &str) -> Result<f64, String> {
    positive_real(s)
        .ok_or_else(|| format!("expected a positive number of records per second, got {s:?}"))
}

/// Total over live bytes of a merged file, above which it is compacted.
pub fn amplification(s: &str) -> Result<f64, String> {
    positive_real(s).filter(|v| *v > 1.0).ok_or_else(|| {
        format!(
            "expected total / live bytes above 1 (1.5 rewrites a file a third of which is wasted), got {s:?}"
        )
    })
}

/// Growth of the restart delay per restart: at least 1.
pub fn multiplier(s: &str) -> Result<f64, String> {
    positive_real(s)
        .filter(|v| *v >= 1.0)
        .ok_or_else(|| format!("expected a factor of at least 1, got {s:?}"))
}

/// A checkpoint interval: a positive duration, or `off`.
pub fn interval(s: &str) -> Result<CheckpointInterval, String> {
    if s.trim() == "off" {
        return Ok(CheckpointInterval(None));
    }
    match duration(s)? {
        d if d.is_zero() => Err("must be positive, or `off`".into()),
        d => Ok(CheckpointInterval(Some(d))),
    }
}

/// A checkpoint interval on the command line: with its unit, or `off`.
pub fn flag_interval(s: &str) -> Result<CheckpointInterval, String> {
    if s.trim() != "off" {
        require_unit(s)?;
    }
    interval(s)
}

/// The directory `path` names: itself, or the one its `_metadata` is in.
pub fn snapshot_dir(path: &str) -> &str {
    let dir = path.trim_end_matches('/');
    dir.strip_suffix(METADATA)
        .unwrap_or(dir)
        .trim_end_matches('/')
}

/// `latest`, a checkpoint directory `[PATH/]chk-N`, or a savepoint
/// directory (a path or URL, or the `_metadata` in it).
pub fn restore(s: &str) -> Result<RestoreArg, String> {
    if s == "latest" {
        return Ok(RestoreArg::Latest);
    }
    let dir = snapshot_dir(s);
    if dir.is_empty() {
        return Err(format!(
            "expected `latest`, a checkpoint directory chk-N or a savepoint directory, got {s:?}"
        ));
    }
    let path = PathBuf::from(dir);
    let id = path
        .file_name()
        .and_then(|n| n.to_str()?.strip_prefix("chk-")?.parse().ok());
    let Some(id) = id.filter(|_| !dir.contains("://")) else {
        return Ok(RestoreArg::Savepoint(dir.to_owned()));
    };
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf);
    Ok(RestoreArg::Checkpoint {
        parent,
        id: CheckpointId(id),
    })
}

/// `claim` or `no-claim`, also in Flink's spelling `CLAIM`, `NO_CLAIM`.
pub fn restore_mode(s: &str) -> Result<RestoreMode, String> {
    match s.trim().to_lowercase().replace('_', "-").as_str() {
        "claim" => Ok(RestoreMode::Claim),
        "no-claim" => Ok(RestoreMode::NoClaim),
        "legacy" => Err("Flink's legacy mode is not supported; use claim or no-claim".into()),
        _ => Err(format!("expected claim or no-claim, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_ttl_is_a_duration_of_a_millisecond_or_more() {
        assert_eq!(state_ttl("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(state_ttl("1ms"), Ok(Duration::from_millis(1)));
        let zero = state_ttl("0ms").unwrap_err();
        assert!(zero.contains("at least 1 ms"), "{zero}");
        assert!(state_ttl("30").is_err());
    }

    #[test]
    fn durations_read_as_flink_reads_them() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("1 s", ms(1000)),
            ("100 ms", ms(100)),
            ("10 min", ms(600_000)),
            ("1min", ms(60_000)),
            ("2m", ms(120_000)),
            ("500ms", ms(500)),
            ("500", ms(500)),
            ("  3 SECONDS ", ms(3000)),
            ("1h", ms(3_600_000)),
            ("2 days", ms(172_800_000)),
            ("7µs", Duration::from_micros(7)),
            ("9 nanos", Duration::from_nanos(9)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(duration(text), Ok(expected), "{text:?}");
        }
        for bad in [
            "",
            "s",
            "1.5s",
            "-1s",
            "1 fortnight",
            "1s 500ms",
            "99999999999999999999 d",
        ] {
            assert!(duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_duration_flag_needs_its_unit_where_a_file_does_not() {
        assert_eq!(flag_duration("3600 s"), Ok(Duration::from_secs(3600)));
        assert_eq!(duration("3600"), Ok(Duration::from_millis(3600)));
        assert!(flag_duration("3600").is_err());
        assert_eq!(flag_interval("off"), Ok(CheckpointInterval(None)));
        assert_eq!(
            flag_interval("2s"),
            Ok(CheckpointInterval(Some(Duration::from_secs(2))))
        );
        assert!(flag_interval("2000").is_err());
        assert_eq!(
            interval("2000"),
            Ok(CheckpointInterval(Some(Duration::from_secs(2))))
        );
    }

    #[test]
    fn sizes_read_as_flink_reads_them_in_binary_units() {
        for (text, expected) in [
            ("4096", 4096),
            ("32 mb", 32 << 20),
            ("20kb", 20 << 10),
            ("1 gb", 1 << 30),
            ("20KiB", 20 << 10),
            ("1MiB", 1 << 20),
            ("3 bytes", 3),
            ("2t", 2 << 40),
            ("0", 0),
        ] {
            assert_eq!(size(text), Ok(expected), "{text:?}");
        }
        for bad in ["", "kb", "1.5mb", "1 kilo", "-1", "99999999999 tb"] {
            assert!(size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn restore_names_latest_a_checkpoint_or_a_savepoint() {
        assert_eq!(restore("latest"), Ok(RestoreArg::Latest));
        assert_eq!(
            restore("/ck/job/chk-7/_metadata"),
            Ok(RestoreArg::Checkpoint {
                parent: Some("/ck/job".into()),
                id: CheckpointId(7)
            })
        );
        assert_eq!(
            restore("s3://b/sp/chk-7"),
            Ok(RestoreArg::Savepoint("s3://b/sp/chk-7".into()))
        );
        assert!(restore("/").is_err());
        assert_eq!(restore_mode("NO_CLAIM"), Ok(RestoreMode::NoClaim));
        assert_eq!(restore_mode("claim"), Ok(RestoreMode::Claim));
        assert!(restore_mode("LEGACY").unwrap_err().contains("legacy"));
    }
}
