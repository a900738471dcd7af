//! Entry points of the fuzz targets (`fuzz/`, cargo-fuzz) and of the stable fuzz smoke test
//! (`tests/tests/fuzz_smoke.rs`): each returns for every input, never panics, and allocates no
//! more than a bounded multiple of its input.

use crate::limits::FRAME_BYTES_MAX;
use crate::{decode, encode, Command, Envelope, Response};

/// Decodes `data` as a message of type `T`; a message that decodes must survive a round trip.
fn round_trip<T>(data: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(value) = decode::<T>(data, FRAME_BYTES_MAX) {
        let again = encode(&value);
        assert_eq!(decode::<T>(&again, usize::MAX).as_ref(), Ok(&value), "a decoded message must encode back to itself");
    }
}

/// A request frame as a node reads it from the network.
pub fn envelope(data: &[u8]) {
    round_trip::<Envelope>(data);
}

/// A reply frame as a client reads it.
pub fn response(data: &[u8]) {
    round_trip::<Response>(data);
}

/// A log entry as a node reads it from disk; a decoded job submission is validated like one
/// from a client.
pub fn command(data: &[u8]) {
    round_trip::<Command>(data);
    if let Ok(Command::Submit { spec, .. }) = decode::<Command>(data, FRAME_BYTES_MAX) {
        let _ = spec.validate();
    }
}
