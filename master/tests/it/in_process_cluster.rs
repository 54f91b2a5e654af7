//! Three masters in one process, talking real gRPC on loopback.
//!
//! - `elect_write_fail_over_and_catch_up`: elect, write, stop the leader,
//!   check the new leader holds every committed object, restart the old
//!   leader and check it catches up.
//! - `a_retried_remove_gets_the_answer_of_its_first_attempt` and
//!   `a_new_leader_honours_its_predecessors_leases`: a 30-minute chaos soak
//!   once lost acknowledged writes because a remove answered
//!   OBJECT_HAS_LEASE took effect.

use std::time::{Duration, Instant};

use clap::Parser;
use crescent_client::MasterClient;
use crescent_master::config::MasterConfig;
use crescent_master::server::RunningMaster;
use crescent_proto::pb;
use crescent_proto::ErrorCode;
use tokio::net::TcpListener;

fn config(
    id: u64,
    port: u16,
    peers: &str,
    dir: &std::path::Path,
    lease_ttl: &str,
    extra: &[String],
) -> MasterConfig {
    MasterConfig::parse_from(
        [
            "crescent-master".to_string(),
            "--insecure".into(),
            "--node-id".into(),
            id.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.join(format!("m{id}")).display().to_string(),
            "--peers".into(),
            peers.to_string(),
            // Small, so the master that comes back must receive a snapshot.
            "--snapshot-logs".into(),
            "40".into(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--lease-ttl".into(),
            lease_ttl.into(),
        ]
        .into_iter()
        .chain(extra.iter().cloned()),
    )
}

async fn leader_of(nodes: &[Option<RunningMaster>], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, n) in nodes.iter().enumerate() {
            if let Some(n) = n {
                if n.node.is_leader() {
                    return i;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader elected within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three masters on loopback ports, in a temporary data directory.
struct Cluster {
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    peers: String,
    lease_ttl: String,
    extra: Vec<String>,
    nodes: Vec<Option<RunningMaster>>,
}

impl Cluster {
    async fn start(lease_ttl: &str) -> Self {
        Self::start_with(lease_ttl, &[]).await
    }

    /// [`start`](Self::start) with `extra` flags for every master.
    async fn start_with(lease_ttl: &str, extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = Vec::new();
        for _ in 0..3 {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let peers = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let cfg = config(
                i as u64 + 1,
                ports[i],
                &peers,
                dir.path(),
                lease_ttl,
                &extra,
            );
            nodes.push(Some(RunningMaster::start(cfg, l).await.unwrap()));
        }
        Self {
            dir,
            ports,
            peers,
            lease_ttl: lease_ttl.into(),
            extra,
            nodes,
        }
    }

    fn addrs(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn leader(&self) -> usize {
        leader_of(&self.nodes, Duration::from_secs(10)).await
    }

    /// Restarts node index `i` from its data directory.
    async fn restart(&mut self, i: usize) {
        let listener = TcpListener::bind(("127.0.0.1", self.ports[i]))
            .await
            .unwrap();
        let cfg = config(
            i as u64 + 1,
            self.ports[i],
            &self.peers,
            self.dir.path(),
            &self.lease_ttl,
            &self.extra,
        );
        self.nodes[i] = Some(RunningMaster::start(cfg, listener).await.unwrap());
    }

    async fn stop(self) {
        for n in self.nodes.into_iter().flatten() {
            n.stop().await;
        }
    }
}

async fn mount(client: &MasterClient) -> u64 {
    client
        .mount_segment(
            pb::SegmentSpec {
                name: "seg".into(),
                endpoint: "127.0.0.1:1".into(),
                capacity: 1 << 30,
                ..Default::default()
            },
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap()
}

async fn put(client: &MasterClient, key: &str, checksum: u32) {
    client
        .put_start(
            key,
            4096,
            pb::ReplicateConfig {
                replica_num: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    client.put_end(key, checksum).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_write_fail_over_and_catch_up() {
    let mut cluster = Cluster::start("10s").await;
    let leader = cluster.leader().await;
    let client = MasterClient::new(&cluster.addrs()).unwrap();
    let seg = mount(&client).await;
    let mut acked = Vec::new();
    for i in 0..200 {
        let key = format!("key-{i}");
        put(&client, &key, i).await;
        acked.push(key);
    }

    // Stop the leader; a new one must hold every acknowledged object.
    let old = cluster.nodes[leader].take().unwrap();
    old.stop().await;
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    for (i, key) in acked.iter().enumerate() {
        let r = client.get_replica_list(key).await.unwrap();
        assert_eq!(r.replicas.len(), 1, "{key}");
        assert_eq!(r.checksum, i as u32);
        assert_eq!(r.replicas[0].segment_id, seg);
    }
    // More writes while the old leader is away.
    for i in 200..260 {
        let key = format!("key-{i}");
        put(&client, &key, i).await;
    }

    // The old leader rejoins from its data dir and catches up.
    cluster.restart(leader).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rejoined = cluster.nodes[leader].as_ref().unwrap();
        let count = rejoined.node.state().objects.len();
        if count == 260 && !rejoined.node.is_leader() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old leader did not catch up: {count} objects"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The leader purged the log it missed, so it was sent a snapshot.
    let m = cluster.nodes[leader].as_ref().unwrap().node.metrics();
    assert!(
        m.snapshot.is_some_and(|s| s.index > 100),
        "no snapshot installed: {:?}",
        m.snapshot
    );
    // Every node holds the same state.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let states: Vec<_> = cluster
            .nodes
            .iter()
            .map(|n| crescent_raft::state::MetaState::clone(&n.as_ref().unwrap().node.state()))
            .collect();
        if states.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        assert!(Instant::now() < deadline, "replicas diverge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}

/// Waits until the leader no longer covers for its predecessor's leases.
async fn past_takeover_grace(cluster: &Cluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let i = cluster.leader().await;
        if !cluster.nodes[i]
            .as_ref()
            .unwrap()
            .node
            .may_hold_predecessor_leases()
        {
            return i;
        }
        assert!(Instant::now() < deadline, "leader still in its lease grace");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

type RawMasterClient = pb::master_service_client::MasterServiceClient<crescent_auth::AuthedChannel>;

/// A client with a mounted segment, the leader once past its lease grace,
/// and a raw gRPC client to it (to send chosen request ids).
async fn settled_cluster_client(cluster: &Cluster) -> (MasterClient, usize, RawMasterClient) {
    let client = MasterClient::new(&cluster.addrs()).unwrap();
    mount(&client).await;
    let leader = past_takeover_grace(cluster).await;
    let addr = cluster.nodes[leader].as_ref().unwrap().addr.to_string();
    let raw = MasterClient::master(client.channel(&addr).unwrap());
    (client, leader, raw)
}

fn raw_remove(key: &str, header: &pb::RequestHeader) -> pb::RemoveRequest {
    pb::RemoveRequest {
        header: Some(header.clone()),
        key: key.into(),
        force: false,
    }
}

/// A retry (same client id and request seq) of a remove that succeeded must
/// be answered OK, even though the key now holds a new, leased object; and
/// the new object must survive. Before the fix the retry was refused with
/// OBJECT_HAS_LEASE from leader memory before dedup was consulted, which in
/// the soak (first attempt still in flight) meant a remove answered "has a
/// lease" that took effect: 12 lost writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_remove_gets_the_answer_of_its_first_attempt() {
    let cluster = Cluster::start("1s").await;
    let (client, _leader, mut raw) = settled_cluster_client(&cluster).await;
    put(&client, "k", 1).await;
    let header = pb::RequestHeader {
        client_id: "remover".into(),
        request_seq: 7,
    };
    let first = raw
        .remove(raw_remove("k", &header))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.status.unwrap().error_code(), ErrorCode::Ok);

    put(&client, "k", 2).await;
    let leased = client.get_replica_list("k").await.unwrap();
    assert_eq!(leased.checksum, 2);
    let retry = raw
        .remove(raw_remove("k", &header))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        retry.status.unwrap().error_code(),
        ErrorCode::Ok,
        "a retry must get its first attempt's answer"
    );
    let still = client.get_replica_list("k").await.unwrap();
    assert_eq!(still.checksum, 2, "the retry removed the new object");
    // A new request is refused: the new object is leased.
    let fresh = pb::RequestHeader {
        client_id: "remover".into(),
        request_seq: 8,
    };
    let refused = raw
        .remove(raw_remove("k", &fresh))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        refused.status.unwrap().error_code(),
        ErrorCode::ObjectHasLease
    );
    assert!(client.exists("k").await.unwrap());
    cluster.stop().await;
}

/// A lease granted by a leader that then dies still protects the object:
/// its successor refuses non-forced removes until a lease TTL has passed
/// since it took over. Before the fix the new leader, with empty lease
/// memory, removed it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_honours_its_predecessors_leases() {
    let mut cluster = Cluster::start("5s").await;
    let client = MasterClient::new(&cluster.addrs()).unwrap();
    mount(&client).await;
    let leader = past_takeover_grace(&cluster).await;
    put(&client, "leased", 1).await;
    client.get_replica_list("leased").await.unwrap();

    cluster.nodes[leader].take().unwrap().stop().await;
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    let e = client.remove("leased", false).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ObjectHasLease, "{e:?}");
    // (Not `client.exists`: a lookup grants a lease of its own.)
    let exists = |c: &Cluster| {
        let node = &c.nodes[new_leader].as_ref().unwrap().node;
        let state = node.state();
        state.exists("leased")
    };
    assert!(exists(&cluster));
    // Once a lease TTL has passed since the takeover, it may go.
    past_takeover_grace(&cluster).await;
    client.remove("leased", false).await.unwrap();
    assert!(!exists(&cluster));
    cluster.restart(leader).await;
    cluster.stop().await;
}

/// A remove whose caller stops waiting (deadline, cancelled stream) while
/// its entry is in flight must still take back its "doomed" mark once the
/// entry is decided. Before, the mark was taken back after the awaited
/// proposal in the request handler, which a cancelled request never reaches:
/// the key then read as missing until the next election, even after a new
/// put of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_remove_does_not_leave_its_key_unreadable() {
    let cluster = Cluster::start("1s").await;
    let (client, leader, mut raw) = settled_cluster_client(&cluster).await;
    let in_state = |key: &str| {
        let node = &cluster.nodes[leader].as_ref().unwrap().node;
        let state = node.state();
        state.exists(key)
    };
    let mut applied = 0;
    for (i, micros) in [200u64, 500, 1_000, 2_000, 5_000, 10_000]
        .into_iter()
        .enumerate()
    {
        let key = format!("k{i}");
        put(&client, &key, 1).await;
        let header = pb::RequestHeader {
            client_id: "impatient".into(),
            request_seq: i as u64,
        };
        let mut req = tonic::Request::new(raw_remove(&key, &header));
        // About a Raft round or less: the server drops the handler mid-way.
        req.set_timeout(Duration::from_micros(micros));
        let _ = raw.remove(req).await;
        // Did the remove reach the state machine? (It may not have been sent.)
        let deadline = Instant::now() + Duration::from_secs(3);
        while in_state(&key) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if in_state(&key) {
            continue;
        }
        applied += 1;
        put(&client, &key, 2).await;
        let found = client.get_replica_list(&key).await;
        assert!(
            found.is_ok(),
            "{key} unreadable after a new put (remove cancelled after {micros} us): {found:?}"
        );
    }
    assert!(applied > 0, "no cancelled remove reached the state machine");
    cluster.stop().await;
}

/// A lookup of a key whose removal is in flight waits for the removal's
/// fate instead of answering "not found": in the seed-20261122 soak a
/// retried forced remove (a dedup duplicate, so a no-op) marked the key, a
/// get answered missing, and the next get found the object still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_waits_for_an_in_flight_removal_instead_of_guessing() {
    let cluster = Cluster::start("1s").await;
    let (client, leader, _) = settled_cluster_client(&cluster).await;
    put(&client, "k", 7).await;
    let node = cluster.nodes[leader].as_ref().unwrap().node.clone();
    let key = vec!["k".to_string()];
    // What `remove_keys` does while its entry is in flight.
    node.doom(&key);
    let reader = MasterClient::new(&cluster.addrs()).unwrap();
    let lookup = tokio::spawn(async move { reader.get_replica_list("k").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !lookup.is_finished(),
        "answered while the removal was in flight"
    );
    // The removal turns out a no-op (e.g. dedup answered a retry).
    node.undoom(&key);
    let found = lookup.await.unwrap().expect("the object is still there");
    assert_eq!(found.checksum, 7);
    cluster.stop().await;
}

/// Sets up a pool over its eviction watermark whose only evictable object,
/// "leased", was just read through the leader (a 5 s read lease), then stops
/// that leader. Returns the cluster, the new leader's index, and when the
/// lease was granted.
async fn fail_over_with_a_leased_object_over_the_watermark(
    extra: &[&str],
) -> (Cluster, usize, Instant) {
    let mut flags = vec!["--eviction-high-watermark", "0.5"];
    flags.extend_from_slice(extra);
    let mut cluster = Cluster::start_with("5s", &flags).await;
    let client = MasterClient::new(&cluster.addrs()).unwrap();
    client
        .mount_segment(
            pb::SegmentSpec {
                name: "small".into(),
                endpoint: "127.0.0.1:1".into(),
                capacity: 4 * 4096,
                ..Default::default()
            },
            &crescent_auth::capability::SegmentKey::generate(),
        )
        .await
        .unwrap();
    let leader = past_takeover_grace(&cluster).await;
    put(&client, "leased", 1).await;
    let granted = Instant::now();
    client.get_replica_list("leased").await.unwrap();
    // Two unfinished puts take the pool to 75 %: over the watermark, and
    // not evictable themselves, so "leased" is the only candidate.
    let one = pb::ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    client
        .put_start("unfinished-1", 4096, one.clone())
        .await
        .unwrap();
    client.put_start("unfinished-2", 4096, one).await.unwrap();
    cluster.nodes[leader].take().unwrap().stop().await;
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    (cluster, new_leader, granted)
}

fn holds(cluster: &Cluster, i: usize, key: &str) -> bool {
    let node = &cluster.nodes[i].as_ref().unwrap().node;
    let state = node.state();
    state.exists(key)
}

/// The eviction twin of `a_new_leader_honours_its_predecessors_leases`: a
/// new leader over its watermark evicts nothing while its predecessor's
/// leases may be in force (it cannot know them), then evicts as usual. The
/// control run with `--unsafe-forget-leases` evicts the leased object while
/// its lease is still in force, which is what the grace prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_evicts_nothing_during_its_lease_grace() {
    let (cluster, new_leader, _) = fail_over_with_a_leased_object_over_the_watermark(&[]).await;
    let node = cluster.nodes[new_leader].as_ref().unwrap().node.clone();
    // Every poll until the grace ends must still find the object.
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.may_hold_predecessor_leases() {
        assert!(
            holds(&cluster, new_leader, "leased"),
            "evicted during the new leader's lease grace"
        );
        assert!(Instant::now() < deadline, "the lease grace never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Eviction was only held back: it happens once the grace is over.
    let deadline = Instant::now() + Duration::from_secs(15);
    while holds(&cluster, new_leader, "leased") {
        assert!(
            Instant::now() < deadline,
            "no eviction after the grace: the set-up is not over the watermark"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.stop().await;

    let (cluster, new_leader, granted) =
        fail_over_with_a_leased_object_over_the_watermark(&["--unsafe-forget-leases"]).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while holds(&cluster, new_leader, "leased") {
        assert!(Instant::now() < deadline, "the control run never evicted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        granted.elapsed() < Duration::from_secs(5),
        "the control run must evict while the 5 s lease is in force, else it shows nothing"
    );
    cluster.stop().await;
}

/// A Raft message with an absurd term (a Vote with term u64::MAX
/// was granted and persisted by the leader, whose next election then
/// panicked on `term + 1`, on every restart) is refused before openraft sees
/// it: the leader keeps its term and leadership, and the next election,
/// forced by stopping it, elects a successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_with_an_absurd_term_is_refused() {
    use crescent_raft::{codec, NodeId};
    use openraft::raft::VoteRequest;
    use openraft::Vote;

    let mut cluster = Cluster::start("1s").await;
    let leader = cluster.leader().await;
    let node = cluster.nodes[leader].as_ref().unwrap().node.clone();
    let term = node.current_term();
    let client = MasterClient::new(&cluster.addrs()).unwrap();
    let addr = cluster.nodes[leader].as_ref().unwrap().addr.to_string();
    let mut raft = pb::raft_service_client::RaftServiceClient::new(client.channel(&addr).unwrap());
    for forged in [
        u64::MAX,
        crescent_raft::terms::TERM_CEILING,
        term + (1 << 33),
    ] {
        let vote: VoteRequest<NodeId> = VoteRequest {
            vote: Vote::new(forged, 3),
            last_log_id: None,
        };
        let refused = raft
            .vote(crescent_raft::network::raft_request(
                codec::encode(&vote).unwrap(),
            ))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("refused"), "{refused:?}");
    }
    assert!(node.is_leader());
    assert_eq!(node.current_term(), term);
    mount(&client).await;
    put(&client, "after-forged-votes", 1).await;

    cluster.nodes[leader].take().unwrap().stop().await;
    let next = cluster.leader().await;
    assert_ne!(next, leader);
    assert!(cluster.nodes[next].as_ref().unwrap().node.current_term() > term);
    cluster.restart(leader).await;
    cluster.stop().await;
}
