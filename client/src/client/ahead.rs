//! Placements ahead: a put's PutEnd also asks the leader to
//! place this client's next put of the same size and config, while the
//! commit waits on the log's fsyncs. That next put then writes its bytes at
//! once and sends only its own PutEnd: one master request per put instead
//! of two. The leader places it like any one-commit put, filed under this
//! client's put id instead of a key (docs/one-commit-puts.md, "Placements
//! ahead"). Nothing here decides safety: the leader's placer and the state
//! machine's commit check do, as for every one-commit put.
//!
//! Owns the placements ready for this client's next puts (a few, for puts
//! running in parallel); the puts that ask for and use them are in `put`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crescent_proto::pb;

use crate::master::{MasterClient, Placement};

/// The oldest placement ahead a put uses. Its write grants, and the
/// deadline of its commit, run out the leader's `--put-start-discard-timeout`
/// (30 s by default) after it was made; an older one is given back.
const MAX_AGE: Duration = Duration::from_secs(2);

/// Most placements ahead ready at once: one per put of a client running
/// in parallel, or per item of its batches, up to this; more are given
/// back, oldest first.
const MAX_READY: usize = crescent_proto::MAX_AHEAD_PER_REQUEST;
/// Most bytes of placements ahead ready at once: space this client holds
/// in the pool for puts it has not made yet (at most [`MAX_AGE`]).
const MAX_READY_BYTES: u64 = 256 << 20;
/// Most shapes remembered from the last put or batch.
const MAX_LAST_SHAPES: usize = 16;

/// What a put needs of a placement: its size and config.
#[derive(Clone, PartialEq, Debug)]
struct Shape {
    size: u64,
    config: pb::ReplicateConfig,
}

/// The placement a put asks for in its PutEnd: the next put's shape, and
/// the put id it will carry (from [`AheadPlacements::take`]).
pub(super) struct Next {
    shape: Shape,
    pub put_id: u64,
    /// Counted in its pool's asks in flight until dropped (kept, refused,
    /// or never sent).
    in_flight: Arc<InFlight>,
}

impl Next {
    /// The size of the put it is for.
    pub fn size(&self) -> u64 {
        self.shape.size
    }
}

impl Drop for Next {
    fn drop(&mut self) {
        self.in_flight.count.fetch_sub(1, Relaxed);
        self.in_flight.bytes.fetch_sub(self.shape.size, Relaxed);
    }
}

/// Placements asked for and not answered yet: counted with those ready
/// against the limits, so puts running in parallel do not all ask for the
/// limit and give the surplus back.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    bytes: AtomicU64,
}

/// A placement made ahead, for this client's put `put_id`.
pub(super) struct Ahead {
    pub put_id: u64,
    pub placement: Placement,
    shape: Shape,
    made: Instant,
}

#[derive(Default)]
struct Slot {
    /// Oldest first; at most [`MAX_READY`].
    ready: VecDeque<Ahead>,
    /// The shapes of the last put or batch: a placement is asked for only
    /// for a put that repeats one, so puts of changing sizes cost no unused
    /// placements.
    last: Vec<Shape>,
}

impl Slot {
    /// Takes the ready placements grown too old ([`MAX_AGE`]) to be used.
    fn take_old(&mut self) -> Vec<Ahead> {
        let (keep, old): (VecDeque<Ahead>, VecDeque<Ahead>) = self
            .ready
            .drain(..)
            .partition(|a| a.made.elapsed() < MAX_AGE);
        self.ready = keep;
        old.into()
    }
}

/// The placements ahead of one client.
#[derive(Default)]
pub(super) struct AheadPlacements {
    slot: Mutex<Slot>,
    in_flight: Arc<InFlight>,
}

/// What the placements ahead did, for `ClientStats`.
#[derive(Default, Debug)]
pub struct AheadStats {
    /// Puts that wrote into a placement made ahead (one master round trip).
    pub used: std::sync::atomic::AtomicU64,
    /// Of `used`, items of batch puts.
    pub used_in_batches: std::sync::atomic::AtomicU64,
    /// Placements made ahead and given back unused (another size came, or
    /// they grew too old).
    pub given_back: std::sync::atomic::AtomicU64,
    /// Puts whose placement ahead failed (its write, or its commit) and
    /// that were put again the usual way.
    pub retried: std::sync::atomic::AtomicU64,
}

