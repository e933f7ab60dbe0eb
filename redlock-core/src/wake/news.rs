//! What a waiter hears: each node's subscription, the releases it announced,
//! and when that is news enough to try again.

use crate::error::{NodeStatus, Report};
use crate::keys::{Heard, Named};

/// One node's part in a channel's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NodeSub {
    /// Asked for, not confirmed yet.
    Pending,
    Subscribed,
    /// No subscription on this node (no connection, or no way to make one):
    /// its releases are found by the fallback timers only.
    Down,
}

/// What a waiter watches: a counter of the subscription changes (a node's
/// subscription lost or regained), how many releases each node announced, and
/// each node's subscription.
#[derive(Debug, Clone)]
pub(super) struct Chan {
    pub(super) changes: u64,
    pub(super) released: Vec<u64>,
    pub(super) nodes: Vec<NodeSub>,
    /// Per node, how many of this handle's own releases' announcements are
    /// still to come (`Waiting::release_sent`): the next messages are
    /// taken for them.
    pub(super) expected: Vec<u64>,
    /// Per node, how many announced releases were not this handle's own
    /// (`released` less those taken for its own): never decreases, so that a
    /// releaser waiting out a hand-off window can tell another's release
    /// since a moment (`wait/handoff.rs`).
    pub(super) others: Vec<u64>,
    /// Per node, the waiter its latest announced release named
    /// (`keys::waiter_name`: the last mutex waiter to set the key's flag
    /// there), if it named one.
    pub(super) named: Vec<Heard>,
}

/// Whom the releases a waiter was woken by name (issue 48, item 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Naming {
    /// This waiter: it tries at once.
    Me,
    /// Another waiter: the named one tries first, and this one leaves it
    /// the turn.
    Other,
    /// Names are not in use (a permit's or share's release, a set's, an
    /// older client's, a native delete's).
    Legacy,
    /// Too few of the release's announcements heard yet to tell.
    Pending,
}

/// What one try of a failed attempt found (a permit's attempt tries each
/// slot), for judging when the next attempt may succeed.
#[derive(Debug, Clone, Default)]
struct Try {
    /// Per node: another holder's key was there.
    busy: Vec<bool>,
    /// How many nodes the try took (and has released since).
    taken: usize,
}

impl Try {
    fn of(r: &Report) -> Self {
        Self {
            busy: r
                .nodes
                .iter()
                .map(|n| matches!(n.status, NodeStatus::Busy { .. }))
                .collect(),
            taken: r.ok_count(),
        }
    }
}

/// What a failed attempt found: one try's report, or (a permit) each
/// slot's. The next attempt is worth making once the news may free what
/// any one of them found taken.
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    tries: Vec<Try>,
}

impl Found {
    /// From a failed attempt's report. An error without one (or with no busy
    /// node) wakes the waiter at the first release heard.
    pub(crate) fn from_report(report: Option<&Report>) -> Self {
        Self::from_reports(report)
    }

    /// As if an attempt found every one of `nodes` busy and took none: news
    /// wakes only once a quorum of them announced.
    pub(crate) fn all_busy(nodes: usize) -> Self {
        Self {
            tries: vec![Try {
                busy: vec![true; nodes],
                taken: 0,
            }],
        }
    }

    /// From the reports of every try of a failed attempt (a permit's slots):
    /// news that frees any one of them wakes the waiter.
    pub(crate) fn from_reports<'r>(reports: impl IntoIterator<Item = &'r Report>) -> Self {
        Self {
            tries: reports.into_iter().map(Try::of).collect(),
        }
    }
}

