//! The nemesis: a seeded random schedule of faults against a [`Rig`] of Redis
//! nodes behind [`FaultProxy`]s.
//!
//! Every choice (which fault, which node, how long) comes from one `StdRng`
//! seeded with the run's seed, which the suite prints first, so the schedule of a
//! failing run can be replayed with `REDLOCK_SEED` (timing and the library's own
//! randomness still vary). Every fault is logged as
//! [`Event::Fault`], every heal as
//! [`Event::Heal`].
//!
//! # The faults, and the model they stay in
//!
//! Redlock promises mutual exclusion while a minority of nodes is faulty, a
//! crashed node stays down longer than the largest TTL, and clocks do not jump.
//! The nemesis stays inside that model (the negative controls step out of it on
//! purpose, and must be caught):
//!
//! * **kill** `-9` a node (no persistence), restarted empty after the largest TTL
//!   plus 50–300 ms;
//! * **pause** a node with `SIGSTOP` for 0.1–3×TTL, then `SIGCONT`;
//! * **proxy** faults for 0.2–3×TTL: request latency, reply latency, blackhole,
//!   reset, refuse, hold then flush (requests, replies, or both);
//! * at most `N − quorum` nodes are faulty at once (a lengthened key counts until
//!   it expires);
//! * **clock** jumps on one node: a backward jump lengthens a lock key's PTTL to
//!   1.5–3×TTL; a forward jump expires a lock key at once (`PEXPIRE key 1`) or
//!   deletes it (`DEL`). A forward jump is only made where the holder keeps a
//!   quorum without that node: on at least `quorum + 1` fault-free nodes whose
//!   copy expires (`PEXPIRETIME`) no earlier than the freshest copy minus 1 ms.
//!   The freshest copy outlives the holder's validity by the drift (≥ 2 ms), so
//!   these copies outlive it too. Losing a key
//!   early on a holder's bare quorum is unsafe for Redlock by design; that case is
//!   the second negative control;
//! * **stall**: a holder pauses past its validity before its write — an
//!   in-process client sleeps (its next critical section), a client process is
//!   `SIGSTOP`ped for 1–2×TTL (a real GC pause, renewal task included);
//! * **holder_stall**: a holder-view client (its own OS thread, a
//!   current-thread runtime that also runs its renewal task) blocks its thread
//!   with `std::thread::sleep` for 1.2–2.5×TTL inside `with_lock`, before its
//!   `is_lost()` check (the deadline check must say "lost") or between the check
//!   and its write (no client-side check can help: counted as
//!   `stalled_after_check`). Decided here, from a second seeded stream, so the
//!   schedule of the other faults is the same as without it; taken by the
//!   clients through [`HolderStalls`];
//! * **max_hold** (the path, not this scheduler): [`Rig::start_slow_path`] puts a
//!   second proxy in front of every node, with 20–40 ms of latency each way, for
//!   guards with `max_hold < ttl` whose renewals near `max_hold` shorten the keys
//!   and answer late. Kills and pauses hit those nodes too; a killed node stays
//!   down longer than the longest TTL of any client ([`NemesisConfig::ttl_longest`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_core::Redlock;

use crate::history::{Event, FaultKind, HistoryLog, Meta, duration_ns, now_ns};
use crate::proxy::{Direction, FaultProxy};
use crate::workload::{HolderStallPlan, HolderStalls};
use crate::{Cluster, RedisNode};

/// The per-node timeout every suite client uses.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(30);
/// The drift factor every suite client uses (the library's default).
pub const DRIFT_FACTOR: f64 = 0.01;
/// The fixed drift every suite client uses (the library's default).
pub const FIXED_DRIFT: Duration = Duration::from_millis(2);

/// A Redlock over `urls` with the suite's settings.
///
/// # Panics
/// If the library refuses the settings.
pub fn redlock_for(urls: &[String]) -> Redlock {
    Redlock::builder()
        .urls(urls.iter().cloned())
        .node_timeout(NODE_TIMEOUT)
        .drift_factor(DRIFT_FACTOR)
        .fixed_drift(FIXED_DRIFT)
        .build()
        .expect("build the suite's Redlock")
}

/// The [`Meta`] event of a scenario with the suite's settings.
pub fn meta(scenario: &str, seed: u64, nodes: usize, expect_violation: bool) -> Event {
    Event::Meta(Meta {
        scenario: scenario.to_owned(),
        seed,
        nodes,
        quorum: nodes / 2 + 1,
        drift_factor: DRIFT_FACTOR,
        fixed_drift_ns: duration_ns(FIXED_DRIFT),
        node_timeout_ns: duration_ns(NODE_TIMEOUT),
        expect_violation,
    })
}

