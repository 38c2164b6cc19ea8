//! The workload: P worker processes (this binary re-spawned with the role `worker`), each with
//! the default lock manager over the store under test, looping `lock_with(K, wait)` → a begin
//! write to the fenced resource with its token → a few ms of work → a commit write → release.
//! Each worker records what its guard told it — held, lost and why, the release's answer, failed
//! acquisitions and how long they took — as JSON lines in a file of its own.

use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_redis::{RedisConfig, RedisStore};

use super::clock::now_ns;
use super::deployment::{StoreKind, CLIENT_ID, ENTITY, FARM_ID};
use super::history::{AcquireFailure, Acquisition, ReleaseOutcome, WorkerEvent, WriteOutcome};
use super::resource::ResourceClient;
use super::ROLE_ENV;

/// The role a worker process is spawned with.
pub const ROLE: &str = "worker";
/// The environment variable a worker reads its [`WorkerConfig`] from (JSON-free, `;`-separated).
pub const CONFIG_ENV: &str = "NEMESIS_WORKER";

/// How the workers reach the store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Which store.
    pub kind: StoreKind,
    /// Its URL (Aerospike: its hosts).
    pub url: String,
    /// Redis: `min_replicas(n, 500 ms)` when not 0.
    pub min_replicas: u32,
    /// The lease TTL (`LockManagerBuilder::lock_ttl`): the watchdog renews every third of it.
    pub ttl: Duration,
}

impl StoreConfig {
    /// The default lock manager over this store: client `nemesis`, farm `f1`, this TTL, and
    /// nothing else changed.
    pub async fn manager(&self) -> leasehold::Result<LockManager> {
        let builder = LockManager::builder()
            .client_id(CLIENT_ID)
            .farm_id(FARM_ID)
            .lock_ttl(self.ttl);
        let builder = match self.kind {
            StoreKind::Redis | StoreKind::RedisCluster | StoreKind::Sentinel => {
                let mut config = RedisConfig::new(self.url.clone());
                if self.min_replicas > 0 {
                    config = config.min_replicas(self.min_replicas, Duration::from_millis(500));
                }
                builder.store(RedisStore::connect(config).await?)
            }
            StoreKind::Etcd => {
                builder.store(EtcdStore::connect(EtcdConfig::from_url(&self.url)?).await?)
            }
            StoreKind::Aerospike => builder.store(
                AerospikeStore::connect(AerospikeConfig::new(
                    self.url.clone(),
                    super::aerospike_node::NAMESPACE,
                    FARM_ID,
                ))
                .await?,
            ),
        };
        builder.build()
    }
}

/// What one worker process is told.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Its number.
    pub worker: usize,
    /// The store.
    pub store: StoreConfig,
    /// How long one `lock_with` waits.
    pub wait: Duration,
    /// The work between the begin and the commit write.
    pub hold: Duration,
    /// The fenced resource.
    pub resource: SocketAddr,
    /// No acquisition starts after this (machine-wide clock, ns).
    pub deadline_ns: u64,
    /// Where its history goes.
    pub history: PathBuf,
}

impl WorkerConfig {
    /// As one environment value.
    pub fn to_env(&self) -> String {
        [
            self.worker.to_string(),
            self.store.kind.name().to_owned(),
            self.store.url.clone(),
            self.store.min_replicas.to_string(),
            self.store.ttl.as_millis().to_string(),
            self.wait.as_millis().to_string(),
            self.hold.as_millis().to_string(),
            self.resource.to_string(),
            self.deadline_ns.to_string(),
            self.history.display().to_string(),
        ]
        .join(";")
    }

    /// Parses [`to_env`](Self::to_env)'s value.
    pub fn from_env(value: &str) -> io::Result<Self> {
        let bad = |what: &str| io::Error::other(format!("bad worker config ({what}): {value}"));
        let f: Vec<&str> = value.splitn(10, ';').collect();
        if f.len() != 10 {
            return Err(bad("fields"));
        }
        let ms = |s: &str| s.parse().map(Duration::from_millis).map_err(|_| bad(s));
        Ok(WorkerConfig {
            worker: f[0].parse().map_err(|_| bad("worker"))?,
            store: StoreConfig {
                kind: f[1].parse().map_err(|e: String| bad(&e))?,
                url: f[2].to_owned(),
                min_replicas: f[3].parse().map_err(|_| bad("min_replicas"))?,
                ttl: ms(f[4])?,
            },
            wait: ms(f[5])?,
            hold: ms(f[6])?,
            resource: f[7].parse().map_err(|_| bad("resource"))?,
            deadline_ns: f[8].parse().map_err(|_| bad("deadline"))?,
            history: PathBuf::from(f[9]),
        })
    }

