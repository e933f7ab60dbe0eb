//! Liveness bounds of the HTTP and gRPC suites (tower, actix, grpc), derived
//! from [`crate::timing`]: how long a request through a lock layer may take,
//! from the settings under test.

use std::time::Duration;

use crate::timing::{PATIENT_NODE_TIMEOUT, liveness};
use crate::util::{Gauge, GaugeGuard, eventually};

/// How long a request through a lock layer whose handle has the patient node
/// timeout may take to be answered, when its handler works for `work`: an
/// acquire and a release (one node timeout each) around the handler's own
/// work, times [`slack`](crate::timing::slack), plus the scheduling margin.
/// Also the bound for such a handler to have started (`work` zero).
pub fn answered(work: Duration) -> Duration {
    liveness(PATIENT_NODE_TIMEOUT.saturating_mul(2).saturating_add(work))
}

/// [`answered`] for a request through a layer whose handle has `node_timeout`.
pub fn answered_with(node_timeout: Duration, work: Duration) -> Duration {
    liveness(node_timeout.saturating_mul(2).saturating_add(work))
}

/// A gate a handler waits at until the test opens it: how a test keeps a
/// request inside its lock while it checks what others get, without betting
/// on a handler's sleep outlasting the checks on a loaded machine.
#[derive(Debug)]
pub struct Gate(tokio::sync::watch::Sender<bool>);

impl Default for Gate {
    fn default() -> Self {
        Self(tokio::sync::watch::channel(false).0)
    }
}

impl Gate {
    /// Lets every waiter through, now and later.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Closes the gate again: later waiters wait for the next [`Gate::open`].
    pub fn close(&self) {
        self.0.send_replace(false);
    }

    /// Waits until the gate is open.
    pub async fn passed(&self) {
        let mut open = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close meanwhile.
        let _ = open.wait_for(|open| *open).await;
    }
}

/// What a test sees of the handlers under a lock: a [`Gauge`] of how many
/// are inside, and the [`Gate`] a gated one waits at until the test has
/// checked what the other requests get meanwhile. Share one between the app
/// (its state) and the test.
#[derive(Debug, Default)]
pub struct Inside {
    /// The handlers inside now, and the most seen at once.
    pub gauge: Gauge,
    /// Where a gated handler waits.
    pub gate: Gate,
}

impl Inside {
    /// Counts the calling handler inside until the guard drops.
    pub fn enter(&self) -> GaugeGuard<'_> {
        self.gauge.enter()
    }

    /// How many handlers are inside now.
    pub fn now(&self) -> usize {
        self.gauge.now()
    }

    /// The most handlers seen inside at once.
    pub fn max(&self) -> usize {
        self.gauge.max()
    }

    /// Counts the calling handler inside while it waits at the gate, until
    /// the test opens it.
    pub async fn wait_at_gate(&self) {
        let _inside = self.enter();
        self.gate.passed().await;
    }

    /// Waits until at least `n` handlers are inside at once, for as long as
    /// a request through a patient lock layer may take to reach its handler
    /// ([`answered`] of no work).
    ///
    /// # Panics
    /// When they are not, by then.
    pub async fn holding(&self, n: usize) {
        assert!(
            eventually(answered(Duration::ZERO), || self.now() >= n).await,
            "{n} gated requests never were inside at once (now {})",
            self.now()
        );
    }

    /// [`Inside::holding`] one handler: the gated request is inside, under
    /// its lock.
    pub async fn entered(&self) {
        self.holding(1).await;
    }
}

/// How many retries `pause` apart cover `bound`: the retry count of a client
/// that asks again while it is answered busy, for as long as a liveness
/// bound allows.
pub fn busy_retries(bound: Duration, pause: Duration) -> u32 {
    let n = bound.as_millis() / pause.as_millis().max(1);
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
}
