//! *Layer 4, waiting (see `lib.rs`).*
//!
//! Spec step 4's "retry", one loop for every primitive
//! ([`Core::retry_loop`]): by polling, or by wake-up. A mutex waiter first
//! queues behind the other waiters of its process for the key (`queue/`);
//! at the head (or, for a set, a permit or a share, at once) it contends
//! on the nodes, and between attempts it sleeps until releases heard on the
//! nodes it found busy may have freed a quorum (`wake/`), with fallback
//! timers for what no message announces:
//!
//! - the holder's remaining PTTL from the busy answer (an expiry publishes
//!   nothing);
//! - the retry policy's delay, as a safety-net poll (pub/sub is at-most-once);
//! - a node's subscription lost or regained (its messages may be lost);
//! - a release in this process by a holder that did not queue (`try_acquire`).
//!
//! The retry policy keeps its meaning: every attempt counts against
//! `max_attempts`, and the deadline bounds the whole wait, queue included.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::{join_all, select_all};
use rand::Rng;

use crate::error::{Error, Report};
use crate::keys::Named;
use crate::protocol::acquire::Ttl;
use crate::protocol::lock::Lock;
use crate::protocol::redlock::Core;
use crate::protocol::steps::{may_retry, retry_delay};
use crate::queue::Place;
use crate::settings::RetryPolicy;
use crate::wake::{Found, Naming, Subscription};

mod many;
mod shared;

/// How a retrying acquire waits between its attempts: what the one retry
/// loop ([`Core::retry_loop`]) needs to know of its primitive.
pub(crate) struct Waits<'a> {
    /// The keys whose releases are news to this waiter: each has a release
    /// channel and a waiters flag (the mutex's key, every key of a set, a
    /// permit's or a share's resource key).
    keys: &'a [Arc<str>],
    /// The TTL one attempt asks for (a waiters flag outlives it).
    ttl: Duration,
    /// A subscribed waiter's flag goes out in its attempt's own round trip
    /// (`Call::waiting_acquire`), not by a round of its own answered first
    /// (the all-or-none and read/write scripts take none).
    inline_flag: bool,
    /// The waiter's place in its process's queue for the key (the mutex):
    /// a local release kicks it, and a won attempt keeps the turn.
    place: Option<Place<'a>>,
    /// After a wake-up, wait a random part of the policy's jitter first: a
    /// freed permit or share wakes every waiter of the resource at once, and
    /// no local queue orders them.
    spread: bool,
    /// A permit's attempt tries each slot: the reports of the last
    /// attempt's tries, filled by the attempt. The waiter wakes on news
    /// that frees any one of them, not just the one its error names.
    tries: Option<&'a Mutex<Vec<Report>>>,
    /// A mutex waiter's name (`keys::waiter_name`), which its attempts
    /// write in the waiters flag: a release names the last waiter that set
    /// it, and only that one tries at once (issue 48, item 7).
    name: Option<u64>,
}

impl<'a> Waits<'a> {
    /// A mutex of one key whose policy does not wait by wake-up (the loop
    /// polls, and these keys are never subscribed to).
    pub(crate) fn polling(keys: &'a [Arc<str>], ttl: Duration) -> Self {
        Self {
            keys,
            ttl,
            inline_flag: true,
            place: None,
            spread: false,
            tries: None,
            name: None,
        }
    }

    /// A mutex of one key, waiting in its process's queue at `place`, whose
    /// attempts write `name` in the waiters flag.
    pub(crate) fn queued(keys: &'a [Arc<str>], ttl: Duration, place: Place<'a>, name: u64) -> Self {
        Self {
            keys,
            ttl,
            inline_flag: true,
            place: Some(place),
            spread: false,
            tries: None,
            name: Some(name),
        }
    }

