//! An Aerospike node as an OS process of its own: the testkit's wire fixture served by this
//! binary re-spawned with a role, so the nemesis can SIGKILL, SIGSTOP and restart it by pid as it
//! does a redis-server or an etcd member (the fixture in the coordinator's own process could only
//! be frozen, not killed).

use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_testkit::aerospike::AerospikeFixture;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::ROLE_ENV;

/// The role a node process is spawned with.
pub const ROLE: &str = "aerospike-node";
/// The environment variable with the address the node binds.
pub const BIND_ENV: &str = "NEMESIS_AEROSPIKE_BIND";
/// The namespace it serves.
pub const NAMESPACE: &str = "test";

/// The node's main: serves the fixture on `bind` until the process is killed.
pub fn serve(bind: SocketAddr) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let fixture = AerospikeFixture::builder()
            .bind(bind)
            .namespace(NAMESPACE)
            .start()
            .await?;
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "listening on {}", fixture.addr())?;
        stdout.flush()?;
        drop(stdout);
        // Served until SIGKILL: a node that dies never cleans up.
        std::future::pending::<()>().await;
        drop(fixture);
        Ok(())
    })
}

/// A node process owned by the coordinator, stopped by pid on drop.
#[derive(Debug)]
pub struct AerospikeNode {
    exe: std::path::PathBuf,
    addr: SocketAddr,
    child: Option<Child>,
}

impl AerospikeNode {
    /// Starts a node on a free loopback port with `exe` (the nemesis binary).
    pub fn start(exe: &std::path::Path) -> io::Result<Self> {
        let port = leasehold_testkit::redis::free_port()?;
        let mut node = AerospikeNode {
            exe: exe.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: None,
        };
        node.spawn()?;
        Ok(node)
    }

    /// `127.0.0.1:<port>`.
    pub fn host_string(&self) -> String {
        self.addr.to_string()
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and wait for it to exit: every record is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub fn pause(&self, stop: bool) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the Aerospike node is not running"))?;
        let signal = if stop {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(Pid::from_raw(pid as i32), signal).map_err(io::Error::from)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let started = Instant::now();
        loop {
            let mut child = Command::new(&self.exe)
                .env(ROLE_ENV, ROLE)
                .env(BIND_ENV, self.addr.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| io::Error::other("no stdout"))?;
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            if line.starts_with("listening on") {
                self.child = Some(child);
                return Ok(());
            }
            let _ = child.kill();
            let _ = child.wait();
            // The port of a node killed a moment ago can still be held briefly.
            if started.elapsed() > Duration::from_secs(10) {
                return Err(io::Error::other(format!(
                    "the Aerospike node on {} did not come up",
                    self.addr
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for AerospikeNode {
    fn drop(&mut self) {
        self.kill();
    }
}
