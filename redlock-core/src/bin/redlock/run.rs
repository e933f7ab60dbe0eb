//! `redlock run`: take the lock, run the command under it with auto-extension,
//! stop the command when the lock is lost, release when it exits.
//!
//! Like `etcdctl lock` (the key and a fencing number in the child's
//! environment, the child's exit code passed through) and `consul lock`
//! (signals forwarded; SIGTERM, then SIGKILL after a grace period, on loss),
//! but the loss is read off the holder's own deadline, so the command hears of
//! it before the old validity ends, and a loss is an exit code of its own.
//!
//! The command runs in a process group of its own (see `group.rs`): the loss,
//! the grace period's SIGKILL and forwarded signals go to the whole group, and
//! `redlock` releases the lock only once no process of the group is left.

use std::process::ExitCode;
use std::task::Poll;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use redlock_core::{Ended, FencingMode, Kind, LockOptions, RetryPolicy, token_fingerprint};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::group::{FORWARDED, Group};
use crate::{acquire_failure, code, connect, fail, parse_duration};

/// How long the group may take to go after SIGKILL before `redlock` stops
/// waiting for it (a process in uninterruptible sleep).
const AFTER_KILL: Duration = Duration::from_secs(5);

/// Which fencing mode `--fencing` asks for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Fencing {
    /// Counters only; needs `appendonly yes` + `appendfsync always` on every node.
    Durable,
    /// Counters and the nodes' clocks; see redlock-core's Safety notes.
    Hybrid,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The resource to lock.
    #[arg(long)]
    key: String,
    /// The lock's TTL; it is renewed while the command runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Wait up to this long for a busy lock (woken by its release); without
    /// it, a busy lock exits 75 at once.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Stop renewing after this long: the command is then stopped as on loss.
    #[arg(long, value_parser = parse_duration)]
    max_hold: Option<Duration>,
    /// Keep the lock at least this long from the start of the acquire, even
    /// when the command ends sooner: its keys are then set to expire at the
    /// end of the minimum instead of being released, so that a replica whose
    /// timer fires a little later skips the same tick (75). Make it longer
    /// than the timer skew between replicas, shorter than the period.
    #[arg(long, value_parser = parse_duration)]
    at_least: Option<Duration>,
    /// Let up to N holders of the key run at once, across every host (a
    /// quorum semaphore, as `consul lock -n`), instead of one.
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Hand the command a fencing token (REDLOCK_FENCING_TOKEN).
    #[arg(long, value_enum)]
    fencing: Option<Fencing>,
    /// How long the command has after SIGTERM (on loss) before SIGKILL; also
    /// how long processes the command left behind in its group may run on
    /// after it exits before they get SIGTERM.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    grace: Duration,
    /// Report the command's own exit code 64, 69, 75 or 79 as CODE instead (with
    /// a note on stderr), so that those four always mean redlock's usage error,
    /// unavailable, busy and lost.
    #[arg(long, value_name = "CODE", value_parser = parse_remap)]
    remap_child_exit: Option<u8>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// redlock's own exit codes, which a command's own code can equal.
const OWN_CODES: [u8; 4] = [code::USAGE, code::UNAVAILABLE, code::BUSY, code::LOST];

fn parse_remap(s: &str) -> Result<u8, String> {
    let code: u8 = s
        .parse()
        .map_err(|_| format!("{s:?} is not an exit code (0-255)"))?;
    if OWN_CODES.contains(&code) {
        return Err(format!(
            "{code} is one of redlock's own codes (64, 69, 75, 79)"
        ));
    }
    Ok(code)
}

