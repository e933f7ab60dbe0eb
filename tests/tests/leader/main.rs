//! Leader election and once-per-tick jobs on real `redis-server` processes.
//!
//! - `election.rs`: five `leader_replica` OS processes campaign for one
//!   election; the leader resigns or is killed with SIGKILL, in turn. Judged
//!   from the intervals the replicas report: one leader at a time, terms
//!   increasing, takeover bounds; an observer in the test process sees the
//!   same leaders in the same order. An observer whose poll interval is
//!   30 s sees the next leader within milliseconds of a resignation (the
//!   release message wakes it); one that does not listen (the control) does
//!   not.
//! - `jobs.rs`: five replicas (independent handles) fire the same ticks with
//!   up to 500 ms of timer skew; a job with a minimum hold runs once per tick,
//!   and without one (the negative control) more often.
//! - `cancel.rs`: such a job cancelled or panicking keeps its tick to the
//!   minimum, as a normal end does.

mod cancel;
mod election;
mod jobs;
