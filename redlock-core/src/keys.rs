//! Which keys a lock holds: one resource's, or several resources taken
//! together under one token ([`Redlock::lock_many`](crate::Redlock::lock_many)).
//! Every step that sends a lock's keys (release, extend, the release of late
//! answers) takes a [`Keys`], so one path serves both.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::Error;
use crate::redlock::Redlock;

/// The most resources one lock may hold together. Each one is a key the
/// acquire script checks and sets on every node in one atomic step, so the
/// number bounds how long one script blocks a node.
pub const MAX_RESOURCES: usize = 64;

/// Several resources locked together: deduplicated, in the order of their
/// keys (the same set always gives the same order and the same label).
#[derive(Debug)]
pub(crate) struct Many {
    /// The resources, in key order.
    pub(crate) resources: Box<[Arc<str>]>,
    /// Their Redis keys, in the same order.
    pub(crate) keys: Box<[Arc<str>]>,
    /// What errors, spans and `Lock::resource` name the set by: `{a, b}`.
    pub(crate) label: Arc<str>,
}

/// The keys one lock holds.
#[derive(Debug, Clone)]
pub(crate) enum Keys {
    One(Arc<str>),
    Many(Arc<Many>),
}

impl Keys {
    /// The first key (the only one of a single-resource lock): the one the
    /// local waiter queue and the metrics go by.
    pub(crate) fn first(&self) -> &Arc<str> {
        match self {
            Keys::One(k) => k,
            Keys::Many(m) => &m.keys[0],
        }
    }
}

/// The resources of a multi-resource lock as the acquire takes them: each
/// checked, duplicates dropped, sorted by key.
pub(crate) enum Resources {
    /// Only one resource once duplicates are dropped: the single-key path.
    One(String),
    Many(Arc<Many>),
}

impl Redlock {
    /// Checks, deduplicates and orders the resources of a multi-resource lock.
    ///
    /// # Errors
    /// [`Error::NoResources`] for an empty set, [`Error::EmptyResource`] for an
    /// empty name, [`Error::TooManyResources`] past [`MAX_RESOURCES`].
    pub(crate) fn resources<I, R>(&self, resources: I) -> Result<Resources, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<str>,
    {
        let mut by_key: BTreeMap<String, Arc<str>> = BTreeMap::new();
        for r in resources {
            let r = r.as_ref();
            self.check_resource(r)?;
            by_key.entry(self.key_for(r)).or_insert_with(|| r.into());
            if by_key.len() > MAX_RESOURCES {
                return Err(Error::TooManyResources { max: MAX_RESOURCES });
            }
        }
        if by_key.len() <= 1 {
            return match by_key.into_values().next() {
                Some(r) => Ok(Resources::One(r.to_string())),
                None => Err(Error::NoResources),
            };
        }
        let (keys, resources): (Vec<Arc<str>>, Vec<Arc<str>>) =
            by_key.into_iter().map(|(k, r)| (Arc::from(k), r)).unzip();
        let label = format!("{{{}}}", resources.join(", "));
        Ok(Resources::Many(Arc::new(Many {
            resources: resources.into(),
            keys: keys.into(),
            label: label.into(),
        })))
    }
}
