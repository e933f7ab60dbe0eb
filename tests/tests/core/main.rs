//! `redlock-core` on real `redis-server` processes: one test binary, one module
//! per concern (the algorithm's steps, node faults, inputs, the guard and the
//! holder's view, the idempotency store, mutual exclusion, TLS, tracing, and the harness itself).

mod algorithm;
mod batch;
mod coalesced;
mod faults;
mod fence_retention;
mod fencing;
mod guard;
mod holder;
mod idempotency;
mod idempotency_order;
mod idempotency_sql;
mod inputs;
mod inspect;
mod many;
mod memory;
mod native;
mod safety;
mod smoke;
mod tls;
mod view;
mod waiting;
