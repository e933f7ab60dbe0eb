//! The checkers on hand-made histories: each must fail when it should.

use super::*;

const MS: u64 = 1_000_000;

fn meta() -> Event {
    Event::Meta(Meta {
        scenario: "unit".into(),
        seed: 1,
        nodes: 3,
        quorum: 2,
        drift_factor: 0.01,
        fixed_drift_ns: 2 * MS,
        node_timeout_ns: 30 * MS,
        expect_violation: false,
    })
}

fn acquire(client: &str, token: &str, t1: u64, valid_until: u64) -> Event {
    Event::Acquire {
        client: client.into(),
        res: "r".into(),
        token: token.into(),
        mode: Mode::Manual,
        t0: t1 - MS,
        t1,
        started: Some(t1 - MS / 2),
        valid_until,
        ttl_ns: 100 * MS,
        loss_margin_ns: None,
    }
}

fn write(client: &str, token: &str, at: u64, read: u64) -> Event {
    Event::Write {
        client: client.into(),
        res: "r".into(),
        token: token.into(),
        read_at: at - 1,
        at,
        read,
        wrote: read + 1,
    }
}

fn release(client: &str, token: &str, at: u64) -> Event {
    Event::Release {
        client: client.into(),
        res: "r".into(),
        token: token.into(),
        at,
        extensions: 0,
    }
}

fn fin(count: u64) -> Event {
    Event::Final {
        res: "r".into(),
        count,
    }
}

#[test]
fn clean_history_passes() {
    let h = vec![
        meta(),
        acquire("a", "ta", 1000 * MS, 1090 * MS),
        write("a", "ta", 1010 * MS, 0),
        release("a", "ta", 1020 * MS),
        acquire("b", "tb", 1021 * MS, 1110 * MS),
        write("b", "tb", 1030 * MS, 1),
        release("b", "tb", 1040 * MS),
        fin(2),
    ];
    let v = check(&h);
    assert_eq!(v.safety_violations(), 0, "{}", v.describe(10));
    assert!(v.passed());
    assert_eq!((v.acquisitions, v.writes), (2, 2));
}

#[test]
fn overlap_and_lost_update_are_caught() {
    let h = vec![
        meta(),
        acquire("a", "ta", 1000 * MS, 1090 * MS),
        acquire("b", "tb", 1010 * MS, 1100 * MS),
        write("a", "ta", 1020 * MS, 0),
        write("b", "tb", 1030 * MS, 0),
        release("a", "ta", 1040 * MS),
        release("b", "tb", 1050 * MS),
        fin(1),
    ];
    let v = check(&h);
    assert_eq!(v.overlaps.len(), 1, "{}", v.describe(10));
    assert!(v.lost_updates >= 1, "{}", v.describe(10));
    assert!(!v.passed());
}

#[test]
fn a_hold_ends_at_its_deadline() {
    // b acquires after a's validity ended although a never released: fine.
    let h = vec![
        meta(),
        acquire("a", "ta", 1000 * MS, 1090 * MS),
        acquire("b", "tb", 1091 * MS, 1180 * MS),
        release("b", "tb", 1100 * MS),
        release("a", "ta", 1200 * MS),
    ];
    assert!(check(&h).overlaps.is_empty());
    // ...but a write after the deadline is late.
    let mut h2 = h.clone();
    h2.push(write("a", "ta", 1095 * MS, 0));
    h2.push(fin(1));
    assert_eq!(check(&h2).late_writes.len(), 1);
}

#[test]
fn an_extension_moves_the_deadline() {
    let h = vec![
        meta(),
        acquire("a", "ta", 1000 * MS, 1090 * MS),
        Event::Extend {
            client: "a".into(),
            res: "r".into(),
            token: "ta".into(),
            t0: 1050 * MS,
            t1: 1051 * MS,
            started: Some(1050 * MS + 10),
            valid_until: Some(1050 * MS + 10 + 97 * MS),
            ttl_ns: 100 * MS,
            error: None,
        },
        acquire("b", "tb", 1100 * MS, 1190 * MS),
    ];
    let v = check(&h);
    assert_eq!(v.overlaps.len(), 1, "{}", v.describe(10));
    assert_eq!(v.extensions, 1);
    assert!(v.stale_validity.is_empty(), "{}", v.describe(10));
}

#[test]
fn overstated_validity_is_caught() {
    // ttl 100 ms, drift 3 ms: at most 97 ms after the start.
    let start = 1000 * MS;
    let mut h = vec![
        meta(),
        Event::Acquire {
            client: "a".into(),
            res: "r".into(),
            token: "ta".into(),
            mode: Mode::Manual,
            t0: start - 10,
            t1: start + 5 * MS,
            started: Some(start),
            valid_until: start + 97 * MS + 1,
            ttl_ns: 100 * MS,
            loss_margin_ns: None,
        },
    ];
    assert_eq!(check(&h).stale_validity.len(), 1);
    // Exactly ttl − drift after the start is allowed...
    if let Event::Acquire { valid_until, .. } = &mut h[1] {
        *valid_until = start + 97 * MS;
    }
    assert!(check(&h).stale_validity.is_empty());
    // ...unless the token was on the wire before the library's start.
    h.push(Event::Sighting {
        proxy: 0,
        token: "ta".into(),
        at: start - 5,
    });
    assert_eq!(
        check(&h).stale_validity.len(),
        2,
        "{}",
        check(&h).describe(10)
    );
}

