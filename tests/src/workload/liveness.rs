//! After the faults: liveness probes and the final counts.

use std::time::Duration;

use redlock_core::{Redlock, RetryPolicy};

use crate::history::{Event, HistoryLog, Mode, duration_ns, instant_ns, now_ns};

use super::*;

/// After the faults healed: takes and releases every resource once, each within
/// `TTL + budget`, and logs the outcome as [`Event::Liveness`].
pub async fn probe_liveness(
    redlock: &Redlock,
    resources: &[(String, Duration)],
    budget: Duration,
    healed_at: u64,
    log: &HistoryLog,
) -> bool {
    let probes = resources.iter().map(|(res, ttl)| async move {
        let bound = *ttl + budget;
        let policy = RetryPolicy::deadline(bound)
            .with_delay(Duration::from_millis(10))
            .with_jitter(Duration::from_millis(10));
        let t0 = now_ns();
        let r = redlock.mutex(res).acquire_with(*ttl, &policy).await;
        let t1 = now_ns();
        let acquired_at = r.as_ref().ok().map(|_| t1);
        match r {
            Ok(lock) => {
                log.push(Event::Acquire {
                    client: "probe".into(),
                    res: res.clone(),
                    token: lock.token().to_owned(),
                    mode: Mode::Probe,
                    t0,
                    t1,
                    started: Some(instant_ns(lock.started_at())),
                    valid_until: instant_ns(lock.valid_until()),
                    ttl_ns: duration_ns(*ttl),
                    loss_margin_ns: None,
                });
                log.push(Event::Release {
                    client: "probe".into(),
                    res: res.clone(),
                    token: lock.token().to_owned(),
                    at: now_ns(),
                    extensions: 0,
                });
                let _ = lock.unlock().await;
            }
            Err(e) => log.push(Event::AcquireFailed {
                client: "probe".into(),
                res: res.clone(),
                t0,
                t1,
                error: short_error(&e),
            }),
        }
        log.push(Event::Liveness {
            res: res.clone(),
            healed_at,
            acquired_at,
            bound_ns: duration_ns(bound),
        });
        acquired_at.is_some_and(|a| a.saturating_sub(healed_at) <= duration_ns(bound))
    });
    let mut ok = true;
    for r in futures_util::future::join_all(probes).await {
        ok &= r;
    }
    ok
}

/// Appends each resource's final count to the history.
pub fn log_finals(store: &dyn Store, resources: &[(String, Duration)], log: &HistoryLog) {
    for (res, _) in resources {
        log.push(Event::Final {
            res: res.clone(),
            count: store.count(res),
        });
    }
}
