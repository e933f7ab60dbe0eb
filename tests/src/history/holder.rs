//! The holder-view checker.

use std::collections::BTreeMap;

use super::*;

/// One [`Event::HolderWrite`], unpacked.
pub(super) struct HolderW<'a> {
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
pub(super) fn check_holder_view(
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
