//! `RedlockMiddleware::permits(n)` and `shared_for_safe_methods()` (issue
//! 41), and the `RateLimit` fields of the busy answers (issue 51).

use std::time::{Duration, Instant};

use crate::common::*;
use actix_web::{App, test, web};
use futures_util::future::join3;
use redlock_actix::RedlockMiddleware;
use redlock_tests::Cluster;
use redlock_tests::http_timing::Inside;

use super::answers::hold;

#[actix_web::test]
pub(super) async fn permits_admit_two_and_answer_the_third_429() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .wrap(RedlockMiddleware::by_path().permits(2))
            .route("/exports", web::get().to(hold)),
    )
    .await;
    // One after the other (no two attempts on one slot at the same moment,
    // which can split the nodes and send both to the next slot): each goes
    // once the one before is inside; the first two stay until the third was
    // answered.
    let second = async {
        probe.holding(1).await;
        call!(&app, "/exports?gate").await
    };
    let late = async {
        probe.holding(2).await;
        let late = call!(&app, "/exports").await;
        probe.gate.open();
        late
    };
    let (a, b, c) = join3(call!(&app, "/exports?gate"), second, late).await;
    let statuses = [a.status, b.status, c.status];
    assert_eq!(statuses, [200, 200, 429], "{a:?} {b:?} {c:?}");
    assert!(c.retry_after.is_some(), "429 without Retry-After");
    assert_eq!(c.content_type.as_deref(), Some("application/problem+json"));
}

/// The busy answers once the two permits of `/exports` are held: the
/// opted-in scope's 429 carries `RateLimit-Policy` and `RateLimit` with `t`
/// its `Retry-After`, the other scope's on the same key does not, and an
/// opted-in mutex scope's 409 does not either.
#[actix_web::test]
pub(super) async fn a_permits_busy_answer_carries_the_rate_limit_fields_when_asked() {
    const TTL: Duration = Duration::from_secs(60);
    let cluster = Cluster::start(3);
    let redlock = cluster.patient_redlock();
    let by_key = || RedlockMiddleware::by_fn(|_| Some("exports".to_owned()));
    let app = test::init_service(
        App::new()
            .app_data(redlock.clone())
            .service(
                web::scope("/fields")
                    .wrap(by_key().permits(2).rate_limit_fields())
                    .route("", web::get().to(|| async { "ran" })),
            )
            .service(
                web::scope("/plain")
                    .wrap(by_key().permits(2))
                    .route("", web::get().to(|| async { "ran" })),
            )
            .service(
                web::scope("/mutex")
                    .wrap(by_key().namespace("jobs:").rate_limit_fields())
                    .route("", web::get().to(|| async { "ran" })),
            ),
    )
    .await;
    // The two permits of the key (the middleware's resource: namespace,
    // then key) and its mutex under `jobs:`, held from here.
    let taken = Instant::now();
    let permits = redlock.semaphore("redlock:exports", 2).unwrap();
    let first = permits.try_acquire(TTL).await.unwrap();
    let second = permits.try_acquire(TTL).await.unwrap();
    let job = redlock
        .mutex("jobs:exports")
        .try_acquire(TTL)
        .await
        .unwrap();

    let limited = call!(&app, "/fields").await;
    let waited = taken.elapsed();
    assert_eq!(limited.status, 429, "{limited:?}");
    let t = limited.retry_after.expect("429 without Retry-After");
    assert_eq!(
        limited.rate_limit,
        (
            Some(r#""permits";q=2;qu="concurrent-requests""#.to_owned()),
            Some(format!(r#""permits";r=0;t={t}"#)),
        )
    );
    // `t` is when the sooner permit frees: within the holders' TTL, and no
    // earlier than what is left of it.
    assert!(
        t <= TTL.as_secs() && Duration::from_secs(t) + waited >= TTL,
        "t = {t} s for permits taken {waited:?} ago with a {TTL:?} TTL"
    );

    let plain = call!(&app, "/plain").await;
    assert_eq!(plain.status, 429, "{plain:?}");
    assert!(plain.retry_after.is_some());
    assert_eq!(plain.rate_limit, (None, None), "fields by default");

    let busy = call!(&app, "/mutex").await;
    assert_eq!(busy.status, 409, "{busy:?}");
    assert!(busy.retry_after.is_some());
    assert_eq!(busy.rate_limit, (None, None), "fields on a mutex");

    for lock in [first, second, job] {
        redlock.unlock(lock).await.unwrap();
    }
}

#[actix_web::test]
pub(super) async fn reads_share_a_path_that_a_write_holds_alone() {
    let cluster = Cluster::start(3);
    let probe = web::Data::new(Inside::default());
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .app_data(probe.clone())
            .wrap(RedlockMiddleware::by_path().shared_for_safe_methods())
            .route("/reports/7", web::get().to(hold))
            .route("/reports/7", web::post().to(hold)),
    )
    .await;
    // The write goes once both reads are inside; they stay until it was
    // answered.
    let write = async {
        probe.holding(2).await;
        let req = test::TestRequest::post().uri("/reports/7").to_request();
        let write = Answer::of(test::call_service(&app, req).await).await;
        probe.gate.open();
        write
    };
    let (a, b, w) = join3(
        call!(&app, "/reports/7?gate"),
        call!(&app, "/reports/7?gate"),
        write,
    )
    .await;
    assert_eq!([a.status, b.status], [200, 200], "{a:?} {b:?}");
    assert_eq!(w.status, 409, "a write beside reads: {w:?}");
}

#[actix_web::test]
pub(super) async fn reads_of_many_distinct_paths_leave_no_key_on_the_nodes() {
    const PATHS: usize = 60;
    let cluster = Cluster::start(3);
    let app = test::init_service(
        App::new()
            .app_data(cluster.patient_redlock())
            .wrap(RedlockMiddleware::by_path().shared_for_safe_methods())
            .route("/r/{id}", web::get().to(hold)),
    )
    .await;
    for id in 0..PATHS {
        let answer = call!(&app, &format!("/r/{id}")).await;
        assert_eq!(answer.status, 200, "GET /r/{id}: {answer:?}");
    }
    // Each read's release is sent as its body ends; wait for them to land.
    let clean = cluster.wait_until(timing::settled(), |c| {
        c.nodes().iter().all(|n| n.keys().is_empty())
    });
    let left: Vec<Vec<String>> = cluster.nodes().iter().map(|n| n.keys()).collect();
    assert!(
        clean,
        "{PATHS} reads of distinct paths left keys on the nodes: {} / {} / {}, e.g. {:?}",
        left[0].len(),
        left[1].len(),
        left[2].len(),
        left[0].iter().take(3).collect::<Vec<_>>()
    );
}
