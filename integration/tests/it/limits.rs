//! Limits against hostile or oversized input on real master processes:
//! absurd segment capacities, segment quotas, and allocation
//! requests no eviction could satisfy. Each refusal changes nothing.
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::Duration;

use crescent_client::MasterClient;
use crescent_integration::LocalCluster;
use crescent_proto::pb;
use crescent_proto::ErrorCode;

use crate::common::{connect_client, leader_metric, master_metric, one_replica, wire_replicas};

fn spec(name: &str, capacity: u64) -> pb::SegmentSpec {
    pb::SegmentSpec {
        name: name.into(),
        endpoint: "127.0.0.1:1".into(),
        capacity,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_capacities_and_segment_quotas_are_refused() {
    let cluster = LocalCluster::start(
        3,
        &[
            "--max-segments".into(),
            "3".into(),
            "--max-segments-per-client".into(),
            "2".into(),
        ],
    )
    .unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let a = MasterClient::new(&cluster.masters_arg()).unwrap();
    a.mount_segment(
        spec("a1", 1 << 30),
        &crescent_auth::capability::SegmentKey::generate(),
    )
    .await
    .unwrap();

    // A capacity near 2^64 once wrapped the total capacity to 1 KiB.
    let e = a
        .mount_segment(
            spec("wrap", u64::MAX - (1 << 28) + 1024),
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");
    assert!(e.to_string().contains("maximum"), "{e}");
    assert_eq!(
        leader_metric(&cluster, "master_total_capacity_bytes").await,
        (1u64 << 30) as f64
    );

    // Per client: two, then refused; a re-mount of an owned name (with its
    // key) still works.
    let a2_key = crescent_auth::capability::SegmentKey::generate();
    a.mount_segment(spec("a2", 1 << 30), &a2_key).await.unwrap();
    let e = a
        .mount_segment(
            spec("a3", 1 << 30),
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");
    assert!(e.to_string().contains("--max-segments-per-client"), "{e}");
    a.mount_segment(spec("a2", 1 << 30), &a2_key).await.unwrap();

    // In all: three, then refused for anyone.
    let b = MasterClient::new(&cluster.masters_arg()).unwrap();
    b.mount_segment(
        spec("b1", 1 << 30),
        &crescent_auth::capability::SegmentKey::generate(),
    )
    .await
    .unwrap();
    let c = MasterClient::new(&cluster.masters_arg()).unwrap();
    let e = c
        .mount_segment(
            spec("c1", 1 << 30),
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");
    assert!(e.to_string().contains("--max-segments "), "{e}");
    assert_eq!(
        leader_metric(&cluster, "master_total_capacity_bytes").await,
        (3u64 << 30) as f64
    );
    assert_eq!(
        leader_metric(
            &cluster,
            "master_quota_rejections_total{quota=\"segments\"}"
        )
        .await,
        2.0
    );
}

/// Without quotas nothing bounds what one client id can make the leader hold
/// (82 k unfinished puts with 1 KiB keys took it to 850 MB). Per-client
/// quotas on unfinished puts, objects and key bytes refuse a PutStart beyond
/// them with NO_AVAILABLE_HANDLE, count it in `/metrics`, leave other
/// clients alone, and free up again as the client finishes or removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_quotas_refuse_and_free_up() {
    let mut args = no_expiry();
    for (flag, v) in [
        ("--max-unfinished-puts-per-client", "100"),
        ("--max-objects-per-client", "150"),
        ("--max-key-bytes-per-client", "64kb"),
    ] {
        args.extend([flag.to_string(), v.to_string()]);
    }
    let cluster = LocalCluster::start(3, &args).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let a = MasterClient::new(&cluster.masters_arg()).unwrap();
    a.mount_segment(
        spec("seg", 1 << 30),
        &crescent_auth::capability::SegmentKey::generate(),
    )
    .await
    .unwrap();
    let quota = |which: &str| format!("master_quota_rejections_total{{quota=\"{which}\"}}");

    // Unfinished puts: 100 pass, the 101st is refused and changes nothing.
    let first = keys("a", 100, 16);
    for r in a
        .batch_put_start(put_start_items(&first), wire_replicas(1))
        .await
        .unwrap()
    {
        assert!(r.status.unwrap_or_default().is_ok());
    }
    let e = a
        .put_start("a-extra", 1, wire_replicas(1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
    assert!(
        e.to_string().contains("--max-unfinished-puts-per-client"),
        "{e}"
    );
    assert!(a.get_replica_list("a-extra").await.is_err());
    assert_eq!(
        leader_metric(&cluster, &quota("unfinished_puts")).await,
        1.0
    );

    // Another client is not affected.
    let b = MasterClient::new(&cluster.masters_arg()).unwrap();
    b.put_start("b-0", 1, wire_replicas(1)).await.unwrap();
    b.put_end("b-0", 7).await.unwrap();

    // Finishing frees the unfinished quota; objects stop at 150.
    for st in a.batch_put_end(put_end_items(&first)).await.unwrap() {
        assert!(st.is_ok(), "{st:?}");
    }
    let more = keys("more", 50, 16);
    a.batch_put_start(put_start_items(&more), wire_replicas(1))
        .await
        .unwrap();
    a.batch_put_end(put_end_items(&more)).await.unwrap();
    let e = a.put_start("a-151", 1, wire_replicas(1)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
    assert!(e.to_string().contains("--max-objects-per-client"), "{e}");
    assert_eq!(leader_metric(&cluster, &quota("objects")).await, 1.0);
    // Removing frees it.
    a.remove(&first[0], true).await.unwrap();
    a.put_start("a-151", 1, wire_replicas(1)).await.unwrap();
    a.put_end("a-151", 7).await.unwrap();
    // At the limit, a put of a key that exists adds nothing: it gets
    // "already exists" (success to a client), not the quota.
    let e = a
        .put_start(&more[0], 1, wire_replicas(1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ObjectAlreadyExists, "{e}");

    // Key bytes: 65 keys of 1,000 bytes fit in 64 KiB, a 66th does not.
    let c = MasterClient::new(&cluster.masters_arg()).unwrap();
    let long = keys("c", 66, 1000);
    c.batch_put_start(put_start_items(&long[..65]), wire_replicas(1))
        .await
        .unwrap();
    let e = c
        .put_start(&long[65], 1, wire_replicas(1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
    assert!(e.to_string().contains("--max-key-bytes-per-client"), "{e}");
    assert_eq!(leader_metric(&cluster, &quota("key_bytes")).await, 1.0);
    assert_eq!(leader_metric(&cluster, &quota("objects")).await, 1.0);
    assert_eq!(
        leader_metric(&cluster, &quota("unfinished_puts")).await,
        1.0
    );
}

/// If every failed allocation ran an eviction round, PutStarts of sizes no
/// segment could ever hold would evict most objects of a nearly empty pool
/// (measured once: most of them). They fail with NO_AVAILABLE_HANDLE without asking for eviction
/// (`master_alloc_failures_total` counts only failures eviction could cure),
/// and every object stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_sizes_evict_nothing() {
    let cluster = LocalCluster::start(3, &[]).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let client = MasterClient::new(&cluster.masters_arg()).unwrap();
    client
        .mount_segment(
            spec("seg", 64 << 20),
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap();
    let one = wire_replicas(1);
    for i in 0..10u32 {
        let key = format!("kept-{i}");
        client.put_start(&key, 4096, one.clone()).await.unwrap();
        client.put_end(&key, i).await.unwrap();
    }
    for size in [1u64 << 63, u64::MAX, (64 << 20) + 1, 300 << 20] {
        for _ in 0..10 {
            let e = client
                .put_start("impossible", size, one.clone())
                .await
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
        }
    }
    assert_eq!(
        leader_metric(&cluster, "master_alloc_failures_total").await,
        0.0
    );
    assert_eq!(
        leader_metric(&cluster, "master_evicted_key_count").await,
        0.0
    );
    for i in 0..10u32 {
        assert_eq!(
            client
                .get_replica_list(&format!("kept-{i}"))
                .await
                .unwrap()
                .checksum,
            i
        );
    }
}

/// Heartbeats from made-up client ids, if all recorded in leader memory and
/// never pruned, grow it without bound (100 k ids: +22 MB,
/// `master_active_clients` 50,617). Only clients that own a segment are
/// recorded: a flood of
/// strangers leaves the count at the one real store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_from_strangers_are_not_recorded() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    let (_, leader_addr, _) = cluster.with_mounted_store("64mb").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while leader_metric(&cluster, "master_active_clients").await != 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the store never counted as an active client"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mc = MasterClient::new(&leader_addr).unwrap();
    let mut raw = MasterClient::master(mc.channel(&leader_addr).unwrap());
    for i in 0..2_000u32 {
        let r = raw
            .heartbeat(pb::HeartbeatRequest {
                client_id: format!("stranger-{i}"),
                segment_ids: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status.unwrap().code, ErrorCode::Ok as i32);
    }
    // A stranger claiming a segment it does not own is told to re-mount,
    // and is not recorded either.
    let r = raw
        .heartbeat(pb::HeartbeatRequest {
            client_id: "stranger-claims".into(),
            segment_ids: vec![1],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.result, pb::HeartbeatResult::NeedRemount as i32);
    assert_eq!(leader_metric(&cluster, "master_active_clients").await, 1.0);
}

/// `n` keys of exactly `len` bytes, distinct per `tag`.
fn keys(tag: &str, n: usize, len: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let k = format!("{tag}-{i:08}-");
            format!("{k}{}", "x".repeat(len - k.len()))
        })
        .collect()
}

fn put_start_items(keys: &[String]) -> Vec<pb::PutStartItem> {
    keys.iter()
        .map(|k| pb::PutStartItem {
            put_id: 0,
            key: k.clone(),
            size: 1,
        })
        .collect()
}

fn put_end_items(keys: &[String]) -> Vec<pb::PutEndItem> {
    keys.iter()
        .map(|k| pb::PutEndItem {
            put_id: 0,
            key: k.clone(),
            checksum: 7,
            ..Default::default()
        })
        .collect()
}

/// The fake segments below get no heartbeats: keep them mounted however
/// slowly the test runs.
fn no_expiry() -> Vec<String> {
    vec!["--client-ttl".into(), "10m".into()]
}

/// Unbounded, one BatchPutStart of ~16 MB becomes one log entry that a
/// follower cannot receive within openraft's 50 ms AppendEntries wait, and
/// a 61 MB one costs the leader its term. The largest batch a master accepts
/// (16,384 keys, 1 MiB of keys) commits on three masters and every master
/// applies it; a batch one byte of keys larger is refused with a clear
/// error and changes nothing; the client library sends that same batch in
/// two requests, which both commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_batch_commits_and_a_larger_one_is_refused() {
    let cluster = LocalCluster::start(3, &no_expiry()).unwrap();
    let (_, leader_addr, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let client = MasterClient::new(&cluster.masters_arg()).unwrap();
    client
        .mount_segment(
            spec("big", 1 << 40),
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap();
    let mut raw = MasterClient::master(client.channel(&leader_addr).unwrap());
    let header = || Some(client.header());

    let n = crescent_proto::MAX_BATCH_ITEMS;
    let largest = keys("max", n, crescent_proto::MAX_BATCH_KEY_BYTES / n);
    assert_eq!(
        largest.iter().map(String::len).sum::<usize>(),
        crescent_proto::MAX_BATCH_KEY_BYTES
    );
    let started = raw
        .batch_put_start(pb::BatchPutStartRequest {
            header: header(),
            items: put_start_items(&largest),
            config: Some(wire_replicas(1)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.status.unwrap().code, ErrorCode::Ok as i32);
    assert!(started
        .results
        .iter()
        .all(|r| r.status.as_ref().unwrap().code == ErrorCode::Ok as i32));
    let ended = raw
        .batch_put_end(pb::BatchPutEndRequest {
            header: header(),
            items: put_end_items(&largest),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ended.status.unwrap().code, ErrorCode::Ok as i32);
    assert!(ended.results.iter().all(|s| s.code == ErrorCode::Ok as i32));

    // Every master applies both entries.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for m in &cluster.masters {
        while master_metric(&cluster, m.id, "master_key_count").await != Some(n as f64) {
            assert!(
                std::time::Instant::now() < deadline,
                "master {} never applied the largest batch:\n{}",
                m.id,
                cluster.log_tail(m.id, 20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // One byte of keys more: refused before anything is proposed.
    let mut larger = keys("over", n, crescent_proto::MAX_BATCH_KEY_BYTES / n);
    larger[0].push('y');
    let refused = raw
        .batch_put_start(pb::BatchPutStartRequest {
            header: header(),
            items: put_start_items(&larger),
            config: Some(wire_replicas(1)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let status = refused.status.unwrap();
    assert_eq!(status.code, ErrorCode::InvalidParams as i32, "{status:?}");
    assert!(status.message.contains("split the batch"), "{status:?}");
    assert!(refused.results.is_empty());
    assert_eq!(
        leader_metric(&cluster, "master_key_count").await,
        n as f64,
        "a refused batch changed the state"
    );

    // The library cuts the same batch into requests the master accepts.
    let results = client
        .batch_put_start(put_start_items(&larger), wire_replicas(1))
        .await
        .unwrap();
    assert_eq!(results.len(), n);
    let ended = client.batch_put_end(put_end_items(&larger)).await.unwrap();
    assert!(ended.iter().all(|s| s.code == ErrorCode::Ok as i32));
    assert_eq!(
        leader_metric(&cluster, "master_key_count").await,
        (2 * n) as f64
    );
}

/// Openraft sends up to 256 entries per AppendEntries and waits
/// only a heartbeat interval (50 ms) for the answer, then retries the same
/// range, so a follower that fell behind by tens of MB of large entries
/// never caught up. Here a follower is down while ~30 MB of maximal batches
/// commit; restarted, it catches up (messages are cut to 8 MiB and may take
/// longer than 50 ms), and then carries the quorum on its own with the
/// other follower stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_by_large_entries_catches_up() {
    let mut cluster = LocalCluster::start(3, &no_expiry()).unwrap();
    let (leader, _, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let client = MasterClient::new(&cluster.masters_arg()).unwrap();
    client
        .mount_segment(
            spec("big", 1 << 40),
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap();
    let followers: Vec<u64> = cluster
        .masters
        .iter()
        .map(|m| m.id)
        .filter(|id| *id != leader)
        .collect();
    let (behind, other) = (followers[0], followers[1]);
    cluster.kill(behind).unwrap();

    let n = crescent_proto::MAX_BATCH_ITEMS;
    let rounds = 12;
    for round in 0..rounds {
        let batch = keys(
            &format!("r{round}"),
            n,
            crescent_proto::MAX_BATCH_KEY_BYTES / n,
        );
        let started = client
            .batch_put_start(put_start_items(&batch), wire_replicas(1))
            .await
            .unwrap();
        assert_eq!(started.len(), n);
        client.batch_put_end(put_end_items(&batch)).await.unwrap();
    }
    let expected = (rounds * n) as f64;
    assert_eq!(leader_metric(&cluster, "master_key_count").await, expected);

    cluster.restart(behind).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while master_metric(&cluster, behind, "master_key_count").await != Some(expected) {
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted follower never caught up:\n{}",
            cluster.log_tail(behind, 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The caught-up follower now makes the quorum with the leader alone.
    cluster.pause(other).unwrap();
    let key = "after-catch-up".to_string();
    let written = async {
        client
            .batch_put_start(
                put_start_items(std::slice::from_ref(&key)),
                wire_replicas(1),
            )
            .await?;
        client.batch_put_end(put_end_items(&[key])).await
    };
    let outcome = tokio::time::timeout(Duration::from_secs(20), written).await;
    cluster.resume(other).unwrap();
    assert!(
        matches!(outcome, Ok(Ok(ref v)) if v[0].code == ErrorCode::Ok as i32),
        "{outcome:?}"
    );
}

/// A batch over 1 MiB of keys goes to the master in parts. When a later part
/// is refused (here by the unfinished-put quota), the client revokes what the
/// earlier parts started: otherwise those puts stayed unfinished, holding
/// their keys and the client's quota until the master reclaimed them
/// (`--put-start-release-timeout`, 10 minutes), and the next batch was refused
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_part_way_leaves_no_unfinished_puts() {
    let mut args = no_expiry();
    args.extend(["--max-unfinished-puts-per-client".into(), "1500".into()]);
    let mut cluster = LocalCluster::start(3, &args).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let client = connect_client(&cluster).await;
    let cfg = one_replica();
    // 2,000 keys of 1,000 bytes: two parts of about 1,000 keys each; the
    // second would take the client past 1,500 unfinished puts.
    let big = keys("split", 2000, 1000);
    let items: Vec<(&str, &[u8])> = big.iter().map(|k| (k.as_str(), b"v".as_slice())).collect();
    let e = client.put_batch(&items, &cfg).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
    let master = MasterClient::new(&cluster.masters_arg()).unwrap();
    for k in [&big[0], &big[999], &big[1999]] {
        let e = master.get_replica_list(k).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::ObjectNotFound, "{k}: {e}");
    }
    // Nothing is left holding the quota: a batch of 1,000 goes through.
    for r in client.put_batch(&items[..1000], &cfg).await.unwrap() {
        r.unwrap();
    }
    assert_eq!(client.get(&big[0]).await.unwrap(), b"v");
}
