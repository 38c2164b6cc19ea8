//! A private etcd cluster of several members for tests: each member on free loopback ports
//! (client and peer), with its data directory in one temporary directory, short Raft timings
//! (heartbeat 50 ms, election timeout 250 ms) so a new leader is elected within a second, and
//! every process stopped by pid on drop.
//!
//! A test hurts one member — [`kill`](EtcdCluster::kill) (SIGKILL),
//! [`pause`](EtcdCluster::pause) (SIGSTOP: the port still accepts connections, but nothing
//! answers), [`restart`](EtcdCluster::restart) (same ports, same data, as a member coming back
//! after a crash) — and asks which member leads ([`leader`](EtcdCluster::leader), from each
//! member's Maintenance status over etcd's JSON gateway).
//!
//! The tests of one test binary can share one cluster with [`EtcdCluster::shared`]: a cluster
//! lives while a test holds it, so the processes stop when the last test using it ends (a static
//! would never be dropped, and would leave its processes behind).
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! let cluster = leasehold_testkit::etcd_cluster::EtcdCluster::start(3)?;
//! println!("connect to {}", cluster.url()); // etcd://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>
//! let leader = cluster.wait_for_leader()?;
//! cluster.kill(leader)?;
//! let next = cluster.wait_for_leader()?; // elected by the two others
//! assert_ne!(next, leader);
//! cluster.restart(leader)?;
//! # Ok(()) }
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::redis::free_port;

/// How long the members may take to report healthy after they were started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`EtcdCluster::wait_for_leader`] and [`EtcdCluster::wait_healthy`] wait.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Raft heartbeat interval, in milliseconds.
const HEARTBEAT_MS: u32 = 50;
/// Raft election timeout, in milliseconds: a leader lost is replaced within about this, plus a
/// round or two.
const ELECTION_MS: u32 = 250;

/// A cluster of `etcd` processes owned by a test.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Mutex<Member>>,
    /// `name=http://127.0.0.1:<peer port>,…`, the same for every member.
    initial_cluster: String,
    dir: tempfile::TempDir,
}

/// One member: its ports and its process while it runs.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    paused: bool,
}

/// How a member is hurt, for [`EtcdCluster::hurt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL: the port refuses connections until [`EtcdCluster::restart`].
    Kill,
    /// SIGSTOP: the port still accepts connections but nothing answers until
    /// [`EtcdCluster::resume`].
    Pause,
}

