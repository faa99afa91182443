//! State time-to-live, as Flink's `StateTtlConfig`: a state declared with a
//! TTL keeps, with each value (each element of a list, each entry of a
//! map), the processing time it was last written (or read), and treats it
//! as gone once the TTL has passed.
//!
//! Expired values are dropped where they are met, never all at once:
//! - on access (the entry or view of a key, when its visibility is
//!   `NeverReturnExpired`);
//! - on the heap, a few entries per record, by a cursor that walks each
//!   state's tables (Flink's `cleanupIncrementally`), no faster than a pass
//!   over the state per half TTL;
//! - in RocksDB, by a compaction filter that reads the timestamps at the
//!   head of each value, so the files a checkpoint uploads shrink as
//!   compaction runs (Flink's `cleanupInRocksdbCompactFilter`);
//! - in a heap snapshot, which never writes an expired value.
//!
//! A snapshot keeps the timestamps, so a job restored with another TTL
//! applies it to them. Values written without TTL and restored into a
//! state with one are stamped with the time of the restore (in RocksDB,
//! when first read or compacted); a state that loses its TTL drops the
//! timestamps (Flink 2's TTL migration).

use super::{Key, ReduceFunction, StateError};
use crate::model::batch::Data;
use crate::time::Millis;
use hashbrown::HashTable;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// When a value's timestamp is renewed (Flink's `StateTtlConfig.UpdateType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateType {
    /// When it is written: set, added to, changed in place.
    OnCreateAndWrite,
    /// When it is written and when it is read.
    OnReadAndWrite,
}

/// Whether a value that has expired but is still stored is returned
/// (Flink's `StateTtlConfig.StateVisibility`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateVisibility {
    /// Never: an expired value reads as absent (and is dropped then).
    NeverReturnExpired,
    /// Until a cleanup dropped it.
    ReturnExpiredIfNotCleanedUp,
}

/// The time-to-live of a keyed state, in processing time: given to
/// `StateRegistrar::value_with_ttl` and its siblings.
///
/// ```
/// use std::time::Duration;
/// use tidemark_core::state::{StateTtlConfig, StateVisibility, UpdateType};
///
/// let ttl = StateTtlConfig::new(Duration::from_secs(3600))
///     .update_type(UpdateType::OnReadAndWrite)
///     .visibility(StateVisibility::NeverReturnExpired)
///     .cleanup_incrementally(10);
/// assert_eq!(ttl.ttl(), Duration::from_secs(3600));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTtlConfig {
    ttl_ms: Millis,
    update: UpdateType,
    visibility: StateVisibility,
    cleanup: usize,
}

impl StateTtlConfig {
    /// Entries a heap backend checks per record and state unless told
    /// otherwise (Flink's default `cleanupSize`).
    pub const DEFAULT_CLEANUP_ENTRIES: usize = 5;

    /// Values live `ttl` (at least a millisecond) after their last write;
    /// expired ones are never returned; the heap checks
    /// [`DEFAULT_CLEANUP_ENTRIES`](Self::DEFAULT_CLEANUP_ENTRIES) entries a
    /// record.
    pub fn new(ttl: Duration) -> Self {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        assert!(ttl_ms > 0, "a state's TTL is at least 1 ms, not {ttl:?}");
        StateTtlConfig {
            ttl_ms,
            update: UpdateType::OnCreateAndWrite,
            visibility: StateVisibility::NeverReturnExpired,
            cleanup: Self::DEFAULT_CLEANUP_ENTRIES,
        }
    }

    /// When timestamps are renewed.
    pub fn update_type(self, update: UpdateType) -> Self {
        StateTtlConfig { update, ..self }
    }

    /// Whether expired values not yet dropped are returned.
    pub fn visibility(self, visibility: StateVisibility) -> Self {
        StateTtlConfig { visibility, ..self }
    }

    /// Entries of each state the heap backend checks, and drops if they
    /// expired, per record processed (0: none; access and snapshots still
    /// drop them); never more than it takes to pass over the state twice
    /// per TTL.
    pub fn cleanup_incrementally(self, entries: usize) -> Self {
        StateTtlConfig {
            cleanup: entries,
            ..self
        }
    }

