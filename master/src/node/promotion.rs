//! Which disk objects to copy back to memory: the leader counts lookups of
//! objects only on disk, and an object looked up `reads` times within
//! `window` joins the promotion queue. Leader memory, not replicated: a new
//! leader starts counting afresh, which at worst delays a promotion.
//! Bounded: at most [`MAX_TRACKED`] keys counted and [`MAX_QUEUED`] queued;
//! past that new keys are not counted until older ones age out or go.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Keys whose disk reads are counted at most.
pub const MAX_TRACKED: usize = 65_536;
/// Keys waiting for promotion at most.
pub const MAX_QUEUED: usize = 4_096;

pub struct DiskReads {
    reads: u32,
    window: Duration,
    /// Key -> (start of its window, lookups in it).
    counted: HashMap<String, (Instant, u32)>,
    queue: VecDeque<String>,
    queued: HashSet<String>,
}

impl DiskReads {
    /// `reads` lookups within `window` promote; `reads == 0` never does.
    pub fn new(reads: u32, window: Duration) -> Self {
        Self {
            reads,
            window,
            counted: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
        }
    }

    /// Records a lookup at `now` of `key`, an object only on disk.
    pub fn record(&mut self, key: &str, now: Instant) {
        if self.reads == 0 || self.queued.contains(key) {
            return;
        }
        if !self.counted.contains_key(key) && self.counted.len() >= MAX_TRACKED {
            let window = self.window;
            self.counted
                .retain(|_, (start, _)| now.saturating_duration_since(*start) <= window);
            if self.counted.len() >= MAX_TRACKED {
                return;
            }
        }
        let entry = self.counted.entry(key.to_string()).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) > self.window {
            *entry = (now, 0);
        }
        entry.1 += 1;
        if entry.1 >= self.reads && self.queue.len() < MAX_QUEUED {
            self.counted.remove(key);
            self.queued.insert(key.to_string());
            self.queue.push_back(key.to_string());
        }
    }

    /// Up to `max` queued keys, oldest first, taken off the queue.
    pub fn take(&mut self, max: usize) -> Vec<String> {
        let n = max.min(self.queue.len());
        let keys: Vec<String> = self.queue.drain(..n).collect();
        for k in &keys {
            self.queued.remove(k);
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_read_within_the_window_queues_a_key_once() {
        let t = Instant::now();
        let mut d = DiskReads::new(2, Duration::from_secs(60));
        d.record("a", t);
        assert!(d.take(10).is_empty(), "one read is not enough");
        d.record("a", t + Duration::from_secs(1));
        d.record("a", t + Duration::from_secs(2));
        assert_eq!(d.take(10), vec!["a".to_string()], "queued once");
        assert!(d.take(10).is_empty());
    }

    #[test]
    fn reads_further_apart_than_the_window_do_not_add_up() {
        let t = Instant::now();
        let mut d = DiskReads::new(2, Duration::from_secs(60));
        d.record("a", t);
        d.record("a", t + Duration::from_secs(61));
        assert!(d.take(10).is_empty());
        d.record("a", t + Duration::from_secs(62));
        assert_eq!(d.take(10), vec!["a".to_string()]);
    }

    #[test]
    fn zero_reads_never_promotes_and_take_is_oldest_first_and_bounded() {
        let t = Instant::now();
        let mut off = DiskReads::new(0, Duration::from_secs(60));
        for _ in 0..5 {
            off.record("a", t);
        }
        assert!(off.take(10).is_empty());
        let mut d = DiskReads::new(1, Duration::from_secs(60));
        for k in ["c", "a", "b"] {
            d.record(k, t);
        }
        assert_eq!(d.take(2), vec!["c".to_string(), "a".to_string()]);
        assert_eq!(d.take(2), vec!["b".to_string()]);
    }

    #[test]
    fn counting_is_bounded() {
        let t = Instant::now();
        let mut d = DiskReads::new(2, Duration::from_secs(60));
        for i in 0..MAX_TRACKED + 10 {
            d.record(&format!("k{i}"), t);
        }
        assert_eq!(d.counted.len(), MAX_TRACKED);
        // Once the window has passed, old counts make room.
        d.record("new", t + Duration::from_secs(61));
        assert_eq!(d.counted.len(), 1);
    }
}
