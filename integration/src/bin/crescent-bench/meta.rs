//! `crescent-bench meta` (also `crescentctl bench meta`): metadata throughput and latency against real masters.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use crescent_client::MasterClient;
use crescent_integration::{LocalCluster, Security};
use crescent_proto::pb;
use crescent_proto::units::parse_size;
use serde_json::json;

#[derive(Args, Debug)]
pub struct MetaArgs {
    /// Masters to benchmark (host:port list; the token, if they need one,
    /// from CRESCENT_TOKEN_FILE: the admin token, since each run clears its
    /// keys with RemoveByRegex; TLS files from CRESCENT_TLS_CERT, _KEY and
    /// _CA). Default: spawn local 1- and 3-node clusters.
    #[arg(long)]
    masters: Option<String>,
    /// Batch sizes to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,128")]
    batch: Vec<usize>,
    /// Objects per batched run.
    #[arg(long, default_value_t = 50_000)]
    objects: usize,
    /// Objects for the unbatched (batch 1) latency run.
    #[arg(long, default_value_t = 3_000)]
    single_objects: usize,
    /// Concurrent requests in flight for batched runs (batch 1 runs one at a time,
    /// so its latency is not queueing).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Object size recorded in the metadata.
    #[arg(long, default_value = "4kb", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    value_size: u64,
    /// Where to measure the fsync floor with --masters (put it on the
    /// masters' data disk). Local clusters use their own data directory.
    #[arg(long, default_value = ".")]
    floor_dir: std::path::PathBuf,
}

struct Row {
    cluster: String,
    batch: usize,
    concurrency: usize,
    op: &'static str,
    objects: usize,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

pub async fn run(args: MetaArgs, json_out: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.batch.iter().all(|b| *b > 0),
        "--batch sizes must be positive"
    );
    anyhow::ensure!(
        args.concurrency > 0 && args.objects > 0,
        "--objects and --concurrency must be positive"
    );
    let mut rows = Vec::new();
    let mut floors = Vec::new();
    match &args.masters {
        Some(m) => {
            let token = crate::env_token()?;
            let tls = crate::env_tls()?;
            rows.extend(bench_cluster("given", m, &token, tls.as_ref(), &args).await?);
            let f = crate::floor::measure(&args.floor_dir, m, &token, tls.as_ref()).await?;
            floors.push(("given".to_string(), args.floor_dir.clone(), f));
        }
        None => {
            // One cluster at a time, so the idle one does not share the CPU.
            // The 3-node cluster three times: `--insecure`, in token mode,
            // and in token mode with mutual TLS, so the cost of checking
            // tokens and of TLS shows in the same run.
            for (n, security) in [
                (1usize, Security::Insecure),
                (3, Security::Insecure),
                (3, Security::Tokens),
                (3, Security::TokensAndTls),
            ] {
                let cluster = LocalCluster::start_as(n, &[], security)?;
                let tls = cluster.client_tls()?;
                cluster.wait_for_leader(Duration::from_secs(20)).await?;
                // The admin token: each run clears its keys with RemoveByRegex.
                let token = crescent_auth::BearerToken::from_optional_file(
                    cluster.admin_token_file().as_deref(),
                )?;
                let name = match security {
                    Security::Insecure => format!("{n}-node"),
                    Security::Tokens => format!("{n}-node-tokens"),
                    Security::TokensAndTls => format!("{n}-node-tokens-tls"),
                };
                eprintln!(
                    "benchmarking {name} cluster at {} ...",
                    cluster.masters_arg()
                );
                let masters = cluster.masters_arg();
                rows.extend(bench_cluster(&name, &masters, &token, tls.as_ref(), &args).await?);
                let f =
                    crate::floor::measure(&cluster.root, &masters, &token, tls.as_ref()).await?;
                floors.push((name, cluster.root.clone(), f));
                drop(cluster);
            }
        }
    }
    print_rows(&rows, &floors, &args, json_out);
    Ok(())
}

