//! Re-checks fault-suite histories: runs every checker of
//! `redlock_tests::history` (the holder-view checker of `holder_write` events
//! included) over JSON-lines files (or every `*.jsonl` under the
//! given directories), prints one line per history and the suite's summary line,
//! and exits 1 if a history failed (a violation, or a negative control that was
//! not caught).
//!
//! ```text
//! cargo run -p redlock-tests --bin fault_recheck -- target/tmp/fault-histories/<seed>
//! ```

use std::path::{Path, PathBuf};

use redlock_tests::history::{Event, Summary, check, read_jsonl};

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            collect(&e, out);
        }
    } else if p.extension().is_some_and(|e| e == "jsonl") {
        out.push(p.to_path_buf());
    }
}

fn main() {
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        collect(Path::new(&a), &mut files);
    }
    if files.is_empty() {
        eprintln!("usage: fault_recheck HISTORY.jsonl|DIR...");
        std::process::exit(2);
    }
    let mut summary = Summary::default();
    let mut failed = false;
    for f in &files {
        let events = match read_jsonl(f) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("{}: {e}", f.display());
                failed = true;
                continue;
            }
        };
        if let Some(Event::Meta(m)) = events.iter().find(|e| matches!(e, Event::Meta(_))) {
            summary.seed = m.seed;
        }
        let v = check(&events);
        summary.add(&v);
        println!(
            "{}: scenario={} events={} acquisitions={} writes={} overlaps={} lost_updates={} \
             stale_validity={} late_writes={} ghosts={}/{} liveness={} holder_writes={} \
             holder_overlaps={} holder_lost_updates={} stalled_after_check={} -> {}",
            f.display(),
            v.scenario,
            events.len(),
            v.acquisitions,
            v.writes,
            v.overlaps.len(),
            v.lost_updates,
            v.stale_validity.len(),
            v.late_writes.len(),
            v.ghost_violations.len(),
            v.ghosts_checked,
            v.liveness_ok.map_or("n/a".to_owned(), |b| b.to_string()),
            v.holder_writes,
            v.holder_overlaps.len(),
            v.holder_lost_updates,
            v.stalled_after_check,
            match (v.passed(), v.expect_violation) {
                (true, true) => "negative control caught",
                (true, false) => "ok",
                (false, true) => "NEGATIVE CONTROL NOT CAUGHT",
                (false, false) => "VIOLATION",
            }
        );
        if !v.passed() || v.expect_violation {
            print!("{}", v.describe(5));
        }
        failed |= !v.passed();
    }
    println!("{}", summary.line());
    if failed {
        std::process::exit(1);
    }
}
