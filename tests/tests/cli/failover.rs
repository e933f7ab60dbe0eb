//! The failover double grant through the `redlock` command (issue 40, its
//! "Reproduced here" paragraph), and what `?replica_acks=1` does to it.
//!
//! Node 1 is one primary with a replica behind a failover endpoint
//! (`redlock_tests::replicas`), nodes 2 and 3 are plain. Node 3 is away
//! (SIGSTOP) and the replication link stalled while holder A's `redlock run`
//! takes the lock and starts a long command; then the primary is killed, its
//! replica promoted without A's key, the endpoint moved, and node 3 resumed.
//! Holder B's `redlock run` on the same key follows.
//!
//! Node 3 is resumed only once A has given up connecting to it: A's `SET`
//! to node 3 waits for that connection as a late answer, and a late `OK`
//! joins A's lock, so a node 3 resumed sooner takes A's key after all (the
//! library's own defence, not the one under test). Linux only: A's sockets
//! are read from `/proc`.
//!
//! Overlap is judged from what the commands record: A's writes `a-start`
//! when it starts and `a-end` when it ends (a trap writes it on SIGTERM too);
//! B's writes `b-start`, and `overlap` when it starts while `a-start` is
//! there and `a-end` is not.
//!
//! - Without replica acks (the negative control), B runs while A's command
//!   still runs: the double grant.
//! - With `?replica_acks=1&replica_timeout_ms=300` on node 1, A's write on
//!   node 1 is not acked by the stalled replica and does not count: A gets
//!   no lock (1 of 3 nodes), its command never starts, and B's run is the
//!   only one. With the link not stalled, the replica has A's key when it is
//!   promoted, and B is refused (75).

use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use redlock_tests::replicas::ReplicaGroup;
use redlock_tests::{RedisNode, timing};

use crate::{finish, redlock, text, wait_for};

const KEY: &str = "cli-failover";
/// Holder A's node timeout: its attempt to connect to the stopped node 3 is
/// given up after ten of them, at least 1 s (`node/connection.rs`).
const A_NODE_TIMEOUT: &str = "500ms";

/// How long holder A may take to start its command, or to fail: its
/// connection to the stopped node 3 given up (ten node timeouts), then the
/// acquire.
fn a_bound() -> Duration {
    timing::liveness(Duration::from_millis(500) * 12)
}

/// How long holder B (1 s node timeout) may take from start to end: a
/// connection, an acquire and a release.
fn b_bound() -> Duration {
    timing::liveness(Duration::from_secs(3))
}

/// A `redlock run` that is killed, with its command's process group, if the
/// test ends (a failed assertion) before it was seen to its end (its command
/// writes its shell's pid, the group's leader, to `pid_file`).
struct Holder {
    child: Option<Child>,
    pid_file: PathBuf,
}

impl Holder {
    /// Whether this `redlock` has a connection to `port` open (Linux:
    /// its socket descriptors, looked up in `/proc/net/tcp`).
    fn connected_to(&self, port: u16) -> bool {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
            })
            .collect();
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let port = format!(":{port:04X}");
        table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Remote address, state (01: established), inode.
            f.len() > 9 && f[2].ends_with(&port) && f[3] == "01" && inodes.iter().any(|i| i == f[9])
        })
    }

    /// Waits for `redlock` to end (bounded, killed after `timeout`).
    fn finish(mut self, timeout: Duration, what: &str) -> Output {
        let child = self.child.take().expect("the holder's process");
        finish(child, timeout, what)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Only a holder the test did not see to its end (a failed
        // assertion): its job first, while `redlock` (its parent, which
        // reaps it) still runs, so the pid cannot have been reused.
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None))
            && let Some(pid) = std::fs::read_to_string(&self.pid_file)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The three nodes, the scratch directory and the runtime the proxies run on.
