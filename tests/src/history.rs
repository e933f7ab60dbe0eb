//! Histories of a fault run, and the checkers that judge them.
//!
//! Every event is stamped with `CLOCK_MONOTONIC` nanoseconds ([`now_ns`]). That is
//! the clock [`Instant`] reads on Linux, and it is one clock for the whole
//! machine, so events logged by separate client processes, by the fault proxies
//! and by the nemesis can be compared directly. A library [`Instant`] (such as
//! `Lock::valid_until`) is converted with [`instant_ns`].
//!
//! A history is a list of [`Event`]s, kept as JSON lines ([`write_jsonl`],
//! [`read_jsonl`]) so a soak run can be checked again later ([`check`], and the
//! `fault_recheck` binary).
//!
//! # The checkers
//!
//! * **Overlap.** Per resource, each lock (one token) held the interval
//!   `[acquired, min(release started, validity deadline − loss margin, loss
//!   noticed))`, where `acquired` is when the acquire call returned and the
//!   deadline is the validity the library reported to the holder: for a manual
//!   lock the acquire's, raised by each successful extension; for a guard the
//!   one its holder observed last (a renewal near `max_hold` can lower it). A
//!   guard's loss margin (0 for manual locks) is there because its holder is told
//!   "lost" at `valid_until − margin` and the library may release the keys from
//!   then on. No two intervals of one resource may intersect.
//! * **Late writes.** Every counted write happened inside its own lock's interval.
//! * **Holder view.** An [`Event::HolderWrite`] is a write the store did not
//!   check: the holder checked `is_lost()` (false), then wrote. A write whose
//!   check passed and that followed it without a stall must fall inside its own
//!   interval and inside no other holder's interval, and the chain of such
//!   writes (in store order, each reading the previous one's value) must not
//!   break, nor end below the final count. Writes the workload stalled between
//!   the check and the write (gap over half the TTL) are counted apart as
//!   `stalled_after_check`: no client-side check can stop them, only fencing;
//!   a broken link caused by one is not counted as a lost update.
//! * **Lost updates.** The clients run a non-atomic read, sleep, write+1 on a
//!   fault-free store. The store runs the validity check and the write as one step
//!   under its own mutex (or `flock`), against the shared monotonic clock, so a
//!   write is counted exactly when it was made inside the validity. The final
//!   count of each resource must equal the number of counted writes, and the
//!   writes, in store order, must each have read the previous write's value.
//! * **Validity not overstated.** For every successful acquire and extension:
//!   the library's own start lies inside the call (`t0 ≤ started ≤ t1`), and the
//!   reported deadline is at most `started + ttl − drift`. For acquisitions the
//!   start must also precede the first time any proxy saw the fresh token on the
//!   wire, and the deadline must be at most `first sighting + ttl − drift`: the
//!   key cannot have been set on any node before that, so it cannot expire before
//!   `first sighting + ttl`. For auto-extended guards, whose calls the harness
//!   does not see, every observed deadline must be at most the latest sighting of
//!   the token before the observation, plus `ttl − drift`.
//! * **Liveness.** After the faults heal, every resource is acquired within
//!   `TTL + retry budget`.
//! * **Ghost keys.** A key that a node set after its client gave up expires
//!   within the TTL.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::time::{ClockId, clock_gettime};
use serde::{Deserialize, Serialize};

/// Nanoseconds on `CLOCK_MONOTONIC`, the machine-wide clock [`Instant`] uses.
///
/// # Panics
/// If the clock cannot be read (never on Linux).
pub fn now_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("read CLOCK_MONOTONIC");
    let secs = u64::try_from(ts.tv_sec()).expect("monotonic seconds are positive");
    let nanos = u64::try_from(ts.tv_nsec()).expect("nanoseconds are positive");
    secs * 1_000_000_000 + nanos
}

/// One pairing of an [`Instant`] with [`now_ns`], taken once per process.
struct Calibration {
    instant: Instant,
    ns: u64,
    /// How far apart the two readings that bracket `instant` were: the most the
    /// pairing can be off by, twice over.
    width: u64,
}

static CALIBRATION: LazyLock<Calibration> = LazyLock::new(|| {
    let mut best: Option<Calibration> = None;
    for _ in 0..64 {
        let a = now_ns();
        let instant = Instant::now();
        let b = now_ns();
        let width = b.saturating_sub(a);
        if best.as_ref().is_none_or(|c| width < c.width) {
            best = Some(Calibration {
                instant,
                ns: a + width / 2,
                width,
            });
        }
    }
    best.expect("at least one sample")
});

/// Converts an [`Instant`] of this process to [`now_ns`] nanoseconds.
///
/// Both read `CLOCK_MONOTONIC`; the conversion is off by at most
/// [`calibration_error_ns`].
pub fn instant_ns(i: Instant) -> u64 {
    let c = &*CALIBRATION;
    if i >= c.instant {
        c.ns + duration_ns(i - c.instant)
    } else {
        c.ns.saturating_sub(duration_ns(c.instant - i))
    }
}

/// The most [`instant_ns`] can be off by in this process (plus one nanosecond).
pub fn calibration_error_ns() -> u64 {
    CALIBRATION.width / 2 + 1
}

/// A duration in whole nanoseconds (saturating).
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

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