    /// The time to live.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    pub(crate) fn cleanup_entries(&self) -> usize {
        self.cleanup
    }

    /// Whether a value stamped `at` has expired at `now`.
    #[inline]
    pub(crate) fn expired(&self, at: Millis, now: Millis) -> bool {
        at.saturating_add(self.ttl_ms) <= now
    }

    pub(crate) fn renews_on_read(&self) -> bool {
        self.update == UpdateType::OnReadAndWrite
    }

    pub(crate) fn returns_expired(&self) -> bool {
        self.visibility == StateVisibility::ReturnExpiredIfNotCleanedUp
    }
}

/// A value and the processing time it was last renewed (Flink's
/// `TtlValue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TtlValue<V> {
    pub(crate) at: Millis,
    pub(crate) value: V,
}

impl<V> TtlValue<V> {
    pub(crate) fn new(value: V, at: Millis) -> Self {
        TtlValue { at, value }
    }
}

/// How a state with a TTL keeps one key's values: one stamped value, a list
/// of stamped elements, or a map of stamped entries; and how it converts
/// from and to the same state without TTL.
pub(crate) trait Expiring: Data {
    /// The same state without TTL.
    type Plain: Data;
    fn stamp(plain: Self::Plain, at: Millis) -> Self;
    fn strip(self) -> Self::Plain;
    /// The newest and the oldest timestamp; `None` when it holds nothing.
    fn span(&self) -> Option<(Millis, Millis)>;
    /// Drops what `expired` says of its timestamps; false if nothing is
    /// left.
    fn retain_live(&mut self, expired: impl Fn(Millis) -> bool) -> bool;
}

impl<V: Data> Expiring for TtlValue<V> {
    type Plain = V;
    fn stamp(plain: V, at: Millis) -> Self {
        TtlValue::new(plain, at)
    }
    fn strip(self) -> V {
        self.value
    }
    fn span(&self) -> Option<(Millis, Millis)> {
        Some((self.at, self.at))
    }
    fn retain_live(&mut self, expired: impl Fn(Millis) -> bool) -> bool {
        !expired(self.at)
    }
}

impl<V: Data> Expiring for Vec<TtlValue<V>> {
    type Plain = Vec<V>;
    fn stamp(plain: Vec<V>, at: Millis) -> Self {
        plain.into_iter().map(|v| TtlValue::new(v, at)).collect()
    }
    fn strip(self) -> Vec<V> {
        self.into_iter().map(|t| t.value).collect()
    }
    fn span(&self) -> Option<(Millis, Millis)> {
        span(self.iter().map(|t| t.at))
    }
    fn retain_live(&mut self, expired: impl Fn(Millis) -> bool) -> bool {
        self.retain(|t| !expired(t.at));
        !self.is_empty()
    }
}

impl<UK: Key, UV: Data> Expiring for FxHashMap<UK, TtlValue<UV>> {
    type Plain = FxHashMap<UK, UV>;
    fn stamp(plain: FxHashMap<UK, UV>, at: Millis) -> Self {
        plain
            .into_iter()
            .map(|(k, v)| (k, TtlValue::new(v, at)))
            .collect()
    }
    fn strip(self) -> FxHashMap<UK, UV> {
        self.into_iter().map(|(k, t)| (k, t.value)).collect()
    }
    fn span(&self) -> Option<(Millis, Millis)> {
        span(self.values().map(|t| t.at))
    }
    fn retain_live(&mut self, expired: impl Fn(Millis) -> bool) -> bool {
        self.retain(|_, t| !expired(t.at));
        !self.is_empty()
    }
}

fn span(stamps: impl Iterator<Item = Millis>) -> Option<(Millis, Millis)> {
    stamps.fold(None, |span, at| match span {
        None => Some((at, at)),
        Some((newest, oldest)) => Some((newest.max(at), oldest.min(at))),
    })
}

/// What of `value` is live at `now`: all of it (borrowed), a copy without
/// its expired parts, or nothing. What a heap snapshot writes.
pub(crate) fn live_part<'a, T: Expiring>(
    value: &'a T,
    config: &StateTtlConfig,
    now: Millis,
) -> Option<Cow<'a, T>> {
    let (newest, oldest) = value.span()?;
    if config.expired(newest, now) {
        None
    } else if !config.expired(oldest, now) {
        Some(Cow::Borrowed(value))
    } else {
        let mut live = value.clone();
        live.retain_live(|at| config.expired(at, now));
        Some(Cow::Owned(live))
    }
}

