//! Two keyed stages and a side output: stage 1 keeps a running balance per
//! account and sends anomalies (a large transfer, an overdraft) to a side
//! output; stage 2 re-keys the balances by region and sums the latest
//! balance of each account in it. The main stream and the side output each
//! end in a sink of their own.
//!
//! cargo run --example side_output

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tidemark::dataflow::operator::OutputTag;
use tidemark::dataflow::source::Items;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Transfer {
    account: String,
    region: String,
    amount: i64,
}

/// An account's balance after a transfer.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Balance {
    account: String,
    region: String,
    balance: i64,
}

/// A transfer at least this large is an anomaly.
const LARGE: i64 = 1_000;

/// Stage 1, per account: the running balance, anomalies to `anomalies`.
struct Balances {
    balance: ValueState<i64>,
    anomalies: OutputTag<String>,
}

impl KeyedProcessFunction<String, Transfer, Balance> for Balances {
    fn process(
        &mut self,
        t: Transfer,
        ctx: &mut KeyedContext<'_, String>,
        out: &mut Collector<'_, Balance>,
    ) {
        let mut entry = ctx.value(&self.balance);
        let balance = entry.get_or_default();
        *balance += t.amount;
        let balance = *balance;
        if t.amount.abs() >= LARGE {
            let text = format!("{}: large transfer of {}", t.account, t.amount);
            out.output(&self.anomalies, text);
        }
        if balance < 0 {
            let text = format!("{}: overdrawn to {balance}", t.account);
            out.output(&self.anomalies, text);
        }
        out.collect(Balance {
            account: t.account,
            region: t.region,
            balance,
        });
    }
}

/// Stage 2, per region: the latest balance of each account, summed at the
/// end of input.
struct Regions {
    latest: ValueState<BTreeMap<String, i64>>,
}

impl KeyedProcessFunction<String, Balance, (String, i64)> for Regions {
    fn process(
        &mut self,
        b: Balance,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, i64)>,
    ) {
        ctx.value(&self.latest)
            .get_or_default()
            .insert(b.account, b.balance);
    }

    fn end_input(&mut self, states: AllKeys<'_, String>, out: &mut Collector<'_, (String, i64)>) {
        for (region, accounts) in states.values(&self.latest) {
            out.collect((region, accounts.values().sum()));
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let transfer = |account: &str, region: &str, amount| Transfer {
        account: account.into(),
        region: region.into(),
        amount,
    };
    // One source subtask reads them in this order (parallelism 1 below):
    // each account's transfers reach stage 1 in it.
    let transfers = Arc::new(vec![
        transfer("ann", "north", 500),
        transfer("bob", "north", 200),
        transfer("cid", "south", 1_500),
        transfer("bob", "north", -350),
        transfer("ann", "north", -100),
        transfer("dee", "south", 50),
        transfer("cid", "south", -400),
    ]);
    let totals = Arc::new(Mutex::new(Vec::new()));
    let anomalies = Arc::new(Mutex::new(Vec::new()));

    let job = Job::builder("balances").parallelism(2);
    let tag = OutputTag::<String>::new("anomalies");
    let stage1_tag = tag.clone();
    let balances = job
        .source("transfers", move |ctx| Items::new(transfers.clone(), ctx))
        .parallelism(1)
        .key_by(|t: &Transfer| t.account.clone())
        .process("balances", move |states| Balances {
            balance: states.value("balance"),
            anomalies: stage1_tag.clone(),
        });
    let found = anomalies.clone();
    balances
        .side_output(&tag)
        .sink("anomalies", move |_| Collect::new(found.clone()));
    let collected = totals.clone();
    balances
        .key_by(|b: &Balance| b.region.clone())
        .process("regions", |states| Regions {
            latest: states.value("latest"),
        })
        .sink("totals", move |_| Collect::new(collected.clone()))
        .build()
        .run()?
        .wait()?;

    let mut anomalies = anomalies.lock().map_err(|_| "poisoned")?.clone();
    anomalies.sort();
    println!("anomalies (side output):");
    for a in &anomalies {
        println!("  {a}");
    }
    let mut totals = totals.lock().map_err(|_| "poisoned")?.clone();
    totals.sort();
    println!("balance per region (stage 2):");
    for (region, total) in &totals {
        println!("  {region:<5} {total}");
    }
    Ok(())
}
