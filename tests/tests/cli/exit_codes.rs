//! A command's own exit code that equals one of `redlock`'s (issue 38, item
//! 8): passed through as documented, or kept apart with `--remap-child-exit`.

use redlock_tests::Cluster;

use super::{redlock, text};

#[test]
fn a_childs_own_75_or_79_passes_through_or_is_remapped_on_request() {
    let cluster = Cluster::start(1);
    let nodes = cluster.urls().join(",");
    let run = |extra: &[&str], code: u8| {
        let mut c = redlock(&nodes);
        c.args(["run", "--key", "cli-codes"]);
        c.args(extra);
        c.args(["--", "sh", "-c"]);
        c.arg(format!("exit {code}"));
        c.output().unwrap()
    };
    // The default: the command's own code, whatever it is (documented).
    let out = run(&[], 75);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    for code in [64, 69, 75, 79] {
        let out = run(&["--remap-child-exit", "3"], code);
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&format!("the command exited {code}; reported as 3")),
            "{}",
            text(&out.stderr)
        );
    }
    // Other codes are untouched.
    let out = run(&["--remap-child-exit", "3"], 7);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    // A target that is itself one of redlock's codes is refused.
    let out = run(&["--remap-child-exit", "79"], 0);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
}
