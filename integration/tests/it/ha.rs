//! High availability with a real etcd and real processes: join through etcd,
//! leader SIGKILL, restart and catch-up, store re-registration, and a client
//! that degrades to local-only caching and recovers.
//! Needs `cargo build --bins` and Debian's etcd-server (`make test` does both).

use std::time::{Duration, Instant};

use crescent_client::{Client, ClientConfig, MasterClient, Stored};
use crescent_integration::LocalEtcd;
use crescent_integration::{crescentctl, http_request, sample, LocalCluster};
use crescent_proto::pb;

use crate::common::{connect_client, one_replica};

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

/// The leader record the leader publishes in etcd (`/crescent/<cluster>/leader`,
/// JSON `{id, addr, term}`), read straight from etcd.
async fn etcd_leader_record(endpoint: &str, cluster: &str) -> Option<serde_json::Value> {
    let mut etcd = etcd_client::Client::connect([endpoint], None).await.ok()?;
    let answer = etcd
        .get(format!("/crescent/{cluster}/leader"), None)
        .await
        .ok()?;
    serde_json::from_slice(answer.kvs().first()?.value()).ok()
}

/// Polls etcd until the leader record names `leader` (the leader republishes
/// it every 500 ms); returns the record.
async fn wait_etcd_leader(endpoint: &str, cluster: &str, leader: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let record = etcd_leader_record(endpoint, cluster).await;
        if let Some(r) = record.as_ref().filter(|r| r["id"].as_u64() == Some(leader)) {
            return r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "etcd leader key never named node {leader}: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    // The leader publishes itself in etcd, with the address clients dial.
    let record = wait_etcd_leader(&etcd.endpoint, "ha1", leader).await;
    assert_eq!(
        record["addr"].as_str(),
        Some(cluster.by_id(leader).unwrap().addr.as_str()),
        "{record}"
    );
    let old_term = record["term"].as_u64().unwrap();

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
            .put(&key, format!("value-{i}").as_bytes(), &one_replica())
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
    // The etcd leader key follows (the dead leader's record is replaced, at
    // a higher term), and the CLI, pointed at etcd, names the new leader.
    let record = wait_etcd_leader(&etcd.endpoint, "ha1", new_leader).await;
    assert!(record["term"].as_u64().unwrap() > old_term, "{record}");
    assert_eq!(
        record["addr"].as_str(),
        Some(cluster.by_id(new_leader).unwrap().addr.as_str()),
        "{record}"
    );
    let (ok, out, _) = crescentctl(&["--master", &url, "leader", "--json"]).unwrap();
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["leader_id"].as_u64().unwrap(), new_leader);

    // The killed master restarts from its data dir and catches up.
    client
        .put("after-kill", b"x", &one_replica())
        .await
        .unwrap();
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

/// After a failover the store's heartbeats reach the new leader (which
/// learns of it only through them: heartbeats are leader memory, not in the
/// log), so its segment stays mounted past the client TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_reregisters_with_a_new_leader() {
    // A short client TTL: a store whose heartbeats did not reach the new leader
    // would lose its segment about two seconds after the failover.
    let ttl = Duration::from_secs(2);
    let mut cluster = LocalCluster::start(3, &["--client-ttl".into(), "2s".into()]).unwrap();
    let (leader, _, _) = cluster.with_mounted_store("64mb").await.unwrap();
    {
        // A client that is gone before the failover, so the store is the only
        // client the new leader can hear from.
        let client = connect_client(&cluster).await;
        client.put("before", b"kept", &one_replica()).await.unwrap();
        client.close().await;
    }
    cluster.kill(leader).unwrap();
    let (new_leader, addr, _) = cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    // Positive evidence: the new leader counts one live heartbeating client.
    let http = cluster.by_id(new_leader).unwrap().http.clone();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, body) = http_request(&http, "GET", "/metrics", &[]).await.unwrap();
        if sample(&body, "master_active_clients") == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store never heartbeated to the new leader:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And what that buys: the segment stays live for three client TTLs after
    // the heartbeat was seen, well past the new leader's own TTL wait before
    // it expires anyone (a claim that something does not happen needs a
    // window; every poll in it must see the segment).
    let mc = MasterClient::new(&cluster.masters_arg()).unwrap();
    let window_end = Instant::now() + 3 * ttl;
    while Instant::now() < window_end {
        let live = mc.node_status(&addr).await.unwrap().segment_count;
        assert_eq!(live, 1, "the store's segment expired under the new leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let client = connect_client(&cluster).await;
    assert_eq!(client.get("before").await.unwrap(), b"kept");
    client.put("after", b"new", &one_replica()).await.unwrap();
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
    // A second client that drops, rather than publishes, what it stored
    // while degraded (CRESCENT_PUBLISH_ON_RECOVER=false).
    let dropping = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        degrade_after: Duration::from_secs(1),
        publish_on_recover: false,
        ..Default::default()
    })
    .await
    .unwrap();
    // The library says where each put went: in the cluster now...
    let placed = client
        .put_placed("cluster-object", b"in the pool", &one_replica())
        .await
        .unwrap();
    assert_eq!(placed, Stored::InCluster);
    let batch = [
        ("cluster-batch-1", b"first".as_slice()),
        ("cluster-batch-2", b"second"),
    ];
    for r in client
        .put_batch_placed(&batch, &one_replica())
        .await
        .unwrap()
    {
        assert_eq!(r.unwrap(), Stored::InCluster);
    }
    // Reading takes a read lease (10 s) and keeps the descriptor; a batch
    // read does too.
    assert_eq!(client.get("cluster-object").await.unwrap(), b"in the pool");
    for r in client
        .get_batch(&["cluster-batch-1", "cluster-batch-2"])
        .await
        .unwrap()
    {
        r.unwrap();
    }

    for id in [1, 2, 3] {
        cluster.kill(id).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(6);
    while !client.is_degraded() || !dropping.is_degraded() {
        assert!(
            Instant::now() < deadline,
            "client never noticed the masters were gone"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Puts and gets keep working from local memory, and say so...
    let placed = client
        .put_placed("local-1", b"while degraded", &one_replica())
        .await
        .unwrap();
    assert_eq!(placed, Stored::LocalOnly);
    assert_eq!(client.get("local-1").await.unwrap(), b"while degraded");
    let mut buf = [0u8; 64];
    assert_eq!(client.get_into("local-1", &mut buf).await.unwrap(), 14);
    // ...and a replica whose read lease is still held is read from its store.
    assert_eq!(client.get("cluster-object").await.unwrap(), b"in the pool");
    // Nothing unknown is invented.
    assert!(client.get("never-put").await.is_err());
    // Batch operations too: a batch put goes to local memory, and batch reads
    // serve local objects and leased replicas (including ones first read by a
    // batch), each unknown key failing on its own.
    let local_batch = [
        ("local-b1", b"batch one".as_slice()),
        ("local-b2", b"batch two"),
    ];
    for r in client
        .put_batch_placed(&local_batch, &one_replica())
        .await
        .unwrap()
    {
        assert_eq!(r.unwrap(), Stored::LocalOnly);
    }
    let keys = ["local-b1", "cluster-batch-2", "never-put", "local-1"];
    let got = client.get_batch(&keys).await.unwrap();
    assert_eq!(got[0].as_ref().unwrap(), b"batch one");
    assert_eq!(got[1].as_ref().unwrap(), b"second");
    assert!(got[2].is_err());
    assert_eq!(got[3].as_ref().unwrap(), b"while degraded");
    let mut bufs = [[0u8; 32]; 4];
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let sizes = client.batch_get_into(&keys, &mut slices).await.unwrap();
    assert_eq!(sizes[0].as_ref().unwrap(), &9);
    assert_eq!(&bufs[0][..9], b"batch one");
    assert_eq!(sizes[1].as_ref().unwrap(), &6);
    assert_eq!(&bufs[1][..6], b"second");
    assert!(sizes[2].is_err());
    assert_eq!(sizes[3].as_ref().unwrap(), &14);
    assert_eq!(&bufs[3][..14], b"while degraded");
    dropping
        .put("local-dropped", b"not published", &one_replica())
        .await
        .unwrap();
    assert_eq!(
        dropping.get("local-dropped").await.unwrap(),
        b"not published"
    );

    for id in [1, 2, 3] {
        cluster.restart(id).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.is_degraded() || dropping.is_degraded() {
        assert!(Instant::now() < deadline, "client never left degraded mode");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The locally stored object is published to the cluster.
    let other = connect_client(&cluster).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let (Ok(v), Ok(b)) = (other.get("local-1").await, other.get("local-b2").await) {
            assert_eq!(v, b"while degraded");
            assert_eq!(b, b"batch two");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "local-only objects were not published"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The dropping client let its local object go: it no longer serves it
    // (dropping happens when it leaves degraded mode, like publishing), and
    // the cluster never saw it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match dropping.get("local-dropped").await {
            Err(e) if e.code() == crescent_proto::ErrorCode::ObjectNotFound => break,
            outcome => assert!(
                Instant::now() < deadline,
                "object stored while degraded was not dropped: {outcome:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!other.exists("local-dropped").await.unwrap());
    assert_eq!(
        dropping
            .stats
            .published
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
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
