//! Resource-exhaustion attacks, replayed one after another against one real
//! cluster (three masters, one store, loopback) by a client with no credentials:
//! oversized and maximal batches, allocation sizes no segment can hold, a
//! wrapping segment capacity, a stranger's heartbeat flood, a request
//! number far ahead, and connection floods on the gRPC, admin HTTP and
//! store data ports. Afterwards the cluster serves a normal put and get,
//! every object acknowledged before the attacks is still there with its
//! bytes, nothing was evicted, and the leader's resident memory stays under
//! [`LEADER_RSS_BOUND`].
//!
//! Replayed elsewhere: terms at u64::MAX or far ahead
//! (`master/tests/it/in_process_cluster.rs`, `raft/src/tests.rs`), trickling
//! and truncated frames on the data port (`store/src/server.rs`), the CLI's
//! false "stored" (`cli.rs`). Not replayed, because not fixed yet: puts
//! started and never finished (no per-client quota; leader memory grows
//! with them until `--put-start-release-timeout`), and the attacks that need
//! authentication.
//!
//! Needs `cargo build --bins` first (`make test` does it).

use std::time::Duration;

use crescent_client::MasterClient;
use crescent_integration::LocalCluster;
use crescent_proto::pb;
use crescent_proto::ErrorCode;

use crate::common::{connect_client, metric_at, one_replica, value, wire_replicas};

/// The leader's resident memory after every attack (a debug build idles at
/// about 40 MB here).
const LEADER_RSS_BOUND: u64 = 300 << 20;

/// The store's resident memory during and after the connection flood: its
/// 256 MiB segment, allocated at start (`--prefault`, the default), and at
/// most 256 MiB more for the connections (about 87 MB here). 20 000 idle
/// connections once took 2.5 GB that was never given back.
const STORE_RSS_BOUND: u64 = 512 << 20;

fn leader_rss(cluster: &mut LocalCluster, leader: u64) -> u64 {
    rss(cluster.by_id(leader).and_then(|m| m.pid()).unwrap())
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap()
}

