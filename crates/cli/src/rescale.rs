//! `tidemark rescale`: a client of a running job's REST API, like
//! `tidemark savepoint`. It asks every vertex for the parallelism given
//! (Flink's `PUT /jobs/{id}/resource-requirements`) and follows the
//! rescale history until the job runs at it, or the rescale failed.

use crate::client::{Client, Connect};
use crate::CliError;
use clap::Args;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `tidemark rescale`.
#[derive(Clone, Debug, Args)]
pub struct RescaleArgs {
    /// The job.
    #[command(flatten)]
    pub connect: Connect,
    /// The parallelism every vertex of the job is to run at.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub parallelism: u32,
    /// How long to wait for the job to run at it.
    #[arg(long, default_value = "10min", value_parser = crate::config::values::flag_duration)]
    pub timeout: Duration,
}

/// Asks for the parallelism and waits until the job runs at it; returns
/// what happened, for people.
pub fn rescale(args: &RescaleArgs) -> Result<String, CliError> {
    let client = Client::new(&args.connect)?;
    let job = client.job(args.connect.job.as_deref())?;
    let vertices = client.call("GET", &format!("/jobs/{job}"), None)?["vertices"].clone();
    let vertices = vertices.as_array().cloned().unwrap_or_default();
    let n = args.parallelism;
    let history = format!("/jobs/{job}/rescales/history");
    // A rescale under way takes the new requirements over; an ended one
    // is not this one.
    let newest = client.call("GET", &history, None)?[0].clone();
    let before = newest["rescaleUuid"].clone();
    let open = !newest.is_null() && newest["terminalState"].is_null();
    if !open && vertices.iter().all(|v| v["parallelism"] == n) {
        return Ok(format!("the job already runs at parallelism {n}"));
    }
    let requirements: serde_json::Map<String, Value> = vertices
        .iter()
        .filter_map(|v| v["id"].as_str())
        .map(|id| {
            let bounds = json!({ "lowerBound": 1, "upperBound": n });
            (id.to_owned(), json!({ "parallelism": bounds }))
        })
        .collect();
    let path = format!("/jobs/{job}/resource-requirements");
    client.call("PUT", &path, Some(Value::Object(requirements)))?;
    let deadline = Instant::now() + args.timeout;
    loop {
        let newest = client.call("GET", &history, None)?[0].clone();
        let ours = open || newest["rescaleUuid"] != before;
        if ours && !newest["terminalState"].is_null() {
            return ended(&client, &job, &newest, n);
        }
        if Instant::now() >= deadline {
            return Err(client.fail(format!(
                "the job did not run at parallelism {n} within {}",
                humantime::format_duration(args.timeout)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a rescale that ended comes to: how long the job paused, or why it
/// did not rescale.
fn ended(client: &Client, job: &str, rescale: &Value, n: u32) -> Result<String, CliError> {
    let uuid = rescale["rescaleUuid"].as_str().unwrap_or_default();
    let details = client.call("GET", &format!("/jobs/{job}/rescales/details/{uuid}"), None)?;
    let states = details["schedulerStates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match rescale["terminalState"].as_str() {
        Some("COMPLETED") => {
            let paused = states
                .iter()
                .find(|s| s["state"] == "Restarting")
                .map_or(Value::Null, |s| s["durationInMillis"].clone());
            let took = rescale["endTimestampInMillis"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(rescale["startTimestampInMillis"].as_u64().unwrap_or(0));
            Ok(format!(
                "rescaled to parallelism {n} in {took} ms; the job paused {paused} ms"
            ))
        }
        Some("FAILED") => {
            let cause = states
                .first()
                .and_then(|s| s["stringifiedException"].as_str())
                .unwrap_or("no cause given");
            Err(client.fail(format!("the rescale failed: {cause}")))
        }
        _ => Err(client.fail(format!(
            "the rescale was not carried out: {}",
            rescale["terminatedReason"]
        ))),
    }
}
