//! Rescaling a running job over REST, as Flink's adaptive scheduler:
//! `PUT /jobs/{jobid}/resource-requirements` takes each vertex's
//! parallelism bounds (the job runs at the upper bound), `GET` answers
//! what is asked for, and `/jobs/{jobid}/rescales/...` serve the rescale
//! history in Flink 2.3's shapes (FLIP-495): history, overview, summary
//! and details. Tidemark has no slots: a
//! rescale's `slots` are empty.

use super::{ApiError, JobView};
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tidemark_core::checkpoint::stats::StatsSummary;
use tidemark_core::cluster::rescale::{
    Requirements, Rescale, RescaleEnd, RescaleError, TriggerCause,
};

pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route(
            "/jobs/{jobid}/resource-requirements",
            web::get().to(requirements),
        )
        .route(
            "/jobs/{jobid}/resource-requirements",
            web::put().to(update_requirements),
        )
        .route("/jobs/{jobid}/rescales/history", web::get().to(history))
        .route("/jobs/{jobid}/rescales/overview", web::get().to(overview))
        .route("/jobs/{jobid}/rescales/summary", web::get().to(summary))
        .route(
            "/jobs/{jobid}/rescales/details/{rescaleuuid}",
            web::get().to(details),
        );
}

/// One vertex's bounds, as Flink's `JobVertexResourceRequirements`.
#[derive(Deserialize)]
struct VertexRequirements {
    parallelism: Bounds,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bounds {
    lower_bound: u32,
    upper_bound: u32,
}

async fn requirements(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let rescales = view.metrics.rescales();
    let desired = rescales.desired();
    let body: serde_json::Map<String, Value> = view
        .vertices
        .iter()
        .filter_map(|v| {
            let parallelism = desired.operators.get(v.operator.0 as usize)?.parallelism;
            let bounds = json!({ "lowerBound": 1, "upperBound": parallelism });
            Some((v.id.clone(), json!({ "parallelism": bounds })))
        })
        .collect();
    Ok(HttpResponse::Ok().json(body))
}

/// Flink answers 200 with `{}` once the requirements are taken; the
/// rescale follows, and the history tells how it went.
async fn update_requirements(
    view: web::Data<JobView>,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let bad = |message: String| ApiError::new(StatusCode::BAD_REQUEST, message);
    let asked: BTreeMap<String, VertexRequirements> =
        serde_json::from_slice(&body).map_err(|e| bad(format!("resource requirements: {e}")))?;
    if asked.is_empty() {
        return Err(bad(
            "Request body does not specify resource requirements.".into()
        ));
    }
    let mut requirements = Requirements::new();
    for (id, asked) in asked {
        let vertex = view.vertex(&id)?;
        let Bounds {
            lower_bound,
            upper_bound,
        } = asked.parallelism;
        if lower_bound > upper_bound {
            return Err(bad(format!(
                "vertex {id}: the lower bound {lower_bound} is above the upper bound {upper_bound}"
            )));
        }
        requirements.insert(vertex.operator, upper_bound);
    }
    let answer = view.control()?.request_rescale(requirements);
    let ended = || ApiError::new(StatusCode::CONFLICT, "the job has ended");
    match answer.await {
        Ok(Ok(())) => Ok(HttpResponse::Ok().json(json!({}))),
        Ok(Err(RescaleError::Ended)) | Err(_) => Err(ended()),
        Ok(Err(e @ RescaleError::Stopping)) => {
            Err(ApiError::new(StatusCode::CONFLICT, e.to_string()))
        }
        Ok(Err(e)) => Err(bad(e.to_string())),
    }
}

async fn history(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let rescales = view.metrics.rescales();
    let newest_first: Vec<Value> = rescales
        .history()
        .rev()
        .map(|r| view.rescale(r, false))
        .collect();
    Ok(HttpResponse::Ok().json(newest_first))
}

async fn overview(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let rescales = view.metrics.rescales();
    let mut latest: BTreeMap<&str, Value> = BTreeMap::new();
    for rescale in rescales.history() {
        let state = counted_as(rescale);
        if state != "inProgress" {
            latest.insert(state, view.rescale(rescale, false));
        }
    }
    let counts = counts(rescales.history());
    let latest: BTreeMap<&str, Value> = ["completed", "failed", "ignored"]
        .into_iter()
        .map(|state| (state, latest.remove(state).unwrap_or(Value::Null)))
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "rescalesCounts": counts, "latest": latest })))
}

/// The counts, and the durations of the rescales that ended, in all and
/// by how they ended.
async fn summary(
    view: web::Data<JobView>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    view.check_job(&path)?;
    let rescales = view.metrics.rescales();
    let durations = |state: Option<&str>| {
        let ended = rescales.history().filter(|r| {
            let of = counted_as(r);
            of != "inProgress" && state.is_none_or(|s| s == of)
        });
        let took = ended.map(|r| r.ended_ms.unwrap_or(0).saturating_sub(r.started_ms));
        super::checkpoints::summary(&StatsSummary::of(took.collect()))
    };
    Ok(HttpResponse::Ok().json(json!({
        "rescalesCounts": counts(rescales.history()),
        "rescalesDurationStatsInMillis": durations(None),
        "completedRescalesDurationStatsInMillis": durations(Some("completed")),
        "ignoredRescalesDurationStatsInMillis": durations(Some("ignored")),
        "failedRescalesDurationStatsInMillis": durations(Some("failed")),
    })))
}