async fn bench_cluster(
    name: &str,
    masters: &str,
    token: &crescent_auth::BearerToken,
    tls: Option<&crescent_auth::tls::TlsFiles>,
    args: &MetaArgs,
) -> anyhow::Result<Vec<Row>> {
    let client = Arc::new(
        crate::connect_masters(masters, tls)
            .await?
            .with_token(token.clone())
            .with_tls(tls),
    );
    client.get_leader().await?;
    let run_id = crescent_client::master::new_client_id();
    let max_objects = args.objects.max(args.single_objects);
    let capacity = (max_objects as u64 * args.value_size * 4).max(1 << 30);
    let segment_key = crescent_auth::capability::SegmentKey::generate();
    let segment_id = client
        .mount_segment(
            pb::SegmentSpec {
                name: format!("bench-{run_id}"),
                endpoint: "127.0.0.1:1".into(),
                capacity,
                hostname: "bench".into(),
                shm_path: String::new(),
                ..Default::default()
            },
            &segment_key,
        )
        .await?;
    // Keep the segment alive: the leader unmounts segments of silent clients.
    let hb_client = client.clone();
    let heartbeat = tokio::spawn(async move {
        loop {
            let _ = hb_client
                .heartbeat(vec![segment_id], Duration::from_secs(1))
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    // Warm up connections, allocator and log files; not measured.
    let warm_prefix = format!("bench/{run_id}/warmup/");
    let warm_objects = (args.objects / 10).clamp(128, 10_000);
    run_phase(
        &client,
        &warm_prefix,
        warm_objects,
        128,
        warm_objects.div_ceil(128),
        args.concurrency,
        args.value_size,
        Phase::Put,
    )
    .await;
    client
        .remove_by_regex(&format!("^{}", regex_escape(&warm_prefix)), true)
        .await?;
    let mut rows = Vec::new();
    for &batch in &args.batch {
        let (objects, concurrency) = if batch == 1 {
            (args.single_objects, 1)
        } else {
            (args.objects, args.concurrency)
        };
        let prefix = format!("bench/{run_id}/{batch}/");
        let batches = objects.div_ceil(batch);
        let put = run_phase(
            &client,
            &prefix,
            objects,
            batch,
            batches,
            concurrency,
            args.value_size,
            Phase::Put,
        )
        .await;
        rows.push(to_row(name, batch, concurrency, "put", objects, put));
        let get = run_phase(
            &client,
            &prefix,
            objects,
            batch,
            batches,
            concurrency,
            args.value_size,
            Phase::Get,
        )
        .await;
        rows.push(to_row(
            name,
            batch,
            concurrency,
            "get_replica_list",
            objects,
            get,
        ));
        client
            .remove_by_regex(&format!("^{}", regex_escape(&prefix)), true)
            .await?;
    }
    heartbeat.abort();
    client.unmount_segment(segment_id, &segment_key).await?;
    Ok(rows)
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '/' || c == '-' || c == '_' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Phase {
    Put,
    Get,
}

struct PhaseResult {
    elapsed: Duration,
    latencies: Vec<Duration>,
    errors: usize,
}

fn to_row(
    cluster: &str,
    batch: usize,
    concurrency: usize,
    op: &'static str,
    objects: usize,
    r: PhaseResult,
) -> Row {
    let mut lat = r.latencies;
    lat.sort_unstable();
    Row {
        cluster: cluster.to_string(),
        batch,
        concurrency,
        op,
        objects,
        per_sec: objects as f64 / r.elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
        errors: r.errors,
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_phase(
    client: &Arc<MasterClient>,
    prefix: &str,
    objects: usize,
    batch: usize,
    batches: usize,
    concurrency: usize,
    size: u64,
    phase: Phase,
) -> PhaseResult {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let next = next.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0usize;
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    break;
                }
                let keys: Vec<String> = (b * batch..((b + 1) * batch).min(objects))
                    .map(|i| format!("{prefix}{i}"))
                    .collect();
                let t = Instant::now();
                match phase {
                    Phase::Put => {
                        // One commit per put where the master places it so
                        // (`--put-mode`, default one-commit): the PutEnd of
                        // a pending item carries its placement.
                        let ids: Vec<u64> = keys.iter().map(|_| client.new_put_id()).collect();
                        let items = keys
                            .iter()
                            .zip(&ids)
                            .map(|(k, id)| pb::PutStartItem {
                                key: k.clone(),
                                size,
                                put_id: *id,
                            })
                            .collect();
                        let cfg = pb::ReplicateConfig {
                            replica_num: 1,
                            ..Default::default()
                        };
                        match client.batch_put_start_one_commit(items, cfg.clone()).await {
                            Ok(res) => {
                                errors += res
                                    .iter()
                                    .filter(|r| !r.status.as_ref().is_none_or(|s| s.is_ok()))
                                    .count();
                                let ends = keys
                                    .iter()
                                    .zip(&ids)
                                    .zip(&res)
                                    .map(|((k, id), r)| pb::PutEndItem {
                                        key: k.clone(),
                                        checksum: 0,
                                        put_id: *id,
                                        placement: if r.pending {
                                            r.replicas.clone()
                                        } else {
                                            Vec::new()
                                        },
                                        size,
                                        ahead: false,
                                    })
                                    .collect();
                                match client.batch_put_end_placed(ends, cfg).await {
                                    Ok(st) => errors += st.iter().filter(|s| !s.is_ok()).count(),
                                    Err(_) => errors += keys.len(),
                                }
                            }
                            Err(_) => errors += keys.len(),
                        }
                    }
                    Phase::Get => match client.batch_get_replica_list(keys.clone()).await {
                        Ok(res) => {
                            errors += res
                                .iter()
                                .filter(|r| {
                                    !r.status.as_ref().is_none_or(|s| s.is_ok())
                                        || r.replicas.is_empty()
                                })
                                .count()
                        }
                        Err(_) => errors += keys.len(),
                    },
                }
                lat.push(t.elapsed());
            }
            (lat, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            latencies.extend(l);
            errors += e;
        }
    }
    PhaseResult {
        elapsed: start.elapsed(),
        latencies,
        errors,
    }
}

type Floors = [(String, std::path::PathBuf, crate::floor::Floor)];

fn print_rows(rows: &[Row], floors: &Floors, args: &MetaArgs, json_out: bool) {
    const MOONCAKE_PUTS: f64 = 30_000.0;
    const MOONCAKE_GETS: f64 = 128_000.0;
    if json_out {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"cluster": r.cluster, "batch": r.batch, "concurrency": r.concurrency, "op": r.op,
                       "objects": r.objects, "objects_per_sec": r.per_sec.round(), "p50_ms": r.p50_ms,
                       "p99_ms": r.p99_ms, "errors": r.errors})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"value_size": args.value_size, "results": v,
                "floors": floors.iter().map(|(c, _, f)| json!({"cluster": c, "floor": f.to_json()})).collect::<Vec<_>>(),
                "reference": {"mooncake_batched_puts_per_sec": MOONCAKE_PUTS, "mooncake_batched_gets_per_sec": MOONCAKE_GETS}}))
            .unwrap_or_default()
        );
        return;
    }
    println!(
        "{:<14} {:>5} {:>5} {:<17} {:>8} {:>12} {:>9} {:>9} {:>6}",
        "CLUSTER", "BATCH", "CONC", "OP", "OBJECTS", "OBJECTS/S", "P50 MS", "P99 MS", "ERRORS"
    );
    for r in rows {
        println!(
            "{:<14} {:>5} {:>5} {:<17} {:>8} {:>12.0} {:>9.3} {:>9.3} {:>6}",
            r.cluster,
            r.batch,
            r.concurrency,
            r.op,
            r.objects,
            r.per_sec,
            r.p50_ms,
            r.p99_ms,
            r.errors
        );
    }
    println!();
    println!(
        "latency is per request: one PutStart+PutEnd pair (put) or one GetReplicaList (get) of BATCH objects; value size {} B",
        args.value_size
    );
    println!("reference: Mooncake reports ~30,000 objects/s batched puts and ~128,000 objects/s batched gets for a single, unreplicated master");
    for r in rows.iter().filter(|r| r.batch > 1) {
        let (reference, target) = if r.op == "put" {
            (MOONCAKE_PUTS, 110_000.0)
        } else {
            (MOONCAKE_GETS, 250_000.0)
        };
        println!(
            "  {:<14} batch-{} {:<17} {:>10.0}/s = {:.2}x Mooncake; target {:.0}/s {}",
            r.cluster,
            r.batch,
            r.op,
            r.per_sec,
            r.per_sec / reference,
            target,
            if r.per_sec >= target {
                "MET"
            } else {
                "NOT MET"
            }
        );
    }
    // The cost of security: the same 3-node cluster with tokens, and with
    // tokens + mutual TLS, against --insecure (issue target: <= 15 % of
    // single-put latency).
    for (secured, label) in [
        ("3-node-tokens", "token mode cost"),
        ("3-node-tokens-tls", "tokens + TLS cost"),
    ] {
        for r in rows.iter().filter(|r| r.cluster == secured) {
            let Some(open) = rows
                .iter()
                .find(|o| o.cluster == "3-node" && o.batch == r.batch && o.op == r.op)
            else {
                continue;
            };
            if r.batch == 1 {
                let cost = (r.p50_ms / open.p50_ms - 1.0) * 100.0;
                let verdict = if r.op == "put" {
                    if cost <= 15.0 {
                        " (target <= +15 %: MET)"
                    } else {
                        " (target <= +15 %: NOT MET)"
                    }
                } else {
                    ""
                };
                println!(
                    "{label}: single {} p50 {:.3} ms vs {:.3} ms --insecure ({cost:+.1} %){verdict}",
                    r.op, r.p50_ms, open.p50_ms,
                );
            } else {
                println!(
                    "{label}: batch-{} {} {:.0}/s vs {:.0}/s --insecure ({:+.1} %)",
                    r.batch,
                    r.op,
                    r.per_sec,
                    open.per_sec,
                    (r.per_sec / open.per_sec - 1.0) * 100.0
                );
            }
        }
    }
    for (cluster, dir, f) in floors {
        println!("{cluster}: {}", f.describe(dir));
        for r in rows
            .iter()
            .filter(|r| &r.cluster == cluster && r.batch == 1)
        {
            if r.op == "put" {
                let what = format!("{cluster} single put (metadata only)");
                println!("{}", f.put_line(&what, r.p50_ms, r.p99_ms));
                if !cluster.starts_with("1-node") {
                    println!("{}", f.serial_flush_line(&what, r.p50_ms));
                }
            } else {
                let what = format!("{cluster} single get_replica_list");
                println!("{}", f.get_line(&what, r.p50_ms, 3.0));
            }
        }
    }
}