/// One event of a history. Times are [`now_ns`] nanoseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The run's parameters.
    Meta(Meta),
    /// A process's [`calibration_error_ns`]: comparisons between a converted
    /// [`Instant`] and a raw clock reading allow the two largest, added up.
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

/// What the checkers found in one history.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The scenario (from [`Meta`]).
    pub scenario: String,
    /// Whether the history is a negative control.
    pub expect_violation: bool,
    /// Successful acquisitions by the workload (probes not counted).
    pub acquisitions: u64,
    /// Failed acquire calls.
    pub acquire_failures: u64,
    /// Successful extensions (manual ones, and the guards' automatic ones).
    pub extensions: u64,
    /// Counted writes.
    pub writes: u64,
    /// Skipped writes.
    pub skips: u64,
    /// Injected faults per kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// Overlapping holds, described.
    pub overlaps: Vec<String>,
    /// Writes made outside their own hold interval.
    pub late_writes: Vec<String>,
    /// `|counted writes − final count|`, summed over resources, plus broken links
    /// in the chain of writes.
    pub lost_updates: u64,
    /// What the lost-update checker saw, described.
    pub lost_update_details: Vec<String>,
    /// Overstated validities, described.
    pub stale_validity: Vec<String>,
    /// Liveness: `None` when the history has no probe.
    pub liveness_ok: Option<bool>,
    /// Probes that failed, described.
    pub liveness_details: Vec<String>,
    /// Ghost keys checked.
    pub ghosts_checked: u64,
    /// Ghost keys that were seen on their node (a `SET` that ran after its client
    /// gave up).
    pub ghosts_seen: u64,
    /// Ghost keys that outlived their TTL, described.
    pub ghost_violations: Vec<String>,
    /// Holder-view writes ([`Event::HolderWrite`]).
    pub holder_writes: u64,
    /// Holder-view writes judged: the check passed and the write followed it
    /// without a stall.
    pub holder_checked: u64,
    /// Judged holder-view writes that fell inside another holder's interval,
    /// described.
    pub holder_overlaps: Vec<String>,
    /// Broken links in the chain of holder-view writes not caused by a write
    /// stalled after its check, and final counts that differ from the last write.
    pub holder_lost_updates: u64,
    /// What the holder-view lost-update checker saw, described.
    pub holder_lost_update_details: Vec<String>,
    /// Holder-view writes stalled between the check and the write (counted, not
    /// failed: only fencing can refuse them).
    pub stalled_after_check: u64,
    /// Of those, the ones that landed inside another holder's interval.
    pub stalled_overlapping: u64,
    /// Guard locks whose holder saw its validity go down (a shortening renewal
    /// near `max_hold`).
    pub shortened: u64,
}

impl Verdict {
    /// Every safety violation found (liveness excluded).
    pub fn safety_violations(&self) -> u64 {
        self.overlaps.len() as u64
            + self.late_writes.len() as u64
            + self.lost_updates
            + self.stale_validity.len() as u64
            + self.ghost_violations.len() as u64
            + self.holder_overlaps.len() as u64
            + self.holder_lost_updates
    }

    /// Whether the history passed: no violation and live, or, for a negative
    /// control, an overlap was detected.
    pub fn passed(&self) -> bool {
        if self.expect_violation {
            self.caught()
        } else {
            self.safety_violations() == 0 && self.liveness_ok != Some(false)
        }
    }

    /// For a negative control: whether the overlap it provokes was detected
    /// (two holds, or a holder's checked write inside another's hold).
    pub fn caught(&self) -> bool {
        !self.overlaps.is_empty() || !self.holder_overlaps.is_empty()
    }

    /// Lost updates of both checkers.
    pub fn all_lost_updates(&self) -> u64 {
        self.lost_updates + self.holder_lost_updates
    }

    /// Every finding, one per line (at most `limit` per kind).
    pub fn describe(&self, limit: usize) -> String {
        let mut out = String::new();
        for (name, list) in [
            ("overlap", &self.overlaps),
            ("late write", &self.late_writes),
            ("lost update", &self.lost_update_details),
            ("holder-view overlap", &self.holder_overlaps),
            ("holder-view lost update", &self.holder_lost_update_details),
            ("stale validity", &self.stale_validity),
            ("liveness", &self.liveness_details),
            ("ghost key", &self.ghost_violations),
        ] {
            for d in list.iter().take(limit) {
                out.push_str(&format!("  {name}: {d}\n"));
            }
            if list.len() > limit {
                out.push_str(&format!(
                    "  ... {} more {name} findings\n",
                    list.len() - limit
                ));
            }
        }
        out
    }
}

/// How long after `set_after + ttl` a ghost key may still be seen: the node runs
/// the queued `SET` a little after it is resumed (later on a loaded machine), and
/// the key is polled every 10 ms. A `PX` that is too long is caught exactly, by
/// the largest `PTTL` seen.
pub const GHOST_SLACK_NS: u64 = 150_000_000;

/// `ttl · drift_factor + fixed_drift`, computed as the library does.
fn drift_ns(ttl_ns: u64, meta: &Meta) -> u64 {
    duration_ns(Duration::from_nanos(ttl_ns).mul_f64(meta.drift_factor)) + meta.fixed_drift_ns
}

