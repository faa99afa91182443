//! Storage faults on purpose. [`FaultyStore`] wraps an object store and,
//! drawing every decision from a seeded generator, fails puts (before they
//! land, or after: an unknown outcome), fails reads, slows operations down,
//! hides new objects from listings, and simulates a power loss that drops
//! every write not acknowledged by then. Registered under a name
//! ([`super::register_store`]), a job reaches it as `store://NAME/prefix`,
//! so that end-to-end tests run real jobs on storage that misbehaves in a
//! reproducible way.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
    UploadPart,
};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tidemark_core::model::rng::SplitMix64;

/// What a [`FaultyStore`] does wrong, and how often. Probabilities are per
/// operation, from 0 to 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Seeds every decision: the same plan and the same sequence of
    /// operations fail the same way.
    pub seed: u64,
    /// A put fails and nothing lands.
    pub fail_put: f64,
    /// A put lands but reports failure.
    pub fail_put_after: f64,
    /// A read fails.
    pub fail_get: f64,
    /// An operation first waits `slow_by`.
    pub slow: f64,
    /// How long a slow operation waits.
    pub slow_by: Duration,
    /// A listing misses every object written in the last `list_lag`.
    pub stale_list: f64,
    /// How new an object must be for a stale listing to miss it.
    pub list_lag: Duration,
    /// Paths containing any of these are never faulted.
    pub spared: Vec<String>,
    /// If any, only paths containing one of these are faulted.
    pub targets: Vec<String>,
}

/// The faults a [`FaultyStore`] injected.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Puts failed before landing.
    pub puts_failed: AtomicU64,
    /// Puts that landed and reported failure.
    pub puts_failed_after: AtomicU64,
    /// Reads failed.
    pub gets_failed: AtomicU64,
    /// Operations slowed down.
    pub slowed: AtomicU64,
    /// Listings that missed new objects.
    pub stale_lists: AtomicU64,
    /// Writes dropped by the power loss.
    pub dropped_by_power_loss: AtomicU64,
}

impl FaultCounts {
    /// Every fault injected, of any kind.
    pub fn total(&self) -> u64 {
        [
            &self.puts_failed,
            &self.puts_failed_after,
            &self.gets_failed,
            &self.slowed,
            &self.stale_lists,
            &self.dropped_by_power_loss,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }
}

/// An object store that fails by a [`FaultPlan`].
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    plan: FaultPlan,
    rng: Mutex<SplitMix64>,
    counts: Arc<FaultCounts>,
    /// The power is off: every operation fails, and every put still in
    /// flight is undone when it returns.
    off: Arc<AtomicBool>,
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

/// What one operation does wrong.
#[derive(Clone, Copy, Debug)]
enum FaultTiming {
    None,
    Before,
    After,
}

impl FaultyStore {
    /// `inner`, failing by `plan`.
    pub fn new(inner: Arc<dyn ObjectStore>, plan: FaultPlan) -> Self {
        FaultyStore {
            inner,
            rng: Mutex::new(SplitMix64::new(plan.seed)),
            plan,
            counts: Arc::default(),
            off: Arc::default(),
        }
    }

    /// What was injected so far.
    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }

    /// Cuts the power: from now on every operation fails, and a put in
    /// flight does not survive, whatever it reports.
    pub fn power_loss(&self) {
        self.off.store(true, Ordering::SeqCst);
    }

    /// Turns the power back on, with the faults of the plan.
    pub fn power_on(&self) {
        self.off.store(false, Ordering::SeqCst);
    }

    fn chance(&self, p: f64) -> bool {
        p > 0.0 && (self.rng.lock().expect("fault rng").next_u64() as f64 / u64::MAX as f64) < p
    }

    fn spared(&self, location: &Path) -> bool {
        let path = location.as_ref();
        let targeted = self.plan.targets.is_empty()
            || self.plan.targets.iter().any(|t| path.contains(t.as_str()));
        !targeted || self.plan.spared.iter().any(|s| path.contains(s.as_str()))
    }

    fn powered(&self) -> Result<()> {
        if self.off.load(Ordering::SeqCst) {
            return Err(injected("the power is off"));
        }
        Ok(())
    }

