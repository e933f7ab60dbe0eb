//! Scenario `middleware`: an axum route under the layer against the bare route; and the process's CPU and memory readings.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlock_tower::RedlockLayer;

use super::*;

/// 5. Middleware overhead over loopback HTTP.
pub(super) async fn middleware(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let bare = Router::new().route("/{*path}", get(|| async { "ok" }));
    let locked = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(RedlockLayer::new(lib.clone(), redlock_tower::ByPath));
    let serve = |app: Router| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok::<_, BoxError>(addr)
    };
    let bare_addr = serve(bare).await?;
    let locked_addr = serve(locked).await?;
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    let n = if setup.quick { 300 } else { 3000 };
    let get_once = |addr: std::net::SocketAddr, path: String| {
        let client = client.clone();
        async move {
            let uri: http::Uri = format!("http://{addr}{path}").parse()?;
            let resp = client.get(uri).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            if !status.is_success() {
                return Err::<(), BoxError>(format!("status {status}").into());
            }
            Ok(())
        }
    };
    for i in 0..200 {
        get_once(bare_addr, format!("/warm/{i}")).await?;
        get_once(locked_addr, format!("/warm/{i}")).await?;
    }
    let (mut b, mut l, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let start = Instant::now();
        get_once(bare_addr, format!("/k/{i}")).await?;
        b.push(start.elapsed());
        let start = Instant::now();
        get_once(locked_addr, format!("/k/{i}")).await?;
        l.push(start.elapsed());
        let tok = Raw::token();
        let key = format!("bench:mw:{i}");
        let start = Instant::now();
        raw.lock(&key, &tok).await;
        raw.unlock(&key, &tok).await;
        r.push(start.elapsed());
    }
    let (b, l, r) = (Stats::new(b), Stats::new(l), Stats::new(r));
    header(&format!(
        "5. middleware over loopback HTTP ({n} requests each)"
    ));
    row("bare request p50", us(b.pct(0.5)), us(b.pct(0.5)), "µs");
    row(
        "with RedlockLayer p50",
        us(l.pct(0.5)),
        us(b.pct(0.5)),
        "µs",
    );
    row(
        "with RedlockLayer p99",
        us(l.pct(0.99)),
        us(b.pct(0.99)),
        "µs",
    );
    let added50 = us(l.pct(0.5)) - us(b.pct(0.5));
    let added99 = us(l.pct(0.99)) - us(b.pct(0.99));
    row(
        "added p50 vs raw acquire+release",
        added50,
        us(r.pct(0.5)),
        "µs",
    );
    row(
        "added p99 vs raw acquire+release",
        added99,
        us(r.pct(0.99)),
        "µs",
    );
    Ok(())
}

pub(super) fn cpu_time() -> Duration {
    // utime + stime of this process, from /proc (clock ticks of 10 ms on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

pub(super) fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
