//! `leasehold::blocking` across OS processes: a blocking guard held by one thread of this process
//! excludes another process, through a private redis-server both reach.
//!
//! The test is its own child: run normally it is the parent (starts the server, holds the lock on
//! a thread of its own, spawns the child and tells it what to try); spawned with
//! `LEASEHOLD_BLOCKING_CHILD_URL` set it is the child, which reads one command a line on stdin
//! (`try`: one attempt; `wait`: wait up to 10 s; `quit`) and answers each on stdout with a line
//! `CHILD GRANTED <fencing token>` or `CHILD REFUSED <error kind>`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use leasehold::{blocking, LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

const CHILD_URL_ENV: &str = "LEASEHOLD_BLOCKING_CHILD_URL";
const TEST_NAME: &str = "a_blocking_guard_held_by_a_thread_excludes_another_process";
const KEY: &str = "nightly-report";
/// The lease TTL: short, so the test also shows the lease outlives it by renewal.
const TTL: Duration = Duration::from_millis(1000);
/// How long the parent waits for one answer of the child before failing.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking manager over the Redis server at `url`, with a short renewed lease.
fn manager(url: String) -> blocking::LockManager {
    blocking::LockManager::connect(move || async move {
        let store = RedisStore::connect(RedisConfig::new(url)).await?;
        Ok(LockManager::builder()
            .client_id("blocking-process")
            .farm_id("f1")
            .lock_ttl(TTL)
            .renewal(true)
            .store(store))
    })
    .expect("a blocking manager on the private redis-server")
}

/// The child: answers the parent's commands until `quit` or the end of its stdin.
fn child(url: String) {
    let locks = manager(url);
    for line in std::io::stdin().lock().lines() {
        let command = line.expect("a command from the parent");
        let attempt = match command.trim() {
            "try" => locks.try_lock(KEY),
            "wait" => locks.lock_with(KEY, LockOptions::new().wait(Duration::from_secs(10))),
            "quit" => break,
            other => panic!("unknown command {other:?}"),
        };
        match attempt {
            Ok(guard) => {
                let fence = guard.fencing_token().expect("Redis fences");
                assert!(guard.release().expect("release"), "still ours");
                println!("CHILD GRANTED {fence}");
            }
            Err(error) => println!("CHILD REFUSED {}", error.kind().as_str()),
        }
    }
}

/// The child process, killed if the test ends early.
struct ChildProcess {
    process: Child,
    stdin: Option<ChildStdin>,
    answers: mpsc::Receiver<String>,
}

impl ChildProcess {
    fn spawn(url: &str) -> Self {
        let mut process = Command::new(std::env::current_exe().expect("the test binary's path"))
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads", "1"])
            .env(CHILD_URL_ENV, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child process");
        let stdin = process.stdin.take();
        let stdout = process.stdout.take().expect("the child's stdout");
        let (send, answers) = mpsc::channel();
        // The harness prints its own output too, and the first answer follows its `test … `
        // on the same line: only the child's answers are forwarded.
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some((_, answer)) = line.split_once("CHILD ") {
                    if send.send(answer.to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        ChildProcess {
            process,
            stdin,
            answers,
        }
    }

    /// Sends `command` and returns the child's answer.
    fn ask(&mut self, command: &str) -> String {
        let stdin = self.stdin.as_mut().expect("the child's stdin");
        writeln!(stdin, "{command}").expect("send a command to the child");
        stdin.flush().expect("flush the command");
        self.answers
            .recv_timeout(ANSWER_TIMEOUT)
            .unwrap_or_else(|e| panic!("no answer from the child to {command:?}: {e}"))
    }

    /// Tells the child to quit and checks it exited cleanly.
    fn finish(mut self) {
        let mut stdin = self.stdin.take().expect("the child's stdin");
        writeln!(stdin, "quit").expect("send quit");
        drop(stdin);
        let status = self.process.wait().expect("wait for the child");
        assert!(status.success(), "the child failed: {status}");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // Already exited after `finish`; otherwise the test failed and the child must not linger.
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The fencing token in a `GRANTED <n>` answer.
fn granted(answer: &str) -> u64 {
    answer
        .strip_prefix("GRANTED ")
        .and_then(|fence| fence.parse().ok())
        .unwrap_or_else(|| panic!("the child was refused: {answer}"))
}

#[test]
fn a_blocking_guard_held_by_a_thread_excludes_another_process() {
    if let Ok(url) = std::env::var(CHILD_URL_ENV) {
        child(url);
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let locks = manager(server.url());
    let mut other = ChildProcess::spawn(&server.url());

    // Free: the child gets it, and gives it back.
    let first_fence = granted(&other.ask("try"));

    // One OS thread of this process takes the lock and holds it until told to drop it. (Not a
    // scoped thread: if an assertion below fails, `drop_send` goes and the holder ends too.)
    let (taken_send, taken) = mpsc::channel();
    let (drop_send, drop_now) = mpsc::channel::<()>();
    let holder = thread::spawn({
        let locks = locks.clone();
        move || {
            let guard = locks
                .try_lock(KEY)
                .expect("the parent's thread takes the lock");
            taken_send
                .send(guard.fencing_token().expect("Redis fences"))
                .expect("report the fencing token");
            drop_now.recv().expect("the signal to drop the guard");
            let held = guard.is_held();
            drop(guard); // released in the background, on the manager's runtime
            held
        }
    });
    let parent_fence = taken
        .recv_timeout(ANSWER_TIMEOUT)
        .expect("the holder's fencing token");
    assert!(
        parent_fence > first_fence,
        "{parent_fence} after {first_fence}"
    );

    // The child is refused while the thread holds, even past the lease's TTL: the manager's
    // runtime renews it while the holding thread is blocked.
    assert_eq!(other.ask("try"), "REFUSED lock_unavailable");
    thread::sleep(TTL * 5 / 2);
    assert_eq!(
        other.ask("try"),
        "REFUSED lock_unavailable",
        "still held after 2.5 TTLs"
    );

    drop_send.send(()).expect("tell the holder to drop");
    let held = holder.join().expect("the holding thread");
    assert!(held, "the holder's lease was renewed throughout");

    // Once the guard is dropped, the child gets the lock: a waiting call at once, then a try.
    let after_drop = granted(&other.ask("wait"));
    assert!(
        after_drop > parent_fence,
        "{after_drop} after {parent_fence}"
    );
    assert!(granted(&other.ask("try")) > after_drop);
    other.finish();
    locks.shutdown().expect("shut the parent's manager down");
    drop(server); // the testkit kills the server by pid
}
