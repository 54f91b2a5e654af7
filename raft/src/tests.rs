//! Unit tests of the state machine, eviction policy and storage.

use crate::eviction::{select_victims, should_evict, AccessInfo};
use crate::state::*;

const MB: u64 = 1 << 20;

fn policy() -> PutPolicy {
    PutPolicy {
        discard_after_ms: 30_000,
        release_after_ms: 600_000,
        soft_pin_ttl_ms: 1_800_000,
    }
}

fn cmd(now_ms: u64, client: &str, seq: u64, op: Op) -> Command {
    Command {
        now_ms,
        seed: seq.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        origin: Some(Origin {
            client_id: client.into(),
            seq,
        }),
        op,
    }
}

/// The key every test segment is mounted with.
fn test_key() -> SegmentKeyBytes {
    SegmentKeyBytes(vec![1; 32])
}

fn mount(state: &mut MetaState, now: u64, name: &str, owner: &str, cap: u64) -> SegmentId {
    let c = Command {
        now_ms: now,
        seed: 0,
        origin: None,
        op: Op::MountSegment {
            spec: SegmentSpec {
                name: name.into(),
                endpoint: format!("{name}:1"),
                capacity: cap,
                ..Default::default()
            },
            owner: owner.into(),
            key: test_key(),
            tier: Tier::Memory,
            disk_id: String::new(),
        },
    };
    match state.apply(&c) {
        Response::Mounted(Ok(id)) => id,
        other => panic!("mount failed: {other:?}"),
    }
}

fn put(
    state: &mut MetaState,
    now: u64,
    client: &str,
    seq: u64,
    key: &str,
    size: u64,
    replicas: u32,
) -> Response {
    state.apply(&cmd(
        now,
        client,
        seq,
        Op::PutStart {
            items: vec![(key.into(), size, 0)],
            config: ReplicateConfig {
                replica_num: replicas,
                ..Default::default()
            },
            policy: policy(),
        },
    ))
}

fn put_end(state: &mut MetaState, now: u64, client: &str, seq: u64, key: &str) -> Response {
    state.apply(&cmd(
        now,
        client,
        seq,
        Op::PutEnd {
            items: vec![(key.into(), 7, 0)],
        },
    ))
}

fn first_item(resp: &Response) -> Result<(), MetaError> {
    match resp {
        Response::Items(v) => v[0].clone(),
        Response::PutStart(v) => v[0].clone().map(|_| ()),
        Response::Rejected(e) => Err(e.clone()),
        other => panic!("unexpected {other:?}"),
    }
}

/// A pseudo-random workload of every op kind, for replay tests.
fn workload(n: usize) -> Vec<Command> {
    let mut out = Vec::new();
    let mut x = 0x1234_5678u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        out.push(Command {
            now_ms: i as u64,
            seed: 0,
            origin: None,
            op: Op::MountSegment {
                spec: SegmentSpec {
                    name: (*name).into(),
                    endpoint: "e".into(),
                    capacity: 64 * MB,
                    ..Default::default()
                },
                owner: format!("owner-{name}"),
                key: test_key(),
                tier: Tier::Memory,
                disk_id: String::new(),
            },
        });
    }
    for i in 0..n {
        let now = 1_000 + i as u64 * 50;
        let key = format!("k{}", rnd() % 200);
        let client = format!("c{}", rnd() % 4);
        // Put ids come from a small range, so ends and revokes both match
        // and miss (0: any of the writer's puts).
        let put_id = rnd() % 3;
        let op = match rnd() % 10 {
            0..=3 => {
                let size = 1 + rnd() % (2 * MB);
                let config = ReplicateConfig {
                    replica_num: 1 + (rnd() % 3) as u32,
                    soft_pin: rnd() % 5 == 0,
                    hard_pin: rnd() % 11 == 0,
                    preferred_segments: vec![],
                };
                Op::PutStart {
                    items: vec![(key, size, put_id)],
                    config,
                    policy: policy(),
                }
            }
            4..=6 => Op::PutEnd {
                items: vec![(key, rnd() as u32, put_id)],
            },
            7 => {
                let leased = if rnd() % 3 == 0 {
                    [key.clone()].into()
                } else {
                    Default::default()
                };
                Op::Remove {
                    keys: vec![key],
                    force: rnd() % 2 == 0,
                    leased,
                    hold_ms: rnd() % 20_000,
                }
            }
            // Chosen by a policy that saw some other object under the key:
            // applied, it must leave the key's object alone.
            8 => Op::EvictObjects {
                items: vec![(
                    key,
                    ObjectStamp {
                        created_ms: now,
                        put_id,
                        checksum: 0,
                        size: 0,
                    },
                )],
            },
            _ => Op::PutRevoke {
                items: vec![(key, put_id)],
            },
        };
        out.push(cmd(now, &client, i as u64, op));
        if i % 97 == 0 {
            out.push(Command {
                now_ms: now + 700_000,
                seed: 0,
                origin: None,
                op: Op::ReclaimStalePuts {},
            });
        }
    }
    out
}

#[test]
fn deterministic_replay_gives_identical_state() {
    let cmds = workload(3000);
    let mut a = MetaState::new();
    let mut b = MetaState::new();
    let ra: Vec<Response> = cmds.iter().map(|c| a.apply(c)).collect();
    let rb: Vec<Response> = cmds.iter().map(|c| b.apply(c)).collect();
    assert_eq!(ra, rb);
    assert_eq!(a, b);
    assert!(!a.objects.is_empty());
}

#[test]
fn snapshot_roundtrip_rebuilds_identical_state() {
    let cmds = workload(2000);
    let (first, second) = cmds.split_at(1200);
    let mut a = MetaState::new();
    for c in first {
        a.apply(c);
    }
    let bytes = crate::codec::encode(&a).unwrap();
    let mut b: MetaState = crate::codec::decode(&bytes).unwrap();
    b.rebuild_derived().unwrap();
    assert_eq!(a, b, "decoded snapshot differs");
    for c in second {
        assert_eq!(a.apply(c), b.apply(c));
    }
    assert_eq!(a, b);
}

