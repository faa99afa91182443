use super::*;
use crate::dataflow::source::splits::{
    BoxFuture, Discovery, DiscoveryFuture, Erased, SourceSplit, SplitEnumerator,
};
use std::collections::BTreeSet;
use std::task::{Context, Poll, Waker};

/// A split named after an entry of a listing; `pin` sends it to a subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    name: String,
    pin: Option<u32>,
}

impl SourceSplit for Entry {
    fn split_id(&self) -> String {
        self.name.clone()
    }
}

/// Lists what `listing` holds; its state is the names seen.
struct Listing {
    listing: Arc<Mutex<Vec<Entry>>>,
    monitor: Option<Duration>,
    rediscover: bool,
}

impl SplitEnumerator for Listing {
    type Split = Entry;
    type State = BTreeSet<String>;

    fn discover(
        &self,
        mut seen: BTreeSet<String>,
        _: u32,
    ) -> DiscoveryFuture<Entry, BTreeSet<String>> {
        let splits: Vec<Entry> = self
            .listing
            .lock()
            .unwrap()
            .iter()
            .filter(|e| seen.insert(e.name.clone()))
            .cloned()
            .collect();
        Box::pin(std::future::ready(Ok(Discovery {
            splits,
            state: seen,
        })))
    }

    fn monitor_interval(&self) -> Option<Duration> {
        self.monitor
    }

    fn owner(&self, split: &Entry, _parallelism: u32) -> Option<u32> {
        split.pin
    }

    fn discovers_on_restore(&self) -> bool {
        self.rediscover
    }
}

fn entry(name: &str) -> Entry {
    Entry {
        name: name.into(),
        pin: None,
    }
}

struct Fixture {
    listing: Arc<Mutex<Vec<Entry>>>,
    coordinator: SourceCoordinator,
}

impl Fixture {
    fn new(monitor: Option<Duration>, entries: &[Entry]) -> Self {
        Self::listing(monitor, entries, false)
    }

    fn listing(monitor: Option<Duration>, entries: &[Entry], rediscover: bool) -> Self {
        let listing = Arc::new(Mutex::new(entries.to_vec()));
        let enumerator = Arc::new(Erased(Arc::new(Listing {
            listing: listing.clone(),
            monitor,
            rediscover,
        })));
        Fixture {
            listing,
            coordinator: SourceCoordinator::new("files", enumerator),
        }
    }

    /// Applies `event`, runs any discovery it asks for and applies its
    /// outcome: the actions, with discoveries carried out.
    fn step(&mut self, event: SourceEvent) -> Vec<SourceAction> {
        let mut out = Vec::new();
        let mut events = VecDeque::from([event]);
        while let Some(event) = events.pop_front() {
            for action in self.coordinator.handle(event).unwrap() {
                match action {
                    SourceAction::Discover { state, parallelism } => {
                        let (splits, state) =
                            run(self.coordinator.enumerator().discover(&state, parallelism))
                                .unwrap();
                        events.push_back(SourceEvent::Discovered { splits, state });
                    }
                    other => out.push(other),
                }
            }
        }
        out
    }

    fn request(&mut self, subtask: u32) -> Vec<SourceAction> {
        self.step(SourceEvent::SplitRequested { subtask })
    }
}

fn run<T>(future: BoxFuture<T>) -> T {
    let mut future = future;
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("the test enumerator is synchronous"),
    }
}

fn assign(subtask: u32, names: &[&str]) -> SourceAction {
    SourceAction::Assign {
        subtask,
        splits: names
            .iter()
            .map(|n| SplitBytes::encode(&entry(n)).unwrap())
            .collect(),
    }
}

#[test]
fn a_bounded_source_hands_out_one_split_per_request_then_says_no_more() {
    let mut f = Fixture::new(None, &[entry("a"), entry("b")]);
    assert_eq!(f.step(SourceEvent::Started { parallelism: 2 }), []);
    assert_eq!(f.request(1), [assign(1, &["a"])]);
    assert_eq!(f.request(0), [assign(0, &["b"])]);
    assert_eq!(f.request(1), [SourceAction::NoMoreSplits { subtask: 1 }]);
    // A file added after the discovery of a bounded source is not read.
    f.listing.lock().unwrap().push(entry("c"));
    assert_eq!(f.request(0), [SourceAction::NoMoreSplits { subtask: 0 }]);
}

#[test]
fn requests_before_the_first_discovery_are_served_by_it_in_order() {
    let mut f = Fixture::new(None, &[entry("a")]);
    let started = f
        .coordinator
        .handle(SourceEvent::Started { parallelism: 2 })
        .unwrap();
    // The enumerator learns how many readers there are.
    let [SourceAction::Discover {
        state,
        parallelism: 2,
    }] = started.as_slice()
    else {
        panic!("{started:?}");
    };
    assert_eq!(f.request(1), []);
    assert_eq!(f.request(0), []);
    assert_eq!(f.request(1), [], "a second request is not queued twice");
    let (splits, state) = run(f.coordinator.enumerator().discover(state, 2)).unwrap();
    assert_eq!(
        f.step(SourceEvent::Discovered { splits, state }),
        [assign(1, &["a"]), SourceAction::NoMoreSplits { subtask: 0 }]
    );
}

