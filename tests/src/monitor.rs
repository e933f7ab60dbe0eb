//! A `MONITOR` recorder: proves which commands a client actually sent.

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{read_line, write_command};

/// Records the lines `MONITOR` prints, one per command the node runs.
#[derive(Debug)]
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    pub(crate) fn start(port: u16) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect for MONITOR");
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        write_command(&mut stream, &["MONITOR"]).expect("send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
        // Wait for +OK so nothing sent after start() is missed.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(l) = read_line(&mut reader) {
                assert_eq!(l, "+OK", "MONITOR refused");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "MONITOR did not answer"
            );
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l2, s2) = (Arc::clone(&lines), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s2.load(Ordering::SeqCst) {
                if let Some(line) = read_line(&mut reader) {
                    l2.lock().unwrap_or_else(PoisonError::into_inner).push(line);
                }
            }
        });
        Self {
            lines,
            stop,
            thread: Some(thread),
        }
    }

    /// The lines seen so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The commands sent by clients (not by Lua scripts), as their argument lists.
    pub fn client_commands(&self) -> Vec<Vec<String>> {
        self.lines()
            .iter()
            .filter(|l| !l.contains("[0 lua]") && !l.contains(" lua]"))
            .filter_map(|l| parse_monitor_line(l))
            .collect()
    }

    /// Stops recording and returns every line.
    pub fn stop(mut self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(100));
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.lines()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// `+1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc" "1"` → `["EVALSHA","abc","1"]`.
pub fn parse_monitor_line(line: &str) -> Option<Vec<String>> {
    let start = line.find("] ")? + 2;
    let mut args = Vec::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        arg.push(n);
                    }
                }
                '"' => break,
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some(args)
}
