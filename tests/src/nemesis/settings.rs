//! The fault runs' shared settings: the handle every client builds, and the history's opening events.

use std::time::Duration;

use redlock_core::Redlock;

use crate::history::{Event, Meta, duration_ns};

#[allow(unused_imports)]
use super::*;

/// The per-node timeout every suite client uses.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(30);
/// The drift factor every suite client uses (the library's default).
pub const DRIFT_FACTOR: f64 = 0.01;
/// The fixed drift every suite client uses (the library's default).
pub const FIXED_DRIFT: Duration = Duration::from_millis(2);

/// A Redlock over `urls` with the suite's settings.
///
/// # Panics
/// If the library refuses the settings.
pub fn redlock_for(urls: &[String]) -> Redlock {
    Redlock::builder()
        .urls(urls.iter().cloned())
        .node_timeout(NODE_TIMEOUT)
        .drift_factor(DRIFT_FACTOR)
        .fixed_drift(FIXED_DRIFT)
        .build()
        .expect("build the suite's Redlock")
}

/// The [`Meta`] event of a scenario with the suite's settings.
pub fn meta(scenario: &str, seed: u64, nodes: usize, expect_violation: bool) -> Event {
    Event::Meta(Meta {
        scenario: scenario.to_owned(),
        seed,
        nodes,
        quorum: nodes / 2 + 1,
        drift_factor: DRIFT_FACTOR,
        fixed_drift_ns: duration_ns(FIXED_DRIFT),
        node_timeout_ns: duration_ns(NODE_TIMEOUT),
        expect_violation,
    })
}

/// This process's clock calibration, as an event.
pub fn clock_event(process: &str) -> Event {
    Event::Clock {
        process: process.to_owned(),
        error_ns: crate::history::calibration_error_ns(),
    }
}
