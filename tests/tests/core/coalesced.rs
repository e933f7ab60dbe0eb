//! Coalescing (issue 50) on real servers: a node's batch call over k keys,
//! some free, some held by other tokens, some of foreign types, some read
//! shares and waited-for keys, answers each operation exactly as k separate
//! calls do, and leaves the node in the same state (keys, expiries, readers
//! index, waiters flags, release announcements). And many tasks' locks,
//! whose calls the nodes coalesce, each keep their own outcome.
//!
//! Two servers start from the same state: one gets the operations as
//! separate calls, the other as one batch.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redlock_core::coalesce_check::{CheckOp, alone, batched};
use redlock_core::{NodeError, Redlock};
use redlock_tests::servers::valkey_or_skip;
use redlock_tests::timing::{self, PATIENT_NODE_TIMEOUT};
use redlock_tests::{Cluster, RedisNode};

const TTL_MS: u64 = 60_000;

/// The channel a release of the waited-for key is announced on.
const WAITED_CHANNEL: &str = "redlock:released:0:{waited}";

/// The same starting state on a node: a key held by another token, keys
/// held by ours, foreign types, a read share in its readers index, and a
/// key with its waiters flag.
fn prepare(node: &RedisNode) {
    let ttl = TTL_MS.to_string();
    for args in [
        vec!["SET", "held", "other", "PX", &ttl],
        vec!["SET", "mine", "t", "PX", &ttl],
        vec!["SET", "mine2", "t", "PX", &ttl],
        vec!["HSET", "hash", "f", "v"],
        vec!["RPUSH", "list", "x"],
        vec!["SET", "{r}:redlock-reader:t", "t", "PX", &ttl],
        vec!["SADD", "{r}:redlock-readers", "{r}:redlock-reader:t"],
        vec!["SET", "{r}:redlock-reader:u", "u", "PX", &ttl],
        vec!["SADD", "{r}:redlock-readers", "{r}:redlock-reader:u"],
        vec!["SET", "{q}:redlock-reader:t", "t", "PX", &ttl],
        vec!["SADD", "{q}:redlock-readers", "{q}:redlock-reader:t"],
        vec!["PEXPIRE", "{q}:redlock-readers", "5000"],
        vec!["SET", "waited", "t", "PX", &ttl],
        vec!["SET", "{waited}:redlock-waiters", "1", "PX", &ttl],
    ] {
        node.cmd(&args);
    }
}

/// Every key the operations touch.
const KEYS: &[&str] = &[
    "free",
    "held",
    "mine",
    "mine2",
    "hash",
    "list",
    "nokey",
    "{r}:redlock-reader:t",
    "{r}:redlock-reader:u",
    "{r}:redlock-readers",
    "{q}:redlock-reader:t",
    "{q}:redlock-readers",
    "waited",
    "{waited}:redlock-waiters",
];

fn acquire(key: &str, token: &str) -> CheckOp {
    CheckOp::Acquire {
        key: key.into(),
        token: token.into(),
        ttl_ms: 30_000,
    }
}

fn release(key: &str, token: &str) -> CheckOp {
    CheckOp::Release {
        key: key.into(),
        token: token.into(),
    }
}

fn extend(key: &str, token: &str) -> CheckOp {
    CheckOp::Extend {
        key: key.into(),
        token: token.into(),
        ttl_ms: 45_000,
    }
}

fn renew(key: &str, token: &str) -> CheckOp {
    CheckOp::Renew {
        key: key.into(),
        token: token.into(),
        ttl_ms: 45_000,
    }
}

/// k operations of every kind and outcome, in an order where later ones
/// see what earlier ones did (the free key is taken, then released, then
/// taken by another token).
fn operations() -> Vec<CheckOp> {
    vec![
        acquire("free", "t"),
        acquire("held", "t"),
        acquire("mine", "t"),
        acquire("hash", "t"),
        acquire("list", "t"),
        extend("mine", "t"),
        extend("held", "t"),
        extend("hash", "t"),
        extend("nokey", "t"),
        release("held", "t"),
        release("hash", "t"),
        release("list", "t"),
        release("mine2", "t"),
        release("{r}:redlock-reader:t", "t"),
        release("{r}:redlock-reader:u", "t"),
        release("waited", "t"),
        release("free", "t"),
        acquire("free", "t2"),
        release("nokey", "t"),
        extend("free", "t"),
    ]
}