impl AheadPlacements {
    /// For a put of `size` bytes with `config`: the placement made ahead for
    /// such a put, if one is ready and young enough, and the placement its
    /// PutEnd should ask for, when this put repeats the last one's shape.
    /// Gives back those too old.
    pub(super) fn take(
        &self,
        master: &Arc<MasterClient>,
        stats: &Arc<AheadStats>,
        size: u64,
        config: &pb::ReplicateConfig,
    ) -> (Option<Ahead>, Option<Next>) {
        let (mut usable, mut next) = self.take_batch(master, stats, &[size], config);
        (usable.pop().flatten(), next.pop())
    }

    /// For a batch of puts of `sizes` with `config`: per item, the placement
    /// made ahead for it (one of its size, oldest first), if one is ready
    /// and young enough; and the placements the batch's PutEnd should ask
    /// for: one per item whose shape the last put or batch had too, as many
    /// as the limits on ready placements leave room for. Gives back those
    /// too old.
    pub(super) fn take_batch(
        &self,
        master: &Arc<MasterClient>,
        stats: &Arc<AheadStats>,
        sizes: &[u64],
        config: &pb::ReplicateConfig,
    ) -> (Vec<Option<Ahead>>, Vec<Next>) {
        let shapes: Vec<Shape> = sizes
            .iter()
            .map(|&size| Shape {
                size,
                config: config.clone(),
            })
            .collect();
        let (usable, unused, asks) = {
            let mut s = self.slot.lock().expect("lock poisoned");
            // Those too old will not be used; the oldest of each shape are.
            let unused = s.take_old();
            let usable: Vec<Option<Ahead>> = shapes
                .iter()
                .map(|shape| {
                    s.ready
                        .iter()
                        .position(|a| &a.shape == shape)
                        .and_then(|i| s.ready.remove(i))
                })
                .collect();
            // Room left for placements asked now, counting those ready and
            // those asked for and not answered yet.
            let mut room = MAX_READY
                .saturating_sub(s.ready.len())
                .saturating_sub(self.in_flight.count.load(Relaxed));
            let mut room_bytes = MAX_READY_BYTES
                .saturating_sub(ready_bytes(&s.ready))
                .saturating_sub(self.in_flight.bytes.load(Relaxed));
            let mut asks = Vec::new();
            for shape in &shapes {
                if room == 0 || shape.size > room_bytes || !s.last.contains(shape) {
                    continue;
                }
                room -= 1;
                room_bytes -= shape.size;
                asks.push(shape.clone());
            }
            let mut last: Vec<Shape> = Vec::new();
            for shape in shapes {
                if last.len() < MAX_LAST_SHAPES && !last.contains(&shape) {
                    last.push(shape);
                }
            }
            s.last = last;
            (usable, unused, asks)
        };
        for a in unused {
            give_back(master, stats, a.put_id);
        }
        let next = asks
            .into_iter()
            .map(|shape| {
                self.in_flight.count.fetch_add(1, Relaxed);
                self.in_flight.bytes.fetch_add(shape.size, Relaxed);
                Next {
                    shape,
                    put_id: master.new_put_id(),
                    in_flight: self.in_flight.clone(),
                }
            })
            .collect();
        (usable, next)
    }

    /// Keeps `placement`, made ahead as `next` asked, for a next put. The
    /// oldest ready ones are given back when more than the limits are.
    pub(super) fn keep(
        &self,
        master: &Arc<MasterClient>,
        stats: &Arc<AheadStats>,
        next: Next,
        placement: Placement,
    ) {
        self.keep_batch(master, stats, vec![(next, placement)]);
    }

