//! `JobGraph`: the untyped shape of a job — operators with parallelism and a
//! stable `uid`, and the edges between them with their partitioners. The
//! typed builder (`crate::job`) produces it; the runtime deploys it;
//! savepoints match operators across jobs by `uid`.
//!
//! The graph is a DAG: an operator may read several edges (a union, or the
//! two inputs of a two-input operator) and feed several (fan-out, side
//! outputs). A subtask's input gate holds the channels of its input edges
//! one edge after the other, in the order of `JobGraph::edges`; its output
//! channels are laid out the same way. Both orders are part of the
//! checkpoint format: channel state names a channel by its position there.

use crate::model::ids::{ChannelId, OperatorId, SubtaskId, SubtaskIndex};
use crate::model::key_group::DEFAULT_MAX_PARALLELISM;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How an edge routes records from producer subtasks to consumer subtasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Partitioner {
    /// Subtask i feeds subtask i; both sides have the same parallelism.
    Forward,
    /// By key group of the record's key (`key_by`).
    Hash,
    /// Round robin over all consumers.
    Rebalance,
    /// Every record to every consumer.
    Broadcast,
}

/// A vertex of the `JobGraph`: one operator chain, run by `parallelism`
/// subtasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorSpec {
    /// Its position in `JobGraph::operators`.
    pub id: OperatorId,
    /// For people: logs, statistics and the REST API. A sink chained to the
    /// operator appends its name (`count -> sink`).
    pub name: String,
    /// Stable identity across versions of a job: state is matched by it.
    pub uid: String,
    /// Number of subtasks, `1..=max_parallelism`.
    pub parallelism: u32,
    /// Number of key groups of its keyed state, and so the highest
    /// parallelism it can ever be rescaled to; fixed for the life of its
    /// state (default [`DEFAULT_MAX_PARALLELISM`]).
    pub max_parallelism: u32,
}

/// An edge of the `JobGraph`: every producer subtask has one channel to each
/// consumer subtask it can route to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// The producer operator.
    pub from: OperatorId,
    /// The consumer operator.
    pub to: OperatorId,
    /// How records are routed across the edge.
    pub partitioner: Partitioner,
    /// Which input of the consumer the edge feeds: 0, or 1 for the second
    /// input of a two-input operator. Edges of one input carry one record
    /// type (a union).
    #[serde(default)]
    pub input: u8,
}

/// Why a `JobGraph` cannot be deployed ([`JobGraph::validate`]).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GraphError {
    /// An operator's parallelism is 0 or above its max parallelism.
    #[error("operator {name:?}: parallelism {parallelism} must be between 1 and its max parallelism {max_parallelism}")]
    Parallelism {
        /// The operator's name.
        name: String,
        /// Its parallelism.
        parallelism: u32,
        /// Its max parallelism.
        max_parallelism: u32,
    },
    /// Two operators have the same uid, so their state could not be told
    /// apart.
    #[error("operator uid {0:?} is used twice; uids must be unique within a job")]
    DuplicateUid(String),
    /// A forward edge between operators of different parallelism.
    #[error("forward edge {from} -> {to} joins parallelism {from_parallelism} to {to_parallelism}; use rebalance or key_by")]
    ForwardParallelism {
        /// The producer's name.
        from: String,
        /// The consumer's name.
        to: String,
        /// The producer's parallelism.
        from_parallelism: u32,
        /// The consumer's parallelism.
        to_parallelism: u32,
    },
    /// An edge that does not go from an earlier operator to a later one:
    /// the graph must be acyclic, and operators come in topological order.
    #[error("edge {from} -> {to} goes backwards; a job graph is acyclic, its operators in topological order")]
    Backwards {
        /// The producer's name.
        from: String,
        /// The consumer's name.
        to: String,
    },
    /// Two edges between the same two operators: their channels could not
    /// be told apart.
    #[error(
        "operators {from} and {to} are joined by two edges; union a stream with itself only once"
    )]
    DuplicateEdge {
        /// The producer's name.
        from: String,
        /// The consumer's name.
        to: String,
    },
    /// An operator whose edges feed input 1 but not input 0, or an input
    /// above 1.
    #[error("operator {0:?} has edges into input {1} without the inputs before it")]
    Inputs(String, u8),
    /// An edge names an operator the graph does not have.
    #[error("edge refers to unknown operator {0}")]
    UnknownOperator(OperatorId),
    /// No operators at all.
    #[error("the job has no operators")]
    Empty,
}