/// One lock's hold, rebuilt from its events.
#[derive(Debug)]
struct Hold {
    client: String,
    token: String,
    start: u64,
    /// The validity deadline: the latest one the holder observed (a guard's
    /// validity can go down: a renewal near `max_hold` shortens the keys), or
    /// the largest one a manual acquire or extend reported.
    deadline: u64,
    /// When `deadline` was observed (guards).
    observed_at: u64,
    /// A guard's loss margin: the holder is told "lost" at `deadline − margin`,
    /// and the library may release the keys from then on.
    margin: u64,
    release: Option<u64>,
    lost_at: Option<u64>,
}

impl Hold {
    fn end(&self) -> u64 {
        self.deadline
            .saturating_sub(self.margin)
            .min(self.release.unwrap_or(u64::MAX))
            .min(self.lost_at.unwrap_or(u64::MAX))
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
}

/// Runs every checker over one history.
pub fn check(events: &[Event]) -> Verdict {
    let meta = events
        .iter()
        .find_map(|e| match e {
            Event::Meta(m) => Some(m.clone()),
            _ => None,
        })
        .unwrap_or(Meta {
            scenario: "unknown".into(),
            seed: 0,
            nodes: 0,
            quorum: 0,
            drift_factor: 0.01,
            fixed_drift_ns: 2_000_000,
            node_timeout_ns: 0,
            expect_violation: false,
        });
    let mut v = Verdict {
        scenario: meta.scenario.clone(),
        expect_violation: meta.expect_violation,
        ..Verdict::default()
    };
    let mut errors: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Clock { error_ns, .. } => Some(*error_ns),
            _ => None,
        })
        .collect();
    errors.sort_unstable_by(|a, b| b.cmp(a));
    let slack = errors.iter().take(2).sum::<u64>() + 1;
    let guard_tokens: std::collections::HashSet<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Acquire {
                token,
                mode: Mode::Guard,
                ..
            } => Some(token.as_str()),
            _ => None,
        })
        .collect();

    // Token sightings on the wire, sorted by time.
    let mut sightings: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in events {
        if let Event::Sighting { token, at, .. } = e {
            sightings.entry(token.as_str()).or_default().push(*at);
        }
    }
    for list in sightings.values_mut() {
        list.sort_unstable();
    }
    let first_seen = |token: &str| sightings.get(token).and_then(|l| l.first().copied());
    let last_seen_before = |token: &str, at: u64| {
        sightings
            .get(token)
            .and_then(|l| l.iter().rev().find(|&&s| s <= at + slack).copied())
    };

    // Holds per (resource, token).
    let mut holds: BTreeMap<(String, String), Hold> = BTreeMap::new();
    let mut writes: BTreeMap<String, Vec<&Event>> = BTreeMap::new();
    let mut finals: BTreeMap<String, u64> = BTreeMap::new();
    let mut holder_writes: BTreeMap<String, Vec<&Event>> = BTreeMap::new();
    let mut shortened: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
    let mut stale_list: Vec<String> = Vec::new();
    let mut stale = |what: String| stale_list.push(what);

    for e in events {
        match e {
            Event::Acquire {
                client,
                res,
                token,
                mode,
                t0,
                t1,
                started,
                valid_until,
                ttl_ns,
                loss_margin_ns,
            } => {
                if *mode != Mode::Probe {
                    v.acquisitions += 1;
                }
                holds.insert(
                    (res.clone(), token.clone()),
                    Hold {
                        client: client.clone(),
                        token: token.clone(),
                        start: *t1,
                        deadline: *valid_until,
                        observed_at: *t1,
                        margin: loss_margin_ns.unwrap_or(0),
                        release: None,
                        lost_at: None,
                    },
                );
                let allowed = ttl_ns.saturating_sub(drift_ns(*ttl_ns, &meta));
                let tag = format!("acquire {res} by {client} token {}", short(token));
                if let Some(s) = started {
                    // Both come from the same process's Instants: exact.
                    if *s + slack < *t0 || *s > *t1 + slack {
                        stale(format!(
                            "{tag}: library start {s} outside the call [{t0}, {t1}]"
                        ));
                    }
                    if valid_until.saturating_sub(*s) > allowed {
                        stale(format!(
                            "{tag}: validity {:.1} µs after its start, above ttl − drift = {:.1} µs",
                            us(valid_until - s),
                            us(allowed)
                        ));
                    }
                }
                match (*mode, first_seen(token)) {
                    (Mode::Guard, _) => {
                        let base = last_seen_before(token, *t1).unwrap_or(*t1);
                        if *valid_until > base + allowed + slack {
                            stale(format!(
                                "{tag}: deadline {:.1} µs past the last sighting + ttl − drift",
                                us(valid_until - base - allowed)
                            ));
                        }
                    }
                    (_, Some(first)) => {
                        if let Some(s) = started
                            && *s > first + slack
                        {
                            stale(format!(
                                "{tag}: library start {:.1} µs after the token was on the wire",
                                us(s - first)
                            ));
                        }
                        if *valid_until > first + allowed + slack {
                            stale(format!(
                                "{tag}: deadline {:.1} µs past first sighting + ttl − drift",
                                us(valid_until - first - allowed)
                            ));
                        }
                    }
                    (_, None) => {}
                }
            }
            Event::AcquireFailed { .. } => v.acquire_failures += 1,
            Event::Extend {
                client,
                res,
                token,
                t0,
                t1,
                started,
                valid_until,
                ttl_ns,
                error,
            } => {
                let (Some(vu), None) = (valid_until, error) else {
                    continue;
                };
                v.extensions += 1;
                if let Some(h) = holds.get_mut(&(res.clone(), token.clone())) {
                    h.deadline = h.deadline.max(*vu);
                }
                let allowed = ttl_ns.saturating_sub(drift_ns(*ttl_ns, &meta));
                let tag = format!("extend {res} by {client} token {}", short(token));
                if let Some(s) = started {
                    if *s + slack < *t0 || *s > *t1 + slack {
                        stale(format!(
                            "{tag}: library start {s} outside the call [{t0}, {t1}]"
                        ));
                    }
                    if vu.saturating_sub(*s) > allowed {
                        stale(format!(
                            "{tag}: validity {:.1} µs after its start, above ttl − drift = {:.1} µs",
                            us(vu - s),
                            us(allowed)
                        ));
                    }
                } else {
                    stale(format!("{tag}: success without a start"));
                }
            }
            Event::Observe {
                client,
                res,
                token,
                at,
                valid_until,
                lost,
                ttl_ns,
            } => {
                if let Some(h) = holds.get_mut(&(res.clone(), token.clone())) {
                    if *lost {
                        h.lost_at = Some(h.lost_at.map_or(*at, |l| l.min(*at)));
                    } else if *at >= h.observed_at {
                        // The latest view wins: it may be lower than an earlier
                        // one (a shortening renewal near `max_hold`).
                        if *valid_until < h.deadline {
                            shortened.insert((res.as_str(), token.as_str()));
                        }
                        h.deadline = *valid_until;
                        h.observed_at = *at;
                    }
                }
                if !lost {
                    let allowed = ttl_ns.saturating_sub(drift_ns(*ttl_ns, &meta));
                    let base = last_seen_before(token, *at).unwrap_or(*at);
                    if *valid_until > base + allowed + slack {
                        stale(format!(
                            "observe {res} by {client} token {}: deadline {:.1} µs past the last sighting + ttl − drift",
                            short(token),
                            us(valid_until - base - allowed)
                        ));
                    }
                }
            }
            Event::Write { res, .. } => {
                v.writes += 1;
                writes.entry(res.clone()).or_default().push(e);
            }
            Event::HolderWrite { res, .. } => {
                v.holder_writes += 1;
                holder_writes.entry(res.clone()).or_default().push(e);
            }
            Event::Skip { .. } => v.skips += 1,
            Event::Release {
                res,
                token,
                at,
                extensions,
                ..
            } => {
                if let Some(h) = holds.get_mut(&(res.clone(), token.clone())) {
                    h.release = Some(h.release.map_or(*at, |r| r.min(*at)));
                }
                // Manual extensions are counted from their own events.
                if guard_tokens.contains(token.as_str()) {
                    v.extensions += u64::from(*extensions);
                }
            }
            Event::Fault { kind, .. } => *v.faults.entry(*kind).or_default() += 1,
            Event::Final { res, count } => {
                finals.insert(res.clone(), *count);
            }
            Event::Liveness {
                res,
                healed_at,
                acquired_at,
                bound_ns,
            } => {
                let ok = acquired_at.is_some_and(|a| a.saturating_sub(*healed_at) <= *bound_ns);
                v.liveness_ok = Some(v.liveness_ok.unwrap_or(true) && ok);
                if !ok {
                    v.liveness_details.push(format!(
                        "{res}: acquired {} after healing, bound {:.1} ms",
                        acquired_at.map_or("never".to_owned(), |a| format!(
                            "{:.1} ms",
                            us(a.saturating_sub(*healed_at)) / 1000.0
                        )),
                        us(*bound_ns) / 1000.0
                    ));
                }
            }
            Event::Ghost {
                node,
                key,
                ttl_ns,
                set_after,
                max_pttl_ms,
                last_present,
            } => {
                v.ghosts_checked += 1;
                v.ghosts_seen += u64::from(last_present.is_some());
                let ttl_ms = i64::try_from(ttl_ns / 1_000_000).unwrap_or(i64::MAX);
                // The node runs the SET a little after `set_after`; the key is
                // polled every 10 ms.
                let deadline = set_after + ttl_ns + GHOST_SLACK_NS;
                if *max_pttl_ms > ttl_ms || last_present.is_some_and(|p| p > deadline) {
                    v.ghost_violations.push(format!(
                        "node {node} key {key}: max pttl {max_pttl_ms} ms (ttl {ttl_ms} ms), last seen {}",
                        last_present.map_or("never".to_owned(), |p| format!(
                            "{:.1} ms after the SET could run",
                            us(p.saturating_sub(*set_after)) / 1000.0
                        ))
                    ));
                }
            }
            Event::Meta(_) | Event::Clock { .. } | Event::Heal { .. } | Event::Sighting { .. } => {}
        }
    }
    v.stale_validity = stale_list;
    v.shortened = shortened.len() as u64;

    // Overlap: sweep each resource's holds by start.
    let mut by_res: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for ((res, _), h) in &holds {
        by_res.entry(res.as_str()).or_default().push(h);
    }
    for (res, mut list) in by_res {
        list.sort_by_key(|h| h.start);
        let mut latest: Option<&Hold> = None;
        for h in list {
            if h.end() <= h.start {
                continue; // nothing held: the call returned after the validity ended
            }
            if let Some(prev) = latest
                && h.start < prev.end()
            {
                v.overlaps.push(format!(
                        "{res}: {} token {} held [{}, {}) and {} token {} held [{}, {}): {:.1} µs together",
                        prev.client,
                        short(&prev.token),
                        prev.start,
                        prev.end(),
                        h.client,
                        short(&h.token),
                        h.start,
                        h.end(),
                        us(prev.end().min(h.end()) - h.start)
                    ));
            }
            if latest.is_none_or(|p| h.end() > p.end()) {
                latest = Some(h);
            }
        }
    }

    // Late writes and lost updates.
    for (res, mut list) in writes {
        list.sort_by_key(|e| match e {
            Event::Write { at, .. } => *at,
            _ => 0,
        });
        let mut previous = 0;
        for e in &list {
            let Event::Write {
                client,
                token,
                at,
                read,
                wrote,
                ..
            } = e
            else {
                continue;
            };
            match holds.get(&(res.clone(), token.clone())) {
                Some(h) if *at >= h.start.saturating_sub(slack) && *at < h.end() + slack => {}
                Some(h) => v.late_writes.push(format!(
                    "{res} by {client} token {}: write at {at} outside its hold [{}, {})",
                    short(token),
                    h.start,
                    h.end()
                )),
                None => v.late_writes.push(format!(
                    "{res} by {client}: write by an unknown lock {}",
                    short(token)
                )),
            }
            if *read != previous {
                v.lost_updates += 1;
                v.lost_update_details.push(format!(
                    "{res}: {client} read {read} but the last counted write left {previous}"
                ));
            }
            previous = *wrote;
        }
        let counted = list.len() as u64;
        match finals.get(&res) {
            Some(&f) if f == counted => {}
            Some(&f) => {
                v.lost_updates += f.abs_diff(counted);
                v.lost_update_details
                    .push(format!("{res}: final count {f}, counted writes {counted}"));
            }
            None => v
                .lost_update_details
                .push(format!("{res}: no final count in the history")),
        }
    }

    check_holder_view(&mut v, &holds, holder_writes, &finals, slack);
    v
}

