//! Five campaigning processes: exclusivity, terms, takeover after a
//! resignation and after `kill -9`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use redlock_core::{FencingMode, Leader, Redlock};
use redlock_tests::Cluster;
use redlock_tests::timing;

const REPLICAS: usize = 5;
const TTL: Duration = Duration::from_millis(1500);
/// The node timeout `leader_replica` gives its handle.
const REPLICA_NODE_TIMEOUT: Duration = Duration::from_millis(100);
const ELECTION: &str = "leader-suite";

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// What a replica said, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    Lead { id: usize, term: u64, at: u128 },
    Resign { id: usize, at: u128 },
    Lost { id: usize, at: u128 },
}

fn parse(line: &str) -> Option<Said> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| w.get(i).and_then(|s| s.parse::<u128>().ok());
    let id = w.get(1)?.strip_prefix('r')?.parse().ok()?;
    match *w.first()? {
        "LEAD" => Some(Said::Lead {
            id,
            term: u64::try_from(num(2)?).ok()?,
            at: num(3)?,
        }),
        "RESIGN" => Some(Said::Resign { id, at: num(2)? }),
        "LOST" => Some(Said::Lost { id, at: num(2)? }),
        _ => None,
    }
}

/// The replicas, killed with SIGKILL at the end (on panic too).
struct Replicas {
    children: Vec<Option<(Child, ChildStdin)>>,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for (child, _) in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start(nodes: &str, said: &mpsc::Sender<Said>) -> Replicas {
    let mut children = Vec::new();
    for i in 0..REPLICAS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leader_replica"))
            .args(["--nodes", nodes, "--name", ELECTION, "--id"])
            .arg(format!("r{i}"))
            .args(["--ttl-ms", &TTL.as_millis().to_string()])
            .args([
                "--node-timeout-ms",
                &timing::patient_node_timeout_for(TTL)
                    .as_millis()
                    .to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a leader_replica");
        let stdin = child.stdin.take().expect("its stdin");
        let stdout = child.stdout.take().expect("its stdout");
        let tx = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match parse(&line) {
                    Some(s) => {
                        if tx.send(s).is_err() {
                            return;
                        }
                    }
                    None => eprintln!("replica r{i}: {line}"),
                }
            }
        });
        children.push(Some((child, stdin)));
    }
    Replicas { children }
}

/// The next line any replica says, within `bound`.
fn next(rx: &mpsc::Receiver<Said>, log: &mut Vec<Said>, bound: Duration) -> Said {
    let s = rx
        .recv_timeout(bound)
        .unwrap_or_else(|_| panic!("no replica said anything within {bound:?}; so far {log:?}"));
    log.push(s.clone());
    s
}

/// The next `LEAD`, within `bound`; other lines are logged on the way.
fn next_lead(rx: &mpsc::Receiver<Said>, log: &mut Vec<Said>, bound: Duration) -> (usize, u128) {
    let end = Instant::now() + bound;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if let Said::Lead { id, at, .. } = next(rx, log, left) {
            return (id, at);
        }
    }
}