/// The untyped shape of a job (Flink's `JobGraph`): what the runtime deploys
/// and what checkpoints are matched against.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobGraph {
    /// Indexed by `OperatorId`.
    pub operators: Vec<OperatorSpec>,
    /// The edges, in the order that lays out gates and outputs.
    pub edges: Vec<Edge>,
}

impl JobGraph {
    /// Appends an operator with a default uid (`<name>-<id>`) and the default
    /// max parallelism.
    pub fn add_operator(&mut self, name: &str, parallelism: u32) -> OperatorId {
        let id = OperatorId(self.operators.len() as u32);
        self.operators.push(OperatorSpec {
            id,
            name: name.to_owned(),
            uid: format!("{}-{}", name, id.0),
            parallelism,
            max_parallelism: DEFAULT_MAX_PARALLELISM,
        });
        id
    }

    /// Whether `other` is this job at another parallelism: the same
    /// operators and edges, whatever their parallelism.
    pub fn rescales_to(&self, other: &JobGraph) -> bool {
        let same = |a: &OperatorSpec, b: &OperatorSpec| {
            (a.id, &a.name, &a.uid, a.max_parallelism) == (b.id, &b.name, &b.uid, b.max_parallelism)
        };
        self.edges == other.edges
            && self.operators.len() == other.operators.len()
            && self
                .operators
                .iter()
                .zip(&other.operators)
                .all(|(a, b)| same(a, b))
    }

    /// The operator `id`; panics if there is none.
    pub fn operator(&self, id: OperatorId) -> &OperatorSpec {
        &self.operators[id.0 as usize]
    }

    /// The operator `id`, to change; panics if there is none.
    pub fn operator_mut(&mut self, id: OperatorId) -> &mut OperatorSpec {
        &mut self.operators[id.0 as usize]
    }

