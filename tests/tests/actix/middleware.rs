//! `RedlockMiddleware` in real actix-web apps over real Redis nodes: one request
//! per key at a time (fail-fast and wait modes, across two workers), keys run in
//! parallel, the busy / missing-key / unavailable answers, fail-open, every key
//! source, and where the `Redlock` handle comes from.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::dev::ServiceRequest;
use actix_web::http::StatusCode;
use actix_web::http::header::HeaderName;
use actix_web::{App, HttpRequest, test, web};
use futures_util::future::join;
use redlock_actix::{LockHandle, MissingKeyPolicy, Redlock, RedlockMiddleware};
use redlock_tests::Cluster;

/// The state of the critical-section handler: a counter updated without
/// atomicity (read, sleep, write), and a gauge of the requests inside.
#[derive(Default)]
struct Critical {
    counter: AtomicUsize,
    inside: Gauge,
}

/// Read the counter, sleep 5..=20 ms, write it + 1: two overlapping requests
/// lose an update, and the gauge sees them both inside.
async fn critical(state: web::Data<Critical>) -> &'static str {
    let _inside = state.inside.enter();
    let seen = state.counter.load(Ordering::SeqCst);
    actix_web::rt::time::sleep(ms(5 + (seen as u64 * 7) % 16)).await;
    state.counter.store(seen + 1, Ordering::SeqCst);
    "done"
}

fn critical_server(
    cluster: &Cluster,
    middleware: RedlockMiddleware,
) -> (Server, web::Data<Critical>) {
    let state = web::Data::new(Critical::default());
    let redlock = redlock(cluster);
    let shared = state.clone();
    let server = serve!(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(redlock.clone())
            .wrap(middleware.clone())
            .route("/accounts/7/settle", web::get().to(critical))
    });
    (server, state)
}

#[actix_web::test]
async fn fail_fast_admits_one_request_per_path_and_rejects_the_rest_with_409() {
    let cluster = Cluster::start(3);
    let (server, state) = critical_server(&cluster, RedlockMiddleware::by_path());
    // Connections first: on a cold handle, 50 first attempts that all wait for
    // the same three connects are sent in a different order on each node, and
    // fail-fast requests can then split the nodes so that none wins (a cold
    // start split vote; wait mode retries through it).
    let warm = get(&client(), &server.url("/warm-up")).await;
    assert_eq!(warm.status, 404);

    let statuses = burst(&client(), &server.url("/accounts/7/settle"), 50).await;
    let (ok, busy) = (count(&statuses, 200), count(&statuses, 409));
    assert_eq!(ok + busy, 50, "only 200 and 409 expected: {statuses:?}");
    assert!(ok >= 1, "someone must get the lock: {statuses:?}");
    assert!(
        busy >= 1,
        "50 concurrent requests must collide: {statuses:?}"
    );
    assert_eq!(
        state.counter.load(Ordering::SeqCst),
        ok,
        "every admitted request's update must survive"
    );
    assert_eq!(state.inside.max(), 1, "two requests were inside at once");
}

#[actix_web::test]
async fn wait_mode_serializes_every_request_on_one_path() {
    let cluster = Cluster::start(3);
    let middleware = RedlockMiddleware::by_path()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(20));
    let (server, state) = critical_server(&cluster, middleware);

    let started = Instant::now();
    let statuses = burst(&client(), &server.url("/accounts/7/settle"), 40).await;
    assert_eq!(
        count(&statuses, 200),
        40,
        "every waiter must get the lock within 20 s: {statuses:?}"
    );
    assert_eq!(state.counter.load(Ordering::SeqCst), 40, "lost update");
    assert_eq!(state.inside.max(), 1, "two requests were inside at once");
    eprintln!("40 serialized requests took {:?}", started.elapsed());
}