/// The per-writer usage the leader's quotas read is kept up to date by every
/// op that adds, finishes or drops an object (zombie takeover, revoke,
/// remove, evict, reclaim, unmount): after each command it equals a recount.
#[test]
fn writer_usage_matches_a_recount_after_every_command() {
    let mut cmds = workload(3000);
    cmds.insert(
        2000,
        Command {
            now_ms: 200_000,
            seed: 0,
            origin: None,
            op: Op::UnmountSegment { segment_id: 2 },
        },
    );
    let mut s = MetaState::new();
    let mut saw_unfinished = false;
    for (i, c) in cmds.iter().enumerate() {
        s.apply(c);
        let mut recount = s.clone();
        recount.rebuild_derived().unwrap();
        assert_eq!(s, recount, "usage drifted at command {i}: {:?}", c.op);
        saw_unfinished |= (0..4).any(|w| s.writer_usage(&format!("c{w}")).unfinished > 0);
    }
    assert!(saw_unfinished);
    let total: u64 = (0..4)
        .map(|w| s.writer_usage(&format!("c{w}")).objects)
        .sum();
    assert_eq!(total, s.objects.len() as u64);
    assert!(s.writer_count() > 0);
}

#[test]
fn two_phase_put_and_lookup() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    assert!(matches!(s.lookup("k"), Err(MetaError::ObjectNotFound(_))));
    first_item(&put(&mut s, 10, "c", 1, "k", 4096, 1)).unwrap();
    assert!(matches!(s.lookup("k"), Err(MetaError::ReplicaNotReady(_))));
    assert!(!s.exists("k"));
    first_item(&put_end(&mut s, 11, "c", 2, "k")).unwrap();
    let view = s.lookup("k").unwrap();
    assert_eq!(view.size, 4096);
    assert_eq!(view.checksum, 7);
    assert_eq!(view.replicas.len(), 1);
    assert!(s.exists("k"));
    // A second put of the same key.
    assert_eq!(
        first_item(&put(&mut s, 12, "d", 1, "k", 4096, 1)),
        Err(MetaError::ObjectAlreadyExists("k".into()))
    );
}

#[test]
fn replicas_land_on_distinct_segments_best_effort() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "s1", "o1", 8 * MB);
    mount(&mut s, 1, "s2", "o2", 8 * MB);
    mount(&mut s, 1, "s3", "o3", MB);
    match put(&mut s, 2, "c", 1, "big", 4 * MB, 3) {
        Response::PutStart(v) => {
            let reps = v[0].clone().unwrap();
            // s3 is too small: best effort gives two, on distinct segments.
            assert_eq!(reps.len(), 2);
            assert_ne!(reps[0].segment_id, reps[1].segment_id);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        put(&mut s, 2, "c", 2, "x", 1, 4),
        Response::Rejected(MetaError::InvalidParams(_))
    ));
    assert!(matches!(
        put(&mut s, 2, "c", 3, "x", 1, 0),
        Response::Rejected(MetaError::InvalidParams(_))
    ));
    assert_eq!(
        first_item(&put(&mut s, 2, "c", 4, "huge", 100 * MB, 1)),
        Err(MetaError::NoAvailableHandle(100 * MB))
    );
    // Larger than any segment: no eviction could help, so none is asked for.
    assert_eq!(s.alloc_failures, 0);
}

#[test]
fn retried_request_is_applied_once() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    let first = put(&mut s, 10, "c", 1, "k", 100, 1);
    let allocated = s.total_allocated();
    let retry = put(&mut s, 20, "c", 1, "k", 100, 1);
    assert_eq!(first, retry, "a retry returns the original answer");
    assert_eq!(s.total_allocated(), allocated, "and allocates nothing more");
    // Push the request out of the dedup window: it is refused, not re-applied.
    for seq in 2..(DEDUP_RESULTS_PER_CLIENT as u64 + 5) {
        s.apply(&cmd(
            30,
            "c",
            seq,
            Op::PutRevoke {
                items: vec![("nope".into(), 0)],
            },
        ));
    }
    assert!(matches!(
        put(&mut s, 40, "c", 1, "k2", 100, 1),
        Response::Rejected(MetaError::InvalidParams(_))
    ));
    assert!(!s.objects.contains_key("k2"));
}

#[test]
fn remove_rules() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    put(&mut s, 10, "c", 1, "inflight", 100, 1);
    let rm = |s: &mut MetaState, seq, key: &str, force| {
        first_item(&s.apply(&cmd(
            11,
            "admin",
            seq,
            Op::Remove {
                keys: vec![key.into()],
                force,
                leased: Default::default(),
                hold_ms: 0,
            },
        )))
    };
    assert_eq!(
        rm(&mut s, 1, "inflight", false),
        Err(MetaError::ReplicaNotReady("inflight".into()))
    );
    assert_eq!(
        rm(&mut s, 2, "missing", false),
        Err(MetaError::ObjectNotFound("missing".into()))
    );
    // Hard pin.
    s.apply(&cmd(
        12,
        "c",
        2,
        Op::PutStart {
            items: vec![("pinned".into(), 100, 0)],
            config: ReplicateConfig {
                replica_num: 1,
                hard_pin: true,
                ..Default::default()
            },
            policy: policy(),
        },
    ));
    put_end(&mut s, 13, "c", 3, "pinned");
    assert_eq!(
        rm(&mut s, 3, "pinned", false),
        Err(MetaError::ObjectPinned("pinned".into()))
    );
    assert_eq!(rm(&mut s, 4, "pinned", true), Ok(()));
    // An unfinished put is not taken by force either: its writer may still
    // commit it. Its space goes when the leader reclaims stale puts.
    let before = s.total_allocated();
    assert_eq!(
        rm(&mut s, 5, "inflight", true),
        Err(MetaError::ReplicaNotReady("inflight".into()))
    );
    assert_eq!(s.total_allocated(), before, "refused: nothing changed");
    first_item(&put_end(&mut s, 14, "c", 4, "inflight")).unwrap();
    assert!(s.exists("inflight"), "its writer still commits it");
    assert_eq!(rm(&mut s, 6, "inflight", true), Ok(()));
    put(&mut s, 15, "c", 5, "stale", 100, 1);
    s.apply(&Command {
        now_ms: 15 + 600_000,
        seed: 0,
        origin: None,
        op: Op::ReclaimStalePuts {},
    });
    assert_eq!(s.total_allocated(), 0);
}

