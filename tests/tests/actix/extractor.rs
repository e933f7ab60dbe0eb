//! The `HeldLock` extractor over real Redis nodes: a key computed by the
//! `HeldLockConfig` in app data admits one of two concurrent requests, the lock
//! goes when the handler returns (not at the end of its body), a key computed
//! from the handler's own JSON argument through `HeldLock::acquire`, the
//! rejections (400, 500, 503) and fail-open, config lookup, and `HeldLock::run`
//! stopping the work when the lock is lost.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::{App, HttpRequest, HttpResponse, test, web};
use bytes::Bytes;
use futures_util::future::join;
use http_body_util::BodyExt;
use redlock_actix::{HeldLock, HeldLockConfig, LockHandle, LockPolicy, LockRejection};
use redlock_tests::Cluster;
use redlock_tests::http_timing::Inside;

/// The key of `/orders/{order}/...`: `order:<id>`.
fn order_config() -> HeldLockConfig {
    HeldLockConfig::new().key(|req| req.match_info().get("order").map(|o| format!("order:{o}")))
}

/// What a test sees of a gated handler: whether it is inside (under its
/// lock), and the gates it waits at until the test checked what others get.
#[derive(Default)]
struct Probe {
    inside: Inside,
    /// For a handler that waits twice (the export's body).
    second_gate: Gate,
}

/// Holds the extracted lock for `?hold=<ms>`, or with `?gate` until the test
/// opens the app's [`Probe`], then answers with its key (or `unlocked`).
async fn settle(req: HttpRequest, probe: Option<web::Data<Probe>>, lock: HeldLock) -> String {
    if req.query_string() == "gate" {
        let probe = probe.expect("a `?gate` request needs the app's Probe");
        probe.inside.wait_at_gate().await;
    } else {
        let hold = req
            .query_string()
            .strip_prefix("hold=")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        actix_web::rt::time::sleep(ms(hold)).await;
    }
    match lock.handle() {
        Some(handle) => handle.key().to_owned(),
        None => "unlocked".to_owned(),
    }
}

#[actix_web::test]
async fn extracted_lock_admits_one_of_two_concurrent_requests_for_a_key() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Probe::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .app_data(order_config())
            .route("/orders/{order}/settle", web::get().to(settle)),
    )
    .await;

    let (first, (second, other)) = join(call!(&app, "/orders/1/settle?gate"), async {
        probe.inside.entered().await;
        let second = call!(&app, "/orders/1/settle").await;
        let other = call!(&app, "/orders/2/settle").await;
        probe.inside.gate.open();
        (second, other)
    })
    .await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "redlock:order:1")
    );
    assert_eq!(second.status, 409, "{second:?}");
    assert!(second.retry_after.is_some_and(|s| s >= 1), "{second:?}");
    assert_eq!(
        second.content_type.as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(second.json()["key"], "redlock:order:1");
    assert_eq!(
        (other.status, other.body.as_str()),
        (200, "redlock:order:2"),
        "another order runs meanwhile"
    );
}

