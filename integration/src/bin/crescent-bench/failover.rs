//! `crescent-bench failover` (also `crescentctl bench failover`): SIGKILL the leader again and again under a
//! steady put workload; measure the time from each kill to the first
//! successful write, and check that no acknowledged write was lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use crescent_client::{Client, ClientConfig, MasterClient, ReplicateConfig};
use crescent_integration::{LocalCluster, LocalEtcd};
use serde_json::json;

#[derive(Args, Debug)]
pub struct FailoverArgs {
    /// Leader kills.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Value size of each put.
    #[arg(long, default_value_t = 1024)]
    value_size: usize,
    /// Discover masters through a local etcd (started here) instead of static peers.
    #[arg(long)]
    etcd: bool,
}

#[derive(Clone)]
struct Ack {
    key: String,
    value: Vec<u8>,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn run(args: FailoverArgs, json_out: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.kills > 0 && args.writers > 0 && args.value_size > 0,
        "arguments must be positive"
    );
    let etcd = if args.etcd {
        Some(LocalEtcd::start()?)
    } else {
        None
    };
    let mut cluster = match &etcd {
        Some(e) => LocalCluster::start_with_etcd(3, &e.endpoint, "failover", &[])?,
        None => LocalCluster::start(3, &[])?,
    };
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster.start_store("1gb", &[])?;
    cluster
        .wait_for_segments(1, Duration::from_secs(20))
        .await?;
    let masters = match &etcd {
        Some(e) => e.url("failover"),
        None => cluster.masters_arg(),
    };
    let probe = MasterClient::connect(&masters).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<Ack>>> = Arc::default();
    // (invoked, completed) of every successful put.
    let successes: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        // Degraded mode off: a locally cached put is not a cluster write.
        let client = Client::connect(ClientConfig {
            master: masters.clone(),
            degrade_after: Duration::ZERO,
            master_deadline: Duration::from_secs(10),
            ..Default::default()
        })
        .await?;
        let (stop, acked, successes) = (stop.clone(), acked.clone(), successes.clone());
        let size = args.value_size;
        tasks.push(tokio::spawn(async move {
            let cfg = ReplicateConfig {
                replica_num: 1,
                ..Default::default()
            };
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("failover/{w}/{i}");
                let value: Vec<u8> = (0..size).map(|j| (j as u64 ^ i ^ w as u64) as u8).collect();
                let invoked = Instant::now();
                if client.put(&key, &value, &cfg).await.is_ok() {
                    successes
                        .lock()
                        .expect("lock")
                        .push((invoked, Instant::now()));
                    acked.lock().expect("lock").push(Ack { key, value });
                }
                i += 1;
            }
            client
        }));
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut gaps_ms = Vec::new();
    for k in 0..args.kills {
        let (leader, _, term) = cluster.wait_for_leader(Duration::from_secs(20)).await?;
        cluster.kill(leader)?;
        let killed_at = Instant::now();
        let deadline = killed_at + Duration::from_secs(30);
        let recovered = loop {
            let first = successes
                .lock()
                .expect("lock")
                .iter()
                .filter(|(inv, _)| *inv >= killed_at)
                .map(|(_, done)| *done)
                .min();
            if let Some(done) = first {
                break done;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no write succeeded within 30 s of kill {k}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let gap = recovered.duration_since(killed_at).as_secs_f64() * 1e3;
        gaps_ms.push(gap);
        eprintln!(
            "kill {:>2}: leader {leader} (term {term}) -> first write after {gap:.0} ms",
            k + 1
        );
        // Restart it and let it catch up before the next kill, so a quorum always exists.
        cluster.restart(leader)?;
        let addr = cluster
            .by_id(leader)
            .map(|m| m.addr.clone())
            .unwrap_or_default();
        let caught_up = Instant::now() + Duration::from_secs(20);
        loop {
            let s = probe.node_status(&addr).await;
            if let Ok(s) = s {
                if s.leader_id != 0 && s.applied + 50 >= s.last_log_index && s.applied > 0 {
                    break;
                }
            }
            anyhow::ensure!(
                Instant::now() < caught_up,
                "restarted master {leader} did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut clients = Vec::new();
    for t in tasks {
        clients.push(t.await?);
    }

    // Every acknowledged write must read back, byte for byte.
    let acked = acked.lock().expect("lock").clone();
    let reader = &clients[0];
    let mut lost = Vec::new();
    for chunk in acked.chunks(256) {
        let keys: Vec<&str> = chunk.iter().map(|a| a.key.as_str()).collect();
        let got = reader.get_batch(&keys).await?;
        for (a, g) in chunk.iter().zip(got) {
            if g.as_ref().ok() != Some(&a.value) {
                lost.push(a.key.clone());
            }
        }
    }
    gaps_ms.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99, max) = (
        pct(&gaps_ms, 0.5),
        pct(&gaps_ms, 0.99),
        gaps_ms.last().copied().unwrap_or(0.0),
    );
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"kills": args.kills, "acknowledged_writes": acked.len(),
                "lost_writes": lost.len(), "unavailable_ms": {"p50": p50, "p99": p99, "max": max},
                "discovery": if args.etcd { "etcd" } else { "static peers" }})
            )?
        );
    } else {
        println!(
            "leader kills: {}   acknowledged writes: {}   lost: {}   discovery: {}",
            args.kills,
            acked.len(),
            lost.len(),
            if args.etcd { "etcd" } else { "static peers" }
        );
        println!("time from SIGKILL of the leader to the first successful write (ms): p50 {p50:.0}  p99 {p99:.0}  max {max:.0}");
        println!(
            "targets: p50 <= 1000 ms {}, p99 <= 2000 ms {}, 0 lost {}",
            if p50 <= 1000.0 { "MET" } else { "NOT MET" },
            if p99 <= 2000.0 { "MET" } else { "NOT MET" },
            if lost.is_empty() { "MET" } else { "NOT MET" }
        );
        println!("reference: Mooncake reports ~10 s to promote a standby and can lose acknowledged writes on failover");
    }
    anyhow::ensure!(
        lost.is_empty(),
        "{} acknowledged writes were lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    Ok(())
}
