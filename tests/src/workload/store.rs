//! The stores the workload counts on, with an exact validity check: one in memory, one in files under `flock`.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::history::now_ns;

/// A fault-free counter store with an exact validity check.
pub trait Store: Send + Sync {
    /// Reads the counter of `res`. Returns the value and when it was read.
    fn read(&self, res: &str) -> (u64, u64);

    /// Writes `value` if `Instant::now() < valid_until`, both under the store's
    /// lock. `Ok(at)`: written at `at`; `Err(at)`: the validity had run out.
    fn write_if_valid(&self, res: &str, value: u64, valid_until: Instant) -> Result<u64, u64>;

    /// Writes `value` with no check at all (the holder-view workload, whose
    /// writes are judged by the holder's own `is_lost()` check). Returns when it
    /// wrote, under the store's lock.
    fn write(&self, res: &str, value: u64) -> u64;

    /// The counter of `res` (0 if never written).
    fn count(&self, res: &str) -> u64;
}

/// A [`Store`] in memory, for clients that are tasks of one process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    values: Mutex<HashMap<String, u64>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn read(&self, res: &str) -> (u64, u64) {
        let values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        (values.get(res).copied().unwrap_or(0), now_ns())
    }

    fn write_if_valid(&self, res: &str, value: u64, valid_until: Instant) -> Result<u64, u64> {
        let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        // `at` is read first, so `at <= now < valid_until` for a write.
        let at = now_ns();
        let now = Instant::now();
        if now < valid_until {
            values.insert(res.to_owned(), value);
            Ok(at)
        } else {
            Err(at)
        }
    }

    fn write(&self, res: &str, value: u64) -> u64 {
        let mut values = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        let at = now_ns();
        values.insert(res.to_owned(), value);
        at
    }

    fn count(&self, res: &str) -> u64 {
        self.read(res).0
    }
}

/// A [`Store`] of one file per resource under `flock`, shared by processes.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// A store in `dir` (created if missing).
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).expect("create the store dir");
        Self { dir }
    }

    pub(super) fn open_locked(&self, res: &str) -> std::fs::File {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(format!("{res}.count")))
            .expect("open the store file");
        f.lock().expect("flock the store file");
        f
    }

    pub(super) fn value(f: &mut std::fs::File) -> u64 {
        let mut s = String::new();
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.read_to_string(&mut s).expect("read the store file");
        s.trim().parse().unwrap_or(0)
    }
}

impl Store for FileStore {
    fn read(&self, res: &str) -> (u64, u64) {
        let mut f = self.open_locked(res);
        let v = Self::value(&mut f);
        (v, now_ns())
    }

    fn write_if_valid(&self, res: &str, value: u64, valid_until: Instant) -> Result<u64, u64> {
        let mut f = self.open_locked(res);
        let at = now_ns();
        let now = Instant::now();
        if now >= valid_until {
            return Err(at);
        }
        f.set_len(0).expect("truncate");
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.write_all(value.to_string().as_bytes()).expect("write");
        f.flush().expect("flush");
        Ok(at)
    }

    fn write(&self, res: &str, value: u64) -> u64 {
        let mut f = self.open_locked(res);
        let at = now_ns();
        f.set_len(0).expect("truncate");
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.write_all(value.to_string().as_bytes()).expect("write");
        f.flush().expect("flush");
        at
    }

    fn count(&self, res: &str) -> u64 {
        self.read(res).0
    }
}
