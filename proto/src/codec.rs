//! The one encoding of every message and log entry: a version byte, then postcard.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::PROTOCOL_VERSION;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("empty message")]
    Empty,
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("protocol version {theirs} is not ours ({ours})")]
    Version { ours: u8, theirs: u8 },
    #[error("malformed message: {0}")]
    Malformed(String),
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let out = vec![PROTOCOL_VERSION];
    // postcard only fails on a writer that runs out of room; a Vec never does.
    match postcard::to_extend(value, out) {
        Ok(v) => v,
        Err(e) => panic!("postcard encode into Vec cannot fail: {e}"),
    }
}

/// Decodes `bytes`, refusing anything larger than `max_bytes` before looking inside.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], max_bytes: usize) -> Result<T, CodecError> {
    if bytes.len() > max_bytes {
        return Err(CodecError::TooLarge { len: bytes.len(), max: max_bytes });
    }
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != PROTOCOL_VERSION {
        return Err(CodecError::Version { ours: PROTOCOL_VERSION, theirs: version });
    }
    let (value, rest) = postcard::take_from_bytes(body).map_err(|e| CodecError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::Malformed(format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientRequest, Command, Envelope, PeerRequest, Request};

    #[test]
    fn round_trip_and_bad_input() {
        let req = Envelope { hops: 0, request: ClientRequest::Cancel { job: 7 }.into(), user: None };
        let bytes = encode(&req);
        assert_eq!(decode::<Envelope>(&bytes, 1024), Ok(req));
        // A node's request keeps its side: it never decodes as a client's.
        let kill = Envelope { hops: 1, request: PeerRequest::Kill { job: 7, run: 2, checkpoint: true }.into(), user: None };
        let decoded = decode::<Envelope>(&encode(&kill), 1024).map(|e| e.request);
        assert!(matches!(decoded, Ok(Request::Peer(PeerRequest::Kill { job: 7, run: 2, checkpoint: true }))), "{decoded:?}");
        assert_eq!(decode::<Envelope>(&[], 1024), Err(CodecError::Empty));
        assert!(matches!(decode::<Envelope>(&bytes, 2), Err(CodecError::TooLarge { .. })));
        let mut other = bytes.clone();
        other[0] = 99;
        assert_eq!(decode::<Envelope>(&other, 1024), Err(CodecError::Version { ours: PROTOCOL_VERSION, theirs: 99 }));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(decode::<Envelope>(&trailing, 1024), Err(CodecError::Malformed(_))));
        // Garbage after a valid version byte never panics.
        for seed in 0u8..=255 {
            let junk: Vec<u8> = (0..64).map(|i| PROTOCOL_VERSION.wrapping_add(i).wrapping_mul(seed)).collect();
            let mut framed = vec![PROTOCOL_VERSION];
            framed.extend_from_slice(&junk);
            let _ = decode::<Command>(&framed, 1024);
        }
    }
}