/// The leader's lease verdict travels in the entry: a leased key is refused
/// (unless forced), and a retry of the same request gets the first attempt's
/// answer even when its own verdict differs. A verdict given before proposing
/// could answer a retry OBJECT_HAS_LEASE while its first attempt committed
/// and removed the object.
#[test]
fn remove_verdict_is_replicated_and_a_retry_gets_the_first_answer() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    for (seq, key) in [(1, "a"), (3, "b")] {
        put(&mut s, 10, "w", seq, key, 100, 1);
        put_end(&mut s, 11, "w", seq + 1, key);
    }
    let rm = |s: &mut MetaState, seq, key: &str, force, leased: &[&str]| {
        first_item(&s.apply(&cmd(
            20,
            "remover",
            seq,
            Op::Remove {
                keys: vec![key.into()],
                force,
                leased: leased.iter().map(|k| k.to_string()).collect(),
                hold_ms: 10_000,
            },
        )))
    };
    assert_eq!(
        rm(&mut s, 1, "a", false, &["a"]),
        Err(MetaError::ObjectHasLease("a".into()))
    );
    assert!(s.exists("a"), "a refused remove changes nothing");
    // Retry of request 1 judged unleased by another leader: still refused.
    assert_eq!(
        rm(&mut s, 1, "a", false, &[]),
        Err(MetaError::ObjectHasLease("a".into()))
    );
    assert!(s.exists("a"));
    // The first attempt of request 2 removes b; its retry, judged leased, is
    // answered OK (what happened), not OBJECT_HAS_LEASE.
    assert_eq!(rm(&mut s, 2, "b", false, &[]), Ok(()));
    assert_eq!(rm(&mut s, 2, "b", false, &["b"]), Ok(()));
    assert!(!s.exists("b"));
    // Force ignores the lease verdict.
    assert_eq!(rm(&mut s, 3, "a", true, &["a"]), Ok(()));
    assert!(!s.exists("a"));
}

/// A soak's wrong_bytes: a forced remove freed the space of an
/// object a reader had just looked up under a lease; the next put took that
/// range and the reader's bytes failed their checksum. A forced removal of a
/// possibly-leased object now parks its space until the lease has run out.
#[test]
fn space_of_a_leased_object_removed_with_force_is_not_reused_until_the_lease_ends() {
    let mut s = MetaState::new();
    mount(&mut s, 0, "a", "oa", 4 * MB);
    mount(&mut s, 0, "b", "ob", 4 * MB);
    first_item(&put(&mut s, 10, "w", 1, "k", 4000, 2)).unwrap();
    first_item(&put_end(&mut s, 20, "w", 2, "k")).unwrap();
    let reader_view = s.lookup("k").unwrap().replicas.clone();
    let overlaps = |got: &[Replica]| {
        got.iter().any(|g| {
            reader_view.iter().any(|r| {
                g.segment_id == r.segment_id
                    && g.offset < r.offset + r.len
                    && r.offset < g.offset + g.len
            })
        })
    };
    let remove = Op::Remove {
        keys: vec!["k".into()],
        force: true,
        leased: ["k".to_string()].into(),
        hold_ms: 10_000,
    };
    first_item(&s.apply(&cmd(30, "x", 1, remove))).unwrap();
    assert!(!s.exists("k"), "forced: removed at once");
    let Response::PutStart(v) = put(&mut s, 31, "y", 1, "k2", 4000, 2) else {
        panic!("put_start answered something else")
    };
    assert!(
        !overlaps(v[0].as_ref().unwrap()),
        "a range a leased reader may still read was handed out again"
    );
    // Reclaimed once the lease has run out, and then reusable.
    s.apply(&Command {
        now_ms: 30 + 10_000,
        seed: 0,
        origin: None,
        op: Op::ReclaimStalePuts {},
    });
    assert!(s.pending_release.is_empty());
    let Response::PutStart(v) = put(&mut s, 10_050, "y", 2, "k3", 4000, 2) else {
        panic!("put_start answered something else")
    };
    assert!(
        overlaps(v[0].as_ref().unwrap()),
        "best fit reuses the freed range"
    );

    // Not leased, not forced: held just the same (a reader leased before
    // the leader's verdict is protected even if leader memory missed it).
    first_item(&put_end(&mut s, 10_060, "y", 3, "k3")).unwrap();
    let before = s.total_allocated();
    let remove = Op::Remove {
        keys: vec!["k3".into()],
        force: false,
        leased: Default::default(),
        hold_ms: 10_000,
    };
    first_item(&s.apply(&cmd(10_070, "x", 2, remove))).unwrap();
    assert!(!s.exists("k3"));
    assert_eq!(s.total_allocated(), before, "space held for a lease TTL");
}

#[test]
fn put_end_and_revoke_check_the_writer() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    put(&mut s, 10, "alice", 1, "k", 100, 1);
    assert_eq!(
        first_item(&put_end(&mut s, 11, "bob", 1, "k")),
        Err(MetaError::InvalidWrite("k".into()))
    );
    assert_eq!(
        first_item(&s.apply(&cmd(
            11,
            "bob",
            2,
            Op::PutRevoke {
                items: vec![("k".into(), 0)],
            }
        ))),
        Err(MetaError::InvalidWrite("k".into()))
    );
    assert_eq!(
        first_item(&s.apply(&cmd(
            12,
            "alice",
            2,
            Op::PutRevoke {
                items: vec![("k".into(), 0)],
            }
        ))),
        Ok(())
    );
    assert!(s.objects.is_empty());
    // The writer gave up, but its bytes may still reach the store while
    // its grant lasts: the range waits out the discard time and the margin.
    assert!(
        s.total_allocated() > 0,
        "a revoked range is fenced, not freed"
    );
    let fenced_until = 10 + policy().discard_after_ms + WRITE_FENCE_MARGIN_MS;
    for (now, freed) in [(fenced_until - 1, false), (fenced_until, true)] {
        s.apply(&Command {
            now_ms: now,
            seed: 0,
            origin: None,
            op: Op::ReclaimStalePuts {},
        });
        assert_eq!(s.total_allocated() == 0, freed, "at {now}");
    }
    // A revoke after the fence has passed frees at once.
    put(&mut s, 100_000, "alice", 3, "late", 100, 1);
    first_item(&s.apply(&cmd(
        100_000 + fenced_until,
        "alice",
        4,
        Op::PutRevoke {
            items: vec![("late".into(), 0)],
        },
    )))
    .unwrap();
    assert_eq!(s.total_allocated(), 0);
}