/// One [`Event::HolderWrite`], unpacked.
struct HolderW<'a> {
    client: &'a str,
    token: &'a str,
    read_at: u64,
    read: u64,
    check_at: u64,
    at: u64,
    wrote: u64,
    /// Stalled between the check and the write (decided by the workload, and
    /// the gap is over half the TTL).
    stalled: bool,
}

/// The holder-view checker: a write whose `is_lost()` check passed, and that
/// followed the check without a stall, must not fall inside another holder's
/// interval, must fall inside the writer's own, and must not lose an update.
/// Writes stalled between the check and the write are counted apart.
fn check_holder_view(
    v: &mut Verdict,
    holds: &BTreeMap<(String, String), Hold>,
    holder_writes: BTreeMap<String, Vec<&Event>>,
    finals: &BTreeMap<String, u64>,
    slack: u64,
) {
    for (res, list) in holder_writes {
        let mut ws: Vec<HolderW<'_>> = list
            .iter()
            .filter_map(|e| match e {
                Event::HolderWrite {
                    client,
                    token,
                    read_at,
                    read,
                    check_at,
                    at,
                    wrote,
                    stalled_after_check,
                    ttl_ns,
                    ..
                } => Some(HolderW {
                    client,
                    token,
                    read_at: *read_at,
                    read: *read,
                    check_at: *check_at,
                    at: *at,
                    wrote: *wrote,
                    stalled: *stalled_after_check && at.saturating_sub(*check_at) > ttl_ns / 2,
                }),
                _ => None,
            })
            .collect();
        ws.sort_by_key(|w| w.at);
        let others: Vec<&Hold> = holds
            .iter()
            .filter(|((r, _), _)| *r == res)
            .map(|(_, h)| h)
            .collect();
        for w in &ws {
            let inside = others
                .iter()
                .find(|h| h.token != w.token && w.at > h.start + slack && w.at + slack < h.end());
            if w.stalled {
                v.stalled_after_check += 1;
                v.stalled_overlapping += u64::from(inside.is_some());
                continue;
            }
            v.holder_checked += 1;
            if let Some(h) = inside {
                v.holder_overlaps.push(format!(
                    "{res}: {} token {} checked is_lost()=false at {} and wrote at {} ({:.1} ms later), \
                     inside {} token {} held [{}, {})",
                    w.client,
                    short(w.token),
                    w.check_at,
                    w.at,
                    us(w.at.saturating_sub(w.check_at)) / 1000.0,
                    h.client,
                    short(&h.token),
                    h.start,
                    h.end()
                ));
            }
            match holds.get(&(res.clone(), w.token.to_owned())) {
                Some(h) if w.at + slack >= h.start && w.at < h.end() + slack => {}
                Some(h) => v.late_writes.push(format!(
                    "{res} by {} token {}: holder write at {} outside its hold [{}, {}) \
                     (checked at {})",
                    w.client,
                    short(w.token),
                    w.at,
                    h.start,
                    h.end(),
                    w.check_at
                )),
                None => v.late_writes.push(format!(
                    "{res} by {}: holder write by an unknown lock {}",
                    w.client,
                    short(w.token)
                )),
            }
        }
        // The chain of values in store order. A broken link is the stall's doing
        // when the write itself was stalled after its check, or when a stalled
        // write landed between its read and its write.
        let mut previous = 0;
        for w in &ws {
            if w.read != previous {
                let excused = w.stalled
                    || ws
                        .iter()
                        .any(|s| s.stalled && s.at > w.read_at && s.at < w.at);
                if !excused {
                    v.holder_lost_updates += 1;
                    v.holder_lost_update_details.push(format!(
                        "{res}: {} token {} read {} but the last write left {previous}",
                        w.client,
                        short(w.token),
                        w.read
                    ));
                }
            }
            previous = w.wrote;
        }
        match (finals.get(&res), ws.last()) {
            (Some(&f), Some(last)) if f == last.wrote => {}
            (Some(&f), Some(last)) => {
                v.holder_lost_updates += 1;
                v.holder_lost_update_details.push(format!(
                    "{res}: final count {f}, but the last holder write left {}",
                    last.wrote
                ));
            }
            (None, _) => v
                .holder_lost_update_details
                .push(format!("{res}: no final count in the history")),
            (Some(_), None) => {}
        }
    }
}

