//! Embedding Tidemark: count words of a text in parallel, keep a running
//! count per word in keyed state, and collect the final counts in memory.
//!
//! cargo run --example embedded

use std::sync::{Arc, Mutex};
use tidemark::dataflow::source::Items;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;

/// Counts per word; emits every word's total once the input has ended.
struct WordCount {
    count: ValueState<u64>,
}

impl KeyedProcessFunction<String, String, (String, u64)> for WordCount {
    fn process(
        &mut self,
        _word: String,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, u64)>,
    ) {
        *ctx.value(&self.count).get_or_default() += 1;
    }

    fn end_input(&mut self, states: AllKeys<'_, String>, out: &mut Collector<'_, (String, u64)>) {
        for (word, count) in states.values(&self.count) {
            out.collect((word, count));
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lines: Vec<String> = [
        "the quick brown fox jumps over the lazy dog",
        "the dog sleeps and the fox runs",
        "a fox is quick and a dog is lazy",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let lines = Arc::new(lines);
    let results = Arc::new(Mutex::new(Vec::new()));

    let sink_results = results.clone();
    let report = Job::builder("embedded-wordcount")
        .parallelism(2)
        .source("lines", move |ctx| Items::new(lines.clone(), ctx))
        .flat_map(|line: String| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|word: &String| word.len() > 1)
        .key_by(|word: &String| word.clone())
        .process("count", |states| WordCount {
            count: states.value("count"),
        })
        .sink("collect", move |_| Collect::new(sink_results.clone()))
        .build()
        .run()?
        .wait()?;

    let mut counts = results.lock().map_err(|_| "poisoned")?.clone();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!("{} lines read; most frequent words:", report.records_in);
    for (word, count) in counts.iter().take(5) {
        println!("{count:>3} {word}");
    }
    Ok(())
}