    /// The mutex of a set: every key's channel, the flags set before each
    /// attempt.
    pub(crate) fn set(keys: &'a [Arc<str>], ttl: Duration) -> Self {
        Self {
            keys,
            ttl,
            inline_flag: false,
            place: None,
            spread: false,
            tries: None,
            name: None,
        }
    }

    /// A permit (`inline_flag`: its slot attempt sets the flag) or a share
    /// of the resource whose key is `keys`' one.
    pub(crate) fn shared(keys: &'a [Arc<str>], ttl: Duration, inline_flag: bool) -> Self {
        Self {
            keys,
            ttl,
            inline_flag,
            place: None,
            spread: true,
            tries: None,
            name: None,
        }
    }

    /// [`Waits::shared`] for a permit whose attempts put each slot's report
    /// in `tries`.
    pub(crate) fn with_tries(self, tries: &'a Mutex<Vec<Report>>) -> Self {
        Self {
            tries: Some(tries),
            ..self
        }
    }
}

impl Core {
    /// The one retry loop (spec step 4) of every primitive: `attempt_once(n,
    /// flag)` for the n-th attempt until one wins or `retry` gives up, the
    /// last starting by `latest_start`.
    ///
    /// Between attempts it polls (the policy's delay and jitter) unless the
    /// policy retries and wake-ups are on. Then, after a failed attempt, it
    /// subscribes to the release channel of each of `waits`' keys and tries
    /// again once every node confirmed (a release between the two is not
    /// missed); from then on every attempt leaves the waiters flags first
    /// (inline as `flag`, or by a round of their own), so that a release
    /// after it announces itself, and it sleeps until releases heard on the
    /// nodes it found busy may have freed a quorum (`wake/`), a local
    /// release kicks its queue place, or a fallback timer fires (the
    /// holder's expiry, the policy's delay, the last moment for an attempt).
    /// `subscriptions`: those a queued mutex waiter made while it waited for
    /// its turn.
    pub(crate) async fn retry_loop<'a, F, Fut>(
        &'a self,
        mut waits: Waits<'a>,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        mut subscriptions: Vec<Subscription<'a>>,
        mut attempt_once: F,
    ) -> Result<Lock, Error>
    where
        F: FnMut(u32, Option<Flag>) -> Fut,
        Fut: Future<Output = Result<Lock, Error>>,
    {
        let waiting = &self.inner.waiting;
        let by_wake_up = retry.max_attempts > 1 && waiting.enabled();
        let node_timeout = self.inner.settings.node_timeout;
        // Whether the subscriptions have been waited for once: a node that
        // confirms later (or never: paused, down) wakes the waiter then.
        let mut readied = false;
        let mut attempt = 1;
        // The latest hand-off this waiter waited out: each is waited once.
        let mut handed = None;
        // How many turns this waiter has left to named others: of the
        // waiters a release names, the one that left the most goes.
        let mut turns = 0u32;
        loop {
            // A retrying acquire leaves the turn to the waiters this
            // handle's last release woke in other handles (`handoff`); a
            // single attempt is never delayed.
            if retry.max_attempts > 1 {
                readied |= self
                    .wait_hand_off(
                        &waits,
                        retry,
                        latest_start,
                        &mut subscriptions,
                        (&mut handed, &mut turns),
                    )
                    .await;
            }
            if let Some(place) = &waits.place {
                place.clear_kick();
            }
            // Whether a release from here on is sure to be heard: every node
            // that can has confirmed each subscription.
            let mut covered = !subscriptions.is_empty();
            for s in &mut subscriptions {
                s.mark_seen();
                covered &= readied || s.confirmed();
            }
            let mut flag = None;
            if !subscriptions.is_empty() {
                let ttl = flag_ttl(waits.ttl, retry, node_timeout, Instant::now(), latest_start);
                if waits.inline_flag {
                    let name = waits.name.map(|id| Named { id, turns });
                    flag = Some(Flag {
                        ttl,
                        name: name.map(Named::value),
                    });
                } else {
                    self.set_waiters_flags(waits.keys, ttl).await;
                }
            }
            let err = match attempt_once(attempt, flag).await {
                Ok(lock) => {
                    if let Some(place) = waits.place.take() {
                        place.hold(lock.shared_token(), lock.valid_until());
                    }
                    return Ok(lock);
                }
                Err(e) => e,
            };
            tracing::debug!(attempt, error = %err, "attempt failed");
            if !err.is_retryable() {
                return Err(err);
            }
            let now = Instant::now();
            if !may_retry(attempt, retry, latest_start, now) {
                return Err(err);
            }
            attempt += 1;
            if !by_wake_up {
                let wake = now.checked_add(retry_delay(retry));
                let wake = match (wake, latest_start) {
                    (Some(w), Some(l)) => Some(w.min(l)),
                    (w, l) => w.or(l),
                };
                match wake {
                    Some(wake) => tokio::time::sleep_until(wake.into()).await,
                    // A delay past the end of time: no attempt will ever follow.
                    None => return Err(err),
                }
                continue;
            }
            if !covered {
                if subscriptions.is_empty() {
                    subscriptions = waits
                        .keys
                        .iter()
                        .filter_map(|k| waiting.subscribe(k))
                        .collect();
                }
                if !subscriptions.is_empty() {
                    // Subscribed on every node (or out of patience) before
                    // the next attempt, so a release that lands between the
                    // failed attempt and the subscription is seen by that
                    // attempt. Not past the last moment for an attempt.
                    let limit = latest_start.map_or(node_timeout, |l| {
                        l.saturating_duration_since(now).min(node_timeout)
                    });
                    join_all(subscriptions.iter_mut().map(|s| s.ready(limit))).await;
                    tracing::debug!(
                        confirmed = subscriptions.iter().all(Subscription::confirmed),
                        "subscribed to the release channels"
                    );
                    readied = true;
                    continue;
                }
            }
            let Some(wake) = fallback(&err, now, retry, latest_start) else {
                // A delay past the end of time and nothing else to wait for.
                return Err(err);
            };
            let found = match waits.tries {
                Some(tries) => {
                    let tries = tries.lock().unwrap_or_else(PoisonError::into_inner);
                    if tries.is_empty() {
                        Found::from_report(err.report())
                    } else {
                        Found::from_reports(tries.iter())
                    }
                }
                None => Found::from_report(err.report()),
            };
            tracing::debug!(
                ?found,
                channels = ?subscriptions.iter().map(Subscription::describe).collect::<Vec<_>>(),
                "waiter sleeps"
            );
            let woken = {
                let released = async {
                    match subscriptions.as_mut_slice() {
                        [] => std::future::pending().await,
                        [one] => one.woken(&found).await,
                        many => {
                            select_all(many.iter_mut().map(|s| Box::pin(s.woken(&found)))).await;
                        }
                    }
                };
                let kicked = async {
                    match &waits.place {
                        Some(place) => place.kicked().await,
                        None => std::future::pending().await,
                    }
                };
                let slept = Instant::now();
                let (woken, by) = tokio::select! {
                    () = tokio::time::sleep_until(wake.into()) => (false, "its fallback timer"),
                    () = released => (true, "releases heard"),
                    () = kicked => (false, "a local release"),
                };
                tracing::debug!(by, after = ?slept.elapsed(), ?found, "waiter woken");
                woken
            };
            if !woken {
                continue;
            }
            self.take_turn(&waits, &mut subscriptions, retry, latest_start, &mut turns)
                .await;
        }
    }

    /// What a waiter woken by releases heard does before its next attempt
    /// ([`Core::decide_turn`]): nothing if it goes now, a sleep of its
    /// spread, or it leaves the turn to the waiter named ([`Core::defer_turn`]).
    async fn take_turn<'a>(
        &'a self,
        waits: &Waits<'a>,
        subscriptions: &mut [Subscription<'a>],
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        turns: &mut u32,
    ) {
        match self.decide_turn(waits, subscriptions, retry).await {
            AfterWake::Now | AfterWake::Pending => {}
            AfterWake::Spread(spread) => {
                sleep_until_at_most(Instant::now().checked_add(spread), latest_start).await;
            }
            AfterWake::Defer => {
                self.defer_turn(waits, subscriptions, retry, latest_start, turns)
                    .await;
            }
        }
    }

    /// What a waiter woken by releases heard does next ([`after_wake_up`]),
    /// once every subscribed node announced the release (whom it named),
    /// or, at most a node timeout later, with what was heard by then.
    async fn decide_turn(
        &self,
        waits: &Waits<'_>,
        subscriptions: &mut [Subscription<'_>],
        retry: &RetryPolicy,
    ) -> AfterWake {
        let decided = after_wake_up(waits, subscriptions, retry, false);
        tracing::debug!(
            ?decided,
            me = ?waits.name,
            channels = ?subscriptions.iter().map(Subscription::describe).collect::<Vec<_>>(),
            "woken waiter's turn"
        );
        let (AfterWake::Pending, [sub]) = (decided, &mut *subscriptions) else {
            return decided;
        };
        let until = Instant::now().checked_add(self.inner.settings.node_timeout);
        loop {
            let more = changed_before(sub, until).await;
            let decided = after_wake_up(waits, std::slice::from_ref(sub), retry, !more);
            if decided != AfterWake::Pending {
                return decided;
            }
        }
    }

    /// Leaves the turn to the waiter a release named ([`AfterWake::Defer`]),
    /// for a mutex waiter (one key): says this one still waits, its name on
    /// the flags for the next release to name it, and listens on. Returns
    /// when a release names it (true: its attempt then leaves its name out)
    /// or nobody, when a subscription changed, or when a poll delay of its
    /// policy passed with no release heard on a quorum (the named one gone,
    /// paused, or holding long: false). The poll starts anew at each release
    /// that names another, so while the turns pass from one named waiter to
    /// the next, the waiters that defer make no attempt to race them.
    ///
    /// The name goes on each node once the release has been heard there: a
    /// flag written on a node before the release ran there is deleted by it
    /// (and named this waiter on that node alone), so that the next release
    /// found different names on different nodes and nobody went.
    async fn defer_turn<'a>(
        &'a self,
        waits: &Waits<'a>,
        subscriptions: &mut [Subscription<'a>],
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        turns: &mut u32,
    ) {
        let ([sub], Some(id), Some(key)) = (subscriptions, waits.name, waits.keys.first()) else {
            return;
        };
        *turns = turns.saturating_add(1);
        let node_timeout = self.inner.settings.node_timeout;
        let found = Found::all_busy(self.inner.nodes.len());
        let poll_from = |now: Instant| {
            [now.checked_add(retry_delay(retry)), latest_start]
                .into_iter()
                .flatten()
                .min()
        };
        let mut poll = poll_from(Instant::now());
        let nodes = self.inner.nodes.len();
        // The release deferred to, reaching the nodes one by one: the nodes
        // it has not reached yet (whose announcement is that release's,
        // not news), until a node timeout after it was heard.
        let mut late = vec![true; nodes];
        let mut late_until = Instant::now().checked_add(node_timeout);
        let mut first = true;
        loop {
            let Some(fresh) = sub.fresh_nodes() else {
                return;
            };
            let now = Instant::now();
            let in_time = late_until.is_none_or(|t| now < t);
            let (reached, news): (Vec<usize>, Vec<usize>) = fresh
                .into_iter()
                .partition(|&i| first || (in_time && late.get(i) == Some(&true)));
            first = false;
            if !reached.is_empty() {
                sub.mark_nodes_seen(&reached);
                for &i in &reached {
                    if let Some(l) = late.get_mut(i) {
                        *l = false;
                    }
                }
                // Answered before this waiter goes on: its own attempt must
                // not overtake its name, which would then stay on a node
                // after it holds.
                let ttl = flag_ttl(waits.ttl, retry, node_timeout, now, latest_start);
                let named = Named { id, turns: *turns };
                self.set_defer_flags(key, ttl, named, reached).await;
            }
            if !news.is_empty() && sub.wakes_now(&found) {
                match self
                    .decide_turn(waits, std::slice::from_mut(sub), retry)
                    .await
                {
                    AfterWake::Defer => {
                        tracing::debug!("another waiter named again: its turn");
                        *turns = turns.saturating_add(1);
                        let now = Instant::now();
                        poll = poll_from(now);
                        late = vec![true; nodes];
                        late_until = now.checked_add(node_timeout);
                        first = true;
                        continue;
                    }
                    AfterWake::Now | AfterWake::Pending => return,
                    AfterWake::Spread(spread) => {
                        sleep_until_at_most(Instant::now().checked_add(spread), latest_start).await;
                        return;
                    }
                }
            }
            let heard = changed_before(sub, poll).await;
            if !heard {
                tracing::debug!("deferring waiter's poll");
                return;
            }
        }
    }

    /// Waits out the hand-off window of `waits`' keys, if this handle's
    /// last release of one of them woke another handle's waiters (see
    /// `handoff`): until the window ends (not past `latest_start`), or,
    /// waiting by wake-up, until a release by another than this handle is
    /// heard (the woken waiter held and let go: its turn is over). To hear
    /// it, the waiter subscribes (if it had not) and leaves the waiters
    /// flags first. A release by another that ends the window woke the
    /// others too: this waiter then does what they do
    /// ([`after_wake_up`]). Returns whether it made and readied
    /// `subscriptions`, and whether a release named it (see
    /// [`Core::defer_turn`]). `handed`: when the hand-off it last waited out was decided (a
    /// hand-off is waited out once: not again after another's release
    /// ended it early); updated.
    async fn wait_hand_off<'a>(
        &'a self,
        waits: &Waits<'a>,
        retry: &RetryPolicy,
        latest_start: Option<Instant>,
        subscriptions: &mut Vec<Subscription<'a>>,
        (handed, turns): (&mut Option<Instant>, &mut u32),
    ) -> bool {
        let waiting = &self.inner.waiting;
        let node_timeout = self.inner.settings.node_timeout;
        let now = Instant::now();
        let window =
            crate::wake::handoff::window(node_timeout, waits.spread.then_some(retry.jitter));
        let decided = waits
            .keys
            .iter()
            .filter_map(|k| waiting.handoffs.decided(k, now))
            .filter(|d| handed.is_none_or(|h| *d > h))
            .max();
        let Some((decided, until)) = decided.and_then(|d| {
            crate::wake::handoff::not_before(d, window, now, latest_start).map(|until| (d, until))
        }) else {
            return false;
        };
        *handed = Some(decided);
        tracing::debug!(
            wait = ?until.saturating_duration_since(now),
            "hand-off window: the turn is left to the waiters this handle's release woke"
        );
        let sleep = tokio::time::sleep_until(until.into());
        if !waiting.enabled() {
            sleep.await;
            return false;
        }
        let mut readied = false;
        if subscriptions.is_empty() {
            subscriptions.extend(waits.keys.iter().filter_map(|k| waiting.subscribe(k)));
            let limit = until.saturating_duration_since(now).min(node_timeout);
            join_all(subscriptions.iter_mut().map(|s| s.ready(limit))).await;
            readied = !subscriptions.is_empty();
        }
        if subscriptions.is_empty() {
            sleep.await;
            return false;
        }
        let since: Vec<Vec<u64>> = subscriptions.iter().map(Subscription::others).collect();
        let flag = flag_ttl(waits.ttl, retry, node_timeout, Instant::now(), latest_start);
        self.set_waiters_flags(waits.keys, flag).await;
        let by_release = {
            let others = select_all(
                subscriptions
                    .iter_mut()
                    .zip(&since)
                    .map(|(s, since)| Box::pin(s.others_released(since))),
            );
            tokio::select! {
                () = sleep => false,
                _ = others => true,
            }
        };
        tracing::debug!(by_release, "hand-off window over");
        // The release that ended the window woke the other waiters too (and
        // may have named one of them): this one is woken like them, and
        // leaves the named one its head start. Trying at once, it raced the
        // named waiter and split the votes at a bare quorum (issue 48, item 7).
        if by_release {
            self.take_turn(waits, subscriptions, retry, latest_start, turns)
                .await;
        }
        readied
    }

    /// The mutex's retrying acquire of `key` (`Core::lock_with_retained`).
    /// With wake-ups on and a policy that retries, it first queues behind
    /// the other waiters of its process for the key (`queue/`); at the head
    /// it takes the one retry loop. `latest_start` is when the last attempt
    /// must start by (the deadline less one acquire round, the fence round
    /// of a fencing lock, and one release round).
    pub(crate) async fn wait_mutex(
        &self,
        resource: &Arc<str>,
        key: &Arc<str>,
        ttl: Ttl,
        retry: &RetryPolicy,
        begin: Instant,
        latest_start: Option<Instant>,
    ) -> Result<Lock, Error> {
        let keys = [Arc::clone(key)];
        let waiting = &self.inner.waiting;
        if retry.max_attempts <= 1 || !waiting.enabled() {
            let attempt = |n, flag: Option<Flag>| {
                self.attempt_flagged(resource, key, ttl, n, flag.map(|f| (f.ttl, None)))
            };
            return self
                .retry_loop(
                    Waits::polling(&keys, ttl.key),
                    retry,
                    latest_start,
                    Vec::new(),
                    attempt,
                )
                .await;
        }
        let place = Place::join(&waiting.queues, key);
        // An attempts-only policy gets, in the queue, the time its attempts
        // would have taken by polling.
        let turn_by = latest_start.or_else(|| begin.checked_add(turn_budget(retry)));
        let mut subscriptions = Vec::new();
        if place.turn().now_or_never().is_none() {
            // Behind other local waiters: the key is contended, so subscribe
            // now, and the subscription is ready when the turn comes. Every
            // queued waiter holds it, so it lives from one local holder to
            // the next instead of being dropped and made again at each turn.
            subscriptions.extend(waiting.subscribe(key));
            if !wait_turn(&place, turn_by, retry).await {
                drop((subscriptions, place));
                // Out of time behind other local waiters: one attempt of its
                // own, so that the error says who holds the lock and for how
                // long.
                return self.attempt(resource, key, ttl, 1).await;
            }
        }
        let name = rand::random::<u64>();
        let attempt = |n, flag: Option<Flag>| async move {
            let flag = flag.as_ref().map(|f| (f.ttl, f.name.as_deref()));
            self.attempt_flagged(resource, key, ttl, n, flag).await
        };
        let waits = Waits::queued(&keys, ttl.key, place, name);
        self.retry_loop(waits, retry, latest_start, subscriptions, attempt)
            .await
    }
}