/// A reducing state's reduce function over stamped values: an added value
/// renews the timestamp, and starts again from itself when the value it
/// meets had expired by the time it was added (unless the state returns
/// expired values). It is not associative: two adds combined before they
/// meet the value lose the time of the first, which decides whether the
/// value had expired. So adds of a state with TTL in an embedded store read
/// the value first and write no merge operands; the merge operator only
/// combines those of a state restored from one without TTL, all stamped
/// alike.
#[derive(Clone)]
pub(crate) struct TtlReduce<R> {
    config: StateTtlConfig,
    reduce: R,
}

impl<R> TtlReduce<R> {
    pub(crate) fn new(config: StateTtlConfig, reduce: R) -> Self {
        TtlReduce { config, reduce }
    }
}

impl<V, R: ReduceFunction<V>> ReduceFunction<TtlValue<V>> for TtlReduce<R> {
    #[inline]
    fn reduce(&self, acc: &mut TtlValue<V>, added: TtlValue<V>) {
        if self.config.expired(acc.at, added.at) && !self.config.returns_expired() {
            *acc = added;
        } else {
            self.reduce.reduce(&mut acc.value, added.value);
            acc.at = acc.at.max(added.at);
        }
    }
}

/// The first bytes of a value of a state with TTL in an embedded store: a
/// MessagePack `fixext 16` of type `T` holding the newest and the oldest
/// timestamp (big endian), then the value. No value of a state without TTL
/// starts so (serde types never encode as an extension), so a value tells
/// which kind of state wrote it, and a compaction filter reads the
/// timestamps without decoding the value.
const HEADER: [u8; 2] = [0xd8, b'T'];
const HEADER_LEN: usize = 18;

/// `value` as a state with TTL stores it.
pub(crate) fn encode_stamped<T: Expiring>(out: &mut Vec<u8>, value: &T) {
    let (newest, oldest) = value.span().unwrap_or((0, 0));
    out.extend_from_slice(&HEADER);
    out.extend_from_slice(&newest.to_be_bytes());
    out.extend_from_slice(&oldest.to_be_bytes());
    rmp_serde::encode::write(out, value).expect("values serialize to memory");
}

/// The newest and oldest timestamps of a stored value and the value's own
/// bytes; `None` for a value written by a state without TTL.
pub(crate) fn split_stamped(bytes: &[u8]) -> Option<(Millis, Millis, &[u8])> {
    if bytes.len() < HEADER_LEN || bytes[..2] != HEADER {
        return None;
    }
    let stamp = |at: usize| Millis::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Some((stamp(2), stamp(10), &bytes[HEADER_LEN..]))
}

/// A stored value read into a state with TTL; one written without TTL is
/// stamped `now`.
pub(crate) fn decode_stamped<T: Expiring>(
    bytes: &[u8],
    now: Millis,
) -> Result<T, rmp_serde::decode::Error> {
    match split_stamped(bytes) {
        Some((_, _, value)) => rmp_serde::from_slice(value),
        None => rmp_serde::from_slice(bytes).map(|plain| T::stamp(plain, now)),
    }
}

/// A stored value read into a state without TTL; `T`: the same state with
/// TTL, whose timestamps are dropped.
pub(crate) fn decode_plain<T: Expiring>(
    bytes: &[u8],
) -> Result<T::Plain, rmp_serde::decode::Error> {
    match split_stamped(bytes) {
        Some((_, _, value)) => rmp_serde::from_slice::<T>(value).map(T::strip),
        None => rmp_serde::from_slice(bytes),
    }
}

