//! Auto-extension of one lock behind a [`LockGuard`](crate::LockGuard):
//! when to renew it, against the holder's deadline, to what TTL, and the loss
//! it reports. `schedule.rs` runs the renewals of a handle's locks in batches.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::guard::handle::Shared;
use crate::protocol::lock::Lock;
use crate::settings::LockOptions;

/// Fires `lost` when a lock's renewals end any way but a normal release: a
/// panic unwinds through the schedule, a runtime shutdown drops it.
pub(super) struct LostOnExit {
    pub(super) lost: CancellationToken,
    pub(super) armed: bool,
}

impl Drop for LostOnExit {
    fn drop(&mut self) {
        if self.armed {
            self.lost.cancel();
        }
    }
}

/// How often a failing renewal is retried: a tenth of the last validity, but not
/// more often than every 10 ms.
fn renewal_retry_step(granted: Duration) -> Duration {
    (granted / 10).max(Duration::from_millis(10))
}

/// When to renew: once 40–60% of the time the holder was last granted is left
/// before `valid_until` (the holder's deadline), at a random
/// point in that band, rounded down to a grid of 1/400 of the validity.
///
/// Locks taken together (a burst of requests, a batch job) would otherwise renew
/// together forever, each renewal one burst of concurrent calls to every node,
/// whose peak memory stays with the process. The jitter spreads them out; the
/// grid makes the renewals that fall close together fire in the same timer tick,
/// so they still share the node connections' writes and reads.
fn renew_point(valid_until: Instant, granted: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let left = granted.mul_f64(rand::rng().random_range(0.4..=0.6));
    let at = valid_until.checked_sub(left).unwrap_or(valid_until);
    let epoch = *EPOCH.get_or_init(Instant::now);
    let grid = (granted / 400).max(Duration::from_millis(1)).as_nanos();
    let since = at.saturating_duration_since(epoch).as_nanos();
    let snapped = u64::try_from(since - since % grid).unwrap_or(u64::MAX);
    epoch
        .checked_add(Duration::from_nanos(snapped))
        .map_or(at, |s| s.min(at))
}

/// What a lock's renewal does when its time comes.
pub(super) enum Due {
    /// Renew the keys to this TTL now.
    Renew(Duration),
    /// Nothing to send (the cap was reached): wait for `renew_at`.
    Wait,
    /// The lock is lost: release it.
    Lost,
}

/// One auto-extended lock's renewal state: when to renew it, to what TTL, and
/// what each outcome means for its holder. The schedule
/// (`guard/schedule.rs`) runs it, batched with the handle's other locks. It
/// owns the [`Lock`], so a release always comes after the last renewal.
pub(super) struct Renewal {
    pub(super) lock: Lock,
    pub(super) shared: Arc<Shared>,
    ttl: Duration,
    /// `Duration::MAX` (or any cap past the end of time) means no cap.
    hold_until: Option<Instant>,
    /// A renewal shorter than this would be refused (`InvalidTtl`), or could
    /// not complete within its own validity: stop renewing instead.
    min_ttl: Duration,
    /// The validity the last renewal left, for the next renewal point.
    granted: Duration,
    /// When to renew next.
    pub(super) renew_at: Instant,
    /// The deadline the renewal in flight must beat.
    deadline: Instant,
    /// Why the renewals stopped, for the loss's cause in the metrics: the cap
    /// (`max_hold`, the extension limit) or a failing renewal.
    stopped_by: &'static str,
    /// The cause of a loss the renewal itself found.
    loss: Option<&'static str>,
    exit: LostOnExit,
}

impl Renewal {
    pub(super) fn new(
        lock: Lock,
        shared: Arc<Shared>,
        options: &LockOptions,
        exit: LostOnExit,
    ) -> Self {
        let redlock = lock.redlock();
        let hold_until = shared.hold_until;
        let min_ttl = redlock
            .min_ttl()
            .max(redlock.node_timeout().saturating_mul(2));
        // Renewals are scheduled against the holder's deadline (validity less the
        // margin), not the keys' expiry: a renewal confirmed after the holder was
        // told "lost" is of no use, so with a margin close to the TTL they come
        // early enough to land before it.
        let deadline = shared.deadline();
        let granted = deadline.saturating_duration_since(Instant::now());
        Self {
            lock,
            shared,
            ttl: options.ttl,
            hold_until,
            min_ttl,
            granted,
            renew_at: renew_point(deadline, granted),
            deadline,
            stopped_by: "expired",
            loss: None,
            exit,
        }
    }

    /// How much earlier than `renew_at` this lock may be renewed to fill a
    /// batch that goes out anyway: a tenth of its last validity, so it is
    /// renewed with 40–70% of it left.
    pub(super) fn slack(&self) -> Duration {
        self.granted / 10
    }

