//! `/metrics` in the Prometheus text format (version 0.0.4).

use super::JobView;
use actix_web::{web, HttpResponse};
use std::fmt::Write;
use std::sync::atomic::Ordering;
use tidemark_core::checkpoint::stats;

/// Writes the Prometheus exposition, one family at a time.
struct Exposition {
    out: String,
    job: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP tidemark_{name} {help}");
        let _ = writeln!(self.out, "# TYPE tidemark_{name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "tidemark_{name}{{job=\"{}\"", escape(&self.job));
        for (label, value) in labels {
            let _ = write!(self.out, ",{label}=\"{}\"", escape(value));
        }
        let _ = writeln!(self.out, "}} {value}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// Label values escape backslash, double quote and line feed.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(super) async fn metrics(view: web::Data<JobView>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(exposition(&view))
}

fn exposition(view: &JobView) -> String {
    let mut e = Exposition {
        out: String::new(),
        job: view.name.clone(),
    };
    let subtasks = view.metrics.subtasks();
    // Names need not be unique; the vertex id is.
    let vertex_of = |operator| {
        view.vertices
            .iter()
            .find(|v| v.operator == operator)
            .map_or(("", ""), |v| (v.name.as_str(), v.id.as_str()))
    };
    for (family, help, read) in [
        (
            "records_in_total",
            "Records taken in by the operator's subtasks: read by a source, received otherwise.",
            (|c: &crate::metrics::SubtaskCounters| c.records_in() as f64) as fn(&_) -> f64,
        ),
        (
            "records_out_total",
            "Records the operator's subtasks sent downstream.",
            |c| c.records_out() as f64,
        ),
        (
            "backpressured_seconds_total",
            "Time the subtask held output back for lack of credit, taking no input.",
            |c| c.backpressured().as_secs_f64(),
        ),
    ] {
        e.family(family, "counter", help);
        for (id, counters) in &subtasks {
            let subtask = id.index.0.to_string();
            let (name, vertex) = vertex_of(id.operator);
            let labels = [
                ("operator", name),
                ("vertex", vertex),
                ("subtask", subtask.as_str()),
            ];
            e.sample(family, &labels, read(counters));
        }
    }
    let (counts, last) = {
        let tracker = stats::lock(&view.metrics.checkpoint_stats);
        (tracker.counts(), tracker.latest_completed().cloned())
    };
    e.family(
        "checkpoints",
        "gauge",
        "Checkpoints and savepoints by status, over the job's life.",
    );
    for (status, n) in [
        ("completed", counts.completed),
        ("failed", counts.failed),
        ("in_progress", counts.in_progress),
    ] {
        e.sample("checkpoints", &[("status", status)], n as f64);
    }
    e.single(
        "checkpoints_restored_total",
        "counter",
        "Restores from a checkpoint or savepoint.",
        counts.restored as f64,
    );
    let last = last.as_ref();
    let totals = last.map(|c| c.totals()).unwrap_or_default();
    let alignment = last
        .into_iter()
        .flat_map(|c| c.operators.iter().flat_map(|o| o.subtasks.iter().flatten()))
        .map(|s| s.metrics.alignment.as_secs_f64())
        .fold(0.0, f64::max);
    e.single(
        "checkpoint_last_duration_seconds",
        "gauge",
        "Trigger to completion of the latest completed checkpoint.",
        last.map_or(0, |c| c.end_to_end_duration()) as f64 / 1e3,
    );
    e.single(
        "checkpoint_last_state_size_bytes",
        "gauge",
        "Whole state the latest completed checkpoint references.",
        totals.state_size as f64,
    );
    e.single(
        "checkpoint_last_checkpointed_size_bytes",
        "gauge",
        "Bytes the latest completed checkpoint wrote itself.",
        totals.checkpointed_size as f64,
    );
    e.single(
        "checkpoint_last_processed_bytes",
        "gauge",
        "Bytes processed while aligning, latest completed checkpoint.",
        totals.processed_data as f64,
    );
    e.single(
        "checkpoint_last_persisted_bytes",
        "gauge",
        "In-flight bytes persisted by the latest completed checkpoint.",
        totals.persisted_data as f64,
    );
    e.single(
        "checkpoint_last_alignment_seconds",
        "gauge",
        "Longest alignment of any subtask in the latest completed checkpoint.",
        alignment,
    );
    let restarts = view.metrics.checkpoints.restarts.load(Ordering::Relaxed);
    e.single(
        "restarts_total",
        "counter",
        "Restarts after failures.",
        restarts as f64,
    );
    let records = view.metrics.records_in();
    e.single(
        "source_records_total",
        "counter",
        "Records read by all sources, replays included.",
        records as f64,
    );
    if let Some(lag) = view.metrics.time.watermark_lag() {
        e.single(
            "watermark_lag_seconds",
            "gauge",
            "Largest source timestamp minus the watermark that reached the keyed operators.",
            lag as f64 / 1e3,
        );
    }
    e.out
}
