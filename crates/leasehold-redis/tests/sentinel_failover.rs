//! A killed Sentinel master that its supervisor restarts comes back on the same address, first as
//! an empty master, then — once the sentinels reconfigure it — as a replica of the master they
//! promoted meanwhile, answering every write with `READONLY`. The store must follow the sentinels
//! to the new master (and never write to the restarted node), and the locks must be granted there
//! as soon as the sentinels' failover is over. The same for a master the sentinels demote while it
//! runs (`SENTINEL FAILOVER`).

use std::time::{Duration, Instant};

use leasehold::{LockManager, LockOptions};
use leasehold_core::{Acquire, LockKey, LockStore, OwnerToken};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis_cluster::RedisSentinel;

fn manager(store: RedisStore) -> LockManager {
    LockManager::builder()
        .client_id("t")
        .farm_id("f1")
        .lock_ttl(Duration::from_secs(2))
        .min_backoff(Duration::from_millis(50))
        .store(store)
        .build()
        .unwrap()
}

/// Takes and releases `name` until `stop`, as the fault harness's workers do: every wait
/// generous, so a wait that runs out is the store stuck, not the failover. Returns how many
/// times it had the lock, or the first error.
fn acquire_until(
    locks: LockManager,
    name: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<leasehold::Result<u32>> {
    tokio::spawn(async move {
        let mut done = 0u32;
        while !*stop.borrow() {
            let guard = locks
                .lock_with(name, LockOptions::new().wait(Duration::from_secs(60)))
                .await?;
            tokio::time::sleep(Duration::from_millis(5)).await;
            // A release cut off by the kill is the readback's business; the lock then runs out.
            let _ = guard.release().await;
            done += 1;
        }
        Ok(done)
    })
}

/// The connections on the data node at `port` whose last command was a script: the stores' data
/// connections (the sentinels', the replicas' and the subscribers' run other commands).
fn script_clients(group: &RedisSentinel, port: u16) -> Vec<String> {
    let list = group
        .node(port)
        .expect("a data node")
        .command(&["CLIENT", "LIST"])
        .expect("CLIENT LIST");
    list.lines()
        .filter(|l| l.contains("cmd=evalsha") || l.contains("cmd=eval "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_restarted_as_a_replica_is_left_for_the_new_master() {
    let mut group = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis Sentinel (redis-server, redis-sentinel)");
    let url = group.url();
    let store = RedisStore::connect(RedisConfig::new(&url)).await.unwrap();
    let locks = manager(store.clone());
    let key: LockKey = "DC#f1#t#follow".parse().unwrap();
    let lock_key = store.lock_key(&key);
    // Two more processes take the lock in a loop through every kill, as in production.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let looping: Vec<_> =
        futures::future::join_all((0..2).map(|_| RedisStore::connect(RedisConfig::new(&url))))
            .await
            .into_iter()
            .map(|store| acquire_until(manager(store.unwrap()), "follow", stopped.clone()))
            .collect();
    drop(
        locks
            .lock("follow")
            .await
            .expect("the lock before any fault"),
    );

    // Round 0: the master killed and restarted at once. Round 1: the master demoted by
    // `SENTINEL FAILOVER` while the store is idle (the sentinels make it a replica and close its
    // clients' connections; it stays up, answering `READONLY`). Round 2: killed again.
    for round in 0..3 {
        let old = group.master_port().unwrap();
        let killed = Instant::now();
        if round == 0 {
            group.kill(old).unwrap();
            // Before the sentinels fail over (they wait a second to call the master down), a
            // try fails naming the node that is gone.
            let err = store
                .try_acquire(&Acquire::new(
                    key.clone(),
                    OwnerToken::generate(),
                    Duration::from_secs(2),
                ))
                .await
                .expect_err("no master to grant it");
            assert!(
                err.to_string().contains(&format!("127.0.0.1:{old}")),
                "names the master that is gone: {err}"
            );
            assert!(
                std::error::Error::source(&err).is_some(),
                "the cause is kept: {err}"
            );
        }
        let (back, new) = tokio::task::spawn_blocking(move || {
            if round == 1 {
                let new = group.failover();
                let settled = group.wait_settled();
                return (group, new.and_then(|new| settled.map(|()| new)));
            }
            if round != 0 {
                if let Err(e) = group.kill(old) {
                    return (group, Err(e));
                }
            }
            let new = group.wait_new_master(old);
            // Restarted at once: an empty master until the sentinels make it a replica of the
            // new one (the restart returns once it is one, in sync).
            let restarted = group.restart(old);
            (group, new.and_then(|new| restarted.map(|()| new)))
        })
        .await
        .unwrap();
        group = back;
        let new = new.expect("the sentinels promoted a replica and the old master came back");
        assert_ne!(old, new);
        let role = group.node(old).unwrap().info_field("replication", "role");
        assert_eq!(
            role.unwrap(),
            "slave",
            "round {round}: the old master is a replica now"
        );

        // The failover is long over: the next lock must not wait for anything but the lock.
        let guard = locks
            .lock_with("follow", LockOptions::new().wait(Duration::from_secs(10)))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "round {round}: no lock {:?} after the fault on :{old} (new master :{new}): {e}",
                    killed.elapsed()
                )
            });
        // The sentinels may have elected again since (after the old master's restart, a replica
        // that was promoted can be replaced): the store follows the master they name now, which
        // is never the old one, a replica now.
        let new = group.master_port().unwrap_or(new);
        assert_ne!(new, old, "round {round}: the old master stays a replica");
        // Granted on the new master, over a connection to it, and nothing of ours on the old.
        let held = group
            .node(new)
            .unwrap()
            .command(&["EXISTS", &lock_key])
            .unwrap();
        assert_eq!(
            held, ":1",
            "round {round}: the lock is on the new master :{new}"
        );
        let info = store.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.token.as_ref(), Some(guard.token()));
        // A connection is known by the last command it ran (a script). The sentinels may still
        // be closing clients' connections on the new master as they settle (a reconfiguration
        // kills normal clients), so a connection that ran one can be gone by the time the list is
        // read: ask again, over a fresh one, for a few seconds.
        let asked = Instant::now();
        while script_clients(&group, new).is_empty() && asked.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store.inspect(&key).await.unwrap();
        }
        assert!(
            !script_clients(&group, new).is_empty(),
            "round {round}: the store's data connection is to the new master :{new}: {}",
            group
                .node(new)
                .unwrap()
                .command(&["CLIENT", "LIST"])
                .unwrap_or_default()
        );
        assert_eq!(
            script_clients(&group, old),
            Vec::<String>::new(),
            "round {round}: no data connection to the old master :{old}, a replica now"
        );
        assert!(guard.release().await.unwrap(), "round {round}: released");
    }

    stop.send_replace(true);
    for worker in looping {
        let done = worker
            .await
            .unwrap()
            .expect("every wait of the looping processes ended with the lock");
        assert!(done > 0);
    }
}