    /// [`keep`](Self::keep) of a batch's placements ahead.
    pub(super) fn keep_batch(
        &self,
        master: &Arc<MasterClient>,
        stats: &Arc<AheadStats>,
        placed: Vec<(Next, Placement)>,
    ) {
        let mut answered = Vec::with_capacity(placed.len());
        let dropped = {
            let mut s = self.slot.lock().expect("lock poisoned");
            let made = Instant::now();
            for (next, placement) in placed {
                s.ready.push_back(Ahead {
                    put_id: next.put_id,
                    placement,
                    shape: next.shape.clone(),
                    made,
                });
                answered.push(next);
            }
            let mut dropped = Vec::new();
            while s.ready.len() > MAX_READY || ready_bytes(&s.ready) > MAX_READY_BYTES {
                match s.ready.pop_front() {
                    Some(old) => dropped.push(old),
                    None => break,
                }
            }
            dropped
        };
        // Answered: no longer in flight (counted as ready instead).
        drop(answered);
        for old in dropped {
            give_back(master, stats, old.put_id);
        }
    }

    /// Gives back the ready placements grown too old to be used: a client
    /// that stops putting does not hold them until the leader's release
    /// timeout (called about once a second by the client's monitor).
    pub(super) fn give_back_old(&self, master: &Arc<MasterClient>, stats: &Arc<AheadStats>) {
        let old = self.slot.lock().expect("lock poisoned").take_old();
        for a in old {
            give_back(master, stats, a.put_id);
        }
    }

    /// Gives back the ready placements (the client is closing).
    pub(super) async fn give_back_ready(&self, master: &MasterClient, stats: &AheadStats) {
        let ready: Vec<Ahead> = self
            .slot
            .lock()
            .expect("lock poisoned")
            .ready
            .drain(..)
            .collect();
        stats
            .given_back
            .fetch_add(ready.len() as u64, std::sync::atomic::Ordering::Relaxed);
        // At once: up to MAX_READY revokes, each bounded by the master
        // client's deadline, must not make `close` take minutes.
        futures::future::join_all(ready.iter().map(|a| revoke(master, a.put_id))).await;
    }
}

/// Bytes of the placements in `ready`.
fn ready_bytes(ready: &VecDeque<Ahead>) -> u64 {
    ready.iter().map(|a| a.shape.size).sum()
}

/// Revokes the placement ahead made for put `put_id`. If that fails, the
/// leader releases it after its `--put-start-release-timeout`.
pub(super) async fn revoke(master: &MasterClient, put_id: u64) {
    if let Err(e) = master.put_revoke_ahead(put_id).await {
        tracing::debug!(error = %e, "giving back a placement ahead failed; the leader releases it later");
    }
}

