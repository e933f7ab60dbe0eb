//! The `redlock` command on real `redis-server` processes: two runs on one key,
//! the child stopped on loss (SIGTERM before the old validity ends, SIGKILL
//! after the grace), signals forwarded, exit codes and environment, `status`,
//! `check` and `release` output, and no password in any output.
//!
//! The binary is built once per run with `cargo build -p redlock-core
//! --features cli --bin redlock` (it lives in redlock-core behind a feature, so
//! this package cannot name it with `CARGO_BIN_EXE_*`).

mod at_least;
mod cluster;
mod exit_codes;
#[cfg(target_os = "linux")]
mod failover;
#[cfg(target_os = "linux")]
mod group;
mod passwords;
mod permits;
mod replicas;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redlock_tests::{Cluster, RedisNode, timing};

const PASSWORD: &str = "cli-s3cret-pw";

fn redlock_bin() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "-q",
                "-p",
                "redlock-core",
                "--features",
                "cli",
                "--bin",
                "redlock",
            ])
            .status()
            .expect("run cargo build for the redlock binary");
        assert!(status.success(), "building the redlock binary failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
        target.join("debug").join("redlock")
    })
}

/// A user `locker` with a password on every node, and URLs that use it.
fn urls_with_password(cluster: &Cluster) -> String {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            n.cmd(&[
                "ACL",
                "SETUSER",
                "locker",
                "on",
                &format!(">{PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ]);
            format!("redis://locker:{PASSWORD}@127.0.0.1:{}", n.port())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The `redlock` command on `nodes`, with the patient node timeout: the
/// global flag goes first (after `run ... --` it would be the child
/// command's argument). A test whose subject is a node timeout gives its own
/// `--node-timeout` after the subcommand, which overrides this one.
fn redlock(nodes: &str) -> Command {
    let mut c = Command::new(redlock_bin());
    c.args([
        "--node-timeout",
        &format!("{}ms", timing::PATIENT_NODE_TIMEOUT.as_millis()),
    ]);
    c.env("REDLOCK_NODES", nodes)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run_to_end(mut c: Command) -> Output {
    let out = c.output().expect("run redlock");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(PASSWORD), "password in the output: {all}");
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits (bounded) until `f` holds.
fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn key_on(cluster: &Cluster, key: &str) -> usize {
    cluster.count_with_key(key)
}

/// How many nodes have `key` once that is `want`, or once the last node's
/// answer to a call that returned at quorum must have come.
fn settled_on(cluster: &Cluster, key: &str, want: usize) -> usize {
    cluster.settled_count_blocking(key, want)
}

/// How long a `redlock` run with the patient node timeout may take to start
/// its command: a connection and an acquire.
fn to_start() -> Duration {
    timing::liveness(timing::PATIENT_NODE_TIMEOUT * 2)
}

/// How long a `redlock` command may take to end once its child has: a
/// release, or the grace period and a release.
fn to_end(grace: Duration) -> Duration {
    timing::liveness(grace + timing::PATIENT_NODE_TIMEOUT * 2)
}

/// Waits for `child` (bounded): kills it and fails with `what` if it is
/// still running after `timeout`, so that no test can hang.
fn finish(mut child: std::process::Child, timeout: Duration, what: &str) -> Output {
    let end = Instant::now() + timeout;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= end {
            let _ = child.kill();
            let out = child.wait_with_output().ok();
            panic!(
                "{what}: still running after {timeout:?}; stderr: {}",
                out.map(|o| text(&o.stderr)).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect the output")
}

#[test]
fn a_second_run_is_busy_or_waits_and_the_childs_code_and_environment_pass_through() {
    let cluster = Cluster::start(3);
    let nodes = urls_with_password(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let env_file = dir.path().join("env");
    let order = dir.path().join("order");

    // The first holder writes its environment, then waits for the gate. Its
    // TTL exceeds the loss margin, the patient node timeout.
    let ttl = format!("{}ms", (timing::PATIENT_NODE_TIMEOUT * 5).as_millis());
    let mut first = redlock(&nodes);
    first.args([
        "run",
        "--key",
        "cli-job",
        "--ttl",
        &ttl,
        "--fencing",
        "hybrid",
        "--",
        "sh",
        "-c",
    ]);
    first.arg(format!(
        "env | grep ^REDLOCK_ > {env}; echo first >> {order}; while [ ! -e {gate} ]; do sleep 0.02; done; exit 7",
        env = env_file.display(),
        order = order.display(),
        gate = gate.display()
    ));
    let first = first.spawn().unwrap();
    wait_for("the first holder's child", to_start(), || env_file.exists());

    // Busy without --wait: 75 at once, the command never ran.
    let busy = run_to_end({
        let mut c = redlock(&nodes);
        c.args([
            "run",
            "--key",
            "cli-job",
            "--",
            "sh",
            "-c",
            "echo busy-ran >> /dev/stderr",
        ]);
        c
    });
    assert_eq!(busy.status.code(), Some(75), "{}", text(&busy.stderr));
    assert!(!text(&busy.stderr).contains("busy-ran"));

    // With --wait, it runs once the first one is done.
    let mut waiter = redlock(&nodes);
    waiter.args(["run", "--key", "cli-job", "--wait", "20s", "--", "sh", "-c"]);
    waiter.arg(format!("echo second >> {}", order.display()));
    let waiter = waiter.spawn().unwrap();
    // It waits: its attempt left the waiters flag.
    wait_for("the waiter's attempt", to_start(), || {
        cluster.nodes().iter().any(|n| {
            n.raw::<i64>(&["EXISTS", "{cli-job}:redlock-waiters"])
                .unwrap_or(0)
                == 1
        })
    });
    std::fs::write(&gate, b"").unwrap();

    let first = finish(first, to_end(Duration::ZERO), "the first holder");
    assert_eq!(
        first.status.code(),
        Some(7),
        "the child's code passes through"
    );
    let waiter = finish(
        waiter,
        to_start() + to_end(Duration::ZERO),
        "the waiting run",
    );
    assert_eq!(waiter.status.code(), Some(0), "{}", text(&waiter.stderr));
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "first\nsecond\n");

    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains("REDLOCK_KEY=cli-job\n"), "{env}");
    let fingerprint = env
        .lines()
        .find_map(|l| l.strip_prefix("REDLOCK_TOKEN_FINGERPRINT="))
        .expect("the fingerprint is in the environment");
    assert_eq!(fingerprint.len(), 16);
    let fence: u64 = env
        .lines()
        .find_map(|l| l.strip_prefix("REDLOCK_FENCING_TOKEN="))
        .expect("the fencing token is in the environment")
        .parse()
        .unwrap();
    assert!(fence > 0);
    assert!(
        !env.contains("REDLOCK_TOKEN="),
        "the token itself is not handed out"
    );
    assert_eq!(settled_on(&cluster, "cli-job", 0), 0, "released");
}

#[test]
fn a_lost_lock_stops_the_child_before_the_old_validity_ends_then_kills_it() {
    let cluster = Cluster::start(3);
    let nodes = urls_with_password(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let termed = dir.path().join("termed");
    // A child that notes SIGTERM and keeps running: it must be killed after
    // the grace period.
    let mut c = redlock(&nodes);
    c.args([
        "run",
        "--key",
        "cli-lost",
        "--ttl",
        "3s",
        "--grace",
        "1s",
        "--node-timeout",
        "100ms",
        "--",
        "sh",
        "-c",
    ]);
    c.arg(format!(
        "trap 'touch {termed}' TERM; touch {started}; while :; do sleep 0.05; done",
        termed = termed.display(),
        started = started.display()
    ));
    let mut child = c.spawn().unwrap();
    // What redlock says, line by line, with when the test read it: when it
    // sent SIGTERM and SIGKILL, as closely as the test can see it (the
    // child's own note of SIGTERM comes after the shell's scheduling too).
    let said: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let reader = {
        let (stderr, said) = (child.stderr.take().unwrap(), Arc::clone(&said));
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                said.lock().unwrap().push((Instant::now(), line));
            }
        })
    };
    let said_at = |what: &str| {
        said.lock()
            .unwrap()
            .iter()
            .find(|(_, l)| l.contains(what))
            .map(|(at, _)| *at)
    };
    wait_for("the child", to_start(), || started.exists());
    // Every node stops answering: no renewal can succeed once two are
    // paused, so every renewal that did began before the last pause.
    for n in cluster.nodes() {
        n.pause();
    }
    let paused_at = Instant::now();
    // By the 3 s TTL at most; the bound is only there for a failing test.
    wait_for("SIGTERM", timing::liveness(Duration::from_secs(3)), || {
        termed.exists()
    });
    let out = finish(
        child,
        to_end(Duration::from_secs(1)),
        "redlock after the loss",
    );
    reader.join().unwrap();
    for n in cluster.nodes() {
        n.resume();
    }
    let stderr: String = said
        .lock()
        .unwrap()
        .iter()
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    let term_at = said_at("sending SIGTERM").unwrap_or_else(|| panic!("no SIGTERM: {stderr}"));
    let kill_at = said_at("sending SIGKILL").unwrap_or_else(|| panic!("no SIGKILL: {stderr}"));
    let termed_after = term_at.saturating_duration_since(paused_at);
    // The keys were set (or last renewed) before the last pause with a 3 s
    // TTL: redlock sent SIGTERM before they could expire.
    assert!(
        term_at < paused_at + Duration::from_secs(3),
        "SIGTERM came {termed_after:?} after the pause, past the old validity"
    );
    assert!(
        kill_at >= term_at + Duration::from_millis(900),
        "SIGKILL must wait for the 1 s grace: TERM at {termed_after:?}, KILL {:?} later",
        kill_at.saturating_duration_since(term_at)
    );
    assert_eq!(out.status.code(), Some(79), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
}

#[test]
fn signals_are_forwarded_and_the_lock_released() {
    let cluster = Cluster::start(3);
    let nodes = urls_with_password(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let mut c = redlock(&nodes);
    c.args(["run", "--key", "cli-signal", "--", "sh", "-c"]);
    // SIGTERM, not SIGHUP: a shell cannot trap a signal that was ignored when
    // it started, and a test run under `nohup` ignores SIGHUP (the command
    // forwards all three the same way).
    c.arg(format!(
        "trap 'exit 42' TERM; touch {}; while :; do sleep 0.05; done",
        started.display()
    ));
    let child = c.spawn().unwrap();
    wait_for("the child", to_start(), || started.exists());
    // The acquire returned at quorum: the last node's answer may be on its way.
    assert_eq!(settled_on(&cluster, "cli-signal", 3), 3);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = finish(child, to_end(Duration::ZERO), "redlock after SIGTERM");
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    assert_eq!(
        settled_on(&cluster, "cli-signal", 0),
        0,
        "released when the command exits"
    );
}

#[test]
fn status_check_and_release_output_and_no_password_anywhere() {
    let cluster = Cluster::start(3);
    let nodes = urls_with_password(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let gate = dir.path().join("gate");
    let mut c = redlock(&nodes);
    c.args([
        "run",
        "--key",
        "cli-status",
        "--ttl",
        "20s",
        "--",
        "sh",
        "-c",
    ]);
    c.arg(format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
        started.display(),
        gate.display()
    ));
    let asked = Instant::now();
    let holder = c.spawn().unwrap();
    wait_for("the child", to_start(), || started.exists());
    assert_eq!(settled_on(&cluster, "cli-status", 3), 3, "every node's key");

    let token = cluster.node(0).get("cli-status").unwrap();
    let fingerprint = redlock_core::token_fingerprint(&token);
    let table = run_to_end({
        let mut c = redlock(&nodes);
        c.args(["status", "cli-status"]);
        c
    });
    let table = text(&table.stdout);
    assert!(
        table.contains(&format!("held by {fingerprint} on 3 node(s)")),
        "{table}"
    );
    assert_eq!(table.matches(&fingerprint).count(), 4, "{table}");
    assert!(!table.contains(&token), "the token is never shown: {table}");
    let json = run_to_end({
        let mut c = redlock(&nodes);
        c.args(["status", "cli-status", "--json"]);
        c
    });
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["verdict"]["state"], "held");
    assert_eq!(v["verdict"]["holder"], fingerprint.as_str());
    assert_eq!(v["nodes"].as_array().unwrap().len(), 3);
    // At most the TTL, and no less than what is left of it since the run
    // was started (the holder renews it, which only adds).
    let pttl = v["nodes"][0]["pttl_ms"].as_u64().unwrap();
    let left = Duration::from_secs(20).saturating_sub(asked.elapsed());
    assert!(
        pttl <= 20_000 && u128::from(pttl) >= left.as_millis(),
        "PTTL {pttl} ms, at least {left:?} expected"
    );

    // The escape hatch: the wrong token deletes nothing; the right one frees it.
    let wrong = run_to_end({
        let mut c = redlock(&nodes);
        c.args(["release", "cli-status", "--token", "0000"]);
        c
    });
    assert_ne!(wrong.status.code(), Some(0));
    assert_eq!(key_on(&cluster, "cli-status"), 3);
    let right = run_to_end({
        let mut c = redlock(&nodes);
        c.args(["release", "cli-status", "--token", &token]);
        c
    });
    assert_eq!(right.status.code(), Some(0), "{}", text(&right.stderr));
    assert_eq!(settled_on(&cluster, "cli-status", 0), 0);
    std::fs::write(&gate, b"").unwrap();
    let _ = finish(holder, to_end(Duration::ZERO), "the status holder");

    // check: one URL listed twice (localhost and 127.0.0.1 reach one server),
    // and a node that is down; the password shows in neither output.
    let down = RedisNode::start();
    let down_url = format!("redis://locker:{PASSWORD}@127.0.0.1:{}", down.port());
    down.kill();
    let dup = format!(
        "{nodes},redis://locker:{PASSWORD}@localhost:{},{down_url}",
        cluster.node(0).port()
    );
    let check = run_to_end({
        let mut c = redlock(&dup);
        c.arg("check");
        c
    });
    let out = text(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{out}");
    assert!(out.contains("same server as"), "{out}");
    assert!(out.contains("unreachable"), "{out}");
    assert!(out.contains("3 of 5 node(s) fit"), "{out}");
    assert!(out.contains("7."), "the version is shown: {out}");
    let check = run_to_end({
        let mut c = redlock(&dup);
        c.args(["check", "--json"]);
        c
    });
    let v: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["healthy"], 3);
    let ok = run_to_end({
        let mut c = redlock(&nodes);
        c.args(["check", "--json"]);
        c
    });
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["nodes"][0]["latency_us"].as_u64().is_some());

    // A busy error, and an acquire with every node down, name no password.
    let unreachable = run_to_end({
        let mut c = redlock(&format!("{down_url},{down_url}9,{down_url}8"));
        c.args(["run", "--key", "x", "--", "true"]);
        c
    });
    assert!(
        matches!(unreachable.status.code(), Some(64 | 69)),
        "{unreachable:?}"
    );
}

#[test]
fn usage_errors_exit_64() {
    let out = run_to_end({
        let mut c = redlock("");
        c.env_remove("REDLOCK_NODES");
        c.args(["run", "--key", "k", "--", "true"]);
        c
    });
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let out = run_to_end({
        let mut c = redlock("redis://127.0.0.1:1");
        c.args(["run", "--key", "k", "--ttl", "soon", "--", "true"]);
        c
    });
    assert_eq!(out.status.code(), Some(64));
    let help = run_to_end({
        let mut c = redlock("");
        c.arg("--help");
        c
    });
    assert!(
        text(&help.stdout).contains("cron"),
        "the help has a cron example"
    );
}

#[test]
fn check_flags_replicas_and_evicting_policies() {
    let master = RedisNode::start();
    let replica = RedisNode::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    let evicting = RedisNode::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    // A replica connects from its once-a-second cron.
    wait_for(
        "the replica to attach",
        timing::liveness(Duration::from_secs(1)),
        || {
            let info: String = master.raw(&["INFO", "replication"]).unwrap_or_default();
            info.contains("connected_slaves:1")
        },
    );
    let nodes = [&master, &replica, &evicting]
        .iter()
        .map(|n| n.url())
        .collect::<Vec<_>>()
        .join(",");
    let out = run_to_end({
        let mut c = redlock(&nodes);
        c.arg("check");
        c
    });
    let text = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("1 replica(s) attached"), "{text}");
    assert!(text.contains("role slave"), "{text}");
    assert!(
        text.contains("eviction:") && text.contains("allkeys-lru"),
        "{text}"
    );
    assert!(text.contains("0 of 3 node(s) fit"), "{text}");
    eprintln!("{text}");
}