impl EtcdCluster {
    /// Starts a cluster of `size` members on free ports of 127.0.0.1 and waits until every member
    /// is healthy (which needs an elected leader).
    ///
    /// Fails with [`io::ErrorKind::NotFound`] and a message naming Debian's `etcd-server` package
    /// when the `etcd` binary is missing.
    pub fn start(size: usize) -> io::Result<Self> {
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one member",
            ));
        }
        // A port free a moment ago can be taken by a server another test starts at the same time;
        // then a member cannot bind, and the whole cluster is started again on new ports.
        let mut attempts = 0;
        loop {
            match Self::start_once(size) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempts < 5 => attempts += 1,
                result => return result,
            }
        }
    }

    fn start_once(size: usize) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-etcd-cluster-")
            .tempdir()?;
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
                paused: false,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let cluster = EtcdCluster {
            members: members.into_iter().map(Mutex::new).collect(),
            initial_cluster,
            dir,
        };
        // All members start before any can be healthy: a member alone has no quorum.
        for i in 0..size {
            let mut member = cluster.member(i);
            cluster.spawn(&mut member)?;
        }
        let started = Instant::now();
        for i in 0..size {
            cluster.wait_member(i, started, STARTUP_TIMEOUT)?;
        }
        Ok(cluster)
    }

    /// The cluster of this test binary that a test holds at the moment, or a new one of `size`
    /// members. It lives while a test holds the returned handle: tests that run at the same
    /// time share it (use separate key names), and the last one to finish stops it.
    pub fn shared(
        slot: &'static Mutex<Weak<EtcdCluster>>,
        size: usize,
    ) -> io::Result<Arc<EtcdCluster>> {
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cluster) = slot.upgrade() {
            return Ok(cluster);
        }
        let cluster = Arc::new(EtcdCluster::start(size)?);
        *slot = Arc::downgrade(&cluster);
        Ok(cluster)
    }

    /// How many members the cluster has (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// `127.0.0.1:<client port>` of member `i`, for `EtcdConfig::new`.
    ///
    /// # Panics
    /// When `i` is not a member's index.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.member(i).client_port)
    }

    /// Every member's endpoint, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.endpoint(i)).collect()
    }

    /// `etcd://127.0.0.1:<p0>,127.0.0.1:<p1>,…`, the store URL with every member in member order.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The store URL with the members in this order (e.g. the member to be hurt first).
    pub fn url_in_order(&self, order: &[usize]) -> String {
        let endpoints: Vec<String> = order.iter().map(|&i| self.endpoint(i)).collect();
        format!("etcd://{}", endpoints.join(","))
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.member(i).child.as_ref().map(Child::id)
    }

    /// Hurts member `i` as `fault` says.
    pub fn hurt(&self, i: usize, fault: Fault) -> io::Result<()> {
        match fault {
            Fault::Kill => self.kill(i),
            Fault::Pause => self.pause(i),
        }
    }

    /// Undoes [`hurt`](Self::hurt): restarts a killed member, resumes a paused one, and waits
    /// until it is healthy again.
    pub fn heal(&self, i: usize) -> io::Result<()> {
        self.undo(i)?;
        self.wait_member(i, Instant::now(), SETTLE_TIMEOUT)
    }

    /// Resumes member `i` if paused, starts it if killed.
    fn undo(&self, i: usize) -> io::Result<()> {
        let mut member = self.member(i);
        if member.paused {
            drop(member);
            self.resume(i)
        } else if member.child.is_none() {
            self.spawn(&mut member)
        } else {
            Ok(())
        }
    }

    /// Kills member `i` (SIGKILL, by pid) and waits for it to exit. Its data directory stays.
    pub fn kill(&self, i: usize) -> io::Result<()> {
        let mut member = self.member(i);
        member.paused = false;
        if let Some(mut child) = member.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Pauses member `i` (SIGSTOP): its ports still accept connections, but it answers nothing
    /// and sends no heartbeats until [`resume`](Self::resume).
    pub fn pause(&self, i: usize) -> io::Result<()> {
        let mut member = self.member(i);
        let Some(pid) = member.child.as_ref().map(Child::id) else {
            return Err(io::Error::other(format!("member {i} is not running")));
        };
        crate::process::pause(pid)?;
        member.paused = true;
        Ok(())
    }

    /// Resumes a paused member (SIGCONT).
    pub fn resume(&self, i: usize) -> io::Result<()> {
        let mut member = self.member(i);
        if let Some(pid) = member.child.as_ref().map(Child::id) {
            crate::process::resume(pid)?;
        }
        member.paused = false;
        Ok(())
    }

    /// Kills member `i` (if it runs) and starts it again on the same ports with the same data,
    /// then waits until it is healthy.
    pub fn restart(&self, i: usize) -> io::Result<()> {
        self.kill(i)?;
        self.heal(i)
    }

    /// Restarts every member that was killed and resumes every paused one, then waits until all
    /// are healthy: what a test does after it hurt the cluster, so the next test sees it whole.
    pub fn heal_all(&self) -> io::Result<()> {
        // Every member first: a member alone may have no quorum to be healthy with.
        for i in 0..self.size() {
            self.undo(i)?;
        }
        self.wait_healthy()
    }

    /// Waits until every member runs and says it is healthy (it has a leader and serves).
    pub fn wait_healthy(&self) -> io::Result<()> {
        let started = Instant::now();
        for i in 0..self.size() {
            self.wait_member(i, started, SETTLE_TIMEOUT)?;
        }
        Ok(())
    }

    /// The member that leads, as the running, unpaused members see it: `None` while they have
    /// none (an election is under way, or no quorum) or cannot be asked.
    pub fn leader(&self) -> Option<usize> {
        let mut ids = Vec::with_capacity(self.size());
        let mut leader = None;
        for i in 0..self.size() {
            let asked = {
                let member = self.member(i);
                member.child.is_some() && !member.paused
            };
            let status = if asked { self.status(i).ok() } else { None };
            match status {
                Some(status) => {
                    // The leader the first member asked reports: the others agree once settled.
                    if leader.is_none() && status.leader != 0 {
                        leader = Some(status.leader);
                    }
                    ids.push(Some(status.member_id));
                }
                None => ids.push(None),
            }
        }
        let leader = leader?;
        ids.iter().position(|id| *id == Some(leader))
    }

    /// Waits until the running, unpaused members agree on a leader among them, and returns it.
    pub fn wait_for_leader(&self) -> io::Result<usize> {
        let started = Instant::now();
        loop {
            if let Some(leader) = self.leader() {
                let agreed = (0..self.size()).all(|i| {
                    let member = self.member(i);
                    if member.child.is_none() || member.paused {
                        return true;
                    }
                    drop(member);
                    let Ok(status) = self.status(i) else {
                        return false;
                    };
                    self.status(leader)
                        .is_ok_and(|l| l.member_id == status.leader)
                });
                if agreed {
                    return Ok(leader);
                }
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(io::Error::other(format!(
                    "no leader agreed within {SETTLE_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The member `i` is not: some other member (the one after it), for a test that hurts `i`.
    pub fn other_than(&self, i: usize) -> usize {
        (i + 1) % self.size()
    }

    fn member(&self, i: usize) -> MutexGuard<'_, Member> {
        self.members[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn log_path(&self, member: &Member) -> PathBuf {
        self.dir.path().join(format!("{}.log", member.name))
    }

    fn spawn(&self, member: &mut Member) -> io::Result<()> {
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(member))?;
        // A data directory that exists (a restart) ignores the initial-cluster flags: the member
        // rejoins the cluster its log names.
        let child = Command::new("etcd")
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "leasehold-test"])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "etcd not found: install Debian's `etcd-server` package \
                         (apt-get install -y etcd-server) to run the etcd tests",
                    )
                } else {
                    e
                }
            })?;
        member.child = Some(child);
        member.paused = false;
        Ok(())
    }

    /// Waits until member `i` runs and answers healthy, or fails with its log.
    fn wait_member(&self, i: usize, started: Instant, timeout: Duration) -> io::Result<()> {
        loop {
            let (exited, addr) = {
                let mut member = self.member(i);
                let exited = member
                    .child
                    .as_mut()
                    .map_or(Ok(true), |c| c.try_wait().map(|s| s.is_some()))?;
                (exited, member_addr(&member))
            };
            if !exited && healthy(addr) {
                return Ok(());
            }
            if exited || started.elapsed() > timeout {
                let mut member = self.member(i);
                let log = std::fs::read_to_string(self.log_path(&member)).unwrap_or_default();
                if let Some(mut child) = member.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                if log.contains("address already in use") {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "port {} or {} is taken: {log}",
                            member.client_port, member.peer_port
                        ),
                    ));
                }
                return Err(io::Error::other(format!(
                    "etcd member {} on port {} did not come up ({}); its log:\n{log}",
                    member.name,
                    member.client_port,
                    if exited { "it exited" } else { "timeout" }
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Member `i`'s Maintenance status, through etcd's JSON gateway.
    fn status(&self, i: usize) -> io::Result<Status> {
        let addr = member_addr(&self.member(i));
        let body = post(addr, "/v3/maintenance/status", "{}")?;
        let field = |name: &str| {
            json_u64(&body, name).ok_or_else(|| {
                io::Error::other(format!("no {name:?} in the status answer: {body}"))
            })
        };
        Ok(Status {
            member_id: field("member_id")?,
            leader: json_u64(&body, "leader").unwrap_or(0),
        })
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &self.members {
            let mut member = member.lock().unwrap_or_else(PoisonError::into_inner);
            // SIGKILL ends a stopped process too.
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// What a member says of itself and its leader.
#[derive(Debug, Clone, Copy)]
struct Status {
    member_id: u64,
    /// 0 while it knows no leader.
    leader: u64,
}

fn member_addr(member: &Member) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, member.client_port))
}

/// Sends `SIG<name>` to `pid` with `kill(1)` (the testkit has no signal bindings).
/// `GET /health` answers `"health":"true"`.
fn healthy(addr: SocketAddr) -> bool {
    request(addr, "GET", "/health", "").is_ok_and(|body| body.contains("\"health\":\"true\""))
}

fn post(addr: SocketAddr, path: &str, body: &str) -> io::Result<String> {
    request(addr, "POST", path, body)
}

/// One HTTP/1.1 request on a new connection, the whole answer (head and body) as text.
fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(250))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.set_write_timeout(Some(Duration::from_millis(500)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    for line in BufReader::new(stream).lines() {
        answer.push_str(&line?);
    }
    Ok(answer)
}

/// The unsigned number in `"name":"123"` or `"name":123` (the JSON gateway writes 64-bit
/// numbers as strings).
fn json_u64(body: &str, name: &str) -> Option<u64> {
    let at = body.find(&format!("\"{name}\":"))? + name.len() + 3;
    let digits: String = body[at..]
        .trim_start_matches([' ', '"'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_are_read_as_strings_or_numbers() {
        let body = r#"{"header":{"cluster_id":"1","member_id":"42"},"leader":"7","raftTerm":3}"#;
        assert_eq!(json_u64(body, "member_id"), Some(42));
        assert_eq!(json_u64(body, "leader"), Some(7));
        assert_eq!(json_u64(body, "raftTerm"), Some(3));
        assert_eq!(json_u64(body, "missing"), None);
    }

    #[test]
    fn a_killed_leader_is_replaced_and_comes_back() {
        let cluster = EtcdCluster::start(3).unwrap();
        let leader = cluster.wait_for_leader().unwrap();
        cluster.kill(leader).unwrap();
        let next = cluster.wait_for_leader().unwrap();
        assert_ne!(next, leader);
        cluster.pause(next).unwrap();
        cluster.heal_all().unwrap();
        assert!(cluster.leader().is_some());
        let pids: Vec<u32> = (0..3).filter_map(|i| cluster.pid(i)).collect();
        assert_eq!(pids.len(), 3);
        drop(cluster);
        for pid in pids {
            // Killed and reaped: the pid is gone (or, rarely, reused by a process that is not
            // etcd).
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            assert_ne!(comm.trim(), "etcd", "member {pid} still runs");
        }
    }
}