#[actix_web::test]
async fn extracted_lock_is_released_when_the_handler_returns_not_at_the_body_end() {
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let probe = web::Data::new(Probe::default());
    let shared = probe.clone();
    let server = serve!(move || {
        App::new()
            .app_data(redlock.clone())
            .app_data(shared.clone())
            .app_data(order_config())
            .route(
                "/orders/{order}/export",
                web::get().to(|lock: HeldLock, probe: web::Data<Probe>| async move {
                    // A closure's argument must be moved into the async block,
                    // or it is dropped (released) before the work starts.
                    let _lock = lock;
                    // Work under the lock until the test has seen it busy (the
                    // first export only), then a body that streams after the
                    // handler has returned: its first row at once, the rest
                    // once the test has seen the lock go.
                    let first = probe.inside.max() == 0;
                    if first {
                        probe.inside.wait_at_gate().await;
                    }
                    let chunks = futures_util::stream::unfold(0u32, move |i| {
                        let probe = probe.clone();
                        async move {
                            if i > 10 {
                                return None;
                            }
                            if i == 1 && first {
                                probe.second_gate.passed().await;
                            }
                            if i > 0 {
                                actix_web::rt::time::sleep(ms(100)).await;
                            }
                            Some((
                                Ok::<_, Infallible>(Bytes::from(format!("row {i}\n"))),
                                i + 1,
                            ))
                        }
                    });
                    HttpResponse::Ok().streaming(chunks)
                }),
            )
    });
    let client = client();
    let url = server.url("/orders/5/export");

    let (response, during) = join(open(&client, &url), async {
        probe.inside.entered().await;
        let during = get(&client, &url).await;
        probe.inside.gate.open();
        during
    })
    .await;
    assert_eq!(
        during.status, 409,
        "held while the handler runs: {during:?}"
    );
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = within(CLIENT_TIMEOUT, "first row", body.frame())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.data_ref().map(|b| &b[..]), Some(&b"row 0\n"[..]));
    // The body waits after its first row: held to the body's end, the key
    // would stay until the test lets it go on.
    assert!(
        on_no_node(&cluster, "redlock:order:5").await,
        "the lock must go when the handler returns"
    );
    let meanwhile = get(&client, &url).await;
    assert_eq!(
        meanwhile.status, 200,
        "a second export runs while the first streams"
    );
    probe.second_gate.open();
    let rest = within(CLIENT_TIMEOUT, "rest of the body", body.collect())
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&rest).ends_with("row 10\n"));
}

/// Locks on the `from` account of its JSON body, then (for account 7) works
/// until the test opens the app's [`Probe`].
async fn transfer(
    req: HttpRequest,
    probe: web::Data<Probe>,
    body: web::Json<serde_json::Value>,
) -> Result<String, LockRejection> {
    let from = body["from"].as_u64().unwrap_or_default();
    let lock = HeldLock::acquire(&req, format!("account:{from}")).await?;
    if from == 7 {
        probe.inside.wait_at_gate().await;
    }
    Ok(lock
        .handle()
        .map(|h| h.key().to_owned())
        .unwrap_or_default())
}

#[actix_web::test]
async fn acquire_locks_on_a_key_computed_from_the_handlers_own_arguments() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Probe::default());
    let app = test::init_service(
        App::new()
            .app_data(web::Data::new(cluster.patient_redlock()))
            .app_data(probe.clone())
            .route("/transfers", web::post().to(transfer)),
    )
    .await;
    let post = |from: u64| {
        let req = test::TestRequest::post()
            .uri("/transfers")
            .set_json(serde_json::json!({ "from": from, "to": 99 }))
            .to_request();
        async { Answer::of(test::call_service(&app, req).await).await }
    };

    let (first, (second, other)) = join(post(7), async {
        probe.inside.entered().await;
        let both = (post(7).await, post(8).await);
        probe.inside.gate.open();
        both
    })
    .await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "redlock:account:7")
    );
    assert_eq!(second.status, 409, "{second:?}");
    assert!(second.retry_after.is_some_and(|s| s >= 1), "{second:?}");
    assert_eq!(second.json()["key"], "redlock:account:7");
    assert_eq!(
        (other.status, other.body.as_str()),
        (200, "redlock:account:8")
    );
    assert!(
        on_no_node(&cluster, "redlock:account:7").await,
        "released after the handler"
    );
}

