//! The model checks (stateright) of the protocols `redlock-core`
//! implements: each is a test target of this package (`tests/`). They are
//! their own package so that the test build can optimize them alone (the
//! workspace's `[profile.dev.package.redlock-models]`): a debug build
//! explores their state spaces several times slower, and they were a
//! quarter of the test command's time.
