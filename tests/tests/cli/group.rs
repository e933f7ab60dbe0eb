//! `redlock run`'s command as a process group (issue 38, item 1): a loss stops
//! the whole job, not only the shell; a `redlock` killed with SIGKILL takes its
//! job with it; a signal during the acquire ends `redlock` before the command
//! starts; a terminal's signal reaches the job once.
//!
//! Linux only: a process's state is read from `/proc` (a zombie is dead, and
//! the machine's init may never reap one).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use redlock_tests::{Cluster, timing};

use super::{finish, redlock, text, to_end, to_start, wait_for};

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Kills a process the test started indirectly if it is still there when the
/// test ends, pass or fail.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// Waits (bounded) for `path` to hold a pid.
fn read_pid(path: &Path) -> i32 {
    wait_for("the job's pid file", to_start(), || {
        std::fs::read_to_string(path).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    });
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The issue's job, `sh -c 'sleep 31; true'`, with the `sleep` writing its pid
/// first (an inner shell that writes `$$` and `exec`s it). The `sleep` holds
/// none of redlock's pipes, so an orphan of it cannot hold up the test.
fn sleeper(pid_file: &Path) -> String {
    format!(
        "sh -c 'echo $$ > {}; exec sleep 31 </dev/null >/dev/null 2>&1'; true",
        pid_file.display()
    )
}

#[test]
fn a_lost_lock_stops_the_whole_job_and_the_next_holder_starts_after_it_is_gone() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sleep.pid");
    let mut c = redlock(&nodes);
    c.args([
        "run",
        "--key",
        "orphan:job",
        "--ttl",
        "3s",
        "--grace",
        "1s",
        "--node-timeout",
        "100ms",
        "--",
        "sh",
        "-c",
    ]);
    c.arg(sleeper(&pid_file));
    let first = c.spawn().unwrap();
    let sleep_pid = read_pid(&pid_file);
    let _cleanup = KillOnDrop(sleep_pid);
    assert!(alive(sleep_pid));
    for n in cluster.nodes() {
        n.pause();
    }
    // The loss comes by the 3 s TTL, then the grace.
    let out = finish(
        first,
        to_end(Duration::from_secs(3) + Duration::from_secs(1)),
        "redlock after the loss",
    );
    // Read at once: redlock has exited, so the lock may be taken by another.
    let survived = alive(sleep_pid);
    for n in cluster.nodes() {
        n.resume();
    }
    assert_eq!(out.status.code(), Some(79), "{}", text(&out.stderr));
    assert!(
        !survived,
        "the job's `sleep` (pid {sleep_pid}) still runs after redlock exited 79; stderr: {}",
        text(&out.stderr)
    );

    // The next holder, once the old keys have expired: its command starts
    // with no process of the first job left.
    let started = dir.path().join("second-started");
    let gate = dir.path().join("gate");
    // It waits for the old keys' 3 s TTL.
    let wait = timing::liveness(Duration::from_secs(3));
    let mut c = redlock(&nodes);
    c.args([
        "run",
        "--key",
        "orphan:job",
        "--wait",
        &format!("{}ms", wait.as_millis()),
        "--",
        "sh",
        "-c",
    ]);
    c.arg(format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
        started.display(),
        gate.display()
    ));
    let second = c.spawn().unwrap();
    wait_for("the second holder's command", wait + to_start(), || {
        started.exists()
    });
    let overlap = alive(sleep_pid);
    std::fs::write(&gate, b"").unwrap();
    let out = finish(second, to_end(Duration::ZERO), "the second holder");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !overlap,
        "the second holder's command ran while the first job's sleep ({sleep_pid}) still ran"
    );
}

#[test]
fn a_redlock_killed_with_sigkill_takes_its_whole_job_with_it() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sleep.pid");
    let shell_file = dir.path().join("sh.pid");
    let mut c = Command::new(super::redlock_bin());
    c.env("REDLOCK_NODES", &nodes)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .args([
            "--node-timeout",
            &format!("{}ms", timing::PATIENT_NODE_TIMEOUT.as_millis()),
            "run",
            "--key",
            "cli-kill9",
            "--ttl",
            "10s",
            "--",
            "sh",
            "-c",
        ]);
    c.arg(format!(
        "echo $$ > {}; {}",
        shell_file.display(),
        sleeper(&pid_file)
    ));
    let mut holder = c.spawn().unwrap();
    let sleep_pid = read_pid(&pid_file);
    let shell_pid = read_pid(&shell_file);
    let _cleanup = (KillOnDrop(sleep_pid), KillOnDrop(shell_pid));
    assert!(alive(sleep_pid) && alive(shell_pid));
    holder.kill().unwrap();
    holder.wait().unwrap();
    // Nothing to wait for but the scheduler: the kernel signals the job.
    wait_for(
        "the job to die with its redlock (SIGKILL)",
        timing::liveness(Duration::ZERO),
        || !alive(sleep_pid) && !alive(shell_pid),
    );
}

