//! Liveness bounds of the HTTP and gRPC suites (tower, actix, grpc), derived
//! from [`crate::timing`]: how long a request through a lock layer may take,
//! from the settings under test.

use std::time::Duration;

use crate::timing::{PATIENT_NODE_TIMEOUT, liveness};

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

/// How many retries `pause` apart cover `bound`: the retry count of a client
/// that asks again while it is answered busy, for as long as a liveness
/// bound allows.
pub fn busy_retries(bound: Duration, pause: Duration) -> u32 {
    let n = bound.as_millis() / pause.as_millis().max(1);
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
}
