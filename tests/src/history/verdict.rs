//! What the checkers found in one history, and the sum over a run's histories.

use std::collections::BTreeMap;

use super::*;

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
