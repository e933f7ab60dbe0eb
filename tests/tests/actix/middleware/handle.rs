//! Where the middleware finds its handle, and what it answers when nodes are down.

use crate::common::*;
use actix_web::http::header::HeaderName;
use actix_web::{App, test, web};
use redlock_actix::{Redlock, RedlockMiddleware};
use redlock_tests::Cluster;

use super::*;

/// A `Redlock` whose nodes refuse every connection: any lock attempt is a 503.
pub(super) fn dead_redlock() -> Redlock {
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
pub(super) async fn handle_comes_from_the_binding_then_app_data_then_web_data() {
    let cluster = Cluster::start(3);
    let live = cluster.patient_redlock();

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
    assert!(eventually(timing::settled(), released).await);

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
    assert!(eventually(timing::settled(), released).await);

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
pub(super) async fn majority_of_nodes_down_answers_503_unless_fail_open() {
    let cluster = Cluster::start(3);
    cluster.node(0).kill();
    cluster.node(1).kill();
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
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
        on_no_node(&cluster, "redlock:/closed").await,
        "a failed attempt leaves nothing on the live node"
    );

    let open = call!(&app, "/open").await;
    assert_eq!(
        (open.status, open.body.as_str()),
        (200, "unlocked"),
        "fail-open runs the request without a lock"
    );
}
