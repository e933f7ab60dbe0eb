//! The tower/axum adapter (`redlock-tower`) on real `redis-server` processes: one test binary, one module
//! per concern.

mod common;
mod endings;
mod exclusion;
mod extract;
mod fencing;
mod holding;
mod idempotency;
mod loss;
mod metrics;
mod path_keys;
mod responses;
mod upgrade;