/// The signals `redlock run` handles, installed before anything else it does:
/// from then on no signal but SIGKILL ends `redlock` by its default action
/// with the command left behind.
struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        let mut streams = Vec::new();
        // SIGTSTP (Ctrl-Z) is caught and not acted on: a stopped `redlock` could
        // not renew its lock while the command, in a group of its own, ran on.
        for sig in FORWARDED.iter().chain(&[Signal::SIGTSTP]) {
            streams.push((*sig, signal(SignalKind::from_raw(*sig as i32))?));
        }
        Ok(Signals { streams })
    }

    async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*sig);
                }
            }
            Poll::Pending
        })
        .await
    }
}

fn exit_code(code: u8, remap: Option<u8>) -> ExitCode {
    match remap {
        Some(to) if OWN_CODES.contains(&code) => {
            eprintln!("redlock: the command exited {code}; reported as {to} (--remap-child-exit)");
            ExitCode::from(to)
        }
        _ => ExitCode::from(code),
    }
}

pub(crate) async fn run(nodes: &[String], node_timeout: Duration, args: Args) -> ExitCode {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            return fail(
                code::FAILURE,
                format!("cannot install the signal handlers: {e}"),
            );
        }
    };
    let mut sigchld = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            return fail(
                code::FAILURE,
                format!("cannot install the signal handlers: {e}"),
            );
        }
    };
    let fencing = args.fencing.map(|f| match f {
        Fencing::Durable => FencingMode::Durable,
        Fencing::Hybrid => FencingMode::Hybrid,
    });
    let redlock = match connect(nodes, node_timeout, fencing) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let retry = match args.wait {
        Some(wait) => RetryPolicy::deadline(wait),
        None => RetryPolicy::no_retry(),
    };
    let mut options = LockOptions::new(args.ttl).retry(retry);
    if let Some(max_hold) = args.max_hold {
        options = options.max_hold(max_hold);
    }
    let kind = args.permits.map_or(Kind::Mutex, Kind::Permits);
    let mut acquire =
        Box::pin(async { redlock.primitive([&args.key], kind)?.guard(&options).await });
    let acquired = loop {
        tokio::select! {
            acquired = &mut acquire => break acquired,
            sig = signals.recv() => {
                if sig == Signal::SIGTSTP {
                    eprintln!("redlock: suspending is not supported (a stopped holder cannot renew its lock); SIGTSTP ignored");
                    continue;
                }
                // Dropped, an attempt in flight releases its keys in the
                // background: give that a node timeout (capped) before the
                // runtime ends.
                drop(acquire);
                eprintln!("redlock: {sig} while taking the lock on {:?}; the command was not started", args.key);
                tokio::time::sleep(node_timeout.min(Duration::from_secs(2))).await;
                return ExitCode::from(128 + sig as u8);
            }
        }
    };
    let guard = match acquired {
        Ok(g) => g,
        Err(e) => return fail(acquire_failure(&e), e),
    };
    let handle = guard.handle();
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return fail(code::USAGE, "no command given after --"),
    };
    let mut command = std::process::Command::new(program);
    command
        .args(rest)
        // The node URLs may carry passwords: the command does not get them.
        .env_remove("REDLOCK_NODES")
        .env("REDLOCK_KEY", handle.key())
        .env(
            "REDLOCK_TOKEN_FINGERPRINT",
            token_fingerprint(handle.token()),
        );
    if let Some(token) = handle.fencing_token() {
        command.env("REDLOCK_FENCING_TOKEN", token.get().to_string());
    }
    let mut group = match Group::start(&mut command) {
        Ok(g) => g,
        Err(e) => {
            let _ = guard.release().await;
            return fail(code::FAILURE, format!("cannot run {program:?}: {e}"));
        }
    };

    let lost = handle.lost();
    tokio::pin!(lost);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut lost_at: Option<Instant> = None;
    let mut term_at: Option<Instant> = None;
    let mut killed_at: Option<Instant> = None;
    let mut ended_at: Option<Instant> = None;
    let far = || Instant::now() + Duration::from_secs(86_400);
    let complete = loop {
        group.reap();
        if group.status().is_some() && ended_at.is_none() {
            ended_at = Some(Instant::now());
        }
        if group.is_gone() {
            break true;
        }
        // Processes the command left in its group get the grace period, then
        // SIGTERM; SIGKILL a grace period after any SIGTERM.
        let stragglers_at = ended_at
            .filter(|_| term_at.is_none())
            .and_then(|at| at.checked_add(args.grace));
        let kill_at = term_at
            .filter(|_| killed_at.is_none())
            .and_then(|at| at.checked_add(args.grace));
        let give_up_at = killed_at.map(|at| at + AFTER_KILL);
        tokio::select! {
            _ = sigchld.recv() => {}
            _ = tick.tick() => {}
            () = &mut lost, if lost_at.is_none() => {
                lost_at = Some(Instant::now());
                if term_at.is_none() {
                    eprintln!("redlock: lock on {:?} lost; sending SIGTERM to the command's process group", args.key);
                    group.signal(Signal::SIGTERM);
                    group.signal(Signal::SIGCONT);
                    term_at = lost_at;
                }
            }
            () = tokio::time::sleep_until(stragglers_at.unwrap_or_else(far)), if stragglers_at.is_some() => {
                eprintln!("redlock: the command exited but left processes in its group; sending them SIGTERM");
                group.signal(Signal::SIGTERM);
                group.signal(Signal::SIGCONT);
                term_at = Some(Instant::now());
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(far)), if kill_at.is_some() => {
                eprintln!("redlock: the command's process group outlived the {:?} grace period; sending SIGKILL", args.grace);
                group.signal(Signal::SIGKILL);
                killed_at = Some(Instant::now());
            }
            () = tokio::time::sleep_until(give_up_at.unwrap_or_else(far)), if give_up_at.is_some() => {
                eprintln!("redlock: processes of the command's group are still there {AFTER_KILL:?} after SIGKILL");
                break false;
            }
            sig = signals.recv() => {
                if sig == Signal::SIGTSTP {
                    eprintln!("redlock: suspending is not supported (a stopped holder cannot renew its lock); SIGTSTP ignored");
                } else {
                    group.signal(sig);
                }
            }
        }
    };
    if !complete && lost_at.is_none() {
        // Still there: the keys expire with their TTL rather than be released
        // under a live process.
        group.disarm();
        std::mem::forget(guard);
        return fail(
            code::FAILURE,
            "the command's process group did not end; the lock was not released",
        );
    }
    group.disarm();
    // `--at-least`: before the minimum the keys are kept (set to expire at
    // its end, on every node, waited for), never deleted.
    let (released, deleted) = match args.at_least {
        Some(min) if lost_at.is_none() => match guard.release_at_least(min).await {
            Ok(Ended::Released(_)) => (Ok(()), true),
            Ok(_) => (Ok(()), false),
            Err(e) => (Err(e), false),
        },
        _ => (guard.release().await.map(|_| ()), true),
    };
    // The release returns at a quorum and finishes the other nodes in the
    // background, which ends with this process: one more compare-and-delete,
    // which each node runs after the first, waits for every node (or its
    // timeout), so no key outlives the command but on a node that failed.
    if deleted {
        // The key the guard held: a permit's slot key, not the resource's.
        let _ = redlock.release_everywhere(&handle).await;
    }
    if lost_at.is_some() {
        return ExitCode::from(code::LOST);
    }
    if let Err(e) = released {
        eprintln!("redlock: release not confirmed (the keys expire with their TTL): {e}");
    }
    match group.status() {
        Some(WaitStatus::Exited(_, c)) => exit_code(
            u8::try_from(c).unwrap_or(code::FAILURE),
            args.remap_child_exit,
        ),
        Some(WaitStatus::Signaled(_, sig, _)) => {
            ExitCode::from(u8::try_from(128 + sig as i32).unwrap_or(code::FAILURE))
        }
        _ => ExitCode::from(code::FAILURE),
    }
}
