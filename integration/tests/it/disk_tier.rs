//! The disk tier through real processes: three masters and a store with a
//! disk segment. Objects past the memory watermark move to disk and stay
//! readable; a store killed with SIGKILL and started again on the same
//! directory serves its disk objects again; a leader killed while demoting
//! loses nothing acknowledged; an object read twice from disk is copied
//! back to memory and keeps its disk replica across a store restart; puts
//! that find memory full go to disk rather than fail; the disk watermark
//! releases promoted objects' disk copies before it drops any object; an
//! engine's client contributes a disk segment of its own (`disk_path`); a
//! same-host client reads disk replicas from the store's file, opens it
//! again when the store replaced it, and asks the store when its bytes
//! fail their checksum.
//! Needs `cargo build --bins` (`make test`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crescent_client::{Client, ClientConfig, ReplicateConfig};
use crescent_integration::{http_request, LocalCluster};
use crescent_proto::pb;

use crate::common::{connect_client, leader_metric, metric_at, patterned};

const VALUE: usize = 512 << 10;

fn value(i: usize) -> Vec<u8> {
    patterned(VALUE, i)
}

/// Masters that demote early and hold demoted memory briefly.
fn master_flags() -> Vec<String> {
    [
        "--eviction-high-watermark",
        "0.5",
        "--eviction-ratio",
        "0.3",
        "--lease-ttl",
        "2s",
        "--demotion-timeout",
        "15s",
    ]
    .map(String::from)
    .to_vec()
}

/// Masters that promote an object read twice within 30 s, copying while
/// memory stays at or below 0.5.
fn promotion_flags() -> Vec<String> {
    [
        "--eviction-high-watermark",
        "0.6",
        "--promotion-max-memory-usage",
        "0.5",
        "--eviction-ratio",
        "0.1",
        "--lease-ttl",
        "2s",
        "--demotion-timeout",
        "15s",
        "--promotion-reads",
        "2",
        "--promotion-window",
        "30s",
    ]
    .map(String::from)
    .to_vec()
}

fn store_flags(disk: &std::path::Path) -> Vec<String> {
    vec![
        "--segment-name".into(),
        "s0".into(),
        "--disk-path".into(),
        disk.display().to_string(),
        "--disk-size".into(),
        "256mb".into(),
    ]
}

/// Puts `key`, retrying while memory is full (demotion frees it).
async fn put_retrying(c: &Client, key: &str, v: &[u8]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match c.put(key, v, &ReplicateConfig::default()).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("{key}: {e}")),
        }
    }
}

/// The kinds of `key`'s replicas (None when it has none readable).
async fn kinds(c: &LocalCluster, key: &str) -> Option<Vec<pb::ReplicaKind>> {
    let r = c.master_client().ok()?.get_replica_list(key).await.ok()?;
    Some(
        r.replicas
            .iter()
            .map(|d| pb::ReplicaKind::try_from(d.kind).unwrap_or(pb::ReplicaKind::Memory))
            .collect(),
    )
}

/// Those of `keys` with a disk replica (a promoted one has a memory
/// replica too).
async fn on_disk(c: &LocalCluster, keys: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for k in keys {
        if kinds(c, k)
            .await
            .is_some_and(|ks| ks.contains(&pb::ReplicaKind::Disk))
        {
            out.push(k.clone());
        }
    }
    out
}

/// Three demoting masters and one store with an 8 MiB memory segment and a
/// disk segment in `disk` (both mounted), and a client.
async fn disk_cluster(disk: &std::path::Path) -> (LocalCluster, Client) {
    disk_cluster_with(disk, &master_flags()).await
}

async fn disk_cluster_with(disk: &std::path::Path, flags: &[String]) -> (LocalCluster, Client) {
    disk_cluster_serving(disk, flags, &[]).await
}

/// [`disk_cluster_with`], the store also given `store_extra`.
async fn disk_cluster_serving(
    disk: &std::path::Path,
    flags: &[String],
    store_extra: &[String],
) -> (LocalCluster, Client) {
    let mut cluster = LocalCluster::start(3, flags).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let mut store = store_flags(disk);
    store.extend_from_slice(store_extra);
    cluster.start_store("8mb", &store).unwrap();
    cluster
        .wait_for_segments(2, Duration::from_secs(15))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;
    (cluster, c)
}