/// This process's clock calibration, as an event.
pub fn clock_event(process: &str) -> Event {
    Event::Clock {
        process: process.to_owned(),
        error_ns: crate::history::calibration_error_ns(),
    }
}

/// Redis nodes, each behind its own [`FaultProxy`].
#[derive(Debug)]
pub struct Rig {
    cluster: Cluster,
    proxies: Vec<FaultProxy>,
    /// A second, slow proxy per node ([`Rig::start_slow_path`]).
    slow: Vec<FaultProxy>,
}

impl Rig {
    /// Starts `n` nodes and a proxy in front of each; proxies report token
    /// sightings to `log`.
    ///
    /// # Panics
    /// If a node or a proxy cannot start.
    pub async fn start(n: usize, log: &HistoryLog) -> Self {
        let cluster = tokio::task::spawn_blocking(move || Cluster::start(n))
            .await
            .expect("start the cluster");
        let mut proxies = Vec::with_capacity(n);
        for (i, node) in cluster.nodes().iter().enumerate() {
            proxies.push(
                FaultProxy::start(i, node.port(), Some(log.clone()))
                    .await
                    .expect("start a proxy"),
            );
        }
        Self {
            cluster,
            proxies,
            slow: Vec::new(),
        }
    }

    /// Starts a second proxy in front of every node with a constant latency of
    /// 20–40 ms each way (20–35 ms, seeded, plus up to 5 ms of jitter), logs each
    /// as a proxy fault, and returns their URLs. The nemesis never touches them;
    /// they last as long as the rig. The sightings they report carry proxy ids
    /// `len()..2·len()`.
    ///
    /// # Panics
    /// If a proxy cannot start.
    pub async fn start_slow_path(&mut self, seed: u64, log: &HistoryLog) -> Vec<String> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x736c_6f77_7061_7468);
        let n = self.len();
        for (i, node) in self.cluster.nodes().iter().enumerate() {
            let p = FaultProxy::start(n + i, node.port(), Some(log.clone()))
                .await
                .expect("start a slow proxy");
            let jitter = Duration::from_millis(5);
            let mut lat = [Duration::ZERO; 2];
            for (d, l) in [Direction::Request, Direction::Reply]
                .into_iter()
                .zip(&mut lat)
            {
                *l = Duration::from_millis(rng.random_range(20..=35));
                p.delay(d, *l, jitter);
            }
            log.push(Event::Fault {
                kind: FaultKind::Proxy,
                node: Some(i),
                at: now_ns(),
                detail: format!(
                    "slow path for max_hold guards (second proxy, whole run): request {} ms, reply {} ms, + up to {} ms each",
                    lat[0].as_millis(),
                    lat[1].as_millis(),
                    jitter.as_millis()
                ),
            });
            self.slow.push(p);
        }
        self.slow.iter().map(FaultProxy::url).collect()
    }

    /// The proxies' URLs: what the clients connect to.
    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::url).collect()
    }

    /// Node `i` (direct access, no proxy).
    pub fn node(&self, i: usize) -> &Arc<RedisNode> {
        self.cluster.node(i)
    }

    /// The proxy in front of node `i`.
    pub fn proxy(&self, i: usize) -> &FaultProxy {
        &self.proxies[i]
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// The quorum.
    pub fn quorum(&self) -> usize {
        self.len() / 2 + 1
    }

    /// Every `(node, key)` of `keys` still present on a running node.
    pub async fn leftover_keys(&self, keys: &[String]) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for i in 0..self.len() {
            let node = Arc::clone(self.node(i));
            if !node.is_running() {
                continue;
            }
            let keys = keys.to_vec();
            let found: Vec<String> = tokio::task::spawn_blocking(move || {
                keys.into_iter()
                    .filter(|k| node.raw::<i64>(&["EXISTS", k]).unwrap_or(0) == 1)
                    .collect()
            })
            .await
            .expect("EXISTS");
            out.extend(found.into_iter().map(|k| (i, k)));
        }
        out
    }
}

/// Who a stall hits.
#[derive(Debug, Clone)]
pub enum StallTarget {
    /// No stalls.
    None,
    /// In-process clients take stall requests from this counter.
    InProcess(Arc<AtomicU32>),
    /// Client processes, `SIGSTOP`ped and `SIGCONT`ed by pid.
    Processes(Vec<u32>),
}

