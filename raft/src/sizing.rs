//! How big a log entry and a replication message may be, and how long one may
//! take to arrive. Pure rules, no I/O.
//!
//! openraft 0.9 sends up to `max_payload_entries` entries per AppendEntries
//! and gives the call only the heartbeat interval (50 ms) to be answered,
//! then retries the same range (a 16 MB entry could never reach a
//! follower, which then stayed behind for good; a 61 MB one cost the leader
//! its term). So:
//!
//! - no proposed entry encodes to more than [`MAX_ENTRY_BYTES`]; requests
//!   carry at most `crescent_proto::MAX_BATCH_KEY_BYTES` of keys, and the
//!   master's own large proposals (eviction, remove-all) are cut into entries
//!   of at most [`ENTRY_KEY_BUDGET`] key bytes;
//! - one AppendEntries carries at most [`MAX_MESSAGE_BYTES`] of entries (at
//!   least one entry), the rest follows in the next message
//!   ([`sendable_prefix`]);
//! - a message with entries is sent by a task that outlives openraft's 50 ms
//!   wait, with its own deadline of [`replication_timeout`] (5 s plus 1 s per
//!   MiB); a retry of the same range waits for that task instead of sending
//!   the bytes again (see `network`).

use std::time::Duration;

/// Largest encoded command a master proposes (bincode, see [`crate::codec`]).
pub const MAX_ENTRY_BYTES: u64 = 4 << 20;

/// Key bytes the master puts into one entry of its own making (eviction
/// victims, keys of a remove-all). A `Remove` lists a key up to twice (keys
/// and leased keys), so twice this plus overhead stays under
/// [`MAX_ENTRY_BYTES`].
pub const ENTRY_KEY_BUDGET: usize = 1 << 20;

/// Largest sum of encoded entries in one AppendEntries message.
pub const MAX_MESSAGE_BYTES: u64 = 8 << 20;

// Two budgets of keys and their overhead fit an entry; an entry fits a message.
const _: () = assert!(2 * ENTRY_KEY_BUDGET as u64 + (1 << 20) <= MAX_ENTRY_BYTES);
const _: () = assert!(MAX_ENTRY_BYTES <= MAX_MESSAGE_BYTES);

/// How long a replication message of `bytes` may take to be answered.
pub fn replication_timeout(bytes: u64) -> Duration {
    Duration::from_secs(5) + Duration::from_secs(bytes.div_ceil(1 << 20))
}

/// How many of the entries, of the given encoded sizes, go into one message:
/// as many as fit in `budget` bytes, and always at least one (an entry is
/// never split), so every message makes progress.
pub fn sendable_prefix(sizes: impl IntoIterator<Item = u64>, budget: u64) -> usize {
    let mut total = 0u64;
    let mut n = 0usize;
    for size in sizes {
        total = total.saturating_add(size);
        if n > 0 && total > budget {
            break;
        }
        n += 1;
    }
    n
}

/// Splits `keys` into runs of at most `budget` key bytes each (a key longer
/// than the budget is a run of its own).
pub fn chunk_keys(keys: Vec<String>, budget: usize) -> Vec<Vec<String>> {
    chunk_by(keys, budget, String::len)
}

/// Splits `items` into runs whose `cost` adds up to at most `budget` each
/// (an item costing more than the budget is a run of its own).
pub fn chunk_by<T>(items: Vec<T>, budget: usize, cost: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut chunks = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let c = cost(&item);
        if !current.is_empty() && bytes.saturating_add(c) > budget {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes = bytes.saturating_add(c);
        current.push(item);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_takes_what_fits_and_never_nothing() {
        assert_eq!(sendable_prefix([], 10), 0);
        assert_eq!(sendable_prefix([4, 4, 4], 10), 2);
        assert_eq!(sendable_prefix([4, 6, 1], 10), 2);
        assert_eq!(
            sendable_prefix([11, 1], 10),
            1,
            "an oversized entry goes alone"
        );
        assert_eq!(sendable_prefix([1, 11], 10), 1);
        assert_eq!(sendable_prefix([u64::MAX, u64::MAX], 10), 1);
        assert_eq!(sendable_prefix([1; 100], u64::MAX), 100);
    }

    #[test]
    fn keys_are_cut_by_bytes_and_none_is_lost() {
        let keys: Vec<String> = (0..10).map(|i| format!("k{i:03}")).collect(); // 4 bytes each
        let chunks = chunk_keys(keys.clone(), 10);
        assert_eq!(
            chunks.iter().map(Vec::len).collect::<Vec<_>>(),
            [2, 2, 2, 2, 2]
        );
        assert_eq!(chunks.concat(), keys);
        assert_eq!(chunk_keys(vec!["x".repeat(50), "y".into()], 10).len(), 2);
        assert!(chunk_keys(Vec::new(), 10).is_empty());
    }

    #[test]
    fn the_timeout_grows_with_the_bytes() {
        assert_eq!(replication_timeout(0), Duration::from_secs(5));
        assert_eq!(replication_timeout(1), Duration::from_secs(6));
        assert_eq!(replication_timeout(8 << 20), Duration::from_secs(13));
        assert!(replication_timeout(u64::MAX) > Duration::from_secs(1 << 40));
    }
}
