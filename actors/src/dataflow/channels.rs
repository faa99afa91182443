//! Wiring an attempt's channels: an output endpoint on the producer's
//! arbiter and an input endpoint on the consumer's for every channel, and a
//! TCP link between every pair of workers that a channel crosses.

use crate::dataflow::endpoint::{
    ConnectUpstream, InputEndpoint, InputPeer, OutputEndpoint, OutputPeer,
};
use crate::dataflow::net::{LinkActor, LinkEnds, Routes, Workers};
use crate::dataflow::subtask::SubtaskActor;
use crate::messages::{Stop, SubtaskFailed};
use crate::metrics::JobMetrics;
use actix::{Actor, Addr, Recipient};
use actix_rt::ArbiterHandle;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tidemark_core::model::channel::ChannelConfig;
use tidemark_core::model::graph::JobGraph;
use tidemark_core::model::ids::{Attempt, SubtaskId};

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
    pub attempt: Attempt,
    pub graph: &'a JobGraph,
    pub config: ChannelConfig,
    pub workers: &'a Workers,
    pub metrics: &'a Arc<JobMetrics>,
    /// Where failures of endpoints and links go.
    pub failures: Recipient<SubtaskFailed>,
    /// The arbiter of a subtask, and of its endpoints.
    pub arbiter: &'a dyn Fn(SubtaskId) -> &'a ArbiterHandle,
}

impl Wiring<'_> {
    /// Connects the channels of `subtasks`, the ones this process hosts,
    /// through `ends`, this process's ends of the links between workers,
    /// by the pair of workers and the worker they belong to.
    pub fn connect(
        &self,
        subtasks: &HashMap<SubtaskId, Addr<SubtaskActor>>,
        mut ends: LinkEnds,
    ) -> Channels {
        let graph = self.graph;
        let placement = &self.workers.placement;
        // The end of the link of `pair` on the worker of `subtask`.
        let end = |pair, subtask: SubtaskId| ends[&(pair, placement.worker(subtask))].sender();
        let mut routes: BTreeMap<(u32, u32), Routes> = BTreeMap::new();
        let mut outputs: HashMap<SubtaskId, Vec<Addr<OutputEndpoint>>> = HashMap::new();
        let mut inputs: HashMap<SubtaskId, Vec<Option<Addr<InputEndpoint>>>> = subtasks
            .keys()
            .map(|id| (*id, vec![None; graph.gate(*id).len()]))
            .collect();
        let mut actors: Vec<Recipient<Stop>> = Vec::new();
        // A link end fails in the name of a subtask on its worker that it
        // feeds, or else one that feeds it.
        let mut fed: BTreeMap<((u32, u32), u32), SubtaskId> = BTreeMap::new();
        let mut feeding: BTreeMap<((u32, u32), u32), SubtaskId> = BTreeMap::new();
        let config = self.config;
        for producer in graph.subtasks() {
            for (k, channel) in graph.outputs(producer).into_iter().enumerate() {
                let (producer, consumer) = (subtasks.get(&channel.from), subtasks.get(&channel.to));
                if producer.is_none() && consumer.is_none() {
                    continue;
                }
                let crossing = placement.crossing(channel);
                let gauge =
                    self.metrics
                        .channel(channel, config.output_credits, config.input_credits);
                let ie = consumer.map(|consumer| {
                    let consumer_channel = graph
                        .gate(channel.to)
                        .iter()
                        .position(|(c, _)| *c == channel)
                        .expect("both sides of an edge list the same channels");
                    let (consumer, failures, gauge) =
                        (consumer.clone(), self.failures.clone(), gauge.clone());
                    let attempt = self.attempt;
                    let ie =
                        InputEndpoint::start_in_arbiter((self.arbiter)(channel.to), move |_| {
                            InputEndpoint::new(
                                channel,
                                attempt,
                                consumer,
                                consumer_channel,
                                config.prefetch,
                                gauge,
                                failures,
                            )
                        });
                    actors.push(ie.clone().recipient());
                    inputs
                        .get_mut(&channel.to)
                        .expect("every hosted subtask has an entry")[consumer_channel] =
                        Some(ie.clone());
                    if let Some(pair) = crossing {
                        fed.entry((pair, placement.worker(channel.to)))
                            .or_insert(channel.to);
                        routes
                            .entry(pair)
                            .or_default()
                            .inputs
                            .insert(channel, ie.clone().recipient());
                    }
                    ie
                });
                let oe = producer.map(|producer| {
                    let downstream = match (crossing, &ie) {
                        (None, Some(ie)) => InputPeer::Local(ie.clone()),
                        (Some(pair), _) => InputPeer::Remote {
                            channel,
                            link: end(pair, channel.from),
                            seq: 0,
                        },
                        (None, None) => {
                            unreachable!("a channel within a worker has both ends here")
                        }
                    };
                    let producer = producer.clone().recipient();
                    let oe =
                        OutputEndpoint::start_in_arbiter((self.arbiter)(channel.from), move |_| {
                            OutputEndpoint::new(producer, k, downstream, gauge)
                        });
                    actors.push(oe.clone().recipient());
                    outputs.entry(channel.from).or_default().push(oe.clone());
                    if let Some(pair) = crossing {
                        feeding
                            .entry((pair, placement.worker(channel.from)))
                            .or_insert(channel.from);
                        routes
                            .entry(pair)
                            .or_default()
                            .outputs
                            .insert(channel, oe.clone().recipient());
                    }
                    oe
                });
                if let Some(ie) = ie {
                    ie.do_send(ConnectUpstream(match (crossing, oe) {
                        (None, Some(oe)) => OutputPeer::Local(oe),
                        (Some(pair), _) => OutputPeer::Remote {
                            channel,
                            link: end(pair, channel.to),
                        },
                        (None, None) => {
                            unreachable!("a channel within a worker has both ends here")
                        }
                    }));
                }
            }
        }
        // Links start once every endpoint they deliver to is known: the
        // frames queued meanwhile (initial credits) wait in their queues.
        let mut links = Vec::new();
        let routes: BTreeMap<(u32, u32), Arc<Routes>> = routes
            .into_iter()
            .map(|(pair, r)| (pair, Arc::new(r)))
            .collect();
        for ((pair, worker), end) in std::mem::take(&mut ends) {
            let arbiter = self
                .workers
                .links
                .as_ref()
                .expect("links come with a link arbiter");
            let blame = *fed
                .get(&(pair, worker))
                .or_else(|| feeding.get(&(pair, worker)))
                .expect("a link end's worker hosts one of its channels' ends");
            let (routes, metrics) = (routes[&pair].clone(), self.metrics.clone());
            let link = LinkActor::start_in_arbiter(arbiter, move |_| {
                LinkActor::new(end, routes, metrics, blame)
            });
            actors.push(link.clone().recipient());
            links.push((worker, link));
        }
        Channels {
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
            links,
            actors,
        }
    }
}