/// The nemesis's settings.
#[derive(Debug, Clone)]
pub struct NemesisConfig {
    /// The seed of the schedule.
    pub seed: u64,
    /// The largest TTL the clients use.
    pub ttl_max: Duration,
    /// The lock keys (the resources; no key prefix is used).
    pub keys: Vec<String>,
    /// The pause between two faults, uniform in this range.
    pub gap: (Duration, Duration),
    /// Who stalls.
    pub stall: StallTarget,
    /// The longest TTL any client uses (at least `ttl_max`): a killed node is
    /// restarted no sooner than this plus 50–300 ms.
    pub ttl_longest: Duration,
    /// Where holder stalls go ([`HolderStalls`]); `None`: no holder stalls.
    pub holder_stalls: Option<Arc<HolderStalls>>,
}

#[derive(Debug, Clone, Copy)]
enum NodeState {
    Killed { restart_at: Instant },
    Paused { resume_at: Instant },
    Proxy { heal_at: Instant },
    Lengthened { until: Instant },
}

impl NodeState {
    fn due(&self) -> Instant {
        match *self {
            NodeState::Killed { restart_at: t }
            | NodeState::Paused { resume_at: t }
            | NodeState::Proxy { heal_at: t }
            | NodeState::Lengthened { until: t } => t,
        }
    }
}

/// A key's value and PTTL, read in one step (the ghost watcher).
const READ_PTTL: &str = "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";
/// A key's value and absolute expiry in Unix ms (Redis 7). All nodes run on this
/// machine, so expiries of different nodes compare on one clock, with no
/// round-trip error.
const READ_EXPIRETIME: &str =
    "return {redis.call('GET', KEYS[1]), redis.call('PEXPIRETIME', KEYS[1])}";
/// How much older than the freshest copy a copy may be and still protect its
/// holder: less than the library's smallest drift (2 ms fixed) minus the 1 ms
/// rounding of expiry times.
const FRESH_MARGIN_MS: i64 = 1;
const CAS_PEXPIRE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
const CAS_DEL: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The fault scheduler.
#[derive(Debug)]
pub struct Nemesis<'a> {
    rig: &'a Rig,
    cfg: NemesisConfig,
    rng: StdRng,
    /// The holder stalls' own stream, so they leave the rest of the schedule
    /// as it is without them.
    holder_rng: StdRng,
    log: HistoryLog,
    state: Vec<Option<NodeState>>,
    stalled: Vec<Option<Instant>>,
}

/// A copy of a lock key on one node.
#[derive(Debug, Clone)]
struct KeyCopy {
    node: usize,
    token: String,
    /// The absolute expiry, Unix ms.
    expires_ms: i64,
}

impl<'a> Nemesis<'a> {
    /// A nemesis over `rig`, logging to `log`.
    pub fn new(rig: &'a Rig, cfg: NemesisConfig, log: HistoryLog) -> Self {
        let processes = match &cfg.stall {
            StallTarget::Processes(p) => p.len(),
            _ => 0,
        };
        Self {
            rng: StdRng::seed_from_u64(cfg.seed ^ 0x6e65_6d65_7369_7321),
            holder_rng: StdRng::seed_from_u64(cfg.seed ^ 0x686f_6c64_6572_2121),
            rig,
            cfg,
            log,
            state: vec![None; rig.len()],
            stalled: vec![None; processes],
        }
    }

    fn budget(&self) -> usize {
        self.rig.len() - self.rig.quorum()
    }

    fn faulty(&self) -> usize {
        self.state.iter().flatten().count()
    }

    fn fault(&self, kind: FaultKind, node: Option<usize>, detail: String) {
        self.log.push(Event::Fault {
            kind,
            node,
            at: now_ns(),
            detail,
        });
    }

    fn healed(&self, node: Option<usize>, detail: &str) {
        self.log.push(Event::Heal {
            node,
            at: now_ns(),
            detail: detail.to_owned(),
        });
    }

    fn scaled(&mut self, lo: f64, hi: f64) -> Duration {
        self.cfg.ttl_max.mul_f64(self.rng.random_range(lo..hi))
    }

