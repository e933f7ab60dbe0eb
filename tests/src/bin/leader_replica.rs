//! One replica of the leader-election suite (`tests/tests/leader/`): campaigns
//! for an election, says on stdout when it leads and when it stops, and takes
//! orders on stdin, so that the parent can run several in separate OS
//! processes, resign one, or `kill -9` it.
//!
//! ```text
//! leader_replica --nodes URL,URL,.. --name ELECTION --id ID --ttl-ms MS
//! ```
//!
//! Lines out (times in µs since the Unix epoch, comparable between processes
//! of one machine; the library itself never reads the wall clock):
//!
//! - `LEAD id term at` once `campaign` returned;
//! - `RESIGN id at` just before a resignation starts (the end of the
//!   replica's leadership as far as it acts on it);
//! - `LOST id at` when the leadership was lost.
//!
//! Lines in: `resign` (resign, then campaign again), `quit` (resign and
//! exit).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redlock_core::{CampaignOptions, FencingMode, Redlock};
use tokio::io::{AsyncBufReadExt, BufReader};

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn arg(name: &str) -> String {
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == name
            && let Some(v) = it.next()
        {
            return v;
        }
    }
    eprintln!("leader_replica: {name} is missing");
    std::process::exit(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = arg("--nodes");
    let name = arg("--name");
    let id = arg("--id");
    let ttl = Duration::from_millis(arg("--ttl-ms").parse().expect("--ttl-ms is a number"));
    let redlock = Redlock::builder()
        .urls(nodes.split(','))
        .node_timeout(Duration::from_millis(100))
        .fencing(FencingMode::Hybrid)
        .build()
        .expect("a handle over the nodes");
    let options = CampaignOptions::new(ttl).id(id.clone());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let leadership = redlock
            .campaign_with(&name, &options)
            .await
            .expect("campaign");
        println!("LEAD {id} {} {}", leadership.term(), now_us());
        let order = tokio::select! {
            () = leadership.lost() => {
                println!("LOST {id} {}", now_us());
                continue;
            }
            line = lines.next_line() => line.ok().flatten().unwrap_or_else(|| "quit".into()),
        };
        println!("RESIGN {id} {}", now_us());
        leadership.resign().await.expect("resign");
        if order.trim() == "quit" {
            return;
        }
    }
}
