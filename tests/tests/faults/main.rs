//! The fault-injection suites on real `redis-server` processes: one test binary,
//! four parts.
//!
//! * [`suite`]: the safety suite. One test, `fault_suite`, runs the negative
//!   controls (which the checkers must catch), ghost keys, then an in-process and
//!   a multi-process randomized run under a seeded nemesis (crashes, pauses,
//!   proxy faults, clock jumps, client and holder stalls), checks every history
//!   and prints one `fault-suite seed=…` summary line. `REDLOCK_SEED` replays a
//!   schedule, `REDLOCK_SOAK_SECS` lengthens the randomized runs.
//! * [`proxy`]: the fault proxy's own tests (`redlock_tests::proxy`): each fault
//!   does what the suite relies on.
//! * [`fenced`]: writes through the fence by holders stalled between their check
//!   and their write: the `Durable` and `Hybrid` (clock skew, empty restarts,
//!   proxy faults) workloads and a deliberate break of the `Hybrid` assumption,
//!   each printing one `fault-fenced mode=…` summary line.
//! * [`replicas`]: a primary killed while it holds a lock key, behind a
//!   failover endpoint, with replica acks (the lock survives) and without
//!   (the negative control: two holders).
//!
//! The suite and the fenced tests are heavy and timing-sensitive: the suite
//! runs alone, the fenced tests beside each other (as when they were a binary
//! of their own), through [`HEAVY`]; the proxy's tests are light and run
//! alongside anything.
//!
//! ```sh
//! cargo test -p redlock-tests --test faults -- --nocapture           # all three parts
//! cargo test -p redlock-tests --test faults suite -- --nocapture     # the suite alone
//! cargo test -p redlock-tests --test faults fenced -- --nocapture    # the fenced tests alone
//! cargo test -p redlock-tests --test faults proxy:: -- --nocapture   # the proxy's tests alone
//! ```
//!
//! (`proxy` without the `::` would also select the fenced `Hybrid` workload,
//! whose name mentions proxy faults.)

mod fenced;
mod proxy;
mod replicas;
mod shared;
mod suite;
mod waitaof;

/// The suite alone, or the fenced workloads together: libtest runs the tests
/// of a binary on parallel threads, and the suite's timing (stalls of two
/// TTLs, node timeouts of 30–100 ms, three client processes) must not compete
/// for the CPU with the fenced workloads, which were written and measured
/// running beside each other. Each takes its turn first thing and keeps it to
/// the end: the suite with `HEAVY.write().await`, the fenced tests (plain
/// threads) with `HEAVY.blocking_read()`. A tokio lock does not poison: a
/// heavy test that fails gives the next one its turn as it unwinds.
static HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
