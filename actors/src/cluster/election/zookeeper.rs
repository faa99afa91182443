//! Leader election of a job's drivers through ZooKeeper, as Flink's
//! `high-availability.type: zookeeper`: each candidate adds an ephemeral
//! sequential node under `<root>/<cluster-id>/leader` (Curator's
//! `LeaderLatch` layout), and the lowest leads. A leader whose session
//! expires (it was paused or cut off past the session timeout) loses its
//! node, so the next candidate leads; a leader that loses its connection
//! stops leading at once, as Flink revokes leadership on a suspended
//! connection.
//!
//! The leader keeps the job's latest completed checkpoint under
//! `<cluster>/checkpoints/latest` and, when the job ran to its end, marks
//! `<cluster>/finished`; both writes are transactions that check the
//! leader's own node, so a leader whose session is gone writes nothing.
//! A new leader refuses to run when the checkpoint storage it would
//! restore from lacks the checkpoint ZooKeeper names.

use super::ElectionError;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark_core::model::ids::CheckpointId;
use tidemark_storage::CheckpointStorage;
use zookeeper_client as zk;

/// Where and how to reach ZooKeeper, and under which path the job's
/// election lives (Flink's `high-availability.zookeeper.*` options).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZooKeeperConfig {
    /// `host:port` pairs, comma-separated.
    pub quorum: String,
    /// The root of every Tidemark cluster's nodes.
    pub root: String,
    /// This job's nodes under the root.
    pub cluster_id: String,
    /// How long the session lives without the client being heard from:
    /// a paused leader leads no longer than this.
    pub session_timeout: Duration,
    /// How long a connection attempt may take.
    pub connection_timeout: Duration,
}

impl ZooKeeperConfig {
    /// `<root>/<cluster-id>`, with single slashes.
    pub fn cluster_path(&self) -> String {
        let root = self.root.trim_matches('/');
        let id = self.cluster_id.trim_matches('/');
        [root, id]
            .iter()
            .filter(|part| !part.is_empty())
            .fold(String::new(), |path, part| format!("{path}/{part}"))
    }

    fn leader_dir(&self) -> String {
        format!("{}/leader", self.cluster_path())
    }

    fn finished_path(&self) -> String {
        format!("{}/finished", self.cluster_path())
    }

    fn pointer_path(&self) -> String {
        format!("{}/checkpoints/latest", self.cluster_path())
    }
}

/// The job's latest completed checkpoint, as its leader records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointPointer {
    /// Its id.
    pub checkpoint: CheckpointId,
    /// Its directory, as its storage names it.
    pub path: String,
}

/// One driver's part in the election.
pub struct ZooKeeperElection {
    config: ZooKeeperConfig,
    identity: String,
    client: Option<zk::Client>,
    /// This driver's node, while it leads.
    latch: Option<zk::OwnedLockClient>,
    /// The pointer last written.
    written: Option<CheckpointPointer>,
}

/// How often a leader looks for a newer completed checkpoint to record.
const POINTER_PERIOD: Duration = Duration::from_millis(200);

impl ZooKeeperElection {
    /// A candidate named `identity`.
    pub fn new(config: ZooKeeperConfig, identity: &str) -> Self {
        ZooKeeperElection {
            config,
            identity: identity.to_string(),
            client: None,
            latch: None,
            written: None,
        }
    }

    /// The job's node, as errors name it.
    pub fn record(&self) -> String {
        format!("ZooKeeper node {}", self.config.cluster_path())
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ElectionError {
        ElectionError::ZooKeeper {
            quorum: self.config.quorum.clone(),
            message: format!("{what}: {e}"),
        }
    }

    fn persistent() -> zk::CreateOptions<'static> {
        zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
    }

