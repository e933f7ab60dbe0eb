//! The actix-web adapter (`redlock-actix`) on real `redis-server` processes: one test binary, one module
//! per concern.

#[macro_use]
mod common;
mod extractor;
mod fail_open;
mod fencing;
mod hold_limit;
mod holding;
mod hostile_keys;
mod idempotency;
mod idempotency_body;
mod idempotency_fingerprint;
mod loss;
mod metrics;
mod middleware;
mod path_keys;
mod sized;
mod upgrade;
mod workers;
