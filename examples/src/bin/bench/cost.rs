//! What one lock+unlock pair costs beyond wall time, on both sides of the
//! wire: this process's CPU and allocations, the nodes' CPU (`INFO cpu`) and
//! the commands they ran (`INFO commandstats`), and how well both sides
//! batched them: the nodes' socket reads and writes (`INFO stats`), this
//! process's read and write system calls (`/proc/self/io`) and its threads'
//! context switches (`/proc/self/task/*/status`). Snapshots are taken around
//! each block of the library and of the raw loop, in the same run.
//!
//! Counting allocations needs a global allocator of the bench's own:
//! `stats_alloc` wraps the system one (a crate, so the workspace's
//! `unsafe_code = "forbid"` holds here too).

use std::alloc::System;
use std::time::Duration;

use deadpool_redis::redis;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use crate::{BoxError, cpu_time};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Everything counted at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Snapshot {
    client_cpu: Duration,
    allocations: u64,
    server_cpu: Duration,
    commands: u64,
    command_usec: u64,
    server_reads: u64,
    server_writes: u64,
    client_syscalls: u64,
    client_switches: u64,
}

/// The difference of two snapshots, summed over blocks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    pub(crate) client_cpu: Duration,
    pub(crate) allocations: u64,
    pub(crate) server_cpu: Duration,
    pub(crate) commands: u64,
    /// Time the nodes spent running commands (`usec` of `INFO
    /// commandstats`): the server CPU less its event loop and I/O.
    pub(crate) command_time: Duration,
    /// Socket reads the nodes served (`total_reads_processed`): fewer per
    /// command means commands arrived together.
    pub(crate) server_reads: u64,
    /// Socket writes of replies (`total_writes_processed`).
    pub(crate) server_writes: u64,
    /// This process's read and write system calls (`syscr` + `syscw`).
    pub(crate) client_syscalls: u64,
    /// Context switches of this process's threads, voluntary (a thread
    /// that went to sleep: no work, or a lock held elsewhere) and not.
    pub(crate) client_switches: u64,
}

impl Cost {
    pub(crate) fn add(&mut self, before: Snapshot, after: Snapshot) {
        self.client_cpu += after.client_cpu.saturating_sub(before.client_cpu);
        self.allocations += after.allocations.saturating_sub(before.allocations);
        self.server_cpu += after.server_cpu.saturating_sub(before.server_cpu);
        self.commands += after.commands.saturating_sub(before.commands);
        self.command_time +=
            Duration::from_micros(after.command_usec.saturating_sub(before.command_usec));
        self.server_reads += after.server_reads.saturating_sub(before.server_reads);
        self.server_writes += after.server_writes.saturating_sub(before.server_writes);
        self.client_syscalls += after.client_syscalls.saturating_sub(before.client_syscalls);
        self.client_switches += after.client_switches.saturating_sub(before.client_switches);
    }
}

fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// `name`'s number in `text`, 0 when absent.
fn number(text: &str, name: &str) -> u64 {
    field(text, name)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's read and write system calls so far.
fn syscalls() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    number(&io, "syscr") + number(&io, "syscw")
}

/// Context switches of this process's live threads so far. The bench's
/// runtime keeps its worker threads for the whole run, so differences
/// between snapshots count them.
fn switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| number(&s, "voluntary_ctxt_switches") + number(&s, "nonvoluntary_ctxt_switches"))
        .sum()
}

/// Counts now: this process, and every node of `pools` (one `INFO` each).
pub(crate) async fn snapshot(pools: &[deadpool_redis::Pool]) -> Result<Snapshot, BoxError> {
    let mut s = Snapshot {
        client_cpu: cpu_time(),
        allocations: GLOBAL.stats().allocations as u64,
        client_syscalls: syscalls(),
        client_switches: switches(),
        ..Snapshot::default()
    };
    for p in pools {
        let mut c = p.get().await?;
        let cpu: String = redis::cmd("INFO").arg("cpu").query_async(&mut c).await?;
        let secs = |n: &str| {
            field(&cpu, n)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        s.server_cpu += Duration::from_secs_f64(secs("used_cpu_sys") + secs("used_cpu_user"));
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await?;
        let counted = || {
            stats
                .lines()
                .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        };
        let sum = |name: &str| {
            counted()
                .filter_map(|l| l.split(name).nth(1)?.split(',').next()?.parse::<u64>().ok())
                .sum::<u64>()
        };
        let io: String = redis::cmd("INFO").arg("stats").query_async(&mut c).await?;
        s.server_reads += number(&io, "total_reads_processed");
        s.server_writes += number(&io, "total_writes_processed");
        s.commands += sum("calls=");
        s.command_usec += sum(",usec=");
    }
    Ok(s)
}
