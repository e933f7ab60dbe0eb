//! `redlock status KEY`: each node's view of one lock, as a table or JSON.

use std::process::ExitCode;
use std::time::Duration;

use redlock_core::{Inspection, Verdict};
use serde_json::json;

use crate::{code, connect, fail};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The resource.
    key: String,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(nodes: &[String], node_timeout: Duration, args: Args) -> ExitCode {
    let redlock = match connect(nodes, node_timeout, None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let seen = match redlock.inspect(&args.key).await {
        Ok(s) => s,
        Err(e) => return fail(code::USAGE, e),
    };
    if args.json {
        println!("{}", to_json(&seen));
    } else {
        print!("{}", table(&seen));
    }
    ExitCode::SUCCESS
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
