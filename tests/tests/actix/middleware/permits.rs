//! `RedlockMiddleware::permits(n)` and `shared_for_safe_methods()` (issue 41).

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
