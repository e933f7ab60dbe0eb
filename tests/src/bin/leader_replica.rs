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
    // The node timeout the test derives from the TTL (see
    // `redlock_tests::timing`); 100 ms without one.
    let node_timeout = std::env::args()
        .skip_while(|a| a != "--node-timeout-ms")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_millis(100), Duration::from_millis);
    let redlock = Redlock::builder()
        .urls(nodes.split(','))
        .node_timeout(node_timeout)
        .fencing(FencingMode::Hybrid)
        .build()
        .expect("a handle over the nodes");
    let options = CampaignOptions::new(ttl).id(id.clone());
    let election = redlock.election(&name).expect("a fenced handle");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        // A campaign that fails (too few nodes answered in time on a loaded
        // machine) is the library's honest answer: campaign again.
        let leadership = match election.campaign_with(&options).await {
            Ok(leadership) => leadership,
            Err(e) => {
                eprintln!("leader_replica {id}: campaign: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        println!("LEAD {id} {} {}", leadership.term(), now_us());
        let order = tokio::select! {
            () = leadership.lost() => {
                println!("LOST {id} {}", now_us());
                continue;
            }
            line = lines.next_line() => line.ok().flatten().unwrap_or_else(|| "quit".into()),
        };
        println!("RESIGN {id} {}", now_us());
        // A resignation a quorum did not confirm leaves the keys to expire
        // with their TTL: the next leader then comes later, never sooner.
        if let Err(e) = leadership.resign().await {
            eprintln!("leader_replica {id}: resign: {e}");
        }
        if order.trim() == "quit" {
            return;
        }
    }
}