#[actix_web::test]
async fn rejections_and_config_lookup() {
    let cluster = Cluster::start(3);
    let live = cluster.patient_redlock();
    let app = test::init_service(
        App::new()
            .app_data(live.clone())
            // App level: no key function, so the extractor has no key (400).
            .route("/keyless/{order}", web::get().to(settle))
            .service(
                // Scope level config, in web::Data, with its own key and prefix.
                web::scope("/orders/{order}")
                    .app_data(web::Data::new(
                        order_config().policy(LockPolicy::default().namespace("shop:")),
                    ))
                    .route("/settle", web::get().to(settle)),
            )
            .service(
                web::resource("/lenient/{order}")
                    .app_data(order_config().policy(LockPolicy::default()).key(|_| None))
                    .route(web::get().to(settle)),
            ),
    )
    .await;
    let keyless = call!(&app, "/keyless/1").await;
    assert_eq!(keyless.status, 400, "{keyless:?}");
    assert_eq!(keyless.json()["title"], "Missing lock key");
    let scoped = call!(&app, "/orders/3/settle").await;
    assert_eq!((scoped.status, scoped.body.as_str()), (200, "shop:order:3"));
    let lenient = call!(&app, "/lenient/3").await;
    assert_eq!(
        (lenient.status, lenient.body.as_str()),
        (200, "unlocked"),
        "a pass-through policy runs keyless requests without a lock"
    );

    // No handle anywhere: 500.
    let app = test::init_service(
        App::new()
            .app_data(order_config())
            .route("/orders/{order}/settle", web::get().to(settle)),
    )
    .await;
    let unconfigured = call!(&app, "/orders/1/settle").await;
    assert_eq!(unconfigured.status, 500, "{unconfigured:?}");
    assert_eq!(
        unconfigured.json()["title"],
        "Lock middleware is not configured"
    );

    // A majority of nodes down: 503, or unlocked with fail-open.
    cluster.node(0).kill();
    cluster.node(1).kill();
    let app = test::init_service(
        App::new()
            .app_data(live.clone())
            .app_data(order_config())
            .route("/orders/{order}/settle", web::get().to(settle))
            .service(
                web::resource("/open/{order}")
                    .app_data(order_config().policy(LockPolicy::default().fail_open()))
                    .route(web::get().to(settle)),
            ),
    )
    .await;
    let down = call!(&app, "/orders/1/settle").await;
    assert_eq!(down.status, 503, "{down:?}");
    assert!(down.retry_after.is_some_and(|s| s >= 1), "{down:?}");
    let open = call!(&app, "/open/1").await;
    assert_eq!((open.status, open.body.as_str()), (200, "unlocked"));
}

const RUN_TTL: Duration = PATIENT_NODE_TIMEOUT.saturating_mul(4);

#[actix_web::test]
async fn run_drops_the_work_when_the_lock_is_lost() {
    let cluster = Cluster::start(3);
    let published: Arc<Mutex<Option<LockHandle>>> = Arc::default();
    let dropped_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (publish, recorder) = (published.clone(), dropped_at.clone());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            // A TTL the patient handle renews (two node timeouts).
            .app_data(order_config().policy(LockPolicy::default().ttl(RUN_TTL)))
            .route(
                "/orders/{order}/settle",
                web::get().to(move |lock: HeldLock| {
                    let (publish, recorder) = (publish.clone(), recorder.clone());
                    async move {
                        *publish.lock().unwrap() = lock.handle();
                        lock.run(async {
                            let _recorder = DropRecorder(recorder);
                            actix_web::rt::time::sleep(liveness(RUN_TTL) * 2).await;
                            "finished"
                        })
                        .await
                    }
                }),
            ),
    )
    .await;
    let key = "redlock:order:1";

    let (answer, valid_until) = join(call!(&app, "/orders/1/settle"), async {
        assert!(
            eventually(answered(Duration::ZERO), || published
                .lock()
                .unwrap()
                .is_some())
            .await,
            "the handler never ran"
        );
        // The acquire returned at a quorum; the third `SET` may land after
        // a `DEL` and give the holder a quorum back (seen under load: the
        // renewals went on, and the work ran to the hold cap). Stolen only
        // once it is on every node.
        assert!(
            on_every_node(&cluster, key).await,
            "the lock never reached every node"
        );
        for i in 0..2 {
            cluster.node(i).cmd(&["DEL", key]);
        }
        published.lock().unwrap().as_ref().unwrap().valid_until()
    })
    .await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.json()["title"], "Lock lost");
    let dropped_at = dropped_at
        .lock()
        .unwrap()
        .expect("the work must be dropped");
    assert!(
        dropped_at < valid_until,
        "work dropped {:?} after the validity ended",
        dropped_at - valid_until
    );
}
