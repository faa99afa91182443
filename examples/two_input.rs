//! A keyed two-input function with event-time timers: orders and payments,
//! two sources with watermarks, connected and keyed alike by order id. Both
//! inputs share each order's state and timers: an order waits for its
//! payment, and a timer at the order's deadline reports it unpaid if none
//! came. A payment may arrive before its order; it waits for it likewise.
//!
//! cargo run --example two_input

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::dataflow::source::Items;
use tidemark::dataflow::two_input::KeyedCoProcessFunction;
use tidemark::time::{Timestamped, WatermarkStrategy};
use tidemark_actors::prelude::*;
use tidemark_actors::sinks::Collect;

/// How long after its order a payment counts, in ms of event time.
const TIMEOUT_MS: u64 = 10_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    amount: u64,
    at_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Payment {
    order: u64,
    at_ms: u64,
}

impl Timestamped for Order {
    fn timestamp(&self) -> u64 {
        self.at_ms
    }
}

impl Timestamped for Payment {
    fn timestamp(&self) -> u64 {
        self.at_ms
    }
}

/// Matches each order with its payment, per order id.
struct Matcher {
    order: ValueState<Order>,
    payment: ValueState<Payment>,
}

/// Whether `payment` pays `order`: at most [`TIMEOUT_MS`] after it.
fn pays(payment: &Payment, order: &Order) -> bool {
    (order.at_ms..=order.at_ms + TIMEOUT_MS).contains(&payment.at_ms)
}

fn paid(order: &Order, payment: &Payment) -> String {
    format!(
        "order {} ({}): paid {} ms after it",
        order.id,
        order.amount,
        payment.at_ms - order.at_ms
    )
}

impl KeyedCoProcessFunction<u64, Order, Payment, String> for Matcher {
    fn process_left(
        &mut self,
        order: Order,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) {
        let waiting = ctx.value(&self.payment).get().cloned();
        if let Some(payment) = waiting.filter(|p| pays(p, &order)) {
            ctx.value(&self.payment).clear();
            ctx.delete_event_time_timer(payment.at_ms);
            return out.collect(paid(&order, &payment));
        }
        // Unpaid, unless its payment comes before the watermark passes this.
        ctx.register_event_time_timer(order.at_ms + TIMEOUT_MS);
        ctx.value(&self.order).set(order);
    }

    fn process_right(
        &mut self,
        payment: Payment,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) {
        let waiting = ctx.value(&self.order).get().cloned();
        if let Some(order) = waiting.filter(|o| pays(&payment, o)) {
            ctx.value(&self.order).clear();
            ctx.delete_event_time_timer(order.at_ms + TIMEOUT_MS);
            return out.collect(paid(&order, &payment));
        }
        // It came before its order (the sources are independent): every
        // order it can pay has arrived once the watermark passes it.
        ctx.register_event_time_timer(payment.at_ms);
        ctx.value(&self.payment).set(payment);
    }

    fn on_timer(
        &mut self,
        timestamp: u64,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) {
        let order = ctx.value(&self.order).get().cloned();
        if let Some(order) = order.filter(|o| o.at_ms + TIMEOUT_MS <= timestamp) {
            out.collect(format!("order {} ({}): unpaid", order.id, order.amount));
            ctx.value(&self.order).clear();
        }
        let payment = ctx.value(&self.payment).get().cloned();
        if let Some(payment) = payment.filter(|p| p.at_ms <= timestamp) {
            out.collect(format!(
                "payment for order {} at {} ms: no order it pays",
                payment.order, payment.at_ms
            ));
            ctx.value(&self.payment).clear();
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let order = |id, amount, at_ms| Order { id, amount, at_ms };
    let orders = Arc::new(vec![
        order(1, 30, 1_000),
        order(2, 12, 2_000),
        order(3, 99, 3_000),
        order(4, 45, 4_000),
        order(5, 7, 20_000),
    ]);
    let payment = |order, at_ms| Payment { order, at_ms };
    let payments = Arc::new(vec![
        payment(1, 4_000),
        payment(5, 20_500), // may arrive before its order
        payment(3, 15_000), // too late: order 3 is unpaid
        payment(2, 2_500),
        payment(9, 21_000), // no such order
    ]);
    let results = Arc::new(Mutex::new(Vec::new()));

    let job = Job::builder("orders-and-payments").parallelism(2);
    let strategy = WatermarkStrategy::bounded_out_of_orderness(Duration::from_secs(1));
    let orders = job
        .source_with_watermarks("orders", strategy, move |ctx| {
            Items::new(orders.clone(), ctx)
        })
        .key_by(|o: &Order| o.id);
    let payments = job
        .source_with_watermarks("payments", strategy, move |ctx| {
            Items::new(payments.clone(), ctx)
        })
        .key_by(|p: &Payment| p.order);
    let collected = results.clone();
    orders
        .connect(payments)
        .process("match", |states| Matcher {
            order: states.value("order"),
            payment: states.value("payment"),
        })
        .sink("collect", move |_| Collect::new(collected.clone()))
        .build()
        .run()?
        .wait()?;

    let mut lines = results.lock().map_err(|_| "poisoned")?.clone();
    lines.sort();
    for line in lines {
        println!("{line}");
    }
    Ok(())
}
