//! The README's first command, with a smaller burst: the demo binary starts
//! its own `redis-server` nodes, runs the burst through the middleware, and
//! must report a pass (every critical section exclusive, no update lost).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_demo_passes_with_a_small_burst() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--requests", "120", "--concurrency", "16"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the demo binary");
    // Read the pipes on threads, so a full pipe cannot stall the demo.
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout piped")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr piped")));
    // A liveness bound: what the demo takes on a quiet machine, with room.
    let bound = redlock_tests::timing::liveness(Duration::from_secs(45));
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the demo") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    let status = status.unwrap_or_else(|| {
        panic!("the demo ran past {bound:?} and was killed\n{stdout}\n{stderr}")
    });
    assert!(
        status.success(),
        "the demo failed ({status})\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("RESULT: PASS"),
        "no pass in the demo's report\n{stdout}\n{stderr}"
    );
}
