//! Signals to the servers the tests started, by pid: pausing one waits until the kernel has
//! actually stopped it, so a test's next request never races the stop.

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long [`pause`] waits for the process to show as stopped.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Sends `SIG<name>` (`STOP`, `CONT`, `TERM`, `KILL`) to `pid` with `kill(1)`.
pub fn signal(pid: u32, name: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "kill -{name} {pid} failed: {status}"
        )))
    }
}

/// SIGSTOP, then waits until `/proc/<pid>/stat` says the process is stopped: `kill` returns
/// when the signal is queued, and a server still running its last instructions could answer
/// a request sent right after.
pub fn pause(pid: u32) -> io::Result<()> {
    signal(pid, "STOP")?;
    let give_up = Instant::now() + STOP_WAIT;
    loop {
        if is_stopped(pid)? {
            return Ok(());
        }
        if Instant::now() >= give_up {
            return Err(io::Error::other(format!(
                "process {pid} did not stop within {STOP_WAIT:?} of SIGSTOP"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// SIGCONT.
pub fn resume(pid: u32) -> io::Result<()> {
    signal(pid, "CONT")
}

/// Whether the process is stopped (state `T`, or `t` under a tracer).
fn is_stopped(pid: u32) -> io::Result<bool> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // `pid (comm) state ...`: the command may hold spaces and parentheses, so read after the
    // last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    Ok(matches!(state, Some("T" | "t")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_process_reads_as_stopped_until_resumed() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!is_stopped(pid).unwrap());
        pause(pid).unwrap();
        assert!(is_stopped(pid).unwrap());
        resume(pid).unwrap();
        let give_up = Instant::now() + STOP_WAIT;
        while is_stopped(pid).unwrap() {
            assert!(Instant::now() < give_up, "resumed");
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