/// Wait mode is woken by the holder's release: with a 1.5 s fallback poll,
/// the waiting request still runs soon after the holder lets go at 300 ms.
#[actix_web::test]
async fn wait_mode_is_woken_by_the_release_before_its_fallback_poll() {
    let cluster = Cluster::start(3);
    let middleware = RedlockMiddleware::by_path()
        .wait(Duration::from_secs(10))
        .retry_delay(Duration::from_millis(1500), Duration::ZERO);
    let (server, state) = critical_server(&cluster, middleware);
    let holder = redlock(&cluster);
    let lock = holder
        .try_lock("redlock:/accounts/7/settle", Duration::from_secs(5))
        .await
        .unwrap();
    let release = async {
        actix_web::rt::time::sleep(ms(300)).await;
        holder.unlock(lock).await.unwrap();
    };
    let started = Instant::now();
    let (reply, ()) = join(get(&client(), &server.url("/accounts/7/settle")), release).await;
    let took = started.elapsed();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(state.counter.load(Ordering::SeqCst), 1);
    assert!(
        took >= ms(250) && took < ms(1200),
        "woken by the release at 300 ms, not by the 1.5 s poll: {took:?}"
    );
}

#[actix_web::test]
async fn different_paths_run_in_parallel() {
    let cluster = Cluster::start(3);
    let gauge = web::Data::new(Gauge::default());
    let redlock = redlock(&cluster);
    let shared = gauge.clone();
    let server = serve!(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(redlock.clone())
            .wrap(RedlockMiddleware::by_path())
            .route(
                "/jobs/{id}",
                web::get().to(|g: web::Data<Gauge>| async move {
                    let _inside = g.enter();
                    actix_web::rt::time::sleep(ms(300)).await;
                    "done"
                }),
            )
    });
    let client = client();

    let started = Instant::now();
    let requests = (0..8).map(|i| {
        let (client, url) = (client.clone(), server.url(&format!("/jobs/{i}")));
        async move { get(&client, &url).await.status }
    });
    let statuses = futures_util::future::join_all(requests).await;
    assert_eq!(
        count(&statuses, 200),
        8,
        "distinct paths never contend: {statuses:?}"
    );
    assert!(
        gauge.max() > 1,
        "requests to 8 different paths never overlapped (max inside {})",
        gauge.max()
    );
    eprintln!(
        "8 paths: max {} inside at once, {:?} in all",
        gauge.max(),
        started.elapsed()
    );
}

/// Sleeps `?hold=<ms>` (0 when absent), then answers with the lock's key, or
/// `unlocked` when the request runs without one.
async fn hold(req: HttpRequest, lock: Option<web::ReqData<LockHandle>>) -> String {
    let hold = req
        .query_string()
        .split('&')
        .find_map(|kv| kv.strip_prefix("hold="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    actix_web::rt::time::sleep(ms(hold)).await;
    match lock {
        Some(lock) => lock.key().to_owned(),
        None => "unlocked".to_owned(),
    }
}

#[actix_web::test]
async fn busy_answer_is_409_with_retry_after_and_a_problem_document() {
    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .wrap(RedlockMiddleware::by_path().ttl(Duration::from_millis(2500)))
            .route("/reports/9", web::get().to(hold)),
    )
    .await;

    let (first, second) = join(call!(&app, "/reports/9?hold=800"), async {
        actix_web::rt::time::sleep(ms(200)).await;
        call!(&app, "/reports/9").await
    })
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, "redlock:/reports/9");
    assert_eq!(second.status, 409, "{second:?}");
    let retry_after = second.retry_after.expect("Retry-After on a 409");
    assert!(
        (1..=3).contains(&retry_after),
        "Retry-After {retry_after} must round the holder's ~2.3 s left up"
    );
    assert_eq!(
        second.content_type.as_deref(),
        Some("application/problem+json")
    );
    let doc = second.json();
    assert_eq!(doc["status"], 409, "{doc}");
    assert_eq!(doc["title"], "Resource is locked", "{doc}");
    assert_eq!(doc["key"], "redlock:/reports/9", "{doc}");
    assert_eq!(doc["retry_after"], retry_after, "{doc}");

    // The first request's answer was in memory: the lock was released before its
    // head went out, so the path is free now.
    // (Decided at quorum: at most a minority key may still be on its way out.)
    assert!(
        cluster.count_with_key("redlock:/reports/9") <= 1,
        "the lock must be released with the response"
    );
    let third = call!(&app, "/reports/9").await;
    assert_eq!(third.status, 200, "{third:?}");
}