/// How one state keeps its values, with or without TTL, and reads those the
/// other kind wrote: what a backend's table of `S` values needs of it.
/// Function pointers, made for the state's types when it is declared.
pub(crate) struct Form<K, S: Clone> {
    /// `Some`: values are `Expiring`, stamped.
    pub(crate) ttl: Option<StateTtlConfig>,
    /// Writes a value as an embedded store keeps it.
    pub(crate) encode: fn(&mut Vec<u8>, &S),
    /// Reads a value an embedded store kept, whichever kind wrote it;
    /// the time stamps one written without TTL.
    pub(crate) decode: fn(&[u8], Millis) -> Result<S, rmp_serde::decode::Error>,
    /// Whether `decode` stamps a stored value (one written without TTL,
    /// read into a state with TTL), which is then written back stamped, so
    /// that a later restore does not stamp it again.
    pub(crate) stamps: fn(&[u8]) -> bool,
    /// Reads the entries of a key group in the heap snapshot format that
    /// the other kind wrote, converted.
    pub(crate) decode_other: DecodeEntries<K, S>,
    /// What of a value is live (all of it without TTL).
    pub(crate) live: for<'a> fn(&'a S, &StateTtlConfig, Millis) -> Option<Cow<'a, S>>,
    /// The heap's incremental cleanup of one table (a no-op without TTL).
    pub(crate) sweep: fn(&mut HashTable<(K, S)>, &mut Sweep, &StateTtlConfig, Millis),
    /// The compaction filter of the state with TTL (of `S` or of its twin).
    pub(crate) filter: fn(StateTtlConfig, Arc<TtlClock>) -> CompactionFilter,
}

type DecodeEntries<K, S> = fn(&mut &[u8], Millis) -> Result<Vec<(K, S)>, rmp_serde::decode::Error>;

impl<K, S: Clone> Clone for Form<K, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, S: Clone> Copy for Form<K, S> {}

impl<K: Key, S: Data> Form<K, S> {
    /// A state without TTL, whose values with TTL are `T`.
    pub(crate) fn plain<T: Expiring<Plain = S>>() -> Self {
        Form {
            ttl: None,
            encode: |out, value| {
                rmp_serde::encode::write(out, value).expect("values serialize to memory")
            },
            decode: |bytes, _| decode_plain::<T>(bytes),
            stamps: |_| false,
            decode_other: |input, _| {
                let entries: Vec<(K, T)> = rmp_serde::from_read(input)?;
                Ok(entries.into_iter().map(|(k, t)| (k, t.strip())).collect())
            },
            live: |value, _, _| Some(Cow::Borrowed(value)),
            sweep: |_, _, _, _| {},
            filter: compaction_filter::<T>,
        }
    }

    /// Its compaction filter, if it has a TTL; `clock`: the backend's.
    pub(crate) fn compaction_filter(&self, clock: &Arc<TtlClock>) -> Option<CompactionFilter> {
        self.ttl.map(|config| (self.filter)(config, clock.clone()))
    }

    /// Reads the entries of one state in one key group of a heap snapshot:
    /// marked as stamped or not, converted if this state is the other kind.
    pub(crate) fn decode_entries(
        &self,
        input: &mut &[u8],
        now: Millis,
    ) -> Result<Vec<(K, S)>, StateError> {
        let stamped = input.first() == Some(&STAMPED);
        if stamped {
            *input = &input[1..];
        }
        let entries = if stamped == self.ttl.is_some() {
            rmp_serde::from_read(input)
        } else {
            (self.decode_other)(input, now)
        };
        entries.map_err(|e| StateError::Decode(e.to_string()))
    }
}

impl<K: Key, T: Expiring> Form<K, T> {
    /// A state with TTL `config`.
    pub(crate) fn stamped(config: StateTtlConfig) -> Self {
        Form {
            ttl: Some(config),
            encode: encode_stamped::<T>,
            decode: decode_stamped::<T>,
            stamps: |bytes| split_stamped(bytes).is_none(),
            decode_other: |input, now| {
                let entries: Vec<(K, T::Plain)> = rmp_serde::from_read(input)?;
                Ok(entries
                    .into_iter()
                    .map(|(k, plain)| (k, T::stamp(plain, now)))
                    .collect())
            },
            live: live_part::<T>,
            sweep: sweep::<K, T>,
            filter: compaction_filter::<T>,
        }
    }
}

/// Where the heap's incremental cleanup of a state is, and what it may
/// still do in this call: check `entries` entries, visit `buckets` buckets.
pub(crate) struct Sweep {
    pub(crate) bucket: usize,
    pub(crate) entries: usize,
    pub(crate) buckets: usize,
}