    async fn maybe_slow(&self, location: &Path) {
        if self.spared(location) || !self.chance(self.plan.slow) {
            return;
        }
        self.counts.slowed.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.plan.slow_by).await;
    }

    /// What every read goes through first: the power, slowness, failure.
    async fn before_read(&self, location: &Path) -> Result<()> {
        self.powered()?;
        self.maybe_slow(location).await;
        if !self.spared(location) && self.chance(self.plan.fail_get) {
            self.counts.gets_failed.fetch_add(1, Ordering::Relaxed);
            return Err(injected("read failed"));
        }
        Ok(())
    }

    /// What a put (or an upload) will do wrong; counted when it strikes.
    fn put_fault(&self, location: &Path) -> FaultTiming {
        if self.spared(location) {
            FaultTiming::None
        } else if self.chance(self.plan.fail_put) {
            FaultTiming::Before
        } else if self.chance(self.plan.fail_put_after) {
            FaultTiming::After
        } else {
            FaultTiming::None
        }
    }
}

impl FaultTiming {
    fn strikes(self, counts: &FaultCounts) -> Self {
        match self {
            FaultTiming::Before => counts.puts_failed.fetch_add(1, Ordering::Relaxed),
            FaultTiming::After => counts.puts_failed_after.fetch_add(1, Ordering::Relaxed),
            FaultTiming::None => 0,
        };
        self
    }
}

/// A put's (or an upload's) result once it returned: undone if the power
/// went off meanwhile.
async fn landed(
    inner: &dyn ObjectStore,
    off: &AtomicBool,
    counts: &FaultCounts,
    location: &Path,
    result: Result<PutResult>,
) -> Result<PutResult> {
    if off.load(Ordering::SeqCst) {
        if result.is_ok() {
            let _ = inner.delete(location).await;
            counts.dropped_by_power_loss.fetch_add(1, Ordering::Relaxed);
        }
        return Err(injected("the power went off during the write"));
    }
    result
}