#[test]
fn zombie_put_is_taken_over_and_reclaimed() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    put(&mut s, 1_000, "dead", 1, "k", MB, 1);
    // Within the discard timeout: the key is still being written, which is
    // not the success-like "already exists".
    assert_eq!(
        first_item(&put(&mut s, 20_000, "live", 1, "k", MB, 1)),
        Err(MetaError::ReplicaNotReady("k".into()))
    );
    // After it: taken over, and the zombie's space stays parked.
    first_item(&put(&mut s, 31_001, "live", 2, "k", MB, 1)).unwrap();
    assert_eq!(s.total_allocated(), 2 * MB);
    assert_eq!(s.pending_release.len(), 1);
    // The zombie's late PutEnd must not complete the new writer's object.
    assert_eq!(
        first_item(&put_end(&mut s, 32_000, "dead", 2, "k")),
        Err(MetaError::InvalidWrite("k".into()))
    );
    first_item(&put_end(&mut s, 32_000, "live", 3, "k")).unwrap();
    // Reclaim before the release deadline changes nothing; after it frees the zombie's space.
    s.apply(&Command {
        now_ms: 500_000,
        seed: 0,
        origin: None,
        op: Op::ReclaimStalePuts {},
    });
    assert_eq!(s.total_allocated(), 2 * MB);
    s.apply(&Command {
        now_ms: 601_000,
        seed: 0,
        origin: None,
        op: Op::ReclaimStalePuts {},
    });
    assert_eq!(s.total_allocated(), MB);
    assert!(s.exists("k"));
}

#[test]
fn silent_clients_segments_expire_and_come_back_on_remount() {
    let mut s = MetaState::new();
    let a = mount(&mut s, 1, "a", "store-a", 64 * MB);
    mount(&mut s, 1, "b", "store-b", 64 * MB);
    put(&mut s, 10, "c", 1, "two", 100, 2);
    put_end(&mut s, 10, "c", 2, "two");
    s.apply(&cmd(
        10,
        "c",
        3,
        Op::PutStart {
            items: vec![("only-a".into(), 100, 0)],
            config: ReplicateConfig {
                replica_num: 1,
                preferred_segments: vec!["a".into()],
                ..Default::default()
            },
            policy: policy(),
        },
    ));
    put_end(&mut s, 10, "c", 4, "only-a");
    assert_eq!(s.lookup("only-a").unwrap().replicas[0].segment_id, a);
    let expire = |s: &mut MetaState| {
        s.apply(&Command {
            now_ms: 20,
            seed: 0,
            origin: None,
            op: Op::UnmountClient {
                client_id: "store-a".into(),
            },
        })
    };
    // A silent client's segments expire: reads skip them, nothing is dropped.
    assert_eq!(expire(&mut s), Response::Count(1));
    assert_eq!(expire(&mut s), Response::Count(0), "already expired");
    assert_eq!(s.lookup("two").unwrap().replicas.len(), 1);
    assert!(matches!(
        s.lookup("only-a"),
        Err(MetaError::ReplicasUnavailable(_))
    ));
    assert!(s.exists("only-a"));
    assert_eq!(s.expired_segments(25, 10, 10), Vec::<SegmentId>::new());
    assert_eq!(s.expired_segments(30, 10, 10), vec![a]);
    // New replicas avoid it: two replicas need two live segments.
    let r = s.apply(&cmd(
        21,
        "c",
        5,
        Op::PutStart {
            items: vec![("new".into(), 100, 0)],
            config: ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            },
            policy: policy(),
        },
    ));
    assert!(
        matches!(first_item(&r), Err(MetaError::InvalidParams(_))),
        "{r:?}"
    );
    // The same store re-mounts: same id, everything readable again.
    assert_eq!(mount(&mut s, 22, "a", "store-a", 64 * MB), a);
    assert_eq!(s.lookup("two").unwrap().replicas.len(), 2);
    assert_eq!(s.lookup("only-a").unwrap().replicas[0].segment_id, a);
    // Expired past its grace, the leader removes it for good.
    expire(&mut s);
    let r = s.apply(&Command {
        now_ms: 90,
        seed: 0,
        origin: None,
        op: Op::UnmountSegment { segment_id: a },
    });
    assert_eq!(r, Response::Done(Ok(())));
    assert_eq!(s.lookup("two").unwrap().replicas.len(), 1);
    assert!(matches!(
        s.lookup("only-a"),
        Err(MetaError::ObjectNotFound(_))
    ));
    let r = s.apply(&Command {
        now_ms: 91,
        seed: 0,
        origin: None,
        op: Op::UnmountSegment { segment_id: a },
    });
    assert_eq!(r, Response::Done(Err(MetaError::SegmentNotFound(a))));
}

#[test]
fn a_new_process_takes_over_an_expired_segment_name() {
    let mut s = MetaState::new();
    let old = mount(&mut s, 1, "seg", "old-process", 64 * MB);
    s.apply(&Command {
        now_ms: 5,
        seed: 0,
        origin: None,
        op: Op::UnmountClient {
            client_id: "old-process".into(),
        },
    });
    let new = mount(&mut s, 6, "seg", "new-process", 64 * MB);
    assert_ne!(new, old);
    assert_eq!(s.segments.len(), 1);
}

#[test]
fn mount_is_idempotent_per_owner() {
    let mut s = MetaState::new();
    let id = mount(&mut s, 1, "seg", "store", 64 * MB);
    assert_eq!(mount(&mut s, 2, "seg", "store", 64 * MB), id);
    let other = s.apply(&Command {
        now_ms: 3,
        seed: 0,
        origin: None,
        op: Op::MountSegment {
            spec: SegmentSpec {
                name: "seg".into(),
                capacity: 64 * MB,
                ..Default::default()
            },
            owner: "intruder".into(),
            key: test_key(),
            tier: Tier::Memory,
            disk_id: String::new(),
        },
    });
    assert_eq!(
        other,
        Response::Mounted(Err(MetaError::SegmentAlreadyExists("seg".into())))
    );
}

