//! torch's `TCPStore` wire protocol, as its client speaks it (torch 2.15): a query type byte,
//! then its fields; strings and byte vectors as a 64-bit length and the bytes, numbers in the
//! host's byte order (little-endian on every machine torch ships for). Pure: bytes in, queries
//! out, and the answers' bytes. Every length is checked against the store's bounds before
//! anything is allocated; a query it cannot read is an error that ends the connection.

use proto::{StoreOp, STORE_KEYS_PER_OP_MAX, STORE_KEY_BYTES_MAX, STORE_VALUE_BYTES_MAX};

/// What the client checks first on connecting (`validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Bytes one query takes at most: its keys and values at their bounds.
pub const QUERY_BYTES_MAX: usize = 1 + 8 + STORE_KEYS_PER_OP_MAX * (16 + STORE_KEY_BYTES_MAX) + 2 * STORE_VALUE_BYTES_MAX;

/// One query of a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Query {
    Validate(u32),
    Ping(u32),
    /// `get`: torch waits for the key first, then asks for its value.
    Get(Vec<u8>),
    /// `wait` (and every `get` before it): answered once every key is there.
    Wait(Vec<Vec<u8>>),
    CancelWait,
    MultiGet(Vec<Vec<u8>>),
    /// Any other operation, answered as the store answers it.
    Op(StoreOp),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("unknown query type {0}")]
    UnknownQuery(u8),
    #[error("a field of {0} bytes, past the store's bounds")]
    TooLong(u64),
}

/// torch's `QueryType`, in its order.
mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
}

/// torch's `CheckResponseType::READY` and `NOT_READY`.
pub const CHECK_READY: u8 = 0;
pub const CHECK_NOT_READY: u8 = 1;
/// torch's `WaitResponseType::STOP_WAITING` and `WAIT_CANCELED`.
pub const WAIT_STOP: u8 = 0;
pub const WAIT_CANCELED: u8 = 1;

/// Why a query could not be read yet: its bytes have not all come, or they are bad.
enum Short {
    More,
    Bad(WireError),
}

impl From<WireError> for Short {
    fn from(e: WireError) -> Short {
        Short::Bad(e)
    }
}

/// Reads fields off a buffer; [`Short::More`] where the buffer ends first, which ends the
/// read of the whole query (no later field is read from where an earlier one stopped).
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Short> {
        let end = self.at.checked_add(n).ok_or(Short::More)?;
        let bytes = self.buf.get(self.at..end).ok_or(Short::More)?;
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, Short> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Result<u32, Short> {
        let mut four = [0u8; 4];
        four.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(four))
    }

    fn u64(&mut self) -> Result<u64, Short> {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(eight))
    }

    /// A length-prefixed byte string of at most `max` bytes.
    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, Short> {
        let len = self.u64()?;
        if len > max as u64 {
            return Err(WireError::TooLong(len).into());
        }
        Ok(self.take(len as usize)?.to_vec())
    }

    fn count(&mut self) -> Result<usize, Short> {
        let n = self.u64()?;
        if n > STORE_KEYS_PER_OP_MAX as u64 {
            return Err(WireError::TooLong(n).into());
        }
        Ok(n as usize)
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, Short> {
        let n = self.count()?;
        (0..n).map(|_| self.bytes(STORE_KEY_BYTES_MAX)).collect()
    }
}

/// The first query in `buf` and the bytes it took; `None` while it is incomplete.
pub fn parse(buf: &[u8]) -> Result<Option<(Query, usize)>, WireError> {
    let mut r = Reader { buf, at: 0 };
    match query(&mut r) {
        Ok(query) => Ok(Some((query, r.at))),
        Err(Short::More) => Ok(None),
        Err(Short::Bad(e)) => Err(e),
    }
}

fn query(r: &mut Reader<'_>) -> Result<Query, Short> {
    let (key, value) = (STORE_KEY_BYTES_MAX, STORE_VALUE_BYTES_MAX);
    Ok(match r.u8()? {
        query::VALIDATE => Query::Validate(r.u32()?),
        query::PING => Query::Ping(r.u32()?),
        query::CANCEL_WAIT => Query::CancelWait,
        query::GETNUMKEYS => Query::Op(StoreOp::NumKeys),
        query::GET => Query::Get(r.bytes(key)?),
        query::DELETE_KEY => Query::Op(StoreOp::Delete { key: r.bytes(key)? }),
        query::WAIT => Query::Wait(r.keys()?),
        query::MULTI_GET => Query::MultiGet(r.keys()?),
        query::CHECK => Query::Op(StoreOp::Check { keys: r.keys()? }),
        query::SET => Query::Op(StoreOp::Set { key: r.bytes(key)?, value: r.bytes(value)? }),
        query::APPEND => Query::Op(StoreOp::Append { key: r.bytes(key)?, value: r.bytes(value)? }),
        query::COMPARE_SET => Query::Op(StoreOp::CompareSet { key: r.bytes(key)?, expected: r.bytes(value)?, desired: r.bytes(value)? }),
        query::ADD => Query::Op(StoreOp::Add { key: r.bytes(key)?, delta: r.u64()? as i64 }),
        query::MULTI_SET => {
            let n = r.count()?;
            let pairs = (0..n).map(|_| Ok((r.bytes(key)?, r.bytes(value)?))).collect::<Result<_, Short>>()?;
            Query::Op(StoreOp::MultiSet { pairs })
        }
        other => return Err(WireError::UnknownQuery(other).into()),
    })
}