#[actix_web::test]
async fn busy_status_is_configurable() {
    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .wrap(RedlockMiddleware::by_path().busy_status(StatusCode::LOCKED))
            .route("/reports/9", web::get().to(hold)),
    )
    .await;

    let (first, second) = join(call!(&app, "/reports/9?hold=600"), async {
        actix_web::rt::time::sleep(ms(200)).await;
        call!(&app, "/reports/9").await
    })
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(second.status, 423, "{second:?}");
    assert!(second.retry_after.is_some_and(|s| s >= 1), "{second:?}");
    assert_eq!(second.json()["status"], 423);
}

#[actix_web::test]
async fn by_header_runs_requests_without_the_header_unlocked_or_rejects_them_with_400() {
    let cluster = Cluster::start(3);
    let tenant = HeaderName::from_static("x-tenant");
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .service(
                web::resource("/lenient")
                    .wrap(RedlockMiddleware::by_header(tenant.clone()))
                    .route(web::get().to(hold)),
            )
            .service(
                web::resource("/strict")
                    .wrap(
                        RedlockMiddleware::by_header(tenant.clone())
                            .on_missing_key(MissingKeyPolicy::Reject),
                    )
                    .route(web::get().to(hold)),
            ),
    )
    .await;

    let keyed = call!(&app, "/lenient", ("x-tenant", "acme")).await;
    assert_eq!(
        (keyed.status, keyed.body.as_str()),
        (200, "redlock:x-tenant=acme")
    );
    let lenient = call!(&app, "/lenient").await;
    assert_eq!((lenient.status, lenient.body.as_str()), (200, "unlocked"));
    let empty = call!(&app, "/lenient", ("x-tenant", "")).await;
    assert_eq!((empty.status, empty.body.as_str()), (200, "unlocked"));

    let strict = call!(&app, "/strict").await;
    assert_eq!(strict.status, 400, "{strict:?}");
    assert_eq!(
        strict.retry_after, None,
        "a missing key is not worth retrying"
    );
    assert_eq!(strict.json()["title"], "Missing lock key");
    let keyed = call!(&app, "/strict", ("x-tenant", "globex")).await;
    assert_eq!(
        (keyed.status, keyed.body.as_str()),
        (200, "redlock:x-tenant=globex")
    );
}

#[actix_web::test]
async fn by_path_param_on_a_scope_locks_per_tenant() {
    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new().app_data(redlock(&cluster)).service(
            web::scope("/tenants/{tenant}")
                .wrap(RedlockMiddleware::by_path_param("tenant"))
                .route("/jobs/{job}", web::get().to(hold)),
        ),
    )
    .await;

    let (first, (same, other)) = join(call!(&app, "/tenants/acme/jobs/1?hold=800"), async {
        actix_web::rt::time::sleep(ms(200)).await;
        let same = call!(&app, "/tenants/acme/jobs/2").await;
        let other = call!(&app, "/tenants/globex/jobs/1").await;
        (same, other)
    })
    .await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "redlock:tenant=acme")
    );
    assert_eq!(same.status, 409, "another job of the same tenant: {same:?}");
    assert_eq!(
        (other.status, other.body.as_str()),
        (200, "redlock:tenant=globex"),
        "another tenant runs meanwhile"
    );
}

/// `by_path_params(["from", "to"])` on the scope that declares them: a
/// transfer holds both accounts as one lock; the same pair reversed and a
/// transfer sharing one account get 409, another pair runs.
#[actix_web::test]
async fn by_path_params_locks_both_accounts_of_a_transfer_together() {
    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new().app_data(redlock(&cluster)).service(
            web::scope("/transfers/{from}/{to}")
                .wrap(RedlockMiddleware::by_path_params_as(
                    ["from", "to"],
                    "account",
                ))
                .route("/go", web::get().to(hold)),
        ),
    )
    .await;
    let (first, (reversed, shared, other)) =
        join(call!(&app, "/transfers/7/9/go?hold=1500"), async {
            assert!(
                redlock_tests::util::eventually(Duration::from_secs(5), || {
                    cluster.count_with_key("redlock:account=7") == 3
                        && cluster.count_with_key("redlock:account=9") == 3
                })
                .await,
                "the first transfer never took both accounts"
            );
            let reversed = call!(&app, "/transfers/9/7/go").await;
            let shared = call!(&app, "/transfers/5/9/go").await;
            let other = call!(&app, "/transfers/1/2/go").await;
            (reversed, shared, other)
        })
        .await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "redlock:account=7")
    );
    assert_eq!(reversed.status, 409, "the same pair reversed: {reversed:?}");
    assert_eq!(shared.status, 409, "a pair sharing account 9: {shared:?}");
    assert_eq!(
        (other.status, other.body.as_str()),
        (200, "redlock:account=1"),
        "another pair runs meanwhile"
    );
}