/// Gives back an unused placement in the background ([`revoke`]).
pub(super) fn give_back(master: &Arc<MasterClient>, stats: &Arc<AheadStats>, put_id: u64) {
    stats
        .given_back
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let master = master.clone();
    tokio::spawn(async move { revoke(&master, put_id).await });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(replica_num: u32) -> pb::ReplicateConfig {
        pb::ReplicateConfig {
            replica_num,
            ..Default::default()
        }
    }

    fn placed(offset: u64) -> Placement {
        Placement {
            replicas: vec![pb::ReplicaDescriptor {
                offset,
                ..Default::default()
            }],
            pending: true,
            ahead: true,
        }
    }

    /// A placement is asked for only by a put that repeats the last put's
    /// shape, and used only by a put of that shape, oldest first; more
    /// than MAX_READY are not kept.
    #[tokio::test]
    async fn placements_ahead_go_to_puts_of_their_shape() {
        // No master answers there: give-backs fail in the background.
        let master = Arc::new(MasterClient::new("127.0.0.1:1").unwrap());
        let stats = Arc::new(AheadStats::default());
        let ahead = AheadPlacements::default();
        let (none, ask) = ahead.take(&master, &stats, 4096, &config(1));
        assert!(
            none.is_none() && ask.is_none(),
            "a first put asks for nothing"
        );
        let (none, ask) = ahead.take(&master, &stats, 4096, &config(1));
        assert!(none.is_none());
        let next = ask.expect("a repeated shape asks");
        let first_id = next.put_id;
        ahead.keep(&master, &stats, next, placed(1));
        // Another size or config neither uses it nor asks.
        let (none, ask) = ahead.take(&master, &stats, 8192, &config(1));
        assert!(none.is_none() && ask.is_none());
        let (none, ask) = ahead.take(&master, &stats, 4096, &config(2));
        assert!(none.is_none() && ask.is_none());
        let (used, ask) = ahead.take(&master, &stats, 4096, &config(2));
        assert!(used.is_none() && ask.is_some());
        drop(ask); // never sent: no longer in flight
        let (used, _) = ahead.take(&master, &stats, 4096, &config(1));
        let used = used.expect("kept for its shape");
        assert_eq!(used.put_id, first_id);
        assert_eq!(used.placement.replicas[0].offset, 1);
        // Puts in parallel: each asked before any placement came back, up
        // to MAX_READY asks in flight; the next asks for none.
        let asked: Vec<Next> = (0..MAX_READY)
            .map(|_| {
                let (none, ask) = ahead.take(&master, &stats, 4096, &config(1));
                assert!(none.is_none());
                ask.expect("asks")
            })
            .collect();
        let (none, ask) = ahead.take(&master, &stats, 4096, &config(1));
        assert!(none.is_none() && ask.is_none(), "MAX_READY asks in flight");
        // Oldest first; none given back.
        for (next, offset) in asked.into_iter().zip(10..) {
            ahead.keep(&master, &stats, next, placed(offset));
        }
        assert_eq!(
            stats.given_back.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        let (used, ask) = ahead.take(&master, &stats, 4096, &config(1));
        assert_eq!(used.expect("ready").placement.replicas[0].offset, 10);
        assert!(ask.is_some(), "room again for one");
        drop(ask);
        // An ask answered with nothing (dropped) frees its room too.
        assert_eq!(ahead.in_flight.count.load(Relaxed), 0);
    }

    /// A batch takes one ready placement per item of its shape and asks for
    /// one per item whose shape the last put or batch had, within the
    /// limits on what is ready (count and bytes).
    #[tokio::test]
    async fn a_batch_takes_and_asks_one_placement_per_item_of_a_repeated_shape() {
        let master = Arc::new(MasterClient::new("127.0.0.1:1").unwrap());
        let stats = Arc::new(AheadStats::default());
        let ahead = AheadPlacements::default();
        let (none, asks) = ahead.take_batch(&master, &stats, &[4096, 4096, 8192], &config(1));
        assert!(
            none.iter().all(Option::is_none) && asks.is_empty(),
            "nothing to repeat"
        );
        // 4096 and 8192 repeat, 100 does not.
        let (none, asks) = ahead.take_batch(&master, &stats, &[4096, 100, 8192, 4096], &config(1));
        assert!(none.iter().all(Option::is_none));
        let sizes: Vec<u64> = asks.iter().map(Next::size).collect();
        assert_eq!(sizes, vec![4096, 8192, 4096]);
        let made = asks
            .into_iter()
            .zip(1..)
            .map(|(n, o)| (n, placed(o)))
            .collect();
        ahead.keep_batch(&master, &stats, made);
        // Items of a ready shape take one each, oldest first; the rest none.
        let (used, _) = ahead.take_batch(&master, &stats, &[4096, 4096, 4096, 8192], &config(1));
        let offsets: Vec<Option<u64>> = used
            .iter()
            .map(|a| a.as_ref().map(|a| a.placement.replicas[0].offset))
            .collect();
        assert_eq!(offsets, vec![Some(1), Some(3), None, Some(2)]);
        // Asks stop at the bytes limit, counting what is ready.
        let big = MAX_READY_BYTES / 4 + 1;
        let _ = ahead.take_batch(&master, &stats, &[big], &config(1));
        let (_, asks) = ahead.take_batch(&master, &stats, &[big; 6], &config(1));
        assert_eq!(asks.len(), 3, "three fit in the bytes limit");
        let made = asks.into_iter().map(|n| (n, placed(9))).collect();
        ahead.keep_batch(&master, &stats, made);
        let (_, asks) = ahead.take_batch(&master, &stats, &[big; 6], &config(1));
        assert_eq!(asks.len(), 3, "three taken, three more fit");
    }
}
