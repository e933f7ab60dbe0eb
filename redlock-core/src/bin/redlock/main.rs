//! `redlock`: guard a job or a shell command with a Redlock lock, look at who
//! holds a lock, check the nodes, and release a lock whose holder is gone.
//!
//! Built only with the `cli` feature: `cargo install redlock-core --features cli`.
//! It uses redlock-core's public API alone.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use redlock_core::{Error, Redlock};

mod check;
mod cluster;
mod group;
mod nodes;
mod release;
mod replicas;
mod run;
mod status;

/// Exit codes of what is not the child's own (sysexits.h where one fits).
pub(crate) mod code {
    /// Bad usage: an unknown flag, a missing `--nodes`, an invalid TTL.
    pub(crate) const USAGE: u8 = 64;
    /// No quorum of nodes could be reached (`EX_UNAVAILABLE`).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// Another holder has the lock, and `--wait` ran out or was not given
    /// (`EX_TEMPFAIL`).
    pub(crate) const BUSY: u8 = 75;
    /// The lock was lost while the command ran; its process group was sent
    /// SIGTERM (and SIGKILL after the grace period).
    pub(crate) const LOST: u8 = 79;
    /// Anything else that went wrong on our side.
    pub(crate) const FAILURE: u8 = 1;
}

const AFTER_HELP: &str = "\
Exit codes of `redlock run`: the command's own code when it ran (128+N when a
signal N ended it); 75 when the lock is busy (--wait ran out or was not given);
69 when no quorum of nodes answered; 79 when the lock was lost while the command
ran; 64 for bad usage; 128+N when signal N came before the command started. A
command's own 64, 69, 75 or 79 reads the same as redlock's unless
--remap-child-exit is given.

The command runs in a process group of its own: on loss, SIGTERM (then SIGKILL
after --grace) goes to the whole group, signals redlock gets (INT, TERM, HUP,
QUIT, USR1, USR2) are forwarded to it once, and redlock exits only once no
process of the group is left. If redlock itself is killed, a watchdog kills the
group. Ctrl-Z is ignored while the lock is held. The command does not get
REDLOCK_NODES.

REDLOCK_NODES and --nodes: URLs separated by commas or whitespace; a separator
counts only where a URL (redis://, rediss://, redis+unix://, unix://, valkey...)
starts right after it, so a comma in a password needs no escaping. A node that
is a Redis Cluster is written redis+cluster://[user:pass@]h1:7000,h2:7000 (its
seeds, sharing the credentials). A node whose writes must reach its replicas
(a primary with replicas, a cluster whose masters have them) takes
?replica_acks=N[&replica_timeout_ms=MS], and ?waitaof=1 to wait for the AOF
fsync too (WAITAOF: Redis 7.2+, Valkey 8+).

Examples:
  export REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
  redlock run --key nightly-report --ttl 30s -- ./report.sh --full
  redlock run --key migrate --wait 10m --fencing durable -- ./migrate.sh
  redlock status nightly-report --json
  redlock check
  # cron: one replica runs it, the others skip (75) quietly
  */5 * * * * redlock run --key cleanup -- /usr/local/bin/cleanup || [ $? -eq 75 ]";

/// Redlock from the command line: run a command under a distributed lock.
#[derive(Debug, Parser)]
#[command(name = "redlock", version, after_help = AFTER_HELP)]
struct Cli {
    /// The Redis nodes, `redis://` URLs separated by commas or whitespace, one
    /// per independent master (may be given more than once); a node that is a
    /// Redis Cluster as `redis+cluster://h1:7000,h2:7000` (its seeds).
    #[arg(long, env = "REDLOCK_NODES", global = true, hide_env_values = true)]
    nodes: Vec<String>,
    /// How long each node may take to answer one call.
    #[arg(long, global = true, default_value = "200ms", value_parser = parse_duration)]
    node_timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Take the lock, run a command under it, release it when the command
    /// exits; the command is stopped if the lock is lost.
    Run(run::Args),
    /// Show who holds a lock on each node (never the token itself).
    Status(status::Args),
    /// Check each node: version, run_id, role, persistence, latency.
    Check(check::Args),
    /// Release a lock by its token (compare-and-delete: another holder's lock
    /// is never touched). An operator's escape hatch.
    Release(release::Args),
    /// `redlock run`'s placeholder leader of its command's process group.
    #[command(name = group::PLACEHOLDER, hide = true)]
    Placeholder,
    /// `redlock run`'s watchdog: kills the command's process group if
    /// `redlock` ends while holding the lock.
    #[command(name = group::WATCHDOG, hide = true)]
    Watchdog {
        /// The process group.
        pgid: i32,
    },
}

/// Parses `30s`, `1m`, `250ms`, `1h30m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// A one-line error on stderr, and the exit code.
pub(crate) fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("redlock: {message}");
    ExitCode::from(code)
}

/// The handle over `nodes`, or the exit code for why not. Errors carry no
/// password (redlock-core redacts URLs).
pub(crate) fn connect(
    nodes: &[String],
    node_timeout: Duration,
    fencing: Option<redlock_core::FencingMode>,
) -> Result<Redlock, ExitCode> {
    if nodes.is_empty() {
        return Err(fail(
            code::USAGE,
            "no nodes: give --nodes or set REDLOCK_NODES (redis:// URLs, comma-separated)",
        ));
    }
    let mut builder = nodes
        .iter()
        .fold(Redlock::builder(), |b, n| cluster::add(b, n))
        .node_timeout(node_timeout);
    if let Some(mode) = fencing {
        builder = builder.fencing(mode);
    }
    builder.build().map_err(|e| fail(code::USAGE, e))
}

/// The exit code for an acquire that failed.
pub(crate) fn acquire_failure(e: &Error) -> u8 {
    match e {
        Error::Busy { .. } => code::BUSY,
        Error::NoQuorum { report, .. } if report.busy_count() > 0 => code::BUSY,
        Error::NoQuorum { .. } | Error::NoValidity { .. } => code::UNAVAILABLE,
        Error::InvalidTtl { .. }
        | Error::NodeTimeoutTooLong { .. }
        | Error::EmptyResource
        | Error::ReservedResource { .. }
        | Error::InvalidConfig(_) => code::USAGE,
        _ => code::FAILURE,
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(code::USAGE),
            };
        }
    };
    match cli.command {
        Command::Placeholder => return group::placeholder(),
        Command::Watchdog { pgid } => return group::watchdog(pgid),
        _ => {}
    }
    let nodes = nodes::split(&cli.nodes);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(code::FAILURE, format!("cannot start the runtime: {e}")),
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&nodes, cli.node_timeout, args).await,
            Command::Status(args) => status::run(&nodes, cli.node_timeout, args).await,
            Command::Check(args) => check::run(&nodes, cli.node_timeout, args).await,
            Command::Release(args) => release::run(&nodes, cli.node_timeout, args).await,
            Command::Placeholder | Command::Watchdog { .. } => ExitCode::SUCCESS,
        }
    })
}