/// Checks the entries of `table` from `sweep.bucket` on, within its
/// budget, and drops what expired by `now`. hashbrown's removal moves no
/// other entry, so walking bucket indices while removing is sound.
fn sweep<K, T: Expiring>(
    table: &mut HashTable<(K, T)>,
    sweep: &mut Sweep,
    config: &StateTtlConfig,
    now: Millis,
) {
    while sweep.entries > 0 && sweep.buckets > 0 && sweep.bucket < table.num_buckets() {
        sweep.buckets -= 1;
        if let Some((_, value)) = table.get_bucket_mut(sweep.bucket) {
            sweep.entries -= 1;
            if !value.retain_live(|at| config.expired(at, now)) {
                let _ = table.get_bucket_entry(sweep.bucket).map(|e| e.remove());
            }
        }
        sweep.bucket += 1;
    }
}

/// In a heap snapshot, the byte (MessagePack `true`) before the entries of
/// a state with TTL; those of a state without start with an array.
pub(crate) const STAMPED: u8 = 0xc3;

/// What a compaction filter does with one value.
#[derive(Debug, PartialEq, Eq)]
pub enum Filtered {
    /// Keeps it.
    Keep,
    /// Drops it: it expired.
    Remove,
    /// Replaces it with the buffer given to the filter: some of its
    /// elements expired, or it had no timestamp.
    Change,
}

/// The compaction filter of a state with TTL in an embedded store: `value`
/// in, a decision out, the replacement written to `out`. The store calls it
/// on its own threads.
pub type CompactionFilter = Arc<dyn Fn(&[u8], &mut Vec<u8>) -> Filtered + Send + Sync>;

/// The processing time of an embedded store's backend, shared with the
/// compaction filters that run on the store's threads, and the time of its
/// last restore, which values written without TTL read into a state with
/// TTL are stamped with, however late they are read.
#[derive(Debug, Default)]
pub(crate) struct TtlClock {
    now: AtomicU64,
    restored: AtomicU64,
}

impl TtlClock {
    pub(crate) fn now(&self) -> Millis {
        self.now.load(Ordering::Relaxed)
    }

    /// Processing time is `now` (never going back).
    pub(crate) fn set(&self, now: Millis) {
        self.now.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn restored(&self) -> Millis {
        self.restored.load(Ordering::Relaxed)
    }

    /// A restore at `time`, which is also the time now.
    pub(crate) fn restore(&self, time: Millis) {
        self.restored.store(time, Ordering::Relaxed);
        self.set(time);
    }
}

/// The compaction filter of a state with TTL of `T` values. Values are
/// kept until the subtask first set the `clock`. A value written without
/// TTL gets the timestamp of the restore (or goes, if that expired); a
/// value that does not decode is kept, for the read that needs it to
/// report.
pub(crate) fn compaction_filter<T: Expiring>(
    config: StateTtlConfig,
    clock: Arc<TtlClock>,
) -> CompactionFilter {
    let filter = move |bytes: &[u8], out: &mut Vec<u8>| {
        let now = clock.now();
        if now == 0 {
            return Filtered::Keep;
        }
        let restamp = |value: T, out: &mut Vec<u8>| {
            out.clear();
            encode_stamped(out, &value);
            Filtered::Change
        };
        let Some((newest, oldest, encoded)) = split_stamped(bytes) else {
            let restored = clock.restored();
            return match rmp_serde::from_slice(bytes) {
                Ok(_) if config.expired(restored, now) => Filtered::Remove,
                Ok(plain) => restamp(T::stamp(plain, restored), out),
                Err(_) => Filtered::Keep,
            };
        };
        if config.expired(newest, now) {
            return Filtered::Remove;
        }
        if !config.expired(oldest, now) {
            return Filtered::Keep;
        }
        match rmp_serde::from_slice::<T>(encoded) {
            Ok(mut value) => {
                value.retain_live(|at| config.expired(at, now));
                restamp(value, out)
            }
            Err(_) => Filtered::Keep,
        }
    };
    // The store calls it through C, where a panic (in a value's own
    // `Deserialize`) would abort the process: such a value is kept.
    Arc::new(move |bytes, out| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| filter(bytes, out)))
            .unwrap_or(Filtered::Keep)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> StateTtlConfig {
        StateTtlConfig::new(Duration::from_millis(100))
    }