    /// The renewal's time came (`renew_at`, or within [`Renewal::slack`]
    /// before it, to fill a batch): checks the lock is still held and picks the TTL. A renewal
    /// that shortens the keys (the `max_hold` cap) lowers the holder's
    /// validity here, before it is sent: a schedule starved between the send
    /// and the reply cannot leave the holder counting on the old one.
    pub(super) fn due(&mut self) -> Due {
        let now = Instant::now();
        if self.held_to_the_cap(now) || self.shared.is_lost() || now >= self.lock.valid_until() {
            // Past the cap the holder has been told (the cap bounds its
            // deadline), and the keys go now rather than at the end of their
            // TTL.
            let cause = if self.held_to_the_cap(now) {
                "max_hold"
            } else {
                self.stopped_by
            };
            if cause == "max_hold" {
                tracing::debug!(
                    resource = self.lock.resource(),
                    "max_hold reached: releasing"
                );
            } else {
                tracing::warn!(
                    resource = self.lock.resource(),
                    "lock validity ran out before a renewal succeeded"
                );
            }
            self.lose(cause);
            return Due::Lost;
        }
        let ttl = match self.hold_until {
            None => self.ttl,
            Some(until) => {
                let left = until.saturating_duration_since(now);
                if left < self.min_ttl {
                    // max_hold reached: stop renewing; the holder is told when the
                    // validity it has runs out.
                    self.stopped_by = "max_hold";
                    self.renew_at = self.shared.deadline();
                    return Due::Wait;
                }
                self.ttl.min(left)
            }
        };
        let redlock = self.lock.redlock();
        self.shared.lower_valid_until(redlock.extend_cap(ttl, now));
        // The extend may not outlast the holder's deadline: a renewal confirmed
        // after the holder was told "lost" would be no use to it.
        self.deadline = self.shared.deadline();
        Due::Renew(ttl)
    }

    /// The holder's deadline the renewal sent at [`Renewal::due`] must beat.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The renewal sent at [`Renewal::due`] was decided at `decided` with
    /// `outcome`. Returns whether the lock is still held.
    pub(super) fn settled(&mut self, decided: Instant, outcome: Result<(), Error>) -> bool {
        // A shortening extend lowers the lock's validity before it is sent, and
        // keeps it lowered whatever the outcome: publish it either way.
        self.shared.set_valid_until(self.lock.valid_until());
        if decided >= self.deadline {
            if self.held_to_the_cap(decided) {
                self.lose("max_hold");
                return false;
            }
            tracing::warn!(
                resource = self.lock.resource(),
                "lock validity ran out during a renewal"
            );
            self.lose("renewal_failed");
            return false;
        }
        let deadline = self.shared.deadline();
        match outcome {
            Ok(()) => {
                self.shared
                    .extensions
                    .store(self.lock.extensions(), Ordering::Relaxed);
                self.granted = deadline.saturating_duration_since(Instant::now());
                self.renew_at = renew_point(deadline, self.granted);
            }
            Err(e @ (Error::NoQuorum { .. } | Error::Expired { .. }))
                if Instant::now() < deadline =>
            {
                tracing::debug!(resource = self.lock.resource(), error = %e, "renewal failed, retrying");
                self.stopped_by = "renewal_failed";
                self.renew_at = Instant::now()
                    .checked_add(renewal_retry_step(self.granted))
                    .map_or(deadline, |t| t.min(deadline));
            }
            Err(e @ (Error::ExtensionLimit { .. } | Error::InvalidTtl { .. })) => {
                tracing::debug!(resource = self.lock.resource(), error = %e, "no more renewals");
                self.stopped_by = "max_hold";
                self.renew_at = deadline;
            }
            Err(e) => {
                tracing::warn!(resource = self.lock.resource(), error = %e, "lock lost");
                self.lose(match e {
                    Error::NotHeld { .. } => "refused",
                    _ => "renewal_failed",
                });
                return false;
            }
        }
        true
    }

    /// Whether the hold cap (`max_hold`) has been reached at `at`.
    fn held_to_the_cap(&self, at: Instant) -> bool {
        self.hold_until.is_some_and(|cap| at >= cap)
    }

    fn lose(&mut self, cause: &'static str) {
        self.loss = Some(cause);
        self.shared.lost.cancel();
    }

    /// The renewals end (a loss, a release, a drop): counts a loss in the
    /// metrics and hands the lock over for its release.
    pub(super) fn finish(mut self) -> Lock {
        let metrics_key = self.lock.metrics_key();
        // A loss the holder saw on its own clock and answered with a release
        // before the renewal ran counts too (a release while held does not).
        let cause = if self.held_to_the_cap(Instant::now()) {
            "max_hold"
        } else {
            self.stopped_by
        };
        let seen = (self.shared.lost.is_cancelled() && !self.shared.is_released()).then_some(cause);
        if let Some(cause) = self.loss.or(seen) {
            crate::metrics::lost(metrics_key, cause);
        }
        // From here the lock ends by its release; a shutdown mid-release has
        // nothing more to tell the holder than what the renewals already did.
        self.exit.armed = false;
        self.lock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_fall_in_the_band_and_on_the_grid() {
        let now = Instant::now();
        for granted_ms in [10u64, 300, 1_000, 10_000, 60_000] {
            let granted = Duration::from_millis(granted_ms);
            let valid_until = now + granted;
            let grid = (granted / 400).max(Duration::from_millis(1));
            let mut seen = std::collections::HashSet::new();
            for _ in 0..500 {
                let at = renew_point(valid_until, granted);
                let left = valid_until - at;
                assert!(
                    left >= granted.mul_f64(0.4),
                    "{granted:?}: only {left:?} left"
                );
                assert!(
                    left <= granted.mul_f64(0.6) + grid,
                    "{granted:?}: {left:?} left is too early"
                );
                seen.insert(at);
            }
            // Jittered, yet snapped: many different points, but no more than the
            // grid allows across a band of 20% of the validity.
            let slots = (granted.as_nanos() / 5 / grid.as_nanos()) as usize + 2;
            assert!(seen.len() > 1, "{granted:?}: no jitter");
            assert!(seen.len() <= slots, "{granted:?}: {} points", seen.len());
        }
    }
}