fn filled_state() -> MetaState {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 100 * MB);
    for i in 0..10u64 {
        let key = format!("k{i}");
        let soft = i == 0;
        let hard = i == 1;
        s.apply(&cmd(
            100 + i,
            "c",
            2 * i,
            Op::PutStart {
                items: vec![(key.clone(), 9 * MB, 0)],
                config: ReplicateConfig {
                    replica_num: 1,
                    soft_pin: soft,
                    hard_pin: hard,
                    ..Default::default()
                },
                policy: policy(),
            },
        ));
        if i != 9 {
            put_end(&mut s, 100 + i, "c", 2 * i + 1, &key);
        }
    }
    s
}

#[test]
fn eviction_policy_order_and_exclusions() {
    let s = filled_state();
    assert!(should_evict(&s, 0.9, false));
    assert!(!should_evict(&s, 0.95, false));
    assert!(should_evict(&s, 0.95, true));
    // 10 % of 10 objects = 1: the oldest unpinned, unleased, complete one.
    let v = select_victims(&s, 1_000, 0.1, |_| AccessInfo::default());
    assert_eq!(v, vec!["k2"]);
    // A lease or a recent access protects it.
    let v = select_victims(&s, 1_000, 0.1, |k| AccessInfo {
        leased: k == "k2",
        last_access_ms: None,
    });
    assert_eq!(v, vec!["k3"]);
    let v = select_victims(&s, 1_000, 0.2, |k| AccessInfo {
        leased: false,
        last_access_ms: if k == "k2" { Some(999) } else { None },
    });
    assert_eq!(v, vec!["k3", "k4"]);
    // Asking for everything: never the hard-pinned or unfinished, soft-pinned last.
    let v = select_victims(&s, 1_000, 1.0, |_| AccessInfo::default());
    assert_eq!(v.len(), 8);
    assert!(!v.contains(&"k1".to_string()) && !v.contains(&"k9".to_string()));
    assert_eq!(v.last().unwrap(), "k0");
    // Once the soft pin expired, k0 is just the oldest.
    let v = select_victims(&s, 100 + 1_800_001, 0.1, |_| AccessInfo::default());
    assert_eq!(v, vec!["k0"]);
}

#[test]
fn evict_applies_only_to_evictable_objects() {
    let mut s = filled_state();
    let before = s.objects.len();
    let r = s.apply(&Command {
        now_ms: 2_000,
        seed: 0,
        origin: None,
        op: Op::EvictObjects {
            items: crate::eviction::stamped(
                &s,
                vec!["k1".into(), "k9".into(), "k5".into(), "nope".into()],
            ),
        },
    });
    assert_eq!(r, Response::Count(1));
    assert_eq!(s.objects.len(), before - 1);
    assert_eq!(s.evicted_total, 1);
}

mod storage_suite {
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::StorageError;
    use tempfile::TempDir;

    use crate::store::{LogStore, StateMachineStore};
    use crate::{NodeId, TypeConfig};

    struct JournalBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for JournalBuilder {
        async fn build(
            &self,
        ) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
            let dir = TempDir::new().expect("temp dir");
            let (log, sm) = crate::store::open(dir.path()).expect("open store");
            Ok((dir, log, sm))
        }
    }

    #[test]
    fn openraft_storage_conformance() {
        Suite::test_all(JournalBuilder).expect("openraft storage suite");
    }
}

mod durability {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::{CommittedLeaderId, LogId, RaftLogReader, Vote};

    use crate::store;

    #[tokio::test]
    async fn vote_and_committed_survive_reopen() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let (mut log, _sm) = store::open(dir.path()).unwrap();
            log.save_vote(&Vote::new(3, 2)).await.unwrap();
            log.save_committed(Some(LogId::new(CommittedLeaderId::new(3, 2), 0)))
                .await
                .unwrap();
            // save_committed is write-behind: the close writes it at the latest.
            log.save_vote(&Vote::new(4, 2)).await.unwrap();
        }
        let (mut log, mut sm) = store::open(dir.path()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(4, 2)));
        assert_eq!(
            log.read_committed().await.unwrap(),
            Some(LogId::new(CommittedLeaderId::new(3, 2), 0))
        );
        assert!(log.try_get_log_entries(0..10).await.unwrap().is_empty());
        assert_eq!(sm.applied_state().await.unwrap().0, None);
    }

    /// A data dir of an earlier build (its `raft.redb`, no journal) is refused
    /// by name: opened as empty, the master could found a new, empty cluster.
    #[test]
    fn a_data_dir_of_an_earlier_build_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        std::fs::write(dir.path().join("raft.redb"), b"earlier").unwrap();
        let refused = store::open(dir.path()).err().expect("refused");
        assert!(
            matches!(refused, store::OpenError::EarlierStore { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("raft.redb"), "{refused}");
        assert!(!dir.path().join("raft.log").exists(), "nothing was written");
    }

    /// A committed vote (this node led, or followed a leader, in term 5)
    /// comes back uncommitted: openraft would otherwise restore a restarted
    /// leader in its old term without a blank entry (see
    /// `store::without_leadership`).
    #[tokio::test]
    async fn a_committed_vote_comes_back_uncommitted() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let (mut log, _sm) = store::open(dir.path()).unwrap();
            log.save_vote(&Vote::new_committed(5, 1)).await.unwrap();
            assert_eq!(
                log.read_vote().await.unwrap(),
                Some(Vote::new_committed(5, 1)),
                "a running node reads back what it saved"
            );
        }
        let (mut log, sm) = store::open(dir.path()).unwrap();
        let vote = log.read_vote().await.unwrap().unwrap();
        assert_eq!(vote, Vote::new(5, 1));
        assert!(!vote.is_committed());
        drop(log);
        drop(sm);
        // The test-only switch hands it back as saved.
        let (mut log, _sm) =
            store::open_with(dir.path(), store::VoteAtOpen::AsSavedUnsafely).unwrap();
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(5, 1))
        );
    }

    /// The committed hint has no transaction of its own: the one saved last,
    /// with no write after it, reaches the disk when the store closes.
    #[tokio::test]
    async fn the_latest_committed_hint_is_written_at_close() {
        let dir = tempfile::TempDir::new().unwrap();
        let at = |index| Some(LogId::new(CommittedLeaderId::new(3, 2), index));
        {
            let (mut log, _sm) = store::open(dir.path()).unwrap();
            log.save_vote(&Vote::new(3, 2)).await.unwrap();
            log.save_committed(at(0)).await.unwrap();
            log.save_vote(&Vote::new(4, 2)).await.unwrap();
            // No write after this hint but the one at close.
            log.save_committed(at(1)).await.unwrap();
        }
        let (mut log, _sm) = store::open(dir.path()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(4, 2)));
        assert_eq!(log.read_committed().await.unwrap(), at(1));
    }

    /// A persisted vote with an absurd term (a forged Vote with
    /// term u64::MAX was saved, then openraft panicked at every start's
    /// election) is refused when the store opens, with a clear error.
    #[tokio::test]
    async fn an_absurd_persisted_term_is_refused_at_open() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let (mut log, _sm) = store::open(dir.path()).unwrap();
            log.save_vote(&Vote::new(u64::MAX, 2)).await.unwrap();
        }
        let err = match store::open(dir.path()) {
            Ok(_) => panic!("a vote at term u64::MAX was loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("beyond any reachable term"), "{err}");
    }
}

