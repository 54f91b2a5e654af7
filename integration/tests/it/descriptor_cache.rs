//! The client's descriptor cache (`descriptor_cache`) against real masters
//! and a real store: a key read once is read again, while its read lease
//! lasts, with no master call (every master paused, the read still
//! succeeds, where a client without the cache cannot look the key up);
//! batches mix cached and looked-up keys; a descriptor the store no longer
//! honours (the store restarted) is dropped and the key looked up again, so
//! the new value is read, never the old bytes; after the lease, reads ask
//! the masters again, unless the key was read through the cache meanwhile:
//! then the client renewed its lease in the background. Needs `cargo build
//! --bins` (`make test`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crescent_client::{Client, ClientConfig, ReplicateConfig};
use crescent_integration::LocalCluster;

/// Long enough for a pause of every master inside one lease.
const LEASE: Duration = Duration::from_secs(10);

fn config(c: &LocalCluster, cache: bool) -> ClientConfig {
    ClientConfig {
        master: c.masters_arg(),
        descriptor_cache: cache,
        // Degraded mode reads leased descriptors too: off, so a read with
        // every master paused can only be the cache's.
        degrade_after: Duration::ZERO,
        master_deadline: Duration::from_secs(2),
        ..Default::default()
    }
}

fn cached_reads(c: &Client) -> u64 {
    c.stats.cached_reads.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_key_is_read_again_without_the_masters_and_never_with_stale_grants() {
    let mut cluster = LocalCluster::start(3, &["--lease-ttl".into(), "10s".into()]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let cached = Client::connect(config(&cluster, true)).await.unwrap();
    let plain = Client::connect(config(&cluster, false)).await.unwrap();
    let cfg = ReplicateConfig::default();
    plain.put("k1", b"value-1", &cfg).await.unwrap();
    plain.put("k2", b"value-2", &cfg).await.unwrap();

    // The first read looks the key up (and leases it).
    assert_eq!(cached.get("k1").await.unwrap(), b"value-1");
    assert_eq!(cached_reads(&cached), 0);
    let leased_at = Instant::now();

    // Every master paused: only the cache can answer.
    let ids: Vec<u64> = cluster.masters.iter().map(|m| m.id).collect();
    for &id in &ids {
        cluster.pause(id).unwrap();
    }
    let mut buf = vec![0u8; 64];
    let read = cached.get_into("k1", &mut buf).await;
    let plain_read = plain.get("k1").await;
    for &id in &ids {
        cluster.resume(id).unwrap();
    }
    assert_eq!(read.unwrap(), 7, "the cached read needs no master");
    assert_eq!(&buf[..7], b"value-1");
    assert_eq!(cached_reads(&cached), 1);
    assert!(
        plain_read.is_err(),
        "without the cache no master means no lookup: {plain_read:?}"
    );
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();

    // A batch: k1 from the cache, k2 looked up.
    assert!(
        leased_at.elapsed() < LEASE - Duration::from_secs(1),
        "the test ran too slowly to prove anything about the lease"
    );
    let got = cached.get_batch(&["k1", "k2"]).await.unwrap();
    assert_eq!(got[0].as_deref().unwrap(), b"value-1");
    assert_eq!(got[1].as_deref().unwrap(), b"value-2");
    assert_eq!(cached_reads(&cached), 2);

    // The store restarts: the cached descriptor's grant was signed with
    // the old process's segment key, which the new one refuses. The key,
    // removed by force and put again (shorter) meanwhile, reads with its
    // new value, from a get and from a batch.
    plain.put("k3", b"value-3-old", &cfg).await.unwrap();
    plain.put("k4", b"value-4-old", &cfg).await.unwrap();
    assert_eq!(cached.get("k3").await.unwrap(), b"value-3-old");
    assert_eq!(cached.get("k4").await.unwrap(), b"value-4-old");
    let k3_leased_at = Instant::now();
    cluster.stores[0].kill();
    cluster.stores[0].restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (k, v) in [("k3", &b"value-3"[..]), ("k4", &b"value-4"[..])] {
        loop {
            let _ = plain.remove(k, true).await;
            if plain.put(k, v, &cfg).await.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "no put after the store restart");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(
        k3_leased_at.elapsed() < LEASE - Duration::from_secs(1),
        "the restart took too long: the cached descriptors expired unused"
    );
    let (before, fallbacks) = (
        cached_reads(&cached),
        cached.stats.cached_read_fallbacks.load(Ordering::Relaxed),
    );
    assert_eq!(cached.get("k3").await.unwrap(), b"value-3");
    let got = cached.get_batch(&["k4"]).await.unwrap();
    assert_eq!(
        got[0].as_deref().unwrap(),
        b"value-4",
        "cut to the new size"
    );
    assert_eq!(
        cached_reads(&cached),
        before,
        "the refused cached reads are not counted as cached"
    );
    assert_eq!(
        cached.stats.cached_read_fallbacks.load(Ordering::Relaxed),
        fallbacks + 2,
        "both were tried from the cache and refused"
    );

    // k2 (cached by the batch) went with the restarted store's memory: a
    // cached read of it fails, and the lookup says it is gone.
    assert!(cached.get("k2").await.is_err());

    // Once the lease is over, a read asks the masters again. (k3 was not
    // read through the cache since its lookup above, so the background
    // renewal leaves it to expire.)
    let seen = cached_reads(&cached);
    tokio::time::sleep(LEASE).await;
    assert_eq!(cached.get("k3").await.unwrap(), b"value-3");
    assert_eq!(cached_reads(&cached), seen, "an expired lease is not used");
    assert_eq!(cached.get("k3").await.unwrap(), b"value-3");
    assert_eq!(cached_reads(&cached), seen + 1, "the new lease is");

    // This client's own forced remove and put: read at once with the new
    // value, not the cached one.
    cached.remove("k3", true).await.unwrap();
    cached.put("k3", b"value-3-again", &cfg).await.unwrap();
    assert_eq!(cached.get("k3").await.unwrap(), b"value-3-again");
}

/// A key read steadily through the cache is renewed before its lease ends
/// and never misses; a key only looked up is left to expire. Without the
/// renewal, reads of the hot key over two and a half leases would ask the
/// masters about twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_steadily_stays_cached_past_its_lease_and_a_cold_one_expires() {
    // Half a lease (2 s) is when renewal starts: slack for a slow lookup.
    let lease = Duration::from_secs(4);
    let mut cluster = LocalCluster::start(3, &["--lease-ttl".into(), "4s".into()]).unwrap();
    cluster.with_mounted_store("64mb").await.unwrap();
    let cached = Client::connect(config(&cluster, true)).await.unwrap();
    let cfg = ReplicateConfig::default();
    cached.put("hot", b"hot-value", &cfg).await.unwrap();
    cached.put("cold", b"cold-value", &cfg).await.unwrap();
    assert_eq!(cached.get("hot").await.unwrap(), b"hot-value");
    assert_eq!(cached.get("cold").await.unwrap(), b"cold-value");
    let start = cached_reads(&cached);

    let until = Instant::now() + lease * 5 / 2;
    let mut reads = 0;
    while Instant::now() < until {
        assert_eq!(cached.get("hot").await.unwrap(), b"hot-value");
        reads += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        cached_reads(&cached) - start,
        reads,
        "every read of the steadily read key came from the cache"
    );
    let renewals = cached.stats.descriptor_renewals.load(Ordering::Relaxed);
    assert!(renewals >= 2, "renewed {renewals} times in 2.5 leases");

    let seen = cached_reads(&cached);
    assert_eq!(cached.get("cold").await.unwrap(), b"cold-value");
    assert_eq!(
        cached_reads(&cached),
        seen,
        "the key only looked up was not renewed: its lease ended"
    );
    cached.close().await;
}