/// Waits until store 0 reports its disk segment mounted.
async fn wait_for_disk_mount(cluster: &LocalCluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = http_request(&cluster.stores[0].http, "GET", "/health", &[]).await;
        if let Ok((200, body)) = health {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if v["disk"]["mounted"] == true {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the restarted store's disk segment never mounted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_past_the_watermark_move_to_disk_and_survive_a_store_restart() {
    let disk = tempfile::tempdir().unwrap();
    let (mut cluster, c) = disk_cluster(disk.path()).await;
    let copies = demote_and_restart(&mut cluster, &c).await;
    // The store copied the demoted objects from its memory to its own disk
    // (the bytes never went through the leader).
    assert!(copies.by_store_per_leader > 0, "{copies:?}");
    assert!(copies.by_store >= copies.by_store_per_leader, "{copies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_told_to_copy_through_the_leader_demote_the_same_way() {
    let disk = tempfile::tempdir().unwrap();
    let mut flags = master_flags();
    flags.push("--tier-copy-on-store=false".into());
    let (mut cluster, c) = disk_cluster_with(disk.path(), &flags).await;
    let copies = demote_and_restart(&mut cluster, &c).await;
    assert_eq!(copies.by_store_per_leader, 0, "{copies:?}");
    assert_eq!(copies.by_store, 0, "{copies:?}");
}

/// Demotions copied by the store itself, before its restart.
#[derive(Debug)]
struct StoreCopies {
    /// As the leader counts them.
    by_store_per_leader: u64,
    /// As the store counts them (read after the leader's).
    by_store: u64,
}

/// Puts 16 MiB through the 8 MiB memory segment, checks that demotions ran
/// and every object reads back, then SIGKILLs and restarts the store and
/// checks that its disk objects read back with no re-put.
async fn demote_and_restart(cluster: &mut LocalCluster, c: &Client) -> StoreCopies {
    // 16 MiB through an 8 MiB memory segment: none is refused for long.
    let keys: Vec<String> = (0..32).map(|i| format!("block-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(c, k, &value(i)).await.unwrap();
    }
    // Whatever is in memory or on disk reads back right; every object is
    // somewhere (the disk has room, so nothing was dropped).
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            c.get(k).await.unwrap_or_else(|e| panic!("{k}: {e}")),
            value(i),
            "{k}"
        );
    }
    let demoted = on_disk(cluster, &keys).await;
    assert!(
        demoted.len() >= 12,
        "at least 12 MiB of 16 must be on disk, found {}",
        demoted.len()
    );
    // On disk by demotion, or put there while memory was full. Memory is
    // past the watermark either way, so demotions run (after the puts,
    // when these went to disk rather than waiting for them).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut demotions = 0;
    while demotions == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        demotions = leader_metric(cluster, "master_demotions_total").await as u64;
    }
    let puts_to_disk = leader_metric(cluster, "master_puts_to_disk_total").await as u64;
    assert!(demotions > 0, "no demotion ran");
    assert!(demotions + puts_to_disk >= demoted.len() as u64);
    // The store counts each COPY before it answers, the leader after: read
    // in this order, the store's count is never the smaller.
    let by_store_per_leader =
        leader_metric(cluster, "master_tier_copies_on_store_total").await as u64;
    let by_store = metric_at(
        &cluster.stores[0].http,
        "store_tier_copies_total{from=\"memory\"}",
    )
    .await as u64;

    // SIGKILL the store and start it again on the same directory: its
    // memory objects are gone, its disk objects come back with no re-put.
    cluster.stores[0].kill();
    cluster.stores[0].restart().unwrap();
    // The new process mounts its disk segment (the masters took it back
    // rather than waiting for the old one to expire and starting afresh).
    wait_for_disk_mount(cluster).await;
    assert_eq!(
        on_disk(cluster, &demoted).await,
        demoted,
        "every disk object is listed again"
    );
    for k in &demoted {
        let i: usize = k.trim_start_matches("block-").parse().unwrap();
        assert_eq!(c.get(k).await.unwrap(), value(i), "{k} after the restart");
    }
    // The restarted store serves puts again (its new memory segment).
    put_retrying(c, "after", &value(99)).await.unwrap();
    assert_eq!(c.get("after").await.unwrap(), value(99));
    let (_, health) = http_request(&cluster.stores[0].http, "GET", "/health", &[])
        .await
        .unwrap();
    assert!(health.contains("\"disk\":{"), "{health}");
    StoreCopies {
        by_store_per_leader,
        by_store,
    }
}

/// Waits until store 0's log says it did not open its disk segment, and
/// returns that line.
async fn wait_for_disk_refusal(cluster: &LocalCluster, from: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&cluster.stores[0].log_path).unwrap_or_default();
        if let Some(line) = log[from.min(log.len())..]
            .lines()
            .find(|l| l.contains("no disk tier"))
        {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the store never said it left its disk segment alone"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restarted_with_another_disk_size_keeps_its_disk_objects_unless_told_to_reformat() {
    let disk = tempfile::tempdir().unwrap();
    // A short client TTL: the reformatted file's new segment mounts once
    // the old one (same name, other disk id) has expired.
    let mut flags = master_flags();
    flags.extend(["--client-ttl".to_string(), "3s".to_string()]);
    let (mut cluster, c) = disk_cluster_with(disk.path(), &flags).await;
    let keys: Vec<String> = (0..24).map(|i| format!("block-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(&c, k, &value(i)).await.unwrap();
    }
    let demoted = on_disk(&cluster, &keys).await;
    assert!(!demoted.is_empty(), "nothing reached the disk");
    let file = disk.path().join(crescent_store::disk::DISK_FILE);
    let header = |f: &std::path::Path| {
        let raw = std::fs::read(f).unwrap();
        (
            raw.len(),
            raw[..crescent_store::disk::HEADER_LEN as usize].to_vec(),
        )
    };
    let before = header(&file);

    // A mistyped size: the file is left alone and the store serves memory.
    cluster.stores[0].kill();
    let log_from = std::fs::metadata(&cluster.stores[0].log_path)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    cluster.stores[0].set_flag("--disk-size", "128mb");
    cluster.stores[0].restart().unwrap();
    let said = wait_for_disk_refusal(&cluster, log_from).await;
    for part in ["--disk-size 256mb", "--disk-reformat", "128mb"] {
        assert!(said.contains(part), "{part:?} not in: {said}");
    }
    put_retrying(&c, "memory-only", &value(98)).await.unwrap();
    assert_eq!(c.get("memory-only").await.unwrap(), value(98));
    let (_, health) = http_request(&cluster.stores[0].http, "GET", "/health", &[])
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert!(v["disk"].is_null(), "a disk tier was opened: {health}");
    assert_eq!(v["status"], "degraded", "{health}");
    let why = v["disk_error"].as_str().unwrap_or_default();
    assert!(why.contains("--disk-size 256mb"), "{health}");
    let (_, metrics) = http_request(&cluster.stores[0].http, "GET", "/metrics", &[])
        .await
        .unwrap();
    assert!(metrics.contains("store_disk_open_failed 1"), "{metrics}");
    assert!(header(&file) == before, "the refused file changed");

    // Its own size again: every disk object reads back, with no re-put.
    cluster.stores[0].kill();
    cluster.stores[0].set_flag("--disk-size", "256mb");
    cluster.stores[0].restart().unwrap();
    wait_for_disk_mount(&cluster).await;
    assert_eq!(on_disk(&cluster, &demoted).await, demoted);
    for k in &demoted {
        let i: usize = k.trim_start_matches("block-").parse().unwrap();
        assert_eq!(c.get(k).await.unwrap(), value(i), "{k} after the restart");
    }

    // Told to reformat: the new size, a new disk id, the old objects gone
    // (never read back from the new formatting).
    cluster.stores[0].kill();
    cluster.stores[0].set_flag("--disk-size", "128mb");
    cluster.stores[0].set_flag("--disk-reformat", "true");
    cluster.stores[0].restart().unwrap();
    wait_for_disk_mount(&cluster).await;
    let (len, new_header) = header(&file);
    assert_eq!(len as u64, crescent_store::disk::HEADER_LEN + (128 << 20));
    let old_id = crescent_store::disk::decode_header(&before.1)
        .unwrap()
        .disk_id;
    let new = crescent_store::disk::decode_header(&new_header).unwrap();
    assert_ne!(new.disk_id, old_id, "formatted anew under the same disk id");
    for k in &demoted {
        let got = c.get(k).await;
        assert!(
            got.is_err(),
            "{k}: read back after its disk was formatted anew"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_memory_cannot_hold_go_to_disk_and_none_fails() {
    let disk = tempfile::tempdir().unwrap();
    let (mut cluster, c) = disk_cluster(disk.path()).await;

    // 24 MiB back to back through an 8 MiB memory segment, each put tried
    // once: demotion frees memory only a lease TTL after each round, so
    // most of these find memory full, and must go to disk, not fail.
    let keys: Vec<String> = (0..48).map(|i| format!("over-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        c.put(k, &value(i), &ReplicateConfig::default())
            .await
            .unwrap_or_else(|e| panic!("{k} refused while the disk has room: {e}"));
    }
    let to_disk = leader_metric(&cluster, "master_puts_to_disk_total").await as u64;
    assert!(to_disk > 0, "no put went to disk: the test proved nothing");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            c.get(k).await.unwrap_or_else(|e| panic!("{k}: {e}")),
            value(i),
            "{k}"
        );
    }
    // Put to disk, they survive the store's restart as demoted ones do.
    let on_disk_before = on_disk(&cluster, &keys).await;
    assert!(on_disk_before.len() as u64 >= to_disk.min(keys.len() as u64) / 2);
    cluster.stores[0].kill();
    cluster.stores[0].restart().unwrap();
    wait_for_disk_mount(&cluster).await;
    // The client's pooled connections to the store's disk port are stale
    // now: the first read goes through a new one (retried once by the
    // transport).
    for k in &on_disk_before {
        let i: usize = k.trim_start_matches("over-").parse().unwrap();
        assert_eq!(c.get(k).await.unwrap(), value(i), "{k} after the restart");
    }
    // Puts work again (retried: until the old memory segment expires, the
    // masters may still place on it, and the new process refuses that).
    put_retrying(&c, "after", &value(7)).await.unwrap();
    assert_eq!(c.get("after").await.unwrap(), value(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_while_demoting_loses_nothing_acknowledged() {
    let disk = tempfile::tempdir().unwrap();
    let (mut cluster, c) = disk_cluster(disk.path()).await;

    let mut acked: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..48 {
        let k = format!("k-{i}");
        // Twice, while memory is past the watermark and demotions run:
        // SIGKILL the leader, wait for the next, start the old one again.
        if i == 20 || i == 34 {
            let (leader, _, _) = cluster
                .wait_for_leader(Duration::from_secs(15))
                .await
                .unwrap();
            cluster.kill(leader).unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            cluster
                .wait_for_leader(Duration::from_secs(15))
                .await
                .unwrap();
            cluster.restart(leader).unwrap();
        }
        match put_retrying(&c, &k, &value(i)).await {
            Ok(()) => {
                acked.insert(k, i);
            }
            Err(e) => eprintln!("not acknowledged (allowed): {e}"),
        }
    }
    assert!(acked.len() >= 40, "most puts succeed: {}", acked.len());
    for (k, i) in &acked {
        let got = c
            .get(k)
            .await
            .unwrap_or_else(|e| panic!("acknowledged {k} lost: {e}"));
        assert_eq!(&got, &value(*i), "{k}");
    }
    let keys: Vec<String> = acked.keys().cloned().collect();
    assert!(!on_disk(&cluster, &keys).await.is_empty(), "demotion ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_read_twice_from_disk_is_promoted_and_keeps_its_disk_replica() {
    let disk = tempfile::tempdir().unwrap();
    let flags = promotion_flags();
    let (mut cluster, c) = disk_cluster_with(disk.path(), &flags).await;
    let keys: Vec<String> = (0..24).map(|i| format!("p-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(&c, k, &value(i)).await.unwrap();
    }
    // Room for promotions: remove what is still in memory (its space is
    // free a lease TTL later).
    let mut disk_only = Vec::new();
    for k in &keys {
        match kinds(&cluster, k).await.as_deref() {
            Some([pb::ReplicaKind::Disk]) => disk_only.push(k.clone()),
            // Forced: the kind lookup just leased it.
            _ => c
                .remove(k, true)
                .await
                .unwrap_or_else(|e| panic!("{k}: {e}")),
        }
    }
    assert!(disk_only.len() >= 8, "demoted: {disk_only:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The kind lookups above were one read each; one get more is the
    // second, and the leader copies the object back to memory.
    let promoted: Vec<String> = disk_only.iter().take(4).cloned().collect();
    for k in &promoted {
        let i: usize = k.trim_start_matches("p-").parse().unwrap();
        assert_eq!(c.get(k).await.unwrap(), value(i), "{k} from disk");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for k in &promoted {
        loop {
            let ks = kinds(&cluster, k).await.unwrap_or_default();
            if ks == [pb::ReplicaKind::Memory, pb::ReplicaKind::Disk] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{k} was not promoted (memory first, disk kept): {ks:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let i: usize = k.trim_start_matches("p-").parse().unwrap();
        assert_eq!(c.get(k).await.unwrap(), value(i), "{k} from memory");
    }
    assert!(leader_metric(&cluster, "master_promotions_total").await >= promoted.len() as f64);
    // Promotions too are copied by the store, from its disk to its memory.
    let promoted_by_store = metric_at(
        &cluster.stores[0].http,
        "store_tier_copies_total{from=\"disk\"}",
    )
    .await as u64;
    assert!(promoted_by_store > 0, "no promotion copied by the store");
    // A key read once stays only on disk.
    let unread = disk_only.last().unwrap();
    assert_eq!(
        kinds(&cluster, unread).await.unwrap(),
        [pb::ReplicaKind::Disk],
        "{unread} was read once"
    );

    // SIGKILL the store: the promoted objects' memory copies die with it,
    // their disk replicas come back with the restart.
    cluster.stores[0].kill();
    cluster.stores[0].restart().unwrap();
    wait_for_disk_mount(&cluster).await;
    for k in &promoted {
        let i: usize = k.trim_start_matches("p-").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        let got = loop {
            match c.get(k).await {
                Ok(v) => break v,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("promoted {k} lost across the store restart: {e}"),
            }
        };
        assert_eq!(got, value(i), "{k} after the restart");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_watermark_releases_promoted_objects_disk_copies_first() {
    let disk = tempfile::tempdir().unwrap();
    // As in the promotion test, with a 16 MiB disk whose watermark is
    // half of it.
    let mut flags = promotion_flags();
    flags.extend(["--disk-eviction-high-watermark".into(), "0.5".into()]);
    let mut cluster = LocalCluster::start(3, &flags).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let mut store = store_flags(disk.path());
    let size = store.iter().position(|f| f == "--disk-size").unwrap() + 1;
    store[size] = "16mb".into();
    cluster.start_store("8mb", &store).unwrap();
    cluster
        .wait_for_segments(2, Duration::from_secs(15))
        .await
        .unwrap();
    let c = connect_client(&cluster).await;

    // Objects on disk only, as in the promotion test; four promoted.
    let keys: Vec<String> = (0..24).map(|i| format!("w-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(&c, k, &value(i)).await.unwrap();
    }
    // Demotion runs after the puts (those that found memory full went to
    // disk at once).
    let deadline = Instant::now() + Duration::from_secs(20);
    while on_disk(&cluster, &keys).await.len() < 8 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut disk_only = Vec::new();
    for k in &keys {
        match kinds(&cluster, k).await.as_deref() {
            Some([pb::ReplicaKind::Disk]) => disk_only.push(k.clone()),
            // Gone already: dropped at this small disk's watermark.
            None => {}
            // Still in memory: removed, to leave room for promotions. It
            // may have gone to disk and been dropped since the lookup.
            Some(_) => match c.remove(k, true).await {
                Ok(()) | Err(crescent_client::Error::NotFound(_)) => {}
                Err(e) => panic!("{k}: {e}"),
            },
        }
    }
    assert!(disk_only.len() >= 4, "demoted: {disk_only:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The last looked up: the disk watermark, dropping the coldest
    // disk-only objects, would come to them last.
    let promoted: Vec<String> = disk_only[disk_only.len() - 4..].to_vec();
    let index = |k: &str| -> usize { k.rsplit('-').next().unwrap().parse().unwrap() };
    for k in &promoted {
        assert_eq!(c.get(k).await.unwrap(), value(index(k)), "{k} from disk");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for k in &promoted {
        while kinds(&cluster, k).await.unwrap_or_default()
            != [pb::ReplicaKind::Memory, pb::ReplicaKind::Disk]
        {
            assert!(Instant::now() < deadline, "{k} was not promoted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        leader_metric(&cluster, "master_disk_copies_released_total").await as u64,
        0
    );

    // More objects, until the disk passes its watermark. The promoted ones
    // are read after every put: fresh and leased, memory eviction leaves
    // them in memory, and the disk watermark must take their disk copies
    // before it drops any object for good.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut released = 0;
    let mut i = 100;
    while released == 0 {
        assert!(
            Instant::now() < deadline,
            "no disk copy released within 60 s"
        );
        put_retrying(&c, &format!("fill-{i}"), &value(i))
            .await
            .unwrap();
        i += 1;
        for k in &promoted {
            assert_eq!(c.get(k).await.unwrap(), value(index(k)), "{k}");
        }
        released = leader_metric(&cluster, "master_disk_copies_released_total").await as u64;
    }
    // Their bytes are still there, from memory; at least one has no disk
    // replica any more.
    let mut memory_only = 0;
    for k in &promoted {
        assert_eq!(c.get(k).await.unwrap(), value(index(k)), "{k} after");
        if kinds(&cluster, k).await.unwrap_or_default() == [pb::ReplicaKind::Memory] {
            memory_only += 1;
        }
    }
    assert!(
        memory_only >= 1,
        "released {released}, yet every promoted object is on disk"
    );
}

/// The endpoints of `key`'s disk replicas.
async fn disk_endpoints(c: &LocalCluster, key: &str) -> Vec<String> {
    let Ok(master) = c.master_client() else {
        return Vec::new();
    };
    match master.get_replica_list(key).await {
        Ok(r) => r
            .replicas
            .iter()
            .filter(|d| d.kind == pb::ReplicaKind::Disk as i32)
            .map(|d| d.endpoint.clone())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// An engine's client with `disk_path` (Mooncake's `enable_ssd_offload`)
/// contributes a disk segment beside its memory: objects past the
/// watermark go there and read back right, from it and from another
/// client; and the engine started again on the same directory serves them
/// again, with no re-put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_own_disk_segment_takes_objects_and_keeps_them_across_its_restart() {
    let disk = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, &master_flags()).unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(15))
        .await
        .unwrap();
    let engine_config = ClientConfig {
        master: cluster.masters_arg(),
        global_segment_size: 8 << 20,
        disk_path: Some(disk.path().to_path_buf()),
        disk_size: 64 << 20,
        ..Default::default()
    };
    let engine = Client::connect(engine_config.clone()).await.unwrap();
    let (disk_name, disk_endpoint) = {
        let d = engine
            .local_disk()
            .expect("the client serves a disk segment");
        (d.name.clone(), d.endpoint.clone())
    };
    cluster
        .wait_for_segments(2, Duration::from_secs(15))
        .await
        .unwrap();

    // 16 MiB through the client's 8 MiB of memory: the only disk is its own.
    let keys: Vec<String> = (0..32).map(|i| format!("engine-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(&engine, k, &value(i)).await.unwrap();
    }
    let reader = connect_client(&cluster).await;
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(engine.get(k).await.unwrap(), value(i), "{k} (engine)");
        assert_eq!(reader.get(k).await.unwrap(), value(i), "{k} (reader)");
    }
    let on_disk_now = on_disk(&cluster, &keys).await;
    assert!(
        on_disk_now.len() >= 12,
        "at least 12 MiB of 16 must be on the client's disk, found {}",
        on_disk_now.len()
    );
    for k in &on_disk_now {
        assert_eq!(
            disk_endpoints(&cluster, k).await,
            vec![disk_endpoint.clone()],
            "{k} is on the client's disk segment"
        );
    }

    // The engine stops and starts again on the same directory: its memory
    // objects are gone with its memory segment, its disk objects come back.
    // The old client is still alive (as when other threads hold it): its
    // close alone frees the directory.
    engine.close().await;
    assert!(engine.local_disk().is_none(), "closed");
    let old_engine = engine;
    // Started with another disk size, it fails and leaves the file alone.
    let err = Client::connect(ClientConfig {
        disk_size: 32 << 20,
        ..engine_config.clone()
    })
    .await
    .err()
    .expect("a disk file of another size was opened");
    for part in ["disk_size to 64mb", "disk_reformat", "--disk-segment-grace"] {
        assert!(err.to_string().contains(part), "{part:?} not in: {err}");
    }
    let engine = Client::connect(engine_config).await.unwrap();
    let d = engine.local_disk().expect("the disk segment again");
    assert_eq!(d.name, disk_name, "the file keeps the segment's name");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut listed = on_disk(&cluster, &on_disk_now).await;
    while listed != on_disk_now && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        listed = on_disk(&cluster, &on_disk_now).await;
    }
    assert_eq!(listed, on_disk_now, "every disk object is listed again");
    for k in &on_disk_now {
        let i: usize = k.trim_start_matches("engine-").parse().unwrap();
        assert_eq!(
            reader.get(k).await.unwrap(),
            value(i),
            "{k} after the restart"
        );
        assert_eq!(
            engine.get(k).await.unwrap(),
            value(i),
            "{k} (engine, after)"
        );
    }
    engine.close().await;
    drop(old_engine);
}

fn disk_file_bytes(c: &Client) -> u64 {
    c.stats
        .disk_file_bytes
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_host_client_reads_disk_replicas_from_the_file_follows_its_replacement_and_never_returns_bad_bytes(
) {
    let disk = tempfile::tempdir().unwrap();
    // No promotion: the disk replicas stay the ones read.
    let mut masters = master_flags();
    masters.extend(["--promotion-reads".to_string(), "0".to_string()]);
    let (mut cluster, here) =
        disk_cluster_serving(disk.path(), &masters, &["--shm".to_string()]).await;
    // Both clients name their host: `here` the store's, this one not.
    let elsewhere = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        local_hostname: "another-host".into(),
        ..Default::default()
    })
    .await
    .unwrap();

    let keys: Vec<String> = (0..32).map(|i| format!("block-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(&here, k, &value(i)).await.unwrap();
    }
    let demoted = on_disk(&cluster, &keys).await;
    assert!(demoted.len() >= 12, "only {} on disk", demoted.len());
    let index = |k: &str| -> usize { k.trim_start_matches("block-").parse().unwrap() };
    let before = disk_file_bytes(&here);
    for k in &demoted {
        assert!(
            here.get(k).await.unwrap() == value(index(k)),
            "{k}: wrong bytes"
        );
        assert!(
            elsewhere.get(k).await.unwrap() == value(index(k)),
            "{k}: wrong bytes"
        );
    }
    // Every disk object was read from the file; the other host's client
    // read none of it.
    assert!(
        disk_file_bytes(&here) - before >= (demoted.len() * VALUE) as u64,
        "{} bytes read from the file for {} disk objects",
        disk_file_bytes(&here) - before,
        demoted.len()
    );
    assert_eq!(disk_file_bytes(&elsewhere), 0);
    assert_eq!(fallbacks(&here), 0);

    // The store's file is replaced while it is down: the restarted store
    // formats a new one at the same path, and the masters forget what the
    // old one held. This client still holds the old file open.
    cluster.stores[0].kill();
    std::fs::remove_file(disk.path().join(crescent_store::disk::DISK_FILE)).unwrap();
    cluster.stores[0].restart().unwrap();
    wait_for_disk_mount(&cluster).await;
    let fresh: Vec<String> = (0..32).map(|i| format!("fresh-{i}")).collect();
    for (i, k) in fresh.iter().enumerate() {
        put_retrying(&here, k, &value(i + 100)).await.unwrap();
    }
    let fresh_on_disk = on_disk(&cluster, &fresh).await;
    assert!(
        fresh_on_disk.len() >= 12,
        "only {} on disk",
        fresh_on_disk.len()
    );
    // The new file is a new segment to the masters: the client opens the
    // path again for it rather than reading the old file it holds (whose
    // bytes would fail the new objects' checksums).
    let before = disk_file_bytes(&here);
    for k in &fresh_on_disk {
        let i: usize = k.trim_start_matches("fresh-").parse().unwrap();
        assert!(
            here.get(k).await.unwrap() == value(i + 100),
            "{k}: wrong bytes"
        );
    }
    assert!(
        disk_file_bytes(&here) - before >= (fresh_on_disk.len() * VALUE) as u64,
        "the new file was not read directly"
    );
    assert_eq!(fallbacks(&here), 0);

    // Bytes that fail their checksum in the file: the direct read is not
    // believed, the store is asked over TCP (and reads the same bytes), and
    // the get fails rather than return them.
    let victim = &fresh_on_disk[0];
    let found = cluster
        .master_client()
        .unwrap()
        .get_replica_list(victim)
        .await
        .unwrap();
    let disk_replica = found
        .replicas
        .iter()
        .find(|r| r.kind == pb::ReplicaKind::Disk as i32)
        .expect("a disk replica");
    assert!(!disk_replica.disk_file_path.is_empty());
    assert!(
        disk_replica.shm_path.is_empty(),
        "older clients would map it"
    );
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&disk_replica.disk_file_path)
            .unwrap();
        f.write_all_at(
            b"scribbled",
            crescent_store::disk::HEADER_LEN + disk_replica.offset + 100,
        )
        .unwrap();
    }
    let tcp_before = here
        .stats
        .tcp_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    let got = here.get(victim).await;
    assert!(
        matches!(got, Err(crescent_client::Error::ChecksumMismatch(_))),
        "{victim}: {:?}",
        got.map(|v| v.len())
    );
    assert_eq!(fallbacks(&here), 1);
    assert!(
        here.stats
            .tcp_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            > tcp_before,
        "the store was not asked"
    );
}

fn fallbacks(c: &Client) -> u64 {
    c.stats
        .disk_file_fallbacks
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Bytes of `value`'s length, different from it, with the same crc32c: the
/// checksum cannot tell them apart, so only where they were read from can.
/// (crc32c is affine over GF(2) for messages of one length: flipping a set
/// of bits changes the crc by the xor of what each flip alone changes it
/// by. Among 64 single-bit flips some set changes it by 0.)
fn same_crc_other_bytes(value: &[u8]) -> Vec<u8> {
    let base = crc32c::crc32c(value);
    let effect = |bit: usize| {
        let mut v = value.to_vec();
        v[bit / 8] ^= 1 << (bit % 8);
        crc32c::crc32c(&v) ^ base
    };
    // A basis of the effects seen, each with the flips that make it.
    let mut basis: Vec<(u32, u64)> = Vec::new();
    for bit in 0..64 {
        let (mut e, mut flips) = (effect(bit), 1u64 << bit);
        for &(b, f) in &basis {
            if e ^ b < e {
                e ^= b;
                flips ^= f;
            }
        }
        if e == 0 {
            let mut forged = value.to_vec();
            for b in (0..64).filter(|b| flips & (1 << b) != 0) {
                forged[b / 8] ^= 1 << (b % 8);
            }
            assert_ne!(forged, value);
            assert_eq!(crc32c::crc32c(&forged), base);
            return forged;
        }
        basis.push((e, flips));
        basis.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
    }
    unreachable!("64 flips in a 32-bit space always have a dependent set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_host_client_reads_cached_disk_replicas_from_the_file_but_never_from_a_file_formatted_anew(
) {
    let disk = tempfile::tempdir().unwrap();
    let mut masters = master_flags();
    masters.extend(["--promotion-reads".to_string(), "0".to_string()]);
    let (mut cluster, writer) =
        disk_cluster_serving(disk.path(), &masters, &["--shm".to_string()]).await;
    let keys: Vec<String> = (0..32).map(|i| format!("block-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_retrying(&writer, k, &value(i)).await.unwrap();
    }
    let demoted = on_disk(&cluster, &keys).await;
    assert!(demoted.len() >= 12, "only {} on disk", demoted.len());
    let index = |k: &str| -> usize { k.trim_start_matches("block-").parse().unwrap() };

    // The victim, and bytes that pass its checksum but are not its value.
    // Read last below, its cached descriptor has the most lease left.
    let victim = demoted.last().expect("a disk object").clone();
    let found = cluster
        .master_client()
        .unwrap()
        .get_replica_list(&victim)
        .await
        .unwrap();
    let replica = found
        .replicas
        .iter()
        .find(|r| r.kind == pb::ReplicaKind::Disk as i32)
        .expect("a disk replica")
        .clone();
    assert_eq!(replica.disk_id.len(), 32, "{replica:?}");
    let forged = same_crc_other_bytes(&value(index(&victim)));
    assert_eq!(crc32c::crc32c(&forged), found.checksum);
    // A same-host client with the descriptor cache: the second get of a
    // disk object reads the file with no master call.
    let here = Client::connect(ClientConfig {
        master: cluster.masters_arg(),
        descriptor_cache: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let cached = |c: &Client| {
        c.stats
            .cached_reads
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    for k in &demoted {
        let want = value(index(k));
        assert!(here.get(k).await.unwrap() == want, "{k}: wrong bytes");
        let (reads, bytes) = (cached(&here), disk_file_bytes(&here));
        assert!(here.get(k).await.unwrap() == want, "{k}: wrong bytes");
        assert_eq!(
            cached(&here),
            reads + 1,
            "{k}: not read with its cached descriptor"
        );
        assert!(
            disk_file_bytes(&here) >= bytes + VALUE as u64,
            "{k}: the cached read did not read the file"
        );
    }
    assert_eq!(fallbacks(&here), 0);

    // The store dies and its file is formatted anew in place (as a store
    // does that finds it unusable): a new disk id in the header, and the
    // forged bytes at the victim's offset. This client still holds the
    // file open and the victim's descriptor is still cached.
    cluster.stores[0].kill();
    {
        use std::os::unix::fs::FileExt;
        let path = disk.path().join(crescent_store::disk::DISK_FILE);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let len = f.metadata().unwrap().len();
        let mut header = vec![0u8; crescent_store::disk::HEADER_LEN as usize];
        f.read_exact_at(&mut header, 0).unwrap();
        f.set_len(0).unwrap();
        f.set_len(len).unwrap();
        // The same segment with a new disk id.
        let mut identity = crescent_store::disk::decode_header(&header).unwrap();
        let new_id: String = identity
            .disk_id
            .chars()
            .map(|c| if c == '0' { '1' } else { '0' })
            .collect();
        assert_ne!(new_id, identity.disk_id);
        identity.disk_id = new_id;
        f.write_all_at(&crescent_store::disk::encode_header(&identity), 0)
            .unwrap();
        f.write_all_at(&forged, crescent_store::disk::HEADER_LEN + replica.offset)
            .unwrap();
    }
    // The cached read finds the file formatted anew and does not believe
    // it; the store (down) cannot be asked; the masters still list the
    // replica, whose descriptor names the old formatting, which the file
    // no longer holds. The get fails: it never returns the forged bytes.
    let cached_fallbacks = |c: &Client| {
        c.stats
            .cached_read_fallbacks
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let fell_back = cached_fallbacks(&here);
    let got = here.get(&victim).await;
    assert_eq!(
        cached_fallbacks(&here),
        fell_back + 1,
        "the get did not start with the cached descriptor"
    );
    assert!(
        got.is_err(),
        "{victim}: read {} bytes from a file formatted anew (forged: {})",
        got.as_ref().map_or(0, Vec::len),
        got.as_ref().is_ok_and(|v| *v == forged)
    );
    assert!(fallbacks(&here) >= 1, "the direct read was not refused");
    // A client without the cache, opening the file afresh, refuses it too.
    let fresh = connect_client(&cluster).await;
    assert!(fresh.get(&victim).await.is_err());
    assert_eq!(disk_file_bytes(&fresh), 0);
}
