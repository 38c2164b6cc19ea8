//! `leasehold run KEY -- CMD ARGS…`: a command under a lock.

use std::os::unix::process::ExitStatusExt;

use leasehold::{ErrorKind, LockOptions, LockStore};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin::LockView;
use crate::cli::{Global, RunArgs};
use crate::exit::{self, CliError};
use crate::store::Target;

pub(crate) async fn run(global: &Global, args: RunArgs) -> Result<u8, CliError> {
    let target = Target::connect(global).await?;
    let key = target.key(&args.key)?;
    let manager = target.manager()?;
    let opts = LockOptions::new().ttl(args.ttl).wait(args.wait).renew(true);
    let acquired = if args.wait.is_zero() {
        manager.try_lock_with(&key, opts).await
    } else {
        manager.lock_with(&key, opts).await
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(e) if matches!(e.kind(), ErrorKind::LockUnavailable | ErrorKind::Timeout) => {
            let holder = match target.store.inspect(&key).await {
                Ok(Some(info)) => LockView::new(&info).sentence(),
                _ => format!("{key} is held by another owner"),
            };
            let waited = if args.wait.is_zero() {
                String::new()
            } else {
                format!(" (waited {})", crate::admin::human(args.wait))
            };
            return Err(CliError::new(
                args.conflict_exit_code,
                format!("{holder}{waited}"),
            ));
        }
        Err(e) => return Err(target.error(e)),
    };

    // Listen for signals before the child exists, so none is missed.
    let (mut sigint, mut sigterm) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            let _ = guard.release().await;
            return Err(CliError::new(
                exit::FAILURE,
                format!("cannot listen for signals: {e}"),
            ));
        }
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
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = sigint.recv() => forward(Signal::SIGINT),
            _ = sigterm.recv() => forward(Signal::SIGTERM),
            lost = guard.lost(), if !lost_reported => {
                lost_reported = true;
                eprintln!("leasehold: {lost}; the command is no longer protected by the lock");
                if args.kill_on_lost {
                    eprintln!("leasehold: --kill-on-lost: sending SIGTERM to the command");
                    forward(Signal::SIGTERM);
                }
            }
        }
    };
    let released = guard.release().await;
    if let Err(e) = &released {
        eprintln!("leasehold: releasing {key} failed: {e}; it expires at its TTL");
    }
    let status = status.map_err(|e| {
        CliError::new(
            exit::FAILURE,
            format!("waiting for the command failed: {e}"),
        )
    })?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::FAILURE),
        (None, Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        (None, None) => exit::FAILURE,
    })
}
