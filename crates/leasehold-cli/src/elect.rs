//! `leasehold elect NAME -- CMD`: a command run while this instance leads an election, and
//! `leasehold leader NAME [--watch]`: who leads.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use leasehold::core::BoxStore;
use leasehold::{ErrorKind, Leader, Leadership, LockManager, LockOptions, MemoryStore};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cli::{ElectArgs, Global, LeaderArgs};
use crate::exit::{self, CliError};
use crate::run::{stop_waiting, Forwarded};
use crate::store::{check_lease, Names};

/// The election lease of `elect` without `--ttl`.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// One wait of a campaign without `--wait`: it simply waits again.
const WAIT_CHUNK: Duration = Duration::from_secs(3600);

pub(crate) async fn elect(global: &Global, args: ElectArgs) -> Result<u8, CliError> {
    // Refused before connecting: a bad name, TTL or label, and what the lock call itself
    // checks (a TTL the unlock window cannot work with), on the embedded store.
    let names = Names::parse(global)?;
    let key = names.election(&args.name)?;
    check_lease(args.ttl, args.label.as_deref())?;
    names
        .manager_over(
            BoxStore::new(MemoryStore::new()),
            leasehold::scenario::ScenarioRegistry::new(),
        )
        .and_then(|probe| probe.check(&key, &campaign_options(&args)))
        .map_err(|e| CliError::usage(e.chain().to_string()))?;
    let target = names.connect().await?;
    let manager = target.manager()?;
    // Listened for from the start: once tokio handles a signal it does for the whole process,
    // so a SIGTERM while campaigning (again) must be handled here, not by the default action.
    let mut forwarded = Forwarded::listen()
        .map_err(|e| CliError::new(exit::FAILURE, format!("cannot listen for signals: {e}")))?;
    loop {
        let campaigned = tokio::select! {
            leadership = campaign(&manager, &args) => Some(leadership),
            _ = forwarded.recv() => None,
        };
        let Some(campaigned) = campaigned else {
            return Ok(stop_waiting(&manager, &mut forwarded).await);
        };
        let leadership = campaigned.map_err(|e| match e {
            Campaign::Timeout => CliError::new(
                args.conflict_exit_code,
                format!(
                    "did not become leader of `{}` within {}",
                    args.name,
                    crate::admin::human(args.wait.unwrap_or_default())
                ),
            ),
            Campaign::Failed(e) => target.error(e),
        })?;
        let led = lead(&args, &leadership, &mut forwarded).await;
        // Resigned whatever became of the command, one that could not start included: a
        // leadership kept past this process would name a dead leader until its TTL.
        let resigned = leadership.resign().await;
        let mut led = led?;
        match resigned {
            Ok(true) => {}
            // Nothing saw the loss while the command ran (an operator broke the election lock
            // between two renewals, say), but it was not this instance's when the command
            // ended.
            Ok(false) if !led.lost => {
                led.lost = true;
                eprintln!(
                    "leasehold: this instance no longer led `{}` when the command ended",
                    args.name
                );
            }
            Ok(false) => {}
            Err(e) => eprintln!(
                "leasehold: resigning failed: {}; leadership expires at its TTL",
                e.chain()
            ),
        }
        if led.lost {
            eprintln!(
                "leasehold: the command exited with status {}, but leadership was lost while it \
                 ran; exiting with {}",
                led.status, args.lost_exit_code
            );
            if !args.again || led.stop {
                return Ok(args.lost_exit_code);
            }
        } else if !args.again || led.stop {
            return Ok(led.status);
        }
    }
}

enum Campaign {
    Timeout,
    Failed(leasehold::Error),
}

/// The options of every campaign call.
fn campaign_options(args: &ElectArgs) -> LockOptions {
    let opts = LockOptions::new()
        .ttl(args.ttl.unwrap_or(DEFAULT_TTL))
        .wait(args.wait.unwrap_or(WAIT_CHUNK));
    match &args.label {
        Some(label) => opts.label(label.as_str()),
        None => opts,
    }
}

