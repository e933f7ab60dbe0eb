//! The events of a fault run's history, and its JSON-lines log.

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// How a lock was taken and held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `lock_with`, manual `extend`, `unlock`.
    Manual,
    /// `lock_guard` with auto-extension; validity read from the `LockHandle`.
    Guard,
    /// The liveness probe after the faults healed.
    Probe,
}

/// The kinds of injected faults, as counted in the summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `kill -9` of a node (restarted later, empty).
    Kill,
    /// `SIGSTOP` of a node (`SIGCONT` later).
    Pause,
    /// A fault of the TCP proxy in front of a node.
    Proxy,
    /// A clock jump emulated on one node's keys.
    Clock,
    /// A holder that stalls past its validity before its write.
    Stall,
    /// A holder on a current-thread runtime that blocks its own thread (so its
    /// renewal task cannot run) past its validity, before or after its
    /// `is_lost()` check.
    HolderStall,
    /// A guard with `max_hold` shorter than its TTL, renewed through slow
    /// proxies: its last renewals shorten the keys and answer late.
    MaxHold,
}

impl FaultKind {
    /// Every kind, in summary order.
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Proxy,
        FaultKind::Clock,
        FaultKind::Stall,
        FaultKind::HolderStall,
        FaultKind::MaxHold,
    ];

    /// The name used in the summary line.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Proxy => "proxy",
            FaultKind::Clock => "clock",
            FaultKind::Stall => "stall",
            FaultKind::HolderStall => "holder_stall",
            FaultKind::MaxHold => "max_hold",
        }
    }
}

/// What a history is about; the first event of every history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The scenario's name.
    pub scenario: String,
    /// The seed of the run.
    pub seed: u64,
    /// How many lock nodes.
    pub nodes: usize,
    /// The quorum.
    pub quorum: usize,
    /// The library's drift factor.
    pub drift_factor: f64,
    /// The library's fixed drift, in ns.
    pub fixed_drift_ns: u64,
    /// The per-node timeout, in ns.
    pub node_timeout_ns: u64,
    /// A negative control: the run is built to violate mutual exclusion, and the
    /// checkers must say so.
    pub expect_violation: bool,
}

