//! `redlock status KEY`: each node's view of one lock, as a table or JSON;
//! with `--permits N` of a semaphore's N permit slots (as `redlock run
//! --permits N` takes them), with `--rw` of a read/write lock .

use std::process::ExitCode;
use std::time::Duration;

use redlock_core::{Inspection, PermitsInspection, RwInspection, RwVerdict, Verdict};
use serde_json::json;

use crate::{code, connect, fail};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The resource.
    key: String,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The key is a semaphore of N permits (`redlock run --permits N`): show
    /// each permit slot and how many are held.
    #[arg(long, value_name = "N", conflicts_with = "rw")]
    permits: Option<u32>,
    /// The key is a read/write lock: show the writer, the readers and a
    /// waiting writer on each node.
    #[arg(long)]
    rw: bool,
}

pub(crate) async fn run(nodes: &[String], node_timeout: Duration, args: Args) -> ExitCode {
    let redlock = match connect(nodes, node_timeout, None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let shown = match (args.permits, args.rw) {
        (Some(permits), _) => redlock
            .inspect_permits(&args.key, permits)
            .await
            .map(|seen| permits_out(&seen, args.json)),
        (None, true) => redlock
            .inspect_rw(&args.key)
            .await
            .map(|seen| rw_out(&seen, args.json)),
        (None, false) => redlock.inspect(&args.key).await.map(|seen| {
            if args.json {
                format!("{}\n", to_json(&seen))
            } else {
                table(&seen)
            }
        }),
    };
    match shown {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(code::USAGE, e),
    }
}

fn ms(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn verdict_json(v: &Verdict) -> serde_json::Value {
    match v {
        Verdict::Free => json!({"state": "free"}),
        Verdict::Held {
            holder,
            nodes,
            validity,
        } => {
            json!({"state": "held", "holder": holder, "nodes": nodes, "validity_ms": ms(Some(*validity))})
        }
        Verdict::Inconsistent { reason } => json!({"state": "inconsistent", "reason": reason}),
        Verdict::Unknown { answered } => json!({"state": "unknown", "answered": answered}),
        _ => json!({"state": "unknown"}),
    }
}

fn to_json(seen: &Inspection) -> serde_json::Value {
    let nodes: Vec<_> = seen
        .nodes
        .iter()
        .map(|n| match &n.state {
            Ok(s) => json!({
                "node": &*n.node,
                "exists": s.exists,
                "holder": s.holder,
                "foreign_type": s.foreign_type,
                "pttl_ms": ms(s.pttl),
                "fencing_counter": s.fencing_counter,
            }),
            Err(e) => json!({"node": &*n.node, "error": e.to_string()}),
        })
        .collect();
    json!({
        "resource": seen.resource,
        "key": seen.key,
        "quorum": seen.quorum,
        "verdict": verdict_json(&seen.verdict),
        "nodes": nodes,
    })
}

fn verdict_line(v: &Verdict) -> String {
    match v {
        Verdict::Free => "free".into(),
        Verdict::Held {
            holder,
            nodes,
            validity,
        } => format!(
            "held by {holder} on {nodes} node(s), {} ms left on a quorum",
            validity.as_millis()
        ),
        Verdict::Inconsistent { reason } => format!("inconsistent: {reason}"),
        Verdict::Unknown { answered } => format!("unknown: only {answered} node(s) answered"),
        _ => "unknown".into(),
    }
}

fn table(seen: &Inspection) -> String {
    let mut out = format!(
        "key {:?}  quorum {}/{}  {}\n",
        seen.key,
        seen.quorum,
        seen.nodes.len(),
        verdict_line(&seen.verdict)
    );
    let width = seen
        .nodes
        .iter()
        .map(|n| n.node.len())
        .max()
        .unwrap_or(4)
        .max(4);
    out.push_str(&format!(
        "{:<width$}  {:<6}  {:<16}  {:>10}  {:>8}\n",
        "NODE", "EXISTS", "HOLDER", "PTTL_MS", "FENCE"
    ));
    for n in &seen.nodes {
        match &n.state {
            Ok(s) => out.push_str(&format!(
                "{:<width$}  {:<6}  {:<16}  {:>10}  {:>8}\n",
                n.node,
                if s.exists { "yes" } else { "no" },
                s.holder
                    .as_deref()
                    .or(s.foreign_type.as_deref())
                    .unwrap_or("-"),
                ms(s.pttl).map_or_else(|| "-".into(), |v| v.to_string()),
                s.fencing_counter
                    .map_or_else(|| "-".into(), |v| v.to_string()),
            )),
            Err(e) => out.push_str(&format!("{:<width$}  error: {e}\n", n.node)),
        }
    }
    out
}

/// Each node's count, for `--json`.
fn counts_json(seen: &PermitsInspection) -> Vec<serde_json::Value> {
    seen.counts
        .iter()
        .map(|n| match &n.state {
            Ok(c) => json!({"node": &*n.node, "count": c}),
            Err(e) => json!({"node": &*n.node, "error": e.to_string()}),
        })
        .collect()
}

/// `--permits N`: the count, then each slot as a mutex's status.
fn permits_out(seen: &PermitsInspection, json: bool) -> String {
    let v = &seen.verdict;
    if json {
        let slots: Vec<_> = seen.slots.iter().map(to_json).collect();
        let out = json!({
            "resource": seen.resource,
            "key": seen.key,
            "permits": seen.permits,
            "quorum": seen.quorum,
            "verdict": {"held": v.held, "free": v.free, "unclear": v.unclear},
            "counts": counts_json(seen),
            "slots": slots,
        });
        return format!("{out}\n");
    }
    let mut out = format!(
        "key {:?}  quorum {}/{}  {} of {} permit(s) held, {} free, {} unclear\n",
        seen.key,
        seen.quorum,
        seen.slots.first().map_or(0, |s| s.nodes.len()),
        v.held,
        seen.permits,
        v.free,
        v.unclear
    );
    let counts: Vec<String> = seen
        .counts
        .iter()
        .map(|n| match &n.state {
            Ok(Some(c)) => format!("{}={c}", n.node),
            Ok(None) => format!("{}=-", n.node),
            Err(e) => format!("{}=? ({e})", n.node),
        })
        .collect();
    out.push_str(&format!("count kept by the nodes: {}\n", counts.join("  ")));
    let asked = seen.permits.to_string();
    if seen
        .counts
        .iter()
        .any(|n| matches!(&n.state, Ok(Some(c)) if *c != asked))
    {
        out.push_str(&format!(
            "WARNING: the holders use another count than --permits {asked}\n"
        ));
    }
    for (slot, s) in seen.slots.iter().enumerate() {
        out.push_str(&format!("\nslot {slot}  "));
        out.push_str(&table(s));
    }
    out
}

fn rw_verdict_json(v: &RwVerdict) -> serde_json::Value {
    match v {
        RwVerdict::Free => json!({"state": "free"}),
        RwVerdict::Written {
            holder,
            nodes,
            validity,
        } => {
            json!({"state": "written", "holder": holder, "nodes": nodes, "validity_ms": ms(Some(*validity))})
        }
        RwVerdict::Read { readers, nodes } => {
            json!({"state": "read", "readers": readers, "nodes": nodes})
        }
        RwVerdict::Inconsistent { reason } => json!({"state": "inconsistent", "reason": reason}),
        RwVerdict::Unknown { answered } => json!({"state": "unknown", "answered": answered}),
        _ => json!({"state": "unknown"}),
    }
}

fn rw_verdict_line(v: &RwVerdict) -> String {
    match v {
        RwVerdict::Free => "free".into(),
        RwVerdict::Written {
            holder,
            nodes,
            validity,
        } => format!(
            "written by {holder} on {nodes} node(s), {} ms left on a quorum",
            validity.as_millis()
        ),
        RwVerdict::Read { readers, nodes } => {
            format!("read by {readers} reader(s) on a quorum, readers on {nodes} node(s)")
        }
        RwVerdict::Inconsistent { reason } => format!("inconsistent: {reason}"),
        RwVerdict::Unknown { answered } => format!("unknown: only {answered} node(s) answered"),
        _ => "unknown".into(),
    }
}

fn dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// `--rw`: the writer, the readers and a waiting writer on each node.
fn rw_out(seen: &RwInspection, json: bool) -> String {
    if json {
        let nodes: Vec<_> = seen
            .nodes
            .iter()
            .map(|n| match &n.state {
                Ok(s) => json!({
                    "node": &*n.node,
                    "writer": s.writer.holder,
                    "foreign_type": s.writer.foreign_type,
                    "writer_pttl_ms": ms(s.writer.pttl),
                    "fencing_counter": s.writer.fencing_counter,
                    "readers": s.readers,
                    "readers_pttl_ms": ms(s.readers_pttl),
                    "intent_pttl_ms": ms(s.intent_pttl),
                    "readers_waiting": s.readers_waiting,
                    "phase_readers": s.phase_readers,
                    "phase_pttl_ms": ms(s.phase_pttl),
                }),
                Err(e) => json!({"node": &*n.node, "error": e.to_string()}),
            })
            .collect();
        let out = json!({
            "resource": seen.resource,
            "key": seen.key,
            "quorum": seen.quorum,
            "verdict": rw_verdict_json(&seen.verdict),
            "writer_waiting": seen.writer_waiting,
            "read_phase_open": seen.read_phase_open,
            "nodes": nodes,
        });
        return format!("{out}\n");
    }
    let mut out = format!(
        "key {:?}  quorum {}/{}  {}",
        seen.key,
        seen.quorum,
        seen.nodes.len(),
        rw_verdict_line(&seen.verdict)
    );
    if seen.writer_waiting > 0 {
        out.push_str(&format!(
            "; a writer waits on {} node(s)",
            seen.writer_waiting
        ));
    }
    if seen.read_phase_open > 0 {
        out.push_str(&format!(
            "; a read phase is open on {} node(s)",
            seen.read_phase_open
        ));
    }
    out.push('\n');
    let width = seen
        .nodes
        .iter()
        .map(|n| n.node.len())
        .max()
        .unwrap_or(4)
        .max(4);
    out.push_str(&format!(
        "{:<width$}  {:<16}  {:>10}  {:>7}  {:>10}  {:>10}  {:>7}  {:>10}  {:>8}\n",
        "NODE",
        "WRITER",
        "PTTL_MS",
        "READERS",
        "READ_MS",
        "INTENT_MS",
        "WAITING",
        "PHASE_MS",
        "FENCE"
    ));
    for n in &seen.nodes {
        match &n.state {
            Ok(s) => out.push_str(&format!(
                "{:<width$}  {:<16}  {:>10}  {:>7}  {:>10}  {:>10}  {:>7}  {:>10}  {:>8}\n",
                n.node,
                s.writer
                    .holder
                    .as_deref()
                    .or(s.writer.foreign_type.as_deref())
                    .unwrap_or("-"),
                dash(ms(s.writer.pttl)),
                s.readers,
                dash(ms(s.readers_pttl)),
                dash(ms(s.intent_pttl)),
                s.readers_waiting,
                dash(ms(s.phase_pttl)),
                dash(s.writer.fencing_counter),
            )),
            Err(e) => out.push_str(&format!("{:<width$}  error: {e}\n", n.node)),
        }
    }
    out
}
