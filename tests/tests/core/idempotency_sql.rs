//! A second `IdempotencyStore`, on SQLite: it proves the trait is enough for
//! a user's own database, written in the same transaction as the work's
//! effects. Its rule is the fencing token's, not the lock key's: a holder
//! claims the key with its token when it reads under the lock, and a write
//! lands only `WHERE fence <= $token`, so a stale holder's late write is
//! refused once a newer holder has come.
//!
//! (This test store keeps records forever; a real one would add an expiry
//! column and sweep it.)

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use redlock_core::idempotency::{
    Fingerprint, Found, Idempotency, IdempotencyKey, IdempotencyStore, LookupKey, Outcome, Record,
    RedisStore, StoreError, StoreFuture,
};
use redlock_core::{FencingMode, LockHandle, LockOptions, Redlock};
use redlock_tests::Cluster;
use rusqlite::{Connection, OptionalExtension, params};

use crate::idempotency::request;

#[derive(Debug)]
struct SqliteStore {
    // Each statement is short and in memory; a real store would use a pool
    // and `spawn_blocking`.
    conn: Mutex<Connection>,
}

impl SqliteStore {
    fn open() -> Self {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE records (lookup TEXT PRIMARY KEY, fence INTEGER NOT NULL, record BLOB)",
        )
        .unwrap();
        Self {
            conn: Mutex::new(conn),
        }
    }

    fn token(holder: &LockHandle) -> Result<i64, StoreError> {
        holder
            .fencing_token()
            .and_then(|t| i64::try_from(t.get()).ok())
            .ok_or_else(|| StoreError::Backend("this store needs fencing tokens".into()))
    }

    /// Runs `f` on the connection; a poisoned lock is a backend error.
    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Backend("poisoned".into()))?;
        f(&conn).map_err(|e| StoreError::Backend(e.to_string()))
    }

    fn read(&self, key: &LookupKey) -> Result<Option<Record>, StoreError> {
        let bytes: Option<Option<Vec<u8>>> = self.with(|c| {
            c.query_row(
                "SELECT record FROM records WHERE lookup = ?1",
                params![key.resource()],
                |row| row.get(0),
            )
            .optional()
        })?;
        match bytes.flatten() {
            Some(bytes) => Ok(Some(Record::decode(&bytes)?)),
            None => Ok(None),
        }
    }
}

impl IdempotencyStore for SqliteStore {
    fn get<'a>(&'a self, key: &'a LookupKey) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move { self.read(key) })
    }

    fn get_held<'a>(
        &'a self,
        key: &'a LookupKey,
        holder: &'a LockHandle,
    ) -> StoreFuture<'a, Option<Found>> {
        Box::pin(async move {
            let token = Self::token(holder)?;
            // Claim the key with this holder's token: from now on an older
            // holder's write is refused.
            let claimed = self.with(|c| {
                c.execute(
                    "INSERT INTO records (lookup, fence, record) VALUES (?1, ?2, NULL)
                     ON CONFLICT (lookup) DO UPDATE SET fence = excluded.fence
                     WHERE records.fence <= excluded.fence",
                    params![key.resource(), token],
                )
            })?;
            if claimed == 0 {
                return Err(StoreError::Backend("fenced out by a newer holder".into()));
            }
            Ok(self.read(key)?.map(|record| Found {
                record,
                durable: true,
            }))
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a LookupKey,
        holder: &'a LockHandle,
        record: &'a Record,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let token = Self::token(holder)?;
            let written = self.with(|c| {
                c.execute(
                    "INSERT INTO records (lookup, fence, record) VALUES (?1, ?2, ?3)
                     ON CONFLICT (lookup) DO UPDATE SET fence = excluded.fence, record = excluded.record
                     WHERE records.fence <= excluded.fence",
                    params![key.resource(), token, record.encode()],
                )
            })?;
            if written == 0 {
                return Err(StoreError::Backend("fenced out by a newer holder".into()));
            }
            Ok(())
        })
    }
}

fn fenced(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .urls(cluster.urls())
        .node_timeout(redlock_tests::timing::PATIENT_NODE_TIMEOUT)
        .fencing(FencingMode::Hybrid)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_records_and_replays_from_sqlite() {
    let cluster = Cluster::start(3);
    let redlock = fenced(&cluster);
    let idem = Idempotency::new(redlock.clone()).store(SqliteStore::open());
    assert_eq!(request(&idem, None, "sql-1", "a").await.unwrap(), None);
    assert_eq!(
        request(&idem, None, "sql-1", "a").await.unwrap(),
        Some((201, Bytes::from_static(b"ran:a")))
    );
    assert_eq!(
        request(&idem, None, "sql-1", "b")
            .await
            .unwrap_err()
            .status(),
        422
    );
    // Nothing went to the Redis nodes but the lock.
    let lookup = idem.lookup_key(None, &IdempotencyKey::parse(b"sql-1").unwrap());
    let record_key = RedisStore::new(redlock).record_key(&lookup);
    assert_eq!(cluster.count_with_key(&record_key), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_s_write_is_refused_by_the_fence() {
    let cluster = Cluster::start(3);
    let redlock = fenced(&cluster);
    let store = SqliteStore::open();
    let lookup = LookupKey::new(
        "idempotency:",
        None,
        &IdempotencyKey::parse(b"sql-2").unwrap(),
    );
    let options = LockOptions::new(Duration::from_secs(10));
    let stale = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    let stale_handle = stale.handle();
    assert!(
        store
            .get_held(&lookup, &stale_handle)
            .await
            .unwrap()
            .is_none()
    );
    for node in cluster.nodes() {
        node.cmd(&["DEL", stale_handle.key()]);
    }
    let next = redlock
        .mutex(lookup.resource())
        .guard(&options)
        .await
        .unwrap();
    assert!(next.fencing_token() > stale_handle.fencing_token());
    assert!(
        store
            .get_held(&lookup, &next.handle())
            .await
            .unwrap()
            .is_none()
    );
    let record = |body: &'static str| Record {
        order: 1,
        fencing_token: None,
        fingerprint: Fingerprint::of_fields([body.as_bytes()]),
        status: 200,
        outcome: Outcome::Replayable {
            headers: Vec::new(),
            body: Bytes::from_static(body.as_bytes()),
        },
    };
    let err = store
        .put(&lookup, &stale_handle, &record("stale"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert_eq!(store.get(&lookup).await.unwrap(), None);
    store
        .put(&lookup, &next.handle(), &record("next"))
        .await
        .unwrap();
    assert_eq!(store.get(&lookup).await.unwrap(), Some(record("next")));
    drop(stale);
    next.release().await.unwrap();
}
