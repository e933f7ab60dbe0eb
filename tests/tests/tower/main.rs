//! The tower/axum adapter (`redlock-tower`) on real `redis-server` processes: one test binary, one module
//! per concern.

mod common;
mod endings;
mod exclusion;
mod extract;
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
mod path_keys;
mod permits;
mod responses;
mod upgrade;
