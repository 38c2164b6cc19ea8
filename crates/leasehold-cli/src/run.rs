//! `leasehold run KEY -- CMD ARGS…`: a command under a lock.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use leasehold::scenario::AcquireMode;
use leasehold::{BoxStore, ErrorKind, LockMode, LockOptions, LockStore, MemoryStore};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin::LockView;
use crate::cli::{Global, RunArgs};
use crate::exit::{self, CliError};
use crate::store::{check_lease, Names};

/// The lease TTL of `run` without `--ttl` or a scenario.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

pub(crate) async fn run(global: &Global, args: RunArgs) -> Result<u8, CliError> {
    // Refused before connecting: a bad key, scenario, lock mode, TTL or label.
    let names = Names::parse(global)?;
    let key = names.key(&args.key)?;
    let registry = match &args.config {
        Some(path) => crate::scenarios::load(path)?,
        None => leasehold::scenario::ScenarioRegistry::new(),
    };
    if let Some(name) = &args.scenario {
        if registry.get(name).is_none() {
            return Err(CliError::usage(format!(
                "no scenario named `{name}` in {}; it has: {}",
                args.config
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                registry
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let mode = match (args.shared, args.permits) {
        (true, _) => LockMode::Shared,
        (false, Some(permits)) => {
            LockMode::semaphore(permits).map_err(|e| CliError::usage(e.chain().to_string()))?
        }
        (false, None) => LockMode::Exclusive,
    };
    check_lease(args.ttl, args.label.as_deref())?;
    let mut opts = LockOptions::new().renew(true);
    if mode != LockMode::Exclusive {
        opts = opts.mode(mode);
    }
    if let Some(name) = &args.scenario {
        opts = opts.scenario(name.as_str());
    }
    let scenario = args
        .scenario
        .as_deref()
        .and_then(|n| registry.get(n))
        .or_else(|| registry.matching(key.entity_id()));
    if let Some(ttl) = args.ttl.or(scenario.is_none().then_some(DEFAULT_TTL)) {
        opts = opts.ttl(ttl);
    }
    let try_only = scenario.is_some_and(|s| s.acquire_mode() == AcquireMode::Try);
    let wait = match (args.wait, scenario) {
        (Some(wait), Some(s)) if try_only && !wait.is_zero() => {
            return Err(CliError::usage(format!(
                "scenario `{}` is try-only: drop --wait, or make the scenario blocking",
                s.name()
            )))
        }
        (Some(wait), _) => wait,
        (None, Some(_)) if try_only => Duration::ZERO,
        (None, Some(s)) => s
            .wait_for_lock()
            .unwrap_or(leasehold::DEFAULT_WAIT_FOR_LOCK),
        (None, None) => Duration::ZERO,
    };
    opts = opts.wait(wait);
    if let Some(label) = &args.label {
        opts = opts.label(label.as_str());
    }
    if let Some(period) = args.at_least {
        opts = opts.hold_at_least(period);
    }
    // The lock call's own checks (the scenario it resolves to, a renewal against the TTL, a
    // strict registry), on the embedded store: a bad call is exit 2 before any connection.
    names
        .manager_over(BoxStore::new(MemoryStore::new()), registry.clone())
        .and_then(|probe| probe.check(&key, &opts))
        .map_err(|e| CliError::usage(e.chain().to_string()))?;
    let target = names.connect().await?;
    let manager = target.manager_with(registry)?;
    // Listened for from the start, so none is missed: a signal while waiting stops the wait
    // cleanly instead of killing the process with its place in line (see `stop_waiting`).
    let mut forwarded = Forwarded::listen()
        .map_err(|e| CliError::new(exit::FAILURE, format!("cannot listen for signals: {e}")))?;
    let acquiring = async {
        if wait.is_zero() {
            manager.try_lock_with(&key, opts).await
        } else {
            manager.lock_with(&key, opts).await
        }
    };
    let acquired = tokio::select! {
        acquired = acquiring => Some(acquired),
        _ = forwarded.recv() => None,
    };
    let Some(acquired) = acquired else {
        return Ok(stop_waiting(&manager, &mut forwarded).await);
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(e) if matches!(e.kind(), ErrorKind::LockUnavailable | ErrorKind::Timeout) => {
            let holder = match target.store.inspect(&key).await {
                Ok(Some(info)) => LockView::new(&info).sentence(),
                _ => format!("{key} is held by another owner"),
            };
            let waited = if wait.is_zero() {
                String::new()
            } else {
                format!(" (waited {})", crate::admin::human(wait))
            };
            return Err(CliError::new(
                args.conflict_exit_code,
                format!("{holder}{waited}"),
            ));
        }
        // Held as another kind of lock (an exclusive hold against `--permits`, say): held by
        // someone else all the same, until they release it.
        Err(e) if e.kind() == ErrorKind::ModeConflict => {
            return Err(CliError::new(
                args.conflict_exit_code,
                e.chain().to_string(),
            ))
        }
        Err(e) => return Err(target.error(e)),
    };

    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("LEASEHOLD_KEY", key.as_str())
        .env("LEASEHOLD_TOKEN", guard.token().as_str());
    if let Some(fence) = guard.fencing_token() {
        command.env("LEASEHOLD_FENCING_TOKEN", fence.to_string());
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            return Err(CliError::new(
                127,
                format!("cannot run {:?}: {e}", args.command[0]),
            ));
        }
    };
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    let forward = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };

    let mut lost_reported = false;
    // Set once SIGTERM was sent for a lost lock: when SIGKILL follows if the command is still
    // running (a command that ignores SIGTERM must not go on unprotected).
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = forwarded.recv() => forward(sig),
            lost = guard.lost(), if !lost_reported => {
                lost_reported = true;
                eprintln!("leasehold: {lost}; the command is no longer protected by the lock");
                if args.kill_on_lost {
                    eprintln!("leasehold: --kill-on-lost: sending SIGTERM to the command");
                    forward(Signal::SIGTERM);
                    kill_at = Some(tokio::time::Instant::now() + args.kill_grace);
                }
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)),
                if kill_at.is_some() =>
            {
                kill_at = None;
                eprintln!(
                    "leasehold: --kill-on-lost: the command outlived SIGTERM by {:?}; sending \
                     SIGKILL",
                    args.kill_grace
                );
                forward(Signal::SIGKILL);
            }
        }
    };
    // The renewal may have found the lock lost just as the command exited, with `select!`
    // picking the exit first: that counts as lost too.
    if !lost_reported && !guard.is_held() {
        lost_reported = true;
        eprintln!("leasehold: the lock was lost while the command ran");
    }
    match guard.release().await {
        Ok(true) => {}
        // Nothing saw the loss while the command ran (an operator broke the lock between two
        // renewals, say), but the lock was not ours when it ended: part of the work may have
        // run unprotected.
        Ok(false) if !lost_reported => {
            lost_reported = true;
            eprintln!(
                "leasehold: {key} was no longer held by this command when it ended (released \
                 by someone else, or expired)"
            );
        }
        Ok(false) => {}
        Err(e) => eprintln!(
            "leasehold: releasing {key} failed: {}; it expires at its TTL",
            e.chain()
        ),
    }
    let status = status.map_err(|e| {
        CliError::new(
            exit::FAILURE,
            format!("waiting for the command failed: {e}"),
        )
    })?;
    let child_status = match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::FAILURE),
        (None, Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        (None, None) => exit::FAILURE,
    };
    if lost_reported {
        // Whatever the command reports, part of its work ran without the lock: a script must
        // not mistake that for a protected success.
        eprintln!(
            "leasehold: the command exited with status {child_status}, but the lock was lost \
             while it ran; exiting with {}",
            args.lost_exit_code
        );
        return Ok(args.lost_exit_code);
    }
    Ok(child_status)
}