#[test]
fn a_signal_during_the_acquire_ends_redlock_and_the_command_never_starts() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let gate = dir.path().join("gate");
    let ran = dir.path().join("ran");
    // A holder keeps the lock busy, so the next `redlock run --wait` waits.
    let mut c = redlock(&nodes);
    c.args(["run", "--key", "cli-early", "--", "sh", "-c"]);
    c.arg(format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
        started.display(),
        gate.display()
    ));
    let holder = c.spawn().unwrap();
    wait_for("the holder's command", to_start(), || started.exists());
    let clients = |cluster: &Cluster| -> usize {
        let list: String = cluster.node(0).raw(&["CLIENT", "LIST"]).unwrap();
        list.lines().count()
    };
    let before = clients(&cluster);
    let mut c = redlock(&nodes);
    c.args([
        "run",
        "--key",
        "cli-early",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
    ]);
    c.arg(format!("touch {}", ran.display()));
    let waiter = c.spawn().unwrap();
    // The waiter has connected to the nodes: it is taking the lock.
    wait_for("the waiter's connections", to_start(), || {
        clients(&cluster) > before
    });
    let pid = Pid::from_raw(i32::try_from(waiter.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let out = finish(waiter, to_end(Duration::ZERO), "redlock after SIGTERM");
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "exit status {:?}; stderr: {}",
        out.status,
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("not started"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&gate, b"").unwrap();
    let out = finish(holder, to_end(Duration::ZERO), "the holder");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !ran.exists(),
        "the command of a redlock ended by SIGTERM ran"
    );
    // The waiter left nothing behind: the lock is free at once.
    let mut c = redlock(&nodes);
    c.args(["run", "--key", "cli-early", "--", "true"]);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A job that logs each delivery of SIGINT or SIGHUP (a wakeup fd gets one
/// byte per delivery, so two deliveries are never counted as one), and exits
/// 42 on SIGTERM.
const COUNTER: &str = r#"
import os, signal, sys
log, started = sys.argv[1], sys.argv[2]
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, lambda *a: None)
open(started, "w").close()
with open(log, "a") as out:
    while True:
        n = os.read(r, 1)[0]
        if n == signal.SIGTERM:
            sys.exit(42)
        out.write(signal.Signals(n).name + "\n")
        out.flush()
"#;

#[test]
fn a_terminal_signal_reaches_the_job_once() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("signals");
    let started = dir.path().join("started");
    let mut c = redlock(&nodes);
    // As a shell runs a job: `redlock` leads a process group, which a
    // terminal's Ctrl-C signals as a whole.
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    c.args(["run", "--key", "cli-tty", "--", "python3", "-c", COUNTER]);
    c.arg(&log).arg(&started);
    let job = c.spawn().unwrap();
    wait_for("the job", to_start(), || started.exists());
    let pid = Pid::from_raw(i32::try_from(job.id()).unwrap());
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    // Two copies of one SIGINT that reach a process close together merge
    // into one pending signal, which would hide a double delivery: redlock is
    // stopped while the terminal's copy goes out, so that a copy reaching the
    // job directly is taken before any copy redlock forwards.
    kill(pid, Signal::SIGSTOP).unwrap();
    wait_for("redlock to stop", timing::liveness(Duration::ZERO), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
        })
    });
    // Ctrl-C: SIGINT to the terminal's foreground group, redlock's.
    killpg(pid, Signal::SIGINT).unwrap();
    // A job in redlock's group has its copy now; one in a group of its own
    // has none until redlock forwards one (so this wait runs out).
    let end = std::time::Instant::now() + timing::liveness(Duration::ZERO);
    while !lines().contains("SIGINT") && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(pid, Signal::SIGCONT).unwrap();
    wait_for("the job's SIGINT", timing::liveness(Duration::ZERO), || {
        lines().contains("SIGINT")
    });
    // A mark after it: SIGHUP to redlock alone, forwarded.
    kill(pid, Signal::SIGHUP).unwrap();
    wait_for("the job's SIGHUP", timing::liveness(Duration::ZERO), || {
        lines().contains("SIGHUP")
    });
    kill(pid, Signal::SIGTERM).unwrap();
    let out = finish(job, to_end(Duration::ZERO), "redlock after SIGTERM");
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    assert_eq!(
        lines(),
        "SIGINT\nSIGHUP\n",
        "one Ctrl-C must reach the job once"
    );
}

#[test]
fn processes_the_command_leaves_behind_are_stopped_before_the_release() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("bg.pid");
    // The command exits at once and leaves a `sleep` behind in its group.
    let mut c = redlock(&nodes);
    c.args(["run", "--key", "cli-bg", "--grace", "1s", "--", "sh", "-c"]);
    c.arg(format!(
        "sleep 30 </dev/null >/dev/null 2>&1 & echo $! > {}; exit 3",
        pid_file.display()
    ));
    let run = c.spawn().unwrap();
    let bg = read_pid(&pid_file);
    let _cleanup = KillOnDrop(bg);
    let out = finish(
        run,
        to_start() + to_end(Duration::from_secs(1)),
        "redlock with a leftover process",
    );
    let survived = alive(bg);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        !survived,
        "the leftover `sleep` ({bg}) still runs after redlock released the lock"
    );
    assert!(
        text(&out.stderr).contains("left processes in its group"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        cluster.settled_count_blocking("cli-bg", 0),
        0,
        "released at the end"
    );
}