#[test]
fn broken_liveness_and_ghosts_are_caught() {
    let h = vec![
        meta(),
        Event::Liveness {
            res: "r".into(),
            healed_at: 0,
            acquired_at: Some(500 * MS),
            bound_ns: 400 * MS,
        },
        Event::Ghost {
            node: 0,
            key: "k".into(),
            ttl_ns: 100 * MS,
            set_after: 0,
            max_pttl_ms: 100,
            last_present: Some(400 * MS),
        },
    ];
    let v = check(&h);
    assert_eq!(v.liveness_ok, Some(false));
    assert_eq!(v.ghost_violations.len(), 1);
}

fn guard_acquire(client: &str, token: &str, t1: u64, valid_until: u64) -> Event {
    Event::Acquire {
        client: client.into(),
        res: "r".into(),
        token: token.into(),
        mode: Mode::Guard,
        t0: t1 - MS,
        t1,
        started: None,
        valid_until,
        ttl_ns: 100 * MS,
        loss_margin_ns: Some(30 * MS),
    }
}

fn holder_write(client: &str, token: &str, check_at: u64, at: u64, read: u64) -> Event {
    Event::HolderWrite {
        client: client.into(),
        res: "r".into(),
        token: token.into(),
        read_at: check_at - 5 * MS,
        read,
        check_at,
        at,
        wrote: read + 1,
        stalled_after_check: at - check_at > 50 * MS,
        ttl_ns: 100 * MS,
    }
}

#[test]
fn a_guard_hold_ends_at_its_deadline_less_the_margin() {
    // a is told "lost" at 1060 (1090 − 30) and the library may release then.
    let h = vec![
        meta(),
        guard_acquire("a", "ta", 1000 * MS, 1090 * MS),
        acquire("b", "tb", 1070 * MS, 1160 * MS),
    ];
    assert!(check(&h).overlaps.is_empty(), "{}", check(&h).describe(10));
    // A lower validity observed later (a shortening renewal) ends it sooner.
    let h = vec![
        meta(),
        guard_acquire("a", "ta", 1000 * MS, 1190 * MS),
        Event::Observe {
            client: "a".into(),
            res: "r".into(),
            token: "ta".into(),
            at: 1040 * MS,
            valid_until: 1090 * MS,
            lost: false,
            ttl_ns: 100 * MS,
        },
        acquire("b", "tb", 1070 * MS, 1160 * MS),
    ];
    let v = check(&h);
    assert!(v.overlaps.is_empty(), "{}", v.describe(10));
    assert_eq!(v.shortened, 1);
}

#[test]
fn a_checked_holder_write_inside_another_hold_is_caught() {
    // a's check passed at 1095 (it did not see its loss), b holds from 1070.
    let h = vec![
        meta(),
        guard_acquire("a", "ta", 1000 * MS, 1090 * MS),
        acquire("b", "tb", 1070 * MS, 1160 * MS),
        holder_write("b", "tb", 1075 * MS, 1075 * MS + 10, 0),
        holder_write("a", "ta", 1095 * MS, 1095 * MS + 10, 0),
        release("b", "tb", 1100 * MS),
        fin(1),
    ];
    let v = check(&h);
    assert_eq!(v.holder_overlaps.len(), 1, "{}", v.describe(10));
    assert_eq!(v.holder_lost_updates, 1, "{}", v.describe(10));
    assert_eq!(v.late_writes.len(), 1, "{}", v.describe(10));
    assert!(v.caught() && !v.passed());
}

#[test]
fn a_write_stalled_after_its_check_is_counted_apart() {
    // a checked at 1040, stalled 60 ms, wrote at 1100 inside b's hold: the
    // overlap and the broken link it causes (b's write) are the stall's.
    let h = vec![
        meta(),
        guard_acquire("a", "ta", 1000 * MS, 1090 * MS),
        acquire("b", "tb", 1070 * MS, 1160 * MS),
        holder_write("b", "tb", 1098 * MS, 1105 * MS, 0),
        holder_write("a", "ta", 1040 * MS, 1100 * MS, 0),
        release("b", "tb", 1110 * MS),
        fin(1),
    ];
    let v = check(&h);
    assert_eq!(v.stalled_after_check, 1);
    assert_eq!(v.stalled_overlapping, 1);
    assert!(v.holder_overlaps.is_empty(), "{}", v.describe(10));
    assert_eq!(v.holder_lost_updates, 0, "{}", v.describe(10));
    assert!(v.passed(), "{}", v.describe(10));
}

#[test]
fn instants_map_onto_the_monotonic_clock() {
    let a = now_ns();
    let i = instant_ns(Instant::now());
    let b = now_ns();
    let e = calibration_error_ns();
    assert!(a <= i + e && i <= b + e, "{a} {i} {b} ±{e}");
}

#[test]
fn histories_round_trip_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.jsonl");
    let h = vec![
        meta(),
        acquire("a", "ta", 1000 * MS, 1090 * MS),
        Event::Fault {
            kind: FaultKind::Clock,
            node: Some(1),
            at: 5,
            detail: "forward".into(),
        },
    ];
    write_jsonl(&path, &h).unwrap();
    assert_eq!(read_jsonl(&path).unwrap(), h);
}
