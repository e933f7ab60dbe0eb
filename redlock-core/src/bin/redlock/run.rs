//! `redlock run`: take the lock, run the command under it with auto-extension,
//! stop the command when the lock is lost, release when it exits.
//!
//! Like `etcdctl lock` (the key and a fencing number in the child's
//! environment, the child's exit code passed through) and `consul lock`
//! (signals forwarded; SIGTERM, then SIGKILL after a grace period, on loss),
//! but the loss is read off the holder's own deadline, so the command hears of
//! it before the old validity ends, and a loss is an exit code of its own.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlock_core::{FencingMode, LockOptions, RetryPolicy, token_fingerprint};
use tokio::signal::unix::{SignalKind, signal};

use crate::{acquire_failure, code, connect, fail, parse_duration};

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
    /// Hand the command a fencing token (REDLOCK_FENCING_TOKEN).
    #[arg(long, value_enum)]
    fencing: Option<Fencing>,
    /// How long the command has after SIGTERM (on loss) before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

pub(crate) async fn run(nodes: &[String], node_timeout: Duration, args: Args) -> ExitCode {
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
    let guard = match redlock.lock_guard(&args.key, &options).await {
        Ok(g) => g,
        Err(e) => return fail(acquire_failure(&e), e),
    };
    let handle = guard.handle();
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return fail(code::USAGE, "no command given after --"),
    };
    let mut command = tokio::process::Command::new(program);
    command.args(rest).env("REDLOCK_KEY", handle.key()).env(
        "REDLOCK_TOKEN_FINGERPRINT",
        token_fingerprint(handle.token()),
    );
    if let Some(token) = handle.fencing_token() {
        command.env("REDLOCK_FENCING_TOKEN", token.get().to_string());
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            return fail(code::FAILURE, format!("cannot run {program:?}: {e}"));
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let send = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        send(Signal::SIGKILL);
        let _ = guard.release().await;
        return fail(code::FAILURE, "cannot install the signal handlers");
    };

    let lost = handle.lost();
    tokio::pin!(lost);
    let mut lost_at = None;
    let mut killed = false;
    let status = loop {
        let kill_at = lost_at.map_or_else(tokio::time::Instant::now, |at: tokio::time::Instant| {
            at + args.grace
        });
        tokio::select! {
            status = child.wait() => break status,
            () = &mut lost, if lost_at.is_none() => {
                eprintln!("redlock: lock on {:?} lost; sending SIGTERM to the command", args.key);
                send(Signal::SIGTERM);
                lost_at = Some(tokio::time::Instant::now());
            }
            () = tokio::time::sleep_until(kill_at), if lost_at.is_some() && !killed => {
                eprintln!("redlock: the command outlived the {:?} grace period; sending SIGKILL", args.grace);
                send(Signal::SIGKILL);
                killed = true;
            }
            _ = int.recv() => send(Signal::SIGINT),
            _ = term.recv() => send(Signal::SIGTERM),
            _ = hup.recv() => send(Signal::SIGHUP),
        }
    };
    let released = guard.release().await;
    // The release returns at a quorum and finishes the other nodes in the
    // background, which ends with this process: one more compare-and-delete,
    // which each node runs after the first, waits for every node (or its
    // timeout), so no key outlives the command but on a node that failed.
    let _ = redlock
        .release_token(handle.resource(), handle.token())
        .await;
    if lost_at.is_some() {
        return ExitCode::from(code::LOST);
    }
    if let Err(e) = released {
        eprintln!("redlock: release not confirmed (the keys expire with their TTL): {e}");
    }
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(code::FAILURE)),
            (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(code::FAILURE)),
            (None, None) => ExitCode::from(code::FAILURE),
        },
        Err(e) => fail(code::FAILURE, format!("waiting for the command: {e}")),
    }
}