/// One event of a history. Times are [`now_ns`](super::now_ns) nanoseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The run's parameters.
    Meta(Meta),
    /// A process's [`calibration_error_ns`](super::calibration_error_ns): comparisons between a converted
    /// [`Instant`](std::time::Instant) and a raw clock reading allow the two largest, added up.
    Clock {
        /// The process (`"parent"` or a client's name).
        process: String,
        /// Its calibration error.
        error_ns: u64,
    },
    /// A lock was acquired. `t0`/`t1` bracket the call; `started` is the
    /// library's `Lock::started_at` (manual mode).
    Acquire {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// How the lock is held.
        mode: Mode,
        /// Before the call.
        t0: u64,
        /// After the call returned.
        t1: u64,
        /// `Lock::started_at`, when known.
        started: Option<u64>,
        /// `Lock::valid_until` / `LockHandle::valid_until`.
        valid_until: u64,
        /// The TTL asked for.
        ttl_ns: u64,
        /// A guard's loss margin (`LockHandle::loss_margin`): its holder is told
        /// the lock is lost at `valid_until − loss_margin`, and the library may
        /// give the lock up from then on, so its hold ends there.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        loss_margin_ns: Option<u64>,
    },
    /// An acquire call failed.
    AcquireFailed {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// Before the call.
        t0: u64,
        /// After the call returned.
        t1: u64,
        /// The error.
        error: String,
    },
    /// A manual `Lock::extend` call.
    Extend {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// Before the call.
        t0: u64,
        /// After the call returned.
        t1: u64,
        /// `Lock::started_at` after a success.
        started: Option<u64>,
        /// `Lock::valid_until` after a success.
        valid_until: Option<u64>,
        /// The TTL asked for.
        ttl_ns: u64,
        /// The error, if it failed.
        error: Option<String>,
    },
    /// A guard holder read its `LockHandle` before a write.
    Observe {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// When.
        at: u64,
        /// `LockHandle::valid_until`.
        valid_until: u64,
        /// `LockHandle::is_lost`.
        lost: bool,
        /// The guard's TTL.
        ttl_ns: u64,
    },
    /// A counted write: the store found the validity unexpired and wrote.
    Write {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// When the store read the value (inside its lock).
        read_at: u64,
        /// When the store checked the validity and wrote (inside its lock).
        at: u64,
        /// The value read.
        read: u64,
        /// The value written (`read + 1`).
        wrote: u64,
    },
    /// A write judged by the holder's own view: the holder checked
    /// `LockHandle::is_lost()` (false) and then wrote to the store, which does
    /// not check anything itself.
    HolderWrite {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// When the store read the value.
        read_at: u64,
        /// The value read.
        read: u64,
        /// Just before the `is_lost()` check that returned false.
        check_at: u64,
        /// When the store wrote (under its lock).
        at: u64,
        /// The value written (`read + 1`).
        wrote: u64,
        /// The workload stalled the holder's thread between the check and the
        /// write. No client-side check can catch that; only fencing can.
        stalled_after_check: bool,
        /// The lock's TTL.
        ttl_ns: u64,
    },
    /// A write skipped because the holder saw its lock expired or lost.
    Skip {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// When.
        at: u64,
        /// Why.
        reason: String,
    },
    /// The holder started to release the lock.
    Release {
        /// The client.
        client: String,
        /// The resource.
        res: String,
        /// The lock's token.
        token: String,
        /// When the release call started.
        at: u64,
        /// Successful extensions of this lock (manual or automatic).
        extensions: u32,
    },
    /// An injected fault.
    Fault {
        /// Which kind.
        kind: FaultKind,
        /// The node (or client process) it hit, if any.
        node: Option<usize>,
        /// When.
        at: u64,
        /// The details (sub-kind, durations).
        detail: String,
    },
    /// A fault was healed.
    Heal {
        /// The node, if any.
        node: Option<usize>,
        /// When.
        at: u64,
        /// What was healed.
        detail: String,
    },
    /// A proxy saw a lock token in a client's request.
    Sighting {
        /// The proxy (node index).
        proxy: usize,
        /// The token.
        token: String,
        /// When the proxy read it from the client's socket.
        at: u64,
    },
    /// The store's final count of a resource, after the workload stopped.
    Final {
        /// The resource.
        res: String,
        /// The count.
        count: u64,
    },
    /// The liveness probe of a resource after the faults healed.
    Liveness {
        /// The resource.
        res: String,
        /// When every fault was healed.
        healed_at: u64,
        /// When the probe held the lock, if it did.
        acquired_at: Option<u64>,
        /// The allowed wait: TTL + the retry budget.
        bound_ns: u64,
    },
    /// A key a node set after its client gave up, watched until it expired.
    Ghost {
        /// The node.
        node: usize,
        /// The key.
        key: String,
        /// The TTL the key may live, at most.
        ttl_ns: u64,
        /// The node could run the `SET` from this time on (it was resumed, or the
        /// proxy flushed).
        set_after: u64,
        /// The largest `PTTL` seen.
        max_pttl_ms: i64,
        /// The last poll that found the key.
        last_present: Option<u64>,
    },
}

/// A shared, append-only event log.
#[derive(Debug, Clone, Default)]
pub struct HistoryLog {
    events: Arc<Mutex<Vec<Event>>>,
}

impl HistoryLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an event.
    pub fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }

    /// Appends several events.
    pub fn extend(&self, es: impl IntoIterator<Item = Event>) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(es);
    }

    /// A copy of every event so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Writes events as JSON lines.
///
/// # Errors
/// I/O errors.
pub fn write_jsonl(path: &Path, events: &[Event]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut w = BufWriter::new(std::fs::File::create(path)?);
    for e in events {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

/// Reads a JSON-lines history.
///
/// # Errors
/// I/O errors and malformed lines (with the line number).
pub fn read_jsonl(path: &Path) -> std::io::Result<Vec<Event>> {
    let r = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut out = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let e = serde_json::from_str(&line).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}:{}: {e}", path.display(), i + 1),
            )
        })?;
        out.push(e);
    }
    Ok(out)
}

/// The directory histories are written to: `$REDLOCK_HISTORY_DIR`, else `default`.
pub fn history_dir(default: &Path) -> std::path::PathBuf {
    std::env::var_os("REDLOCK_HISTORY_DIR").map_or_else(|| default.to_path_buf(), Into::into)
}
