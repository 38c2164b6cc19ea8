//! Waiting across processes on a real redis-server. The shared suite
//! (`tests/suites/fairness.rs`): every process gets a hot key (none starves), a crashed waiter
//! drops out of the queue by its waiter timeout. Here: a release wakes the next process at once,
//! and a lost notification only costs a poll.
//!
//! Strict FIFO mode (`RedisConfig::strict_fifo`): waiters from several processes, and several
//! tasks of one process, are granted in the order they started waiting; a waiter that gives up
//! leaves the queue at once; a SIGKILLed waiter lapses after its waiter timeout.
//!
//! The test binary is its own worker (`leasehold_testkit::fleet`): spawned with a role, it plays
//! it (a contending process, a waiter that records its turn, or a waiter that will be killed)
//! instead of coordinating.

use std::time::{Duration, Instant};

use leasehold::{ErrorKind, LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::fleet;
use leasehold_testkit::redis::RedisServer;

#[path = "../../../tests/suites/fairness.rs"]
mod suite;

impl suite::Deployment for RedisServer {
    const STARVES_AFTER: Duration = Duration::from_secs(20);
    const LAPSES_WITHIN: Duration = Duration::from_secs(15);

    fn start(_: &tokio::runtime::Runtime) -> Self {
        RedisServer::start().expect("start redis-server")
    }

    fn address(&self) -> String {
        self.url()
    }

    async fn manager(url: &str) -> LockManager {
        manager(url, |c| c).await
    }

    /// Drops a dead waiter once its 1 s waiter timeout passes.
    async fn latecomer(url: &str) -> LockManager {
        manager(url, |c| c.waiter_timeout(Duration::from_secs(1))).await
    }

    async fn line_length(url: &str, entity: &str) -> usize {
        queue(url, entity).await.len()
    }
}

suite::fairness_suite!(RedisServer);

async fn manager(url: &str, config: impl FnOnce(RedisConfig) -> RedisConfig) -> LockManager {
    let store = RedisStore::connect(config(RedisConfig::new(url)))
        .await
        .expect("connect");
    LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .build()
        .expect("manager")
}

/// A strict-FIFO waiter that queues itself on `held` and then hangs until killed.
async fn queue_and_hang(url: String) {
    let locks = manager(&url, |c| c.strict_fifo(true)).await;
    let _ = locks
        .lock_with("held", LockOptions::new().wait(Duration::from_secs(600)))
        .await;
}

/// A manager (a process) whose waiters poll after `first`, backing off up to `most`.
async fn polling_every(url: &str, first: Duration, most: Duration) -> LockManager {
    let store = RedisStore::connect(RedisConfig::new(url)).await.unwrap();
    LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .min_backoff(first)
        .retry_interval(most)
        .build()
        .unwrap()
}

/// A worker (see `leasehold_testkit::fleet`) that also knows its `name`.
fn spawn_named(role: &str, test: &str, url: &str, name: &str) -> std::process::Child {
    fleet::spawn_role_with(role, test, url, &[("LEASEHOLD_FAIR_NAME", name)])
}

/// Where a strict-FIFO test's waiters write their names when they get the lock.
const GRANTED: &str = "granted";

/// Waits for the hot key, then, holding it, appends `name` to the `GRANTED` list: the list is the
/// order of the grants.
async fn wait_and_record(locks: &LockManager, url: &str, name: &str) {
    let guard = locks
        .lock_with("hot", LockOptions::new().wait(Duration::from_secs(60)))
        .await
        .expect("granted in turn");
    let mut conn = connection(url).await;
    let () = redis::cmd("RPUSH")
        .arg(GRANTED)
        .arg(name)
        .query_async(&mut conn)
        .await
        .expect("record the grant");
    tokio::time::sleep(Duration::from_millis(20)).await;
    guard.release().await.expect("release");
}

/// A connection of the test's own, beside the code under test.
async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// The entries of a key's waiter queue, oldest first.
async fn queue(url: &str, key: &str) -> Vec<String> {
    let mut conn = connection(url).await;
    redis::cmd("LRANGE")
        .arg(format!("leasehold:queue:DC#f1#fair#{key}"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("LRANGE")
}

/// Waits (at most 20 s) until `key`'s queue satisfies `done`, and returns it.
async fn queue_until(url: &str, key: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let entries = queue(url, key).await;
        if done(&entries) {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "the queue of {key} never got there: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the role this process was spawned for, if any.
fn play_role() -> bool {
    let Some((role, url)) = fleet::role() else {
        return false;
    };
    fleet::runtime().block_on(async move {
        match role.as_str() {
            "hang-strict" => queue_and_hang(url).await,
            "wait-strict" => {
                let name = std::env::var("LEASEHOLD_FAIR_NAME").expect("the waiter's name");
                let locks = manager(&url, |c| c.strict_fifo(true)).await;
                wait_and_record(&locks, &url, &name).await;
            }
            other => panic!("unknown role {other}"),
        }
    });
    true
}

#[test]
fn a_release_wakes_the_next_process_and_a_lost_notification_costs_a_poll() {
    if play_role() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    fleet::runtime().block_on(async {
        let slow = Duration::from_secs(30);
        let (a, b) = (
            polling_every(&url, slow, slow).await,
            polling_every(&url, slow, slow).await,
        );

        // Notified: B would poll again only after 30 s (and A's lease has 90 s left).
        let held = a.try_lock("k").await.unwrap();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move {
                let asked = Instant::now();
                let guard = b
                    .lock_with("k", LockOptions::new().wait(Duration::from_secs(60)))
                    .await
                    .unwrap();
                let waited = asked.elapsed();
                guard.release().await.unwrap();
                waited
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        let waited = waiting.await.unwrap();
        assert!(
            waited < Duration::from_secs(20),
            "woken by the release announcement, not the 30 s poll: {waited:?}"
        );

        // The subscriber connection is cut: waiting falls back to polling, never to a missed lock.
        let (first, most) = (Duration::from_millis(100), Duration::from_millis(300));
        let (a, b) = (
            polling_every(&url, first, most).await,
            polling_every(&url, first, most).await,
        );
        let held = a.try_lock("cut").await.unwrap();
        let waiting = tokio::spawn(async move {
            b.lock_with("cut", LockOptions::new().wait(Duration::from_secs(30)))
                .await
                .map(drop)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        server
            .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .expect("cut the subscriber connections");
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        waiting
            .await
            .unwrap()
            .expect("the waiter took the lock by polling");
    });
}

#[test]
fn strict_fifo_grants_in_the_order_waiters_started_across_processes_and_tasks() {
    const TEST: &str = "strict_fifo_grants_in_the_order_waiters_started_across_processes_and_tasks";
    if play_role() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    fleet::runtime().block_on(async {
        let holder = manager(&url, |c| c.strict_fifo(true)).await;
        let here = manager(&url, |c| c.strict_fifo(true)).await;
        let held = holder.try_lock("hot").await.expect("free");
        // Other processes and tasks of this one, interleaved: by default the tasks here would
        // share one place (and be served together, in one turn of this process); in strict FIFO
        // each keeps its own. Each starts once the one before is known to be in line.
        let names = ["p0", "t1", "p2", "t3", "t4", "p5"];
        let (mut children, mut tasks) = (Vec::new(), Vec::new());
        for (i, name) in names.iter().enumerate() {
            if name.starts_with('p') {
                children.push(spawn_named("wait-strict", TEST, &url, name));
            } else {
                let (here, url, name) = (here.clone(), url.clone(), name.to_string());
                tasks.push(tokio::spawn(async move {
                    wait_and_record(&here, &url, &name).await
                }));
            }
            let line = queue_until(&url, "hot", |q| q.len() == i + 1).await;
            assert!(
                line.iter().all(|entry| entry.contains('#')),
                "one entry per waiting call (<store id>#<n>), not per process: {line:?}"
            );
        }
        held.release().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        for child in children {
            let out = child.wait_with_output().expect("worker");
            assert!(
                out.status.success(),
                "a waiter failed:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let mut conn = connection(&url).await;
        let granted: Vec<String> = redis::cmd("LRANGE")
            .arg(GRANTED)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(granted, names, "granted in the order they started waiting");
        assert!(queue(&url, "hot").await.is_empty(), "nobody left in line");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_strict_fifo_a_waiter_that_gives_up_leaves_the_queue_at_once() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let holder = manager(&url, |c| c.strict_fifo(true)).await;
    let here = manager(&url, |c| c.strict_fifo(true)).await;
    let held = holder.try_lock("k").await.expect("free");
    let wait = |here: LockManager| async move {
        here.lock_with("k", LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .map(drop)
    };
    let first = tokio::spawn(wait(here.clone()));
    queue_until(&url, "k", |q| q.len() == 1).await;
    let second = tokio::spawn(wait(here.clone()));
    let line = queue_until(&url, "k", |q| q.len() == 2).await;

    // The first waiter gives up (its call is dropped) while the second of the same process
    // still waits: its own place goes at once, the second's stays.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let left = queue_until(&url, "k", |q| q.len() == 1).await;
    assert_eq!(
        left,
        line[1..],
        "the first waiter's entry went, the second's stayed"
    );
    let deadline_kept = server
        .command(&["HEXISTS", "leasehold:queue-deadline:DC#f1#fair#k", &line[0]])
        .unwrap();
    assert_eq!(deadline_kept, ":0", "its deadline went with it");

    held.release().await.unwrap();
    second
        .await
        .unwrap()
        .expect("the second waiter is next and is granted");
}

#[test]
fn in_strict_fifo_a_sigkilled_waiter_lapses_after_its_waiter_timeout() {
    const TEST: &str = "in_strict_fifo_a_sigkilled_waiter_lapses_after_its_waiter_timeout";
    if play_role() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    fleet::runtime().block_on(async {
        let holder = manager(&url, |c| c.strict_fifo(true)).await;
        let held = holder.try_lock("held").await.expect("free");
        let mut waiter = fleet::spawn_role("hang-strict", TEST, &url);
        let line = queue_until(&url, "held", |q| q.len() == 1).await;
        assert!(line[0].contains('#'), "the call's own entry: {line:?}");
        waiter.kill().unwrap(); // SIGKILL, by pid
        waiter.wait().unwrap();
        held.release().await.unwrap();

        // The dead waiter is first in line (its place kept for the default 5 s waiter timeout
        // after its last attempt); it is dropped once that passes.
        let next = manager(&url, |c| c.strict_fifo(true)).await;
        let refused = next.try_lock("held").await.unwrap_err();
        assert_eq!(
            refused.kind(),
            ErrorKind::LockUnavailable,
            "a try-lock does not pass a queued waiter"
        );
        let guard = next
            .lock_with("held", LockOptions::new().wait(Duration::from_secs(20)))
            .await
            .expect("the crashed waiter's place lapsed");
        guard.release().await.unwrap();
        assert!(queue(&url, "held").await.is_empty());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_announced_only_on_the_channel_of_the_process_next_in_line() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let (a, b, c) = (
        manager(&url, |c| c).await,
        manager(&url, |c| c).await,
        manager(&url, |c| c).await,
    );
    let held = a.try_lock("next").await.unwrap();

    let mut listener = listener(&url).await;

    let wait_then_release = |locks: LockManager| async move {
        locks
            .lock_with("next", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("its turn comes")
            .release()
            .await
            .expect("release");
    };
    let first = tokio::spawn(wait_then_release(b));
    queue_until(&url, "next", |q| q.len() == 1).await;
    let second = tokio::spawn(wait_then_release(c));
    let line = queue_until(&url, "next", |q| q.len() == 2).await;

    // A's release names B, B's names C: each on that process's own channel, so no other process
    // hears it. (C's release finds nobody in line and announces nothing.)
    held.release().await.unwrap();
    first.await.expect("B got its turn");
    second.await.expect("C got its turn");
    let line: Vec<&str> = line.iter().map(String::as_str).collect();
    assert_eq!(heard(&mut listener).await, announced("next", &line));
}

/// A subscriber to every announcement of every lock, as Redis publishes it.
async fn listener(url: &str) -> redis::aio::PubSub {
    let mut listener = redis::Client::open(url)
        .unwrap()
        .get_async_pubsub()
        .await
        .expect("subscriber");
    listener
        .psubscribe("leasehold:released:*")
        .await
        .expect("PSUBSCRIBE");
    listener
}

/// Every announcement heard on `listener` until it has been quiet for half a second:
/// `(channel, entry named)`.
async fn heard(listener: &mut redis::aio::PubSub) -> Vec<(String, String)> {
    use futures::StreamExt;

    let mut heard = Vec::new();
    let mut messages = listener.on_message();
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_millis(500), messages.next()).await
    {
        let payload: String = message.get_payload().unwrap();
        heard.push((message.get_channel_name().to_owned(), payload));
    }
    heard
}

/// A lock's announcements as `heard` reports them, one per entry named.
fn announced(key: &str, entries: &[&str]) -> Vec<(String, String)> {
    let base = format!("leasehold:released:leasehold:DC#f1#fair#{key}");
    entries
        .iter()
        .map(|entry| (format!("{base}:{entry}"), (*entry).to_owned()))
        .collect()
}

/// A blocking `lock()` of `key` in its own task (30 s to wait), to be awaited or aborted.
fn waiting(
    locks: &LockManager,
    key: &'static str,
) -> tokio::task::JoinHandle<leasehold::Result<leasehold::LockGuard>> {
    let locks = locks.clone();
    tokio::spawn(async move {
        locks
            .lock_with(key, LockOptions::new().wait(Duration::from_secs(30)))
            .await
    })
}

/// Releases `held`; the waiter `next` takes its turn and releases too. Returns what `listener`
/// heard.
async fn hand_over(
    held: leasehold::LockGuard,
    next: tokio::task::JoinHandle<leasehold::Result<leasehold::LockGuard>>,
    listener: &mut redis::aio::PubSub,
) -> Vec<(String, String)> {
    held.release().await.unwrap();
    next.await
        .unwrap()
        .expect("the next in line got its turn")
        .release()
        .await
        .unwrap();
    heard(listener).await
}

/// Process A holds `key` and has gone in line for its tasks still waiting, alone, so its hold
/// names A as next: A's first task took the key, its second took it over with its third still
/// waiting. Returns the hold, A's id in line, A's waiting task, and a listener of every
/// announcement from then on.
async fn hold_naming_own_process(
    url: &str,
    a: &LockManager,
    key: &'static str,
) -> (
    leasehold::LockGuard,
    String,
    tokio::task::JoinHandle<leasehold::Result<leasehold::LockGuard>>,
    redis::aio::PubSub,
) {
    let first = a.try_lock(key).await.unwrap();
    let (one, other) = (waiting(a, key), waiting(a, key));
    let listener = listener(url).await;
    first.release().await.unwrap();
    // One of the two takes its turn while the other still waits: A goes back in line, alone,
    // so the hold names A.
    let (taken, third) = match futures::future::select(one, other).await {
        futures::future::Either::Left(done) | futures::future::Either::Right(done) => done,
    };
    let held = taken.unwrap().expect("A's second task got its turn");
    let line = queue_until(url, key, |q| q.len() == 1).await;
    (held, line[0].clone(), third, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_entry_a_hold_names_leaves_the_line_the_release_tells_the_new_head() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let (a, w) = (manager(&url, |c| c).await, manager(&url, |c| c).await);
    let (held, a_id, a_third, mut listener) = hold_naming_own_process(&url, &a, "left").await;
    let w_waits = waiting(&w, "left");
    let line = queue_until(&url, "left", |q| q.len() == 2).await;
    assert_eq!(line[0], a_id);
    let w_id = line[1].clone();

    // A's last waiter gives up: A leaves the head of the line while its hold names A.
    a_third.abort();
    queue_until(&url, "left", |q| q == [w_id.as_str()]).await;

    assert_eq!(
        hand_over(held, w_waits, &mut listener).await,
        announced("left", &[&w_id]),
        "the release told W, the head after A left, not A"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_lapsed_head_is_dropped_during_a_hold_the_release_tells_the_new_head() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let (a, y) = (manager(&url, |c| c).await, manager(&url, |c| c).await);
    let (held, _, a_third, mut listener) = hold_naming_own_process(&url, &a, "lapsed").await;

    // A crashed process's place behind A (what a SIGKILLed waiter leaves), 300 ms from lapsing;
    // A's last waiter gives up, so the hold now names the crashed place.
    let mut conn = connection(&url).await;
    let (now_s, now_us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let lapses_at = now_s * 1000 + now_us / 1000 + 300;
    let () = redis::pipe()
        .cmd("RPUSH")
        .arg("leasehold:queue:DC#f1#fair#lapsed")
        .arg("crashed")
        .ignore()
        .cmd("HSET")
        .arg("leasehold:queue-deadline:DC#f1#fair#lapsed")
        .arg("crashed")
        .arg(lapses_at)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    a_third.abort();
    queue_until(&url, "lapsed", |q| q == ["crashed"]).await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    // Y's first attempt drops the lapsed place and takes the head.
    let y_waits = waiting(&y, "lapsed");
    let line = queue_until(&url, "lapsed", |q| q.len() == 1 && q[0] != "crashed").await;
    let y_id = line[0].clone();

    assert_eq!(
        hand_over(held, y_waits, &mut listener).await,
        announced("lapsed", &[&y_id]),
        "the release told Y, not the crashed place it had dropped"
    );
}

/// How many times the server ran `command` since its statistics were last reset.
async fn calls(url: &str, command: &str) -> u64 {
    let mut conn = connection(url).await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

async fn reset_stats(url: &str) {
    let mut conn = connection(url).await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("CONFIG RESETSTAT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_nobody_contends_costs_the_round_trips_of_a_try_and_never_subscribes() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let locks = manager(&url, |c| c).await;
    // Connected and the scripts loaded, so only the cycle itself is counted.
    locks
        .try_lock("warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    reset_stats(&url).await;

    for _ in 0..3 {
        let guard = locks
            .lock_with("quiet", LockOptions::new().wait(Duration::from_secs(5)))
            .await
            .expect("free");
        guard.release().await.expect("release");
    }
    assert_eq!(
        calls(&url, "subscribe").await,
        0,
        "no wait, no subscription"
    );
    assert_eq!(calls(&url, "unsubscribe").await, 0);
    assert_eq!(
        calls(&url, "evalsha").await,
        6,
        "an acquire and a release each, one script apiece, as try_lock + release"
    );
    assert_eq!(
        calls(&url, "lindex").await,
        3,
        "the line read by each acquire; a release whose hold names nobody reads none"
    );
    assert_eq!(calls(&url, "publish").await, 0, "nobody to tell");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_back_in_an_emptied_line_behind_a_hold_is_named_by_the_hold() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let holder = manager(&url, |c| c).await;
    let waiter = polling_every(&url, Duration::from_millis(50), Duration::from_millis(200)).await;
    let held = holder.try_lock("emptied").await.unwrap();
    // Two tasks of one process wait (each releasing at once): its attempts go back in line for
    // the other.
    let take_and_release = || {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .lock_with("emptied", LockOptions::new().wait(Duration::from_secs(30)))
                .await?
                .release()
                .await
        })
    };
    let (one, other) = (take_and_release(), take_and_release());
    let entry = queue_until(&url, "emptied", |q| q.len() == 1).await[0].clone();

    // The line is lost under the hold (as when it expired): the next attempt joins an empty line.
    let mut conn = connection(&url).await;
    let () = redis::cmd("DEL")
        .arg("leasehold:queue:DC#f1#fair#emptied")
        .arg("leasehold:queue-deadline:DC#f1#fair#emptied")
        .query_async(&mut conn)
        .await
        .unwrap();
    queue_until(&url, "emptied", |q| q == [entry.as_str()]).await;
    let value: String = redis::cmd("GET")
        .arg("leasehold:DC#f1#fair#emptied")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        value,
        format!(
            "{}\t{}\n{entry}",
            held.token().as_str(),
            held.fencing_token().expect("fenced")
        ),
        "the hold names its fencing token, and the process first in the line it joined, so its \
         release tells it"
    );

    held.release().await.unwrap();
    for task in [one, other] {
        assert!(task.await.unwrap().expect("each task gets its turn"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_first_in_line_behind_a_writer_is_told_at_its_release() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let (writer, reader) = (manager(&url, |c| c).await, manager(&url, |c| c).await);
    // Taken with nobody in line: the hold names nobody.
    let held = writer.try_lock("rw").await.unwrap();
    let mut listener = listener(&url).await;
    let reads = {
        let reader = reader.clone();
        tokio::spawn(async move {
            reader
                .read_with("rw", LockOptions::new().wait(Duration::from_secs(30)))
                .await
        })
    };
    let line = queue_until(&url, "rw", |q| q.len() == 1).await;

    // The reader, first in the empty line, pointed the hold at itself: the release tells it.
    assert_eq!(
        hand_over(held, reads, &mut listener).await,
        announced("rw", &[&line[0]]),
        "the writer's release told the reader that joined behind it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_contended_again_is_still_subscribed_and_its_waiter_woken_without_polling() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let holder = manager(&url, |c| c).await;
    // Polls once a minute: only the release announcement can hand it the lock within the test.
    let waiter = polling_every(&url, Duration::from_secs(60), Duration::from_secs(60)).await;
    reset_stats(&url).await;

    for round in 1..=3 {
        let held = holder.try_lock("again").await.expect("free between rounds");
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let guard = waiter
                    .lock_with("again", LockOptions::new().wait(Duration::from_secs(30)))
                    .await
                    .expect("its turn comes");
                let waited = started.elapsed();
                guard.release().await.expect("release");
                waited
            })
        };
        queue_until(&url, "again", |q| q.len() == 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let waited = waiting.await.expect("the waiter got the lock");
        assert!(
            waited < Duration::from_secs(20),
            "round {round}: woken by the announcement, not the minute's poll ({waited:?})"
        );
    }
    assert_eq!(
        calls(&url, "subscribe").await,
        1,
        "the first wait subscribed; the later ones found the subscription in place"
    );
    assert_eq!(
        calls(&url, "unsubscribe").await,
        0,
        "it lingers between waits"
    );
}

/// A manager whose store requests are counted (acquires, releases, …).
async fn counted(
    url: &str,
) -> (
    LockManager,
    std::sync::Arc<leasehold::layers::RequestCounts>,
) {
    let counting = leasehold::layers::CountingLayer::new();
    let counts = counting.counts();
    let store = RedisStore::connect(RedisConfig::new(url)).await.unwrap();
    let locks = LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .layer(counting)
        .build()
        .unwrap();
    (locks, counts)
}

/// `N` processes (managers with the default configuration) on the server at `url`.
async fn processes<const N: usize>(url: &str) -> [LockManager; N] {
    let mut all = Vec::with_capacity(N);
    for _ in 0..N {
        all.push(manager(url, |c| c).await);
    }
    all.try_into()
        .unwrap_or_else(|_| unreachable!("N managers"))
}

/// Brings A to keep its place in `key`'s line behind B: X holds, A waits and is granted (a
/// first grant, nobody else in line: nothing kept), then X holds again, A waits, B waits behind
/// A, and X releases: A, granted again within a second with B in line, keeps its place behind
/// B. Returns A's hold, B's waiting call, and A's and B's ids in line.
async fn keep_a_place(
    url: &str,
    key: &'static str,
    (x, a, b): (&LockManager, &LockManager, &LockManager),
) -> (
    leasehold::LockGuard,
    tokio::task::JoinHandle<leasehold::Result<leasehold::LockGuard>>,
    String,
    String,
) {
    let held = x.try_lock(key).await.unwrap();
    let a_waits = waiting(a, key);
    queue_until(url, key, |q| q.len() == 1).await;
    held.release().await.unwrap();
    a_waits
        .await
        .unwrap()
        .expect("A's turn")
        .release()
        .await
        .unwrap();
    assert!(
        queue(url, key).await.is_empty(),
        "nothing kept: nobody else was in line"
    );

    let held = x.try_lock(key).await.unwrap();
    let a_waits = waiting(a, key);
    let a_id = queue_until(url, key, |q| q.len() == 1).await[0].clone();
    let b_waits = waiting(b, key);
    let b_id = queue_until(url, key, |q| q.len() == 2).await[1].clone();
    held.release().await.unwrap();
    let a_held = a_waits.await.unwrap().expect("A's turn");
    assert_eq!(
        queue(url, key).await,
        [b_id.clone(), a_id.clone()],
        "A kept its place"
    );
    (a_held, b_waits, a_id, b_id)
}

/// A process that keeps asking for a hot key (a task looping on it) keeps its place in line
/// between its waits while others wait too: its next `lock()` waits for its turn at once, with
/// no try and no join — one acquire per grant. Places nobody asks for any more are given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_keeps_asking_keeps_its_place_in_line_between_its_waits() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let (a, a_requests) = counted(&url).await;
    let [x, b] = processes(&url).await;
    let (a_held, b_waits, _, _) = keep_a_place(&url, "loop", (&x, &a, &b)).await;

    // A's next wait takes no try and no join: its one acquire is the grant when its turn comes
    // (after B's hold).
    a_requests.reset();
    let a_again = waiting(&a, "loop");
    a_held.release().await.unwrap();
    b_waits
        .await
        .unwrap()
        .expect("B's turn")
        .release()
        .await
        .unwrap();
    a_again
        .await
        .unwrap()
        .expect("A's turn again")
        .release()
        .await
        .unwrap();
    assert_eq!(
        a_requests.acquires(),
        1,
        "A waited in its kept place: no try, no join"
    );

    // Nobody asks any more: every kept place is given up (when its turn comes, or after a
    // second), and the line empties.
    let started = Instant::now();
    queue_until(&url, "loop", |q| q.is_empty()).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "kept places went within their keep time: {:?}",
        started.elapsed()
    );
}

/// A kept place never holds the line up: A keeps its place behind B and stops asking; when B
/// releases, the turn is A's with nobody in A waiting, and A gives it up at once to C, who
/// waits behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_place_whose_turn_comes_with_nobody_waiting_is_given_up_at_once() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let [x, a, b, c] = processes(&url).await;
    let (a_held, b_waits, a_id, b_id) = keep_a_place(&url, "kept", (&x, &a, &b)).await;
    a_held.release().await.unwrap();
    let b_held = b_waits.await.unwrap().expect("B's turn");
    let c_waits = waiting(&c, "kept");
    queue_until(&url, "kept", |q| {
        q.first() == Some(&a_id) && q.iter().any(|e| *e != a_id && *e != b_id)
    })
    .await;
    let released_at = Instant::now();
    b_held.release().await.unwrap();
    c_waits
        .await
        .unwrap()
        .expect("C's turn, past A's kept place")
        .release()
        .await
        .unwrap();
    assert!(
        released_at.elapsed() < Duration::from_millis(500),
        "A gave up its turn at once, not after its keep time: {:?}",
        released_at.elapsed()
    );
}

/// A process that shuts down gives its kept places up at once: the next in line is not left to
/// wait for their deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_shutting_down_gives_up_its_kept_places_at_once() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let [x, a, b] = processes(&url).await;
    let (a_held, b_waits, a_id, _) = keep_a_place(&url, "leaving", (&x, &a, &b)).await;
    a_held.release().await.unwrap();
    let b_held = b_waits.await.unwrap().expect("B's turn");
    assert!(
        queue(&url, "leaving").await.contains(&a_id),
        "A's place kept"
    );

    a.shutdown().await.expect("shutdown");
    assert!(
        !queue(&url, "leaving").await.contains(&a_id),
        "gone when the shutdown returns, well before its keep time"
    );
    b_held.release().await.unwrap();
}
