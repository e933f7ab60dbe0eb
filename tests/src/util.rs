//! Small helpers the HTTP suites (tower and actix) share: bounded waits, a gauge
//! of how many callers are inside a section, and a recorder of when a future was
//! dropped.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it holds or `timeout` passes; returns whether it
/// held. `f` may do short blocking calls (the harness talks to Redis
/// synchronously).
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `f` every 20 ms until it holds or `within` passes; returns whether
/// it held. The blocking twin of [`eventually`], for the harness's own
/// threads and for tests that must not wait on a runtime.
pub fn poll_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `fut` with a bound, panicking with `what` when it does not finish.
pub async fn within<T>(bound: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {bound:?}"))
}

/// Counts how many callers are inside a section at once, and the most seen.
#[derive(Default, Debug)]
pub struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    /// Enters the section until the guard drops.
    pub fn enter(&self) -> GaugeGuard<'_> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        GaugeGuard(self)
    }

    /// The most callers seen inside at once.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// How many callers are inside now.
    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }
}

/// One caller inside a [`Gauge`]'s section.
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a Gauge);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Records the instant it is dropped: put one in a handler to see when (and
/// whether) the handler's future was dropped.
#[derive(Debug)]
pub struct DropRecorder(pub Arc<Mutex<Option<Instant>>>);

impl Drop for DropRecorder {
    fn drop(&mut self) {
        if let Ok(mut at) = self.0.lock() {
            *at = Some(Instant::now());
        }
    }
}

/// Asserts what a release decided at quorum says when `expected` nodes held the
/// key: no more than `expected` deleted by the decision, and the nodes still
/// pending then account for the rest.
#[track_caller]
pub fn assert_released(released: &redlock_core::Released, expected: usize) {
    let pending = released.report().pending_count();
    assert!(
        released.deleted <= expected && released.deleted + pending >= expected,
        "expected {expected} deletions, got {} with {pending} pending: {}",
        released.deleted,
        released.report()
    );
}

/// A `tracing_subscriber` writer (`.with_writer({ let c = capture.clone();
/// move || c.clone() })`) that keeps everything written, for a test to read.
#[derive(Clone, Default, Debug)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Forgets what was written so far.
    pub fn clear(&self) {
        self.bytes().clear();
    }

    fn bytes(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
