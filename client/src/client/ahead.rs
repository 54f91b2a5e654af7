//! Placements ahead (issue 12): a put's PutEnd also asks the leader to
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crescent_proto::pb;

use crate::master::{MasterClient, Placement};

/// The oldest placement ahead a put uses. Its write grants, and the
/// deadline of its commit, run out the leader's `--put-start-discard-timeout`
/// (30 s by default) after it was made; an older one is given back.
const MAX_AGE: Duration = Duration::from_secs(2);

/// Most placements ahead ready at once: one per put of a client running
/// in parallel, up to this; more are given back.
const MAX_READY: usize = 4;

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
    /// The shape of the last put: a placement is asked for only when a put
    /// repeats it, so puts of changing sizes cost no unused placements.
    last: Option<Shape>,
}

/// The placements ahead of one client.
#[derive(Default)]
pub(super) struct AheadPlacements {
    slot: Mutex<Slot>,
}

/// What the placements ahead did, for `ClientStats`.
#[derive(Default, Debug)]
pub struct AheadStats {
    /// Puts that wrote into a placement made ahead (one master round trip).
    pub used: std::sync::atomic::AtomicU64,
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
        let shape = Shape {
            size,
            config: config.clone(),
        };
        let (usable, unused, repeats) = {
            let mut s = self.slot.lock().expect("lock poisoned");
            // Those too old will not be used; the oldest of this shape is.
            let (mut keep, unused): (VecDeque<Ahead>, VecDeque<Ahead>) =
                s.ready.drain(..).partition(|a| a.made.elapsed() < MAX_AGE);
            let usable = keep
                .iter()
                .position(|a| a.shape == shape)
                .and_then(|i| keep.remove(i));
            s.ready = keep;
            let repeats = s.last.as_ref() == Some(&shape);
            s.last = Some(shape.clone());
            (usable, unused, repeats)
        };
        for a in unused {
            give_back(master, stats, a.put_id);
        }
        let next = repeats.then(|| Next {
            shape,
            put_id: master.new_put_id(),
        });
        (usable, next)
    }

    /// Keeps `placement`, made ahead as `next` asked, for a next put. The
    /// oldest ready one is given back when [`MAX_READY`] are.
    pub(super) fn keep(
        &self,
        master: &Arc<MasterClient>,
        stats: &Arc<AheadStats>,
        next: Next,
        placement: Placement,
    ) {
        let dropped = {
            let mut s = self.slot.lock().expect("lock poisoned");
            s.ready.push_back(Ahead {
                put_id: next.put_id,
                placement,
                shape: next.shape,
                made: Instant::now(),
            });
            (s.ready.len() > MAX_READY)
                .then(|| s.ready.pop_front())
                .flatten()
        };
        if let Some(old) = dropped {
            give_back(master, stats, old.put_id);
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
        for a in ready {
            stats
                .given_back
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            revoke(master, a.put_id).await;
        }
    }
}

/// Revokes the placement ahead made for put `put_id`. If that fails, the
/// leader releases it after its `--put-start-release-timeout`.
pub(super) async fn revoke(master: &MasterClient, put_id: u64) {
    if let Err(e) = master.put_revoke_ahead(put_id).await {
        tracing::debug!(error = %e, "giving back a placement ahead failed; the leader releases it later");
    }
}

/// Gives back an unused placement in the background ([`revoke`]).
fn give_back(master: &Arc<MasterClient>, stats: &Arc<AheadStats>, put_id: u64) {
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
        let (used, _) = ahead.take(&master, &stats, 4096, &config(1));
        let used = used.expect("kept for its shape");
        assert_eq!(used.put_id, first_id);
        assert_eq!(used.placement.replicas[0].offset, 1);
        // Puts in parallel: each asked before any placement came back.
        let asked: Vec<Next> = (0..=MAX_READY)
            .map(|_| {
                let (none, ask) = ahead.take(&master, &stats, 4096, &config(1));
                assert!(none.is_none());
                ask.expect("asks")
            })
            .collect();
        // Oldest first; one more than MAX_READY pushes the first out.
        for (next, offset) in asked.into_iter().zip(10..) {
            ahead.keep(&master, &stats, next, placed(offset));
        }
        assert_eq!(
            stats.given_back.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        let (used, _) = ahead.take(&master, &stats, 4096, &config(1));
        assert_eq!(used.expect("ready").placement.replicas[0].offset, 11);
    }
}
