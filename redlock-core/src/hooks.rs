//! Test-only pauses inside a node call (the `test-hooks` feature), for the
//! fault suites to put a fault exactly between two of its round trips. Not
//! part of the API; without the feature nothing here is built, and nothing
//! in the library waits on it.
//!
//! A pause is keyed by the lock key it stops, so that the other tests of a
//! binary, which run at the same time in the same process, never meet it.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Semaphore;

/// One pause: where a call stopped, and when it may go on.
#[derive(Debug)]
struct Gate {
    key: Vec<u8>,
    /// A permit per call that reached the pause.
    reached: Semaphore,
    /// A permit per call let go on; closed when the pause is dropped.
    resume: Semaphore,
}

/// The pauses in force.
static GATES: Mutex<Vec<Arc<Gate>>> = Mutex::new(Vec::new());

/// Test-only: stops every acked write of `key` on a cluster node with
/// replica acks between the write's answer and its marker pipeline (`SET
/// {tag}:redlock-acked`, `WAIT`), until [`MarkerPause::resume`] or the
/// pause is dropped.
pub fn pause_before_marker(key: &str) -> MarkerPause {
    let gate = Arc::new(Gate {
        key: key.as_bytes().to_vec(),
        reached: Semaphore::new(0),
        resume: Semaphore::new(0),
    });
    GATES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Arc::clone(&gate));
    MarkerPause(gate)
}

/// A pause set by [`pause_before_marker`]; dropping it lets every call go
/// on and sets no more pauses.
#[derive(Debug)]
pub struct MarkerPause(Arc<Gate>);

impl MarkerPause {
    /// Waits until a call reached the pause (one call per wait).
    pub async fn reached(&self) {
        if let Ok(permit) = self.0.reached.acquire().await {
            permit.forget();
        }
    }

    /// Lets one call that reached (or will reach) the pause go on.
    pub fn resume(&self) {
        self.0.resume.add_permits(1);
    }
}

impl Drop for MarkerPause {
    fn drop(&mut self) {
        GATES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|g| !Arc::ptr_eq(g, &self.0));
        self.0.resume.close();
    }
}

/// Where a cluster node's acked write of `key` stops, if a test paused it.
pub(crate) async fn before_marker(key: &[u8]) {
    let gate = GATES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|g| g.key == key)
        .cloned();
    if let Some(gate) = gate {
        gate.reached.add_permits(1);
        if let Ok(permit) = gate.resume.acquire().await {
            permit.forget();
        }
    }
}
