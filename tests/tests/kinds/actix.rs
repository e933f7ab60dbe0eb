//! The kinds through `redlock-actix`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix_web::{App, HttpResponse, test, web};
use redlock_actix::RedlockMiddleware;
use redlock_actix::idempotency::IdempotencyMiddleware;
use redlock_core::idempotency::IdempotencyPolicy;
use redlock_tests::Cluster;

use crate::{all_keys, redlock};

/// The twin of the tower test: `by_path_params(["from", "to"])` with shared
/// reads or permits is refused before the handler, with nothing written.
#[actix_web::test]
async fn several_keys_with_shared_reads_or_permits_are_refused_before_the_handler() {
    let cluster = Cluster::start(3);
    for (kind, middleware) in [
        (
            "shared_for_safe_methods",
            RedlockMiddleware::by_path_params_as(["from", "to"], "account")
                .shared_for_safe_methods(),
        ),
        (
            "permits(1)",
            RedlockMiddleware::by_path_params_as(["from", "to"], "account").permits(1),
        ),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&runs);
        let app = test::init_service(
            App::new().app_data(redlock(&cluster)).service(
                web::scope("/transfers/{from}/{to}")
                    .wrap(middleware)
                    .default_service(web::to(move || {
                        counter.fetch_add(1, Ordering::SeqCst);
                        async { HttpResponse::Ok().body("ran") }
                    })),
            ),
        )
        .await;
        for method in [actix_web::http::Method::POST, actix_web::http::Method::GET] {
            let req = test::TestRequest::default()
                .method(method.clone())
                .uri("/transfers/7/9/go")
                .to_request();
            let resp = test::call_service(&app, req).await;
            assert_eq!(resp.status().as_u16(), 500, "{kind}, {method}");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{kind}: the handler ran");
        assert_eq!(all_keys(&cluster), Vec::<String>::new(), "{kind}");
    }
}

/// The twin of the tower test: the idempotency middleware refuses a lock
/// policy that is not the mutex, and no copy runs the handler.
#[actix_web::test]
async fn the_idempotency_middleware_refuses_a_lock_that_is_not_the_mutex() {
    let cluster = Cluster::start(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = test::init_service(
        App::new()
            .wrap(
                IdempotencyMiddleware::new(redlock(&cluster))
                    .policy(IdempotencyPolicy::default().lock(|p| p.permits(2))),
            )
            .route(
                "/pay",
                web::post().to(move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { HttpResponse::Created().body("paid") }
                }),
            ),
    )
    .await;
    for _ in 0..2 {
        let req = test::TestRequest::post()
            .uri("/pay")
            .insert_header(("idempotency-key", "pay-1"))
            .set_payload("{}")
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status().as_u16(), 500);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler ran");
    assert_eq!(all_keys(&cluster), Vec::<String>::new());
}
