//! Scenario `idempotency`: the idempotency layer over loopback HTTP. The
//! first request of a key (fast read with the lock, read under the lock,
//! handler, record; the release follows in the background) against
//! `RedlockLayer` alone, its added time against one raw quorum round trip
//! (`SET NX PX` on every node), and a replay (one quorum read) against a raw
//! quorum acquire+release.

use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlock_tower::RedlockLayer;
use redlock_tower::idempotency::IdempotencyLayer;

use super::{BoxError, Raw, Setup, Stats, header, redlock, row, us};

pub(crate) async fn idempotency(setup: &Setup) -> Result<(), BoxError> {
    let lib = redlock(setup)?;
    let raw = Raw::new(&setup.pools).await?;
    let bare = Router::new().route("/{*path}", post(|| async { "ok" }));
    let locked = Router::new()
        .route("/{*path}", post(|| async { "ok" }))
        .layer(RedlockLayer::new(lib.clone(), redlock_tower::ByPath));
    let idem = Router::new()
        .route("/{*path}", post(|| async { "ok" }))
        .layer(IdempotencyLayer::new(lib.clone()));
    let serve = |app: Router| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok::<_, BoxError>(addr)
    };
    let bare_addr = serve(bare).await?;
    let locked_addr = serve(locked).await?;
    let idem_addr = serve(idem).await?;
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    let n = if setup.quick { 300 } else { 2000 };
    let post_once = |addr: std::net::SocketAddr, path: String, key: Option<String>| {
        let client = client.clone();
        async move {
            let mut req = http::Request::post(format!("http://{addr}{path}"));
            if let Some(key) = key {
                req = req.header("idempotency-key", key);
            }
            let resp = client.request(req.body(Body::from("{}"))?).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            if !status.is_success() {
                return Err::<(), BoxError>(format!("status {status}").into());
            }
            Ok(())
        }
    };
    for i in 0..200 {
        post_once(locked_addr, format!("/warm/{i}"), None).await?;
        post_once(idem_addr, "/warm".into(), Some(format!("warm-{i}"))).await?;
    }
    let (mut bare_lat, mut locked_lat, mut first, mut replay, mut r, mut round) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let run = Raw::token();
    for i in 0..n {
        let start = Instant::now();
        post_once(bare_addr, format!("/k/{i}"), None).await?;
        bare_lat.push(start.elapsed());
        let start = Instant::now();
        post_once(locked_addr, format!("/k/{i}"), None).await?;
        locked_lat.push(start.elapsed());
        let key = format!("{run}-{i}");
        let start = Instant::now();
        post_once(idem_addr, "/pay".into(), Some(key.clone())).await?;
        first.push(start.elapsed());
        let start = Instant::now();
        post_once(idem_addr, "/pay".into(), Some(key)).await?;
        replay.push(start.elapsed());
        let tok = Raw::token();
        let key = format!("bench:idem:{i}");
        let start = Instant::now();
        raw.lock(&key, &tok).await;
        round.push(start.elapsed());
        raw.unlock(&key, &tok).await;
        r.push(start.elapsed());
    }
    let (b, l, f, p, r, one) = (
        Stats::new(bare_lat),
        Stats::new(locked_lat),
        Stats::new(first),
        Stats::new(replay),
        Stats::new(r),
        Stats::new(round),
    );
    header(&format!(
        "9. idempotency layer over loopback HTTP ({n} keys; 'raw' column: the reference)"
    ));
    row(
        "first request p50 vs RedlockLayer",
        us(f.pct(0.5)),
        us(l.pct(0.5)),
        "µs",
    );
    row(
        "first request p99 vs RedlockLayer",
        us(f.pct(0.99)),
        us(l.pct(0.99)),
        "µs",
    );
    row(
        "first added p50 vs one raw quorum round trip",
        us(f.pct(0.5)) - us(l.pct(0.5)),
        us(one.pct(0.5)),
        "µs",
    );
    row(
        "replay p50 vs bare request",
        us(p.pct(0.5)),
        us(b.pct(0.5)),
        "µs",
    );
    row(
        "replay p99 vs bare request",
        us(p.pct(0.99)),
        us(b.pct(0.99)),
        "µs",
    );
    row(
        "replay added p50 vs raw acquire+release",
        us(p.pct(0.5)) - us(b.pct(0.5)),
        us(r.pct(0.5)),
        "µs",
    );
    Ok(())
}
