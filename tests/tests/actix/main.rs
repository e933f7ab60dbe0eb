//! The actix-web adapter (`redlock-actix`) on real `redis-server` processes: one test binary, one module
//! per concern.

#[macro_use]
mod common;
mod extractor;
mod fencing;
mod holding;
mod idempotency;
mod loss;
mod middleware;
mod path_keys;
mod workers;
