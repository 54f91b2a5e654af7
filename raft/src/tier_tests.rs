//! Unit tests of the disk tier in the state machine: tiered mounts, the
//! re-attach of a restarted store's disk segment, and demotions.

use crate::eviction::{
    plan_eviction, select_disk_copies, select_victims_in, stamped, AccessInfo, EvictionPlan,
};
use crate::state::*;

const MB: u64 = 1 << 20;

/// No segment avoided as a copy target.
fn none() -> std::collections::BTreeSet<SegmentId> {
    Default::default()
}

fn policy() -> PutPolicy {
    PutPolicy {
        discard_after_ms: 30_000,
        release_after_ms: 600_000,
        soft_pin_ttl_ms: 1_800_000,
    }
}

fn run(s: &mut MetaState, now: u64, op: Op) -> Response {
    s.apply(&Command {
        now_ms: now,
        seed: now,
        origin: None,
        op,
    })
}

fn run_as(s: &mut MetaState, now: u64, client: &str, seq: u64, op: Op) -> Response {
    s.apply(&Command {
        now_ms: now,
        seed: seq,
        origin: Some(Origin {
            client_id: client.into(),
            seq,
        }),
        op,
    })
}

fn mount_tier(
    s: &mut MetaState,
    now: u64,
    name: &str,
    owner: &str,
    cap: u64,
    tier: Tier,
    disk_id: &str,
) -> Result<SegmentId, MetaError> {
    match run(
        s,
        now,
        Op::MountSegment {
            spec: SegmentSpec {
                name: name.into(),
                endpoint: format!("{name}:1"),
                capacity: cap,
                ..Default::default()
            },
            owner: owner.into(),
            key: SegmentKeyBytes(vec![owner.len() as u8; 32]),
            tier,
            disk_id: disk_id.into(),
        },
    ) {
        Response::Mounted(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

/// Puts `key` (one replica) and finishes it; returns its replica.
fn put_done(s: &mut MetaState, now: u64, seq: u64, key: &str, size: u64) -> Replica {
    let placed = match run_as(
        s,
        now,
        "w",
        seq,
        Op::PutStart {
            items: vec![(key.into(), size, seq)],
            config: ReplicateConfig {
                replica_num: 1,
                ..Default::default()
            },
            policy: policy(),
        },
    ) {
        Response::PutStart(mut r) => r.remove(0).expect("placed"),
        other => panic!("unexpected {other:?}"),
    };
    match run_as(
        s,
        now,
        "w",
        seq + 1_000_000,
        Op::PutEnd {
            items: vec![(key.into(), 42, seq)],
        },
    ) {
        Response::Items(r) => r[0].clone().expect("ended"),
        other => panic!("unexpected {other:?}"),
    }
    placed[0].clone()
}

fn demote_start(
    s: &mut MetaState,
    now: u64,
    key: &str,
    target: SegmentId,
) -> Result<TierMove, MetaError> {
    move_start(s, now, key, target, Tier::Disk)
}

fn move_start(
    s: &mut MetaState,
    now: u64,
    key: &str,
    target: SegmentId,
    to: Tier,
) -> Result<TierMove, MetaError> {
    match run(
        s,
        now,
        Op::TierMoveStart {
            to,
            items: vec![(key.into(), target)],
            release_after_ms: 1_000,
        },
    ) {
        Response::TierMoves(mut r) => r.remove(0),
        other => panic!("unexpected {other:?}"),
    }
}

fn demote_end(
    s: &mut MetaState,
    now: u64,
    id: TierMoveId,
    copied: bool,
    hold_ms: u64,
) -> Result<(), MetaError> {
    move_end(s, now, id, copied, true, hold_ms)
}

fn move_end(
    s: &mut MetaState,
    now: u64,
    id: TierMoveId,
    copied: bool,
    release_source: bool,
    hold_ms: u64,
) -> Result<(), MetaError> {
    match run(
        s,
        now,
        Op::TierMoveEnd {
            items: vec![(id, copied)],
            release_source,
            hold_ms,
        },
    ) {
        Response::Items(r) => r[0].clone(),
        other => panic!("unexpected {other:?}"),
    }
}

fn recount_equal(s: &MetaState) {
    let mut recount = s.clone();
    recount.rebuild_derived().expect("consistent");
    assert_eq!(s, &recount, "derived state drifted");
}

#[test]
fn puts_go_to_disk_only_when_memory_is_full_and_each_tier_has_its_own_usage() {
    let mut s = MetaState::new();
    let mem = mount_tier(&mut s, 0, "m", "store", 4 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 64 * MB, Tier::Disk, "d1").unwrap();
    for i in 0..3 {
        let r = put_done(&mut s, 1, 10 + i, &format!("k{i}"), MB);
        assert_eq!(r.segment_id, mem, "a put lands in memory while it has room");
    }
    assert_eq!(s.tier_usage(Tier::Memory), (4 * MB, 3 * MB));
    assert_eq!(s.tier_usage(Tier::Disk), (64 * MB, 0));
    assert!((s.usage_ratio() - 0.75).abs() < 1e-9, "memory usage only");
    assert_eq!(s.disk_usage_ratio(), 0.0);
    // Two replicas need two memory segments: the disk one does not count.
    let two = run_as(
        &mut s,
        2,
        "w",
        99,
        Op::PutStart {
            items: vec![("two".into(), 64, 99)],
            config: ReplicateConfig {
                replica_num: 2,
                ..Default::default()
            },
            policy: policy(),
        },
    );
    assert!(
        matches!(two, Response::Rejected(MetaError::InvalidParams(_))),
        "{two:?}"
    );
    // Reservations (one-commit puts) are memory only too.
    let res = run(
        &mut s,
        3,
        Op::Reserve {
            segment_id: disk,
            len: MB,
            term: 1,
        },
    );
    assert!(
        matches!(res, Response::Reserved(Err(MetaError::SegmentNotFound(_)))),
        "{res:?}"
    );
    // Memory full: the put goes to disk rather than failing, and still
    // counts as a memory allocation failure (the leader demotes to make
    // room for the next puts).
    let start =
        |s: &mut MetaState, now: u64, seq: u64, key: &str, size: u64, hard_pin: bool| match run_as(
            s,
            now,
            "w",
            seq,
            Op::PutStart {
                items: vec![(key.into(), size, seq)],
                config: ReplicateConfig {
                    replica_num: 1,
                    hard_pin,
                    ..Default::default()
                },
                policy: policy(),
            },
        ) {
            Response::PutStart(mut r) => r.remove(0),
            other => panic!("unexpected {other:?}"),
        };
    let failures = s.alloc_failures;
    let big = start(&mut s, 4, 100, "big", 2 * MB, false).expect("placed on disk");
    assert_eq!(big.len(), 1);
    assert_eq!(big[0].segment_id, disk, "memory full: the put goes to disk");
    assert_eq!(
        s.alloc_failures,
        failures + 1,
        "memory's failure is counted"
    );
    assert_eq!(s.tier_usage(Tier::Disk), (64 * MB, 2 * MB));
    // A hard-pinned object must stay in memory: it fails instead.
    let pinned = start(&mut s, 5, 101, "pinned", 2 * MB, true);
    assert!(
        matches!(pinned, Err(MetaError::NoAvailableHandle(_))),
        "{pinned:?}"
    );
    // Disk full too: the put fails, and nothing changed.
    let before = s.clone();
    let huge = start(&mut s, 6, 102, "huge", 63 * MB, false);
    assert!(
        matches!(huge, Err(MetaError::NoAvailableHandle(_))),
        "{huge:?}"
    );
    assert_eq!(s.objects, before.objects);
    assert_eq!(s.tier_usage(Tier::Disk), before.tier_usage(Tier::Disk));
    // A put that prefers a store's memory segment goes to that store's
    // disk, whatever the rotation would pick.
    let other = mount_tier(&mut s, 6, "o-disk", "other", 64 * MB, Tier::Disk, "d2").unwrap();
    for seq in 200..206u64 {
        let placed = run_as(
            &mut s,
            6,
            "w",
            seq,
            Op::PutStart {
                items: vec![(format!("pref{seq}"), 2 * MB, seq)],
                config: ReplicateConfig {
                    replica_num: 1,
                    preferred_segments: vec!["m".into()],
                    ..Default::default()
                },
                policy: policy(),
            },
        );
        assert!(
            matches!(&placed, Response::PutStart(r) if r[0].as_ref().is_ok_and(|x| x[0].segment_id == disk)),
            "{placed:?}"
        );
    }
    // Without a preference, the rotation uses both disks.
    let mut used = std::collections::BTreeSet::new();
    for seq in 300..306u64 {
        let r = start(&mut s, 7, seq, &format!("any{seq}"), 2 * MB, false).expect("on disk");
        used.insert(r[0].segment_id);
    }
    assert_eq!(used, [disk, other].into(), "rotation over the disks");
    // Room in memory again: puts go there, not to disk.
    let r = put_done(&mut s, 7, 103, "small", 64);
    assert_eq!(r.segment_id, mem);
    recount_equal(&s);
}

#[test]
fn bad_tiered_mounts_are_refused_and_change_nothing() {
    let mut s = MetaState::new();
    assert!(matches!(
        mount_tier(&mut s, 0, "d", "o", MB, Tier::Disk, ""),
        Err(MetaError::InvalidParams(_))
    ));
    assert!(matches!(
        mount_tier(&mut s, 0, "m", "o", MB, Tier::Memory, "x"),
        Err(MetaError::InvalidParams(_))
    ));
    let long = "x".repeat(129);
    assert!(matches!(
        mount_tier(&mut s, 0, "d", "o", MB, Tier::Disk, &long),
        Err(MetaError::InvalidParams(_))
    ));
    assert!(s.segments.is_empty());
    mount_tier(&mut s, 0, "d", "o", MB, Tier::Disk, "id1").unwrap();
    // The same owner cannot turn it into memory or another disk.
    assert!(matches!(
        mount_tier(&mut s, 1, "d", "o", MB, Tier::Memory, ""),
        Err(MetaError::InvalidParams(_))
    ));
    assert!(matches!(
        mount_tier(&mut s, 1, "d", "o", MB, Tier::Disk, "id2"),
        Err(MetaError::InvalidParams(_))
    ));
    // Another owner with another disk id while it is live: taken.
    assert!(matches!(
        mount_tier(&mut s, 1, "d", "p", MB, Tier::Disk, "id2"),
        Err(MetaError::SegmentAlreadyExists(_))
    ));
    assert_eq!(s.segments.len(), 1);
    assert_eq!(s.segments.values().next().unwrap().disk_id, "id1");
}

#[test]
fn a_demotion_moves_an_object_to_disk_and_holds_its_memory_for_readers() {
    let mut s = MetaState::new();
    let mem = mount_tier(&mut s, 0, "m", "store", 4 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    let src = put_done(&mut s, 10, 1, "k", MB);
    let victims = select_victims_in(&s, Tier::Memory, 20, 1.0, |_| AccessInfo::default());
    assert_eq!(victims, vec!["k".to_string()]);
    assert!(select_victims_in(&s, Tier::Disk, 20, 1.0, |_| AccessInfo::default()).is_empty());

    let d = demote_start(&mut s, 20, "k", disk).unwrap();
    assert_eq!(d.source, src);
    assert_eq!(d.target.segment_id, disk);
    assert_eq!((d.checksum, d.size), (42, MB));
    // While copying the object stays readable from memory, and a second
    // demotion of it is refused.
    assert_eq!(s.lookup("k").unwrap().replicas, vec![src.clone()]);
    assert!(demote_start(&mut s, 21, "k", disk).is_err());
    assert_eq!(s.tier_usage(Tier::Disk).1, MB, "the disk range is held");
    recount_equal(&s);

    demote_end(&mut s, 30, d.id, true, 100).unwrap();
    assert_eq!(s.lookup("k").unwrap().replicas, vec![d.target.clone()]);
    assert_eq!(s.demoted_total, 1);
    assert!(s.tier_moves.is_empty());
    // The memory stays allocated for the lease TTL, then is reclaimed;
    // eviction does not count it meanwhile (it would demote ever more).
    assert_eq!(s.tier_usage(Tier::Memory).1, MB);
    assert!((s.usage_ratio() - 0.25).abs() < 1e-9);
    assert_eq!(s.eviction_usage_ratio(), 0.0);
    recount_equal(&s);
    assert!(!s.has_reclaimable(129));
    assert!(s.has_reclaimable(130));
    run(&mut s, 130, Op::ReclaimStalePuts {});
    assert_eq!(s.tier_usage(Tier::Memory).1, 0);
    // Now on disk only: a disk victim, no longer a memory one.
    assert!(select_victims_in(&s, Tier::Memory, 140, 1.0, |_| AccessInfo::default()).is_empty());
    assert_eq!(
        select_victims_in(&s, Tier::Disk, 140, 1.0, |_| AccessInfo::default()),
        vec!["k".to_string()]
    );
    // A demoted object can be removed and evicted like any other.
    let _ = mem;
    let chosen = stamped(&s, vec!["k".into()]);
    assert_eq!(
        run(&mut s, 150, Op::EvictObjects { items: chosen }),
        Response::Count(1)
    );
    assert_eq!(s.tier_usage(Tier::Disk).1, 0);
    recount_equal(&s);
}

/// Eviction victims are split by what frees their memory. A victim whose
/// copy between tiers is in flight, such as one an earlier leader started
/// and never ended (it died after its TierMoveStart), is left alone until
/// that copy ends or is released: a demotion of it would be refused, and a
/// refused demotion used to be evicted (a soak lost 30 keys that way).
#[test]
fn eviction_leaves_a_victim_being_copied_alone_and_demotes_it_once_released() {
    let mut s = MetaState::new();
    let mem = mount_tier(&mut s, 0, "m", "store", 8 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    put_done(&mut s, 10, 1, "cold", MB);
    put_done(&mut s, 10, 2, "copying", MB);
    put_done(&mut s, 10, 3, "promoted", MB);
    put_done(&mut s, 10, 4, "large", 2 * MB);
    let d = demote_start(&mut s, 11, "promoted", disk).unwrap();
    demote_end(&mut s, 12, d.id, true, 0).unwrap();
    let p = move_start(&mut s, 13, "promoted", mem, Tier::Memory).unwrap();
    move_end(&mut s, 14, p.id, true, false, 0).unwrap();
    // An earlier leader's demotion round, cut off after its start.
    let orphan = demote_start(&mut s, 20, "copying", disk).unwrap();
    recount_equal(&s);

    let mut victims = stamped(
        &s,
        ["cold", "copying", "promoted", "large", "gone"]
            .map(String::from)
            .to_vec(),
    );
    assert_eq!(victims.len(), 4, "a key naming no object gets no stamp");
    let large = victims[3].clone();
    victims.push(("gone".into(), large.1));
    let before = s.clone();
    assert_eq!(
        plan_eviction(&s, victims, MB, &none()),
        EvictionPlan {
            drop_memory_copy: vec!["promoted".into()],
            demote: vec!["cold".into()],
            evict: vec![large],
            busy: vec!["copying".into()],
            gone: vec!["gone".into()],
        }
    );
    assert_eq!(s, before, "planning changes nothing");
    assert!(s.is_moving("copying") && !s.is_moving("cold"));

    // Its release time passes with no end: the held target range is
    // released, the object is still whole in memory, and the next round
    // demotes it.
    assert!(s.has_reclaimable(orphan.release_at_ms));
    run(&mut s, orphan.release_at_ms, Op::ReclaimStalePuts {});
    assert!(!s.is_moving("copying"));
    assert_eq!(
        s.lookup("copying").unwrap().replicas,
        vec![orphan.source.clone()]
    );
    assert_eq!(
        plan_eviction(&s, stamped(&s, vec!["copying".into()]), MB, &none()).demote,
        vec!["copying".to_string()]
    );
    recount_equal(&s);
}

/// A disk segment whose copies failed lately is not counted as room: a
/// victim goes to another disk segment with room, or, with none, is
/// evicted as without a disk tier.
#[test]
fn a_disk_segment_avoided_after_failed_copies_is_no_room_for_demotion() {
    let mut s = MetaState::new();
    mount_tier(&mut s, 0, "m", "store", 8 * MB, Tier::Memory, "").unwrap();
    let failing = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    put_done(&mut s, 10, 1, "cold", MB);
    let victims = || stamped(&s, vec!["cold".into()]);
    let avoided: std::collections::BTreeSet<SegmentId> = [failing].into();
    assert_eq!(
        plan_eviction(&s, victims(), MB, &none()).demote,
        vec!["cold".to_string()]
    );
    let plan = plan_eviction(&s, victims(), MB, &avoided);
    assert!(plan.demote.is_empty());
    assert_eq!(plan.evict.len(), 1, "no other disk: evicted");
    mount_tier(&mut s, 0, "other-disk", "other", 8 * MB, Tier::Disk, "d2").unwrap();
    assert_eq!(
        plan_eviction(&s, stamped(&s, vec!["cold".into()]), MB, &avoided).demote,
        vec!["cold".to_string()],
        "another disk segment has room"
    );
}

/// An eviction round chooses its victims, then a failed demotion or a full
/// disk decides to drop them. Meanwhile a key may be removed by force (a
/// force ignores the round's claim) and put again, and that put answered.
/// The round must drop only the object it chose: a chaos run lost a put
/// acknowledged 0.6 ms before the old `Evict`, which names keys, applied.
#[test]
fn an_eviction_drops_only_the_object_it_chose_never_a_later_put_of_its_key() {
    let mut s = MetaState::new();
    mount_tier(&mut s, 0, "m", "store", 8 * MB, Tier::Memory, "").unwrap();
    put_done(&mut s, 10, 1, "k", MB);
    put_done(&mut s, 10, 2, "other", MB);
    let chosen = stamped(&s, vec!["k".into(), "other".into()]);

    let removed = run(
        &mut s,
        20,
        Op::Remove {
            keys: vec!["k".into()],
            force: true,
            leased: Default::default(),
            hold_ms: 0,
        },
    );
    assert_eq!(removed, Response::Items(vec![Ok(())]));
    put_done(&mut s, 30, 3, "k", MB);
    let again = s.lookup("k").unwrap();

    let plan = plan_eviction(&s, chosen.clone(), MB, &none());
    assert_eq!(plan.gone, vec!["k".to_string()]);
    assert_eq!(
        plan.evict.len(),
        1,
        "no disk: the unchanged victim is evicted"
    );

    assert_eq!(
        run(&mut s, 40, Op::EvictObjects { items: chosen }),
        Response::Count(1)
    );
    assert_eq!(s.lookup("k").unwrap(), again, "the later put stays");
    assert!(s.lookup("other").is_err(), "the chosen object goes");
    recount_equal(&s);
}

/// A promotion copies a disk-only object back to memory and keeps its disk
/// replica; evicting it from memory later only releases the memory copy.
#[test]
fn a_promotion_adds_a_memory_replica_and_keeps_the_disk_one() {
    let mut s = MetaState::new();
    let mem = mount_tier(&mut s, 0, "m", "store", 4 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    put_done(&mut s, 10, 1, "k", MB);
    let d = demote_start(&mut s, 20, "k", disk).unwrap();
    demote_end(&mut s, 30, d.id, true, 0).unwrap();
    let on_disk = d.target.clone();
    assert_eq!(s.lookup("k").unwrap().replicas, vec![on_disk.clone()]);

    // Refused: a target of the wrong tier, an object already in memory.
    assert!(matches!(
        move_start(&mut s, 40, "k", disk, Tier::Memory),
        Err(MetaError::SegmentNotFound(_))
    ));
    put_done(&mut s, 40, 2, "in-memory", MB);
    let before = s.clone();
    assert!(move_start(&mut s, 41, "in-memory", mem, Tier::Memory).is_err());
    assert_eq!(s.tier_moves, before.tier_moves, "a refusal changes nothing");

    let p = move_start(&mut s, 50, "k", mem, Tier::Memory).unwrap();
    assert_eq!((p.to, p.source.clone()), (Tier::Memory, on_disk.clone()));
    // While copying, readers keep the disk replica; a demotion of the
    // object, or a second promotion, is refused.
    assert_eq!(s.lookup("k").unwrap().replicas, vec![on_disk.clone()]);
    assert!(move_start(&mut s, 51, "k", mem, Tier::Memory).is_err());
    recount_equal(&s);
    move_end(&mut s, 60, p.id, true, false, 100).unwrap();
    assert_eq!(s.promoted_total, 1);
    assert_eq!(
        s.lookup("k").unwrap().replicas,
        vec![p.target.clone(), on_disk.clone()],
        "memory first, and the disk replica stays"
    );
    recount_equal(&s);
    // Both tiers hold it: a memory victim, not a disk one (it is not
    // only on disk), and a demotion of it is refused.
    assert!(
        select_victims_in(&s, Tier::Memory, 70, 1.0, |_| AccessInfo::default())
            .contains(&"k".to_string())
    );
    assert!(select_victims_in(&s, Tier::Disk, 70, 1.0, |_| AccessInfo::default()).is_empty());
    assert!(demote_start(&mut s, 70, "k", disk).is_err());

    // Memory eviction of a promoted object: the memory copy goes (held for
    // readers), the object stays on disk. A key only in memory, or unknown,
    // is left alone.
    let memory_used = s.tier_usage(Tier::Memory).1;
    assert_eq!(
        run(
            &mut s,
            80,
            Op::DropMemoryCopies {
                keys: vec!["k".into(), "in-memory".into(), "nope".into()],
                hold_ms: 100,
            }
        ),
        Response::Count(1)
    );
    assert_eq!(s.lookup("k").unwrap().replicas, vec![on_disk.clone()]);
    assert!(s.lookup("in-memory").is_ok());
    assert_eq!(
        s.tier_usage(Tier::Memory).1,
        memory_used,
        "held for readers"
    );
    recount_equal(&s);
    run(&mut s, 180, Op::ReclaimStalePuts {});
    assert_eq!(s.tier_usage(Tier::Memory).1, memory_used - MB);
    recount_equal(&s);

    // A promotion whose object was removed and put again meanwhile keeps
    // nothing; with release_source (the test-only exclusive promotion) the
    // disk replica goes.
    let p = move_start(&mut s, 200, "k", mem, Tier::Memory).unwrap();
    run(
        &mut s,
        201,
        Op::Remove {
            keys: vec!["k".into()],
            force: true,
            leased: Default::default(),
            hold_ms: 0,
        },
    );
    put_done(&mut s, 202, 3, "k", MB);
    assert!(move_end(&mut s, 203, p.id, true, false, 0).is_err());
    recount_equal(&s);
    let d = demote_start(&mut s, 210, "k", disk).unwrap();
    demote_end(&mut s, 211, d.id, true, 0).unwrap();
    let p = move_start(&mut s, 220, "k", mem, Tier::Memory).unwrap();
    move_end(&mut s, 221, p.id, true, true, 0).unwrap();
    assert_eq!(s.lookup("k").unwrap().replicas, vec![p.target]);
    recount_equal(&s);
}

#[test]
fn the_disk_watermark_releases_disk_copies_of_promoted_objects_first() {
    let mut s = MetaState::new();
    let mem = mount_tier(&mut s, 0, "m", "store", 8 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    // "promoted": on disk and in memory; "cold": on disk only; "hot": in
    // memory only; "moving": on disk only, being promoted now.
    for (seq, key) in [(1, "promoted"), (2, "cold"), (3, "moving")] {
        put_done(&mut s, 10, seq, key, MB);
        let d = demote_start(&mut s, 20, key, disk).unwrap();
        demote_end(&mut s, 30, d.id, true, 0).unwrap();
    }
    put_done(&mut s, 40, 4, "hot", MB);
    let p = move_start(&mut s, 50, "promoted", mem, Tier::Memory).unwrap();
    move_end(&mut s, 60, p.id, true, false, 0).unwrap();
    move_start(&mut s, 70, "moving", mem, Tier::Memory).unwrap();
    recount_equal(&s);

    // Only the promoted object is a disk copy to release.
    let copies = select_disk_copies(&s, 80, 1.0, |_| AccessInfo::default());
    assert_eq!(copies, vec!["promoted".to_string()]);
    // Leased too: it stays readable from memory, and the hold covers a
    // reader of the disk copy. (Memory eviction leaves leased ones alone.)
    let leased = |_: &str| AccessInfo {
        leased: true,
        last_access_ms: None,
    };
    assert_eq!(select_disk_copies(&s, 80, 1.0, leased), copies);
    assert!(select_victims_in(&s, Tier::Disk, 80, 1.0, leased).is_empty());

    let disk_used = s.tier_usage(Tier::Disk).1;
    let before = s.clone();
    let n = run(
        &mut s,
        90,
        Op::DropDiskCopies {
            keys: ["promoted", "cold", "hot", "moving", "nope"]
                .map(String::from)
                .to_vec(),
            hold_ms: 100,
        },
    );
    assert_eq!(n, Response::Count(1));
    assert_eq!(
        s.lookup("promoted").unwrap().replicas,
        vec![p.target.clone()]
    );
    for key in ["cold", "hot", "moving"] {
        assert_eq!(s.objects[key], before.objects[key], "{key} changed");
    }
    assert_eq!(s.tier_usage(Tier::Disk).1, disk_used, "held for readers");
    // The held range does not count for the watermark: one release is
    // seen at once, and does not make the leader release (or drop) more
    // while the hold lasts.
    let watermark = disk_used as f64 / (8 * MB) as f64;
    assert!(crate::eviction::should_evict_disk(&before, watermark));
    assert!(!crate::eviction::should_evict_disk(&s, watermark));
    recount_equal(&s);
    run(&mut s, 190, Op::ReclaimStalePuts {});
    assert_eq!(s.tier_usage(Tier::Disk).1, disk_used - MB);
    recount_equal(&s);

    // Its memory segment expired (its store missed heartbeats): the disk
    // copy is then the one a restart keeps, and stays.
    let d = demote_start(&mut s, 200, "hot", disk).unwrap();
    demote_end(&mut s, 201, d.id, true, 0).unwrap();
    let p = move_start(&mut s, 210, "hot", mem, Tier::Memory).unwrap();
    move_end(&mut s, 211, p.id, true, false, 0).unwrap();
    run(
        &mut s,
        220,
        Op::UnmountClient {
            client_id: "store".into(),
        },
    );
    let before = s.clone();
    assert_eq!(
        run(
            &mut s,
            230,
            Op::DropDiskCopies {
                keys: vec!["hot".into()],
                hold_ms: 0,
            },
        ),
        Response::Count(0)
    );
    assert_eq!(s.objects, before.objects);
    assert!(select_disk_copies(&s, 240, 1.0, |_| AccessInfo::default()).is_empty());
}

/// A promoted object whose disk store went silent keeps its disk replica
/// when memory eviction releases its memory copy: the store's restart
/// brings the object back.
#[test]
fn a_memory_copy_is_released_even_while_the_disk_segment_is_expired() {
    let mut s = MetaState::new();
    let mem = mount_tier(&mut s, 0, "m", "store", 4 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    put_done(&mut s, 10, 1, "k", MB);
    let d = demote_start(&mut s, 20, "k", disk).unwrap();
    demote_end(&mut s, 21, d.id, true, 0).unwrap();
    let p = move_start(&mut s, 30, "k", mem, Tier::Memory).unwrap();
    move_end(&mut s, 31, p.id, true, false, 0).unwrap();
    run(
        &mut s,
        40,
        Op::UnmountClient {
            client_id: "store".into(),
        },
    );
    assert!(!s.segments[&disk].is_live());
    assert_eq!(
        run(
            &mut s,
            50,
            Op::DropMemoryCopies {
                keys: vec!["k".into()],
                hold_ms: 0,
            }
        ),
        Response::Count(1)
    );
    assert_eq!(s.objects["k"].replicas, vec![d.target]);
    recount_equal(&s);
}

#[test]
fn a_demotion_keeps_nothing_of_an_object_that_changed_or_of_a_failed_copy() {
    let mut s = MetaState::new();
    mount_tier(&mut s, 0, "m", "store", 4 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    put_done(&mut s, 10, 1, "a", MB);
    put_done(&mut s, 10, 2, "b", MB);
    put_done(&mut s, 10, 3, "c", MB);

    // A failed copy frees its disk range and leaves the object alone.
    let da = demote_start(&mut s, 20, "a", disk).unwrap();
    demote_end(&mut s, 21, da.id, false, 100).unwrap();
    assert_eq!(s.tier_usage(Tier::Disk).1, 0);
    assert_eq!(
        s.tier_of(s.lookup("a").unwrap().replicas[0].segment_id),
        Tier::Memory
    );

    // The object was removed and put again while copying: the copy is of
    // the old bytes, so it is dropped.
    let db = demote_start(&mut s, 22, "b", disk).unwrap();
    run(
        &mut s,
        23,
        Op::Remove {
            keys: vec!["b".into()],
            force: true,
            leased: Default::default(),
            hold_ms: 0,
        },
    );
    put_done(&mut s, 24, 4, "b", MB);
    assert!(matches!(
        demote_end(&mut s, 25, db.id, true, 100),
        Err(MetaError::ObjectNotFound(_))
    ));
    assert_eq!(
        s.tier_of(s.lookup("b").unwrap().replicas[0].segment_id),
        Tier::Memory
    );
    assert_eq!(s.tier_usage(Tier::Disk).1, 0);

    // A copier that never reports back: its range is held until the
    // release time (it may still be writing), then reclaimed; a late end
    // is refused.
    let dc = demote_start(&mut s, 30, "c", disk).unwrap();
    assert!(!s.has_reclaimable(30 + 999));
    assert!(s.has_reclaimable(30 + 1000));
    run(&mut s, 1030, Op::ReclaimStalePuts {});
    assert_eq!(s.tier_usage(Tier::Disk).1, 0);
    assert!(demote_end(&mut s, 1031, dc.id, true, 100).is_err());
    assert_eq!(
        s.tier_of(s.lookup("c").unwrap().replicas[0].segment_id),
        Tier::Memory
    );

    // The disk segment's store went silent before the end: the object
    // stays in memory rather than on a disk nobody serves.
    let dd = demote_start(&mut s, 2000, "c", disk).unwrap();
    run(
        &mut s,
        2001,
        Op::UnmountClient {
            client_id: "store".into(),
        },
    );
    assert!(matches!(
        demote_end(&mut s, 2002, dd.id, true, 0),
        Err(MetaError::SegmentNotFound(_))
    ));
    assert_eq!(s.tier_usage(Tier::Disk).1, 0);
    mount_tier(&mut s, 2003, "m", "store", 4 * MB, Tier::Memory, "").unwrap();
    mount_tier(&mut s, 2003, "m-disk", "store", 8 * MB, Tier::Disk, "d1").unwrap();
    assert_eq!(
        s.tier_of(s.lookup("c").unwrap().replicas[0].segment_id),
        Tier::Memory
    );

    // Refusals: unknown key, hard-pinned, a memory segment as target.
    assert!(matches!(
        demote_start(&mut s, 40, "nope", disk),
        Err(MetaError::ObjectNotFound(_))
    ));
    let mem = s.lookup("c").unwrap().replicas[0].segment_id;
    assert!(matches!(
        demote_start(&mut s, 40, "c", mem),
        Err(MetaError::SegmentNotFound(_))
    ));
    recount_equal(&s);
}

#[test]
fn a_restarted_store_takes_its_disk_segment_back_with_its_objects() {
    let mut s = MetaState::new();
    mount_tier(&mut s, 0, "m", "p1", 4 * MB, Tier::Memory, "").unwrap();
    let disk = mount_tier(&mut s, 0, "m-disk", "p1", 8 * MB, Tier::Disk, "d1").unwrap();
    put_done(&mut s, 10, 1, "k", MB);
    let d = demote_start(&mut s, 11, "k", disk).unwrap();
    demote_end(&mut s, 12, d.id, true, 0).unwrap();

    // The store dies: its segments expire, the disk object is unavailable.
    run(
        &mut s,
        20,
        Op::UnmountClient {
            client_id: "p1".into(),
        },
    );
    assert!(matches!(
        s.lookup("k"),
        Err(MetaError::ReplicasUnavailable(_))
    ));
    // A new process (new owner, new key) on the same file gets it back.
    let again = mount_tier(&mut s, 30, "m-disk", "p2", 8 * MB, Tier::Disk, "d1").unwrap();
    assert_eq!(again, disk);
    assert_eq!(s.lookup("k").unwrap().replicas, vec![d.target.clone()]);
    assert_eq!(s.segments[&disk].owner, "p2");
    assert_eq!(s.segments[&disk].key, SegmentKeyBytes(vec![2; 32]));
    // Even before the old one expired, from the same host (the file lock
    // proves it gone); from another host (a copied file) only once expired.
    let mut elsewhere = SegmentSpec {
        name: "m-disk".into(),
        endpoint: "x:1".into(),
        capacity: 8 * MB,
        hostname: "other-host".into(),
        ..Default::default()
    };
    let copied = run(
        &mut s,
        31,
        Op::MountSegment {
            spec: elsewhere.clone(),
            owner: "thief".into(),
            key: SegmentKeyBytes(vec![9; 32]),
            tier: Tier::Disk,
            disk_id: "d1".into(),
        },
    );
    assert!(
        matches!(
            copied,
            Response::Mounted(Err(MetaError::SegmentAlreadyExists(_)))
        ),
        "{copied:?}"
    );
    elsewhere.hostname.clear();
    let again = mount_tier(&mut s, 31, "m-disk", "p3", 8 * MB, Tier::Disk, "d1").unwrap();
    assert_eq!(again, disk);
    assert!(s.lookup("k").is_ok());
    // The memory segment of the dead process is taken over empty, as before.
    run(
        &mut s,
        32,
        Op::UnmountClient {
            client_id: "p1".into(),
        },
    );
    mount_tier(&mut s, 33, "m", "p3", 4 * MB, Tier::Memory, "").unwrap();
    assert!(
        s.lookup("k").is_ok(),
        "the disk replica is not the memory segment's"
    );

    // A reformatted file (new id) is a new segment: the objects are gone.
    run(
        &mut s,
        40,
        Op::UnmountClient {
            client_id: "p3".into(),
        },
    );
    let fresh = mount_tier(&mut s, 50, "m-disk", "p4", 8 * MB, Tier::Disk, "d2").unwrap();
    assert_ne!(fresh, disk);
    assert!(matches!(s.lookup("k"), Err(MetaError::ObjectNotFound(_))));
    recount_equal(&s);
}

/// Random puts, removes, evictions, demotions and promotions (finished,
/// failed, late, abandoned), released memory copies, reclaims, expiries and re-attaches over memory and disk
/// segments: after every command no two live ranges overlap and the derived
/// allocators equal a recount.
#[test]
fn tiers_never_overlap_under_random_commands() {
    let mut s = MetaState::new();
    let mut segs = Vec::new();
    for i in 0..2 {
        segs.push(
            mount_tier(
                &mut s,
                0,
                &format!("m{i}"),
                &format!("p{i}"),
                8 * MB,
                Tier::Memory,
                "",
            )
            .unwrap(),
        );
        segs.push(
            mount_tier(
                &mut s,
                0,
                &format!("d{i}"),
                &format!("p{i}"),
                8 * MB,
                Tier::Disk,
                &format!("id{i}"),
            )
            .unwrap(),
        );
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut seq = 0;
    for i in 0..4000u64 {
        let now = 100 + i * 3;
        seq += 1;
        let key = format!("k{}", rnd() % 60);
        let store = rnd() % 2;
        let op = match rnd() % 10 {
            0 | 1 => Op::PutStart {
                items: vec![(key, 1 + rnd() % MB, seq)],
                config: ReplicateConfig {
                    replica_num: 1 + (rnd() % 2) as u32,
                    ..Default::default()
                },
                policy: PutPolicy {
                    discard_after_ms: 50,
                    release_after_ms: 100,
                    soft_pin_ttl_ms: 0,
                },
            },
            2 => Op::PutEnd {
                items: s
                    .objects
                    .iter()
                    .filter(|(_, o)| !o.is_complete())
                    .take(2)
                    .map(|(k, o)| (k.clone(), 1, o.put_id))
                    .collect(),
            },
            3 | 4 => {
                // Even indices are memory segments, odd ones disk; now and
                // then a target of the wrong tier, which must be refused.
                let to = if rnd() % 3 == 0 {
                    Tier::Memory
                } else {
                    Tier::Disk
                };
                let mut target = 2 * (rnd() % 2) as usize + usize::from(to == Tier::Disk);
                if rnd() % 5 == 0 {
                    target ^= 1;
                }
                Op::TierMoveStart {
                    to,
                    items: vec![(key, segs[target])],
                    release_after_ms: 1 + rnd() % 60,
                }
            }
            5 => {
                let mut items: Vec<(TierMoveId, bool)> = Vec::new();
                for id in s.tier_moves.keys().copied().collect::<Vec<_>>() {
                    if rnd() % 2 == 0 {
                        items.push((id, rnd() % 4 != 0));
                    }
                }
                items.push((rnd() % 50, true));
                Op::TierMoveEnd {
                    items,
                    release_source: rnd() % 4 != 0,
                    hold_ms: rnd() % 20,
                }
            }
            6 => Op::Remove {
                keys: vec![key],
                force: true,
                leased: Default::default(),
                hold_ms: rnd() % 20,
            },
            7 if i % 2 == 0 => Op::EvictObjects {
                items: stamped(&s, vec![key]),
            },
            7 if i % 3 == 0 => Op::DropDiskCopies {
                keys: vec![key],
                hold_ms: rnd() % 20,
            },
            7 => Op::DropMemoryCopies {
                keys: vec![key],
                hold_ms: rnd() % 20,
            },
            8 if i % 97 == 0 => Op::UnmountClient {
                client_id: format!("p{store}"),
            },
            8 if i % 5 == 0 => Op::MountSegment {
                spec: SegmentSpec {
                    name: format!("m{store}"),
                    endpoint: "x:1".into(),
                    capacity: 8 * MB,
                    ..Default::default()
                },
                owner: format!("p{store}"),
                // The key `mount_tier` gave it: a re-mount by its owner.
                key: SegmentKeyBytes(vec![2; 32]),
                tier: Tier::Memory,
                disk_id: String::new(),
            },
            8 if i % 7 == 0 => Op::MountSegment {
                spec: SegmentSpec {
                    name: format!("d{store}"),
                    endpoint: "x:1".into(),
                    capacity: 8 * MB,
                    ..Default::default()
                },
                owner: format!("p{store}-{i}"),
                key: SegmentKeyBytes(vec![1; 32]),
                tier: Tier::Disk,
                disk_id: format!("id{store}"),
            },
            _ => Op::ReclaimStalePuts {},
        };
        run_as(&mut s, now, "w", seq, op);
        let mut ranges: Vec<(SegmentId, u64, u64)> = s
            .objects
            .values()
            .flat_map(|o| o.replicas.iter())
            .chain(s.pending_release.iter().map(|p| &p.replica))
            .chain(s.tier_moves.values().map(|d| &d.target))
            .map(|r| {
                (
                    r.segment_id,
                    r.offset,
                    crate::alloc::aligned_len(r.len).unwrap(),
                )
            })
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
        for o in s.objects.values() {
            let disk = o
                .replicas
                .iter()
                .filter(|r| s.tier_of(r.segment_id) == Tier::Disk)
                .count();
            assert!(disk <= 1, "one disk replica at most at command {i}");
        }
        recount_equal(&s);
    }
    assert!(s.demoted_total > 0, "some demotions finished");
    assert!(s.promoted_total > 0, "some promotions finished");
}
