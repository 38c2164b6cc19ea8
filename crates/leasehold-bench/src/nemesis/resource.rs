//! The fenced resource: a small loopback TCP service that stands for the system a lock protects
//! (a database row, a file). It accepts a write only with a fencing token at least the highest it
//! has accepted, and records every write — token, worker, its start and end on the machine-wide
//! clock, accepted or rejected — so the checker can tell what the fence let through.
//!
//! It also carries out **client pauses**: armed with [`FencedResource::pause_next_holder`], it
//! stops (SIGSTOP) the worker process whose next begin write it accepts, before answering, and
//! continues it (SIGCONT) after the pause. The worker then holds the lock, has written once, and
//! wakes past its lease to send its commit write with the old token: the garbage-collection pause
//! of the fencing argument, placed exactly where it hurts.
//!
//! Protocol, one line each way: `HELLO <worker> <pid>` → `OK`;
//! `W <worker> <seq> <phase> <token|->` → `A` (accepted) or `R <highest>` (rejected).

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::clock::now_ns;
use super::history::{ClientPause, WriteOutcome, WriteRecord};

/// The resource's state, shared by its connections and the nemesis.
#[derive(Debug, Default)]
struct State {
    highest: Option<u64>,
    writes: Vec<WriteRecord>,
    /// Worker → process id, from each connection's `HELLO`.
    pids: HashMap<usize, u32>,
    /// A client pause to carry out on the next accepted begin write, and for how long.
    armed: Option<Duration>,
    pauses: Vec<ClientPause>,
    /// Workers stopped now (so the end of a run can continue them whatever happens).
    stopped: HashMap<usize, u32>,
}

/// A running fenced resource; stops accepting on drop (and continues any worker it stopped).
#[derive(Debug)]
pub struct FencedResource {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl FencedResource {
    /// Starts the resource on a free port of 127.0.0.1, on the current tokio runtime.
    pub async fn start() -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state: Arc<Mutex<State>> = Arc::default();
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(stream, state.clone()));
                }
            }
        });
        Ok(FencedResource { addr, state, task })
    }

    /// Where workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Arms a client pause: the worker whose next begin write is accepted is stopped for
    /// `pause`. Returns how many pauses were carried out before (to wait for the next with
    /// [`pauses_started`](Self::pauses_started)).
    pub fn pause_next_holder(&self, pause: Duration) -> usize {
        let mut state = lock(&self.state);
        state.armed = Some(pause);
        state.pauses.len()
    }

    /// Disarms a client pause that found no holder.
    pub fn disarm(&self) {
        lock(&self.state).armed = None;
    }

    /// How many client pauses have started.
    pub fn pauses_started(&self) -> usize {
        lock(&self.state).pauses.len()
    }

    /// Whether every client pause started has ended (its worker continued).
    pub fn no_worker_stopped(&self) -> bool {
        lock(&self.state).stopped.is_empty()
    }

    /// Continues every worker still stopped (the end of a run, whatever happened).
    pub fn continue_all(&self) {
        let mut state = lock(&self.state);
        let now = now_ns();
        for (worker, pid) in std::mem::take(&mut state.stopped) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            if let Some(pause) = state
                .pauses
                .iter_mut()
                .rev()
                .find(|p| p.worker == worker && p.resumed_ns == 0)
            {
                pause.resumed_ns = now;
            }
        }
    }

    /// Every write so far, in the order the resource decided them.
    pub fn writes(&self) -> Vec<WriteRecord> {
        lock(&self.state).writes.clone()
    }

    /// Every client pause so far.
    pub fn pauses(&self) -> Vec<ClientPause> {
        lock(&self.state).pauses.clone()
    }
}

