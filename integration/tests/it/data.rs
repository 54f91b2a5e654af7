//! Real bytes through real processes: a master, two stores and clients.
//! Needs `cargo build --bins` first (`make test` does it).

use std::sync::atomic::Ordering;
use std::time::Duration;

use crescent_client::{Client, ClientConfig, Error, ReplicateConfig};
use crescent_integration::{metric, metric_reaches, FakeClock, LocalCluster};
use crescent_proto::ErrorCode;
use crescent_store::protocol::{Grant, Status};
use crescent_store::ShmMapping;
use crescent_store::TcpTransport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{connect_client, patterned, replicas, wire_replicas};

async fn cluster_with_stores(stores: usize, extra: &[String]) -> LocalCluster {
    let mut c = LocalCluster::start(1, &[]).unwrap();
    c.wait_for_leader(Duration::from_secs(15)).await.unwrap();
    for _ in 0..stores {
        c.start_store("256mb", extra).unwrap();
    }
    c.wait_for_segments(stores as u64, Duration::from_secs(15))
        .await
        .unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_sizes_batches_and_zero_copy() {
    let cluster = cluster_with_stores(2, &[]).await;
    let c = connect_client(&cluster).await;
    for (i, size) in [1usize, 63, 64, 65, 4095, 4096, 4097, 1 << 20, 64 << 20]
        .into_iter()
        .enumerate()
    {
        let key = format!("size-{size}");
        let value = patterned(size, i);
        c.put(&key, &value, &replicas(2)).await.unwrap();
        assert_eq!(c.get(&key).await.unwrap(), value, "{key}");
        assert_eq!(c.get_size(&key).await.unwrap(), size as u64);
        // Zero-copy read into a larger caller buffer.
        let mut buf = vec![0u8; size + 10];
        assert_eq!(c.get_into(&key, &mut buf).await.unwrap(), size);
        assert_eq!(&buf[..size], &value[..]);
        let mut small = vec![0u8; size - 1];
        assert!(matches!(
            c.get_into(&key, &mut small).await,
            Err(Error::BufferTooSmall { .. })
        ));
    }
    // A second put of an existing key succeeds and keeps the first value.
    c.put_from("size-1", &[9], &replicas(1)).await.unwrap();
    assert_eq!(c.get("size-1").await.unwrap(), patterned(1, 0));
    // Empty values are refused.
    assert_eq!(
        c.put("empty", &[], &replicas(1)).await.unwrap_err().code(),
        ErrorCode::InvalidParams
    );

    // Batches, including a missing key.
    let values: Vec<Vec<u8>> = (0..50).map(|i| patterned(1000 + i * 97, i)).collect();
    let keys: Vec<String> = (0..50).map(|i| format!("batch-{i}")).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .map(|k| k.as_str())
        .zip(values.iter().map(|v| v.as_slice()))
        .collect();
    for r in c.batch_put_from(&items, &replicas(2)).await.unwrap() {
        r.unwrap();
    }
    let mut want: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    want.push("batch-missing");
    let got = c.get_batch(&want).await.unwrap();
    for (i, r) in got.iter().take(50).enumerate() {
        assert_eq!(r.as_ref().unwrap(), &values[i]);
    }
    assert_eq!(got[50], Err(Error::NotFound("batch-missing".into())));
    let mut bufs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let sizes = c.batch_get_into(&want[..50], &mut slices).await.unwrap();
    for (i, s) in sizes.into_iter().enumerate() {
        assert_eq!(s.unwrap(), values[i].len());
    }
    assert_eq!(bufs, values);
    let ex = c.batch_exists(&["batch-0", "nope"]).await.unwrap();
    assert_eq!(ex, vec![Ok(true), Ok(false)]);
    assert_eq!(
        c.remove_by_regex("^batch-", false).await.unwrap(),
        0,
        "fresh reads hold leases"
    );
    assert_eq!(c.remove_by_regex("^batch-", true).await.unwrap(), 50);
    assert!(!c.exists("batch-3").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_survive_a_store_kill_and_checksums_catch_corruption() {
    // The stores also offer their segments in /dev/shm, where this test
    // corrupts bytes as failing memory would (the TCP port writes only
    // under a write grant, and this object's has been used). The client
    // claims another host, so it still reads over TCP.
    let mut cluster = cluster_with_stores(2, &["--shm".to_string()]).await;
    let c = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        local_hostname: "another-host".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let corrupt = |r: &crescent_proto::pb::ReplicaDescriptor, at: u64, junk: &[u8]| {
        ShmMapping::open(std::path::Path::new(&r.shm_path))
            .unwrap()
            .write_at(r.offset + at, junk)
            .unwrap()
    };
    let value = patterned(300_000, 7);
    c.put("two", &value, &replicas(2)).await.unwrap();
    c.put("one", &value, &replicas(1)).await.unwrap();

    // Corrupt one replica of "two": the get falls back to the other one.
    let desc = c.master().get_replica_list("two").await.unwrap();
    assert_eq!(desc.replicas.len(), 2);
    assert_ne!(desc.replicas[0].segment_id, desc.replicas[1].segment_id);
    let tcp = TcpTransport::new();
    let garbage = vec![0xAAu8; 1000];
    for r in &desc.replicas[..1] {
        // Not over TCP: a read grant does not allow a write.
        let refused = tcp
            .write(
                &r.endpoint,
                &[(Grant::from(r), r.offset + 5000, &garbage[..])],
            )
            .await;
        assert!(
            matches!(
                refused,
                Err(crescent_store::TransferError::Refused {
                    status: Status::Forbidden,
                    ..
                })
            ),
            "{refused:?}"
        );
        corrupt(r, 5000, &garbage);
    }
    let before = c.stats.checksum_failures.load(Ordering::Relaxed);
    assert_eq!(c.get("two").await.unwrap(), value);
    // Replicas of one route are read in the master's order: the corrupt
    // first one failed its checksum, and the right bytes came from the other.
    let after_two = c.stats.checksum_failures.load(Ordering::Relaxed);
    assert_eq!(
        after_two,
        before + 1,
        "the get did not read the corrupt replica first"
    );
    // Corrupt the only replica of "one": CHECKSUM_MISMATCH, never wrong bytes.
    let one = c.master().get_replica_list("one").await.unwrap();
    corrupt(&one.replicas[0], 0, &garbage);
    assert_eq!(
        c.get("one").await,
        Err(Error::ChecksumMismatch("one".into()))
    );
    assert!(c.stats.checksum_failures.load(Ordering::Relaxed) > after_two);

    // Kill one store: objects with a replica elsewhere stay readable.
    c.put("survivor", &value, &replicas(2)).await.unwrap();
    cluster.stores[0].kill();
    assert_eq!(c.get("survivor").await.unwrap(), value);
    let mut buf = vec![0u8; value.len()];
    assert_eq!(c.get_into("survivor", &mut buf).await.unwrap(), value.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_to_a_dead_store_fails_and_is_revoked() {
    let mut cluster = cluster_with_stores(1, &[]).await;
    let c = connect_client(&cluster).await;
    c.put("before", b"ok", &replicas(1)).await.unwrap();
    // The master still lists the segment (client-ttl has not passed), but its store is gone.
    cluster.stores[0].kill();
    let err = c
        .put("lost", &patterned(10_000, 1), &replicas(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::TransferFail, "{err}");
    assert!(
        !c.exists("lost").await.unwrap(),
        "a failed put must not become readable"
    );
    assert!(matches!(c.get("lost").await, Err(Error::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_to_a_store_port_closes_only_that_connection() {
    let cluster = cluster_with_stores(1, &[]).await;
    let c = connect_client(&cluster).await;
    let value = patterned(100_000, 3);
    c.put("k", &value, &replicas(1)).await.unwrap();
    let endpoint = cluster.stores[0].endpoint.clone();

    // A connection opened before the junk, with a good read on it.
    let good = TcpTransport::new();
    let desc = c.master().get_replica_list("k").await.unwrap();
    let r = &desc.replicas[0];
    let read_head = || async {
        let mut head = [0u8; 16];
        good.read(
            &r.endpoint,
            &mut [(Grant::from(r), r.offset, &mut head[..])],
        )
        .await
        .map(|_| head)
    };
    assert_eq!(read_head().await.unwrap(), value[..16]);

    // Junk bytes and a truncated header: the store closes that connection
    // (its read ends, with EOF or a reset) ...
    for junk in [vec![0x55u8; 100], b"CRES".to_vec()] {
        let mut s = tokio::net::TcpStream::connect(&endpoint).await.unwrap();
        s.write_all(&junk).await.unwrap();
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(
            closed.is_ok(),
            "the store kept a connection that sent {junk:?} open"
        );
    }
    // ... and only that one: the earlier pooled connection still serves.
    assert_eq!(read_head().await.unwrap(), value[..16]);
    let tcp = TcpTransport::new();
    let mut buf = [0u8; 16];
    let grant = Grant::from(r);
    let out_of_range = tcp
        .read(&endpoint, &mut [(grant, u64::MAX - 8, &mut buf[..])])
        .await;
    assert!(out_of_range.is_err());
    let beyond = tcp.write(&endpoint, &[(grant, 1 << 40, &buf[..])]).await;
    assert!(beyond.is_err());
    // A request naming another segment (as after a store restart) is refused,
    // and its bytes are not written.
    let other = Grant {
        segment_id: 0x00AB_CDEF,
        ..grant
    };
    let wrong = tcp.write(&endpoint, &[(other, 0, &buf[..])]).await;
    assert!(
        matches!(
            wrong,
            Err(crescent_store::TransferError::Refused {
                status: crescent_store::protocol::Status::WrongSegment,
                ..
            })
        ),
        "{wrong:?}"
    );
    // Everyone else is still served.
    assert_eq!(c.get("k").await.unwrap(), value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_segment_and_shared_memory_paths() {
    let shm_dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with_stores(
        1,
        &[
            "--shm".into(),
            "--shm-dir".into(),
            shm_dir.path().display().to_string(),
        ],
    )
    .await;
    // A client that contributes memory reads its own replica with a memcpy.
    let contributor = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        global_segment_size: 32 << 20,
        transfer_listen: "127.0.0.1:0".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let own = contributor.local_store().unwrap().name.clone();
    let value = patterned(1 << 20, 9);
    let cfg = ReplicateConfig {
        replica_num: 1,
        preferred_segments: vec![own],
        ..Default::default()
    };
    contributor.put("mine", &value, &cfg).await.unwrap();
    assert_eq!(contributor.get("mine").await.unwrap(), value);
    assert!(contributor.stats.local_bytes.load(Ordering::Relaxed) >= 2 << 20);
    assert_eq!(contributor.stats.tcp_bytes.load(Ordering::Relaxed), 0);

    // A pure client on the same host reads the shm store's replica by mapping it,
    // and the contributor's replica over TCP.
    let reader = connect_client(&cluster).await;
    assert_eq!(reader.get("mine").await.unwrap(), value);
    assert!(reader.stats.tcp_bytes.load(Ordering::Relaxed) >= 1 << 20);
    let shm_cfg = ReplicateConfig {
        replica_num: 1,
        preferred_segments: vec![],
        ..Default::default()
    };
    // Put until one lands on the shm store (placement rotates over the two segments).
    let mut on_shm = None;
    for i in 0..20 {
        let key = format!("s-{i}");
        reader.put(&key, &value, &shm_cfg).await.unwrap();
        let d = reader.master().get_replica_list(&key).await.unwrap();
        if !d.replicas[0].shm_path.is_empty() {
            on_shm = Some(key);
            break;
        }
    }
    let key = on_shm.expect("no object landed on the shm store");
    let shm_before = reader.stats.shm_bytes.load(Ordering::Relaxed);
    assert_eq!(reader.get(&key).await.unwrap(), value);
    assert!(reader.stats.shm_bytes.load(Ordering::Relaxed) >= shm_before + (1 << 20));
    contributor.close().await;
}

/// This process's mappings of files under `dir` that were removed.
fn removed_files_mapped_from(dir: &std::path::Path) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let dir = dir.display().to_string();
    maps.lines()
        .filter(|l| l.contains(&dir) && l.ends_with("(deleted)"))
        .map(str::to_string)
        .collect()
}

/// A client that read a same-host store's shared memory writes nothing
/// more into it once the store died (the put was acknowledged with bytes
/// no store served), and lets go of the mapping: otherwise every restart
/// kept a whole segment's memory alive in every such client, which starved
/// a two-hour chaos soak of memory after about an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_stores_old_shared_memory_is_unmapped() {
    let shm_dir = tempfile::tempdir().unwrap();
    let flags = [
        "--shm".to_string(),
        "--shm-dir".into(),
        shm_dir.path().display().to_string(),
    ];
    let mut cluster = cluster_with_stores(1, &flags).await;
    let c = connect_client(&cluster).await;
    let before = patterned(1 << 20, 1);
    c.put("before", &before, &replicas(1)).await.unwrap();
    assert_eq!(c.get("before").await.unwrap(), before);
    assert!(
        c.stats.shm_bytes.load(Ordering::Relaxed) >= 1 << 20,
        "read through shm"
    );

    cluster.stores[0].kill();
    // The masters still list the dead store's segment for a while.
    let refused = c.put("while-dead", &before, &replicas(1)).await;
    assert!(
        refused.is_err(),
        "a put into a dead store's memory: {refused:?}"
    );
    cluster.stores[0].restart().unwrap();
    let after = patterned(1 << 20, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while c.put("after", &after, &replicas(1)).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no put after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shm_before = c.stats.shm_bytes.load(Ordering::Relaxed);
    assert_eq!(c.get("after").await.unwrap(), after);
    assert!(
        c.stats.shm_bytes.load(Ordering::Relaxed) >= shm_before + (1 << 20),
        "the new file is read through shm"
    );
    let left = removed_files_mapped_from(shm_dir.path());
    assert!(left.is_empty(), "the old file is still mapped: {left:?}");
}

/// An object over MAX_TRANSFER (1 GiB) crosses the TCP data path in several
/// transfers and its checksum is computed over the pieces: a put and both
/// kinds of get round-trip every byte. (Until this test the multi-piece path
/// of `combine_crcs`/`chunks` never ran.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_over_one_gib_round_trips_in_pieces() {
    let mut cluster = LocalCluster::start(1, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    cluster.start_store("1100mb", &[]).unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;
    let size = (1usize << 30) + 4097;
    // Position-dependent bytes (a repeating pattern's period must not divide
    // 1 GiB, or a misplaced piece could still compare equal).
    let value: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    c.put("huge", &value, &replicas(1)).await.unwrap();
    assert_eq!(c.get_size("huge").await.unwrap(), size as u64);
    let got = c.get("huge").await.unwrap();
    assert!(got == value, "get returned different bytes");
    drop(got);
    let mut buf = vec![0u8; size];
    assert_eq!(c.get_into("huge", &mut buf).await.unwrap(), size);
    assert!(buf == value, "get_into returned different bytes");
    // The replica's checksum is the crc32c of the whole object, so a reader
    // that fetched it in one piece (e.g. over shared memory) agrees.
    let found = c.master().get_replica_list("huge").await.unwrap();
    assert_eq!(found.checksum, crc32c::crc32c(&value));
}

// ---- Regression tests for what the chaos suite found -------------------

/// A store restarted on the same address serves a new, empty segment under
/// a new id. A reader or writer still holding a descriptor of the old
/// segment must be refused (WRONG_SEGMENT), not served the new segment's
/// bytes at that offset, nor let write into it. Found by the chaos suite;
/// fixed in 7109e4a by the segment tag in every transfer request: before it
/// the store served any request by offset, so the stale write below landed
/// in the new object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_store_refuses_requests_for_its_previous_segment() {
    let mut cluster = LocalCluster::start(1, &["--client-ttl".into(), "2s".into()]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    cluster.start_store("64mb", &[]).unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;
    let old_value = patterned(4096, 1);
    c.put("old", &old_value, &replicas(1)).await.unwrap();
    let old = c.master().get_replica_list("old").await.unwrap().replicas[0].clone();

    cluster.stores[0].kill();
    cluster.stores[0].restart().unwrap();
    // The first put that succeeds is on the restarted store's new segment.
    let new_value = patterned(4096, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.put("new", &new_value, &replicas(1)).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted store never took a put"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new = c.master().get_replica_list("new").await.unwrap().replicas[0].clone();
    assert_ne!(new.segment_id, old.segment_id);
    assert_eq!(new.endpoint, old.endpoint);

    let tcp = TcpTransport::new();
    // The old descriptor's grant, aimed at the new object's bytes.
    let stale = Grant::from(&old);
    let mut buf = vec![0u8; 4096];
    let read = tcp
        .read(&old.endpoint, &mut [(stale, new.offset, &mut buf[..])])
        .await;
    assert!(
        matches!(
            read,
            Err(crescent_store::TransferError::Refused {
                status: crescent_store::protocol::Status::WrongSegment,
                ..
            })
        ),
        "a read for the old segment was served: {read:?}"
    );
    let junk = vec![0xEEu8; 4096];
    let write = tcp
        .write(&old.endpoint, &[(stale, new.offset, &junk[..])])
        .await;
    assert!(write.is_err(), "a write for the old segment was accepted");
    assert_eq!(c.get("new").await.unwrap(), new_value);
    // The old object is gone with its store: an error, never other bytes.
    assert!(c.get("old").await.is_err());
}

/// A put racing another client's unfinished put of the same key must fail
/// (REPLICA_IS_NOT_READY), not succeed: a client treats "already exists" as
/// success, so answering that would acknowledge a put whose bytes may never
/// become readable if the first writer fails. Found by the chaos checker;
/// fixed in 7109e4a (the state machine answered OBJECT_ALREADY_EXISTS for an
/// unfinished object, and this put returned Ok with nothing readable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_racing_an_unfinished_put_is_not_ready_not_acknowledged() {
    let cluster = cluster_with_stores(1, &[]).await;
    let first_writer = crescent_client::MasterClient::new(&cluster.masters_arg()).unwrap();
    first_writer
        .put_start("racy", 4096, wire_replicas(1))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;
    let second = c.put("racy", &patterned(4096, 9), &replicas(1)).await;
    assert_eq!(
        second.as_ref().map_err(|e| e.code()),
        Err(ErrorCode::ReplicaIsNotReady),
        "{second:?}"
    );
    // The first writer gives up: nothing was acknowledged, nothing is readable,
    // and the key is free for the next put.
    first_writer.put_revoke("racy").await.unwrap();
    assert!(!c.exists("racy").await.unwrap());
    c.put("racy", &patterned(4096, 9), &replicas(1))
        .await
        .unwrap();
    assert_eq!(c.get("racy").await.unwrap(), patterned(4096, 9));
}

/// Two puts of one key in flight at once from one `Client`: the master
/// takes the first PutStart it applies and answers the other
/// REPLICA_IS_NOT_READY, and the object holds the winner's bytes. Before
/// 9520544 both went to the master as one writer (it told writers apart by
/// client id only), and the 30-minute soak caught a PutEnd completing the
/// other put's object with its checksum; 9520544 kept one put per key in
/// flight in the client, and now every put carries a put id the master
/// checks (`raft` test
/// `a_put_end_or_revoke_finishes_only_the_put_it_names`), so the client
/// guard is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_of_one_key_from_one_client_never_mix() {
    let cluster = cluster_with_stores(1, &[]).await;
    let c = connect_client(&cluster).await;
    let big = patterned(32 << 20, 4);
    let small = patterned(4096, 5);
    let one = replicas(1);
    let (first, second) = tokio::join!(
        c.put("contended", &big, &one),
        c.put("contended", &small, &one)
    );
    let stored = c.get("contended").await.unwrap();
    match (&first, &second) {
        (Ok(()), Err(e)) => {
            assert_eq!(e.code(), ErrorCode::ReplicaIsNotReady, "{e}");
            assert!(stored == big, "the object lost the winning put's bytes");
        }
        (Err(e), Ok(())) => {
            assert_eq!(e.code(), ErrorCode::ReplicaIsNotReady, "{e}");
            assert!(stored == small, "the object lost the winning put's bytes");
        }
        // The small put finished before the big one started: "exists".
        (Ok(()), Ok(())) => assert!(stored == small),
        (Err(a), Err(b)) => panic!("both puts failed: {a}; {b}"),
    }
    // Once the first is done the key is free again (and exists: a success).
    c.put("contended", &small, &replicas(1)).await.unwrap();
    assert_eq!(c.get("contended").await.unwrap(), stored);
    // Different keys are not serialized against each other.
    let (a, b) = tokio::join!(c.put("free-a", &big, &one), c.put("free-b", &small, &one));
    a.unwrap();
    b.unwrap();
}

/// A batch put that repeats the sizes of the last one asks the leader for
/// the next batch's placements in its PutEnd; the next batch
/// writes into them and sends only its PutEnd. Bytes, keys that exist,
/// batches larger than what is ready and placements grown too old all
/// come out right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_one_size_write_into_placements_made_ahead() {
    let cluster = cluster_with_stores(1, &[]).await;
    let c = connect_client(&cluster).await;
    let used = |c: &Client| {
        c.stats
            .ahead
            .used
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let batch = |round: usize, n: usize| -> (Vec<String>, Vec<Vec<u8>>) {
        let keys = (0..n).map(|i| format!("ahead-{round}-{i}")).collect();
        let values = (0..n).map(|i| patterned(4096, round * 31 + i)).collect();
        (keys, values)
    };
    async fn put(c: &Client, keys: &[String], values: &[Vec<u8>]) {
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .map(|k| k.as_str())
            .zip(values.iter().map(|v| v.as_slice()))
            .collect();
        for r in c.put_batch(&items, &replicas(1)).await.unwrap() {
            r.unwrap();
        }
    }
    let mut written: Vec<(String, Vec<u8>)> = Vec::new();
    // The first batch asks for nothing (no sizes to repeat), the second
    // asks for eight, the third uses them.
    for round in 0..3 {
        let (keys, values) = batch(round, 8);
        put(&c, &keys, &values).await;
        written.extend(keys.into_iter().zip(values));
    }
    assert_eq!(
        used(&c),
        8,
        "the third batch wrote into placements made ahead"
    );
    // A larger batch: eight placements ready, eight more started; one key
    // exists already (success, its first value kept).
    let (mut keys, mut values) = batch(3, 16);
    keys[5] = "ahead-0-0".into();
    values[5] = patterned(4096, 99);
    put(&c, &keys, &values).await;
    assert_eq!(used(&c), 16);
    for (i, (k, v)) in keys.into_iter().zip(values).enumerate() {
        if i != 5 {
            written.push((k, v));
        }
    }
    // Placements older than two seconds are given back, not used.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let before = c
        .stats
        .ahead
        .given_back
        .load(std::sync::atomic::Ordering::Relaxed);
    let (keys, values) = batch(4, 4);
    put(&c, &keys, &values).await;
    written.extend(keys.into_iter().zip(values));
    assert_eq!(used(&c), 16, "a placement too old was used");
    assert!(
        c.stats
            .ahead
            .given_back
            .load(std::sync::atomic::Ordering::Relaxed)
            > before
    );
    for (k, v) in &written {
        assert_eq!(&c.get(k).await.unwrap(), v, "{k}");
    }
    assert_eq!(
        c.stats
            .ahead
            .retried
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // An idle client gives back what it holds once too old, with no put.
    let (keys, values) = batch(5, 4);
    put(&c, &keys, &values).await;
    let given_back = c
        .stats
        .ahead
        .given_back
        .load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(
        c.stats
            .ahead
            .given_back
            .load(std::sync::atomic::Ordering::Relaxed)
            >= given_back + 4,
        "an idle client kept its placements ahead"
    );
}

/// Placements ahead that no longer take their items (their grants and
/// commit deadline ran out: masters with a 1 s `--put-start-discard-timeout`)
/// send those items the usual way, in the same batch call; every item
/// ends with its own bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_placements_ahead_expired_puts_them_the_usual_way() {
    let mut cluster =
        LocalCluster::start(1, &["--put-start-discard-timeout".into(), "1s".into()]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    cluster.start_store("256mb", &[]).unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;
    let stat = |s: &std::sync::atomic::AtomicU64| s.load(std::sync::atomic::Ordering::Relaxed);
    let mut written: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..3 {
        let keys: Vec<String> = (0..6).map(|i| format!("expired-{round}-{i}")).collect();
        let values: Vec<Vec<u8>> = (0..6).map(|i| patterned(4096, round * 7 + i)).collect();
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .map(|k| k.as_str())
            .zip(values.iter().map(|v| v.as_slice()))
            .collect();
        if round == 2 {
            // Six placements ahead are ready; their grants expire after 1 s,
            // the client keeps them 2 s.
            tokio::time::sleep(Duration::from_millis(1_300)).await;
        }
        for r in c.put_batch(&items, &replicas(1)).await.unwrap() {
            r.unwrap();
        }
        written.extend(keys.into_iter().zip(values));
    }
    assert_eq!(
        stat(&c.stats.ahead.retried),
        6,
        "every expired placement retried"
    );
    assert_eq!(stat(&c.stats.ahead.used), 0);
    for (k, v) in &written {
        assert_eq!(&c.get(k).await.unwrap(), v, "{k}");
    }
}

/// A put's bytes that reach the store after its writer gave up and revoked
/// it (a stalled link, data retransmitted after a partition heals) must
/// not land in a range the masters gave to a later, acknowledged put.
/// Played on one real store: kA's write is sent in two halves on a raw
/// connection, kA is revoked between them, kB of the same size is put and
/// acknowledged, then kA's second half arrives under its still-valid grant.
/// Before the write fence, the revoke freed kA's range at once, kB was
/// placed there, and kA's late half overwrote it (CHECKSUM_MISMATCH).
///
/// With `clock_step`, the master runs on a [`FakeClock`] whose wall clock
/// steps an hour forward between the revoke and kB's put: a master that
/// read its fences on the wall clock freed kA's range at once. Then it
/// steps two hours back, and puts must still go through.
async fn late_bytes_of_a_revoked_put(put_mode: &str, clock_step: bool) {
    const LEN: usize = 1 << 20;
    let mut cluster =
        LocalCluster::start(1, &["--put-mode".to_string(), put_mode.to_string()]).unwrap();
    let clock_dir = tempfile::tempdir().unwrap();
    let clock = FakeClock::new(clock_dir.path()).unwrap();
    if clock_step {
        cluster.kill(1).unwrap();
        for (k, v) in clock.env() {
            cluster.set_master_env(1, &k, &v).unwrap();
        }
        cluster.restart(1).unwrap();
    }
    cluster.with_mounted_store("64mb").await.unwrap();
    let c = connect_client(&cluster).await;
    let master = c.master();
    let (late, acknowledged) = (patterned(LEN, 1), patterned(LEN, 2));

    let put_id = master.new_put_id();
    let placed = master
        .put_start_placed("kA", LEN as u64, wire_replicas(1), put_id)
        .await
        .unwrap();
    assert_eq!(placed.pending, put_mode == "one-commit", "{put_mode}");
    let r = placed.replicas[0].clone();
    let mut s = tokio::net::TcpStream::connect(&r.endpoint).await.unwrap();
    let header = crescent_store::protocol::Request {
        op: crescent_store::protocol::Op::Write,
        request_id: 1,
        offset: r.offset,
        len: r.length,
        grant: Grant::from(&r),
    };
    s.write_all(&header.encode()).await.unwrap();
    s.write_all(&late[..LEN / 2]).await.unwrap();

    master.put_revoke_named("kA", put_id).await.unwrap();
    if clock_step {
        clock.set_offset_secs(3_600).unwrap();
        // The master sees the step, then its once-a-second upkeep and
        // reclaim run on it.
        tokio::time::sleep(FakeClock::SEEN_WITHIN + Duration::from_secs(2)).await;
    }
    c.put("kB", &acknowledged, &replicas(1)).await.unwrap();

    // kA's second half arrives; its grant has not expired, so the store
    // writes it, into a range nobody else holds.
    s.write_all(&late[LEN / 2..]).await.unwrap();
    let mut answer = [0u8; crescent_store::protocol::RESPONSE_LEN];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut answer))
        .await
        .expect("the store answers the late write")
        .unwrap();
    assert_eq!(
        crescent_store::protocol::Response::decode(&answer)
            .unwrap()
            .status,
        Status::Ok
    );
    let read = c.get("kB").await.map_err(|e| e.code());
    assert!(
        read.as_ref().is_ok_and(|v| *v == acknowledged),
        "{put_mode}: an acknowledged put was overwritten by a revoked put's late bytes: {:?}",
        read.map(|v| v.len())
    );
    let b = master.get_replica_list("kB").await.unwrap().replicas[0].clone();
    assert_ne!(
        (b.segment_id, b.offset),
        (r.segment_id, r.offset),
        "{put_mode}: a revoked put's range was placed again while its grant was valid"
    );
    assert!(
        !c.exists("kA").await.unwrap(),
        "a revoked put is not readable"
    );
    if clock_step {
        clock.set_offset_secs(-3_600).unwrap();
        tokio::time::sleep(FakeClock::SEEN_WITHIN).await;
        for i in 0..20 {
            let (key, value) = (format!("after-step-{i}"), patterned(4096, i));
            tokio::time::timeout(Duration::from_secs(5), c.put(&key, &value, &replicas(1)))
                .await
                .unwrap_or_else(|_| panic!("{put_mode}: put {key} stalled after a step back"))
                .unwrap_or_else(|e| panic!("{put_mode}: put {key} after a step back: {e}"));
            assert_eq!(c.get(&key).await.unwrap(), value, "{put_mode}: {key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_bytes_of_a_revoked_one_commit_put_do_not_overwrite_a_later_put() {
    late_bytes_of_a_revoked_put("one-commit", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_bytes_of_a_revoked_two_commit_put_do_not_overwrite_a_later_put() {
    late_bytes_of_a_revoked_put("two-commit", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_clock_step_frees_no_fenced_range_and_stalls_no_one_commit_put() {
    late_bytes_of_a_revoked_put("one-commit", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_clock_step_frees_no_fenced_range_and_stalls_no_two_commit_put() {
    late_bytes_of_a_revoked_put("two-commit", true).await;
}

/// Three stores, one killed: its segment stays listed until its owner's
/// TTL runs out (the master cannot tell a dead store from a slow one), and
/// placements on it fail their writes. Single puts and batches go again
/// on the live segments instead of failing with TRANSFER_FAIL.
async fn puts_placed_on_a_dead_store_go_to_live_ones(put_mode: &str) {
    let mut cluster =
        LocalCluster::start(1, &["--put-mode".to_string(), put_mode.to_string()]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    for _ in 0..3 {
        cluster.start_store("64mb", &[]).unwrap();
    }
    cluster
        .wait_for_segments(3, Duration::from_secs(15))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;
    c.put("before", b"ok", &replicas(1)).await.unwrap();

    // The leader honours the segments a retry asks it to avoid.
    let master = c.master();
    let mut names: Vec<String> = Vec::new();
    for i in 0..60 {
        if names.len() == 3 {
            break;
        }
        let key = format!("probe-{i}");
        c.put(&key, b"probe", &replicas(1)).await.unwrap();
        let name = master.get_replica_list(&key).await.unwrap().replicas[0]
            .segment_name
            .clone();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    assert_eq!(names.len(), 3, "{put_mode}: 60 puts used only {names:?}");
    for i in 0..10 {
        let (key, put_id) = (format!("avoiding-{i}"), master.new_put_id());
        let placed = master
            .put_start_placed(
                &key,
                4096,
                crescent_proto::pb::ReplicateConfig {
                    replica_num: 1,
                    avoid_segments: names[..2].to_vec(),
                    ..Default::default()
                },
                put_id,
            )
            .await
            .unwrap();
        assert_eq!(placed.replicas[0].segment_name, names[2], "{put_mode}");
        master.put_revoke_named(&key, put_id).await.unwrap();
    }

    cluster.stores[0].kill();
    let mut put = Vec::new();
    for i in 0..24u8 {
        let (key, value) = (format!("single-{i}"), patterned(10_000, i.into()));
        let n = 1 + u32::from(i % 2);
        c.put(&key, &value, &replicas(n))
            .await
            .unwrap_or_else(|e| panic!("{put_mode}: put {key} with {n} replicas: {e}"));
        put.push((key, value));
    }
    for round in 0..3u8 {
        let batch: Vec<(String, Vec<u8>)> = (0..16u8)
            .map(|i| {
                (
                    format!("batch-{round}-{i}"),
                    patterned(4096, (i ^ round).into()),
                )
            })
            .collect();
        let items: Vec<(&str, &[u8])> = batch
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        for (r, (k, _)) in c
            .put_batch(&items, &replicas(1))
            .await
            .unwrap()
            .iter()
            .zip(&batch)
        {
            assert!(r.is_ok(), "{put_mode}: batch item {k}: {r:?}");
        }
        put.extend(batch);
    }
    let retried = c.stats.puts_retried_elsewhere.load(Ordering::Relaxed);
    assert!(
        retried > 0,
        "{put_mode}: no put was placed on the dead store; the test proves nothing"
    );
    for (key, value) in &put {
        assert_eq!(&c.get(key).await.unwrap(), value, "{put_mode}: {key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_commit_puts_placed_on_a_dead_store_go_to_live_ones() {
    puts_placed_on_a_dead_store_go_to_live_ones("one-commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commit_puts_placed_on_a_dead_store_go_to_live_ones() {
    puts_placed_on_a_dead_store_go_to_live_ones("two-commit").await;
}

/// A store started while its wall clock was an hour behind the masters'
/// would honour every grant for an hour past its expiry, long after the
/// masters placed the range again. It learns the leader's clock from its
/// heartbeats and refuses every grant, loudly, instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_clock_is_an_hour_behind_refuses_grants_loudly() {
    let mut cluster = LocalCluster::start(1, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let clock_dir = tempfile::tempdir().unwrap();
    let clock = FakeClock::new(clock_dir.path()).unwrap();
    clock.set_offset_secs(-3_600).unwrap();
    let i = cluster.start_store_env("64mb", &[], &clock.env()).unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .unwrap();
    let http = cluster.stores[i].http.clone();
    assert!(
        metric_reaches(&http, "store_clock_off", 1.0, Duration::from_secs(15)).await,
        "the store never noticed its clock is an hour behind"
    );
    let c = connect_client(&cluster).await;
    let put = c.put("k", b"value", &replicas(1)).await;
    assert!(put.is_err(), "a write under a grant was honoured: {put:?}");
    assert!(metric(&http, "store_transfer_forbidden_total").await >= Some(1.0));
    let log = std::fs::read_to_string(&cluster.stores[i].log_path).unwrap();
    assert!(
        log.contains("too far from the leader's"),
        "the store's log does not say why it refuses"
    );
}