/// A byte vector as torch reads one: its length, then the bytes.
pub fn vector(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A 64-bit number as torch reads one.
pub fn number(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(&n.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        vector(out, s.as_bytes());
    }

    #[test]
    fn each_query_is_read_whole_and_only_when_whole() {
        let mut set = vec![query::SET];
        string(&mut set, "/k");
        string(&mut set, "value");
        // A key cut short before a long value: the value's bytes are never read as a length.
        let mut cas = vec![query::COMPARE_SET];
        string(&mut cas, "/torch.rendezvous.none");
        string(&mut cas, &"gASVaAEA".repeat(40));
        string(&mut cas, &"gASVbBEA".repeat(40));
        let mut ms = vec![query::MULTI_SET];
        ms.extend_from_slice(&2u64.to_le_bytes());
        for (k, v) in [("/a", "1"), ("/b", "")] {
            string(&mut ms, k);
            string(&mut ms, v);
        }
        let mut add = vec![query::ADD];
        string(&mut add, "/n");
        add.extend_from_slice(&(-3i64).to_le_bytes());
        let mut validate = vec![query::VALIDATE];
        validate.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
        let cases = [
            (set, Query::Op(StoreOp::Set { key: b"/k".to_vec(), value: b"value".to_vec() })),
            (
                cas,
                Query::Op(StoreOp::CompareSet {
                    key: b"/torch.rendezvous.none".to_vec(),
                    expected: "gASVaAEA".repeat(40).into_bytes(),
                    desired: "gASVbBEA".repeat(40).into_bytes(),
                }),
            ),
            (ms, Query::Op(StoreOp::MultiSet { pairs: vec![(b"/a".to_vec(), b"1".to_vec()), (b"/b".to_vec(), vec![])] })),
            (add, Query::Op(StoreOp::Add { key: b"/n".to_vec(), delta: -3 })),
            (validate, Query::Validate(VALIDATION_MAGIC)),
            (vec![query::CANCEL_WAIT], Query::CancelWait),
        ];
        for (bytes, want) in cases {
            for cut in 0..bytes.len() {
                assert_eq!(parse(&bytes[..cut]), Ok(None), "{want:?} cut at {cut}");
            }
            let mut two = bytes.clone();
            two.push(query::GETNUMKEYS);
            assert_eq!(parse(&two), Ok(Some((want, bytes.len()))));
        }
    }

    /// Random bytes, and valid queries with bytes flipped, cut or appended: an answer or an
    /// error every time, never a panic, and never more bytes taken than given.
    #[test]
    fn any_bytes_are_read_or_refused_without_a_panic() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut valid = vec![query::COMPARE_SET];
        for field in ["/torch.rendezvous.7", "gASV", "gASVbBEA"] {
            string(&mut valid, field);
        }
        for round in 0..20_000 {
            let mut bytes: Vec<u8> = if round % 2 == 0 {
                (0..next() % 64).map(|_| next() as u8).collect()
            } else {
                let mut v = valid.clone();
                let at = (next() as usize) % v.len();
                v[at] ^= next() as u8;
                v.truncate(v.len() - (next() as usize) % 4);
                v
            };
            bytes.extend((0..next() % 3).map(|_| next() as u8));
            if let Ok(Some((_, used))) = parse(&bytes) {
                assert!(used <= bytes.len(), "round {round}: took {used} of {} bytes", bytes.len());
            }
        }
    }

    #[test]
    fn lengths_past_the_bounds_and_unknown_queries_are_errors_before_any_allocation() {
        let mut get = vec![query::GET];
        get.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(parse(&get), Err(WireError::TooLong(u64::MAX)));
        let mut wait = vec![query::WAIT];
        wait.extend_from_slice(&(STORE_KEYS_PER_OP_MAX as u64 + 1).to_le_bytes());
        assert!(matches!(parse(&wait), Err(WireError::TooLong(_))));
        assert_eq!(parse(&[200]), Err(WireError::UnknownQuery(200)));
    }
}
