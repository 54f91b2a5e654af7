//! One bincode configuration for everything Crescent persists or sends between
//! masters, with a size limit so a corrupt or hostile length cannot make us
//! allocate without bound.

use bincode::Options;
use serde::{de::DeserializeOwned, Serialize};

/// The format of what this module encodes (log entries, snapshots, Raft
/// messages): the journal names it in its header and masters in every
/// Raft message, and a value of another format is refused, never misread.
/// Bump it with any change that makes old bytes decode differently.
pub const FORMAT_VERSION: &str = "2";

/// Largest encoded value accepted (a snapshot of a very large cluster fits).
pub const MAX_ENCODED_BYTES: u64 = 4 << 30;

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(MAX_ENCODED_BYTES)
}

pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    options().serialize(value)
}

/// The length [`encode`] would produce, without encoding.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<u64, bincode::Error> {
    options().serialized_size(value)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    options().deserialize(bytes)
}
