//! No advantage to the releaser (issue 48): a handle whose release woke
//! waiters of another handle (another process, as a rule) leaves them the
//! next turn.
//!
//! Without this, the releaser wins: its next attempt follows its release at
//! once, while a woken waiter first hears the release, is scheduled, and (a
//! permit's or a share's) sleeps a random part of its jitter before it
//! tries. So the release script answers how many subscribers its
//! announcement reached (`node::RELEASE_LUA`), the releaser takes away its
//! own handle's subscription on each node, and when some node still had
//! another's, it records a *hand-off window* for the resource: its retrying
//! acquires of the resource (the one retry loop, `wait/`, the local queue's
//! head included) make no attempt until the window ends,
//! or until a release by someone else is heard (the woken waiter held and
//! let go). A single attempt (`try_acquire`) is never delayed.
//!
//! The window is what a woken waiter needs to land its attempt, from the
//! moment the release was decided: one node timeout (the bound this handle
//! gives any node round: the woken waiter's round, and its wake-up's
//! delivery and scheduling, well within it on a sound machine), plus, for a
//! permit or a share, whose woken waiters first sleep a random part of their
//! jitter, the acquirer's jitter (the same policy as theirs, as a rule). At
//! most [`MAX_WINDOW`], and never past the acquire's last moment to start
//! an attempt.
//!
//! Exclusion never depends on it: the window only delays attempts, and
//! every attempt is still decided by a quorum of `SET NX` (or the scripts).
//! A woken waiter that died no longer subscribes, so no node counts it and
//! no window is recorded. One that is paused (`SIGSTOP`) still counts: the
//! releaser yields one window per release and then contends as before, so a
//! paused waiter costs the others at most one window per release.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The longest hand-off window, whatever the node timeout and the jitter:
/// a paused waiter costs the releaser at most this per release.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(10);

/// How many resources' hand-offs a handle remembers at once; past it, the
/// oldest is forgotten (its window, if any, ends early: the releaser then
/// contends as it did before hand-off windows).
const MAX_ENTRIES: usize = 1024;

/// The hand-off windows of one handle, by resource channel (the lock key's
/// tag, `slots::tagged`): when the last release that woke another handle's
/// waiters was decided.
#[derive(Default)]
pub(crate) struct HandOffs {
    decided: Mutex<HashMap<String, Instant>>,
    /// Whether a hand-off was ever recorded: until then (a handle whose
    /// releases never woke another's waiters), nothing is locked or named.
    any: AtomicBool,
}

impl HandOffs {
    fn map(&self) -> impl std::ops::DerefMut<Target = HashMap<String, Instant>> + '_ {
        self.decided.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A release of lock key `key`'s resource that woke another handle's
    /// waiters was decided at `decided`. Bounded: entries past any window
    /// are dropped, and at [`MAX_ENTRIES`] the oldest goes.
    pub(crate) fn record(&self, key: &str, decided: Instant) {
        let channel = crate::slots::tagged(key);
        let channel = &*channel;
        self.any.store(true, Ordering::Relaxed);
        let mut map = self.map();
        if !map.contains_key(channel) && map.len() >= MAX_ENTRIES {
            map.retain(|_, d| !expired(*d, decided));
            if map.len() >= MAX_ENTRIES
                && let Some(oldest) = map.iter().min_by_key(|(_, d)| **d).map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(channel.to_owned(), decided);
    }

    /// When the release of lock key `key`'s resource that woke another
    /// handle's waiters was decided, if one was within the longest window
    /// of `now` (an older one is forgotten here).
    pub(crate) fn decided(&self, key: &str, now: Instant) -> Option<Instant> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let channel: Cow<'_, str> = crate::slots::tagged(key);
        let mut map = self.map();
        let decided = *map.get(&*channel)?;
        if expired(decided, now) {
            map.remove(&*channel);
            return None;
        }
        Some(decided)
    }