/// Unchecked, a segment declared with a capacity near 2^64 wraps the total
/// capacity (to 1 KiB after 2^64 − 2^28 + 1024) and eviction starts on a
/// nearly empty pool. Such a mount is refused and changes nothing. (Totals
/// also saturate; 65,536 maximal segments would be needed to reach 2^64,
/// more than `--max-segments` allows.)
#[test]
fn an_absurd_segment_capacity_is_refused_and_totals_never_wrap() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 256 * MB);
    let before = s.clone();
    let r = s.apply(&Command {
        now_ms: 2,
        seed: 0,
        origin: None,
        op: Op::MountSegment {
            spec: SegmentSpec {
                name: "huge".into(),
                endpoint: "huge:1".into(),
                capacity: u64::MAX - (1 << 28) + 1024,
                ..Default::default()
            },
            owner: "attacker".into(),
            key: test_key(),
            tier: Tier::Memory,
            disk_id: String::new(),
        },
    });
    assert!(
        matches!(r, Response::Mounted(Err(MetaError::InvalidParams(_)))),
        "{r:?}"
    );
    assert_eq!(s.segments, before.segments);
    assert_eq!(s.total_allocated(), before.total_allocated());
    assert_eq!(s.next_segment_id, before.next_segment_id);
    assert_eq!(s.total_capacity(), 256 * MB);
    // The largest allowed segment mounts.
    mount(&mut s, 3, "big", "store", MAX_SEGMENT_CAPACITY);
    assert_eq!(s.total_capacity(), 256 * MB + MAX_SEGMENT_CAPACITY);
}

/// If every failed allocation asked for an eviction round, 30 PutStarts of
/// 2^63 bytes would evict 85 of 100 objects of a pool 0.03 % full,
/// and one put larger than any segment the only object. A size no
/// live segment could hold even empty fails without asking for eviction; a
/// size that fits once space is freed still does.
#[test]
fn only_allocation_failures_eviction_can_cure_ask_for_eviction() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 4 * MB);
    first_item(&put(&mut s, 10, "c", 1, "small", MB, 1)).unwrap();
    for (seq, size) in [(2, u64::MAX), (3, 1 << 63), (4, 4 * MB + 1), (5, 300 * MB)] {
        assert_eq!(
            first_item(&put(&mut s, 11, "c", seq, &format!("k{seq}"), size, 1)),
            Err(MetaError::NoAvailableHandle(size))
        );
    }
    assert_eq!(s.alloc_failures, 0, "impossible sizes asked for eviction");
    // 4 MiB fits the segment once "small" is evicted: that failure counts.
    assert_eq!(
        first_item(&put(&mut s, 12, "c", 6, "whole", 4 * MB, 1)),
        Err(MetaError::NoAvailableHandle(4 * MB))
    );
    assert_eq!(s.alloc_failures, 1);
}

/// Unbounded, requests with sequence numbers far ahead of a client's push
/// its deduplication window past its real requests, which are then all
/// refused as "older than the deduplication window" (the client can no
/// longer mount). A jump beyond MAX_SEQ_AHEAD is refused and recorded
/// nowhere, so the real client carries on; a new client may start anywhere.
#[test]
fn a_sequence_number_far_ahead_does_not_move_the_dedup_window() {
    let mut s = MetaState::new();
    mount(&mut s, 1, "seg", "store", 64 * MB);
    first_item(&put(&mut s, 10, "victim", 1, "a", 100, 1)).unwrap();
    let before = s.dedup.get("victim").cloned();
    for i in 0..(DEDUP_RESULTS_PER_CLIENT as u64 + 10) {
        let forged = u64::MAX - i;
        assert!(
            matches!(
                put(&mut s, 11, "victim", forged, "forged", 100, 1),
                Response::Rejected(MetaError::InvalidParams(_))
            ),
            "seq {forged} accepted"
        );
    }
    assert_eq!(s.dedup.get("victim").cloned(), before);
    assert!(!s.objects.contains_key("forged"));
    // The real client's next requests still apply.
    first_item(&put(&mut s, 12, "victim", 2, "b", 100, 1)).unwrap();
    first_item(&put(&mut s, 12, "victim", 2 + MAX_SEQ_AHEAD, "c", 100, 1)).unwrap();
    // A client the master has not seen may start at any number.
    first_item(&put(&mut s, 13, "newcomer", u64::MAX / 2, "d", 100, 1)).unwrap();
}

fn put_named(state: &mut MetaState, now: u64, seq: u64, key: &str, put_id: PutId) -> Response {
    state.apply(&cmd(
        now,
        "writer",
        seq,
        Op::PutStart {
            items: vec![(key.into(), 100, put_id)],
            config: ReplicateConfig {
                replica_num: 1,
                ..Default::default()
            },
            policy: policy(),
        },
    ))
}

fn end_named(
    state: &mut MetaState,
    now: u64,
    seq: u64,
    key: &str,
    crc: u32,
    put_id: PutId,
) -> Response {
    state.apply(&cmd(
        now,
        "writer",
        seq,
        Op::PutEnd {
            items: vec![(key.into(), crc, put_id)],
        },
    ))
}