/// A reply with what depends on when it ran taken out: a holder's `PTTL`
/// in a refused acquire's reply is "some time left" (its exact value
/// differs from one server to the other by the time between the two runs).
fn normal(r: &Result<Value, NodeError>) -> String {
    match r {
        Ok(Value::Array(items)) => {
            let items: Vec<Value> = items
                .iter()
                .map(|v| match v {
                    Value::Int(p) if *p > 0 => Value::Int(1),
                    other => other.clone(),
                })
                .collect();
            format!("Ok({items:?})")
        }
        Ok(v) => format!("Ok({v:?})"),
        // A script error's text may name the script's line.
        Err(NodeError::Server { code, .. }) => format!("Err(Server {code})"),
        Err(e) => format!("Err({e:?})"),
    }
}

/// What a node holds at `key`: its type, a string's value, a set's members,
/// and whether it expires (`PTTL` -1 or -2, or "some").
fn state(node: &RedisNode, key: &str) -> String {
    let ty: String = node.raw(&["TYPE", key]).unwrap();
    let value = match ty.as_str() {
        "string" => format!("{:?}", node.get(key)),
        "set" => {
            let mut m: Vec<String> = node.raw(&["SMEMBERS", key]).unwrap();
            m.sort();
            format!("{m:?}")
        }
        _ => String::new(),
    };
    let pttl = match node.pttl(key) {
        p if p > 0 => "expires".to_owned(),
        p => p.to_string(),
    };
    format!("{key}: {ty} {value} {pttl}")
}

/// A connection to `node` for a subscriber (see [`heard`]).
fn subscriber(node: &RedisNode) -> redis::Connection {
    let client = redis::Client::open(node.url()).unwrap();
    let conn = client.get_connection().unwrap();
    conn.set_read_timeout(Some(timing::liveness(PATIENT_NODE_TIMEOUT)))
        .unwrap();
    conn
}

/// The channel of the next announcement `sub` hears.
fn heard(sub: &mut redis::PubSub<'_>) -> String {
    let msg = sub.get_message().unwrap();
    msg.get_channel_name().to_owned()
}

