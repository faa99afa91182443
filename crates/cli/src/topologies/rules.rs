//! The rules topology, Flink's broadcast state pattern: wordcount's keyed
//! records counted per key, and rules broadcast to every counting subtask,
//! each alerting once for every key whose count reaches its threshold. A
//! sink of `key,rule,threshold` alerts.
//!
//! The rules come from the same generator as the keys, one every
//! `records / rules` records, so that they arrive all through the run: a
//! rule that arrives finds the keys already over its threshold through the
//! keyed state of every key, and a count that reaches the threshold of a
//! rule already there alerts with the record. Whatever the order the two
//! inputs meet in, every key alerts once for every rule it reaches.

use crate::sinks::{sink_into, Target};
use crate::topologies::wordcount::{Generator, Keys, Records};
use serde::{Deserialize, Serialize};
use tidemark_connectors::rows::{Column, Row, SqlType, Value};
use tidemark_core::dataflow::broadcast::KeyedBroadcastProcessFunction;
use tidemark_core::job::JobConfig;
use tidemark_core::model::rng::splitmix64;
use tidemark_core::state::{BroadcastContext, MapStateDescriptor};
use tidemark_core::{Collector, Job, KeyedContext, StateRegistrar, UserError, ValueState};

/// The job's name, from which its id and checkpoint directory follow.
pub const JOB_NAME: &str = "rules";

/// A rule: alert for every key whose count reaches `threshold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Rule i of the run.
    pub id: u64,
    /// The count that alerts.
    pub threshold: u64,
}

/// A generated record: wordcount's key, and the rule that comes with it,
/// if one does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keyed {
    /// The key to count.
    pub key: u64,
    /// A rule to broadcast.
    pub rule: Option<Rule>,
}

/// The rules topology's records: record i is wordcount's, and carries rule
/// `i / spacing` when i is a multiple of `spacing` below `rules`.
#[derive(Clone, Copy, Debug)]
pub struct WithRules {
    keys: Keys,
    rules: u64,
    spacing: u64,
    /// A key's mean count over the run.
    mean: u64,
}

impl Records for WithRules {
    type Record = Keyed;
    fn record(&self, i: u64) -> Keyed {
        let id = i / self.spacing;
        Keyed {
            key: self.keys.record(i),
            rule: (i.is_multiple_of(self.spacing) && id < self.rules).then(|| Rule {
                id,
                // From 1 to twice a key's mean count: a rule alerts for
                // some keys and not for others.
                threshold: 1 + splitmix64(self.keys.seed ^ 0x7275_6c65 ^ id) % (2 * self.mean),
            }),
        }
    }
}

/// An alert: `key`'s count reached rule `rule`'s `threshold`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// The key.
    pub key: u64,
    /// The rule's id.
    pub rule: u64,
    /// The rule's threshold.
    pub threshold: u64,
}

/// Columns `key`, `rule` and `threshold`; the key and the rule are the key
/// in upsert mode.
impl Row for Alert {
    fn columns() -> Vec<Column> {
        let column = |name, sql_type| Column { name, sql_type };
        vec![
            column("key", SqlType::BigInt),
            column("rule", SqlType::BigInt),
            column("threshold", SqlType::BigInt),
        ]
    }

    fn key_columns() -> usize {
        2
    }

    fn values(&self, out: &mut Vec<Value>) -> Result<(), UserError> {
        use tidemark_connectors::rows::SqlField;
        out.push(self.key.value()?);
        out.push(self.rule.value()?);
        out.push(self.threshold.value()?);
        Ok(())
    }
}

/// The rules topology's parameters: generator → keys by key, rules
/// broadcast → alerts → sink.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Records generated over all source subtasks.
    pub records: u64,
    /// Wordcount's keys.
    pub keys: Keys,
    /// Rules over the run; at most `records`.
    pub rules: u64,
    /// Where the alerts go.
    pub sink: Target,
}

impl Rules {
    fn records(&self) -> WithRules {
        WithRules {
            keys: self.keys,
            rules: self.rules,
            spacing: (self.records / self.rules.max(1)).max(1),
            mean: self.records.div_ceil(self.keys.keys).max(1),
        }
    }

    /// Every rule of the run, as the generator makes them.
    pub fn all(&self) -> Vec<Rule> {
        let made = self.records();
        (0..self.rules.min(self.records))
            .map(|id| {
                made.record(id * made.spacing)
                    .rule
                    .expect("a rule every spacing")
            })
            .collect()
    }

    /// The job, named [`JOB_NAME`], with operator uids `generator` and
    /// `alerts` (what savepoints match).
    pub fn job(&self, config: JobConfig) -> Job {
        let records = Job::builder(JOB_NAME)
            .config(config)
            .split_source("generator", Generator::of(self.records, self.records()))
            .uid("generator");
        // An operator of their own: two edges may not join one pair of
        // operators.
        let rules = records
            .clone()
            .flat_map(|record: Keyed| record.rule)
            .rebalance();
        let descriptor = MapStateDescriptor::<u64, u64>::new("rules");
        let alerts = records
            .map(|record: Keyed| record.key)
            .key_by(|key: &u64| *key)
            .connect(rules.broadcast_with(&descriptor))
            .process("alerts", move |states| {
                Alerts::open(states, descriptor.clone())
            })
            .uid("alerts");
        sink_into(alerts, &self.sink)
    }
}

/// Counts each key's records and alerts when a count reaches a rule.
struct Alerts {
    count: ValueState<u64>,
    /// Rule id → threshold, broadcast.
    rules: MapStateDescriptor<u64, u64>,
}

impl Alerts {
    fn open(states: &mut StateRegistrar<'_, u64>, rules: MapStateDescriptor<u64, u64>) -> Self {
        Alerts {
            count: states.value("count"),
            rules,
        }
    }
}

impl KeyedBroadcastProcessFunction<u64, u64, Rule, Alert> for Alerts {
    fn process_element(
        &mut self,
        key: u64,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Alert>,
    ) {
        let rules = ctx.broadcast_state(&self.rules);
        let mut entry = ctx.value(&self.count);
        let count = entry.get_or_default();
        *count += 1;
        let count = *count;
        for (&rule, &threshold) in rules {
            if threshold == count {
                out.collect(Alert {
                    key,
                    rule,
                    threshold,
                });
            }
        }
    }

    fn process_broadcast_element(
        &mut self,
        rule: Rule,
        ctx: &mut BroadcastContext<'_, u64>,
        out: &mut Collector<'_, Alert>,
    ) {
        ctx.broadcast_state_mut(&self.rules)
            .insert(rule.id, rule.threshold);
        ctx.apply_to_keyed_state(&self.count, |&key, count| {
            if count.get().is_some_and(|&count| count >= rule.threshold) {
                out.collect(Alert {
                    key,
                    rule: rule.id,
                    threshold: rule.threshold,
                });
            }
        });
    }
}