async fn campaign(manager: &LockManager, args: &ElectArgs) -> Result<Leadership, Campaign> {
    let opts = campaign_options(args);
    loop {
        match manager.campaign_with(&args.name, opts.clone()).await {
            Ok(leadership) => return Ok(leadership),
            Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::LockUnavailable) => {
                if args.wait.is_some() {
                    return Err(Campaign::Timeout);
                }
            }
            Err(e) => return Err(Campaign::Failed(e)),
        }
    }
}

/// How one leadership ended.
struct Led {
    status: u8,
    lost: bool,
    /// A stopping signal (SIGINT, SIGTERM) was passed on: do not campaign again.
    stop: bool,
}

async fn lead(
    args: &ElectArgs,
    leadership: &Leadership,
    forwarded: &mut Forwarded,
) -> Result<Led, CliError> {
    let lease = leadership.lease();
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("LEASEHOLD_ELECTION", &args.name)
        .env("LEASEHOLD_KEY", lease.key().as_str())
        .env("LEASEHOLD_TOKEN", lease.token().as_str());
    if let Some(term) = leadership.term() {
        command.env("LEASEHOLD_TERM", term.to_string());
    }
    let mut child = command
        .spawn()
        .map_err(|e| CliError::new(127, format!("cannot run {:?}: {e}", args.command[0])))?;
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    let forward = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    let mut lost = false;
    let mut stop = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = forwarded.recv() => {
                stop |= matches!(sig, Signal::SIGINT | Signal::SIGTERM);
                forward(sig);
            }
            why = leadership.lost(), if !lost => {
                lost = true;
                eprintln!("leasehold: {why}; sending SIGTERM to the command");
                forward(Signal::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + args.kill_grace);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)),
                if kill_at.is_some() =>
            {
                kill_at = None;
                eprintln!("leasehold: the command outlived SIGTERM by {:?}; sending SIGKILL",
                    args.kill_grace);
                forward(Signal::SIGKILL);
            }
        }
    };
    lost |= !leadership.is_leader();
    let status = status.map_err(|e| {
        CliError::new(
            exit::FAILURE,
            format!("waiting for the command failed: {e}"),
        )
    })?;
    let status = match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::FAILURE),
        (None, Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        (None, None) => exit::FAILURE,
    };
    Ok(Led { status, lost, stop })
}

pub(crate) async fn leader(global: &Global, args: LeaderArgs) -> Result<u8, CliError> {
    let names = Names::parse(global)?;
    names.election(&args.name)?; // refused before connecting
    let target = names.connect().await?;
    let manager = target.manager()?;
    if !args.watch {
        let leader = manager
            .leader(&args.name)
            .await
            .map_err(|e| target.error(e))?;
        println!("{}", line(&args.name, leader.as_ref()));
        return Ok(if leader.is_some() {
            exit::OK
        } else {
            exit::FREE
        });
    }
    let mut changes = std::pin::pin!(manager.observe_every(&args.name, args.interval));
    while let Some(change) = changes.next().await {
        match change {
            Ok(leader) => println!("{}", line(&args.name, leader.as_ref())),
            // An invalid name fails every read the same way: give up at once.
            Err(e) if e.kind() == ErrorKind::InvalidArgument => return Err(target.error(e)),
            Err(e) => eprintln!("leasehold: reading the leader failed: {}", target.error(e)),
        }
    }
    Ok(exit::OK)
}

/// One line: who leads, since when, with which term.
fn line(name: &str, leader: Option<&Leader>) -> String {
    let Some(leader) = leader else {
        return format!("{name}: no leader");
    };
    let who = match (&leader.host, leader.pid) {
        (Some(host), Some(pid)) => format!("{host} pid {pid}"),
        _ => leader.token.to_string(),
    };
    let label = leader
        .label
        .as_ref()
        .map(|l| format!(" [{l}]"))
        .unwrap_or_default();
    let term = leader
        .term
        .map(|t| format!(" term {t}"))
        .unwrap_or_default();
    let since = leader
        .since
        .map(|t: SystemTime| format!(" since {}", crate::admin::wall_time(t)))
        .unwrap_or_default();
    format!(
        "{name}: led by {who}{label}{term}{since} (token {})",
        leader.token
    )
}
