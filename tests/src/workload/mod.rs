//! The fault suite's workload: clients that contend for a few resources with
//! short TTLs, and do a non-atomic read, sleep, write+1 on a fault-free store while
//! they hold the lock.
//!
//! # Exact counting
//!
//! The store ([`Store`]) runs the holder's validity check and the write as one
//! step under its own lock: it reads [`Instant::now`](std::time::Instant::now) and compares it with the
//! library's `valid_until` *inside* that lock, and writes only if the validity has
//! not run out. A write therefore happens at an instant that is inside its lock's
//! validity, or not at all, and a holder that stalled past its validity skips the
//! write and does not count it. With no overlap of validity intervals the writes
//! are serialized, so the final count equals the number of counted writes, exactly.
//!
//! Two stores: [`MemoryStore`] (a mutex) for clients that are tasks of one
//! process, and [`FileStore`] (one file per resource under `flock`) for clients in
//! separate OS processes. Both read the same `CLOCK_MONOTONIC`. A Redis store would
//! not do: it cannot compare against the clients' monotonic clock, so a write
//! could land after the check passed and after the validity ended, and the count
//! would no longer be exact.

mod client;
mod holder;
mod liveness;
mod many;
mod max_hold;
mod store;

pub use client::*;
pub use holder::*;
pub use liveness::*;
pub use many::*;
pub use max_hold::*;
pub use store::*;
