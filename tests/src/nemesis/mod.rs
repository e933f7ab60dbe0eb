//! The nemesis: a seeded random schedule of faults against a [`Rig`] of Redis
//! nodes behind [`FaultProxy`](crate::proxy::FaultProxy)s.
//!
//! Every choice (which fault, which node, how long) comes from one `StdRng`
//! seeded with the run's seed, which the suite prints first, so the schedule of a
//! failing run can be replayed with `REDLOCK_SEED` (timing and the library's own
//! randomness still vary). Every fault is logged as
//! [`Event::Fault`](crate::history::Event::Fault), every heal as
//! [`Event::Heal`](crate::history::Event::Heal).
//!
//! # The faults, and the model they stay in
//!
//! Redlock promises mutual exclusion while a minority of nodes is faulty, a
//! crashed node stays down longer than the largest TTL, and clocks do not jump.
//! The nemesis stays inside that model (the negative controls step out of it on
//! purpose, and must be caught):
//!
//! * **kill** `-9` a node (no persistence), restarted empty after the largest TTL
//!   plus 50–300 ms;
//! * **pause** a node with `SIGSTOP` for 0.1–3×TTL, then `SIGCONT`;
//! * **proxy** faults for 0.2–3×TTL: request latency, reply latency, blackhole,
//!   reset, refuse, hold then flush (requests, replies, or both);
//! * at most `N − quorum` nodes are faulty at once (a lengthened key counts until
//!   it expires);
//! * **clock** jumps on one node: a backward jump lengthens a lock key's PTTL to
//!   1.5–3×TTL; a forward jump expires a lock key at once (`PEXPIRE key 1`) or
//!   deletes it (`DEL`). A forward jump is only made where the holder keeps a
//!   quorum without that node: on at least `quorum + 1` fault-free nodes whose
//!   copy expires (`PEXPIRETIME`) no earlier than the freshest copy minus 1 ms.
//!   The freshest copy outlives the holder's validity by the drift (≥ 2 ms), so
//!   these copies outlive it too. Losing a key
//!   early on a holder's bare quorum is unsafe for Redlock by design; that case is
//!   the second negative control;
//! * **stall**: a holder pauses past its validity before its write — an
//!   in-process client sleeps (its next critical section), a client process is
//!   `SIGSTOP`ped for 1–2×TTL (a real GC pause, renewal task included);
//! * **holder_stall**: a holder-view client (its own OS thread, a
//!   current-thread runtime that also runs its renewal task) blocks its thread
//!   with `std::thread::sleep` for 1.2–2.5×TTL inside `with_lock`, before its
//!   `is_lost()` check (the deadline check must say "lost") or between the check
//!   and its write (no client-side check can help: counted as
//!   `stalled_after_check`). Decided here, from a second seeded stream, so the
//!   schedule of the other faults is the same as without it; taken by the
//!   clients through [`HolderStalls`](crate::workload::HolderStalls);
//! * **max_hold** (the path, not this scheduler): [`Rig::start_slow_path`] puts a
//!   second proxy in front of every node, with 20–40 ms of latency each way, for
//!   guards with `max_hold < ttl` whose renewals near `max_hold` shorten the keys
//!   and answer late. Kills and pauses hit those nodes too; a killed node stays
//!   down longer than the longest TTL of any client ([`NemesisConfig::ttl_longest`]).

mod faults;
mod ghost;
mod rig;
mod settings;

pub use faults::*;
pub use ghost::*;
pub use rig::*;
pub use settings::*;