    /// Waits until this driver leads; fails when ZooKeeper cannot be
    /// reached within the session timeout, or the job already ran to its
    /// end. A standby whose session expires while it waits (it was paused,
    /// or cut off) contends again with a new one.
    pub async fn acquire(&mut self) -> Result<(), ElectionError> {
        let (client, latch) = loop {
            let client = self.connect().await?;
            match self.contend(&client).await {
                Ok(latch) => break (client, latch),
                Err(zk::Error::SessionExpired) => {
                    tracing::warn!(identity = %self.identity, "the standby's ZooKeeper session expired; contending again");
                }
                Err(e) => {
                    let leader_dir = self.config.leader_dir();
                    return Err(self.failed(&format!("contending under {leader_dir}"), e));
                }
            }
        };
        // A leader that finished while this one waited released its node.
        self.finished(&client).await?;
        tracing::info!(node = latch.lock_path(), identity = %self.identity, "leading");
        self.latch = Some(latch);
        self.client = Some(client);
        Ok(())
    }

    async fn connect(&self) -> Result<zk::Client, ElectionError> {
        let client = zk::Client::connector()
            .with_session_timeout(self.config.session_timeout)
            .with_connection_timeout(self.config.connection_timeout)
            .connect(&self.config.quorum)
            .await
            .map_err(|e| {
                let within = self.config.session_timeout;
                self.failed(&format!("no session within {within:?}"), e)
            })?;
        self.finished(&client).await?;
        let checkpoints = format!("{}/checkpoints", self.config.cluster_path());
        client
            .mkdir(&checkpoints, &Self::persistent())
            .await
            .map_err(|e| self.failed(&format!("making {checkpoints}"), e))?;
        Ok(client)
    }

    /// Adds this driver's node and waits until it is the lowest.
    async fn contend(&self, client: &zk::Client) -> Result<zk::OwnedLockClient, zk::Error> {
        let leader_dir = self.config.leader_dir();
        let prefix = zk::LockPrefix::new_curator(&leader_dir, "latch-")?;
        let options = zk::LockOptions::new(zk::Acls::anyone_all())
            .with_ancestor_options(Self::persistent())?;
        let latch = client
            .lock(prefix, self.identity.as_bytes(), options)
            .await?;
        Ok(latch.into_owned())
    }

    async fn finished(&self, client: &zk::Client) -> Result<(), ElectionError> {
        let path = self.config.finished_path();
        match client.get_data(&path).await {
            Ok((holder, _)) => Err(ElectionError::Finished {
                record: format!("ZooKeeper node {path}"),
                holder: String::from_utf8_lossy(&holder).into_owned(),
            }),
            Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(self.failed(&format!("reading {path}"), e)),
        }
    }

