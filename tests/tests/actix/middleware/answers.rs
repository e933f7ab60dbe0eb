//! Busy answers and their status, and the key extractors: headers, path parameters, match patterns, closures.

use std::time::Duration;

use crate::common::*;
use actix_web::dev::ServiceRequest;
use actix_web::http::StatusCode;
use actix_web::http::header::HeaderName;
use actix_web::{App, HttpRequest, test, web};
use futures_util::future::join;
use redlock_actix::{LockHandle, MissingKeyPolicy, RedlockMiddleware};
use redlock_tests::Cluster;
use redlock_tests::http_timing::Inside;

/// Sleeps `?hold=<ms>` (0 when absent), or with `?gate` waits at the app's
/// [`Inside`] gate, then answers with the lock's key, or `unlocked` when the request
/// runs without one.
pub(super) async fn hold(
    req: HttpRequest,
    probe: Option<web::Data<Inside>>,
    lock: Option<web::ReqData<LockHandle>>,
) -> String {
    if req.query_string().split('&').any(|kv| kv == "gate") {
        let probe = probe.expect("a `?gate` request needs the app's Inside");
        probe.wait_at_gate().await;
    } else {
        let hold = req
            .query_string()
            .split('&')
            .find_map(|kv| kv.strip_prefix("hold="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        actix_web::rt::time::sleep(ms(hold)).await;
    }
    match lock {
        Some(lock) => lock.key().to_owned(),
        None => "unlocked".to_owned(),
    }
}

/// The TTL of the busy answer's holder: one the patient handle renews (two
/// node timeouts), and not a whole number of seconds.
const BUSY_TTL: Duration = PATIENT_NODE_TIMEOUT
    .saturating_mul(2)
    .saturating_add(Duration::from_millis(500));

#[actix_web::test]
pub(super) async fn busy_answer_is_409_with_retry_after_and_a_problem_document() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .wrap(RedlockMiddleware::by_path().ttl(BUSY_TTL))
            .route("/reports/9", web::get().to(hold)),
    )
    .await;

    let (first, second) = join(call!(&app, "/reports/9?gate"), async {
        probe.entered().await;
        let second = call!(&app, "/reports/9").await;
        probe.gate.open();
        second
    })
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, "redlock:/reports/9");
    assert_eq!(second.status, 409, "{second:?}");
    let retry_after = second.retry_after.expect("Retry-After on a 409");
    let most = BUSY_TTL.as_millis().div_ceil(1000) as u64;
    assert!(
        (1..=most).contains(&retry_after),
        "Retry-After {retry_after} must round the holder's time left (under {BUSY_TTL:?}) up"
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
pub(super) async fn busy_status_is_configurable() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .wrap(RedlockMiddleware::by_path().busy_status(StatusCode::LOCKED))
            .route("/reports/9", web::get().to(hold)),
    )
    .await;

    let (first, second) = join(call!(&app, "/reports/9?gate"), async {
        probe.entered().await;
        let second = call!(&app, "/reports/9").await;
        probe.gate.open();
        second
    })
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(second.status, 423, "{second:?}");
    assert!(second.retry_after.is_some_and(|s| s >= 1), "{second:?}");
    assert_eq!(second.json()["status"], 423);
}

#[actix_web::test]
pub(super) async fn by_header_runs_requests_without_the_header_unlocked_or_rejects_them_with_400() {
    let cluster = Cluster::start(3);
    let tenant = HeaderName::from_static("x-tenant");
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
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
pub(super) async fn by_path_param_on_a_scope_locks_per_tenant() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .service(
                web::scope("/tenants/{tenant}")
                    .wrap(RedlockMiddleware::by_path_param("tenant"))
                    .route("/jobs/{job}", web::get().to(hold)),
            ),
    )
    .await;

    let (first, (same, other)) = join(call!(&app, "/tenants/acme/jobs/1?gate"), async {
        probe.entered().await;
        let same = call!(&app, "/tenants/acme/jobs/2").await;
        let other = call!(&app, "/tenants/globex/jobs/1").await;
        probe.gate.open();
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
pub(super) async fn by_path_params_locks_both_accounts_of_a_transfer_together() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .service(
                web::scope("/transfers/{from}/{to}")
                    .wrap(RedlockMiddleware::by_path_params_as(
                        ["from", "to"],
                        "account",
                    ))
                    .route("/go", web::get().to(hold)),
            ),
    )
    .await;
    let (first, (reversed, shared, other)) = join(call!(&app, "/transfers/7/9/go?gate"), async {
        probe.entered().await;
        assert!(
            on_every_node(&cluster, "redlock:account=7").await
                && on_every_node(&cluster, "redlock:account=9").await,
            "the first transfer never took both accounts"
        );
        let reversed = call!(&app, "/transfers/9/7/go").await;
        let shared = call!(&app, "/transfers/5/9/go").await;
        let other = call!(&app, "/transfers/1/2/go").await;
        probe.gate.open();
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
pub(super) async fn by_path_param_on_the_app_finds_no_parameter_as_documented() {
    let cluster = Cluster::start(3);
    // Wrapped on the App, the route's `{tenant}` is not filled in yet: no key.
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .wrap(RedlockMiddleware::by_path_param("tenant"))
            .route("/tenants/{tenant}", web::get().to(hold)),
    )
    .await;
    let unlocked = call!(&app, "/tenants/acme").await;
    assert_eq!((unlocked.status, unlocked.body.as_str()), (200, "unlocked"));

    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
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
pub(super) async fn by_match_pattern_on_the_app_locks_every_request_of_one_route() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .wrap(RedlockMiddleware::by_match_pattern())
            .route("/tenants/{tenant}/jobs/{job}", web::get().to(hold))
            .route("/health", web::get().to(hold)),
    )
    .await;
    let key = "redlock:/tenants/{tenant}/jobs/{job}";
    // The resource holds braces: its Redis key (what the handler echoes) is
    // one escaped hash tag (`slots.rs`).
    let redis_key = "{redlock:/tenants/%7Btenant%7D/jobs/%7Bjob%7D}";

    let (first, (same_route, other_route)) =
        join(call!(&app, "/tenants/acme/jobs/1?gate"), async {
            probe.entered().await;
            let same = call!(&app, "/tenants/globex/jobs/2").await;
            let other = call!(&app, "/health").await;
            probe.gate.open();
            (same, other)
        })
        .await;
    assert_eq!((first.status, first.body.as_str()), (200, redis_key));
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
pub(super) async fn by_fn_locks_on_a_computed_key() {
    let cluster = Cluster::start(3);
    let by_account = RedlockMiddleware::by_fn(|req: &ServiceRequest| {
        req.query_string()
            .split('&')
            .find_map(|kv| kv.strip_prefix("account="))
            .map(|a| format!("account:{a}"))
    })
    .namespace("bank:");
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .wrap(by_account)
            .route("/transfer", web::get().to(hold)),
    )
    .await;

    let (first, (same, other, none)) = join(call!(&app, "/transfer?account=7&gate"), async {
        probe.entered().await;
        let same = call!(&app, "/transfer?account=7").await;
        let other = call!(&app, "/transfer?account=8").await;
        let none = call!(&app, "/transfer").await;
        probe.gate.open();
        (same, other, none)
    })
    .await;
    assert_eq!((first.status, first.body.as_str()), (200, "bank:account:7"));
    assert_eq!(same.status, 409, "{same:?}");
    assert_eq!((other.status, other.body.as_str()), (200, "bank:account:8"));
    assert_eq!((none.status, none.body.as_str()), (200, "unlocked"));
}