    /// Whether some release of lock key `key`'s resource woke another
    /// handle's waiters within the longest window of `now`: the resource is
    /// contended across handles, and a release need not hand the local
    /// queue's turn over as it is sent (that waiter would attempt before
    /// the window).
    pub(crate) fn contended(&self, key: &str, now: Instant) -> bool {
        self.decided(key, now).is_some()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

/// Whether a hand-off decided at `decided` can hold back no attempt at
/// `now`: every window from it has ended.
fn expired(decided: Instant, now: Instant) -> bool {
    now.saturating_duration_since(decided) >= MAX_WINDOW
}

/// How long after a release that woke others (decided then) the releaser's
/// handle makes no attempt: `node_timeout`, plus `spread` for a permit or a
/// share (its woken waiters first sleep a random part of their jitter;
/// `None` for the mutex, whose woken waiters try at once). At most
/// [`MAX_WINDOW`].
pub(crate) fn window(node_timeout: Duration, spread: Option<Duration>) -> Duration {
    node_timeout
        .saturating_add(spread.unwrap_or(Duration::ZERO))
        .min(MAX_WINDOW)
}

/// The first moment an attempt may start after a hand-off decided at
/// `decided` (see [`window`]), bounded by `latest_start` (the acquire's last
/// moment to start one); `None` when that is not after `now` (no wait).
pub(crate) fn not_before(
    decided: Instant,
    window: Duration,
    now: Instant,
    latest_start: Option<Instant>,
) -> Option<Instant> {
    // `decided` is in the past: adding at most `MAX_WINDOW` to it does not
    // overflow where `now` exists; if it did, no window.
    let end = decided.checked_add(window)?;
    let end = latest_start.map_or(end, |l| end.min(l));
    (end > now).then_some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_window_is_a_node_timeout_and_the_spread_at_most_the_cap() {
        assert_eq!(window(MS * 50, None), MS * 50);
        assert_eq!(window(MS * 50, Some(MS * 100)), MS * 150);
        assert_eq!(window(Duration::MAX, None), MAX_WINDOW);
        assert_eq!(window(MS, Some(Duration::MAX)), MAX_WINDOW);
        assert_eq!(window(Duration::MAX, Some(Duration::MAX)), MAX_WINDOW);
        assert_eq!(window(Duration::ZERO, None), Duration::ZERO);
    }

    #[test]
    fn an_attempt_waits_for_the_window_but_not_past_its_last_moment() {
        let now = Instant::now();
        let decided = now;
        assert_eq!(not_before(decided, MS * 50, now, None), Some(now + MS * 50));
        // Bounded by the acquire's last moment to start an attempt.
        assert_eq!(
            not_before(decided, MS * 50, now, Some(now + MS * 10)),
            Some(now + MS * 10)
        );
        assert_eq!(not_before(decided, MS * 50, now, Some(now)), None);
        // Over already.
        assert_eq!(not_before(decided, MS * 50, now + MS * 50, None), None);
        assert_eq!(not_before(decided, Duration::ZERO, now, None), None);
        // The largest window from the largest inputs.
        let w = window(Duration::MAX, Some(Duration::MAX));
        assert_eq!(not_before(decided, w, now, None), Some(now + MAX_WINDOW));
        // A window past the end of time: none, not a panic.
        assert_eq!(not_before(decided, Duration::MAX, now, None), None);
    }

    #[test]
    fn hand_offs_are_forgotten_after_the_longest_window_and_kept_bounded() {
        let offs = HandOffs::default();
        let t0 = Instant::now();
        offs.record("{a}", t0);
        assert_eq!(offs.decided("{a}", t0 + MS), Some(t0));
        assert!(offs.contended("{a}", t0 + MAX_WINDOW - MS));
        assert!(!offs.contended("{b}", t0));
        // By resource: a permit slot's release holds back its resource's
        // acquires (the slot's key has the resource key's tag).
        offs.record("{p}:redlock-permit:1", t0);
        assert!(offs.contended("p", t0));
        assert!(offs.contended("{p}:redlock-permit:0", t0));
        assert_eq!(offs.decided("p", t0 + MAX_WINDOW), None);
        // The later release counts.
        offs.record("{a}", t0 + MS * 5);
        assert_eq!(offs.decided("{a}", t0 + MS * 6), Some(t0 + MS * 5));
        assert_eq!(offs.decided("{a}", t0 + MS * 5 + MAX_WINDOW), None);
        assert_eq!(offs.len(), 0, "an expired entry is dropped when read");

        for i in 0..MAX_ENTRIES {
            offs.record(&format!("{{k{i}}}"), t0 + MS * u32::try_from(i).unwrap());
        }
        assert_eq!(offs.len(), MAX_ENTRIES);
        // Full: the oldest goes.
        offs.record("{new}", t0 + MS * 2000);
        assert_eq!(offs.len(), MAX_ENTRIES);
        assert!(!offs.contended("{k0}", t0 + MS * 2000));
        assert!(offs.contended("{k1}", t0 + MS * 2000));
        // Full again, much later: every expired entry goes at once.
        let later = t0 + MAX_WINDOW + MS * 3000;
        offs.record("{late}", later);
        assert_eq!(offs.len(), 1);
    }
}