/// Adds up verdicts for the summary line.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The seed.
    pub seed: u64,
    /// Workload acquisitions in the checked (non-control) runs.
    pub acquisitions: u64,
    /// Extensions in the checked runs.
    pub extensions: u64,
    /// Counted writes in the checked runs.
    pub writes: u64,
    /// Skipped writes in the checked runs.
    pub skips: u64,
    /// Faults per kind in the checked runs.
    pub faults: BTreeMap<FaultKind, u64>,
    /// Overlaps in the checked runs.
    pub overlaps: u64,
    /// Writes outside their hold, in the checked runs.
    pub late_writes: u64,
    /// Lost updates in the checked runs.
    pub lost_updates: u64,
    /// Overstated validities in the checked runs.
    pub stale_validity: u64,
    /// Ghost keys checked / that outlived their TTL.
    pub ghosts: (u64, u64),
    /// Holder-view writes in the checked runs.
    pub holder_writes: u64,
    /// Holder-view writes stalled between the check and the write.
    pub stalled_after_check: u64,
    /// Guard locks whose holder saw its validity shortened (`max_hold`).
    pub shortened: u64,
    /// Liveness of every run that probed it.
    pub liveness_ok: Option<bool>,
    /// Acquisitions of several resources at once (`lock_many`) in the
    /// in-process run; their keys are in `acquisitions` and `overlaps` too.
    pub multi_key_acquisitions: u64,
    /// Negative controls run / caught.
    pub controls: (u64, u64),
    /// How many client OS processes took part.
    pub processes: u64,
    /// Wall time of the whole suite.
    pub secs: f64,
}

