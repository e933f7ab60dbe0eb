//! The command of `redlock run` in a process group of its own, which
//! `redlock` signals as a whole and waits out, and which dies with `redlock`.
//!
//! Three processes besides the command, all from this binary's own image:
//!
//! - A placeholder (`redlock __group`) leads a new process group `G` for the
//!   instant it takes to start the command in it: the group's id is known
//!   before the command exists.
//! - A watchdog (`redlock __watchdog G`), in a group of its own, holds the read
//!   end of a pipe whose only writer is `redlock`. When `redlock` ends without
//!   saying `done` (SIGKILL, the OOM killer, a crash), the kernel closes the
//!   pipe and the watchdog sends SIGKILL to `G`: the whole job, grandchildren
//!   included, never runs on unlocked. It knows `G` from its arguments before
//!   the command is started, so there is no moment where the command runs
//!   unwatched. It is portable (a pipe, `killpg`), where `PR_SET_PDEATHSIG`
//!   is Linux-only, reaches the direct child alone, and needs `pre_exec`,
//!   which the workspace's `unsafe_code = "forbid"` rules out.
//! - On Linux, `redlock` is a child subreaper, so that processes of the job
//!   orphaned by their parent come back to it and are reaped: a zombie stays
//!   in its group, and an init that does not reap (a container's) would keep
//!   the group alive for ever.
//!
//! The group is not the terminal's foreground group: the terminal's Ctrl-C or
//! hang-up reaches `redlock` alone, and `redlock` forwards each signal it gets
//! to the group once. The job hears each of them exactly as often as it would
//! have if the shell had started it.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// The placeholder's subcommand.
pub(crate) const PLACEHOLDER: &str = "__group";
/// The watchdog's subcommand.
pub(crate) const WATCHDOG: &str = "__watchdog";

/// The signals `redlock` forwards to the group, and which its helpers block.
pub(crate) const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// The helpers end only by SIGKILL or by their own decision: a signal meant
/// for the job (sent to its group) or for `redlock` must not end them. Blocked,
/// not ignored: a blocked mask is not inherited across `exec` by std's spawn,
/// and they spawn nothing anyway.
fn block_signals() {
    let mut set = SigSet::empty();
    for signal in FORWARDED.iter().chain(&[
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
        Signal::SIGPIPE,
    ]) {
        set.add(*signal);
    }
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
}

/// `redlock __group`: leads a process group until its standard input closes.
pub(crate) fn placeholder() -> ExitCode {
    block_signals();
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    ExitCode::SUCCESS
}

/// `redlock __watchdog G`: SIGKILL to group `G` unless `redlock` says `done`
/// before its end closes the pipe.
pub(crate) fn watchdog(pgid: i32) -> ExitCode {
    block_signals();
    let mut line = String::new();
    // Blocks for as long as `redlock` lives: its end of the pipe is the only one.
    let done = std::io::stdin().read_line(&mut line).is_ok() && line.trim() == "done";
    if !done && pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        let _ = writeln!(
            std::io::stderr(),
            "redlock: ended while holding the lock; its command's process group {pgid} was killed"
        );
    }
    ExitCode::SUCCESS
}

/// A helper from this binary, in a process group of its own, its standard
/// input a pipe from us.
fn helper(args: &[&str]) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(args)
        .env_remove("REDLOCK_NODES")
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
}

/// The running command's process group.
pub(crate) struct Group {
    pgid: Pid,
    leader: Pid,
    watchdog: Pid,
    /// Our end of the watchdog's pipe.
    lifeline: Option<ChildStdin>,
    status: Option<WaitStatus>,
    watchdog_gone: bool,
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

impl Group {
    /// Starts `command` as the leader's process in a new group, watched.
    pub(crate) fn start(command: &mut Command) -> Result<Group, String> {
        #[cfg(target_os = "linux")]
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            eprintln!(
                "redlock: cannot become a subreaper ({e}); orphans of the command are not reaped"
            );
        }
        let mut placeholder = helper(&[PLACEHOLDER])
            .map_err(|e| format!("cannot start the process group's placeholder: {e}"))?;
        let pgid = pid_of(&placeholder);
        let mut watchdog = match helper(&[WATCHDOG, &pgid.to_string()]) {
            Ok(w) => w,
            Err(e) => {
                drop(placeholder.stdin.take());
                return Err(format!("cannot start the watchdog: {e}"));
            }
        };
        let lifeline = watchdog.stdin.take();
        let spawned = command.process_group(pgid.as_raw()).spawn();
        // The group now has the command (or nothing): the placeholder may go.
        drop(placeholder.stdin.take());
        let mut group = Group {
            pgid,
            leader: Pid::from_raw(0),
            watchdog: pid_of(&watchdog),
            lifeline,
            status: None,
            watchdog_gone: false,
        };
        match spawned {
            Ok(child) => {
                group.leader = pid_of(&child);
                Ok(group)
            }
            Err(e) => {
                group.disarm();
                Err(e.to_string())
            }
        }
    }

    /// Sends `signal` to every process of the group.
    pub(crate) fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }

    /// Reaps every child that has ended: the command, the helpers, and (on
    /// Linux) orphans of the command. The command's status is kept.
    pub(crate) fn reap(&mut self) {
        for _ in 0..4096 {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(status) => match status.pid() {
                    Some(pid) if pid == self.leader => self.status = Some(status),
                    Some(pid) if pid == self.watchdog && self.lifeline.is_some() => {
                        self.watchdog_gone = true;
                        eprintln!(
                            "redlock: the watchdog ended ({status:?}); if redlock dies now, its command is not stopped"
                        );
                    }
                    _ => {}
                },
            }
        }
    }

    /// The command's own exit status, once it has ended and been reaped.
    pub(crate) fn status(&self) -> Option<WaitStatus> {
        self.status
    }

    /// Whether no process of the group is left (the leader reaped, and
    /// `kill(-G, 0)` finds nobody). A process that is not ours but in the
    /// group (`EPERM`) counts as present.
    pub(crate) fn is_gone(&self) -> bool {
        self.status.is_some() && killpg(self.pgid, None) == Err(Errno::ESRCH)
    }

    /// Tells the watchdog that the group is done: it exits without a kill.
    pub(crate) fn disarm(&mut self) {
        if let Some(mut lifeline) = self.lifeline.take() {
            let _ = lifeline.write_all(b"done\n");
        }
    }
}