/// A service that starts while its master is down connects once the sentinels have promoted a
/// replica — within the master wait — instead of failing after twice its connect timeout, long
/// before the sentinels even call the master down. A wait too short for the failover fails
/// naming the master that does not answer and the setting to raise; a master name no sentinel
/// monitors fails without waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_during_a_failover_waits_for_the_new_master() {
    let mut group = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis Sentinel (redis-server, redis-sentinel)");
    let url = group.url();
    let config = |wait: Duration| {
        RedisConfig::new(&url)
            .connect_timeout(Duration::from_millis(200))
            .master_wait(wait)
    };

    // A name no sentinel monitors: nothing to wait for, whatever the master wait.
    let unknown = url.replace("/mymaster", "/nosuchmaster");
    assert_ne!(unknown, url, "the URL names the master: {url}");
    let started = Instant::now();
    let err = RedisStore::connect(
        RedisConfig::new(&unknown)
            .connect_timeout(Duration::from_millis(200))
            .master_wait(Duration::from_secs(60)),
    )
    .await
    .expect_err("no sentinel monitors that name");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed without the master wait ({:?}): {err}",
        started.elapsed()
    );

    let old = group.master_port().unwrap();
    group.kill(old).unwrap();
    // The sentinels call a master down after a second (down-after-milliseconds): a master wait
    // of 600 ms ends before any failover.
    let err = RedisStore::connect(config(Duration::from_millis(600)))
        .await
        .expect_err("no master answers within 600 ms of the kill");
    let message = err.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{old}")) && message.contains("master_wait"),
        "names the master that does not answer and what to raise: {message}"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the cause is kept: {err}"
    );

    let store = RedisStore::connect(config(Duration::from_secs(60)))
        .await
        .expect("connects once the sentinels have promoted a replica");
    let (group, new) = tokio::task::spawn_blocking(move || {
        let new = group.wait_new_master(old);
        (group, new)
    })
    .await
    .unwrap();
    let new = new.expect("the sentinels promote a replica");
    let key: LockKey = "DC#f1#t#starting".parse().unwrap();
    let lease = store
        .try_acquire(&Acquire::new(
            key.clone(),
            OwnerToken::generate(),
            Duration::from_secs(10),
        ))
        .await
        .expect("the store serves from the new master");
    let held = group
        .node(new)
        .expect("the new master")
        .command(&["EXISTS", &store.lock_key(&key)])
        .expect("EXISTS");
    assert_eq!(held, ":1", "the lock is on the new master {new}");
    store.release(&lease).await.unwrap();
}