impl Summary {
    /// Adds one history's verdict.
    pub fn add(&mut self, v: &Verdict) {
        if v.expect_violation {
            self.controls.0 += 1;
            self.controls.1 += u64::from(v.caught());
            return;
        }
        self.acquisitions += v.acquisitions;
        self.extensions += v.extensions;
        self.writes += v.writes;
        self.skips += v.skips;
        for (k, n) in &v.faults {
            *self.faults.entry(*k).or_default() += n;
        }
        self.overlaps += (v.overlaps.len() + v.holder_overlaps.len()) as u64;
        self.late_writes += v.late_writes.len() as u64;
        self.lost_updates += v.all_lost_updates();
        self.holder_writes += v.holder_writes;
        self.stalled_after_check += v.stalled_after_check;
        self.shortened += v.shortened;
        self.stale_validity += v.stale_validity.len() as u64;
        self.ghosts.0 += v.ghosts_checked;
        self.ghosts.1 += v.ghost_violations.len() as u64;
        if let Some(ok) = v.liveness_ok {
            self.liveness_ok = Some(self.liveness_ok.unwrap_or(true) && ok);
        }
    }

    /// Whether everything passed: no violation, live, every control caught.
    pub fn passed(&self) -> bool {
        self.overlaps == 0
            && self.late_writes == 0
            && self.lost_updates == 0
            && self.stale_validity == 0
            && self.ghosts.1 == 0
            && self.liveness_ok != Some(false)
            && self.controls.0 == self.controls.1
    }

    /// The one summary line.
    pub fn line(&self) -> String {
        let faults: Vec<String> = FaultKind::ALL
            .iter()
            .map(|k| format!("{}={}", k.name(), self.faults.get(k).copied().unwrap_or(0)))
            .collect();
        format!(
            "fault-suite seed={} acquisitions={} extensions={} faults[{}] overlaps={} lost_updates={} \
             stale_validity={} liveness_ok={} negative_controls_caught={}/{} late_writes={} \
             ghost_keys={}/{} writes={} skipped_writes={} holder_writes={} stalled_after_check={} \
             max_hold_shortened={} multi_key_acquisitions={} processes={} secs={:.0}",
            self.seed,
            self.acquisitions,
            self.extensions,
            faults.join(" "),
            self.overlaps,
            self.lost_updates,
            self.stale_validity,
            self.liveness_ok.map_or("n/a".to_owned(), |b| b.to_string()),
            self.controls.1,
            self.controls.0,
            self.late_writes,
            self.ghosts.1,
            self.ghosts.0,
            self.writes,
            self.skips,
            self.holder_writes,
            self.stalled_after_check,
            self.shortened,
            self.multi_key_acquisitions,
            self.processes,
            self.secs,
        )
    }
}

