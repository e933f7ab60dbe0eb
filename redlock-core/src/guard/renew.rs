//! Auto-extension: the renewal task behind a [`LockGuard`](crate::LockGuard),
//! scheduled against the holder's deadline, and the loss it reports.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::guard::handle::Shared;
use crate::lock::Lock;
use crate::release::Released;
use crate::settings::LockOptions;

/// Fires `lost` when the renewal task ends any way but a normal release: a panic
/// unwinds through it, a runtime shutdown drops it.
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

/// The auto-extension loop. It renews when about half of the last granted
/// validity is left (see [`renew_point`]), retries failed renewals until the
/// holder's deadline, and signals loss. It owns the [`Lock`], so a release always
/// comes after the last renewal.
pub(super) async fn keep_alive(
    mut lock: Lock,
    shared: Arc<Shared>,
    stop: CancellationToken,
    options: LockOptions,
    mut exit: LostOnExit,
) -> Result<Released, Error> {
    let redlock = lock.redlock().clone();
    // `Duration::MAX` (or any cap past the end of time) means no cap.
    let hold_until = options
        .max_hold
        .and_then(|m| lock.started_at().checked_add(m));
    // Renewals are scheduled against the holder's deadline (validity less the
    // margin), not the keys' expiry: a renewal confirmed after the holder was
    // told "lost" is of no use, so with a margin close to the TTL they come
    // early enough to land before it.
    let mut granted = shared.deadline().saturating_duration_since(Instant::now());
    let mut renew_at = renew_point(shared.deadline(), granted);
    // A renewal shorter than this would be refused (`InvalidTtl`), or could not
    // complete within its own validity: stop renewing instead.
    let min_ttl = redlock
        .min_ttl()
        .max(redlock.node_timeout().saturating_mul(2));
    // Why the renewals stopped, for the loss's cause in the metrics: the cap
    // (`max_hold`, the extension limit) or a failing renewal.
    let mut stopped_by: &'static str = "expired";
    // The cause of a loss the loop itself found.
    let mut loss: Option<&'static str> = None;
    let metrics_key = redlock.metrics_key(lock.key());
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = shared.lost.cancelled() => break,
            _ = tokio::time::sleep_until(renew_at.into()) => {}
        }
        if shared.is_lost() || Instant::now() >= lock.valid_until() {
            tracing::warn!(
                resource = lock.resource(),
                "lock validity ran out before a renewal succeeded"
            );
            loss = Some(stopped_by);
            shared.lost.cancel();
            break;
        }
        let ttl = match hold_until {
            None => options.ttl,
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                if left < min_ttl {
                    // max_hold reached: stop renewing; the holder is told when the
                    // validity it has runs out.
                    stopped_by = "max_hold";
                    renew_at = shared.deadline();
                    continue;
                }
                options.ttl.min(left)
            }
        };
        // A renewal that shortens the keys (the `max_hold` cap) does so on every
        // node it reaches, from the moment it is sent: the holder is told the
        // lower validity first, so a task starved between the send and the
        // reply cannot leave it counting on the old one.
        shared.lower_valid_until(redlock.extend_cap(ttl, Instant::now()));
        // The extend may not outlast the holder's deadline: a renewal confirmed
        // after the holder was told "lost" would be no use to it.
        let deadline = shared.deadline();
        let outcome = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = redlock.extend(&mut lock, ttl) => Some(r),
            _ = tokio::time::sleep_until(deadline.into()) => None,
        };
        // A shortening extend lowers the lock's validity before it is sent, and
        // keeps it lowered whatever the outcome: publish it either way.
        shared.set_valid_until(lock.valid_until());
        match outcome {
            Some(Ok(())) => {
                shared
                    .extensions
                    .store(lock.extensions(), Ordering::Relaxed);
                granted = shared.deadline().saturating_duration_since(Instant::now());
                renew_at = renew_point(shared.deadline(), granted);
            }
            Some(Err(e @ (Error::NoQuorum { .. } | Error::Expired { .. })))
                if Instant::now() < shared.deadline() =>
            {
                tracing::debug!(resource = lock.resource(), error = %e, "renewal failed, retrying");
                stopped_by = "renewal_failed";
                renew_at = Instant::now()
                    .checked_add(renewal_retry_step(granted))
                    .map_or(shared.deadline(), |t| t.min(shared.deadline()));
            }
            Some(Err(e @ (Error::ExtensionLimit { .. } | Error::InvalidTtl { .. }))) => {
                tracing::debug!(resource = lock.resource(), error = %e, "no more renewals");
                stopped_by = "max_hold";
                renew_at = shared.deadline();
            }
            Some(Err(e)) => {
                tracing::warn!(resource = lock.resource(), error = %e, "lock lost");
                let cause = match e {
                    Error::NotHeld { .. } => "refused",
                    _ => "renewal_failed",
                };
                loss = Some(cause);
                shared.lost.cancel();
                break;
            }
            None => {
                tracing::warn!(
                    resource = lock.resource(),
                    "lock validity ran out during a renewal"
                );
                loss = Some("renewal_failed");
                shared.lost.cancel();
                break;
            }
        }
    }
    // A loss the holder saw on its own clock and answered with a release
    // before this task woke counts too (a release while held does not).
    if let Some(cause) =
        loss.or((shared.lost.is_cancelled() && !shared.is_released()).then_some(stopped_by))
    {
        crate::metrics::lost(metrics_key, cause);
    }
    // From here the task ends by releasing; a shutdown mid-release has nothing
    // more to tell the holder than what the loop already did.
    exit.armed = false;
    drop(exit);
    redlock.unlock(lock).await
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
