//! Command-line arguments.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Distributed locks from the shell: run a command under a lock, inspect and break locks.
///
/// A lock is a lease: a record in a shared store that says "token T holds key K until time E".
/// Locks are named by key: either a full storage key (`DC#<farm>#<client>#<entity>`,
/// `XDC#<client>#<entity>`), or an entity name that is combined with --client-id, --farm-id and
/// --level.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, propagate_version = true)]
#[command(after_help = "\
Examples:
  leasehold --store redis://127.0.0.1:6379 run nightly-report -- ./report.sh
  leasehold --store redis://127.0.0.1:6379 inspect nightly-report
  leasehold --store aerospike://127.0.0.1:3000/test?farm=farm1 list
  leasehold --store redis://127.0.0.1:6379 release nightly-report --force
  leasehold --store etcd://127.0.0.1:2379 run nightly-report -- ./report.sh

Exit status: 0 ok (inspect: held), 1 inspect or release: free, 2 bad input, 69 store
unreachable, 75 lock held by someone else (run: --conflict-exit-code; release: it changed hands
meanwhile), 70 other failures;
run exits with its command's status, or 76 if the lock was lost while it ran
(--lost-exit-code).")]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// The store: memory://, redis://[user:password@]host:port[/db], rediss://… (TLS),
    /// redis+unix:///path/to/socket, aerospike://[user:password@]host:port/namespace?set_suffix=…&farm=…,
    /// etcd://[user:password@]host:port[,host:port…][?prefix=…], etcds://… (TLS)
    /// (credentials percent-encoded, e.g. p%40ss for p@ss)
    #[arg(
        long,
        global = true,
        env = "LEASEHOLD_STORE",
        default_value = "memory://"
    )]
    pub(crate) store: String,

    /// Client id: lock ids are <client-id>#<entity>.
    #[arg(
        long,
        global = true,
        env = "LEASEHOLD_CLIENT_ID",
        default_value = "cli"
    )]
    pub(crate) client_id: String,

    /// Farm (data center) id for DC locks. Default: the store URL's `farm=`, else `local`.
    #[arg(long, global = true, env = "LEASEHOLD_FARM_ID")]
    pub(crate) farm_id: Option<String>,

    /// Lock level of keys given as an entity name: dc (one data center) or xdc (all).
    #[arg(long, global = true, value_enum, default_value_t = Level::Dc)]
    pub(crate) level: Level,
}

/// A lock level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Level {
    /// Scoped to one farm: DC#<farm>#<client>#<entity>.
    Dc,
    /// Across data centers: XDC#<client>#<entity>.
    Xdc,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lock, renewing it while the command runs.
    ///
    /// Acquires KEY (waiting up to --wait), runs CMD as a child with LEASEHOLD_KEY,
    /// LEASEHOLD_TOKEN and, where the store gives one, LEASEHOLD_FENCING_TOKEN in its environment,
    /// renews the lease while it runs, releases it when the command exits, and exits with the
    /// command's status. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to
    /// the command; the lock is released once it has exited, and a signal while waiting for the
    /// lock ends the wait (its place in line given up; a second signal exits without waiting
    /// for the store) with status 128 + the signal's number. If
    /// the lock cannot be had (held, or held as another kind of lock): exit status 75
    /// (--conflict-exit-code) and who holds it. If the lock is lost while the command
    /// runs: a line on stderr, SIGTERM to the command with --kill-on-lost, and exit status 76
    /// (--lost-exit-code) whatever the command's own status.
    Run(RunArgs),
    /// Validate a scenario file and print its scenarios as a table. Exit status 2, with the
    /// file, line and field named, when the file is invalid.
    Scenarios(ScenariosArgs),
    /// Print a lock's history kept in the store (the lock trace of scenarios with `trace = true`):
    /// who acquired, waited, released, lost it or had a release skipped, from which host and
    /// process, newest first.
    History(HistoryArgs),
    /// Show who holds a lock: owner token (host, pid, time), TTL left, fencing token.
    /// Exit status 0 when held, 1 when free.
    Inspect(InspectArgs),
    /// List held locks (every store: memory, redis, etcd, aerospike).
    List(ListArgs),
    /// Break a stuck lock. Refuses without --force; prints what it removed.
    Release(ReleaseArgs),
    /// The scenarios, narrated, on the embedded store (no server needed): a hot key with local
    /// fast-fails, reentrancy, a late release skipped by the unlock window, readback after a lost
    /// reply, and graceful shutdown releasing live locks. Ends with a summary table.
    Demo(DemoArgs),
    /// Contention benchmark: N tasks acquire and release K keys for a while, then a summary:
    /// acquisitions/s, p50/p99/max acquire latency, store requests per acquisition, local
    /// fast-fails, errors by kind.
    Bench(BenchArgs),
    /// Run a command while this instance leads election NAME.
    ///
    /// Campaigns (waiting up to --wait; by default as long as it takes), then runs CMD with
    /// LEASEHOLD_ELECTION, LEASEHOLD_KEY, LEASEHOLD_TOKEN and, where the store fences,
    /// LEASEHOLD_TERM (greater for every new leader) in its environment, and gives leadership up
    /// when it exits. If leadership is lost while it runs: SIGTERM to the command (SIGKILL
    /// --kill-grace later) and exit status 76 (--lost-exit-code). With --again, campaigns again
    /// after the command exits, until SIGINT or SIGTERM.
    Elect(ElectArgs),
    /// Print who leads election NAME: host, pid, term, since when. Exit status 0 when someone
    /// leads, 1 when nobody does. With --watch, print every change until interrupted.
    Leader(LeaderArgs),
}

