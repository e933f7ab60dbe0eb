//! Scenario `metrics`: what the lock metrics cost. Sequential lock+unlock
//! pairs with a Prometheus recorder installed and recording, against the same
//! pairs with recording switched off (every metric a no-op handle), in
//! alternating blocks of one run.
//!
//! A process has one global recorder and it cannot be removed, so the
//! recorder installed here is a switch in front of the Prometheus one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use crate::{BoxError, Setup, Stats, TTL, header, redlock, row, us};

static RECORDING: AtomicBool = AtomicBool::new(false);

/// The Prometheus recorder while `RECORDING` is on; no-op handles while off.
struct Switch(PrometheusRecorder);

impl Recorder for Switch {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if RECORDING.load(Ordering::Relaxed) {
            self.0.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if RECORDING.load(Ordering::Relaxed) {
            self.0.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if RECORDING.load(Ordering::Relaxed) {
            self.0.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

pub(crate) async fn metrics_cost(setup: &Setup) -> Result<(), BoxError> {
    let prometheus = PrometheusBuilder::new().build_recorder();
    let handle = prometheus.handle();
    metrics::set_global_recorder(Switch(prometheus))
        .map_err(|e| format!("install the recorder: {e}"))?;
    redlock_core::metrics::describe();
    let lib = redlock(setup)?;
    let (blocks, per_block) = if setup.quick { (4, 250) } else { (10, 600) };
    for i in 0..300 {
        let l = lib
            .mutex(format!("bench:mwarm:{i}"))
            .try_acquire(TTL)
            .await?;
        lib.unlock(l).await?;
    }
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let (mut on_time, mut off_time) = (0.0, 0.0);
    let mut n = 0u64;
    for b in 0..blocks {
        for pass in 0..2 {
            let recording = (pass == 0) == (b % 2 == 0);
            RECORDING.store(recording, Ordering::Relaxed);
            let block = Instant::now();
            for _ in 0..per_block {
                n += 1;
                let start = Instant::now();
                let l = lib
                    .mutex(format!("bench:metrics:{n}"))
                    .try_acquire(TTL)
                    .await?;
                lib.unlock(l).await?;
                if recording {
                    on.push(start.elapsed());
                } else {
                    off.push(start.elapsed());
                }
            }
            let secs = block.elapsed().as_secs_f64();
            if recording {
                on_time += secs;
            } else {
                off_time += secs;
            }
        }
    }
    RECORDING.store(false, Ordering::Relaxed);
    let recorded = handle
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("redlock_releases_total{outcome=\"confirmed\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    let (on_s, off_s) = (Stats::new(on), Stats::new(off));
    header(&format!(
        "metrics: sequential lock+unlock, recorder recording (\"library\") vs switched off (\"raw\"), {} pairs each",
        on_s.sorted.len()
    ));
    row("p50", us(on_s.pct(0.5)), us(off_s.pct(0.5)), "µs");
    row("p99", us(on_s.pct(0.99)), us(off_s.pct(0.99)), "µs");
    let pairs = on_s.sorted.len().max(1) as f64;
    row(
        "mean time per pair (blocks)",
        on_time / pairs * 1e6,
        off_time / off_s.sorted.len().max(1) as f64 * 1e6,
        "µs",
    );
    println!(
        "(releases recorded while on: {recorded}, expected {})",
        on_s.sorted.len()
    );
    Ok(())
}