#[actix_web::test]
async fn by_path_param_on_the_app_finds_no_parameter_as_documented() {
    let cluster = Cluster::start(3);
    // Wrapped on the App, the route's `{tenant}` is not filled in yet: no key.
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .wrap(RedlockMiddleware::by_path_param("tenant"))
            .route("/tenants/{tenant}", web::get().to(hold)),
    )
    .await;
    let unlocked = call!(&app, "/tenants/acme").await;
    assert_eq!((unlocked.status, unlocked.body.as_str()), (200, "unlocked"));

    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .wrap(
                RedlockMiddleware::by_path_param("tenant").on_missing_key(MissingKeyPolicy::Reject),
            )
            .route("/tenants/{tenant}", web::get().to(hold)),
    )
    .await;
    let rejected = call!(&app, "/tenants/acme").await;
    assert_eq!(rejected.status, 400, "{rejected:?}");
}

#[actix_web::test]
async fn by_match_pattern_on_the_app_locks_every_request_of_one_route() {
    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .wrap(RedlockMiddleware::by_match_pattern())
            .route("/tenants/{tenant}/jobs/{job}", web::get().to(hold))
            .route("/health", web::get().to(hold)),
    )
    .await;
    let key = "redlock:/tenants/{tenant}/jobs/{job}";

    let (first, (same_route, other_route)) =
        join(call!(&app, "/tenants/acme/jobs/1?hold=800"), async {
            actix_web::rt::time::sleep(ms(200)).await;
            let same = call!(&app, "/tenants/globex/jobs/2").await;
            let other = call!(&app, "/health").await;
            (same, other)
        })
        .await;
    assert_eq!((first.status, first.body.as_str()), (200, key));
    assert_eq!(same_route.status, 409, "{same_route:?}");
    assert_eq!(same_route.json()["key"], key);
    assert_eq!(
        (other_route.status, other_route.body.as_str()),
        (200, "redlock:/health")
    );
    let unrouted = call!(&app, "/nowhere").await;
    assert_eq!(
        unrouted.status, 404,
        "no route, no key, no lock: {unrouted:?}"
    );
}

#[actix_web::test]
async fn by_fn_locks_on_a_computed_key() {
    let cluster = Cluster::start(3);
    let by_account = RedlockMiddleware::by_fn(|req: &ServiceRequest| {
        req.query_string()
            .split('&')
            .find_map(|kv| kv.strip_prefix("account="))
            .map(|a| format!("account:{a}"))
    })
    .namespace("bank:");
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .wrap(by_account)
            .route("/transfer", web::get().to(hold)),
    )
    .await;

    let (first, (same, other, none)) = join(call!(&app, "/transfer?account=7&hold=800"), async {
        actix_web::rt::time::sleep(ms(200)).await;
        let same = call!(&app, "/transfer?account=7").await;
        let other = call!(&app, "/transfer?account=8").await;
        let none = call!(&app, "/transfer").await;
        (same, other, none)
    })
    .await;
    assert_eq!((first.status, first.body.as_str()), (200, "bank:account:7"));
    assert_eq!(same.status, 409, "{same:?}");
    assert_eq!((other.status, other.body.as_str()), (200, "bank:account:8"));
    assert_eq!((none.status, none.body.as_str()), (200, "unlocked"));
}

/// A `Redlock` whose nodes refuse every connection: any lock attempt is a 503.
fn dead_redlock() -> Redlock {
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        })
        .collect();
    Redlock::builder()
        .urls(ports.iter().map(|p| format!("redis://127.0.0.1:{p}")))
        .node_timeout(ms(100))
        .build()
        .unwrap()
}