/// Opens up to `n` connections to `addr`, 100 at a time (every other one
/// writes a few bytes of a frame and stops), and returns those that opened.
/// Gives up after 50 failed connects (a full listen backlog under load).
async fn flood(addr: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::new();
    let mut failures = 0;
    let mut tried = 0;
    while tried < n && failures < 50 {
        let wave = (n - tried).min(100);
        tried += wave;
        let connects = (0..wave).map(|_| {
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        });
        for (i, c) in futures::future::join_all(connects)
            .await
            .into_iter()
            .enumerate()
        {
            match c {
                Ok(Ok(mut c)) => {
                    if i % 2 == 1 {
                        let _ = c.write_all(&[0, 0, 0x10, 0x01]).await;
                    }
                    held.push(c);
                }
                _ => failures += 1,
            }
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_survives_every_attack_and_loses_nothing() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    let (leader, leader_addr, _) = cluster.with_mounted_store("256mb").await.unwrap();
    let leader_http = cluster.by_id(leader).unwrap().http.clone();
    let client = connect_client(&cluster).await;
    let one = one_replica();
    for i in 0..50 {
        client
            .put(&format!("acked-{i}"), &value(i), &one)
            .await
            .unwrap();
    }
    let rss_before = leader_rss(&mut cluster, leader);

    let mc = MasterClient::new(&cluster.masters_arg()).unwrap();
    let mut raw = MasterClient::master(mc.channel(&leader_addr).unwrap());
    let wire_one = wire_replicas(1);

    // 1. A 61 MB BatchPutStart (it cost the leader its term) and 16 MB ones
    // (they stalled replication for good): refused, nothing proposed.
    for (n, len) in [(15_000usize, 4_000usize), (16_000, 1_000)] {
        let items = (0..n)
            .map(|i| pb::PutStartItem {
                put_id: 0,
                key: format!("{i:0>len$}"),
                size: 1,
            })
            .collect();
        let r = raw
            .batch_put_start(pb::BatchPutStartRequest {
                header: Some(mc.header()),
                items,
                config: Some(wire_one.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status.unwrap().code,
            ErrorCode::InvalidParams as i32,
            "{n} keys of {len} bytes"
        );
    }
    // ... and the largest accepted batches, five times, committed and removed.
    let n = crescent_proto::MAX_BATCH_ITEMS;
    for round in 0..5 {
        let keys: Vec<String> = (0..n).map(|i| format!("big-{round}-{i:0>54}")).collect();
        let items = keys
            .iter()
            .map(|k| pb::PutStartItem {
                put_id: 0,
                key: k.clone(),
                size: 1,
            })
            .collect();
        mc.batch_put_start(items, wire_one.clone()).await.unwrap();
        let ends = keys
            .iter()
            .map(|k| pb::PutEndItem {
                put_id: 0,
                key: k.clone(),
                checksum: 0,
                ..Default::default()
            })
            .collect();
        mc.batch_put_end(ends).await.unwrap();
        mc.batch_remove(keys, true).await.unwrap();
    }

    // 2. Sizes no segment holds: refused without an eviction round.
    for size in [1u64 << 63, 300 << 20] {
        for _ in 0..30 {
            let e = mc
                .put_start("too-big", size, wire_one.clone())
                .await
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::NoAvailableHandle, "{e}");
        }
    }

    // 3. A capacity that wrapped the cluster total to 1 KiB.
    let e = mc
        .mount_segment(
            pb::SegmentSpec {
                name: "wrap".into(),
                endpoint: "127.0.0.1:1".into(),
                capacity: u64::MAX - (1 << 28) + 1024,
                ..Default::default()
            },
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidParams, "{e}");

    // 4. Heartbeats from 20,000 made-up clients: none recorded.
    for i in 0..20_000u32 {
        raw.heartbeat(pb::HeartbeatRequest {
            client_id: format!("stranger-{i}"),
            segment_ids: Vec::new(),
        })
        .await
        .unwrap();
    }
    // The store is the only client that owns a segment (0 for a moment if
    // leadership moved and its next heartbeat has not come yet).
    let active = metric_at(&leader_http, "master_active_clients").await;
    assert!(active <= 1.0, "{active} active clients");

    // 5. A request number 2^40 ahead of the real client's: refused, so the
    // real client's dedup window does not move.
    let mut header = client.master().header();
    header.request_seq += 1 << 40;
    let r = raw
        .put_start(pb::PutStartRequest {
            put_id: 0,
            header: Some(header),
            key: "ahead".into(),
            size: 64,
            config: Some(wire_one.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.status.unwrap().code, ErrorCode::Ok as i32);

    // 6. Connection floods above every cap, held for a moment, then dropped.
    let store = mc
        .put_start("probe-endpoint", 64, wire_one.clone())
        .await
        .unwrap()[0]
        .endpoint
        .clone();
    mc.put_revoke("probe-endpoint").await.unwrap();
    let mut held = Vec::new();
    // Above each cap: the store's 4,096, the master's --max-connections
    // default of 4,096, the admin HTTP's 256.
    for (addr, n, cap) in [
        (&store, 4_500, 4_096),
        (&leader_addr, 4_500, 4_096),
        (&leader_http, 600, 256),
    ] {
        let opened = flood(addr, n).await;
        eprintln!(
            "attacks: {} of {n} connections to {addr} opened",
            opened.len()
        );
        assert!(
            opened.len() > cap,
            "the flood on {addr} stayed under its cap"
        );
        held.extend(opened);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let store_pid = cluster.stores[0].pid().unwrap();
    let store_rss_flooded = rss(store_pid);
    drop(held);

    // Afterwards: a normal put and get, within 20 s of the flood's end.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ok = async {
            client.put("after", &value(99), &one).await?;
            client.get("after").await
        }
        .await;
        match ok {
            Ok(v) if v == value(99) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "no put/get after the attacks: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for i in 0..50 {
        assert_eq!(
            client.get(&format!("acked-{i}")).await.unwrap(),
            value(i),
            "acked-{i}"
        );
    }
    let http = cluster.by_id(leader).unwrap().http.clone();
    assert_eq!(metric_at(&http, "master_evicted_key_count").await, 0.0);
    let rss_after = leader_rss(&mut cluster, leader);
    // The flood leaves the store's memory bounded: it holds at most 4,096
    // connections, each with small buffers (87 MB beside the segment here;
    // the allocator need not hand pages back at once, so no drop is asserted).
    let store_rss_after = rss(store_pid);
    eprintln!(
        "attacks: store RSS {} MB during the flood, {} MB after (bound {} MB)",
        store_rss_flooded >> 20,
        store_rss_after >> 20,
        STORE_RSS_BOUND >> 20
    );
    assert!(
        store_rss_flooded < STORE_RSS_BOUND && store_rss_after < STORE_RSS_BOUND,
        "store RSS {store_rss_flooded} / {store_rss_after} bytes"
    );
    eprintln!(
        "attacks: leader RSS {} MB before, {} MB after (bound {} MB)",
        rss_before >> 20,
        rss_after >> 20,
        LEADER_RSS_BOUND >> 20
    );
    assert!(rss_after < LEADER_RSS_BOUND, "leader RSS {rss_after} bytes");
}
