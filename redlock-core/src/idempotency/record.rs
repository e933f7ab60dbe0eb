//! The record of a completed request, and its encoding: what a retry is
//! answered with.
//!
//! The encoding is binary, all integers big-endian, led by a version byte so
//! that a later layout can be read next to this one:
//!
//! ```text
//! u8  version (1)
//! u8  kind: 0 replayable, 1 completed but not replayable
//! u64 order (see Record::order)
//! u8  1 if a fencing token follows, else 0;  u64 fencing token (if 1)
//! [32] fingerprint
//! u16 status
//! u16 header count;  per header: u16 name length, name, u32 value length, value
//! u32 body length;   body
//! ```
//!
//! A not-replayable record has no headers and an empty body.

use bytes::Bytes;

use super::fingerprint::Fingerprint;
use crate::fencing::FencingToken;

/// The version byte this crate writes.
const VERSION: u8 = 1;

/// Why stored bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Written by a version of the encoding this crate does not know.
    #[error("unknown record version {0}")]
    Version(u8),
    /// The bytes end early, or go on after the record.
    #[error("truncated or overlong record")]
    Length,
    /// A field has a value the encoding does not allow.
    #[error("malformed record: {0}")]
    Malformed(&'static str),
}

/// What a retry of a completed request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The response, replayed byte for byte.
    Replayable {
        /// The headers kept (those on the layer's allowlist), in order.
        headers: Vec<(String, Bytes)>,
        /// The body.
        body: Bytes,
    },
    /// The request completed, but its response body was over the cap: a
    /// retry is answered with the layer's documented status instead, and
    /// the work does not run again.
    NotReplayable,
}

/// The record of a completed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The order among records of one key; under the lock the record with the
    /// largest order wins. With fencing on it is the writer's fencing token;
    /// without, in the Redis store, the key's generation the writer took
    /// under its lock from a quorum of nodes (see the module docs of
    /// `redis_store`); a store of the user's without fencing writes 1.
    pub order: u64,
    /// The writer's fencing token, when the lock handle fences.
    pub fencing_token: Option<FencingToken>,
    /// The fingerprint of the request that produced it.
    pub fingerprint: Fingerprint,
    /// The response status.
    pub status: u16,
    /// The response, or why it cannot be replayed.
    pub outcome: Outcome,
}

impl Record {
    /// The encoded record (see the module docs for the layout).
    pub fn encode(&self) -> Vec<u8> {
        let (kind, headers, body): (u8, &[(String, Bytes)], &[u8]) = match &self.outcome {
            Outcome::Replayable { headers, body } => (0, headers, body),
            Outcome::NotReplayable => (1, &[], &[]),
        };
        let mut out = Vec::with_capacity(64 + body.len());
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&self.order.to_be_bytes());
        match self.fencing_token {
            Some(t) => {
                out.push(1);
                out.extend_from_slice(&t.get().to_be_bytes());
            }
            None => out.push(0),
        }
        out.extend_from_slice(&self.fingerprint.0);
        out.extend_from_slice(&self.status.to_be_bytes());
        // Past the layout's bounds (65535 headers, 64 KiB names) the rest is
        // cut rather than the record refused: an allowlist never gets there.
        out.extend_from_slice(&(headers.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
        for (name, value) in headers.iter().take(usize::from(u16::MAX)) {
            let name = name.as_bytes();
            let name = name.get(..usize::from(u16::MAX)).unwrap_or(name);
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            put_u32_bytes(&mut out, value);
        }
        put_u32_bytes(&mut out, body);
        out
    }

    /// Reads a record written by [`Record::encode`].
    ///
    /// # Errors
    /// A [`RecordError`] when the bytes are not a record of a known version.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != VERSION {
            return Err(RecordError::Version(version));
        }
        let kind = r.u8()?;
        let order = u64::from_be_bytes(r.array()?);
        let fencing_token = match r.u8()? {
            0 => None,
            1 => Some(FencingToken::new(u64::from_be_bytes(r.array()?))),
            _ => return Err(RecordError::Malformed("fencing flag")),
        };
        let fingerprint = Fingerprint(r.array()?);
        let status = u16::from_be_bytes(r.array()?);
        let count = u16::from_be_bytes(r.array()?);
        let mut headers = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let len = u16::from_be_bytes(r.array()?);
            let name = std::str::from_utf8(r.take(usize::from(len))?)
                .map_err(|_| RecordError::Malformed("header name"))?
                .to_owned();
            let len = u32::from_be_bytes(r.array()?);
            let value = Bytes::copy_from_slice(r.take(len as usize)?);
            headers.push((name, value));
        }
        let len = u32::from_be_bytes(r.array()?);
        let body = Bytes::copy_from_slice(r.take(len as usize)?);
        if !r.0.is_empty() {
            return Err(RecordError::Length);
        }
        let outcome = match kind {
            0 => Outcome::Replayable { headers, body },
            1 => Outcome::NotReplayable,
            _ => return Err(RecordError::Malformed("kind")),
        };
        Ok(Self {
            order,
            fencing_token,
            fingerprint,
            status,
            outcome,
        })
    }
}

/// A u32 length, then the bytes (cut at `u32::MAX`: the layer's body cap is
/// far below it).
fn put_u32_bytes(out: &mut Vec<u8>, value: &[u8]) {
    let value = value.get(..u32::MAX as usize).unwrap_or(value);
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Length);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.array::<1>()?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        self.take(N)?.try_into().map_err(|_| RecordError::Length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            order: 7,
            fencing_token: Some(FencingToken::new(42)),
            fingerprint: Fingerprint::of_fields([&b"x"[..]]),
            status: 201,
            outcome: Outcome::Replayable {
                headers: vec![
                    (
                        "content-type".into(),
                        Bytes::from_static(b"application/json"),
                    ),
                    ("location".into(), Bytes::from_static(b"/p/1")),
                ],
                body: Bytes::from_static(b"{\"id\":1}"),
            },
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let n = Record {
            fencing_token: None,
            outcome: Outcome::NotReplayable,
            ..sample()
        };
        assert_eq!(Record::decode(&n.encode()).unwrap(), n);
    }

    #[test]
    fn refuses_unknown_versions_and_bad_lengths() {
        let mut bytes = sample().encode();
        assert_eq!(
            Record::decode(&bytes[..bytes.len() - 1]),
            Err(RecordError::Length)
        );
        bytes.push(0);
        assert_eq!(Record::decode(&bytes), Err(RecordError::Length));
        bytes[0] = 9;
        assert_eq!(Record::decode(&bytes), Err(RecordError::Version(9)));
        assert_eq!(Record::decode(&[]), Err(RecordError::Length));
    }
}
