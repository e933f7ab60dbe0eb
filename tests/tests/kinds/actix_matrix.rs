//! The web matrix (`web_matrix.rs`) through `redlock-actix`: a
//! `RedlockMiddleware` per primitive and fencing mode, each wrapping a
//! resource (so that `by_path_params` sees the match info), on one cluster,
//! in a real `HttpServer` with two workers. The server refuses half-closed
//! connections (`h1_allow_half_closed(false)`): the crate's docs say actix
//! then drops the handler, and the lock, as soon as the client leaves, which
//! is the cancel ending (by default it lets the handler finish, a release).
//! A panicking handler is dropped with its connection. The handler reads
//! its lock as `web::ReqData<LockHandle>`, and its token as
//! `web::ReqData<FencingToken>`.

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use redlock_actix::{FencingToken, LockHandle, RedlockMiddleware};
use redlock_tests::Cluster;

use super::matrix::{SHAPES, Shape, TTL, assert_hygiene, handle};
use super::web_matrix::{Answer, FENCINGS, Probe, REQUEST, Target, run_cases, template, wait};

async fn handler(
    req: HttpRequest,
    probe: web::Data<Probe>,
    lock: web::ReqData<LockHandle>,
    token: Option<web::ReqData<FencingToken>>,
) -> HttpResponse {
    let id = req.headers().get(REQUEST).and_then(|v| v.to_str().ok());
    let token = token.map(web::ReqData::into_inner);
    match super::web_matrix::handle(probe.into_inner(), id, lock.into_inner(), token).await {
        Answer::Whole(text) => HttpResponse::Ok().body(text),
        Answer::Stream(chunks) => HttpResponse::Ok().streaming(chunks),
    }
}

/// The middleware of `shape`.
fn middleware(shape: Shape) -> RedlockMiddleware {
    let middleware = match shape {
        Shape::MutexOne => RedlockMiddleware::by_path(),
        Shape::MutexSet => RedlockMiddleware::by_path_params(["from", "to"]),
        Shape::Permits2 => RedlockMiddleware::by_path().permits(2),
        Shape::ReadWrite => RedlockMiddleware::by_path().shared_for_safe_methods(),
    };
    middleware.ttl(TTL).wait(wait())
}

#[actix_web::test]
async fn every_primitive_fencing_and_ending_through_the_middleware() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Probe::default());
    let handles: Vec<_> = FENCINGS
        .iter()
        .map(|&(fencing, tag)| (tag, handle(&cluster, fencing)))
        .collect();
    let data = probe.clone();
    let server = HttpServer::new(move || {
        let mut app = App::new().app_data(data.clone());
        for (tag, redlock) in &handles {
            for shape in SHAPES {
                app = app.service(
                    web::resource(template(tag, shape))
                        .wrap(middleware(shape).with_redlock(redlock.clone()))
                        .route(web::get().to(handler))
                        .route(web::post().to(handler)),
                );
            }
        }
        app
    })
    .workers(2)
    .disable_signals()
    .shutdown_timeout(1)
    .h1_allow_half_closed(false)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let stop = server.handle();
    actix_web::rt::spawn(server);

    let probe = probe.into_inner();
    run_cases("actix", &Target { addr, probe }).await;
    stop.stop(false).await;
    assert_hygiene(&cluster, "actix");
}
