//! High availability with a real etcd and real processes: join through etcd,
//! leader SIGKILL, restart and catch-up, store re-registration, and a client
//! that degrades to local-only caching and recovers.
//! Needs `cargo build --bins` and Debian's etcd-server (`make test` does both).

use std::time::{Duration, Instant};

use crescent_client::local::LocalEtcd;
use crescent_client::{Client, ClientConfig, MasterClient, ReplicateConfig};
use crescent_integration::{crescentctl, http_request, LocalCluster};
use crescent_proto::pb;

fn one() -> ReplicateConfig {
    ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    }
}

async fn voters(client: &MasterClient) -> usize {
    let Ok(l) = client.get_leader().await else {
        return 0;
    };
    client
        .call_node(&l.leader_addr, |ch| async move {
            MasterClient::cluster(ch)
                .list_members(pb::ListMembersRequest {})
                .await
        })
        .await
        .map(|r| r.members.iter().filter(|m| m.voter).count())
        .unwrap_or(0)
}

async fn key_count(client: &MasterClient, addr: &str) -> Option<u64> {
    client.node_status(addr).await.ok().map(|s| s.key_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_join_through_etcd_and_survive_leader_kill() {
    let etcd = LocalEtcd::start().unwrap();
    let mut cluster = LocalCluster::start_with_etcd(3, &etcd.endpoint, "ha1", &[]).unwrap();
    let url = etcd.url("ha1");
    let mc = MasterClient::connect(&url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while voters(&mc).await < 3 {
        assert!(Instant::now() < deadline, "three voters never formed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, out, err) = crescentctl(&["--master", &url, "leader", "--json"]).unwrap();
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let leader = v["leader_id"].as_u64().unwrap();

    cluster.start_store("64mb", &[]).unwrap();
    cluster
        .wait_for_segments(1, Duration::from_secs(15))
        .await
        .unwrap();
    let client = Client::connect(ClientConfig {
        master: url.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut acked = Vec::new();
    for i in 0..50u32 {
        let key = format!("ha-{i}");
        client
            .put(&key, format!("value-{i}").as_bytes(), &one())
            .await
            .unwrap();
        acked.push(key);
    }

    cluster.kill(leader).unwrap();
    let (new_leader, _, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    assert_ne!(new_leader, leader);
    for (i, key) in acked.iter().enumerate() {
        assert_eq!(
            client.get(key).await.unwrap(),
            format!("value-{i}").into_bytes(),
            "{key}"
        );
    }
    // The etcd leader key follows, and the CLI finds the new leader through it.
    let (ok, out, _) = crescentctl(&["--master", &url, "leader", "--json"]).unwrap();
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["leader_id"].as_u64().unwrap(), new_leader);

    // The killed master restarts from its data dir and catches up.
    client.put("after-kill", b"x", &one()).await.unwrap();
    cluster.restart(leader).unwrap();
    let addr = cluster.by_id(leader).unwrap().addr.clone();
    let deadline = Instant::now() + Duration::from_secs(15);
    while key_count(&mc, &addr).await != Some(51) {
        assert!(
            Instant::now() < deadline,
            "restarted master did not catch up:\n{}",
            cluster.log_tail(leader, 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_reregisters_with_a_new_leader() {
    // A short client TTL: a store whose heartbeats did not reach the new leader
    // would lose its segment two seconds after the failover.
    let mut cluster = LocalCluster::start(3, &["--client-ttl".into(), "2s".into()]).unwrap();
    let (leader, _, _) = cluster.with_mounted_store("64mb").await.unwrap();
    let client = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        ..Default::default()
    })
    .await
    .unwrap();
    client.put("before", b"kept", &one()).await.unwrap();
    cluster.kill(leader).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster
        .wait_for_segments(1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(client.get("before").await.unwrap(), b"kept");
    client.put("after", b"new", &one()).await.unwrap();
    assert_eq!(client.get("after").await.unwrap(), b"new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_degrades_to_local_only_and_recovers() {
    let mut cluster = LocalCluster::start(3, &[]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let client = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        degrade_after: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();
    client
        .put("cluster-object", b"in the pool", &one())
        .await
        .unwrap();
    // Reading it takes a read lease (10 s) and keeps its descriptor.
    assert_eq!(client.get("cluster-object").await.unwrap(), b"in the pool");

    for id in [1, 2, 3] {
        cluster.kill(id).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(6);
    while !client.is_degraded() {
        assert!(
            Instant::now() < deadline,
            "client never noticed the masters were gone"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Puts and gets keep working from local memory...
    client
        .put("local-1", b"while degraded", &one())
        .await
        .unwrap();
    assert_eq!(client.get("local-1").await.unwrap(), b"while degraded");
    let mut buf = [0u8; 64];
    assert_eq!(client.get_into("local-1", &mut buf).await.unwrap(), 14);
    // ...and a replica whose read lease is still held is read from its store.
    assert_eq!(client.get("cluster-object").await.unwrap(), b"in the pool");
    // Nothing unknown is invented.
    assert!(client.get("never-put").await.is_err());

    for id in [1, 2, 3] {
        cluster.restart(id).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.is_degraded() {
        assert!(Instant::now() < deadline, "client never left degraded mode");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The locally stored object is published to the cluster.
    let other = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        ..Default::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(v) = other.get("local-1").await {
            assert_eq!(v, b"while degraded");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "local-only object was not published"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A store that dies stops counting as mounted once it misses its
/// heartbeats for the client TTL (its segment expires), so
/// `wait_for_segments` and `crescentctl status` count only live segments.
/// Before this, `segment_count` also counted expired segments and the wait
/// in `store_reregisters_with_a_new_leader` could not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_stores_segment_stops_counting_as_mounted() {
    let mut cluster = LocalCluster::start(3, &["--client-ttl".into(), "2s".into()]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    cluster.stores[0].kill();
    let mc = MasterClient::new(&cluster.masters_arg()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let (id, addr, _) = cluster
            .wait_for_leader(Duration::from_secs(15))
            .await
            .unwrap();
        if mc
            .node_status(&addr)
            .await
            .is_ok_and(|s| s.segment_count == 0)
        {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "the dead store's segment still counts as mounted after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        cluster
            .wait_for_segments(1, Duration::from_millis(500))
            .await
            .is_err(),
        "wait_for_segments must not count an expired segment"
    );
    // The gauge of mounted segments agrees.
    let http = cluster.by_id(leader).unwrap().http.clone();
    let (code, body) = http_request(&http, "GET", "/metrics", &[]).await.unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("master_segment_count 0"), "{body}");
}