/// What a waiter's attempt sets on each node before it asks: the waiters
/// flag for `ttl`, and `name` in it if it makes it (a mutex waiter's, see
/// [`Waits::name`]).
#[derive(Debug, Clone)]
pub(crate) struct Flag {
    pub(crate) ttl: Duration,
    pub(crate) name: Option<String>,
}

/// What a waiter woken by releases heard does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterWake {
    /// Tries at once.
    Now,
    /// Sleeps this long, then tries.
    Spread(Duration),
    /// Leaves the turn to the waiter the releases named: listens for the
    /// next release, and tries after a poll delay if none comes first
    /// (`Core::defer_turn`).
    Defer,
    /// Too few of the release's announcements heard to tell whom it named
    /// (`Core::decide_turn` waits for more).
    Pending,
}

/// What a waiter woken by releases heard does next (issue 48, item 7: at a
/// bare quorum, waiters that all tried on the same release split the votes):
///
/// - a mutex waiter the releases named (`Core::decide_turn`) tries at once: the lock
///   is handed to it, and no other woken waiter races it;
/// - a mutex waiter that another was named before leaves it the turn
///   ([`AfterWake::Defer`]): it waits for the next release, or a poll delay
///   of its policy, so a named waiter that is dead or paused costs the
///   others one poll delay at most;
/// - a permit's or share's waiter (which no release names) sleeps a random
///   part of the jitter, since every waiter was woken at once;
/// - a mutex waiter woken by releases that name nobody (no mutex waiter
///   wrote the flag, a set's release, an older client's, a native
///   delete's) tries at once, as before names; so does any waiter whose
///   policy has no jitter.
fn after_wake_up(
    waits: &Waits<'_>,
    subscriptions: &[Subscription<'_>],
    retry: &RetryPolicy,
    partial: bool,
) -> AfterWake {
    let naming = waits.name.map_or(Naming::Legacy, |me| {
        let each = subscriptions.iter().map(|s| s.naming(me, partial));
        each.fold(Naming::Legacy, |all, one| match (all, one) {
            (Naming::Me, _) | (_, Naming::Me) => Naming::Me,
            (Naming::Other, _) | (_, Naming::Other) => Naming::Other,
            (Naming::Pending, _) | (_, Naming::Pending) => Naming::Pending,
            _ => Naming::Legacy,
        })
    });
    let jitter = retry.jitter;
    let spread = || rand::rng().random_range(Duration::ZERO..=jitter);
    match naming {
        Naming::Me => AfterWake::Now,
        _ if jitter.is_zero() => AfterWake::Now,
        Naming::Pending if partial => AfterWake::Spread(spread()),
        Naming::Pending => AfterWake::Pending,
        Naming::Other => AfterWake::Defer,
        Naming::Legacy if waits.spread => AfterWake::Spread(spread()),
        Naming::Legacy => AfterWake::Now,
    }
}

/// Whether `sub`'s channel changed before `until` (false once `until`
/// passed; without `until`, it waits for the change).
async fn changed_before(sub: &mut Subscription<'_>, until: Option<Instant>) -> bool {
    let timer = async {
        match until {
            Some(t) => tokio::time::sleep_until(t.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = timer => false,
        () = sub.changed() => true,
    }
}

/// Sleeps until `until`, but not past `latest_start`; not at all without
/// `until` (past the end of time).
async fn sleep_until_at_most(until: Option<Instant>, latest_start: Option<Instant>) {
    if let Some(until) = until {
        let until = latest_start.map_or(until, |l| until.min(l));
        tokio::time::sleep_until(until.into()).await;
    }
}

/// When a waiter whose attempt failed with `err` at `now` tries again if no
/// release wakes it first: the safety-net poll, the holder's expiry (an expiry
/// publishes nothing), or the last moment for an attempt. `None` if none of
/// them is within the end of time.
pub(crate) fn fallback(
    err: &Error,
    now: Instant,
    retry: &RetryPolicy,
    latest_start: Option<Instant>,
) -> Option<Instant> {
    let poll = now.checked_add(retry_delay(retry));
    // Keys live whole milliseconds; one more and the key is gone.
    let expiry = match err {
        Error::Busy {
            retry_after: Some(d),
            ..
        } => now.checked_add(d.saturating_add(Duration::from_millis(1))),
        _ => None,
    };
    [poll, expiry, latest_start].into_iter().flatten().min()
}

/// How long a waiter's flag lives from an attempt at `now`: as long as the
/// waiter may still wait (until `latest_start`, its last attempt, or without
/// a deadline every delay of its policy at its longest), and at least its
/// longest poll delay, plus a TTL, a few node timeouts and a second; at most
/// a day. Not just until its next attempt: an attempt that does not reach a
/// node (down, timed out) does not set the flag there again, and a release
/// there must still announce itself to this waiter. A flag left by a waiter
/// that gave up costs the next release one `PUBLISH`.
pub(crate) fn flag_ttl(
    ttl: Duration,
    retry: &RetryPolicy,
    node_timeout: Duration,
    now: Instant,
    latest_start: Option<Instant>,
) -> Duration {
    const MAX_FLAG_TTL: Duration = Duration::from_secs(24 * 60 * 60);
    let wait = match latest_start {
        Some(last) => last.saturating_duration_since(now),
        None => turn_budget(retry),
    };
    wait.max(retry.delay.saturating_add(retry.jitter))
        .saturating_add(ttl)
        .saturating_add(node_timeout.saturating_mul(3))
        .saturating_add(Duration::from_secs(1))
        .min(MAX_FLAG_TTL)
}

/// The time an attempts-only policy would have spent polling: every delay at
/// its longest.
fn turn_budget(retry: &RetryPolicy) -> Duration {
    retry
        .delay
        .saturating_add(retry.jitter)
        .saturating_mul(retry.max_attempts.saturating_sub(1))
}

/// Waits for the waiter's turn until `by`. Returns whether it got it. A local
/// holder that keeps its turn past its validity without releasing loses it
/// here, so a lost release can delay the queue by one validity at most.
async fn wait_turn(place: &Place<'_>, by: Option<Instant>, retry: &RetryPolicy) -> bool {
    loop {
        let holder = place.holder();
        // The holder may change while this waiter sleeps without a wake-up
        // for it (the turn went to another waiter that then took the lock):
        // look again now and then. No network in this loop.
        let recheck = Instant::now().checked_add(
            retry_delay(retry).clamp(Duration::from_millis(10), Duration::from_secs(1)),
        );
        let timer = [holder.as_ref().map(|h| h.1), by, recheck]
            .into_iter()
            .flatten()
            .min();
        let sleep = async {
            match timer {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = place.turn() => return true,
            () = sleep => {}
        }
        let now = Instant::now();
        if let Some((token, until)) = holder
            && now >= until
        {
            place.expire(&token);
        }
        if by.is_some_and(|by| now >= by) {
            // One last look: the turn may have come with the deadline.
            return place.turn().now_or_never().is_some();
        }
    }
}

#[cfg(all(test, not(redlock_loom)))]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// The flag outlives the whole wait, not just the next poll: a deadline
    /// 30 s away keeps it past 30 s even with a 1 s delay.
    #[test]
    fn a_flag_lives_as_long_as_its_waiter_may_wait() {
        let now = Instant::now();
        let retry = RetryPolicy::deadline(S * 30).with_delay(S);
        let ttl = flag_ttl(S * 5, &retry, S / 10, now, Some(now + S * 29));
        assert!(ttl >= S * 29 + S * 5, "{ttl:?}");
        // Past the last attempt: the poll delay and the TTL remain.
        let ttl = flag_ttl(S * 5, &retry, S / 10, now + S * 40, Some(now + S * 29));
        assert!(ttl >= S * 5 && ttl < S * 29, "{ttl:?}");
        // Without a deadline: every delay of its attempts.
        let retry = RetryPolicy::attempts(11).with_delay(S);
        let ttl = flag_ttl(S, &retry, S / 10, now, None);
        assert!(ttl >= S * 10, "{ttl:?}");
        // Nothing past a day, whatever the inputs.
        let retry = RetryPolicy::deadline(Duration::MAX).with_delay(Duration::MAX);
        let ttl = flag_ttl(Duration::MAX, &retry, Duration::MAX, now, None);
        assert_eq!(ttl, S * 24 * 60 * 60);
    }
}