struct Setup {
    rt: tokio::runtime::Runtime,
    group: ReplicaGroup,
    _node2: RedisNode,
    node3: RedisNode,
    dir: tempfile::TempDir,
    nodes: String,
}

impl Setup {
    /// Node 1 with `?replica_acks=1&replica_timeout_ms=300` when `acks`.
    fn start(acks: bool) -> Self {
        let rt = tokio::runtime::Runtime::new().expect("a Tokio runtime");
        let group = rt.block_on(ReplicaGroup::start());
        let node2 = RedisNode::start();
        let node3 = RedisNode::start();
        let first = if acks {
            format!("{}?replica_acks=1&replica_timeout_ms=300", group.url())
        } else {
            group.url()
        };
        let nodes = format!("{first},{},{}", node2.url(), node3.url());
        Self {
            rt,
            group,
            _node2: node2,
            node3,
            dir: tempfile::tempdir().expect("a temp dir"),
            nodes,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts holder A: a command that records its start, runs until the
    /// `gate` file appears, and records its end (on SIGTERM too).
    fn holder_a(&self) -> Holder {
        let mut c = redlock(&self.nodes);
        c.args([
            "run",
            "--key",
            KEY,
            "--ttl",
            "60s",
            "--node-timeout",
            A_NODE_TIMEOUT,
            "--",
            "sh",
            "-c",
        ]);
        c.arg(format!(
            "echo $$ > {pid}; trap 'touch {end}; exit 143' TERM; touch {start}; \
             while [ ! -e {gate} ]; do sleep 0.02; done; touch {end}",
            pid = self.path("a.pid").display(),
            end = self.path("a-end").display(),
            start = self.path("a-start").display(),
            gate = self.path("gate").display(),
        ));
        Holder {
            child: Some(c.spawn().expect("start holder A")),
            pid_file: self.path("a.pid"),
        }
    }

    /// Runs holder B to its end: a command that records its start, and
    /// whether A's command was running then.
    fn holder_b(&self) -> Output {
        let mut c = redlock(&self.nodes);
        c.args([
            "run",
            "--key",
            KEY,
            "--ttl",
            "60s",
            "--node-timeout",
            "1s",
            "--",
            "sh",
            "-c",
        ]);
        c.arg(format!(
            "echo $$ > {pid}; touch {start}; \
             if [ -e {a_start} ] && [ ! -e {a_end} ]; then touch {overlap}; fi",
            pid = self.path("b.pid").display(),
            start = self.path("b-start").display(),
            a_start = self.path("a-start").display(),
            a_end = self.path("a-end").display(),
            overlap = self.path("overlap").display(),
        ));
        let b = Holder {
            child: Some(c.spawn().expect("start holder B")),
            pid_file: self.path("b.pid"),
        };
        b.finish(b_bound(), "holder B")
    }

    /// The failover: the primary killed, the replica promoted with what it
    /// had received, the endpoint moved; then node 3 resumed and answering.
    ///
    /// `a`, when A still runs: node 3 is resumed only once A has given up
    /// its connection attempt to the stopped node 3. A's `SET` waits for
    /// that attempt as a late answer (a late `OK` joins A's lock); resumed
    /// sooner, node 3 would take A's `SET` late, and hold A's key.
    fn failover_and_node3_back(&self, a: Option<&Holder>) {
        self.rt.block_on(self.group.failover());
        if let Some(a) = a {
            wait_for(
                "A to give up its connection to the stopped node 3",
                a_bound(),
                || !a.connected_to(self.node3.port()),
            );
        }
        self.node3.resume();
        wait_for("node 3 to answer", timing::liveness(Duration::ZERO), || {
            self.node3.raw::<String>(&["PING"]).is_ok()
        });
    }

    fn recorded(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// Lets A's command end, then waits for A (bounded).
    fn end_a(&self, a: Holder) -> Output {
        std::fs::write(self.path("gate"), b"").expect("write the gate");
        a.finish(a_bound(), "holder A")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // A stopped node 3 is killed (SIGKILL reaches a stopped process) by
        // its own drop; resume it anyway so that nothing waits on it.
        self.node3.resume();
    }
}

#[test]
fn without_replica_acks_a_failover_lets_a_second_run_overlap_the_first() {
    let s = Setup::start(false);
    s.node3.pause();
    s.group.stall();
    let a = s.holder_a();
    wait_for("A's command to start", a_bound(), || s.recorded("a-start"));
    assert_eq!(
        s.group.primary().get(KEY).map(|t| t.is_empty()),
        Some(false),
        "A holds node 1's primary"
    );
    assert_eq!(
        s.group.replica().get(KEY),
        None,
        "the stalled replica never got A's key"
    );
    s.failover_and_node3_back(Some(&a));
    assert_eq!(s.node3.get(KEY), None, "A's write never reached node 3");

    let b = s.holder_b();
    let b_ran = s.recorded("b-start");
    let overlap = s.recorded("overlap");
    let a_out = s.end_a(a);
    assert_eq!(b.status.code(), Some(0), "B: {}", text(&b.stderr));
    assert!(
        b_ran && overlap,
        "negative control: B's command must run while A's still runs (B ran: {b_ran}, \
         overlap: {overlap}); A: {}; B: {}",
        text(&a_out.stderr),
        text(&b.stderr)
    );
    eprintln!(
        "double grant observed: B's command ran while A's ran; A exited {:?}",
        a_out.status.code()
    );
}

#[test]
fn with_replica_acks_a_write_the_stalled_replica_missed_gives_no_lock_and_no_overlap() {
    let s = Setup::start(true);
    s.node3.pause();
    s.group.stall();
    let a = s.holder_a();
    let a_out = a.finish(a_bound(), "holder A");
    let a_err = text(&a_out.stderr);
    assert!(
        matches!(a_out.status.code(), Some(69 | 75)),
        "A must get no lock with node 1's write unacked and node 3 away: {:?}: {a_err}",
        a_out.status.code()
    );
    assert!(!s.recorded("a-start"), "A's command never started: {a_err}");
    s.failover_and_node3_back(None);

    let b = s.holder_b();
    assert_eq!(b.status.code(), Some(0), "B: {}", text(&b.stderr));
    assert!(s.recorded("b-start"), "B's command ran");
    assert!(
        !s.recorded("overlap"),
        "no second concurrent run: B's command saw A's running"
    );
    eprintln!(
        "with replica acks: A exited {:?} ({}), B ran alone",
        a_out.status.code(),
        a_err.trim()
    );
}

#[test]
fn with_replica_acks_the_promoted_replica_has_the_key_and_the_second_run_is_refused() {
    let s = Setup::start(true);
    s.node3.pause();
    let a = s.holder_a();
    wait_for("A's command to start", a_bound(), || s.recorded("a-start"));
    let token = s
        .group
        .primary()
        .get(KEY)
        .expect("A holds node 1's primary");
    assert_eq!(
        s.group.replica().get(KEY).as_deref(),
        Some(token.as_str()),
        "the write was acked: the replica has A's key"
    );
    s.failover_and_node3_back(Some(&a));
    assert_eq!(s.node3.get(KEY), None, "A's write never reached node 3");

    let b = s.holder_b();
    let a_out = s.end_a(a);
    assert_eq!(
        b.status.code(),
        Some(75),
        "B must be refused while A holds the lock: {}",
        text(&b.stderr)
    );
    assert!(!s.recorded("b-start"), "B's command never started");
    assert!(!s.recorded("overlap"));
    // A ends by its gate (0), or, had its renewal come before, with the
    // loss (79): after the failover node 1 has no replica to ack it.
    assert!(
        matches!(a_out.status.code(), Some(0 | 79)),
        "A: {:?}: {}",
        a_out.status.code(),
        text(&a_out.stderr)
    );
}