/// One leader at a time and terms increasing, judged from the intervals the
/// replicas reported: a leadership starts at its `LEAD` and ends at the same
/// replica's next `RESIGN` or `LOST`, or when the test killed it.
fn judge(log: &[Said], kills: &[(usize, u128)]) -> usize {
    let mut intervals: Vec<(u128, u128, usize, u64)> = Vec::new();
    for (i, s) in log.iter().enumerate() {
        let Said::Lead { id, term, at } = *s else {
            continue;
        };
        let end = log[i + 1..]
            .iter()
            .find_map(|e| match *e {
                Said::Resign { id: r, at } | Said::Lost { id: r, at } if r == id => Some(at),
                Said::Lead { id: r, .. } if r == id => Some(0),
                _ => None,
            })
            .or_else(|| kills.iter().find(|k| k.0 == id && k.1 >= at).map(|k| k.1))
            .unwrap_or(u128::MAX);
        assert_ne!(end, 0, "r{id} led twice without an end in between: {log:?}");
        intervals.push((at, end, id, term));
    }
    intervals.sort();
    for w in intervals.windows(2) {
        let ((_, end_a, a, term_a), (start_b, _, b, term_b)) = (w[0], w[1]);
        assert!(
            start_b >= end_a,
            "r{b} led from {start_b} while r{a} led until {end_a}: {intervals:?}"
        );
        assert!(
            term_b > term_a,
            "term {term_b} after {term_a}: {intervals:?}"
        );
    }
    intervals.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_one_leader_at_a_time_and_takeover_bounds() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let observer = fenced(&cluster);
    let every = Duration::from_millis(200);
    let mut leaders = observer.observe_every(ELECTION, every).unwrap();
    let seen: Arc<Mutex<Vec<Leader>>> = Arc::default();
    let observed = Arc::clone(&seen);
    let watcher = tokio::spawn(async move {
        while let Some(l) = leaders.next().await {
            observed.lock().unwrap().extend(l);
        }
    });

    let (tx, rx) = mpsc::channel();
    let mut replicas = start(&nodes, &tx);
    let mut log = Vec::new();
    // Anything the replicas say next comes within a TTL (a dead leader's
    // keys expire), a retry's delay (a tenth of the TTL) and two calls.
    let bound = timing::liveness(TTL * 2 + REPLICA_NODE_TIMEOUT * 2);
    let (mut leader, _) = next_lead(&rx, &mut log, bound);

    // Three resignations: the next leader within a round trip (plus the
    // scheduling of two processes on a loaded machine).
    let mut resign_ms = Vec::new();
    for _ in 0..3 {
        let (_, stdin) = replicas.children[leader].as_mut().expect("alive");
        writeln!(stdin, "resign").unwrap();
        // The replicas' lines come through separate pipes: the next
        // leader's `LEAD` may be read before the resignation's `RESIGN`.
        let mut early = None;
        let resigned_at = loop {
            match next(&rx, &mut log, bound) {
                Said::Resign { id, at } if id == leader => break at,
                Said::Lead { id, at, .. } => early = Some((id, at)),
                _ => {}
            }
        };
        let (next_leader, at) = match early {
            Some(lead) => lead,
            None => next_lead(&rx, &mut log, bound),
        };
        resign_ms.push((at.saturating_sub(resigned_at)) as f64 / 1000.0);
        leader = next_leader;
    }

    // Two kills: the next leader within about a TTL.
    let mut kill_ms = Vec::new();
    let mut kills = Vec::new();
    for _ in 0..2 {
        let (mut child, _) = replicas.children[leader].take().expect("alive");
        let killed_at = now_us();
        child.kill().unwrap();
        child.wait().unwrap();
        kills.push((leader, killed_at));
        let (next_leader, at) = next_lead(&rx, &mut log, bound);
        kill_ms.push((at.saturating_sub(killed_at)) as f64 / 1000.0);
        leader = next_leader;
    }
    // The last leader quits; the observer must see the next one.
    let (_, stdin) = replicas.children[leader].as_mut().expect("alive");
    writeln!(stdin, "quit").unwrap();
    let (last, _) = next_lead(&rx, &mut log, bound);
    let last_term = log.iter().rev().find_map(|s| match *s {
        Said::Lead { id, term, .. } if id == last => Some(term),
        _ => None,
    });
    // The observer's next read: its interval and a call.
    let read = timing::liveness(every + timing::PATIENT_NODE_TIMEOUT);
    let shown = redlock_tests::util::eventually(read, || {
        seen.lock()
            .unwrap()
            .last()
            .is_some_and(|l| Some(l.term.get()) == last_term && l.id == format!("r{last}"))
    })
    .await;
    assert!(
        shown,
        "the observer did not see r{last}: {:?}",
        seen.lock().unwrap()
    );
    drop(replicas);
    // Whatever was said before the kill still counts.
    log.extend(rx.try_iter());

    let leaderships = judge(&log, &kills);
    println!(
        "leader takeover after resignation (ms): {resign_ms:?}; after kill -9 (ms, TTL {} ms): {kill_ms:?}; {leaderships} leaderships",
        TTL.as_millis()
    );
    // After a resignation: the release and the woken campaign's attempt.
    let after_resign = timing::liveness(REPLICA_NODE_TIMEOUT * 2);
    for ms in &resign_ms {
        assert!(
            *ms < after_resign.as_secs_f64() * 1000.0,
            "takeover after resignation took {ms} ms (bound {after_resign:?})"
        );
    }
    // After a kill: the TTL, a retry's delay and the attempt.
    let after_kill = timing::liveness(TTL + TTL / 10 + REPLICA_NODE_TIMEOUT);
    for ms in &kill_ms {
        assert!(
            *ms <= after_kill.as_secs_f64() * 1000.0,
            "takeover after kill -9 took {ms} ms (TTL {TTL:?}, bound {after_kill:?})"
        );
    }

    // The observer saw leaders that led, in the order they led.
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    let led: Vec<(String, u64)> = log
        .iter()
        .filter_map(|s| match *s {
            Said::Lead { id, term, .. } => Some((format!("r{id}"), term)),
            _ => None,
        })
        .collect();
    for w in seen.windows(2) {
        assert!(
            w[1].term > w[0].term,
            "observed terms out of order: {seen:?}"
        );
    }
    for l in &seen {
        assert!(
            led.contains(&(l.id.clone(), l.term.get())),
            "observed {l:?}, which no replica reported leading: {led:?}"
        );
    }
    println!("observer saw {} of {} leaderships", seen.len(), led.len());
}

