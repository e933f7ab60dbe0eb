//! The nemesis: the faults it injects on nodes (pauses, kills, restarts, clock jumps, key copies) and the proxies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{Event, FaultKind, HistoryLog, now_ns};
use crate::proxy::Direction;
use crate::workload::{HolderStallPlan, HolderStalls};

#[allow(unused_imports)]
use super::*;

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
pub(super) enum NodeState {
    Killed { restart_at: Instant },
    Paused { resume_at: Instant },
    Proxy { heal_at: Instant },
    Lengthened { until: Instant },
}

impl NodeState {
    pub(super) fn due(&self) -> Instant {
        match *self {
            NodeState::Killed { restart_at: t }
            | NodeState::Paused { resume_at: t }
            | NodeState::Proxy { heal_at: t }
            | NodeState::Lengthened { until: t } => t,
        }
    }
}

/// A key's value and PTTL, read in one step (the ghost watcher).
pub(super) const READ_PTTL: &str =
    "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";
/// A key's value and absolute expiry in Unix ms (Redis 7). All nodes run on this
/// machine, so expiries of different nodes compare on one clock, with no
/// round-trip error.
pub(super) const READ_EXPIRETIME: &str =
    "return {redis.call('GET', KEYS[1]), redis.call('PEXPIRETIME', KEYS[1])}";
/// How much older than the freshest copy a copy may be and still protect its
/// holder: less than the library's smallest drift (2 ms fixed) minus the 1 ms
/// rounding of expiry times.
pub(super) const FRESH_MARGIN_MS: i64 = 1;
pub(super) const CAS_PEXPIRE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
pub(super) const CAS_DEL: &str =
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
pub(super) struct KeyCopy {
    pub(super) node: usize,
    pub(super) token: String,
    /// The absolute expiry, Unix ms.
    pub(super) expires_ms: i64,
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

    pub(super) fn budget(&self) -> usize {
        self.rig.len() - self.rig.quorum()
    }

    pub(super) fn faulty(&self) -> usize {
        self.state.iter().flatten().count()
    }

    pub(super) fn fault(&self, kind: FaultKind, node: Option<usize>, detail: String) {
        self.log.push(Event::Fault {
            kind,
            node,
            at: now_ns(),
            detail,
        });
    }

    pub(super) fn healed(&self, node: Option<usize>, detail: &str) {
        self.log.push(Event::Heal {
            node,
            at: now_ns(),
            detail: detail.to_owned(),
        });
    }

    pub(super) fn scaled(&mut self, lo: f64, hi: f64) -> Duration {
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

    pub(super) fn gap(&mut self) -> Duration {
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

    pub(super) async fn heal_due(&mut self, all: bool) {
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

    pub(super) fn healthy_node(&mut self) -> Option<usize> {
        if self.faulty() >= self.budget() {
            return None;
        }
        let healthy: Vec<usize> = (0..self.rig.len())
            .filter(|&i| self.state[i].is_none())
            .collect();
        (!healthy.is_empty()).then(|| healthy[self.rng.random_range(0..healthy.len())])
    }

    pub(super) async fn step(&mut self) {
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
    pub(super) fn holder_stall(&mut self) {
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

    pub(super) async fn kill(&mut self) {
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

    pub(super) fn pause(&mut self) {
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

    pub(super) fn proxy_fault(&mut self) {
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
    pub(super) async fn copies(&self) -> Vec<(String, Vec<KeyCopy>)> {
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

    pub(super) async fn cas(
        &self,
        node: usize,
        script: &str,
        key: &str,
        token: &str,
        arg: &str,
    ) -> bool {
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

    pub(super) async fn clock_jump(&mut self) {
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

    pub(super) fn stall(&mut self) {
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
