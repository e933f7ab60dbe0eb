//! The fault proxy (`redlock_tests::proxy`) on a real `redis-server`: each fault
//! does what the fault suite relies on. A delayed request runs late; a delayed
//! reply means the command ran although the client gave up; a blackhole never
//! delivers; held bytes run at the flush; a reset breaks open connections;
//! a refusal is a real `ECONNREFUSED` and the port accepts again afterwards; and
//! lock tokens are seen on the wire.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_tests::RedisNode;
use redlock_tests::history::{Event, HistoryLog};
use redlock_tests::nemesis::redlock_for;
use redlock_tests::proxy::{Direction, FaultProxy};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A blocking connection through the proxy with a read timeout.
fn connect(port: u16, read_timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(read_timeout))?;
    Ok(conn)
}

async fn setup() -> (Arc<RedisNode>, FaultProxy) {
    let node = Arc::new(tokio::task::spawn_blocking(RedisNode::start).await.unwrap());
    let proxy = FaultProxy::start(0, node.port(), None).await.unwrap();
    (node, proxy)
}

/// Runs `SET key 1` through the proxy on a blocking thread, in raw RESP on a
/// fresh connection (no client handshake to be delayed); returns the reply line
/// and how long the call took.
async fn set_through(
    port: u16,
    key: &str,
    timeout: Duration,
) -> (std::io::Result<String>, Duration) {
    let key = key.to_owned();
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let r = (|| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(timeout))?;
            write!(
                s,
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$1\r\n1\r\n",
                key.len()
            )?;
            let mut line = String::new();
            if BufReader::new(&s).read_line(&mut line)? == 0 {
                return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed"));
            }
            Ok(line.trim_end().to_owned())
        })();
        (r, start.elapsed())
    })
    .await
    .unwrap()
}

async fn get(node: &Arc<RedisNode>, key: &str) -> Option<String> {
    let (n, k) = (Arc::clone(node), key.to_owned());
    tokio::task::spawn_blocking(move || n.get(&k))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_requests_run_late_and_delayed_replies_ran_already() {
    let (node, proxy) = setup().await;

    // Request delay: the command has not run while the request is on its way.
    proxy.delay(Direction::Request, ms(800), Duration::ZERO);
    let port = proxy.port();
    let call = tokio::spawn(set_through(port, "req", Duration::from_secs(3)));
    tokio::time::sleep(ms(200)).await;
    assert_eq!(
        get(&node, "req").await,
        None,
        "a delayed request must run late"
    );
    let (r, took) = call.await.unwrap();
    assert_eq!(r.unwrap(), "+OK");
    assert!(took >= ms(800), "{took:?}");
    assert_eq!(get(&node, "req").await.as_deref(), Some("1"));

    // Reply delay: the client gives up, yet the command ran.
    proxy.delay(Direction::Request, Duration::ZERO, Duration::ZERO);
    proxy.delay(Direction::Reply, ms(400), Duration::ZERO);
    let (r, _) = set_through(port, "rep", ms(100)).await;
    assert!(r.is_err(), "the reply must come after the client's timeout");
    assert_eq!(
        get(&node, "rep").await.as_deref(),
        Some("1"),
        "the command ran although its reply was late"
    );
    proxy.heal();
    assert_eq!(set_through(port, "after", ms(500)).await.0.unwrap(), "+OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_never_delivers_and_hold_delivers_at_the_flush() {
    let (node, proxy) = setup().await;
    let port = proxy.port();

    proxy.blackhole();
    let (r, _) = set_through(port, "bh", ms(150)).await;
    assert!(r.is_err());
    proxy.heal();
    tokio::time::sleep(ms(100)).await;
    assert_eq!(
        get(&node, "bh").await,
        None,
        "blackholed bytes are never delivered"
    );
    assert!(proxy.stats().dropped_chunks > 0);

    proxy.hold(Direction::Request);
    let (r, _) = set_through(port, "held", ms(150)).await;
    assert!(r.is_err());
    assert_eq!(get(&node, "held").await, None, "held requests have not run");
    proxy.flush();
    let deadline = Instant::now() + Duration::from_secs(2);
    while get(&node, "held").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the flush did not deliver the held SET"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_breaks_connections_and_refuse_refuses() {
    let (_node, proxy) = setup().await;
    let port = proxy.port();

    let mut conn = tokio::task::spawn_blocking(move || connect(port, ms(500)).unwrap())
        .await
        .unwrap();
    let (ok, mut conn) = tokio::task::spawn_blocking(move || {
        let r = redis::cmd("PING").query::<String>(&mut conn);
        (r, conn)
    })
    .await
    .unwrap();
    assert_eq!(ok.unwrap(), "PONG");
    assert_eq!(proxy.reset(), 1);
    let r = tokio::task::spawn_blocking(move || redis::cmd("PING").query::<String>(&mut conn))
        .await
        .unwrap();
    assert!(r.is_err(), "a reset connection must fail: {r:?}");

    proxy.refuse(true);
    tokio::time::sleep(ms(50)).await;
    let e = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    proxy.refuse(false);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if set_through(port, "back", ms(500)).await.0.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the port did not accept again");
        tokio::time::sleep(ms(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_tokens_are_seen_on_the_wire() {
    let node = Arc::new(tokio::task::spawn_blocking(RedisNode::start).await.unwrap());
    let log = HistoryLog::new();
    let proxy = FaultProxy::start(3, node.port(), Some(log.clone()))
        .await
        .unwrap();
    let rl = redlock_for(&[proxy.url()]);
    let lock = rl.mutex("seen").try_acquire(ms(500)).await.unwrap();
    let token = lock.token().to_owned();
    lock.unlock().await.unwrap();
    let sightings: Vec<u64> = log
        .snapshot()
        .into_iter()
        .filter_map(|e| match e {
            Event::Sighting {
                proxy: 3,
                token: t,
                at,
            } if t == token => Some(at),
            _ => None,
        })
        .collect();
    // The SET, then the release (EVALSHA, and EVAL after NOSCRIPT on a new node).
    assert!((2..=3).contains(&sightings.len()), "{sightings:?}");
}