    /// Starts a worker process running `exe` (the nemesis binary) with this config; its
    /// stderr goes to `<history>.log`.
    pub fn spawn(&self, exe: &Path) -> io::Result<Child> {
        let log = std::fs::File::create(self.history.with_extension("log"))?;
        Command::new(exe)
            .env(ROLE_ENV, ROLE)
            .env(CONFIG_ENV, self.to_env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
    }
}

/// A worker process's main.
pub fn main(config: WorkerConfig) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(config))
}

async fn run(config: WorkerConfig) -> io::Result<()> {
    let locks = config.store.manager().await.map_err(io::Error::other)?;
    let mut resource = ResourceClient::connect(config.resource, config.worker).await?;
    let mut out = BufWriter::new(std::fs::File::create(&config.history)?);
    let mut seq = 0u64;
    while now_ns() < config.deadline_ns {
        let asked_ns = now_ns();
        let event = match locks
            .lock_with(ENTITY, LockOptions::new().wait(config.wait))
            .await
        {
            Err(error) => WorkerEvent::Failed(AcquireFailure {
                worker: config.worker,
                asked_ns,
                failed_ns: now_ns(),
                kind: error.kind().as_str().to_owned(),
                message: error.chain().to_string(),
            }),
            Ok(guard) => {
                let acquired_ns = now_ns();
                let token = guard.fencing_token();
                let mut lost: Option<(u64, String)> = None;
                let writes = {
                    let mut section = pin!(async {
                        let begin = resource.write(seq, 1, token).await;
                        tokio::time::sleep(config.hold).await;
                        let commit = resource.write(seq, 2, token).await;
                        [begin, commit]
                    });
                    let mut lost_signal = pin!(guard.lost());
                    // The writes go out whatever the guard says (a paused process could not
                    // have checked either); a loss is noted when the guard reports it.
                    loop {
                        tokio::select! {
                            writes = &mut section => break writes,
                            error = &mut lost_signal, if lost.is_none() => {
                                lost = Some((now_ns(), error.chain().to_string()));
                            }
                        }
                    }
                };
                if lost.is_none() && !guard.is_held() {
                    lost = Some((now_ns(), guard.lost().await.chain().to_string()));
                }
                if lost.is_none() && writes.contains(&WriteOutcome::Rejected) {
                    // The fence saw a newer holder: the guard should learn it at its next
                    // renewal, within a third of the TTL (plus retries while the store is down).
                    let wait = config.store.ttl * 2;
                    if let Ok(error) = tokio::time::timeout(wait, guard.lost()).await {
                        lost = Some((now_ns(), error.chain().to_string()));
                    }
                }
                let release_ns = now_ns();
                let release = match guard.release().await {
                    Ok(true) => ReleaseOutcome::Released,
                    Ok(false) => ReleaseOutcome::NotOurs,
                    Err(error) => ReleaseOutcome::Failed(error.chain().to_string()),
                };
                let (lost_ns, lost_reason) = match lost {
                    Some((at, reason)) => (Some(at), Some(reason)),
                    None => (None, None),
                };
                let event = WorkerEvent::Acquired(Acquisition {
                    worker: config.worker,
                    seq,
                    token,
                    asked_ns,
                    acquired_ns,
                    writes,
                    lost_ns,
                    lost_reason,
                    release_ns,
                    released_ns: now_ns(),
                    release,
                });
                seq += 1;
                event
            }
        };
        serde_json::to_writer(&mut out, &event)?;
        out.write_all(b"\n")?;
        // Line by line: a worker that dies leaves its history up to its last acquisition.
        out.flush()?;
    }
    out.flush()?;
    let _ = locks.shutdown().await;
    Ok(())
}

/// Reads a worker's history file.
pub fn read_history(path: &Path) -> io::Result<Vec<WorkerEvent>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(io::Error::other))
        .collect()
}
