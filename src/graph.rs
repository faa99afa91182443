//! `JobGraph`: the untyped shape of a job — operators with parallelism and a
//! stable `uid`, and the edges between them with their partitioners. The
//! typed builder (`crate::job`) produces it; the runtime deploys it; later,
//! savepoints match operators across jobs by `uid`.

use crate::ids::{ChannelId, OperatorId, SubtaskId, SubtaskIndex};
use crate::key_group::DEFAULT_MAX_PARALLELISM;
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
    /// An operator (named) with more than one `"input"` or `"output"` edge:
    /// only linear pipelines run so far.
    #[error("operator {0:?} has more than one {1} edge; only linear pipelines are supported")]
    NotLinear(String, &'static str),
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
    /// The edges; at most one into and one out of each operator for now.
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

    /// The operator `id`; panics if there is none.
    pub fn operator(&self, id: OperatorId) -> &OperatorSpec {
        &self.operators[id.0 as usize]
    }

    /// The operator `id`, to change; panics if there is none.
    pub fn operator_mut(&mut self, id: OperatorId) -> &mut OperatorSpec {
        &mut self.operators[id.0 as usize]
    }

    /// The edge into `id`: `None` for a source.
    pub fn input_edge(&self, id: OperatorId) -> Option<&Edge> {
        self.edges.iter().find(|e| e.to == id)
    }

    /// The edge out of `id`: `None` for a sink.
    pub fn output_edge(&self, id: OperatorId) -> Option<&Edge> {
        self.edges.iter().find(|e| e.from == id)
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

    /// How many input channels `subtask` reads.
    pub fn input_count(&self, subtask: SubtaskId) -> usize {
        self.input_edge(subtask.operator)
            .map_or(0, |e| self.input_channels(e, subtask.index).len())
    }

    /// Checks what deployment relies on: parallelism within bounds, unique
    /// uids, edges between existing operators, forward edges between equal
    /// parallelism, a linear pipeline.
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
        for op in &self.operators {
            if self.edges.iter().filter(|e| e.to == op.id).count() > 1 {
                return Err(GraphError::NotLinear(op.name.clone(), "input"));
            }
            if self.edges.iter().filter(|e| e.from == op.id).count() > 1 {
                return Err(GraphError::NotLinear(op.name.clone(), "output"));
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
}