/// `leasehold elect`.
#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// The election's name.
    pub(crate) name: String,
    /// Election lease TTL: how long a leader killed without resigning keeps leadership. Renewed
    /// every third of it.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) ttl: Option<Duration>,
    /// How long to wait to become leader (then exit status 75). Default: as long as it takes.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) wait: Option<Duration>,
    /// Campaign again after the command exits.
    #[arg(long)]
    pub(crate) again: bool,
    /// What `leasehold leader` shows of this instance while it leads: an address to reach it,
    /// say (at most 256 bytes, one line).
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// Exit status when --wait passes without leading.
    #[arg(long, default_value_t = crate::exit::DEFAULT_CONFLICT)]
    pub(crate) conflict_exit_code: u8,
    /// Exit status when leadership was lost while the command ran.
    #[arg(long, default_value_t = crate::exit::DEFAULT_LOST)]
    pub(crate) lost_exit_code: u8,
    /// How long after SIGTERM (leadership lost) SIGKILL follows.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) kill_grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

/// `leasehold leader`.
#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    /// The election's name.
    pub(crate) name: String,
    /// Follow changes: print a line whenever the leader changes.
    #[arg(long)]
    pub(crate) watch: bool,
    /// How often --watch reads who leads on a store that does not announce changes (Aerospike);
    /// Redis, etcd and the embedded store announce every change as it happens.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub(crate) interval: Duration,
}

/// `leasehold demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Workers contending for the hot key.
    #[arg(long, default_value_t = 64)]
    pub(crate) tasks: usize,
    /// How long the hot-key scenario runs.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
}

/// `leasehold bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Concurrent tasks.
    #[arg(long, default_value_t = 64)]
    pub(crate) tasks: usize,
    /// Distinct keys the tasks spread over (1: one hot key).
    #[arg(long, default_value_t = 1)]
    pub(crate) keys: usize,
    /// How long to run.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Hand a released lease straight to a local waiter (see docs/LAYERS.md).
    #[arg(long)]
    pub(crate) hand_off: bool,
    /// Run without the local-competition layer (the other default layers stay on).
    #[arg(long, conflicts_with = "hand_off")]
    pub(crate) no_local_competition: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lock: an entity name or a full storage key.
    pub(crate) key: String,
    /// Lease TTL; renewed every third of it while the command runs. Default: the scenario's,
    /// else 30s.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) ttl: Option<Duration>,
    /// How long to wait for the lock if it is held; 0 fails at once. Default: the scenario's
    /// (a try-only scenario never waits), else 0s.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) wait: Option<Duration>,
    /// A scenario file (TOML, see docs/SCENARIOS.md): the key gets the settings of the scenario
    /// its entity name matches, or of --scenario.
    #[arg(long)]
    pub(crate) config: Option<std::path::PathBuf>,
    /// Run under this scenario of --config.
    #[arg(long, requires = "config")]
    pub(crate) scenario: Option<String>,
    /// Exit status when the lock is held by someone else (like flock -E).
    #[arg(long, default_value_t = crate::exit::DEFAULT_CONFLICT)]
    pub(crate) conflict_exit_code: u8,
    /// If the lock is lost while the command runs (renewal failed), send SIGTERM to the command,
    /// and SIGKILL if it is still running `--kill-grace` later.
    #[arg(long)]
    pub(crate) kill_on_lost: bool,
    /// How long `--kill-on-lost` waits after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) kill_grace: Duration,
    /// Exit status when the lock was lost while the command ran, whatever the command's own
    /// status (its work was not all protected by the lock).
    #[arg(long, default_value_t = crate::exit::DEFAULT_LOST)]
    pub(crate) lost_exit_code: u8,
    /// Take the read side of the key's read-write lock: runs alongside other `--shared` runs of
    /// the key, never alongside a plain `run` of it (the write side).
    #[arg(long, conflicts_with = "permits")]
    pub(crate) shared: bool,
    /// Take one of N permits of the key's semaphore: at most N copies of the command run at once
    /// (every run of the key must name the same N).
    #[arg(long, value_name = "N")]
    pub(crate) permits: Option<u32>,
    /// Keep the lock at least this long after it was taken, even if the command exits sooner
    /// (a cron job runs at most once per period across the fleet; see docs/ELECTIONS.md).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) at_least: Option<Duration>,
    /// A note `leasehold inspect` shows with the holder while the command runs (a job's run id,
    /// an address; at most 256 bytes, one line).
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

/// `leasehold scenarios`.
#[derive(Debug, Args)]
pub(crate) struct ScenariosArgs {
    /// The scenario file (TOML).
    #[arg(long)]
    pub(crate) config: std::path::PathBuf,
}

/// `leasehold history`.
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// The lock: an entity name or a full storage key.
    pub(crate) key: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold inspect`.
#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The lock: an entity name or a full storage key.
    pub(crate) key: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only keys starting with this prefix (e.g. `DC#farm1#`).
    #[arg(default_value = "")]
    pub(crate) prefix: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold release`.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// The lock: an entity name or a full storage key.
    pub(crate) key: String,
    /// Really break the lock, whoever holds it.
    #[arg(long)]
    pub(crate) force: bool,
}

/// Parses `30s`, `1m30s`, `500ms`; bare numbers are seconds. At most 30 days (the longest lock
/// TTL): no option of the command means more, and a longer one is a unit mistake.
pub(crate) fn parse_duration(raw: &str) -> Result<Duration, String> {
    let parsed = match raw.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => humantime::parse_duration(raw).map_err(|e| e.to_string()),
    };
    let parsed =
        parsed.map_err(|e| format!("{e}; expected a duration such as 30s, 1m30s or 500ms"))?;
    leasehold::core::validate_at_most("the duration", parsed, leasehold::core::MAX_TTL)
        .map_err(|e| format!("{}; e.g. 30s, 10m or 2h", e.chain()))?;
    Ok(parsed)
}
