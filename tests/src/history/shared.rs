//! The checker of the semaphore and read/write-lock workloads: recorded hold
//! intervals of one resource, judged against the primitive's promise.
//!
//! A hold is `[acquired, end)`: `acquired` when the acquire call returned,
//! `end` the earliest of the release call's start and the end of the validity
//! the holder was told (a manual lock's `valid_until`; a guard's last observed
//! `valid_until` minus its loss margin, where `is_lost()` starts saying "lost").
//! The semaphore promises at most `permits` holds at any instant; the
//! read/write lock that no write hold meets a read hold or another write hold.

use serde::{Deserialize, Serialize};

/// Which side a hold was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldKind {
    /// A semaphore permit.
    Permit,
    /// A read share of a read/write lock.
    Read,
    /// The write lock of a read/write lock.
    Write,
}

/// One hold, in [`now_ns`](super::now_ns) nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// The holder.
    pub client: String,
    /// The side.
    pub kind: HoldKind,
    /// When the acquire returned.
    pub start: u64,
    /// When the hold ended (see the module's text).
    pub end: u64,
}

/// The semaphore's verdict over a list of holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PermitVerdict {
    /// Holds judged (empty intervals left out).
    pub holds: usize,
    /// The most holds at one instant.
    pub max_holders: usize,
    /// Maximal stretches of time with more than `permits` holds.
    pub over_limit: usize,
}

/// Sweeps the holds' endpoints in time order (an end before a start at one
/// instant: intervals are half-open) and calls `at` after each with the
/// holds then open (the one just opened last) and whether it was a start.
fn sweep(holds: &[Hold], mut at: impl FnMut(&[usize], bool)) {
    let mut points: Vec<(u64, bool, usize)> = holds
        .iter()
        .enumerate()
        .filter(|(_, h)| h.end > h.start)
        .flat_map(|(i, h)| [(h.start, true, i), (h.end, false, i)])
        .collect();
    points.sort_unstable();
    let mut open: Vec<usize> = Vec::new();
    for (_, is_start, i) in points {
        if is_start {
            open.push(i);
        } else {
            open.retain(|&j| j != i);
        }
        at(&open, is_start);
    }
}

/// Judges semaphore holds of one resource against `permits`.
pub fn check_permits(holds: &[Hold], permits: usize) -> PermitVerdict {
    let mut v = PermitVerdict {
        holds: holds.iter().filter(|h| h.end > h.start).count(),
        ..PermitVerdict::default()
    };
    let mut over = false;
    sweep(holds, |open, _| {
        v.max_holders = v.max_holders.max(open.len());
        // A stretch over the limit starts where the count passes `permits`
        // and ends where it falls back.
        if open.len() > permits {
            if !over {
                v.over_limit += 1;
            }
            over = true;
        } else {
            over = false;
        }
    });
    v
}

/// The read/write lock's verdict over a list of holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RwVerdict {
    /// Read holds judged.
    pub reads: usize,
    /// Write holds judged.
    pub writes: usize,
    /// The most read holds at one instant.
    pub max_readers: usize,
    /// Pairs of holds (indices into the list) that met and must not have:
    /// a writer with a reader or with another writer.
    pub overlaps: Vec<(usize, usize)>,
}

/// Judges read/write holds of one resource.
pub fn check_rw(holds: &[Hold]) -> RwVerdict {
    let judged = |k: HoldKind| {
        holds
            .iter()
            .filter(|h| h.kind == k && h.end > h.start)
            .count()
    };
    let mut v = RwVerdict {
        reads: judged(HoldKind::Read),
        writes: judged(HoldKind::Write),
        ..RwVerdict::default()
    };
    sweep(holds, |open, is_start| {
        if !is_start {
            return;
        }
        let readers = open
            .iter()
            .filter(|&&i| holds[i].kind == HoldKind::Read)
            .count();
        v.max_readers = v.max_readers.max(readers);
        // The hold that just opened is last: pair it with every open hold
        // when either of the two is a writer.
        if let Some((&new, rest)) = open.split_last() {
            for &old in rest {
                if holds[new].kind == HoldKind::Write || holds[old].kind == HoldKind::Write {
                    v.overlaps.push((old, new));
                }
            }
        }
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(kind: HoldKind, start: u64, end: u64) -> Hold {
        Hold {
            client: format!("{kind:?}@{start}"),
            kind,
            start,
            end,
        }
    }

    #[test]
    fn permits_within_the_limit_pass() {
        let p = HoldKind::Permit;
        // Two at a time, and back-to-back holds (end == start) do not meet.
        let holds = [
            hold(p, 0, 10),
            hold(p, 5, 20),
            hold(p, 10, 30),
            hold(p, 20, 25),
        ];
        let v = check_permits(&holds, 2);
        assert_eq!((v.holds, v.max_holders, v.over_limit), (4, 2, 0));
    }

    #[test]
    fn a_third_holder_of_two_permits_is_caught() {
        let p = HoldKind::Permit;
        let holds = [
            hold(p, 0, 10),
            hold(p, 5, 20),
            hold(p, 9, 12), // three from 9 to 10
            hold(p, 15, 18),
            hold(p, 16, 17), // three again from 16 to 17
            hold(p, 17, 19), // and again, after a gap at 17
        ];
        let v = check_permits(&holds, 2);
        assert_eq!((v.max_holders, v.over_limit), (3, 3));
        assert_eq!(check_permits(&holds, 3).over_limit, 0);
    }

    #[test]
    fn empty_holds_are_not_judged() {
        let p = HoldKind::Permit;
        let v = check_permits(&[hold(p, 0, 10), hold(p, 5, 5), hold(p, 7, 3)], 1);
        assert_eq!((v.holds, v.max_holders, v.over_limit), (1, 1, 0));
    }

    #[test]
    fn readers_share_and_writers_alternate() {
        let (r, w) = (HoldKind::Read, HoldKind::Write);
        let holds = [
            hold(r, 0, 10),
            hold(r, 2, 8),
            hold(w, 10, 20),
            hold(w, 20, 30),
            hold(r, 30, 40),
        ];
        let v = check_rw(&holds);
        assert_eq!((v.reads, v.writes, v.max_readers), (3, 2, 2));
        assert!(v.overlaps.is_empty(), "{:?}", v.overlaps);
    }

    #[test]
    fn a_writer_meeting_a_reader_or_a_writer_is_caught() {
        let (r, w) = (HoldKind::Read, HoldKind::Write);
        let v = check_rw(&[hold(r, 0, 10), hold(w, 9, 20)]);
        assert_eq!(v.overlaps, vec![(0, 1)]);
        let v = check_rw(&[hold(w, 0, 10), hold(r, 3, 4)]);
        assert_eq!(v.overlaps, vec![(0, 1)]);
        let v = check_rw(&[hold(w, 0, 10), hold(w, 1, 2), hold(r, 20, 30)]);
        assert_eq!(v.overlaps, vec![(0, 1)]);
    }
}