    /// The checkpoint ZooKeeper names as the job's latest.
    pub async fn latest(&self) -> Result<Option<CheckpointPointer>, ElectionError> {
        let client = self.client.as_ref().expect("read by a leader");
        let path = self.config.pointer_path();
        match client.get_data(&path).await {
            Ok((bytes, _)) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                self.failed(&format!("{path} is not a Tidemark checkpoint pointer"), e)
            }),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.failed(&format!("reading {path}"), e)),
        }
    }

    /// Refuses to run when `storage` (the job directory this driver would
    /// restore from) lacks the checkpoint ZooKeeper names as the latest.
    pub async fn check_latest(&self, storage: &CheckpointStorage) -> Result<(), ElectionError> {
        let Some(pointer) = self.latest().await? else {
            return Ok(());
        };
        let missing = |found: String| ElectionError::LatestCheckpointMissing {
            service: format!("ZooKeeper node {}", self.config.pointer_path()),
            checkpoint: pointer.checkpoint,
            directory: pointer.path.clone(),
            found,
        };
        let expected = storage.location(&CheckpointStorage::checkpoint_dir(pointer.checkpoint));
        if expected != pointer.path {
            return Err(missing(format!(
                "this driver's checkpoints are under {}",
                storage.directory()
            )));
        }
        let newest = storage
            .completed_ids()
            .await
            .map_err(|e| missing(format!("listing {} failed: {e}", storage.directory())))?
            .into_iter()
            .max();
        match newest {
            Some(newest) if newest >= pointer.checkpoint => Ok(()),
            Some(newest) => Err(missing(format!("the newest one there is {newest}"))),
            None => Err(missing("there is none there".into())),
        }
    }

    /// Records the job's latest completed checkpoint (from `latest`) for as
    /// long as this driver leads, and says why it stopped.
    pub async fn keep(
        &mut self,
        mut latest: impl FnMut() -> Option<CheckpointPointer>,
    ) -> ElectionError {
        let Some(client) = self.client.clone() else {
            return self.lost("it was not leading");
        };
        let mut states = client.state_watcher();
        loop {
            let state = states.peek_state();
            if state != zk::SessionState::SyncConnected {
                return self.lost(&format!("its ZooKeeper session is {state}"));
            }
            let changed = tokio::time::timeout(POINTER_PERIOD, states.changed()).await;
            if changed.is_ok() {
                continue;
            }
            let Some(pointer) = latest().filter(|p| Some(p) != self.written.as_ref()) else {
                continue;
            };
            if let Err(e) = self.write_pointer(&pointer).await {
                return e;
            }
        }
    }

    /// Writes `pointer` if this driver's node still stands.
    async fn write_pointer(&mut self, pointer: &CheckpointPointer) -> Result<(), ElectionError> {
        let latch = self.latch.as_ref().expect("written by a leader");
        let path = self.config.pointer_path();
        let bytes = serde_json::to_vec(pointer).expect("a pointer serializes");
        let written = match latch.set_data(&path, &bytes, None).await {
            Err(zk::Error::NoNode) => latch
                .create(&path, &bytes, &Self::persistent())
                .await
                .map(|_| ()),
            written => written.map(|_| ()),
        };
        match written {
            Ok(()) => {
                self.written = Some(pointer.clone());
                Ok(())
            }
            Err(zk::Error::RuntimeInconsistent) => Err(self.lost("its node is gone")),
            Err(e) => Err(self.lost(&format!("recording {} failed: {e}", pointer.checkpoint))),
        }
    }

    fn lost(&self, why: &str) -> ElectionError {
        ElectionError::Lost {
            record: self.record(),
            why: why.to_string(),
        }
    }

    /// Stops leading: records the job's last checkpoint and, when the job
    /// ran to its end, marks it finished, so that no standby runs it
    /// again; then deletes this driver's node and closes the session.
    pub async fn release(
        &mut self,
        finished: bool,
        last: Option<CheckpointPointer>,
    ) -> Result<(), ElectionError> {
        // A session that ended while the job did (a resumed leader's job
        // fails on its fenced directory) means the leadership was lost.
        let state = self.client.as_ref().map(|c| c.state());
        if let Some(state) = state.filter(|s| *s != zk::SessionState::SyncConnected) {
            self.latch = None;
            self.client = None;
            return Err(self.lost(&format!("its ZooKeeper session is {state}")));
        }
        if self.latch.is_none() {
            return match finished {
                true => Err(ElectionError::NotMarkedFinished {
                    record: self.record(),
                }),
                false => Ok(()),
            };
        }
        if let Some(pointer) = last.filter(|last| Some(last) != self.written.as_ref()) {
            // A failure here is the session's, which the mark then meets.
            let _ = self.write_pointer(&pointer).await;
        }
        let latch = self.latch.take().expect("checked above");
        let marked = if finished {
            let path = self.config.finished_path();
            let mark = latch
                .create(&path, self.identity.as_bytes(), &Self::persistent())
                .await;
            match mark {
                Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
                Err(_) => Err(ElectionError::NotMarkedFinished {
                    record: format!("ZooKeeper node {path}"),
                }),
            }
        } else {
            Ok(())
        };
        // Deleted now, so that a standby leads at once; the session closes
        // once the last of its clients is dropped.
        let _ = latch.client().delete(latch.lock_path(), None).await;
        drop(latch);
        self.client = None;
        marked
    }
}