impl Drop for FencedResource {
    fn drop(&mut self) {
        self.continue_all();
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One worker's connection: a line in, a line out, until it closes.
async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let start_ns = now_ns();
        let answer = answer(&line, start_ns, &state);
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Decides one request and records it.
fn answer(line: &str, start_ns: u64, state: &Arc<Mutex<State>>) -> String {
    let fields: Vec<&str> = line.split_whitespace().collect();
    match fields.as_slice() {
        ["HELLO", worker, pid] => {
            if let (Ok(worker), Ok(pid)) = (worker.parse(), pid.parse()) {
                lock(state).pids.insert(worker, pid);
                return "OK\n".to_owned();
            }
            "ERR bad hello\n".to_owned()
        }
        ["W", worker, seq, phase, token] => {
            let (Ok(worker), Ok(seq), Ok(phase)) = (worker.parse(), seq.parse(), phase.parse())
            else {
                return "ERR bad write\n".to_owned();
            };
            let token: Option<u64> = token.parse().ok();
            let mut guard = lock(state);
            let s = &mut *guard;
            let highest_before = s.highest;
            // A store without fencing gives no token: such writes cannot be fenced and pass.
            let accepted = match (token, s.highest) {
                (Some(t), Some(h)) => t >= h,
                _ => true,
            };
            if accepted {
                if let Some(t) = token {
                    s.highest = Some(s.highest.map_or(t, |h| h.max(t)));
                }
            }
            if accepted && phase == 1 {
                if let (Some(pause), Some(&pid)) = (s.armed, s.pids.get(&worker)) {
                    s.armed = None;
                    stop_for(s, state.clone(), worker, seq, token, pid, pause);
                }
            }
            s.writes.push(WriteRecord {
                worker,
                seq,
                phase,
                token,
                start_ns,
                end_ns: now_ns(),
                accepted,
                highest_before,
            });
            if accepted {
                "A\n".to_owned()
            } else {
                format!("R {}\n", highest_before.unwrap_or(0))
            }
        }
        _ => "ERR unknown request\n".to_owned(),
    }
}

/// Stops `worker` now (before it reads the answer to its write) and continues it after `pause`
/// on a thread of its own.
fn stop_for(
    s: &mut State,
    state: Arc<Mutex<State>>,
    worker: usize,
    seq: u64,
    token: Option<u64>,
    pid: u32,
    pause: Duration,
) {
    let target = Pid::from_raw(pid as i32);
    if kill(target, Signal::SIGSTOP).is_err() {
        return;
    }
    s.stopped.insert(worker, pid);
    s.pauses.push(ClientPause {
        worker,
        seq,
        token,
        paused_ns: now_ns(),
        resumed_ns: 0,
    });
    std::thread::spawn(move || {
        std::thread::sleep(pause);
        let mut s = lock(&state);
        // Continued already if the run ended meanwhile.
        if s.stopped.remove(&worker).is_some() {
            let _ = kill(target, Signal::SIGCONT);
            let now = now_ns();
            if let Some(p) = s
                .pauses
                .iter_mut()
                .rev()
                .find(|p| p.worker == worker && p.resumed_ns == 0)
            {
                p.resumed_ns = now;
            }
        }
    });
}

/// A worker's connection to the resource.
#[derive(Debug)]
pub struct ResourceClient {
    worker: usize,
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl ResourceClient {
    /// Connects as `worker` and says which process it is.
    pub async fn connect(addr: SocketAddr, worker: usize) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let mut client = ResourceClient {
            worker,
            lines: BufReader::new(read).lines(),
            write,
        };
        let hello = format!("HELLO {worker} {}\n", std::process::id());
        client.write.write_all(hello.as_bytes()).await?;
        match client.lines.next_line().await? {
            Some(ok) if ok == "OK" => Ok(client),
            other => Err(io::Error::other(format!(
                "the resource answered {other:?} to HELLO"
            ))),
        }
    }

    /// Writes phase `phase` of acquisition `seq` with `token`; what the fence said.
    pub async fn write(&mut self, seq: u64, phase: u8, token: Option<u64>) -> WriteOutcome {
        let token = token.map_or_else(|| "-".to_owned(), |t| t.to_string());
        let request = format!("W {} {seq} {phase} {token}\n", self.worker);
        if self.write.write_all(request.as_bytes()).await.is_err() {
            return WriteOutcome::Failed;
        }
        match self.lines.next_line().await {
            Ok(Some(answer)) if answer == "A" => WriteOutcome::Accepted,
            Ok(Some(answer)) if answer.starts_with('R') => WriteOutcome::Rejected,
            _ => WriteOutcome::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_fence_rejects_a_lower_token_and_records_everything() {
        let resource = FencedResource::start().await.unwrap();
        let mut a = ResourceClient::connect(resource.addr(), 0).await.unwrap();
        let mut b = ResourceClient::connect(resource.addr(), 1).await.unwrap();
        assert_eq!(a.write(0, 1, Some(5)).await, WriteOutcome::Accepted);
        assert_eq!(b.write(0, 1, Some(6)).await, WriteOutcome::Accepted);
        assert_eq!(a.write(0, 2, Some(5)).await, WriteOutcome::Rejected);
        assert_eq!(
            b.write(0, 2, Some(6)).await,
            WriteOutcome::Accepted,
            "equal passes"
        );
        let writes = resource.writes();
        assert_eq!(writes.len(), 4);
        assert!(!writes[2].accepted && writes[2].highest_before == Some(6));
        assert!(writes.iter().all(|w| w.start_ns <= w.end_ns));
    }
}