/// A fenced handle whose calls are all answered: no test here is about a
/// slow node.
fn fenced(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_is_woken_by_the_release_not_its_poll() {
    let cluster = Cluster::start(3);
    // A TTL the patient node timeout fits in (the loss margin).
    let ttl = timing::PATIENT_NODE_TIMEOUT * 2;
    let (a, b, watcher) = (fenced(&cluster), fenced(&cluster), fenced(&cluster));
    // Without fencing there is no term: refused when the election is made.
    let unfenced = Redlock::from_urls(cluster.urls()).unwrap();
    let refused = unfenced.election("wake");
    assert!(
        matches!(refused, Err(redlock_core::Error::InvalidConfig(_))),
        "{refused:?}"
    );

    let first = a
        .election("wake")
        .unwrap()
        .campaign_with(&redlock_core::CampaignOptions::new(ttl).id("a"))
        .await
        .unwrap();
    // The leader's view of its lease: positive while it leads, within the TTL.
    let remaining = first.remaining();
    assert!(
        !first.is_lost() && remaining > Duration::ZERO && remaining <= ttl,
        "remaining {remaining:?} of a {ttl:?} leadership"
    );
    // An interval far longer than the test: only a release message can make
    // the observer read again in time.
    let every = Duration::from_secs(30);
    // The observer's next read by its interval comes no sooner than this.
    let next_poll = Instant::now() + every;
    let mut leaders = watcher.observe_every("wake", every).unwrap();
    let first_read = timing::liveness(timing::PATIENT_NODE_TIMEOUT);
    let seen = tokio::time::timeout(first_read, leaders.next())
        .await
        .expect("the first state")
        .flatten()
        .expect("a leader");
    assert_eq!((seen.id.as_str(), seen.term), ("a", first.term()));
    assert_eq!(seen.fingerprint, first.fingerprint());
    // Control: an observer that does not listen for releases (its handle's
    // wake-ups are off) reads only at its interval.
    let deaf = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(timing::PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .wake_on_release(false)
        .build()
        .unwrap();
    let deaf_next_poll = Instant::now() + every;
    let mut polling = deaf.observe_every("wake", every).unwrap();
    let polled = tokio::time::timeout(first_read, polling.next()).await;
    assert!(
        matches!(polled, Ok(Some(Some(ref l))) if l.id == "a"),
        "{polled:?}"
    );
    let follower = tokio::spawn(async move {
        b.election("wake")?
            .campaign_with(&redlock_core::CampaignOptions::new(ttl).id("b"))
            .await
    });
    // Part of the scenario, not a wait for anything: the follower is
    // likely waiting by now (its attempt sets the waiters flag too). Nothing
    // below depends on it: either way the next leader is b.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned = Instant::now();
    first.resign().await.unwrap();
    // Seen before the observer's interval would have made it read: only the
    // release message can have woken it.
    let next = tokio::time::timeout_at(next_poll.into(), async {
        loop {
            if let Some(Some(l)) = leaders.next().await {
                return l;
            }
        }
    })
    .await
    .expect("the observer saw the next leader before its 30 s poll interval ended");
    let took = resigned.elapsed();
    let second = follower.await.unwrap().unwrap();
    println!("observer saw the next leader {took:?} after the resignation");
    // The control hears nothing as long as the listening observer took to
    // hear of it (at least 1 s), up to its own interval's end.
    let listen = took.max(Duration::from_secs(1));
    let until = (Instant::now() + listen).min(deaf_next_poll);
    let late = tokio::time::timeout_at(until.into(), polling.next()).await;
    assert!(late.is_err(), "the polling observer read early: {late:?}");
    assert_eq!((next.id.as_str(), next.term), ("b", second.term()));
    assert!(second.term() > seen.term);
}
