//! A real worker, called as a driver would call it: which deployments it
//! admits.

use super::{serve, WorkerConfig};
use crate::control::worker_client::WorkerClient;
use crate::control::{Commands, Deploy, FromWorker, ToWorker};
use crate::job::job_id;
use std::sync::Arc;
use std::time::Duration;
use tidemark_core::checkpoint::lease::LeaseConfig;
use tidemark_core::checkpoint::CheckpointConfig;
use tidemark_core::cluster::attempts::RunAttempt;
use tidemark_core::dataflow::source::Items;
use tidemark_core::job::{Job, JobConfig};
use tidemark_core::model::ids::Attempt;
use tidemark_storage::lease::Lease;
use tidemark_storage::CheckpointStorage;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

const NAME: &str = "worker-admission";

fn job(checkpoints: &str) -> Job {
    Job::builder(NAME)
        .config(JobConfig::default().checkpointing(CheckpointConfig::new(checkpoints)))
        .source("numbers", |ctx| Items::new(Arc::new(vec![1u64, 2, 3]), ctx))
        .sink("discard", |_| crate::sinks::Discard)
        .build()
}

/// A worker in a thread of this process, rebuilding `job`: its client.
async fn worker(checkpoints: &str) -> WorkerClient<Channel> {
    let control = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let options = WorkerConfig {
        control,
        data: "127.0.0.1:0".parse().unwrap(),
        advertise: None,
        threads: 1,
        exit_with_stdin: false,
        tls: None,
        insecure: false,
    };
    let dir = checkpoints.to_owned();
    std::thread::spawn(move || serve(options, Arc::new(move |_| Ok(job(&dir)))));
    let url = format!("http://{control}");
    for _ in 0..500 {
        if let Ok(client) = WorkerClient::connect(url.clone()).await {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the worker at {control} never answered");
}

/// Opens an attempt call for `run` deploying all of `job` on the worker;
/// its first answer.
async fn deploy(
    client: &mut WorkerClient<Channel>,
    run: RunAttempt,
    checkpoints: &str,
) -> Result<FromWorker, tonic::Status> {
    let (commands, receiver) = Commands::channel(run);
    commands.send(ToWorker::Deploy(Box::new(Deploy {
        recipe: Vec::new(),
        graph: job(checkpoints).graph,
        worker: 0,
        workers: 1,
        peers: vec![String::new()],
        restore: None,
    })));
    let call = client
        .attempt(UnboundedReceiverStream::new(receiver))
        .await?;
    let first = call.into_inner().message().await?.expect("an answer");
    drop(commands);
    Ok(FromWorker::open(&first, run.attempt).unwrap())
}

#[tokio::test]
async fn a_worker_admits_only_the_attempts_of_the_directorys_lease_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().to_str().unwrap();
    let storage = CheckpointStorage::open(checkpoints, job_id(NAME)).unwrap();
    let lease = Lease::acquire(&storage, &LeaseConfig::default())
        .await
        .unwrap();
    let run = |epoch, attempt| RunAttempt {
        job: job_id(NAME),
        epoch,
        attempt: Attempt(attempt),
    };
    let mut client = worker(checkpoints).await;

    // A caller claiming a later epoch than the lease is refused before it
    // can stop anything, and says why.
    let forged = deploy(&mut client, run(u64::MAX, 0), checkpoints)
        .await
        .unwrap_err();
    assert_eq!(forged.code(), tonic::Code::FailedPrecondition);
    let why = forged.message();
    assert!(why.contains("it is leased at epoch 1"), "{why}");

    // The lease holder's attempt runs.
    let epoch = lease.holder().epoch;
    let deployed = deploy(&mut client, run(epoch, 0), checkpoints).await;
    assert!(matches!(deployed, Ok(FromWorker::Deployed)), "{deployed:?}");
    // A later epoch than the lease still cannot displace it.
    let forged = deploy(&mut client, run(epoch + 1, 1), checkpoints)
        .await
        .unwrap_err();
    assert!(forged.message().contains("leased at epoch"), "{forged:?}");
}