/// The waiter that goes, of the `names` a release gave on the nodes heard:
/// the one most nodes named (a name left on a node or two by a waiter that
/// holds since, or is gone, loses to the one every node's waiters wrote);
/// of several, the one that left the most turns to others (each node keeps
/// its most patient waiter's name); of several still, one picked by a mix
/// of the names. Every waiter that heard the same names picks the same
/// one, and the pick favours no waiter's id.
fn chosen(names: &[Named]) -> Option<u64> {
    let count = |id: u64| names.iter().filter(|n| n.id == id).count();
    let turns = |id: u64| {
        names
            .iter()
            .filter(|n| n.id == id)
            .map(|n| n.turns)
            .max()
            .unwrap_or(0)
    };
    let salt = names.iter().fold(0u64, |acc, n| acc ^ n.id.rotate_left(17));
    names.iter().map(|n| n.id).max_by_key(|&id| {
        (
            count(id),
            turns(id),
            std::cmp::Reverse((id ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        )
    })
}

impl Chan {
    /// A channel of `nodes` subscriptions, nothing announced yet.
    pub(super) fn new(nodes: Vec<NodeSub>) -> Self {
        let n = nodes.len();
        Self {
            changes: 0,
            released: vec![0; n],
            nodes,
            expected: vec![0; n],
            others: vec![0; n],
            named: vec![Heard::Legacy; n],
        }
    }

    /// `node` announced a release, naming the waiter `name` (if it named
    /// one): this handle's own if one is expected there, else another's.
    pub(super) fn heard(&mut self, node: usize, name: Heard) {
        if let Some(n) = self.released.get_mut(node) {
            *n = n.wrapping_add(1);
        }
        if let Some(n) = self.named.get_mut(node) {
            *n = name;
        }
        match self.expected.get_mut(node) {
            Some(e) if *e > 0 => *e -= 1,
            _ => {
                if let Some(o) = self.others.get_mut(node) {
                    *o = o.wrapping_add(1);
                }
            }
        }
    }

    /// This handle's own release was sent to `node`, which will announce it
    /// to this handle's subscription if it deletes the key.
    pub(super) fn expect(&mut self, node: usize) {
        if let Some(e) = self.expected.get_mut(node) {
            *e = e.saturating_add(1);
        }
    }

    /// This handle's own release on `node`, expected, reached none of its
    /// subscriptions (not held there, or nothing announced). If a message
    /// was taken for it meanwhile, that one was another's. Returns whether
    /// that changed what `others` says.
    pub(super) fn unexpect(&mut self, node: usize) -> bool {
        match self.expected.get_mut(node) {
            Some(e) if *e > 0 => {
                *e -= 1;
                false
            }
            Some(_) => {
                if let Some(o) = self.others.get_mut(node) {
                    *o = o.wrapping_add(1);
                }
                true
            }
            None => false,
        }
    }

    /// Whether releases by others than this handle were announced, since
    /// `since` (an earlier [`Chan::others`]), on a quorum of the nodes
    /// (or, with fewer subscribed, on every subscribed one; at least one).
    pub(super) fn others_released(&self, since: &[u64], quorum: usize) -> bool {
        let heard = self
            .others
            .iter()
            .zip(since)
            .filter(|(now, then)| now != then)
            .count();
        let listening = self
            .nodes
            .iter()
            .filter(|n| **n == NodeSub::Subscribed)
            .count();
        heard >= quorum.min(listening).max(1)
    }

    /// Whether a waiter that last looked at `seen`, and whose attempt then
    /// found `found`, should try again: a subscription changed (whatever it
    /// would have told is lost), or enough of the nodes it found busy have
    /// announced a release since that, with the nodes it took itself, they
    /// make a quorum.
    ///
    /// One node's announcement is not enough: a holder's release reaches
    /// every node, but a failed attempt's clean-up frees only the few nodes it
    /// took, and waking on those sends every waiter against a lock still held
    /// on a quorum, whose failed attempts clean up and wake the others again
    /// (measured: ten `SET`s per node per acquisition with three contending
    /// processes). With fewer busy nodes subscribed than needed, every one of
    /// them must announce; the fallback timers cover the rest.
    pub(super) fn wakes(&self, seen: &Chan, found: &Found, quorum: usize) -> bool {
        if self.changes != seen.changes {
            return true;
        }
        let heard = |i: usize| self.released.get(i) != seen.released.get(i);
        let mut busy_tries = found
            .tries
            .iter()
            .filter(|t| t.busy.contains(&true))
            .peekable();
        if busy_tries.peek().is_none() {
            return (0..self.released.len()).any(heard);
        }
        busy_tries.any(|t| self.frees(t, &heard, quorum))
    }

    /// Whom the releases announced since `seen` name, for the waiter `me`.
    /// Each node counts with the name its latest release gave, and every
    /// waiter that heard the same nodes picks the same one ([`chosen`]):
    /// the nodes' flags may name different waiters (each node keeps the
    /// last that wrote it there). `Pending` until every subscribed node (at
    /// least one) was heard, unless `partial`: waiters that had heard
    /// different nodes could pick different ones.
    pub(super) fn naming(&self, seen: &Chan, me: u64, partial: bool) -> Naming {
        let heard: Vec<usize> = (0..self.released.len())
            .filter(|&i| self.released.get(i) != seen.released.get(i))
            .collect();
        let said: Vec<Heard> = heard
            .iter()
            .filter_map(|&i| self.named.get(i).copied())
            .collect();
        let names: Vec<Named> = said
            .iter()
            .filter_map(|h| match h {
                Heard::Named(n) => Some(*n),
                _ => None,
            })
            .collect();
        let listening = self
            .nodes
            .iter()
            .filter(|n| **n == NodeSub::Subscribed)
            .count();
        if names.is_empty() {
            return if heard.is_empty() {
                Naming::Pending
            } else {
                Naming::Legacy
            };
        }
        // Every subscribed node: waiters that decided on different nodes'
        // names (each node keeps the first of equally patient waiters) could
        // each find the other named, and nobody went.
        if !partial && heard.len() < listening.max(1) {
            return Naming::Pending;
        }
        if chosen(&names) == Some(me) {
            Naming::Me
        } else {
            Naming::Other
        }
    }

    /// Whether the releases `heard` on the nodes try `found` found busy, with
    /// the nodes it took itself, may make a quorum (see [`Chan::wakes`]).
    fn frees(&self, found: &Try, heard: &impl Fn(usize) -> bool, quorum: usize) -> bool {
        let busy = |i: &usize| found.busy.get(*i) == Some(&true);
        let freed = (0..self.released.len())
            .filter(busy)
            .filter(|&i| heard(i))
            .count();
        let listening = (0..self.nodes.len())
            .filter(busy)
            .filter(|&i| self.nodes[i] == NodeSub::Subscribed)
            .count();
        freed >= quorum.saturating_sub(found.taken).min(listening).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five subscribed nodes, nothing announced yet.
    fn chan() -> Chan {
        Chan::new(vec![NodeSub::Subscribed; 5])
    }

    /// `chan` after releases announced on `nodes`.
    fn announced(chan: &Chan, nodes: &[usize]) -> Chan {
        let mut c = chan.clone();
        for &n in nodes {
            c.released[n] += 1;
        }
        c
    }

    /// What a try found: `busy` nodes held by others, `taken` by itself.
    fn try_of(busy: &[usize], taken: usize) -> Try {
        Try {
            busy: (0..5).map(|i| busy.contains(&i)).collect(),
            taken,
        }
    }

    /// What an attempt of one try found.
    fn found(busy: &[usize], taken: usize) -> Found {
        Found {
            tries: vec![try_of(busy, taken)],
        }
    }

    /// Issue 48's `ANY_SLOT` (model_wake_flag): slot 0 held on nodes {0, 1}
    /// and slot 1 on {1, 2} (of three; each try's third node had not
    /// answered when it was decided); releases on nodes 0 and 1 free slot 0
    /// on both its busy nodes, though slot 1's try alone would not wake.
    #[test]
    fn a_permit_waiter_wakes_on_news_that_frees_any_slot() {
        let seen = Chan::new(vec![NodeSub::Subscribed; 3]);
        let slot = |busy: &[usize]| Try {
            busy: (0..3).map(|i| busy.contains(&i)).collect(),
            taken: 0,
        };
        let both = Found {
            tries: vec![slot(&[0, 1]), slot(&[1, 2])],
        };
        let last_only = Found {
            tries: vec![slot(&[1, 2])],
        };
        let news = announced(&seen, &[0, 1]);
        assert!(!news.wakes(&seen, &last_only, 2));
        assert!(news.wakes(&seen, &both, 2));
        // News on node 1 alone frees neither.
        assert!(!announced(&seen, &[1]).wakes(&seen, &both, 2));
    }

    #[test]
    fn a_lock_held_on_a_quorum_wakes_its_waiters_only_once_a_quorum_is_freed() {
        let seen = chan();
        let all_busy = found(&[0, 1, 2, 3, 4], 0);
        // Another waiter's failed attempt cleans up the two nodes it took.
        assert!(!announced(&seen, &[3, 4]).wakes(&seen, &all_busy, 3));
        // The holder's release reaches the first of its three nodes.
        assert!(announced(&seen, &[3, 4, 0]).wakes(&seen, &all_busy, 3));
        assert!(!announced(&seen, &[0, 1]).wakes(&seen, &all_busy, 3));
        assert!(announced(&seen, &[0, 1, 2]).wakes(&seen, &all_busy, 3));
    }

    #[test]
    fn nodes_the_waiter_took_itself_count_towards_the_quorum() {
        let seen = chan();
        // A split vote: the waiter took two nodes (and released them).
        let split = found(&[0, 1, 2], 2);
        assert!(announced(&seen, &[2]).wakes(&seen, &split, 3));
        // Its own clean-up, heard on the nodes it took, frees nothing new.
        assert!(!announced(&seen, &[3, 4]).wakes(&seen, &split, 3));
    }

    #[test]
    fn without_busy_nodes_or_with_a_subscription_change_any_news_wakes() {
        let seen = chan();
        assert!(announced(&seen, &[4]).wakes(&seen, &Found::default(), 3));
        assert!(!seen.wakes(&seen, &Found::default(), 3));
        let mut changed = seen.clone();
        changed.changes += 1;
        assert!(changed.wakes(&seen, &found(&[0, 1, 2, 3, 4], 0), 3));
    }

    /// A releaser waiting out a hand-off window ends it at another's
    /// release heard on a quorum, not at its own release's announcements,
    /// whichever order they come in.
    #[test]
    fn own_releases_are_told_from_others() {
        let mut c = Chan::new(vec![NodeSub::Subscribed; 3]);
        for n in 0..3 {
            c.expect(n);
        }
        // Its own announcement on node 0 came before the window began, the
        // others' after.
        c.heard(0, Heard::Legacy);
        let since = c.others.clone();
        c.heard(1, Heard::Legacy);
        c.heard(2, Heard::Legacy);
        assert!(!c.others_released(&since, 2), "its own release");
        // Another's, on two nodes.
        c.heard(0, Heard::Legacy);
        assert!(!c.others_released(&since, 2));
        c.heard(1, Heard::Legacy);
        assert!(c.others_released(&since, 2));

        // Another's message first, then its own release proves to have
        // reached nobody: the message was another's after all.
        let mut c = Chan::new(vec![NodeSub::Subscribed; 3]);
        c.expect(0);
        c.expect(1);
        let since = c.others.clone();
        c.heard(0, Heard::Legacy);
        assert!(!c.others_released(&since, 2));
        assert!(c.unexpect(0));
        // Its own on node 1 (answered as heard: nothing to undo), then
        // another's there.
        c.heard(1, Heard::Legacy);
        assert!(!c.others_released(&since, 2));
        c.heard(1, Heard::Legacy);
        assert!(c.others_released(&since, 2));
        // An expectation undone before its message could come.
        let mut c = Chan::new(vec![NodeSub::Subscribed; 1]);
        c.expect(0);
        assert!(!c.unexpect(0));
        let since = c.others.clone();
        c.heard(0, Heard::Legacy);
        assert!(c.others_released(&since, 1));
        // Counters that wrapped still differ.
        let mut c = Chan::new(vec![NodeSub::Subscribed; 1]);
        c.others[0] = u64::MAX;
        let since = c.others.clone();
        c.heard(0, Heard::Legacy);
        assert!(c.others_released(&since, 2));
    }

    /// Every waiter that heard the same announcements picks the same named
    /// waiter, once every subscribed node was heard; releases that name
    /// nobody are as before names existed.
    #[test]
    fn a_release_names_the_waiter_that_tries_first() {
        let (me, other) = (7, 9);
        let named = |id| Heard::Named(Named { id, turns: 0 });
        let seen = Chan::new(vec![NodeSub::Subscribed; 3]);
        let mut c = seen.clone();
        assert_eq!(c.naming(&seen, me, false), Naming::Pending);
        c.heard(0, named(me));
        assert_eq!(
            c.naming(&seen, me, false),
            Naming::Pending,
            "one node of three"
        );
        assert_eq!(c.naming(&seen, me, true), Naming::Me);
        assert_eq!(c.naming(&seen, other, true), Naming::Other);
        c.heard(1, named(me));
        assert_eq!(
            c.naming(&seen, me, false),
            Naming::Pending,
            "two nodes of three"
        );
        // Node 2 named another: two nodes of three name `me`.
        c.heard(2, named(other));
        assert_eq!(c.naming(&seen, me, false), Naming::Me);
        assert_eq!(c.naming(&seen, other, false), Naming::Other);
        // Releases before the attempt do not count.
        assert_eq!(c.naming(&c, me, true), Naming::Pending);
        let mut legacy = seen.clone();
        for n in 0..3 {
            legacy.heard(n, Heard::Legacy);
        }
        assert_eq!(legacy.naming(&seen, me, false), Naming::Legacy);
        // With two subscriptions down, the one subscribed node decides.
        let mut down = seen.clone();
        down.nodes[2] = NodeSub::Down;
        down.nodes[1] = NodeSub::Down;
        down.heard(0, named(me));
        assert_eq!(down.naming(&seen, me, false), Naming::Me);
    }

    /// Two nodes named two waiters: exactly one of them goes, whichever
    /// order the names came in, and over many pairs each side wins about
    /// half the time (the pick favours no id).
    #[test]
    fn of_two_named_waiters_exactly_one_goes() {
        let mut low_wins = 0;
        for k in 0..1000u64 {
            let (a, b) = (
                k.wrapping_mul(0x2545_f491_4f6c_dd1d),
                k.wrapping_mul(31) + 5,
            );
            let named = |id| Heard::Named(Named { id, turns: 3 });
            let seen = Chan::new(vec![NodeSub::Subscribed; 2]);
            let mut ab = seen.clone();
            ab.heard(0, named(a));
            ab.heard(1, named(b));
            let mut ba = seen.clone();
            ba.heard(0, named(b));
            ba.heard(1, named(a));
            for c in [&ab, &ba] {
                let goes = [a, b].map(|w| c.naming(&seen, w, false) == Naming::Me);
                assert_eq!(goes.iter().filter(|g| **g).count(), 1, "{a} {b}");
            }
            if ab.naming(&seen, a.min(b), false) == Naming::Me {
                low_wins += 1;
            }
        }
        assert!((350..650).contains(&low_wins), "{low_wins} of 1000");
    }

    /// Of the names a release gave, the one most nodes gave goes, however
    /// many turns a name on fewer nodes claims (a stale name); of names as
    /// often given, the one that left the most turns.
    #[test]
    fn the_most_named_then_the_most_patient_waiter_goes() {
        let named = |id, turns| Heard::Named(Named { id, turns });
        let seen = Chan::new(vec![NodeSub::Subscribed; 3]);
        let mut c = seen.clone();
        c.heard(0, named(1, 2));
        c.heard(1, named(1, 2));
        c.heard(2, named(2, 5));
        assert_eq!(c.naming(&seen, 1, false), Naming::Me);
        assert_eq!(c.naming(&seen, 2, false), Naming::Other);
        let mut c = seen.clone();
        c.heard(0, named(1, 2));
        c.heard(1, named(2, 5));
        c.heard(2, Heard::Legacy);
        assert_eq!(c.naming(&seen, 2, false), Naming::Me);
        assert_eq!(c.naming(&seen, 1, false), Naming::Other);
    }

    #[test]
    fn with_too_few_busy_nodes_subscribed_every_one_of_them_must_announce() {
        let mut seen = chan();
        for n in [0, 1, 2] {
            seen.nodes[n] = NodeSub::Down;
        }
        let all_busy = found(&[0, 1, 2, 3, 4], 0);
        assert!(!announced(&seen, &[3]).wakes(&seen, &all_busy, 3));
        assert!(announced(&seen, &[3, 4]).wakes(&seen, &all_busy, 3));
    }
}
