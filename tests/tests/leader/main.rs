//! Leader election and once-per-tick jobs on real `redis-server` processes.
//!
//! - `election.rs`: five `leader_replica` OS processes campaign for one
//!   election; the leader resigns or is killed with SIGKILL, in turn. Judged
//!   from the intervals the replicas report: one leader at a time, terms
//!   increasing, takeover bounds; an observer in the test process sees the
//!   same leaders in the same order.
//! - `jobs.rs`: five replicas (independent handles) fire the same ticks with
//!   up to 500 ms of timer skew; a job with a minimum hold runs once per tick,
//!   and without one (the negative control) more often.

mod election;
mod jobs;
