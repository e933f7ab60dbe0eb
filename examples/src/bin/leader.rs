//! One leader among replicas: every replica campaigns for the election
//! `leader-demo`; the one that leads runs the loop (here: prints a tick a
//! second, with its term), the others wait. Stop the leader with Ctrl-C (it
//! resigns: another leads a round trip later) or `kill -9` it (another leads
//! about one TTL later, once its key expired).
//!
//! ```sh
//! export REDLOCK_NODES=redis://127.0.0.1:6379,redis://127.0.0.1:6380,redis://127.0.0.1:6381
//! cargo run -p redlock-examples --bin leader -- --id a    # in three terminals: a, b, c
//! cargo run -p redlock-examples --bin leader -- --self-test
//! ```
//!
//! Without `REDLOCK_NODES` a replica starts three local `redis-server`
//! processes of its own, which no other replica shares: give every replica the
//! same `REDLOCK_NODES`. Each replica also prints who leads, as an observer
//! sees it (`Redlock::observe`).
//!
//! `--self-test` starts three local nodes and three replicas (this program,
//! as child processes), then checks: one leader at a time as the observer
//! sees it, a takeover within a second of a resignation (SIGTERM) and within
//! a TTL and a second of a `kill -9`, and terms that only grow.

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redlock_core::{CampaignOptions, FencingMode, Leader, Redlock};
use redlock_examples::{Args, BoxError, Checks, Nodes, init_tracing};
use tokio::signal::unix::{SignalKind, signal};

const ELECTION: &str = "leader-demo";
const TTL: Duration = Duration::from_secs(2);

fn handle(nodes: &Nodes) -> Result<Redlock, redlock_core::Error> {
    Redlock::builder()
        .urls(nodes.urls().iter().cloned())
        .node_timeout(Duration::from_millis(100))
        .fencing(FencingMode::Hybrid)
        .build()
}

/// A replica: campaigns, leads until lost or stopped (SIGINT/SIGTERM resign),
/// campaigns again after a loss.
async fn replica(redlock: Redlock, id: String) -> Result<(), BoxError> {
    let mut leaders = redlock.observe(ELECTION)?;
    tokio::spawn({
        let id = id.clone();
        async move {
            while let Some(l) = leaders.next().await {
                match l {
                    Some(l) => println!("[{id}] observer: {} leads in term {}", l.id, l.term),
                    None => println!("[{id}] observer: nobody leads"),
                }
            }
        }
    });
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let options = CampaignOptions::new(TTL).id(id.clone());
    let election = redlock.election(ELECTION)?;
    loop {
        let leadership = tokio::select! {
            l = election.campaign_with(&options) => l?,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        println!("[{id}] leading in term {}", leadership.term());
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => println!("[{id}] tick (term {})", leadership.term()),
                () = leadership.lost() => {
                    println!("[{id}] leadership lost; campaigning again");
                    break;
                }
                _ = term.recv() => {
                    leadership.resign().await?;
                    println!("[{id}] resigned");
                    return Ok(());
                }
                _ = int.recv() => {
                    leadership.resign().await?;
                    println!("[{id}] resigned");
                    return Ok(());
                }
            }
        }
    }
}

/// The replicas of the self-test, killed at the end (on panic too).
struct Children(Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (bounded) for the observer's next leader other than `old` (by term);
/// `Ok(None)` if none came within `bound`.
async fn next_leader(
    leaders: &mut redlock_core::Observer,
    old: Option<&Leader>,
    bound: Duration,
) -> Option<Leader> {
    let end = Instant::now() + bound;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, leaders.next()).await {
            Ok(Some(Some(l))) if old.is_none_or(|o| o.term != l.term) => return Some(l),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

async fn self_test(nodes: &Nodes) -> Result<ExitCode, BoxError> {
    let exe = std::env::current_exe()?;
    let urls = nodes.urls().join(",");
    let mut children = Children(Vec::new());
    for id in ["a", "b", "c"] {
        let child = Command::new(&exe)
            .args(["--id", id])
            .env("REDLOCK_NODES", &urls)
            .stdout(Stdio::null())
            .spawn()?;
        children.0.push((id.to_owned(), child));
    }
    let redlock = handle(nodes)?;
    let mut leaders = redlock.observe_every(ELECTION, Duration::from_millis(200))?;
    let mut checks = Checks::default();
    let first = next_leader(&mut leaders, None, Duration::from_secs(20)).await;
    checks.check(first.is_some(), "a replica leads");
    let Some(first) = first else {
        return Ok(checks.finish());
    };

    // SIGTERM: the leader resigns.
    let pid = |id: &str, children: &Children| {
        children
            .0
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, c)| c.id())
    };
    let stopped = Instant::now();
    if let Some(p) = pid(&first.id, &children) {
        Command::new("kill")
            .args(["-TERM", &p.to_string()])
            .status()?;
    }
    let second = next_leader(&mut leaders, Some(&first), TTL * 5).await;
    let took = stopped.elapsed();
    println!("takeover after a resignation: {took:?}");
    checks.check(
        second.as_ref().is_some_and(|s| s.id != first.id) && took < Duration::from_secs(1),
        "another replica leads within a second of a resignation",
    );
    let Some(second) = second else {
        return Ok(checks.finish());
    };

    // kill -9: nothing is released; the key expires.
    let killed = Instant::now();
    if let Some((_, c)) = children.0.iter_mut().find(|(i, _)| *i == second.id) {
        c.kill()?;
        c.wait()?;
    }
    let third = next_leader(&mut leaders, Some(&second), TTL * 5).await;
    let took = killed.elapsed();
    println!("takeover after kill -9 (TTL {TTL:?}): {took:?}");
    checks.check(
        third.as_ref().is_some_and(|t| t.id != second.id) && took < TTL + Duration::from_secs(1),
        "another replica leads within a TTL and a second of a kill -9",
    );
    checks.check(
        third
            .as_ref()
            .is_some_and(|t| first.term < second.term && second.term < t.term),
        "terms grow",
    );
    Ok(checks.finish())
}

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    let args = Args::from_env();
    let nodes = Nodes::from_env_or_local();
    if args.flag("--self-test") {
        println!("{}", nodes.describe());
        return match self_test(&nodes).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("leader: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let id = match args.value::<String>("--id") {
        Ok(Some(id)) => id,
        Ok(None) => format!("pid-{}", std::process::id()),
        Err(e) => {
            eprintln!("leader: {e}");
            return ExitCode::from(2);
        }
    };
    println!("[{id}] {}", nodes.describe());
    let run = async { replica(handle(&nodes)?, id).await };
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leader: {e}");
            ExitCode::FAILURE
        }
    }
}