#[cfg(test)]
mod tests {
    //! The checkers on hand-made histories: each must fail when it should.

    use super::*;

    const MS: u64 = 1_000_000;

    fn meta() -> Event {
        Event::Meta(Meta {
            scenario: "unit".into(),
            seed: 1,
            nodes: 3,
            quorum: 2,
            drift_factor: 0.01,
            fixed_drift_ns: 2 * MS,
            node_timeout_ns: 30 * MS,
            expect_violation: false,
        })
    }

    fn acquire(client: &str, token: &str, t1: u64, valid_until: u64) -> Event {
        Event::Acquire {
            client: client.into(),
            res: "r".into(),
            token: token.into(),
            mode: Mode::Manual,
            t0: t1 - MS,
            t1,
            started: Some(t1 - MS / 2),
            valid_until,
            ttl_ns: 100 * MS,
            loss_margin_ns: None,
        }
    }

    fn write(client: &str, token: &str, at: u64, read: u64) -> Event {
        Event::Write {
            client: client.into(),
            res: "r".into(),
            token: token.into(),
            read_at: at - 1,
            at,
            read,
            wrote: read + 1,
        }
    }

    fn release(client: &str, token: &str, at: u64) -> Event {
        Event::Release {
            client: client.into(),
            res: "r".into(),
            token: token.into(),
            at,
            extensions: 0,
        }
    }

    fn fin(count: u64) -> Event {
        Event::Final {
            res: "r".into(),
            count,
        }
    }

    #[test]
    fn clean_history_passes() {
        let h = vec![
            meta(),
            acquire("a", "ta", 1000 * MS, 1090 * MS),
            write("a", "ta", 1010 * MS, 0),
            release("a", "ta", 1020 * MS),
            acquire("b", "tb", 1021 * MS, 1110 * MS),
            write("b", "tb", 1030 * MS, 1),
            release("b", "tb", 1040 * MS),
            fin(2),
        ];
        let v = check(&h);
        assert_eq!(v.safety_violations(), 0, "{}", v.describe(10));
        assert!(v.passed());
        assert_eq!((v.acquisitions, v.writes), (2, 2));
    }

    #[test]
    fn overlap_and_lost_update_are_caught() {
        let h = vec![
            meta(),
            acquire("a", "ta", 1000 * MS, 1090 * MS),
            acquire("b", "tb", 1010 * MS, 1100 * MS),
            write("a", "ta", 1020 * MS, 0),
            write("b", "tb", 1030 * MS, 0),
            release("a", "ta", 1040 * MS),
            release("b", "tb", 1050 * MS),
            fin(1),
        ];
        let v = check(&h);
        assert_eq!(v.overlaps.len(), 1, "{}", v.describe(10));
        assert!(v.lost_updates >= 1, "{}", v.describe(10));
        assert!(!v.passed());
    }

    #[test]
    fn a_hold_ends_at_its_deadline() {
        // b acquires after a's validity ended although a never released: fine.
        let h = vec![
            meta(),
            acquire("a", "ta", 1000 * MS, 1090 * MS),
            acquire("b", "tb", 1091 * MS, 1180 * MS),
            release("b", "tb", 1100 * MS),
            release("a", "ta", 1200 * MS),
        ];
        assert!(check(&h).overlaps.is_empty());
        // ...but a write after the deadline is late.
        let mut h2 = h.clone();
        h2.push(write("a", "ta", 1095 * MS, 0));
        h2.push(fin(1));
        assert_eq!(check(&h2).late_writes.len(), 1);
    }

    #[test]
    fn an_extension_moves_the_deadline() {
        let h = vec![
            meta(),
            acquire("a", "ta", 1000 * MS, 1090 * MS),
            Event::Extend {
                client: "a".into(),
                res: "r".into(),
                token: "ta".into(),
                t0: 1050 * MS,
                t1: 1051 * MS,
                started: Some(1050 * MS + 10),
                valid_until: Some(1050 * MS + 10 + 97 * MS),
                ttl_ns: 100 * MS,
                error: None,
            },
            acquire("b", "tb", 1100 * MS, 1190 * MS),
        ];
        let v = check(&h);
        assert_eq!(v.overlaps.len(), 1, "{}", v.describe(10));
        assert_eq!(v.extensions, 1);
        assert!(v.stale_validity.is_empty(), "{}", v.describe(10));
    }

    #[test]
    fn overstated_validity_is_caught() {
        // ttl 100 ms, drift 3 ms: at most 97 ms after the start.
        let start = 1000 * MS;
        let mut h = vec![
            meta(),
            Event::Acquire {
                client: "a".into(),
                res: "r".into(),
                token: "ta".into(),
                mode: Mode::Manual,
                t0: start - 10,
                t1: start + 5 * MS,
                started: Some(start),
                valid_until: start + 97 * MS + 1,
                ttl_ns: 100 * MS,
                loss_margin_ns: None,
            },
        ];
        assert_eq!(check(&h).stale_validity.len(), 1);
        // Exactly ttl − drift after the start is allowed...
        if let Event::Acquire { valid_until, .. } = &mut h[1] {
            *valid_until = start + 97 * MS;
        }
        assert!(check(&h).stale_validity.is_empty());
        // ...unless the token was on the wire before the library's start.
        h.push(Event::Sighting {
            proxy: 0,
            token: "ta".into(),
            at: start - 5,
        });
        assert_eq!(
            check(&h).stale_validity.len(),
            2,
            "{}",
            check(&h).describe(10)
        );
    }