/// How Flink's counts count `rescale`.
fn counted_as(rescale: &Rescale) -> &'static str {
    match terminal(rescale.end.as_ref()) {
        Some(("COMPLETED", _)) => "completed",
        Some(("FAILED", _)) => "failed",
        Some(_) => "ignored",
        None => "inProgress",
    }
}

fn counts<'a>(rescales: impl Iterator<Item = &'a Rescale>) -> BTreeMap<&'static str, u64> {
    let mut counts = BTreeMap::from([
        ("completed", 0),
        ("failed", 0),
        ("ignored", 0),
        ("inProgress", 0),
    ]);
    for rescale in rescales {
        *counts.entry(counted_as(rescale)).or_default() += 1;
    }
    counts
}

async fn details(
    view: web::Data<JobView>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (jid, uuid) = path.into_inner();
    view.check_job(&jid)?;
    let rescales = view.metrics.rescales();
    let rescale = rescales
        .history()
        .find(|r| view.rescale_uuid(r).eq_ignore_ascii_case(&uuid))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("Could not find rescale details of specified rescaleUuid {uuid}"),
            )
        })?;
    Ok(HttpResponse::Ok().json(view.rescale(rescale, true)))
}

/// Flink's terminal state and terminated reason.
fn terminal(end: Option<&RescaleEnd>) -> Option<(&'static str, &'static str)> {
    end.map(RescaleEnd::flink_names)
}

impl JobView {
    /// A rescale's id as Flink's: 32 hex characters, unique in the job.
    fn rescale_uuid(&self, rescale: &Rescale) -> String {
        format!("{:016x}{:016x}", self.job.0, rescale.id)
    }

    /// Flink's `JobRescaleDetails`; the history and overview give the
    /// short form, without vertices and scheduler states.
    fn rescale(&self, rescale: &Rescale, full: bool) -> Value {
        let (state, reason) = terminal(rescale.end.as_ref()).unzip();
        let cause = match rescale.cause {
            TriggerCause::UpdateRequirement => "UPDATE_REQUIREMENT",
        };
        let mut body = json!({
            "rescaleUuid": self.rescale_uuid(rescale),
            "resourceRequirementsUuid": format!("{:016x}{:016x}", !self.job.0, rescale.requirements),
            "rescaleAttemptId": 1,
            "vertices": {},
            "slots": {},
            "schedulerStates": [],
            "startTimestampInMillis": rescale.started_ms,
            "endTimestampInMillis": rescale.ended_ms,
            "terminalState": state,
            "triggerCause": cause,
            "terminatedReason": reason,
        });
        if full {
            body["vertices"] = self.rescaled_vertices(rescale);
            body["schedulerStates"] = scheduler_states(rescale);
        }
        body
    }

    fn rescaled_vertices(&self, rescale: &Rescale) -> Value {
        let done = rescale.end == Some(RescaleEnd::Succeeded);
        let vertices: serde_json::Map<String, Value> = self
            .vertices
            .iter()
            .map(|v| {
                let i = v.operator.0 as usize;
                let vertex = json!({
                    "jobVertexId": v.id,
                    "jobVertexName": v.name,
                    "slotSharingGroupId": format!("{:032x}", 0),
                    "slotSharingGroupName": "default",
                    "desiredParallelism": rescale.to.get(i),
                    "sufficientParallelism": rescale.to.get(i),
                    "preRescaleParallelism": rescale.from.get(i),
                    "postRescaleParallelism": rescale.to.get(i).filter(|_| done),
                });
                (v.id.clone(), vertex)
            })
            .collect();
        Value::Object(vertices)
    }
}

/// The old attempt executing until it was told to stop, then the job
/// restarting until the new one ran: the second span is the pause.
fn scheduler_states(rescale: &Rescale) -> Value {
    let failure = match &rescale.end {
        Some(RescaleEnd::Failed(reason)) => reason.clone(),
        _ => "(null)".into(),
    };
    let span = |state: &str, enter: u64, leave: Option<u64>, exception: &str| {
        json!({
            "state": state,
            "enterTimestampInMillis": enter,
            "leaveTimestampInMillis": leave,
            "durationInMillis": leave.map(|leave| leave.saturating_sub(enter)),
            "stringifiedException": exception,
        })
    };
    let executing_until = rescale.stopped_ms.or(rescale.ended_ms);
    let mut states = vec![span(
        "Executing",
        rescale.started_ms,
        executing_until,
        &failure,
    )];
    if let Some(stopped) = rescale.stopped_ms {
        states.push(span("Restarting", stopped, rescale.ended_ms, "(null)"));
    }
    Value::Array(states)
}
