//! Command-line arguments of the probe programs (`src/bin/fairness.rs`,
//! `src/bin/rw_fairness.rs`): `--name value` pairs and bare flags.

use std::collections::HashMap;

/// A probe's arguments: `--name value` pairs, and flags (`--stops`) as
/// `"true"`.
#[derive(Debug)]
pub struct ProbeArgs {
    program: &'static str,
    usage: &'static str,
    values: HashMap<String, String>,
}

impl ProbeArgs {
    /// The process's arguments, for `program` whose usage line is `usage`;
    /// exits with 2 on an argument that is not `--name`.
    pub fn parse(program: &'static str, usage: &'static str) -> Self {
        let mut out = Self {
            program,
            usage,
            values: HashMap::new(),
        };
        let mut it = std::env::args().skip(1).peekable();
        while let Some(k) = it.next() {
            let Some(name) = k.strip_prefix("--") else {
                out.fail(&format!("unexpected argument {k}"))
            };
            let value = match it.peek() {
                Some(v) if !v.starts_with("--") => it.next().unwrap_or_default(),
                _ => "true".to_owned(),
            };
            out.values.insert(name.to_owned(), value);
        }
        out
    }

    /// Says what was wrong and how to call the program, and exits with 2.
    pub fn fail(&self, msg: &str) -> ! {
        fail(self.program, self.usage, msg)
    }

    /// `--k`'s value, if given.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.values.get(k).map(String::as_str)
    }

    /// Whether `--k` was given.
    pub fn has(&self, k: &str) -> bool {
        self.values.contains_key(k)
    }

    /// A worker's `--nodes` (comma-separated URLs); exits with 2 without it.
    pub fn nodes(&self) -> Vec<String> {
        self.get("nodes")
            .unwrap_or_else(|| self.fail("--nodes is required"))
            .split(',')
            .map(str::to_owned)
            .collect()
    }

    /// `--k` as a whole number, `default` when not given.
    pub fn num(&self, k: &str, default: u64) -> u64 {
        self.get(k).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| self.fail(&format!("--{k} {v} is not a whole number")))
        })
    }
}

/// Says what was wrong with `program`'s call and how to call it (`usage`),
/// and exits with 2.
pub fn fail(program: &str, usage: &str, msg: &str) -> ! {
    eprintln!("{program}: {msg}");
    eprintln!("usage: {usage}");
    std::process::exit(2)
}

/// How every probe's worker waits (issue 48's runs): a 10 s deadline, a
/// 100 ms delay and 100 ms of jitter; each hold is three 15 ms sections
/// under a 1 s TTL ([`HOLD_TTL`], [`SECTION`]).
pub fn wait_policy() -> redlock_core::RetryPolicy {
    redlock_core::RetryPolicy::deadline(std::time::Duration::from_secs(10))
        .with_delay(std::time::Duration::from_millis(100))
        .with_jitter(std::time::Duration::from_millis(100))
}

/// The lock TTL of every probe's holds.
pub const HOLD_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// One of the three sections of every probe's hold.
pub const SECTION: std::time::Duration = std::time::Duration::from_millis(15);