/// The signals `run` passes on to its command: a supervisor that signals `leasehold run` means
/// the command (interrupt, terminate, hang up or reload, quit, user signals).
pub(crate) struct Forwarded {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
    /// The last signal [`recv`](Self::recv) returned.
    last: Option<Signal>,
}

impl Forwarded {
    const SIGNALS: [(Signal, SignalKind); 6] = [
        (Signal::SIGINT, SignalKind::interrupt()),
        (Signal::SIGTERM, SignalKind::terminate()),
        (Signal::SIGHUP, SignalKind::hangup()),
        (Signal::SIGQUIT, SignalKind::quit()),
        (Signal::SIGUSR1, SignalKind::user_defined1()),
        (Signal::SIGUSR2, SignalKind::user_defined2()),
    ];

    pub(crate) fn listen() -> std::io::Result<Self> {
        let streams = Self::SIGNALS
            .iter()
            .map(|(sig, kind)| signal(*kind).map(|stream| (*sig, stream)))
            .collect::<std::io::Result<_>>()?;
        Ok(Forwarded {
            streams,
            last: None,
        })
    }

    /// The last signal received (SIGTERM before any).
    pub(crate) fn last(&self) -> Signal {
        self.last.unwrap_or(Signal::SIGTERM)
    }

    /// The next signal received, of any of the forwarded kinds.
    pub(crate) async fn recv(&mut self) -> Signal {
        let sig = std::future::poll_fn(|cx| {
            for (sig, stream) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await;
        self.last = Some(sig);
        sig
    }
}

/// After a signal while a lock call waited (its future dropped): shuts the manager down, which
/// waits for the call's undo in the background (its place in the waiter line left, a grant that
/// landed meanwhile released), so the process exits leaving neither in the store; a second
/// signal meanwhile exits at once (a store that does not answer must not hold the process).
/// Returns the status of a process ended by the first signal, 128 + its number.
pub(crate) async fn stop_waiting(
    manager: &leasehold::LockManager,
    forwarded: &mut Forwarded,
) -> u8 {
    let sig = forwarded.last();
    tokio::select! {
        shut = manager.shutdown() => if let Err(e) = shut {
            eprintln!("leasehold: stopping the wait: {}", e.chain());
        },
        again = forwarded.recv() => eprintln!(
            "leasehold: {again} while stopping the wait: exiting without waiting for the store"
        ),
    }
    128u8.saturating_add(sig as u8)
}
