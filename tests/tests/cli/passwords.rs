//! No password in the `redlock` command's output (issue 38, item 4), for each
//! URL form redis-rs reads (the password in the userinfo with a raw `,` or
//! `@` or `%`-escapes, or in a unix URL's `?pass=`) and for forms it rejects
//! (a raw `/` in the password, `?password=`, `rediss://` without TLS, an `@`
//! in a query value); `REDLOCK_NODES` split only where a URL starts; the
//! command never gets `REDLOCK_NODES`.

use std::process::Output;
use std::time::Duration;

use redlock_tests::{Cluster, RedisNode};

use super::to_end;

use super::{finish, redlock, text};

/// Every piece of every password below: none may show anywhere.
const PIECES: [&str; 12] = [
    "leftone1",
    "rightone1",
    "lefttwo2",
    "righttwo2",
    "leftthree3",
    "rightthree3",
    "leftfour4",
    "secret4",
    "leftfive5",
    "rightfive5",
    "leftsix6",
    "rightsix6",
];

/// ACL users on every node of `cluster`, with passwords that hold a `,`, an
/// `@`, and `/,@%`.
fn add_users(cluster: &Cluster) {
    for n in cluster.nodes() {
        for (user, password) in [
            ("comma", "leftone1,rightone1"),
            ("at", "lefttwo2@righttwo2"),
            ("esc", "leftthree3/,@%rightthree3"),
        ] {
            n.cmd(&[
                "ACL",
                "SETUSER",
                user,
                "on",
                &format!(">{password}"),
                "~*",
                "&*",
                "+@all",
            ]);
        }
    }
}

fn assert_no_password(out: &Output, what: &str) {
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    for piece in PIECES {
        assert!(
            !all.contains(piece),
            "{what}: {piece:?} of a password in the output:\n{all}"
        );
    }
}

#[test]
fn no_password_shows_for_any_url_form() {
    let cluster = Cluster::start(1);
    add_users(&cluster);
    let p = cluster.node(0).port();
    // A node with a password for its default user, on TCP and a unix socket.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("r.sock");
    let sock_arg = sock.display().to_string();
    let unix = RedisNode::start_with(&["--unixsocket", &sock_arg, "--unixsocketperm", "700"]);
    unix.cmd(&["CONFIG", "SET", "requirepass", "leftfour4secret4"]);
    let up = unix.port();
    let sock = sock.display();
    // (URL, whether it reaches its node with the right password)
    let forms = [
        (
            format!("redis://comma:leftone1,rightone1@127.0.0.1:{p}"),
            true,
        ),
        (format!("redis://at:lefttwo2@righttwo2@127.0.0.1:{p}"), true),
        (
            format!("redis://esc:leftthree3%2F%2C%40%25rightthree3@127.0.0.1:{p}"),
            true,
        ),
        (format!("redis+unix://{sock}?pass=leftfour4secret4"), true),
        (format!("unix://{sock}?pass=leftfour4secret4&db=0"), true),
        (format!("redis://:leftfour4secret4@127.0.0.1:{up}"), true),
        (
            format!("redis+unix://{sock}?password=leftfour4secret4"),
            false,
        ),
        (
            format!("redis://:leftfive5/rightfive5@127.0.0.1:{p}"),
            false,
        ),
        (
            format!("redis://esc:leftthree3/,@%rightthree3@127.0.0.1:{p}"),
            false,
        ),
        (
            format!("rediss://at:lefttwo2@righttwo2@127.0.0.1:{p}"),
            false,
        ),
        // redis-rs ignores `pass` on TCP, and this node's default user has
        // no password: it works, and the query is still not shown.
        (
            format!("redis://127.0.0.1:{p}/0?pass=leftsix6@rightsix6"),
            true,
        ),
    ];
    for (url, works) in &forms {
        let commands: [&[&str]; 3] = [
            &["check"],
            &["status", "cli-pw"],
            &["run", "--key", "cli-pw", "--", "true"],
        ];
        for args in commands {
            // Each command both ways: `--nodes` and `REDLOCK_NODES`.
            for by_flag in [true, false] {
                let mut c = redlock(if by_flag { "" } else { url });
                if by_flag {
                    c.env_remove("REDLOCK_NODES").args(["--nodes", url]);
                }
                c.args(args);
                let out = c.output().unwrap();
                let what = format!("{args:?} with {url} (by flag: {by_flag})");
                assert_no_password(&out, &what);
                if *works {
                    assert_eq!(
                        out.status.code(),
                        Some(0),
                        "{what}: {}{}",
                        text(&out.stdout),
                        text(&out.stderr)
                    );
                } else if args[0] != "status" {
                    // (`status` reports each node's error in its table and exits 0.)
                    assert_ne!(out.status.code(), Some(0), "{what}: {}", text(&out.stdout));
                }
            }
        }
    }
}

#[test]
fn a_comma_in_a_password_does_not_split_the_nodes_and_the_command_gets_no_urls() {
    let cluster = Cluster::start(3);
    add_users(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://comma:leftone1,rightone1@127.0.0.1:{}", n.port()))
        .collect();
    // Commas, a comma and a space, a newline: each separates URLs.
    let nodes = format!("{},{}, \n{}", urls[0], urls[1], urls[2]);
    let mut c = redlock(&nodes);
    c.args(["run", "--key", "cli-comma", "--", "sh", "-c"]);
    c.arg(format!("env > {}", env_file.display()));
    let out = finish(
        c.spawn().unwrap(),
        super::to_start() + to_end(Duration::ZERO),
        "redlock run",
    );
    assert_no_password(&out, "run");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains("REDLOCK_KEY=cli-comma"), "{env}");
    assert!(
        !env.contains("REDLOCK_NODES") && !env.contains("leftone1"),
        "the command got the node URLs: {env}"
    );
    assert_eq!(
        cluster.settled_count_blocking("cli-comma", 0),
        0,
        "released"
    );
    let mut c = redlock(&nodes);
    c.args(["check"]);
    let out = c.output().unwrap();
    assert_no_password(&out, "check");
    assert!(
        text(&out.stdout).contains("3 of 3 node(s) fit"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
