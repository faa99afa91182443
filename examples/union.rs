//! A union: two sources of different record types, each mapped to the
//! user it names, read as one stream and counted per user in one keyed
//! operator. Both sources' records reach the same count of a user.
//!
//! cargo run --example union

use std::sync::{Arc, Mutex};
use tidemark::dataflow::source::Items;
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;

/// Counts per user; emits every user's total once both inputs have ended.
struct Visits {
    count: ValueState<u64>,
}

impl KeyedProcessFunction<String, String, (String, u64)> for Visits {
    fn process(
        &mut self,
        _user: String,
        ctx: &mut KeyedContext<'_, String>,
        _out: &mut Collector<'_, (String, u64)>,
    ) {
        *ctx.value(&self.count).get_or_default() += 1;
    }

    fn end_input(&mut self, states: AllKeys<'_, String>, out: &mut Collector<'_, (String, u64)>) {
        for (user, count) in states.values(&self.count) {
            out.collect((user, count));
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Web server log lines: "user path".
    let web: Arc<Vec<String>> = Arc::new(
        [
            "ann /home",
            "bob /cart",
            "ann /cart",
            "cid /home",
            "ann /pay",
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    // App events: (user, screen number).
    let app: Arc<Vec<(String, u32)>> = Arc::new(
        [("bob", 1), ("bob", 2), ("dee", 1), ("ann", 3)]
            .map(|(user, screen)| (user.to_owned(), screen))
            .to_vec(),
    );
    let results = Arc::new(Mutex::new(Vec::new()));

    let job = Job::builder("union").parallelism(2);
    let web_users = job
        .source("web", move |ctx| Items::new(web.clone(), ctx))
        .map(|line: String| line.split(' ').next().unwrap_or_default().to_owned());
    let app_users = job
        .source("app", move |ctx| Items::new(app.clone(), ctx))
        .map(|(user, _screen): (String, u32)| user);
    let collected = results.clone();
    let report = web_users
        .union([app_users])
        .key_by(|user: &String| user.clone())
        .process("visits", |states| Visits {
            count: states.value("count"),
        })
        .sink("collect", move |_| Collect::new(collected.clone()))
        .build()
        .run()?
        .wait()?;

    let mut visits = results.lock().map_err(|_| "poisoned")?.clone();
    visits.sort();
    println!(
        "{} records from two sources; visits per user:",
        report.records_in
    );
    for (user, count) in &visits {
        println!("{user:>4} {count}");
    }
    assert_eq!(visits.iter().map(|(_, n)| n).sum::<u64>(), 9);
    Ok(())
}
