//! The checkers of one history (overlap, late writes, lost updates, validity,
//! liveness, ghost keys); the holder view is in `holder.rs`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::*;

/// How long after `set_after + ttl` a ghost key may still be seen: the node runs
/// the queued `SET` a little after it is resumed (later on a loaded machine), and
/// the key is polled every 10 ms. A `PX` that is too long is caught exactly, by
/// the largest `PTTL` seen.
pub const GHOST_SLACK_NS: u64 = 150_000_000;

/// `ttl · drift_factor + fixed_drift`, computed as the library does.
pub(super) fn drift_ns(ttl_ns: u64, meta: &Meta) -> u64 {
    duration_ns(Duration::from_nanos(ttl_ns).mul_f64(meta.drift_factor)) + meta.fixed_drift_ns
}

/// One lock's hold, rebuilt from its events.
#[derive(Debug)]
pub(super) struct Hold {
    pub(super) client: String,
    pub(super) token: String,
    pub(super) start: u64,
    /// The validity deadline: the latest one the holder observed (a guard's
    /// validity can go down: a renewal near `max_hold` shortens the keys), or
    /// the largest one a manual acquire or extend reported.
    pub(super) deadline: u64,
    /// When `deadline` was observed (guards).
    pub(super) observed_at: u64,
    /// A guard's loss margin: the holder is told "lost" at `deadline − margin`,
    /// and the library may release the keys from then on.
    pub(super) margin: u64,
    pub(super) release: Option<u64>,
    pub(super) lost_at: Option<u64>,
}

impl Hold {
    pub(super) fn end(&self) -> u64 {
        self.deadline
            .saturating_sub(self.margin)
            .min(self.release.unwrap_or(u64::MAX))
            .min(self.lost_at.unwrap_or(u64::MAX))
    }
}

pub(super) fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub(super) fn short(token: &str) -> &str {
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