    /// Injects faults until `until`, healing each when it is due.
    pub async fn run_until(&mut self, until: Instant) {
        let mut next = Instant::now() + self.gap();
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let due = self
                .state
                .iter()
                .flatten()
                .map(NodeState::due)
                .chain(self.stalled.iter().flatten().copied())
                .min();
            let wake = due.map_or(next, |d| d.min(next)).min(until);
            tokio::time::sleep_until(wake.into()).await;
            self.heal_due(false).await;
            if Instant::now() >= next && Instant::now() < until {
                self.step().await;
                next = Instant::now() + self.gap();
            }
        }
    }

    fn gap(&mut self) -> Duration {
        let (lo, hi) = self.cfg.gap;
        lo + Duration::from_micros(
            self.rng
                .random_range(0..=u64::try_from((hi - lo).as_micros()).unwrap_or(0)),
        )
    }

    /// Heals every fault (a killed node is restarted no earlier than its
    /// scheduled time: the restart delay is never cut short). Returns when the
    /// last fault was healed, in [`now_ns`] nanoseconds.
    pub async fn heal_all(&mut self) -> u64 {
        self.heal_due(true).await;
        for i in 0..self.rig.len() {
            self.rig.proxy(i).heal();
        }
        now_ns()
    }

    async fn heal_due(&mut self, all: bool) {
        let now = Instant::now();
        for i in 0..self.state.len() {
            let Some(s) = self.state[i] else { continue };
            if !all && s.due() > now {
                continue;
            }
            match s {
                NodeState::Killed { restart_at } => {
                    tokio::time::sleep_until(restart_at.into()).await;
                    let node = Arc::clone(self.rig.node(i));
                    tokio::task::spawn_blocking(move || node.restart())
                        .await
                        .expect("restart a node");
                    self.healed(Some(i), "restarted (empty)");
                }
                NodeState::Paused { .. } => {
                    self.rig.node(i).resume();
                    self.healed(Some(i), "SIGCONT");
                }
                NodeState::Proxy { .. } => {
                    self.rig.proxy(i).heal();
                    self.healed(Some(i), "proxy healed");
                }
                NodeState::Lengthened { .. } => {
                    self.healed(Some(i), "lengthened key expired");
                }
            }
            self.state[i] = None;
        }
        if let StallTarget::Processes(pids) = &self.cfg.stall {
            for (i, s) in self.stalled.iter_mut().enumerate() {
                if s.is_some_and(|t| all || t <= now) {
                    signal_pid(pids[i], Signal::SIGCONT);
                    *s = None;
                    self.log.push(Event::Heal {
                        node: Some(i),
                        at: now_ns(),
                        detail: "client process SIGCONT".into(),
                    });
                }
            }
        }
    }

    fn healthy_node(&mut self) -> Option<usize> {
        if self.faulty() >= self.budget() {
            return None;
        }
        let healthy: Vec<usize> = (0..self.rig.len())
            .filter(|&i| self.state[i].is_none())
            .collect();
        (!healthy.is_empty()).then(|| healthy[self.rng.random_range(0..healthy.len())])
    }

    async fn step(&mut self) {
        let roll: f64 = self.rng.random();
        let stall_possible = !matches!(self.cfg.stall, StallTarget::None);
        if roll < 0.15 {
            self.kill().await;
        } else if roll < 0.35 {
            self.pause();
        } else if roll < 0.70 {
            self.proxy_fault();
        } else if roll < 0.90 || !stall_possible {
            self.clock_jump().await;
        } else {
            self.stall();
        }
        self.holder_stall();
    }

    /// One in three steps, queues a holder stall: before or after the check
    /// with equal odds, 1.2–2.5×TTL long.
    fn holder_stall(&mut self) {
        let Some(q) = &self.cfg.holder_stalls else {
            return;
        };
        if self.holder_rng.random_bool(1.0 / 3.0) {
            let plan = HolderStallPlan {
                after_check: self.holder_rng.random_bool(0.5),
                ttl_factor: self.holder_rng.random_range(1.2..2.5),
            };
            q.push(plan);
        }
    }

    async fn kill(&mut self) {
        let Some(i) = self.healthy_node() else { return };
        let delay = self.cfg.ttl_max.max(self.cfg.ttl_longest)
            + Duration::from_millis(self.rng.random_range(50..=300));
        let node = Arc::clone(self.rig.node(i));
        tokio::task::spawn_blocking(move || node.kill())
            .await
            .expect("kill a node");
        self.state[i] = Some(NodeState::Killed {
            restart_at: Instant::now() + delay,
        });
        self.fault(
            FaultKind::Kill,
            Some(i),
            format!("kill -9, restart in {} ms", delay.as_millis()),
        );
    }

    fn pause(&mut self) {
        let Some(i) = self.healthy_node() else { return };
        let d = self.scaled(0.1, 3.0);
        self.rig.node(i).pause();
        self.state[i] = Some(NodeState::Paused {
            resume_at: Instant::now() + d,
        });
        self.fault(
            FaultKind::Pause,
            Some(i),
            format!("SIGSTOP for {} ms", d.as_millis()),
        );
    }

    fn proxy_fault(&mut self) {
        let Some(i) = self.healthy_node() else { return };
        let d = self.scaled(0.2, 3.0);
        let p = self.rig.proxy(i);
        let ms = |d: Duration| d.as_millis();
        let detail = match self.rng.random_range(0..8) {
            0 | 1 => {
                let dir = if self.rng.random_bool(0.5) {
                    Direction::Request
                } else {
                    Direction::Reply
                };
                let lat = Duration::from_millis(self.rng.random_range(5..=80));
                let jit = Duration::from_millis(self.rng.random_range(0..=20));
                p.delay(dir, lat, jit);
                format!("{dir:?} latency {} ms + jitter {} ms", ms(lat), ms(jit))
            }
            2 => {
                p.blackhole();
                "blackhole".to_owned()
            }
            3 => {
                let n = p.reset();
                self.fault(FaultKind::Proxy, Some(i), format!("reset {n} connections"));
                return;
            }
            4 => {
                p.refuse(true);
                "refuse new connections".to_owned()
            }
            5 => {
                p.hold(Direction::Request);
                "hold requests, then flush".to_owned()
            }
            6 => {
                p.hold(Direction::Reply);
                "hold replies, then flush".to_owned()
            }
            _ => {
                p.hold(Direction::Request);
                p.hold(Direction::Reply);
                "hold both ways, then flush".to_owned()
            }
        };
        self.state[i] = Some(NodeState::Proxy {
            heal_at: Instant::now() + d,
        });
        self.fault(
            FaultKind::Proxy,
            Some(i),
            format!("{detail} for {} ms", d.as_millis()),
        );
    }

    /// Reads every lock key on every running, unpaused node.
    async fn copies(&self) -> Vec<(String, Vec<KeyCopy>)> {
        let mut out = Vec::new();
        for key in &self.cfg.keys {
            let mut copies = Vec::new();
            for i in 0..self.rig.len() {
                if matches!(
                    self.state[i],
                    Some(NodeState::Killed { .. } | NodeState::Paused { .. })
                ) {
                    continue;
                }
                let node = Arc::clone(self.rig.node(i));
                let k = key.clone();
                let r: redis::RedisResult<(Option<String>, i64)> =
                    tokio::task::spawn_blocking(move || {
                        node.raw(&["EVAL", READ_EXPIRETIME, "1", &k])
                    })
                    .await
                    .expect("read a key");
                if let Ok((Some(token), expires_ms)) = r
                    && expires_ms > 0
                {
                    copies.push(KeyCopy {
                        node: i,
                        token,
                        expires_ms,
                    });
                }
            }
            out.push((key.clone(), copies));
        }
        out
    }

    async fn cas(&self, node: usize, script: &str, key: &str, token: &str, arg: &str) -> bool {
        let n = Arc::clone(self.rig.node(node));
        let args: Vec<String> = [script, "1", key, token, arg]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        tokio::task::spawn_blocking(move || {
            let mut a: Vec<&str> = vec!["EVAL"];
            a.extend(args.iter().map(String::as_str));
            n.raw::<i64>(&a).unwrap_or(0) == 1
        })
        .await
        .expect("CAS on a node")
    }

    async fn clock_jump(&mut self) {
        let forward = self.rng.random_bool(0.5);
        let copies = self.copies().await;
        if forward {
            // Candidates: (key, token, node) whose loss leaves the holder a quorum
            // of fault-free copies that outlive its validity.
            let mut candidates = Vec::new();
            for (key, list) in &copies {
                let mut tokens: Vec<&str> = list.iter().map(|c| c.token.as_str()).collect();
                tokens.sort_unstable();
                tokens.dedup();
                for t in tokens {
                    let Some(freshest) = list
                        .iter()
                        .filter(|c| c.token == t)
                        .map(|c| c.expires_ms)
                        .max()
                    else {
                        continue;
                    };
                    let protective: Vec<usize> = list
                        .iter()
                        .filter(|c| {
                            c.token == t
                                && matches!(
                                    self.state[c.node],
                                    None | Some(NodeState::Lengthened { .. })
                                )
                                && c.expires_ms + FRESH_MARGIN_MS >= freshest
                        })
                        .map(|c| c.node)
                        .collect();
                    if protective.len() > self.rig.quorum() {
                        for n in protective {
                            candidates.push((key.clone(), t.to_owned(), n));
                        }
                    }
                }
            }
            if !candidates.is_empty() {
                let (key, token, node) =
                    candidates[self.rng.random_range(0..candidates.len())].clone();
                let del = self.rng.random_bool(0.5);
                let done = if del {
                    self.cas(node, CAS_DEL, &key, &token, "").await
                } else {
                    self.cas(node, CAS_PEXPIRE, &key, &token, "1").await
                };
                if done {
                    self.fault(
                        FaultKind::Clock,
                        Some(node),
                        format!(
                            "forward jump: {} {key} (holder keeps a quorum elsewhere)",
                            if del { "DEL" } else { "PEXPIRE 1" }
                        ),
                    );
                }
                return;
            }
        }
        // Backward jump: lengthen one copy's PTTL, on a fault-free node.
        if self.faulty() >= self.budget() {
            return;
        }
        let candidates: Vec<(String, KeyCopy)> = copies
            .into_iter()
            .flat_map(|(k, list)| list.into_iter().map(move |c| (k.clone(), c)))
            .filter(|(_, c)| self.state[c.node].is_none())
            .collect();
        if candidates.is_empty() {
            return;
        }
        let (key, c) = candidates[self.rng.random_range(0..candidates.len())].clone();
        let d = self.scaled(1.5, 3.0);
        if self
            .cas(
                c.node,
                CAS_PEXPIRE,
                &key,
                &c.token,
                &d.as_millis().to_string(),
            )
            .await
        {
            self.state[c.node] = Some(NodeState::Lengthened {
                until: Instant::now() + d,
            });
            self.fault(
                FaultKind::Clock,
                Some(c.node),
                format!("backward jump: PTTL of {key} set to {} ms", d.as_millis()),
            );
        }
    }

    fn stall(&mut self) {
        match &self.cfg.stall {
            StallTarget::None => {}
            StallTarget::InProcess(pending) => {
                // Counted by the client when it stalls.
                pending.fetch_add(1, Ordering::AcqRel);
            }
            StallTarget::Processes(pids) => {
                let free: Vec<usize> = (0..pids.len())
                    .filter(|&i| self.stalled[i].is_none())
                    .collect();
                if free.is_empty() {
                    return;
                }
                let i = free[self.rng.random_range(0..free.len())];
                let pid = pids[i];
                let d = self.scaled(1.0, 2.0);
                signal_pid(pid, Signal::SIGSTOP);
                self.stalled[i] = Some(Instant::now() + d);
                self.fault(
                    FaultKind::Stall,
                    Some(i),
                    format!("SIGSTOP client process {i} for {} ms", d.as_millis()),
                );
            }
        }
    }
}