    #[test]
    fn a_value_expires_when_its_ttl_has_passed_since_its_timestamp() {
        let c = config();
        assert!(!c.expired(1000, 1099));
        assert!(c.expired(1000, 1100));
        assert!(!c.expired(u64::MAX - 1, u64::MAX - 1));
    }

    #[test]
    fn stored_values_tell_whether_a_state_with_ttl_wrote_them() {
        let list = vec![TtlValue::new(7u64, 1000), TtlValue::new(8, 1050)];
        let mut stamped = Vec::new();
        encode_stamped(&mut stamped, &list);
        assert_eq!(
            split_stamped(&stamped).map(|(n, o, _)| (n, o)),
            Some((1050, 1000))
        );
        assert_eq!(
            decode_plain::<Vec<TtlValue<u64>>>(&stamped).unwrap(),
            vec![7, 8]
        );
        let plain = rmp_serde::to_vec(&vec![7u64, 8]).unwrap();
        assert_eq!(split_stamped(&plain), None);
        assert_eq!(
            decode_stamped::<Vec<TtlValue<u64>>>(&plain, 5).unwrap(),
            vec![TtlValue::new(7, 5), TtlValue::new(8, 5)]
        );
        assert_eq!(
            decode_plain::<Vec<TtlValue<u64>>>(&plain).unwrap(),
            vec![7, 8]
        );
    }

    #[test]
    fn the_compaction_filter_drops_expired_values_and_elements() {
        let clock = Arc::new(TtlClock::default());
        let filter = compaction_filter::<Vec<TtlValue<u64>>>(config(), clock.clone());
        let mut stored = Vec::new();
        encode_stamped(
            &mut stored,
            &vec![TtlValue::new(1, 1000), TtlValue::new(2, 1080)],
        );
        let mut out = Vec::new();
        // Before the subtask set its clock, nothing goes.
        assert_eq!(filter(&stored, &mut out), Filtered::Keep);
        clock.set(1050);
        assert_eq!(filter(&stored, &mut out), Filtered::Keep);
        clock.set(1120);
        assert_eq!(filter(&stored, &mut out), Filtered::Change);
        assert_eq!(
            decode_stamped::<Vec<TtlValue<u64>>>(&out, 0).unwrap(),
            vec![TtlValue::new(2, 1080)]
        );
        clock.set(1180);
        assert_eq!(filter(&stored, &mut out), Filtered::Remove);
        // A value written without TTL gets the time of the restore.
        clock.restore(1150);
        let plain = rmp_serde::to_vec(&vec![5u64]).unwrap();
        assert_eq!(filter(&plain, &mut out), Filtered::Change);
        assert_eq!(
            split_stamped(&out).map(|(n, o, _)| (n, o)),
            Some((1150, 1150))
        );
    }

    #[test]
    fn an_added_value_starts_again_from_itself_after_the_ttl() {
        let sum = |acc: &mut u64, n: u64| *acc += n;
        let add = TtlReduce::new(config(), sum);
        let mut acc = TtlValue::new(1u64, 1000);
        add.reduce(&mut acc, TtlValue::new(1, 1099));
        assert_eq!(acc, TtlValue::new(2, 1099));
        add.reduce(&mut acc, TtlValue::new(1, 1199));
        assert_eq!(acc, TtlValue::new(1, 1199));
        let keep = TtlReduce::new(
            config().visibility(StateVisibility::ReturnExpiredIfNotCleanedUp),
            sum,
        );
        keep.reduce(&mut acc, TtlValue::new(1, 5000));
        assert_eq!(acc, TtlValue::new(2, 5000));
    }

    #[test]
    fn a_snapshot_keeps_only_the_live_part() {
        let c = config();
        let map: FxHashMap<u64, TtlValue<u64>> =
            [(1, TtlValue::new(10, 1000)), (2, TtlValue::new(20, 1090))]
                .into_iter()
                .collect();
        assert!(matches!(live_part(&map, &c, 1050), Some(Cow::Borrowed(_))));
        let live = live_part(&map, &c, 1150).unwrap().into_owned();
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert!(live_part(&map, &c, 1190).is_none());
    }
}