/// The chaos soak's CHECKSUM_MISMATCH (two puts of one key from one client,
/// the second taking the first over, the first put's PutEnd
/// completing the second put's object). With put ids the state machine
/// refuses the stale PutEnd and PutRevoke; the unnamed control shows the
/// old behaviour, so the check is what makes the difference.
#[test]
fn a_put_end_or_revoke_finishes_only_the_put_it_names() {
    for named in [true, false] {
        let mut s = MetaState::new();
        mount(&mut s, 0, "seg", "store", 64 * MB);
        let first = if named { 1 } else { 0 };
        let second = if named { 2 } else { 0 };
        first_item(&put_named(&mut s, 10, 1, "k", first)).unwrap();
        // Past the first put's discard time, the second takes the key over.
        first_item(&put_named(&mut s, 30_011, 2, "k", second)).unwrap();
        let stale_revoke = s.apply(&cmd(
            30_015,
            "writer",
            3,
            Op::PutRevoke {
                items: vec![("k".into(), first)],
            },
        ));
        let stale_end = end_named(&mut s, 30_020, 4, "k", 111, first);
        if named {
            assert!(matches!(
                first_item(&stale_revoke),
                Err(MetaError::InvalidWrite(_))
            ));
            assert!(matches!(
                first_item(&stale_end),
                Err(MetaError::InvalidWrite(_))
            ));
            first_item(&end_named(&mut s, 30_030, 5, "k", 222, second)).unwrap();
            assert_eq!(s.lookup("k").unwrap().checksum, 222);
        } else {
            // Unnamed: the stale revoke takes the second put's object away.
            first_item(&stale_revoke).unwrap();
            assert!(s.lookup("k").is_err());
        }
    }
}

/// Unnamed ends still finish a named put (clients that send no id, as
/// Mooncake's do), and a retried named end of a finished put is a success.
#[test]
fn unnamed_ends_and_retried_named_ends_still_work() {
    let mut s = MetaState::new();
    mount(&mut s, 0, "seg", "store", 64 * MB);
    first_item(&put_named(&mut s, 10, 1, "a", 5)).unwrap();
    first_item(&end_named(&mut s, 20, 2, "a", 9, 0)).unwrap();
    assert_eq!(s.lookup("a").unwrap().checksum, 9);
    first_item(&put_named(&mut s, 30, 3, "b", 6)).unwrap();
    first_item(&end_named(&mut s, 40, 4, "b", 10, 6)).unwrap();
    // A retry outside the dedup window (new seq): already done.
    first_item(&end_named(&mut s, 50, 5, "b", 10, 6)).unwrap();
    assert!(matches!(
        first_item(&end_named(&mut s, 60, 6, "b", 10, 7)),
        Err(MetaError::InvalidWrite(_))
    ));
}

fn reserve_on(
    s: &mut MetaState,
    now: u64,
    segment_id: SegmentId,
    len: u64,
    term: u64,
) -> (u64, u64) {
    let c = Command {
        now_ms: now,
        seed: 0,
        origin: None,
        op: Op::Reserve {
            segment_id,
            len,
            term,
        },
    };
    match s.apply(&c) {
        Response::Reserved(Ok(v)) => v,
        other => panic!("reserve failed: {other:?}"),
    }
}

fn commit(
    s: &mut MetaState,
    now: u64,
    client: &str,
    seq: u64,
    key: &str,
    replicas: Vec<Replica>,
    deadline_ms: u64,
) -> Result<(), MetaError> {
    let size = replicas[0].len;
    let r = s.apply(&cmd(
        now,
        client,
        seq,
        Op::PutCommit {
            items: vec![CommitItem {
                key: key.into(),
                size,
                checksum: 9,
                put_id: seq,
                replicas,
                deadline_ms,
            }],
            config: ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            },
            policy: policy(),
        },
    ));
    first_item(&r)
}

fn rep(segment_id: SegmentId, offset: u64, len: u64) -> Replica {
    Replica {
        segment_id,
        offset,
        len,
    }
}

/// The one commit of a one-commit put: it records placement and object
/// together, only inside free space of a reservation, only before its
/// deadline, and a range is taken once; retiring returns only what is free.
#[test]
fn a_put_commit_takes_free_reserved_space_once_and_before_its_deadline() {
    let mut s = MetaState::new();
    let a = mount(&mut s, 0, "a", "o", 64 * MB);
    let b = mount(&mut s, 0, "b", "o", 64 * MB);
    let (ra, base_a) = reserve_on(&mut s, 1, a, 8 * MB, 3);
    let (_, base_b) = reserve_on(&mut s, 1, b, 8 * MB, 3);
    assert_eq!(s.total_allocated(), 16 * MB);
    assert_eq!(s.usage_ratio(), 0.0, "reserved free space is not usage");

    let two = vec![rep(a, base_a, 4096), rep(b, base_b + 4096, 4096)];
    assert_eq!(commit(&mut s, 10, "c", 1, "k", two.clone(), 100), Ok(()));
    let view = s.lookup("k").unwrap();
    assert_eq!((view.replicas, view.checksum), (two.clone(), 9));
    // The same range again, for another key: refused, nothing changes.
    let before = s.clone();
    assert!(matches!(
        commit(&mut s, 11, "d", 1, "k2", vec![rep(a, base_a, 4096)], 100),
        Err(MetaError::InvalidWrite(_))
    ));
    assert_eq!(s.objects, before.objects);
    // Outside any reservation, past the deadline, an existing key.
    assert!(matches!(
        commit(&mut s, 12, "d", 2, "k3", vec![rep(a, 32 * MB, 4096)], 100),
        Err(MetaError::InvalidWrite(_))
    ));
    assert!(matches!(
        commit(
            &mut s,
            101,
            "d",
            3,
            "k4",
            vec![rep(a, base_a + 8192, 4096)],
            100
        ),
        Err(MetaError::InvalidWrite(_))
    ));
    assert_eq!(
        commit(
            &mut s,
            13,
            "d",
            4,
            "k",
            vec![rep(a, base_a + 8192, 4096)],
            1000
        ),
        Err(MetaError::ObjectAlreadyExists("k".into()))
    );
    // Two replicas on one segment, a length that is not the size.
    assert!(matches!(
        commit(
            &mut s,
            14,
            "d",
            5,
            "k5",
            vec![rep(a, base_a + 8192, 4096), rep(a, base_a + 16384, 4096)],
            1000
        ),
        Err(MetaError::InvalidParams(_))
    ));

    let mut recount = s.clone();
    recount.rebuild_derived().unwrap();
    assert_eq!(s, recount);

    // Retiring returns the free rest; the object keeps its range; removing
    // the object then frees it to the segment.
    let r = s.apply(&Command {
        now_ms: 20,
        seed: 0,
        origin: None,
        op: Op::RetireReservations { ids: vec![ra] },
    });
    assert_eq!(r, Response::Count(1));
    assert_eq!(
        commit(
            &mut s,
            21,
            "d",
            6,
            "k6",
            vec![rep(a, base_a + 8192, 4096)],
            1000
        )
        .map_err(|e| e.code()),
        Err(crescent_proto::ErrorCode::InvalidWrite),
        "a retired reservation's space is no longer committable"
    );
    assert_eq!(s.allocator(a).unwrap().allocated(), 4096);
    let mut recount = s.clone();
    recount.rebuild_derived().unwrap();
    assert_eq!(s, recount);
}