    #[test]
    fn broken_liveness_and_ghosts_are_caught() {
        let h = vec![
            meta(),
            Event::Liveness {
                res: "r".into(),
                healed_at: 0,
                acquired_at: Some(500 * MS),
                bound_ns: 400 * MS,
            },
            Event::Ghost {
                node: 0,
                key: "k".into(),
                ttl_ns: 100 * MS,
                set_after: 0,
                max_pttl_ms: 100,
                last_present: Some(400 * MS),
            },
        ];
        let v = check(&h);
        assert_eq!(v.liveness_ok, Some(false));
        assert_eq!(v.ghost_violations.len(), 1);
    }

    fn guard_acquire(client: &str, token: &str, t1: u64, valid_until: u64) -> Event {
        Event::Acquire {
            client: client.into(),
            res: "r".into(),
            token: token.into(),
            mode: Mode::Guard,
            t0: t1 - MS,
            t1,
            started: None,
            valid_until,
            ttl_ns: 100 * MS,
            loss_margin_ns: Some(30 * MS),
        }
    }

    fn holder_write(client: &str, token: &str, check_at: u64, at: u64, read: u64) -> Event {
        Event::HolderWrite {
            client: client.into(),
            res: "r".into(),
            token: token.into(),
            read_at: check_at - 5 * MS,
            read,
            check_at,
            at,
            wrote: read + 1,
            stalled_after_check: at - check_at > 50 * MS,
            ttl_ns: 100 * MS,
        }
    }

    #[test]
    fn a_guard_hold_ends_at_its_deadline_less_the_margin() {
        // a is told "lost" at 1060 (1090 − 30) and the library may release then.
        let h = vec![
            meta(),
            guard_acquire("a", "ta", 1000 * MS, 1090 * MS),
            acquire("b", "tb", 1070 * MS, 1160 * MS),
        ];
        assert!(check(&h).overlaps.is_empty(), "{}", check(&h).describe(10));
        // A lower validity observed later (a shortening renewal) ends it sooner.
        let h = vec![
            meta(),
            guard_acquire("a", "ta", 1000 * MS, 1190 * MS),
            Event::Observe {
                client: "a".into(),
                res: "r".into(),
                token: "ta".into(),
                at: 1040 * MS,
                valid_until: 1090 * MS,
                lost: false,
                ttl_ns: 100 * MS,
            },
            acquire("b", "tb", 1070 * MS, 1160 * MS),
        ];
        let v = check(&h);
        assert!(v.overlaps.is_empty(), "{}", v.describe(10));
        assert_eq!(v.shortened, 1);
    }

    #[test]
    fn a_checked_holder_write_inside_another_hold_is_caught() {
        // a's check passed at 1095 (it did not see its loss), b holds from 1070.
        let h = vec![
            meta(),
            guard_acquire("a", "ta", 1000 * MS, 1090 * MS),
            acquire("b", "tb", 1070 * MS, 1160 * MS),
            holder_write("b", "tb", 1075 * MS, 1075 * MS + 10, 0),
            holder_write("a", "ta", 1095 * MS, 1095 * MS + 10, 0),
            release("b", "tb", 1100 * MS),
            fin(1),
        ];
        let v = check(&h);
        assert_eq!(v.holder_overlaps.len(), 1, "{}", v.describe(10));
        assert_eq!(v.holder_lost_updates, 1, "{}", v.describe(10));
        assert_eq!(v.late_writes.len(), 1, "{}", v.describe(10));
        assert!(v.caught() && !v.passed());
    }

    #[test]
    fn a_write_stalled_after_its_check_is_counted_apart() {
        // a checked at 1040, stalled 60 ms, wrote at 1100 inside b's hold: the
        // overlap and the broken link it causes (b's write) are the stall's.
        let h = vec![
            meta(),
            guard_acquire("a", "ta", 1000 * MS, 1090 * MS),
            acquire("b", "tb", 1070 * MS, 1160 * MS),
            holder_write("b", "tb", 1098 * MS, 1105 * MS, 0),
            holder_write("a", "ta", 1040 * MS, 1100 * MS, 0),
            release("b", "tb", 1110 * MS),
            fin(1),
        ];
        let v = check(&h);
        assert_eq!(v.stalled_after_check, 1);
        assert_eq!(v.stalled_overlapping, 1);
        assert!(v.holder_overlaps.is_empty(), "{}", v.describe(10));
        assert_eq!(v.holder_lost_updates, 0, "{}", v.describe(10));
        assert!(v.passed(), "{}", v.describe(10));
    }

    #[test]
    fn instants_map_onto_the_monotonic_clock() {
        let a = now_ns();
        let i = instant_ns(Instant::now());
        let b = now_ns();
        let e = calibration_error_ns();
        assert!(a <= i + e && i <= b + e, "{a} {i} {b} ±{e}");
    }

    #[test]
    fn histories_round_trip_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let h = vec![
            meta(),
            acquire("a", "ta", 1000 * MS, 1090 * MS),
            Event::Fault {
                kind: FaultKind::Clock,
                node: Some(1),
                at: 5,
                detail: "forward".into(),
            },
        ];
        write_jsonl(&path, &h).unwrap();
        assert_eq!(read_jsonl(&path).unwrap(), h);
    }
}