    /// The edges into `id`, in gate order: none for a source.
    pub fn input_edges(&self, id: OperatorId) -> impl Iterator<Item = &Edge> + '_ {
        self.edges.iter().filter(move |e| e.to == id)
    }

    /// The edges out of `id`, in output order: none for a chain that ends
    /// in sinks only.
    pub fn output_edges(&self, id: OperatorId) -> impl Iterator<Item = &Edge> + '_ {
        self.edges.iter().filter(move |e| e.from == id)
    }

    /// Whether `id` reads no edge: its subtasks run sources.
    pub fn is_source(&self, id: OperatorId) -> bool {
        self.input_edges(id).next().is_none()
    }

    /// Every subtask of the job, operator by operator.
    pub fn subtasks(&self) -> impl Iterator<Item = SubtaskId> + '_ {
        self.operators.iter().flat_map(|op| {
            (0..op.parallelism).map(move |i| SubtaskId {
                operator: op.id,
                index: SubtaskIndex(i),
            })
        })
    }

    /// Consumer subtasks that producer subtask `index` of `edge.from` sends to,
    /// in the order of its output channels.
    pub fn output_channels(&self, edge: &Edge, index: SubtaskIndex) -> Vec<ChannelId> {
        let from = SubtaskId {
            operator: edge.from,
            index,
        };
        let to = |i| ChannelId {
            from,
            to: SubtaskId {
                operator: edge.to,
                index: SubtaskIndex(i),
            },
        };
        match edge.partitioner {
            Partitioner::Forward => vec![to(index.0)],
            _ => (0..self.operator(edge.to).parallelism).map(to).collect(),
        }
    }

    /// Producer subtasks that consumer subtask `index` of `edge.to` reads
    /// from, in the order of its input channels.
    pub fn input_channels(&self, edge: &Edge, index: SubtaskIndex) -> Vec<ChannelId> {
        let to = SubtaskId {
            operator: edge.to,
            index,
        };
        let from = |i| ChannelId {
            from: SubtaskId {
                operator: edge.from,
                index: SubtaskIndex(i),
            },
            to,
        };
        match edge.partitioner {
            Partitioner::Forward => vec![from(index.0)],
            _ => (0..self.operator(edge.from).parallelism)
                .map(from)
                .collect(),
        }
    }

    /// The input gate of `subtask`: every channel it reads, with the input
    /// (`Edge::input`) it feeds, edge after edge.
    pub fn gate(&self, subtask: SubtaskId) -> Vec<(ChannelId, u8)> {
        self.input_edges(subtask.operator)
            .flat_map(|e| {
                self.input_channels(e, subtask.index)
                    .into_iter()
                    .map(move |c| (c, e.input))
            })
            .collect()
    }

    /// Every output channel of `subtask`, edge after edge.
    pub fn outputs(&self, subtask: SubtaskId) -> Vec<ChannelId> {
        self.output_edges(subtask.operator)
            .flat_map(|e| self.output_channels(e, subtask.index))
            .collect()
    }

    /// Where the channels of edge `index` (in `edges`) start in the gate of
    /// its consumer's subtasks (`input_side`) or among its producer's
    /// outputs, had every operator the parallelism `parallelism_of` gives:
    /// a restore lays out the checkpointed job's gates with the parallelism
    /// it ran at.
    pub fn channel_offset(
        &self,
        index: usize,
        input_side: bool,
        parallelism_of: impl Fn(OperatorId) -> u32,
    ) -> u32 {
        let width = |e: &Edge| match (e.partitioner, input_side) {
            (Partitioner::Forward, _) => 1,
            (_, true) => parallelism_of(e.from),
            (_, false) => parallelism_of(e.to),
        };
        let (edge, before) = (&self.edges[index], self.edges[..index].iter());
        if input_side {
            before.filter(|e| e.to == edge.to).map(width).sum()
        } else {
            before.filter(|e| e.from == edge.from).map(width).sum()
        }
    }

    /// Checks what deployment relies on: parallelism within bounds, unique
    /// uids, edges between existing operators from earlier to later ones,
    /// at most one edge between two operators, forward edges between equal
    /// parallelism, inputs numbered from 0.
    pub fn validate(&self) -> Result<(), GraphError> {
        if self.operators.is_empty() {
            return Err(GraphError::Empty);
        }
        let mut uids = std::collections::HashSet::new();
        for op in &self.operators {
            if op.parallelism == 0 || op.parallelism > op.max_parallelism {
                return Err(GraphError::Parallelism {
                    name: op.name.clone(),
                    parallelism: op.parallelism,
                    max_parallelism: op.max_parallelism,
                });
            }
            if !uids.insert(op.uid.as_str()) {
                return Err(GraphError::DuplicateUid(op.uid.clone()));
            }
        }
        for edge in &self.edges {
            for id in [edge.from, edge.to] {
                if id.0 as usize >= self.operators.len() {
                    return Err(GraphError::UnknownOperator(id));
                }
            }
            let (from, to) = (self.operator(edge.from), self.operator(edge.to));
            if edge.partitioner == Partitioner::Forward && from.parallelism != to.parallelism {
                return Err(GraphError::ForwardParallelism {
                    from: from.name.clone(),
                    to: to.name.clone(),
                    from_parallelism: from.parallelism,
                    to_parallelism: to.parallelism,
                });
            }
        }
        let name = |id: OperatorId| self.operator(id).name.clone();
        for (i, edge) in self.edges.iter().enumerate() {
            if edge.from >= edge.to {
                return Err(GraphError::Backwards {
                    from: name(edge.from),
                    to: name(edge.to),
                });
            }
            if self.edges[..i]
                .iter()
                .any(|e| e.from == edge.from && e.to == edge.to)
            {
                return Err(GraphError::DuplicateEdge {
                    from: name(edge.from),
                    to: name(edge.to),
                });
            }
            if edge.input > 1
                || (edge.input == 1 && !self.input_edges(edge.to).any(|e| e.input == 0))
            {
                return Err(GraphError::Inputs(name(edge.to), edge.input));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_stage(p1: u32, p2: u32, partitioner: Partitioner) -> JobGraph {
        let mut g = JobGraph::default();
        let a = g.add_operator("source", p1);
        let b = g.add_operator("count", p2);
        g.edges.push(Edge {
            from: a,
            to: b,
            partitioner,
            input: 0,
        });
        g
    }

    #[test]
    fn channels_agree_from_both_sides() {
        for partitioner in [
            Partitioner::Hash,
            Partitioner::Rebalance,
            Partitioner::Broadcast,
        ] {
            let g = two_stage(2, 3, partitioner);
            let edge = &g.edges[0];
            let mut outs: Vec<_> = (0..2)
                .flat_map(|i| g.output_channels(edge, SubtaskIndex(i)))
                .collect();
            let mut ins: Vec<_> = (0..3)
                .flat_map(|i| g.input_channels(edge, SubtaskIndex(i)))
                .collect();
            outs.sort();
            ins.sort();
            assert_eq!(outs, ins);
            assert_eq!(outs.len(), 6);
        }
        let g = two_stage(3, 3, Partitioner::Forward);
        assert_eq!(g.output_channels(&g.edges[0], SubtaskIndex(1)).len(), 1);
    }

    #[test]
    fn validation_names_the_problem() {
        assert_eq!(
            two_stage(2, 3, Partitioner::Forward).validate(),
            Err(GraphError::ForwardParallelism {
                from: "source".into(),
                to: "count".into(),
                from_parallelism: 2,
                to_parallelism: 3
            })
        );
        let mut g = two_stage(2, 2, Partitioner::Hash);
        g.operators[1].parallelism = 129;
        assert!(matches!(g.validate(), Err(GraphError::Parallelism { .. })));
        let mut g = two_stage(2, 2, Partitioner::Hash);
        g.operators[1].uid = g.operators[0].uid.clone();
        assert_eq!(
            g.validate(),
            Err(GraphError::DuplicateUid("source-0".into()))
        );
        assert_eq!(JobGraph::default().validate(), Err(GraphError::Empty));
    }

    fn edge(from: OperatorId, to: OperatorId, partitioner: Partitioner, input: u8) -> Edge {
        Edge {
            from,
            to,
            partitioner,
            input,
        }
    }

    /// left (p=2) and right (p=3) into the two inputs of join (p=2) over
    /// hash edges; left also feeds audit (p=2) forward, which unions it with
    /// join's output.
    fn dag() -> JobGraph {
        let mut g = JobGraph::default();
        let left = g.add_operator("left", 2);
        let right = g.add_operator("right", 3);
        let join = g.add_operator("join", 2);
        let audit = g.add_operator("audit", 2);
        g.edges = vec![
            edge(left, join, Partitioner::Hash, 0),
            edge(right, join, Partitioner::Hash, 1),
            edge(left, audit, Partitioner::Forward, 0),
            edge(join, audit, Partitioner::Rebalance, 0),
        ];
        g
    }

    /// A cycle, a stream unioned with itself and a second input without a
    /// first are refused before deployment, naming the operators.
    #[test]
    fn validation_refuses_cycles_duplicate_edges_and_gaps_in_the_inputs() {
        assert_eq!(dag().validate(), Ok(()));
        let (left, join, audit) = (OperatorId(0), OperatorId(2), OperatorId(3));

        let mut g = dag();
        g.edges[3] = edge(audit, join, Partitioner::Rebalance, 0);
        assert_eq!(
            g.validate(),
            Err(GraphError::Backwards {
                from: "audit".into(),
                to: "join".into()
            })
        );
        g.edges[3] = edge(join, join, Partitioner::Forward, 0);
        assert!(matches!(g.validate(), Err(GraphError::Backwards { .. })));

        let mut g = dag();
        g.edges.push(edge(left, join, Partitioner::Rebalance, 1));
        assert_eq!(
            g.validate(),
            Err(GraphError::DuplicateEdge {
                from: "left".into(),
                to: "join".into()
            })
        );

        for input in [1, 2] {
            let mut g = dag();
            g.edges[0].input = input;
            assert_eq!(g.validate(), Err(GraphError::Inputs("join".into(), input)));
        }
    }

    /// A subtask's gate holds the channels of its input edges edge after
    /// edge, each with the input it feeds, and its outputs are laid out
    /// alike: channel state names channels by these positions. A restore
    /// finds an edge's channels with `channel_offset`, at the parallelism
    /// the job ran at, so it must agree with the layout at any parallelism.
    #[test]
    fn gates_and_outputs_lay_out_channels_edge_after_edge() {
        let g = dag();
        let id = |operator, index| SubtaskId {
            operator: OperatorId(operator),
            index: SubtaskIndex(index),
        };
        let from = |gate: Vec<(ChannelId, u8)>| -> Vec<(SubtaskId, u8)> {
            gate.into_iter().map(|(c, input)| (c.from, input)).collect()
        };
        let (l, r, j, a) = (0, 1, 2, 3);
        assert_eq!(
            from(g.gate(id(j, 1))),
            [
                (id(l, 0), 0),
                (id(l, 1), 0),
                (id(r, 0), 1),
                (id(r, 1), 1),
                (id(r, 2), 1)
            ]
        );
        assert_eq!(
            from(g.gate(id(a, 1))),
            [(id(l, 1), 0), (id(j, 0), 0), (id(j, 1), 0)]
        );
        let to: Vec<SubtaskId> = g.outputs(id(l, 1)).into_iter().map(|c| c.to).collect();
        assert_eq!(to, [id(j, 0), id(j, 1), id(a, 1)]);
        assert!(g.gate(id(l, 0)).is_empty());
        assert!(g.outputs(id(a, 0)).is_empty());

        for parallelism in [[2, 3, 2, 2], [4, 1, 3, 4]] {
            let p = |op: OperatorId| parallelism[op.0 as usize];
            let mut rescaled = g.clone();
            for op in &mut rescaled.operators {
                op.parallelism = p(op.id);
            }
            rescaled.validate().unwrap();
            for (i, e) in rescaled.edges.iter().enumerate() {
                let start = g.channel_offset(i, true, p) as usize;
                for index in (0..p(e.to)).map(SubtaskIndex) {
                    let gate = rescaled.gate(SubtaskId {
                        operator: e.to,
                        index,
                    });
                    let expected: Vec<_> = rescaled
                        .input_channels(e, index)
                        .into_iter()
                        .map(|c| (c, e.input))
                        .collect();
                    assert_eq!(gate[start..start + expected.len()], expected, "{e:?}");
                }
                let start = g.channel_offset(i, false, p) as usize;
                for index in (0..p(e.from)).map(SubtaskIndex) {
                    let outputs = rescaled.outputs(SubtaskId {
                        operator: e.from,
                        index,
                    });
                    let expected = rescaled.output_channels(e, index);
                    assert_eq!(outputs[start..start + expected.len()], expected, "{e:?}");
                }
            }
        }
    }

    #[test]
    fn a_graph_rescales_to_itself_at_any_parallelism_but_not_to_another_job() {
        let g = two_stage(2, 2, Partitioner::Hash);
        assert!(g.rescales_to(&two_stage(4, 1, Partitioner::Hash)));
        assert!(!g.rescales_to(&two_stage(2, 2, Partitioner::Rebalance)));
        let mut renamed = g.clone();
        renamed.operators[1].uid = "other".into();
        assert!(!g.rescales_to(&renamed));
        let mut regrouped = g.clone();
        regrouped.operators[1].max_parallelism = 64;
        assert!(!g.rescales_to(&regrouped));
    }
}
