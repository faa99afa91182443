//! Wiring an attempt's channels: an output endpoint on the producer's
//! arbiter and an input endpoint on the consumer's for every channel, and a
//! TCP link between every pair of workers that a channel crosses.

use crate::endpoint::{Downstream, InputEndpoint, OutputEndpoint, Upstream};
use crate::messages::{ConnectUpstream, Stop};
use crate::metrics::JobMetrics;
use crate::net::{self, LinkActor, LinkEnd, Routes, Workers};
use crate::subtask::SubtaskActor;
use crate::supervisor::JobSupervisor;
use actix::{Actor, Addr, Recipient};
use actix_rt::ArbiterHandle;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tidemark::channel::ChannelConfig;
use tidemark::graph::JobGraph;
use tidemark::ids::{Attempt, JobId, SubtaskId};

/// The endpoints of an attempt, by subtask, in the order of its outputs and
/// of its input gate; the ends of its links, by the worker they belong
/// to; and every actor of theirs to stop with the attempt.
pub struct Channels {
    pub outputs: HashMap<SubtaskId, Vec<Addr<OutputEndpoint>>>,
    pub inputs: HashMap<SubtaskId, Vec<Addr<InputEndpoint>>>,
    pub links: Vec<(u32, Addr<LinkActor>)>,
    pub actors: Vec<Recipient<Stop>>,
}

/// What the channels of one attempt are built from.
pub struct Wiring<'a> {
    pub job: JobId,
    pub attempt: Attempt,
    pub graph: &'a JobGraph,
    pub config: ChannelConfig,
    pub workers: &'a Workers,
    pub metrics: &'a Arc<JobMetrics>,
    pub supervisor: Addr<JobSupervisor>,
    /// The arbiter of a subtask, and of its endpoints.
    pub arbiter: &'a dyn Fn(SubtaskId) -> &'a ArbiterHandle,
}

impl Wiring<'_> {
    /// Connects `subtasks`. Fails only if a loopback link cannot be opened.
    pub fn connect(
        &self,
        subtasks: &HashMap<SubtaskId, Addr<SubtaskActor>>,
    ) -> std::io::Result<Channels> {
        let graph = self.graph;
        let mut links: BTreeMap<(u32, u32), (LinkEnd, LinkEnd)> = BTreeMap::new();
        for producer in graph.subtasks() {
            for channel in graph.outputs(producer) {
                if let Some(pair) = self.workers.placement.crossing(channel) {
                    if let std::collections::btree_map::Entry::Vacant(link) = links.entry(pair) {
                        link.insert(net::connect_loopback(
                            self.job,
                            self.attempt,
                            &self.supervisor.clone().recipient(),
                            pair,
                        )?);
                    }
                }
            }
        }
        // The end of the link of `pair` on the worker of `subtask`.
        let end = |pair, subtask: SubtaskId| {
            let (low, high) = &links[&pair];
            if self.workers.placement.worker(subtask) == pair.0 {
                low.sender()
            } else {
                high.sender()
            }
        };
        let mut routes = Routes::default();
        let mut outputs: HashMap<SubtaskId, Vec<Addr<OutputEndpoint>>> = HashMap::new();
        let mut inputs: HashMap<SubtaskId, Vec<Option<Addr<InputEndpoint>>>> = graph
            .subtasks()
            .map(|id| (id, vec![None; graph.gate(id).len()]))
            .collect();
        let mut actors: Vec<Recipient<Stop>> = Vec::new();
        // A link end fails in the name of a subtask on its worker that it
        // feeds, or else one that feeds it.
        let mut fed: BTreeMap<((u32, u32), u32), SubtaskId> = BTreeMap::new();
        let mut feeding: BTreeMap<((u32, u32), u32), SubtaskId> = BTreeMap::new();
        let config = self.config;
        for producer in graph.subtasks() {
            for (k, channel) in graph.outputs(producer).into_iter().enumerate() {
                let consumer_channel = graph
                    .gate(channel.to)
                    .iter()
                    .position(|(c, _)| *c == channel)
                    .expect("both sides of an edge list the same channels");
                let gauge =
                    self.metrics
                        .channel(channel, config.output_credits, config.input_credits);
                let consumer = subtasks[&channel.to].clone();
                let supervisor = self.supervisor.clone();
                let ie_gauge = gauge.clone();
                let attempt = self.attempt;
                let ie = InputEndpoint::start_in_arbiter((self.arbiter)(channel.to), move |_| {
                    InputEndpoint::new(
                        channel,
                        attempt,
                        consumer,
                        consumer_channel,
                        config.prefetch,
                        ie_gauge,
                        supervisor,
                    )
                });
                let (downstream, upstream) = match self.workers.placement.crossing(channel) {
                    None => (Downstream::Local(ie.clone()), None),
                    Some(pair) => {
                        let placement = &self.workers.placement;
                        fed.entry((pair, placement.worker(channel.to)))
                            .or_insert(channel.to);
                        feeding
                            .entry((pair, placement.worker(channel.from)))
                            .or_insert(channel.from);
                        routes.inputs.insert(channel, ie.clone());
                        let downstream = Downstream::Remote {
                            channel,
                            link: end(pair, channel.from),
                            seq: 0,
                        };
                        let upstream = Upstream::Remote {
                            channel,
                            link: end(pair, channel.to),
                        };
                        (downstream, Some(upstream))
                    }
                };
                let producer = subtasks[&channel.from].clone();
                let oe =
                    OutputEndpoint::start_in_arbiter((self.arbiter)(channel.from), move |_| {
                        OutputEndpoint::new(producer, k, downstream, gauge)
                    });
                let upstream = match upstream {
                    Some(remote) => {
                        routes.outputs.insert(channel, oe.clone());
                        remote
                    }
                    None => Upstream::Local(oe.clone()),
                };
                ie.do_send(ConnectUpstream(upstream));
                actors.push(ie.clone().recipient());
                actors.push(oe.clone().recipient());
                outputs.entry(channel.from).or_default().push(oe);
                inputs
                    .get_mut(&channel.to)
                    .expect("every subtask has an entry")[consumer_channel] = Some(ie);
            }
        }
        // Links start once every endpoint they deliver to is known: the
        // frames queued meanwhile (initial credits) wait in their queues.
        let routes = Arc::new(routes);
        let mut ends = Vec::new();
        for (pair, (low, high)) in links {
            let arbiter = self
                .workers
                .links
                .as_ref()
                .expect("a placement that spreads comes with a link arbiter");
            for (worker, end) in [(pair.0, low), (pair.1, high)] {
                let blame = *fed
                    .get(&(pair, worker))
                    .or_else(|| feeding.get(&(pair, worker)))
                    .expect("a link end's worker hosts one of its channels' ends");
                let (routes, metrics) = (routes.clone(), self.metrics.clone());
                let link = LinkActor::start_in_arbiter(arbiter, move |_| {
                    LinkActor::new(end, routes, metrics, blame)
                });
                actors.push(link.clone().recipient());
                ends.push((worker, link));
            }
        }
        Ok(Channels {
            outputs,
            inputs: inputs
                .into_iter()
                .map(|(id, gate)| {
                    let gate = gate
                        .into_iter()
                        .map(|ie| ie.expect("every input channel has an endpoint"))
                        .collect();
                    (id, gate)
                })
                .collect(),
            links: ends,
            actors,
        })
    }
}
