//! A whole run: start the deployment and the fenced resource, spawn the workers, run the
//! nemesis's schedule, stop, look for a lock left behind, read the histories and check them.

use std::io;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use super::checker::{self, History, Verdict};
use super::clock::now_ns;
use super::deployment::{Deployment, Durations, StoreKind, ENTITY};
use super::fault::FaultKind;
use super::history::WorkerEvent;
use super::resource::FencedResource;
use super::schedule::{self, Schedule};
use super::workload::{self, StoreConfig, WorkerConfig};

/// What a run is told.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The store.
    pub store: StoreKind,
    /// Redis: `min_replicas(n)` (0: off).
    pub min_replicas: u32,
    /// The faults to inject (each must be one the store supports).
    pub faults: Vec<FaultKind>,
    /// How long the workers run.
    pub duration: Duration,
    /// The nemesis's seed.
    pub seed: u64,
    /// How many worker processes.
    pub workers: usize,
    /// The lease TTL.
    pub ttl: Duration,
    /// How long each `lock_with` waits.
    pub wait: Duration,
    /// The work between a holder's two writes.
    pub hold: Duration,
    /// The quiet spell before each fault, drawn from this range.
    pub quiet: (Duration, Duration),
    /// The nemesis binary (re-spawned as workers and as the Aerospike node).
    pub exe: PathBuf,
    /// Where to keep the run's histories (workers' files and logs, `faults.json`,
    /// `writes.json`, `pauses.json`), for a look at what the table counts; `None`: not kept.
    pub keep: Option<PathBuf>,
}

impl RunConfig {
    /// The defaults: 4 workers, TTL 2 s, waits of 15 s, 5 ms of work, 0.5–1.5 s between faults,
    /// 60 s, seed 1, every fault the store supports.
    pub fn new(store: StoreKind, exe: impl Into<PathBuf>) -> Self {
        RunConfig {
            store,
            min_replicas: 0,
            faults: store.faults().to_vec(),
            duration: Duration::from_secs(60),
            seed: 1,
            workers: 4,
            ttl: Duration::from_secs(2),
            wait: Duration::from_secs(15),
            hold: Duration::from_millis(5),
            quiet: (Duration::from_millis(500), Duration::from_millis(1500)),
            exe: exe.into(),
            keep: None,
        }
    }

    /// The store and its settings, as the table names them.
    pub fn label(&self) -> String {
        let base = match self.store {
            StoreKind::Redis => "Redis, one server",
            StoreKind::RedisCluster => "Redis Cluster 3 + 3",
            StoreKind::Sentinel => "Sentinel, master + 2 replicas",
            StoreKind::Etcd => "etcd, 3 members",
            StoreKind::Aerospike => "Aerospike fixture, one node",
        };
        if self.store.is_redis() && self.min_replicas > 0 {
            format!("{base}, min_replicas({})", self.min_replicas)
        } else {
            base.to_owned()
        }
    }
}

/// A run's history and verdict.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The store and its settings.
    pub label: String,
    /// Everything recorded.
    pub history: History,
    /// What the checker found.
    pub verdict: Verdict,
}

/// Runs `config` to the end.
pub fn run(config: &RunConfig) -> io::Result<RunResult> {
    if let Some(kind) = config
        .faults
        .iter()
        .find(|k| !config.store.faults().contains(k))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} does not support the fault {kind} (it supports: {})",
                config.store,
                config
                    .store
                    .faults()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut deployment = Deployment::start(config.store, runtime.handle(), &config.exe)?;
    let resource = runtime.block_on(FencedResource::start())?;
    let dir = tempfile::Builder::new()
        .prefix("leasehold-nemesis-")
        .tempdir()?;
    let store = StoreConfig {
        kind: config.store,
        url: deployment.worker_url(),
        min_replicas: config.min_replicas,
        ttl: config.ttl,
    };
    let started = Instant::now();
    let deadline_ns = now_ns() + config.duration.as_nanos() as u64;
    let mut children: Vec<(PathBuf, Child)> = Vec::new();
    for worker in 0..config.workers {
        let history = dir.path().join(format!("worker-{worker}.jsonl"));
        let child = WorkerConfig {
            worker,
            store: store.clone(),
            wait: config.wait,
            hold: config.hold,
            resource: resource.addr(),
            deadline_ns,
            history: history.clone(),
        }
        .spawn(&config.exe)?;
        children.push((history, child));
    }
    let durations = Durations { ttl: config.ttl };
    // No fault starts in the last stretch, so the last one is healed before the workers stop.
    let tail = durations.client_pause().min(config.duration / 3);
    let schedule = Schedule {
        kinds: config.faults.clone(),
        seed: config.seed,
        durations,
        quiet: config.quiet,
        until: started + config.duration.saturating_sub(tail),
    };
    let faults = schedule::run(&schedule, &mut deployment, &resource, runtime.handle());
    deployment.heal_all();
    // Workers stop at their deadline, after their last acquisition (which may wait `wait`).
    let patience = config.duration + config.wait + config.ttl * 4 + Duration::from_secs(20);
    let mut stuck_workers = 0;
    for (_, child) in &mut children {
        loop {
            match child.try_wait()? {
                Some(_) => break,
                None if started.elapsed() > patience => {
                    resource.continue_all();
                    let _ = child.kill();
                    let _ = child.wait();
                    stuck_workers += 1;
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    resource.continue_all();
    let left_behind = runtime.block_on(left_behind(&store));
    let mut history = History {
        writes: resource.writes(),
        pauses: resource.pauses(),
        faults,
        left_behind,
        stuck_workers,
        ..History::default()
    };
    for (path, _) in &children {
        for event in workload::read_history(path).unwrap_or_default() {
            match event {
                WorkerEvent::Acquired(a) => history.acquisitions.push(a),
                WorkerEvent::Failed(f) => history.failures.push(f),
            }
        }
    }
    if let Some(keep) = &config.keep {
        keep_history(keep, dir.path(), &history)?;
    }
    let verdict = checker::check(&history);
    drop(resource);
    drop(deployment);
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(RunResult {
        label: config.label(),
        history,
        verdict,
    })
}

/// Copies the workers' files and writes the coordinator's records into `keep`.
fn keep_history(
    keep: &std::path::Path,
    dir: &std::path::Path,
    history: &History,
) -> io::Result<()> {
    std::fs::create_dir_all(keep)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, keep.join(name))?;
        }
    }
    let write = |name: &str, value: serde_json::Result<String>| {
        std::fs::write(keep.join(name), value.map_err(io::Error::other)?)
    };
    write("faults.json", serde_json::to_string_pretty(&history.faults))?;
    write("writes.json", serde_json::to_string(&history.writes))?;
    write("pauses.json", serde_json::to_string_pretty(&history.pauses))?;
    Ok(())
}

/// The lock as a fresh client finds it once every worker has stopped: `None` when free.
async fn left_behind(store: &StoreConfig) -> Option<String> {
    let look = async {
        let locks: leasehold::LockManager = store.manager().await?;
        let info = locks.inspect(ENTITY).await?;
        let _ = locks.shutdown().await;
        Ok::<_, leasehold::Error>(info)
    };
    match tokio::time::timeout(Duration::from_secs(20), look).await {
        Ok(Ok(None)) => None,
        Ok(Ok(Some(info))) => Some(format!(
            "held, token {:?}, {:?} left",
            info.fencing_token, info.ttl_remaining
        )),
        Ok(Err(error)) => Some(format!("could not look: {}", error.chain())),
        Err(_) => Some("could not look: no answer within 20 s".to_owned()),
    }
}