/// A master, or a sentinel, that refuses the URL's password is a setup error naming it once the
/// refusal has lasted the connect timeout: waiting for a failover does not mend a wrong password,
/// so the connect neither waits out the master wait nor calls it a connection failure. The right
/// passwords connect. (A master and one sentinel of their own: the shared group runs without
/// passwords.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refuses_the_password_fails_the_connect_without_the_master_wait() {
    let (master, sentinel) = tokio::task::spawn_blocking(|| {
        let master = leasehold_testkit::redis::RedisServer::start()?;
        // Set after start: the start-up check reads INFO without a password.
        let set = master.command(&["CONFIG", "SET", "requirepass", "right-secret"])?;
        assert_eq!(set, "+OK", "CONFIG SET requirepass");
        let config = format!(
            "sentinel monitor mymaster 127.0.0.1 {} 1\nsentinel auth-pass mymaster right-secret\n",
            master.port()
        );
        let sentinel =
            leasehold_testkit::redis::RedisServer::start_with_config(&config, &["--sentinel"])?;
        let set =
            sentinel.command(&["ACL", "SETUSER", "default", "resetpass", ">sentinel-secret"])?;
        assert_eq!(set, "+OK", "ACL SETUSER on the sentinel");
        Ok::<_, std::io::Error>((master, sentinel))
    })
    .await
    .unwrap()
    .expect("start a master with a password and its sentinel (redis-server)");
    let connect_timeout = Duration::from_secs(2);
    let config = |password: &str, sentinel_password: &str| {
        RedisConfig::new(format!(
            "redis+sentinel://:{password}@127.0.0.1:{}/mymaster?sentinel_password={sentinel_password}",
            sentinel.port()
        ))
        .connect_timeout(connect_timeout)
        .master_wait(Duration::from_secs(60))
    };
    let refused = |err: &leasehold::Error, node: &str| {
        assert_eq!(err.kind(), leasehold::ErrorKind::StoreSetup, "{err}");
        let message = err.to_string();
        assert!(
            message.contains(node) && message.contains("password"),
            "names {node}, which refused, and what to check: {message}"
        );
        let mut chain = String::new();
        let mut cause: Option<&dyn std::error::Error> = Some(err);
        let mut redis_cause = None;
        while let Some(error) = cause {
            chain.push_str(&format!("{error} / "));
            redis_cause = redis_cause.or(error
                .downcast_ref::<redis::RedisError>()
                .map(|e| (e.kind(), e.code().map(str::to_owned))));
            cause = error.source();
        }
        // The client reports the refused AUTH either as the server's code or as its own kind.
        assert!(
            matches!(
                &redis_cause,
                Some((redis::ErrorKind::AuthenticationFailed, _))
            ) || matches!(&redis_cause, Some((_, Some(code))) if code == "WRONGPASS"),
            "the client's error for the refusal is kept as the cause: {chain}"
        );
        let debug = format!("{err:?}");
        assert!(
            !chain.contains("secret") && !debug.contains("secret"),
            "no password shown: {chain} {debug}"
        );
    };

    // Failing well before twice the connect timeout (the connect's first wait) shows the
    // refusal ends the wait as soon as it has lasted the connect timeout.
    for (password, sentinel_password, node) in [
        (
            "wrong-secret",
            "sentinel-secret",
            format!("127.0.0.1:{}", master.port()),
        ),
        (
            "right-secret",
            "wrong-secret",
            format!("sentinel 127.0.0.1:{}", sentinel.port()),
        ),
    ] {
        let started = Instant::now();
        let err = RedisStore::connect(config(password, sentinel_password))
            .await
            .expect_err("a password is refused");
        let took = started.elapsed();
        assert!(
            took < connect_timeout * 2 - Duration::from_millis(300),
            "failed once the refusal lasted the connect timeout, not at the end of the \
             connect's first wait ({took:?}): {err}"
        );
        refused(&err, &node);
    }

    // The same node without the sentinels: a setup error too, naming it.
    let direct = format!("redis://:wrong-secret@127.0.0.1:{}", master.port());
    let err = RedisStore::connect(RedisConfig::new(direct))
        .await
        .expect_err("the node refuses the password");
    assert_eq!(err.kind(), leasehold::ErrorKind::StoreSetup, "{err}");
    let message = err.chain().to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{}", master.port()))
            && message.contains("credentials")
            && !message.contains("secret"),
        "{message}"
    );

    let store = RedisStore::connect(config("right-secret", "sentinel-secret"))
        .await
        .expect("the right passwords connect");
    let key: LockKey = "DC#f1#t#auth".parse().unwrap();
    let lease = store
        .try_acquire(&Acquire::new(
            key,
            OwnerToken::generate(),
            Duration::from_secs(5),
        ))
        .await
        .expect("a lock through the master with the right password");
    assert!(store.release(&lease).await.unwrap());
    drop((master, sentinel));
}