fn signal_pid(pid: u32, sig: Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(p), sig);
    }
}

/// Polls `key` on node `node` every 10 ms from now until `set_after + ttl + 300 ms`
/// and returns the [`Event::Ghost`] that says how long it lived. Values equal to
/// `ignore` (a foreign holder's) are not the ghost.
pub async fn watch_ghost(
    rig: &Rig,
    node: usize,
    key: &str,
    ttl: Duration,
    set_after: u64,
    ignore: &str,
) -> Event {
    let end = set_after + duration_ns(ttl) + 300_000_000;
    let mut max_pttl_ms = -2;
    let mut last_present = None;
    while now_ns() < end {
        let n = Arc::clone(rig.node(node));
        let k = key.to_owned();
        let r: redis::RedisResult<(Option<String>, i64)> =
            tokio::task::spawn_blocking(move || n.raw(&["EVAL", READ_PTTL, "1", &k]))
                .await
                .expect("poll a key");
        let at = now_ns();
        if let Ok((Some(v), pttl)) = r
            && v != ignore
        {
            max_pttl_ms = max_pttl_ms.max(pttl);
            last_present = Some(at);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Event::Ghost {
        node,
        key: key.to_owned(),
        ttl_ns: duration_ns(ttl),
        set_after,
        max_pttl_ms,
        last_present,
    }
}