#[test]
fn a_continuous_source_looks_again_and_serves_the_subtasks_that_waited() {
    let interval = Duration::from_millis(100);
    let mut f = Fixture::new(Some(interval), &[entry("a")]);
    assert_eq!(
        f.step(SourceEvent::Started { parallelism: 1 }),
        [SourceAction::DiscoverAfter(interval)]
    );
    assert_eq!(f.request(0), [assign(0, &["a"])]);
    assert_eq!(f.request(0), [], "no split yet, and more may come");
    f.listing.lock().unwrap().push(entry("b"));
    assert_eq!(
        f.step(SourceEvent::DiscoveryDue),
        [assign(0, &["b"]), SourceAction::DiscoverAfter(interval)]
    );
    // The enumerator's state keeps "a" from being found again.
    assert_eq!(
        f.step(SourceEvent::DiscoveryDue),
        [SourceAction::DiscoverAfter(interval)]
    );
}

#[test]
fn splits_with_an_owner_go_to_it_without_a_request() {
    let pinned = Entry {
        name: "p".into(),
        pin: Some(3),
    };
    let mut f = Fixture::new(None, &[pinned.clone(), entry("a")]);
    let started = f.step(SourceEvent::Started { parallelism: 2 });
    // Owner 3 of parallelism 2 is subtask 1.
    assert_eq!(
        started,
        [SourceAction::Assign {
            subtask: 1,
            splits: vec![SplitBytes::encode(&pinned).unwrap()],
        }]
    );
    assert_eq!(f.request(0), [assign(0, &["a"])]);
}

#[test]
fn a_restore_hands_out_again_exactly_what_the_checkpoint_had_not_handed_out() {
    let mut f = Fixture::new(None, &[entry("a"), entry("b"), entry("c")]);
    f.step(SourceEvent::Started { parallelism: 2 });
    assert_eq!(f.request(0), [assign(0, &["a"])]);
    // The checkpoint is triggered here: "a" is subtask 0's.
    let checkpoint = f.coordinator.snapshot().unwrap();
    assert_eq!(f.request(1), [assign(1, &["b"])]);
    // The attempt fails; the next restores the checkpoint, at parallelism 3.
    f.coordinator.restore(Some(&checkpoint)).unwrap();
    assert_eq!(f.step(SourceEvent::Started { parallelism: 3 }), []);
    assert_eq!(f.request(2), [assign(2, &["b"])]);
    assert_eq!(f.request(0), [assign(0, &["c"])]);
    assert_eq!(f.request(1), [SourceAction::NoMoreSplits { subtask: 1 }]);
}

#[test]
fn only_a_source_that_asks_for_it_discovers_again_after_a_restore() {
    for rediscover in [false, true] {
        let mut f = Fixture::listing(None, &[entry("a")], rediscover);
        f.step(SourceEvent::Started { parallelism: 1 });
        assert_eq!(f.request(0), [assign(0, &["a"])]);
        assert_eq!(f.request(0), [SourceAction::NoMoreSplits { subtask: 0 }]);
        // The final checkpoint: the source had discovered all.
        let checkpoint = f.coordinator.snapshot().unwrap();
        f.listing.lock().unwrap().push(entry("b"));
        f.coordinator.restore(Some(&checkpoint)).unwrap();
        f.step(SourceEvent::Started { parallelism: 1 });
        let expected = match rediscover {
            true => assign(0, &["b"]),
            false => SourceAction::NoMoreSplits { subtask: 0 },
        };
        assert_eq!(f.request(0), [expected], "rediscover: {rediscover}");
    }
}

#[test]
fn an_attempt_without_a_checkpoint_starts_from_scratch() {
    let mut f = Fixture::new(None, &[entry("a")]);
    f.step(SourceEvent::Started { parallelism: 1 });
    assert_eq!(f.request(0), [assign(0, &["a"])]);
    // A restart with no completed checkpoint: "a" was never checkpointed
    // as read, so it is read again from its start.
    assert_eq!(f.step(SourceEvent::Started { parallelism: 1 }), []);
    assert_eq!(f.request(0), [assign(0, &["a"])]);
}

#[test]
fn the_hook_stores_the_state_under_the_source_uid_and_rejects_a_foreign_one() {
    let f = Fixture::new(None, &[]);
    let shared = Arc::new(Mutex::new(f.coordinator));
    let mut hook = SourceHook::new(shared.clone());
    assert_eq!(hook.name(), "source:files");
    let state = hook.trigger(CheckpointId(1)).unwrap().unwrap();
    hook.restore(CheckpointId(1), Some(&state)).unwrap();
    let error = hook
        .restore(CheckpointId(1), Some(b"not a state"))
        .unwrap_err();
    assert!(
        error.starts_with("the checkpointed state of source files is malformed"),
        "{error}"
    );
}

#[test]
fn a_coordinator_that_failed_refuses_checkpoints_until_the_next_attempt() {
    let mut f = Fixture::new(None, &[entry("a")]);
    f.step(SourceEvent::Started { parallelism: 1 });
    let foreign = SplitBytes {
        id: "x".into(),
        bytes: vec![0xc1],
    };
    let state = f.coordinator.snapshot().unwrap();
    let error = f
        .coordinator
        .handle(SourceEvent::Discovered {
            splits: vec![foreign],
            state,
        })
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("split x is not one of this source's"),
        "{error}"
    );
    let refused = f.coordinator.snapshot().unwrap_err().to_string();
    assert!(refused.contains("it failed"), "{refused}");
    f.step(SourceEvent::Started { parallelism: 1 });
    assert!(f.coordinator.snapshot().is_ok());
}