#[actix_web::test]
async fn handle_comes_from_the_binding_then_app_data_then_web_data() {
    let cluster = Cluster::start(3);
    let live = redlock(&cluster);

    // The bound handle wins over app data (here a dead one).
    let app = test::init_service(
        App::new()
            .app_data(dead_redlock())
            .wrap(RedlockMiddleware::by_path().with_redlock(live.clone()))
            .route("/r", web::get().to(hold)),
    )
    .await;
    let bound = call!(&app, "/r").await;
    assert_eq!((bound.status, bound.body.as_str()), (200, "redlock:/r"));
    let released = || cluster.count_with_key("redlock:/r") == 0;
    assert!(eventually(Duration::from_secs(2), released).await);

    // A plain `Redlock` in app data wins over `web::Data<Redlock>`.
    let app = test::init_service(
        App::new()
            .app_data(live.clone())
            .app_data(web::Data::new(dead_redlock()))
            .wrap(RedlockMiddleware::by_path())
            .route("/r", web::get().to(hold)),
    )
    .await;
    let plain = call!(&app, "/r").await;
    assert_eq!((plain.status, plain.body.as_str()), (200, "redlock:/r"));
    assert!(eventually(Duration::from_secs(2), released).await);

    // `web::Data<Redlock>` alone is found too.
    let app = test::init_service(
        App::new()
            .app_data(web::Data::new(live.clone()))
            .wrap(RedlockMiddleware::by_path())
            .route("/r", web::get().to(hold)),
    )
    .await;
    let data = call!(&app, "/r").await;
    assert_eq!((data.status, data.body.as_str()), (200, "redlock:/r"));

    // The data of the scope the middleware wraps is seen too.
    let app = test::init_service(
        App::new().service(
            web::scope("/s")
                .app_data(live.clone())
                .wrap(RedlockMiddleware::by_path())
                .route("/r", web::get().to(hold)),
        ),
    )
    .await;
    let scoped = call!(&app, "/s/r").await;
    assert_eq!((scoped.status, scoped.body.as_str()), (200, "redlock:/s/r"));

    // None at all: 500 with a problem document; requests without a key still run.
    let app = test::init_service(
        App::new()
            .service(
                web::resource("/r")
                    .wrap(RedlockMiddleware::by_path())
                    .route(web::get().to(hold)),
            )
            .service(
                web::resource("/h")
                    .wrap(RedlockMiddleware::by_header(HeaderName::from_static("x-k")))
                    .route(web::get().to(hold)),
            ),
    )
    .await;
    let none = call!(&app, "/r").await;
    assert_eq!(none.status, 500, "{none:?}");
    assert_eq!(none.json()["title"], "Lock middleware is not configured");
    let keyless = call!(&app, "/h").await;
    assert_eq!((keyless.status, keyless.body.as_str()), (200, "unlocked"));
    let keyed = call!(&app, "/h", ("x-k", "v")).await;
    assert_eq!(keyed.status, 500, "{keyed:?}");
}

#[actix_web::test]
async fn majority_of_nodes_down_answers_503_unless_fail_open() {
    let cluster = Cluster::start(3);
    cluster.node(0).kill();
    cluster.node(1).kill();
    let app = test::init_service(
        App::new()
            .app_data(redlock(&cluster))
            .service(
                web::resource("/closed")
                    .wrap(RedlockMiddleware::by_path())
                    .route(web::get().to(hold)),
            )
            .service(
                web::resource("/open")
                    .wrap(RedlockMiddleware::by_path().fail_open())
                    .route(web::get().to(hold)),
            ),
    )
    .await;

    let closed = call!(&app, "/closed").await;
    assert_eq!(closed.status, 503, "{closed:?}");
    assert!(closed.retry_after.is_some_and(|s| s >= 1), "{closed:?}");
    assert_eq!(
        closed.content_type.as_deref(),
        Some("application/problem+json")
    );
    let doc = closed.json();
    assert_eq!(doc["title"], "Lock service unavailable", "{doc}");
    assert_eq!(doc["key"], "redlock:/closed", "{doc}");
    // A SET still on its way when the attempt was decided is released when it
    // answers, in the background (on this thread: an async wait).
    assert!(
        redlock_tests::util::eventually(Duration::from_secs(2), || cluster
            .count_with_key("redlock:/closed")
            == 0)
        .await,
        "a failed attempt leaves nothing on the live node"
    );

    let open = call!(&app, "/open").await;
    assert_eq!(
        (open.status, open.body.as_str()),
        (200, "unlocked"),
        "fail-open runs the request without a lock"
    );
}