/// What can interleave around a failover, as the state machine sees it: the
/// old leader's reservation stays out of the new leader's reach until it is
/// retired, a commit of the old leader's placement still lands while it is
/// not retired, and a new reservation never overlaps an unretired one.
#[test]
fn an_old_terms_reservation_is_kept_whole_until_retired() {
    let mut s = MetaState::new();
    let a = mount(&mut s, 0, "a", "o", 32 * MB);
    let (old, old_base) = reserve_on(&mut s, 1, a, 16 * MB, 7);
    // The new leader (term 8) reserves: it gets other space.
    let (_, new_base) = reserve_on(&mut s, 5, a, 16 * MB, 8);
    assert!(new_base >= old_base + 16 * MB || new_base + 16 * MB <= old_base);
    // Nothing is left for a two-commit put either.
    assert!(
        matches!(put(&mut s, 6, "x", 1, "two", 4096, 1), Response::PutStart(v) if v[0].is_err())
    );
    // The old leader's writer commits through the new leader.
    assert_eq!(
        commit(&mut s, 7, "w", 1, "late", vec![rep(a, old_base, 4096)], 100),
        Ok(())
    );
    s.apply(&Command {
        now_ms: 8,
        seed: 0,
        origin: None,
        op: Op::RetireReservations { ids: vec![old] },
    });
    assert!(s.lookup("late").is_ok());
    assert_eq!(s.allocator(a).unwrap().allocated(), 16 * MB + 4096);
    // A segment's reservations go with it.
    s.apply(&Command {
        now_ms: 9,
        seed: 0,
        origin: None,
        op: Op::UnmountSegment { segment_id: a },
    });
    assert!(s.reservations.is_empty());
}

/// Random reserve / commit / retire / remove / evict / unmount / two-commit
/// puts, choosing commit ranges from the state as a leader would (and some
/// stale ones): after every command no two objects or free reserved ranges
/// overlap, and the derived allocators equal a recount.
#[test]
fn reservations_and_objects_never_overlap_under_random_commands() {
    let mut s = MetaState::new();
    let segs: Vec<SegmentId> = ["a", "b", "c"]
        .iter()
        .map(|n| mount(&mut s, 0, n, "o", 16 * MB))
        .collect();
    let mut x = 0x9e37_79b9u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut seq = 0;
    for i in 0..4000u64 {
        let now = 100 + i;
        seq += 1;
        let key = format!("k{}", rnd() % 150);
        let seg = segs[(rnd() % 3) as usize];
        let op = match rnd() % 9 {
            0 => Op::Reserve {
                segment_id: seg,
                len: 1 + rnd() % (2 * MB),
                term: rnd() % 3,
            },
            1 => {
                let ids: Vec<u64> = s
                    .reservations
                    .keys()
                    .copied()
                    .filter(|_| rnd() % 2 == 0)
                    .collect();
                Op::RetireReservations { ids }
            }
            2..=4 => {
                // A range from a reservation's free space (or a stale one).
                let len = 1 + rnd() % (256 << 10);
                let pick = s
                    .reservations
                    .values()
                    .filter(|r| r.segment_id == seg)
                    .flat_map(|r| r.free.iter().map(|(o, l)| (*o, *l)))
                    .find(|(_, l)| *l >= len);
                let offset = match pick {
                    Some((o, _)) if rnd() % 5 != 0 => o,
                    _ => (rnd() % (16 * MB)) & !63,
                };
                Op::PutCommit {
                    items: vec![CommitItem {
                        key,
                        size: len,
                        checksum: 1,
                        put_id: seq,
                        replicas: vec![Replica {
                            segment_id: seg,
                            offset,
                            len,
                        }],
                        deadline_ms: now + rnd() % 3,
                    }],
                    config: ReplicateConfig {
                        replica_num: 1,
                        ..Default::default()
                    },
                    policy: policy(),
                }
            }
            5 => Op::PutStart {
                items: vec![(key, 1 + rnd() % MB, seq)],
                config: ReplicateConfig {
                    replica_num: 1,
                    ..Default::default()
                },
                policy: policy(),
            },
            6 => Op::Remove {
                keys: vec![key],
                force: true,
                leased: Default::default(),
                hold_ms: 0,
            },
            7 => Op::EvictObjects {
                items: crate::eviction::stamped(&s, vec![key]),
            },
            _ if i % 500 == 499 => Op::UnmountSegment { segment_id: seg },
            _ => Op::ReclaimStalePuts {},
        };
        s.apply(&cmd(now, "c", seq, op));
        let mut ranges: Vec<(SegmentId, u64, u64)> = s
            .objects
            .values()
            .flat_map(|o| {
                o.replicas.iter().map(|r| {
                    (
                        r.segment_id,
                        r.offset,
                        crate::alloc::aligned_len(r.len).unwrap(),
                    )
                })
            })
            .chain(
                s.reservations
                    .values()
                    .flat_map(|r| r.free.iter().map(|(o, l)| (r.segment_id, *o, *l))),
            )
            .chain(s.pending_release.iter().map(|p| {
                (
                    p.replica.segment_id,
                    p.replica.offset,
                    crate::alloc::aligned_len(p.replica.len).unwrap(),
                )
            }))
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(
                w[0].0 != w[1].0 || w[0].1 + w[0].2 <= w[1].1,
                "overlap at command {i}: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
        let mut recount = s.clone();
        recount.rebuild_derived().unwrap();
        assert_eq!(s, recount, "derived state drifted at command {i}");
    }
    assert!(s.objects.values().any(|o| o.put_id > 0));
}