/// A multipart upload through a [`FaultyStore`]: the fault drawn when it
/// began strikes when it completes, as a put's does, and the power reaches
/// its parts.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    fault: FaultTiming,
    store: Arc<dyn ObjectStore>,
    location: Path,
    off: Arc<AtomicBool>,
    counts: Arc<FaultCounts>,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        if self.off.load(Ordering::SeqCst) {
            return Box::pin(async { Err(injected("the power is off")) });
        }
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        if self.off.load(Ordering::SeqCst) {
            return Err(injected("the power is off"));
        }
        let (store, off, counts) = (&*self.store, &self.off, &self.counts);
        match self.fault.strikes(counts) {
            FaultTiming::Before => {
                let _ = self.inner.abort().await;
                Err(injected("multipart upload failed"))
            }
            FaultTiming::After => {
                let result = self.inner.complete().await;
                landed(store, off, counts, &self.location, result).await?;
                Err(injected("multipart upload landed, then failed"))
            }
            FaultTiming::None => {
                let result = self.inner.complete().await;
                landed(store, off, counts, &self.location, result).await
            }
        }
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected fault: {what}").into(),
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.powered()?;
        self.maybe_slow(location).await;
        match self.put_fault(location).strikes(&self.counts) {
            FaultTiming::Before => Err(injected("put failed")),
            FaultTiming::After => {
                let result = self.inner.put_opts(location, payload, opts).await;
                landed(&*self.inner, &self.off, &self.counts, location, result).await?;
                Err(injected("put landed, then failed"))
            }
            FaultTiming::None => {
                let result = self.inner.put_opts(location, payload, opts).await;
                landed(&*self.inner, &self.off, &self.counts, location, result).await
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.powered()?;
        self.maybe_slow(location).await;
        let fault = self.put_fault(location);
        Ok(Box::new(FaultyUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            fault,
            store: self.inner.clone(),
            location: location.clone(),
            off: self.off.clone(),
            counts: self.counts.clone(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.before_read(location).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.before_read(location).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        if self.off.load(Ordering::SeqCst) {
            return locations.map(|_| Err(injected("the power is off"))).boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.off.load(Ordering::SeqCst) {
            return futures::stream::once(async { Err(injected("the power is off")) }).boxed();
        }
        let spared = prefix.is_some_and(|p| self.spared(p));
        if spared || !self.chance(self.plan.stale_list) {
            return self.inner.list(prefix);
        }
        self.counts.stale_lists.fetch_add(1, Ordering::Relaxed);
        let cutoff = SystemTime::now() - self.plan.list_lag;
        self.inner
            .list(prefix)
            .filter(move |meta| {
                let old = match meta {
                    Ok(meta) => SystemTime::from(meta.last_modified) < cutoff,
                    Err(_) => true,
                };
                futures::future::ready(old)
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.powered()?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.powered()?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.powered()?;
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    fn store(plan: FaultPlan) -> FaultyStore {
        FaultyStore::new(Arc::new(InMemory::new()), plan)
    }

    /// Which of 64 puts fail, as a bit set.
    async fn failing_puts(store: &FaultyStore) -> u64 {
        let mut failed = 0;
        for i in 0..64 {
            let path = Path::from(format!("x/{i}"));
            if store
                .put(&path, PutPayload::from_static(b"x"))
                .await
                .is_err()
            {
                failed |= 1 << i;
            }
        }
        failed
    }

    #[tokio::test]
    async fn the_same_seed_fails_the_same_operations() {
        let plan = |seed| FaultPlan {
            seed,
            fail_put: 0.3,
            ..FaultPlan::default()
        };
        let first = failing_puts(&store(plan(7))).await;
        assert_eq!(first, failing_puts(&store(plan(7))).await);
        assert_ne!(first, failing_puts(&store(plan(8))).await);
        assert_ne!(first, 0);
    }

    #[tokio::test]
    async fn a_put_that_fails_after_landing_is_there_and_spared_paths_never_fail() {
        let store = store(FaultPlan {
            fail_put_after: 1.0,
            spared: vec!["_leases".into()],
            ..FaultPlan::default()
        });
        let path = Path::from("chk-1/_metadata");
        assert!(store
            .put(&path, PutPayload::from_static(b"m"))
            .await
            .is_err());
        assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap(), "m");
        let lease = Path::from("_leases/1");
        store
            .put(&lease, PutPayload::from_static(b"l"))
            .await
            .unwrap();
        assert_eq!(store.counts().puts_failed_after.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn after_a_power_loss_nothing_works_until_the_power_is_back() {
        let store = store(FaultPlan::default());
        let path = Path::from("a");
        store
            .put(&path, PutPayload::from_static(b"a"))
            .await
            .unwrap();
        store.power_loss();
        assert!(store.get(&path).await.is_err());
        assert!(store
            .put(&Path::from("b"), PutPayload::from_static(b"b"))
            .await
            .is_err());
        store.power_on();
        assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap(), "a");
        assert!(store.get(&Path::from("b")).await.is_err());
    }

    /// Starts a multipart upload of two parts at `path` and completes it.
    async fn upload(store: &FaultyStore, path: &Path) -> Result<PutResult> {
        let mut upload = store.put_multipart(path).await?;
        upload.put_part(PutPayload::from_static(b"ab")).await?;
        upload.put_part(PutPayload::from_static(b"cd")).await?;
        upload.complete().await
    }

    #[tokio::test]
    async fn a_multipart_upload_fails_as_a_put_does_when_it_completes() {
        let failing = |fail_put, fail_put_after| {
            store(FaultPlan {
                fail_put,
                fail_put_after,
                ..FaultPlan::default()
            })
        };
        let path = Path::from("chk-1/state");

        let before = failing(1.0, 0.0);
        assert!(upload(&before, &path).await.is_err());
        assert!(before.get(&path).await.is_err());

        let after = failing(0.0, 1.0);
        assert!(upload(&after, &path).await.is_err());
        let landed = after.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(landed, "abcd");

        let power = failing(0.0, 0.0);
        let mut cut = power.put_multipart(&path).await.unwrap();
        cut.put_part(PutPayload::from_static(b"ab")).await.unwrap();
        power.power_loss();
        assert!(cut.put_part(PutPayload::from_static(b"cd")).await.is_err());
        assert!(cut.complete().await.is_err());
        power.power_on();
        assert!(power.get(&path).await.is_err());
        upload(&power, &path).await.unwrap();
        assert_eq!(
            power.get(&path).await.unwrap().bytes().await.unwrap(),
            "abcd"
        );
    }
}