/// Runs `ops` as separate calls on one server and as one batch on another,
/// both prepared alike, and checks the answers and the states match.
/// Returns the two servers (separate, batched) for the caller's own checks.
async fn same_answers_as_separate_calls(
    bin: Option<&Path>,
    ops: Vec<CheckOp>,
) -> (RedisNode, RedisNode) {
    let start = || match bin {
        Some(b) => RedisNode::start_binary(b, &[], &[]),
        None => RedisNode::start(),
    };
    let (one, other) = (start(), start());
    prepare(&one);
    prepare(&other);
    // Subscribed to the waited-for key's channel while the operations run
    // (a `PubSub` unsubscribes when dropped).
    let (mut conn_one, mut conn_other) = (subscriber(&one), subscriber(&other));
    let mut sub_one = conn_one.as_pubsub();
    let mut sub_other = conn_other.as_pubsub();
    sub_one.subscribe(WAITED_CHANNEL).unwrap();
    sub_other.subscribe(WAITED_CHANNEL).unwrap();
    let separate = alone(&one.url(), &ops, PATIENT_NODE_TIMEOUT).await.unwrap();
    let batch = batched(&other.url(), &ops, PATIENT_NODE_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(separate.len(), ops.len());
    assert_eq!(batch.len(), ops.len());
    for ((op, s), b) in ops.iter().zip(&separate).zip(&batch) {
        assert_eq!(normal(s), normal(b), "{op:?}: alone {s:?}, batched {b:?}");
    }
    // The test means something: each kind of answer is there.
    let shown: Vec<String> = separate.iter().map(normal).collect();
    for want in ["Ok(ok)", "Ok(int(0))", "Ok(int(1))", "Ok([nil", "WrongType"] {
        assert!(
            shown.iter().any(|s| s.contains(want)),
            "no {want} among {shown:?}"
        );
    }
    for key in KEYS {
        assert_eq!(state(&one, key), state(&other, key));
    }
    // The waited-for key's release was announced by both.
    assert_eq!(heard(&mut sub_one), WAITED_CHANNEL);
    assert_eq!(heard(&mut sub_other), WAITED_CHANNEL);
    drop((sub_one, sub_other));
    (one, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_key_as_its_own_call_on_redis() {
    same_answers_as_separate_calls(None, operations()).await;
}

/// Locks and unlocks interleaved, as many tasks' are, where no key's
/// acquire comes before a release or extend of it: the batch sends every
/// release and extend in one script call ahead of the `SET`s, and each
/// still answers as its own call, in the order they came (a key released
/// and then taken by another token is free for it).
fn interleaved_operations() -> Vec<CheckOp> {
    vec![
        release("mine", "t"),
        acquire("free", "t"),
        extend("mine2", "t"),
        acquire("mine", "t2"),
        release("held", "t"),
        acquire("held", "t"),
        extend("hash", "t"),
        acquire("list", "t"),
        release("waited", "t"),
        acquire("nokey", "t"),
        release("{r}:redlock-reader:t", "t"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reordered_batch_answers_each_key_as_its_own_call_on_redis() {
    same_answers_as_separate_calls(None, interleaved_operations()).await;
}

/// The batched renewal's extends (issue 50: the renewal is one user of the
/// batch script) among the coalescer's operations: each answers as a read
/// share's extend alone, and a read share's renewal keeps its readers index
/// alive as long as its key.
fn renewals() -> Vec<CheckOp> {
    vec![
        acquire("free", "t"),
        renew("mine", "t"),
        acquire("held", "t"),
        renew("held", "t"),
        renew("nokey", "t"),
        renew("{q}:redlock-reader:t", "t"),
        renew("{q}:redlock-reader:t", "u"),
        release("mine2", "t"),
        extend("hash", "t"),
        release("waited", "t"),
        renew("free", "t"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_renewals_answers_each_key_as_its_own_call_on_redis() {
    let (one, other) = same_answers_as_separate_calls(None, renewals()).await;
    // The readers index, prepared to expire in 5 s, now lives as long as
    // its renewed reader (45 s), on both.
    for node in [&one, &other] {
        let pttl = node.pttl("{q}:redlock-readers");
        assert!(pttl > 30_000, "readers index PTTL {pttl} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_key_as_its_own_call_on_valkey() {
    let Some(bin) = valkey_or_skip("a_batch_answers_each_key_as_its_own_call_on_valkey") else {
        return;
    };
    same_answers_as_separate_calls(Some(&bin), operations()).await;
}

/// A lock's next turn right after its release: a short wait, bounded by
/// how long a release can take to reach every node.
fn again() -> redlock_core::RetryPolicy {
    redlock_core::RetryPolicy::deadline(timing::settle(PATIENT_NODE_TIMEOUT))
        .with_delay(Duration::from_millis(20))
        .with_jitter(Duration::from_millis(20))
}

/// 64 tasks at once, each locking and releasing its own key (`prefix` and
/// its number) `rounds` times; with `deleted`, each release must have
/// deleted its key on some node.
///
/// Decided at quorum: a node whose last release was still on its way
/// refused a lock's `SET`, and says "not held" to its release, with or
/// without coalescing; and a release is decided by a majority of answers,
/// "not held" among them, so two nodes may still hold the key for a moment
/// (seen once: an acquire refused): the next lock waits briefly (timing
/// rule 4).
async fn each_its_own_key(rl: &Redlock, prefix: &'static str, rounds: usize, deleted: bool) {
    let ttl = Duration::from_secs(30);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let rl = rl.clone();
            tokio::spawn(async move {
                let key = format!("{prefix}{i}");
                for _ in 0..rounds {
                    let lock = rl.mutex(&key).acquire_with(ttl, &again()).await.unwrap();
                    let released = rl.unlock(lock).await.unwrap();
                    if deleted {
                        assert!(released.deleted >= 1, "{}", released.report());
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Many tasks at once, whose calls the nodes coalesce: every distinct key
/// is locked and released by its own task, and on one shared key the tasks
/// never hold it together; nothing is left on the nodes once the releases
/// still on their way have landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_locks_keep_their_own_outcomes() {
    let cluster = Cluster::start(3);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .coalesce(true)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(30);
    let before = redlock_core::coalesce_stats();
    // Distinct keys: each task's lock is its own.
    each_its_own_key(&rl, "co:", 5, false).await;
    // One key: at most one holder at a time, each refusal its own.
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (rl, inside) = (rl.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                let mut held = 0;
                for _ in 0..5 {
                    if let Ok(lock) = rl.mutex("co:shared").try_acquire(ttl).await {
                        assert_eq!(
                            inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                            0,
                            "two holders at once"
                        );
                        held += 1;
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        rl.unlock(lock).await.unwrap();
                    }
                }
                held
            })
        })
        .collect();
    let mut held = 0;
    for t in tasks {
        held += t.await.unwrap();
    }
    assert!(held > 0, "nobody ever held the shared key");
    let after = redlock_core::coalesce_stats();
    eprintln!(
        "coalesced: {} batches of {} operations (largest {})",
        after.batches - before.batches,
        after.operations - before.operations,
        after.largest
    );
    assert!(
        after.operations > before.operations,
        "no call was coalesced: this tested nothing"
    );
    // Every release was decided at quorum; the last node's may still be on
    // its way (CONTRIBUTING, timing rule 4).
    for node in cluster.nodes() {
        let clean = redlock_tests::util::eventually(timing::settle(PATIENT_NODE_TIMEOUT), || {
            node.keys().iter().all(|k| !k.starts_with("co:"))
        })
        .await;
        assert!(clean, "keys left on a node: {:?}", node.keys());
    }
}

/// A user whose ACL allows the lock keys but not their waiters flags: the
/// batch script's read of a key and its flag (`MGET`) is refused, it reads
/// them one at a time as the release alone does, and each held key's
/// release then gets the flag's refusal, after which it runs again without
/// the flag, as alone. Every lock is released, and nothing is left on the
/// nodes (long before the locks' TTL), so every release landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_the_flag_key_still_releases_in_a_batch() {
    let cluster = Cluster::start(3);
    let mut urls = Vec::new();
    for node in cluster.nodes() {
        // `acl:*` matches `acl:3`, not `{acl:3}:redlock-waiters`.
        node.cmd(&[
            "ACL", "SETUSER", "narrow", "on", ">secret", "~acl:*", "&*", "+@all",
        ]);
        urls.push(format!("redis://narrow:secret@127.0.0.1:{}", node.port()));
    }
    let rl = Redlock::builder()
        .urls(urls)
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .coalesce(true)
        .build()
        .unwrap();
    let before = redlock_core::coalesce_stats();
    each_its_own_key(&rl, "acl:", 3, true).await;
    let after = redlock_core::coalesce_stats();
    assert!(
        after.operations > before.operations,
        "no call was coalesced: this tested nothing"
    );
    for node in cluster.nodes() {
        let clean = redlock_tests::util::eventually(timing::settle(PATIENT_NODE_TIMEOUT), || {
            node.keys().iter().all(|k| !k.starts_with("acl:"))
        })
        .await;
        assert!(clean, "keys left on a node: {:?}", node.keys());
    }
}

/// Resumes a paused node when dropped, so that a failed assertion does not
/// leave it stopped for the rest of the binary.
struct Resume<'a>(&'a RedisNode);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Lets every task spawned on this (current-thread) runtime run until it
/// waits: each has then sent or queued what it sends first.
async fn let_tasks_run() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// A call that does not take part in the coalescer (here a fencing lock's
/// acquire, a pipeline) never overtakes an operation queued in it for the
/// same node: the holder's release, queued behind the node's busy
/// connection, reaches the node before the next acquire of its key, which
/// then finds the key free. Without that order, the acquire went out at
/// once, before the release, and was refused (a spurious `Busy`).
///
/// The node is stopped (`SIGSTOP`) while the calls are sent, so that their
/// order on its socket is the order they were written in, whatever the
/// machine's load: a first release in flight, a second queued behind it,
/// then the acquire.
#[tokio::test(flavor = "current_thread")]
async fn a_direct_call_does_not_overtake_a_queued_release() {
    let cluster = Cluster::start(1);
    let rl = Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(PATIENT_NODE_TIMEOUT)
        .fencing(redlock_core::FencingMode::Durable)
        .coalesce(true)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(30);
    let first = rl.mutex("ord:first").try_acquire(ttl).await.unwrap();
    let second = rl.mutex("ord:second").try_acquire(ttl).await.unwrap();
    let node = cluster.node(0);
    node.pause();
    let resume = Resume(node);
    // In flight: the coalescer is busy until the node answers it.
    let r1 = tokio::spawn({
        let rl = rl.clone();
        async move { rl.unlock(first).await }
    });
    let_tasks_run().await;
    // Queued behind it.
    let r2 = tokio::spawn({
        let rl = rl.clone();
        async move { rl.unlock(second).await }
    });
    let_tasks_run().await;
    // The next holder of the second key: a fenced acquire, sent directly.
    let next = tokio::spawn({
        let rl = rl.clone();
        async move { rl.mutex("ord:second").try_acquire(ttl).await }
    });
    let_tasks_run().await;
    drop(resume);
    r1.await.unwrap().unwrap();
    r2.await.unwrap().unwrap();
    let next = next.await.unwrap();
    assert!(
        next.is_ok(),
        "the acquire overtook the release queued before it: {next:?}"
    );
    rl.unlock(next.unwrap()).await.unwrap();
}

/// A coalescing handle on `node` alone, whose writes want one replica's
/// ack within `ack_timeout`; no retries, no wake-ups; connected.
async fn acked_handle(node: &RedisNode, ack_timeout: Duration, node_timeout: Duration) -> Redlock {
    let rl = Redlock::builder()
        .node(redlock_core::NodeSpec::url(node.url()).replica_acks(1, ack_timeout))
        .node_timeout(node_timeout)
        .retry(redlock_core::RetryPolicy::no_retry())
        .wake_on_release(false)
        .coalesce(true)
        .build()
        .unwrap();
    rl.inspect("warm-up").await.unwrap();
    rl
}

/// The node errors of an acquire that no replica acknowledged (it must
/// have failed).
fn unacked(r: Result<redlock_core::Lock, redlock_core::Error>) -> Vec<NodeError> {
    let err = r.expect_err("no replica acknowledges the write");
    err.report()
        .map(|r| r.errors().map(|(_, e)| e.clone()).collect())
        .unwrap_or_default()
}

/// `WAIT` calls a node has run so far (`INFO commandstats`).
fn waits_run(node: &RedisNode) -> u64 {
    let info: String = node.raw(&["INFO", "commandstats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:"))
        .and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Replica acks with the coalescer (issue 50): a batch whose acquires wrote
/// waits for the replica once, by one `WAIT` after its pipeline, and that
/// count holds for each write in it. 64 tasks lock and release their own
/// keys on a primary with a replica: every lock is granted, its key is on
/// the replica, and the primary ran fewer `WAIT`s than there were
/// acquires (each acquire alone waits by its own: one `WAIT` per write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waits_for_its_replicas_once_for_all_its_writes() {
    let group = redlock_tests::replicas::ReplicaGroup::start().await;
    let rl = Redlock::builder()
        .node(redlock_core::NodeSpec::url(group.url()).replica_acks(1, Duration::from_secs(3)))
        // Room for the `WAIT` (three quarters of it) on a loaded machine.
        .node_timeout(Duration::from_secs(5))
        .retry(redlock_core::RetryPolicy::no_retry())
        .coalesce(true)
        .build()
        .unwrap();
    rl.inspect("warm-up").await.unwrap();
    let ttl = Duration::from_secs(30);
    let waits_before = waits_run(group.primary());
    let before = redlock_core::coalesce_stats();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let rl = rl.clone();
            tokio::spawn(async move {
                let key = format!("acked:{i}");
                let mut tokens = Vec::new();
                for _ in 0..3 {
                    let lock = rl.mutex(&key).try_acquire(ttl).await.unwrap();
                    tokens.push(lock.token().to_owned());
                    rl.unlock(lock).await.unwrap();
                }
                (key, tokens)
            })
        })
        .collect();
    let mut acquires = 0;
    for t in tasks {
        let (_, tokens) = t.await.unwrap();
        acquires += tokens.len() as u64;
    }
    let after = redlock_core::coalesce_stats();
    let waits = waits_run(group.primary()) - waits_before;
    eprintln!(
        "{acquires} acquires, {waits} WAITs; coalesced: {} batches of {} operations",
        after.batches - before.batches,
        after.operations - before.operations,
    );
    assert!(
        after.operations > before.operations,
        "no call was coalesced: this tested nothing"
    );
    assert!(waits > 0, "no WAIT at all: the acks were not asked for");
    assert!(
        waits < acquires,
        "{waits} WAITs for {acquires} acquires: the batches waited once per write"
    );
    // A write acknowledged by the replica is on it.
    let lock = rl.mutex("acked:last").try_acquire(ttl).await.unwrap();
    assert!(group.replica_has("acked:last", lock.token()).await);
    rl.unlock(lock).await.unwrap();
}

/// A node whose replica never acknowledges (here a primary with none, so
/// `WAIT 1` answers 0 when its timeout ends): each acquire of a batch fails
/// for its acks ([`NodeError::ReplicaAcks`]), never granted and never a
/// timeout, and the batch waited once, not once per write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_without_its_replica_acks_fails_each_write_for_its_acks() {
    const CALLS: u64 = 8;
    let node = RedisNode::start();
    let ack_timeout = Duration::from_millis(300);
    // Room for eight `WAIT`s in a row (each write's own, without the
    // batch's), so that each call sends its own rather than giving up
    // behind the others.
    let rl = acked_handle(&node, ack_timeout, Duration::from_secs(5)).await;
    let waits_before = waits_run(&node);
    let before = redlock_core::coalesce_stats();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let rl = rl.clone();
            tokio::spawn(async move {
                rl.mutex(format!("unacked:{i}"))
                    .try_acquire(Duration::from_secs(30))
                    .await
            })
        })
        .collect();
    for call in calls {
        let errors = unacked(call.await.unwrap());
        assert!(
            matches!(
                errors.as_slice(),
                [NodeError::ReplicaAcks {
                    acked: 0,
                    wanted: 1,
                    ..
                }]
            ),
            "the node must fail for its acks: {errors:?}"
        );
    }
    let after = redlock_core::coalesce_stats();
    let waits = waits_run(&node) - waits_before;
    assert!(
        after.operations > before.operations,
        "no call was coalesced: this tested nothing"
    );
    assert!(
        waits < CALLS,
        "{waits} WAITs for {CALLS} acquires: the batch waited once per write"
    );
}

/// A queued call whose time runs out while a `WAIT` holds the node's
/// connection fails for its acks ([`NodeError::ReplicaAcks`] marked
/// `queued`), as a call sent alone does, not with a `Timeout` that would
/// send an operator looking for a slow server. Node timeout 2 s, acks
/// wanted from a replica the node does not have, each `WAIT` up to 1.5 s:
/// the first acquire goes alone and its `WAIT` takes 1.5 s; the second,
/// queued behind it, has until 2 s; the third, started 0.6 s later (so
/// that the batch's latest deadline is 2.6 s), makes the batch's `WAIT`
/// last past the second's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_call_out_of_time_behind_a_wait_fails_for_its_acks() {
    let node = RedisNode::start();
    let rl = acked_handle(&node, Duration::from_millis(1500), Duration::from_secs(2)).await;
    let acquire = |key: &'static str| {
        let rl = rl.clone();
        tokio::spawn(async move { rl.mutex(key).try_acquire(Duration::from_secs(30)).await })
    };
    let first = acquire("queued-acks:1");
    // The first holds the node's turn (its `WAIT` in flight) before the
    // second comes: the second is queued.
    let blocked = redlock_tests::util::eventually(Duration::from_secs(10), || {
        let info: String = node.raw(&["INFO", "clients"]).unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .is_some_and(|v| v.trim() != "0")
    })
    .await;
    assert!(blocked, "the first acquire's WAIT never blocked");
    let second = acquire("queued-acks:2");
    // Not a wait for a condition: the third's later start is what makes
    // the batch's deadline, and so its `WAIT`, outlast the second's.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let third = acquire("queued-acks:3");
    for (name, call) in [("first", first), ("third", third)] {
        let e = unacked(call.await.unwrap());
        assert!(
            matches!(e.as_slice(), [NodeError::ReplicaAcks { wanted: 1, .. }]),
            "the {name} acquire must fail for its acks: {e:?}"
        );
    }
    let e = unacked(second.await.unwrap());
    assert!(
        matches!(
            e.as_slice(),
            [NodeError::ReplicaAcks {
                acked: 0,
                wanted: 1,
                queued: true,
                ..
            }]
        ),
        "the second acquire ran out of time behind a WAIT: it must say so, \
         not time out: {e:?}"
    );
}
