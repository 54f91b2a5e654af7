//! `crescent-bench data` (also `crescentctl bench data`): put/get throughput and latency of real bytes,
//! over TCP and shared memory, against the machine's own ceilings measured in
//! the same run (loopback TCP between two sockets, single-thread memcpy), and
//! gets from disk replicas against the disk's sequential-read ceiling
//! (see [`disk`]).

mod disk;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use crescent_auth::tls::TlsFiles;
use crescent_client::{Client, ClientConfig, ReplicateConfig};
use crescent_integration::{LocalCluster, Security};
use crescent_proto::units::{format_size, parse_size};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `--lease-ttl` of the local cluster (see `run`).
const LOCAL_LEASE_TTL: &str = "2s";

#[derive(Args, Debug)]
pub struct DataArgs {
    /// Masters of an existing cluster (with stores; the admin token, if they
    /// need one, from CRESCENT_TOKEN_FILE: each run clears its keys with
    /// RemoveByRegex). Default: start 3 masters and one store (--shm) locally.
    #[arg(long)]
    masters: Option<String>,
    /// Value sizes.
    #[arg(long, value_delimiter = ',', default_value = "4kb,64kb,1mb,16mb")]
    sizes: Vec<String>,
    /// Concurrent clients.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    clients: Vec<usize>,
    /// Objects per request: 1 uses put/get_into; more uses put_batch/batch_get_into
    /// (one master round trip and one pipelined exchange per store per batch).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batch: Vec<usize>,
    /// Transports: tcp, shm, disk, disk-local. `disk` (not in the default:
    /// it starts another cluster per --security mode, overflows its memory
    /// into a disk segment and, for each batch size, reads its objects and
    /// a ceiling file of the same size with the page cache dropped)
    /// measures gets of objects demoted to a store's disk segment, one
    /// client, over TCP, against a sequential pread loop over a file of the
    /// same size in the same directory; `disk-local` the same gets by a
    /// same-host client, which reads the store's file itself (the store
    /// runs with --shm). Rows: `get-first` (the first read of the objects
    /// since written), then per batch size `get` and `get-cached` (a
    /// client with the descriptor cache): runs of keys read once untimed,
    /// dropped from the page cache and read again timed, the ceiling's
    /// file likewise in the same runs. Both need a local cluster (no
    /// --masters).
    #[arg(long, value_delimiter = ',', default_value = "tcp,shm")]
    transports: Vec<String>,
    /// Where the `disk` transport's store puts its disk segment (a fresh
    /// directory under it, removed afterwards). Default: the local cluster's
    /// temporary directory.
    #[arg(long)]
    disk_dir: Option<std::path::PathBuf>,
    /// Bytes each run moves per phase (split over clients), bounding memory and time.
    #[arg(long, default_value = "512mb")]
    bytes_per_run: String,
    /// Most operations per client per phase.
    #[arg(long, default_value_t = 2000)]
    max_ops: usize,
    /// Store segment size when starting a local cluster.
    #[arg(long, default_value = "3gb")]
    segment_size: String,
    /// Where to measure the fsync floor with --masters (put it on the
    /// masters' data disk). A local cluster uses its own data directory.
    #[arg(long, default_value = ".")]
    floor_dir: std::path::PathBuf,
    /// Security of the local cluster, one run each so their costs compare in
    /// the same run: insecure (no tokens, clear text), tokens, tokens-tls
    /// (tokens, and mutual TLS on every gRPC connection; the data port in
    /// clear text, the default), tokens-tls-data (and mutual TLS on the
    /// stores' data port too: `--data-tls`). Data-plane grants are always
    /// on. With --masters the cluster is what it is ("given"; data TLS as
    /// CRESCENT_DATA_TLS says).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "insecure,tokens-tls,tokens-tls-data"
    )]
    security: Vec<String>,
    /// Whether the clients ask for placements ahead (the client's
    /// `place_ahead`, on by default): `false` measures puts without them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    place_ahead: bool,
}

/// The credentials the benchmark's clients present.
struct Credentials {
    /// The admin token: each run clears its keys with RemoveByRegex.
    token_file: Option<std::path::PathBuf>,
    tls: Option<TlsFiles>,
    /// Mutual TLS to the stores' data ports.
    data_tls: bool,
}

/// A `--security` mode: the cluster's security, and whether its stores'
/// data ports speak TLS.
fn parse_security(name: &str) -> anyhow::Result<(Security, bool)> {
    match name {
        "insecure" => Ok((Security::Insecure, false)),
        "tokens" => Ok((Security::Tokens, false)),
        "tokens-tls" => Ok((Security::TokensAndTls, false)),
        "tokens-tls-data" => Ok((Security::TokensAndTls, true)),
        other => anyhow::bail!(
            "unknown --security {other:?} (insecure, tokens, tokens-tls, tokens-tls-data)"
        ),
    }
}

struct Row {
    security: String,
    batch: usize,
    transport: String,
    size: u64,
    clients: usize,
    op: &'static str,
    ops: usize,
    gbps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
    /// This row's own ceiling in GB/s, measured next to it (disk rows);
    /// `None`: the transport's ceiling measured at the start.
    ceiling: Option<f64>,
    /// Disk rows: the how-manieth read of these bytes (and of the
    /// ceiling's) in this run; 1: the first since they were written.
    pass: Option<usize>,
    /// Single puts: how many wrote into a placement made ahead (one
    /// master round trip; the client's `place_ahead`).
    placed_ahead: Option<usize>,
}

/// The `p` quantile of `sorted` latencies, in ms (0 for none).
pub(crate) fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// Loopback TCP ceiling: one socket streaming to another, 1 MiB writes and reads.
async fn loopback_ceiling() -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let total: usize = 2 << 30;
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<usize, std::io::Error>(got)
    });
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let chunk = vec![7u8; 1 << 20];
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&chunk).await?;
        sent += chunk.len();
    }
    s.shutdown().await?;
    let got = reader.await??;
    Ok(got as f64 / start.elapsed().as_secs_f64() / 1e9)
}

/// What a data-plane grant costs one transfer, in microseconds (median of
/// 20 rounds of 5,000): the master signs it (HMAC-SHA256 over 55 bytes with
/// the segment's prepared key) and the store checks it (the same HMAC, a
/// constant-time compare, range and expiry). Both run on one core here; in
/// a cluster they run on different machines.
fn grant_cost_us() -> f64 {
    use crescent_auth::capability::{Access, Capability, SegmentKey};
    let signer = SegmentKey::generate().signer();
    let mut rounds = Vec::new();
    for round in 0..20u64 {
        let start = Instant::now();
        for i in 0..5_000u64 {
            let cap = Capability {
                segment_id: 1,
                offset: (round * 5_000 + i) << 12,
                len: 4096,
                access: Access::Read,
                expiry_ms: u64::MAX,
            };
            let mac = signer.sign(std::hint::black_box(&cap));
            let ok = signer.check(&cap, &mac, 1, Access::Read, cap.offset, 4096, 0, 0);
            std::hint::black_box(ok).expect("own grant verifies");
        }
        rounds.push(start.elapsed().as_secs_f64() * 1e6 / 5_000.0);
    }
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

/// Single-thread memcpy bandwidth over buffers larger than the caches.
fn memcpy_ceiling() -> f64 {
    let len = 256 << 20;
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src); // fault the pages in first
    let rounds = 8;
    let start = Instant::now();
    for _ in 0..rounds {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (len * rounds) as f64 / start.elapsed().as_secs_f64() / 1e9
}

pub async fn run(args: DataArgs, json_out: bool) -> anyhow::Result<()> {
    let sizes: Vec<u64> = args
        .sizes
        .iter()
        .map(|s| parse_size(s).map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(sizes.iter().all(|s| *s > 0), "sizes must be positive");
    anyhow::ensure!(
        args.clients.iter().all(|c| *c > 0),
        "--clients must be positive"
    );
    anyhow::ensure!(
        args.batch.iter().all(|b| *b > 0),
        "--batch must be positive"
    );
    for t in &args.transports {
        anyhow::ensure!(
            ["tcp", "shm", "disk", "disk-local"].contains(&t.as_str()),
            "unknown transport {t:?} (tcp, shm, disk, disk-local)"
        );
    }
    let (disk_transports, memory_transports): (Vec<String>, Vec<String>) = args
        .transports
        .iter()
        .cloned()
        .partition(|t| t.starts_with("disk"));
    let with_disk = !disk_transports.is_empty();
    anyhow::ensure!(
        !(with_disk && args.masters.is_some()),
        "--transports disk starts its own cluster (a store with a disk segment): not with --masters"
    );
    let per_run = parse_size(&args.bytes_per_run).map_err(|e| anyhow::anyhow!("{e}"))?;
    let segment_bytes = parse_size(&args.segment_size).map_err(|e| anyhow::anyhow!("{e}"))?;

    eprintln!("measuring ceilings ...");
    let tcp_ceiling = loopback_ceiling().await?;
    let memcpy = tokio::task::spawn_blocking(memcpy_ceiling).await?;
    let grant_us = tokio::task::spawn_blocking(grant_cost_us).await?;
    eprintln!("loopback TCP {tcp_ceiling:.2} GB/s, memcpy {memcpy:.2} GB/s, grant sign+check {grant_us:.2} us");

    let modes: Vec<(String, Option<(Security, bool)>)> = match &args.masters {
        Some(_) => vec![("given".to_string(), None)],
        None => args
            .security
            .iter()
            .map(|name| Ok((name.clone(), Some(parse_security(name)?))))
            .collect::<anyhow::Result<_>>()?,
    };
    anyhow::ensure!(!modes.is_empty(), "--security needs at least one mode");
    let mut rows = Vec::new();
    let mut first_floor = None;
    let mut disk_info = disk::DiskInfo::default();
    for (label, security) in modes {
        if !memory_transports.is_empty() {
            // This mode's cluster stops at the end of the block, before a
            // disk cluster starts.
            let (_cluster, masters, floor_dir, creds) = match security {
                None => (
                    None,
                    args.masters.clone().unwrap_or_default(),
                    args.floor_dir.clone(),
                    Credentials {
                        token_file: std::env::var_os("CRESCENT_TOKEN_FILE").map(Into::into),
                        tls: crate::env_tls()?,
                        data_tls: crescent_client::ClientConfig::from_env()?.data_tls,
                    },
                ),
                Some((security, data_tls)) => {
                    eprintln!("starting a local 3-master cluster ({label}) ...");
                    // A removed object's space stays held for one lease TTL
                    // (readers may still hold its descriptor); 2 s instead of
                    // 10 s lets the next run reuse a big run's space after a
                    // short wait (below).
                    let mut c = LocalCluster::start_as(
                        3,
                        &["--lease-ttl".into(), LOCAL_LEASE_TTL.into()],
                        security,
                    )?;
                    c.wait_for_leader(Duration::from_secs(20)).await?;
                    c.data_tls = data_tls;
                    c.start_store(&args.segment_size, &["--shm".to_string()])?;
                    c.wait_for_segments(1, Duration::from_secs(20)).await?;
                    let m = c.masters_arg();
                    let dir = c.root.clone();
                    let creds = Credentials {
                        token_file: c.admin_token_file(),
                        tls: c.client_tls()?,
                        data_tls,
                    };
                    (Some(c), m, dir, creds)
                }
            };
            measure_floor_once(&mut first_floor, &floor_dir, &masters, &creds).await?;
            rows.extend(
                run_mode(
                    &args,
                    &memory_transports,
                    &label,
                    &masters,
                    &creds,
                    &sizes,
                    per_run,
                    segment_bytes,
                )
                .await?,
            );
        }
        if let (true, Some((security, data_tls))) = (with_disk, security) {
            eprintln!("starting a local 3-master cluster with a disk store ({label}) ...");
            // Declared before the cluster, so removed after its store stopped.
            let parent = match &args.disk_dir {
                Some(d) => d.clone(),
                None => std::env::temp_dir(),
            };
            let dir = tempfile::Builder::new()
                .prefix("crescent-bench-disk-")
                .tempdir_in(&parent)
                .with_context(|| format!("creating a disk directory under {}", parent.display()))?;
            let c = disk::start_cluster(
                security,
                data_tls,
                dir.path(),
                &sizes,
                per_run,
                args.max_ops,
            )
            .await?;
            let masters = c.masters_arg();
            let creds = Credentials {
                token_file: c.admin_token_file(),
                tls: c.client_tls()?,
                data_tls,
            };
            measure_floor_once(&mut first_floor, &c.root, &masters, &creds).await?;
            rows.extend(
                disk::run(
                    &args,
                    &disk_transports,
                    &label,
                    &masters,
                    &creds,
                    dir.path(),
                    &sizes,
                    per_run,
                    &mut disk_info,
                )
                .await?,
            );
            disk_info.copies.push(disk::tier_copies(&c, &label).await);
            drop(c);
        }
    }
    let Some((floor, floor_dir)) = first_floor else {
        anyhow::bail!("no run");
    };
    print(
        &rows,
        tcp_ceiling,
        memcpy,
        grant_us,
        (floor, &floor_dir),
        with_disk.then_some(&disk_info),
        json_out,
    );
    Ok(())
}

/// Measures the floor (fsync in `dir`, gRPC round trip to `masters`) on the
/// first cluster of the run only.
async fn measure_floor_once(
    first_floor: &mut Option<(crate::floor::Floor, std::path::PathBuf)>,
    dir: &std::path::Path,
    masters: &str,
    creds: &Credentials,
) -> anyhow::Result<()> {
    if first_floor.is_none() {
        let token = crescent_auth::BearerToken::from_optional_file(creds.token_file.as_deref())?;
        let floor = crate::floor::measure(dir, masters, &token, creds.tls.as_ref()).await?;
        eprintln!("{}", floor.describe(dir));
        *first_floor = Some((floor, dir.to_path_buf()));
    }
    Ok(())
}

/// Every transport (of `transports`), size, batch and client count against
/// one cluster.
#[allow(clippy::too_many_arguments)]
async fn run_mode(
    args: &DataArgs,
    transports: &[String],
    label: &str,
    masters: &str,
    creds: &Credentials,
    sizes: &[u64],
    per_run: u64,
    segment_bytes: u64,
) -> anyhow::Result<Vec<Row>> {
    let host = crescent_client::config::system_hostname();
    let mut rows = Vec::new();
    for transport in transports {
        for &size in sizes {
            for &batch in &args.batch {
                for &clients in &args.clients {
                    eprintln!(
                        "{label} {transport} {} x{clients} batch {batch} ...",
                        format_size(size)
                    );
                    // A client that believes it is on another host never maps shared memory.
                    let hostname = if transport == "shm" {
                        host.clone()
                    } else {
                        format!("{host}-remote")
                    };
                    let ops = ((per_run / size) as usize / clients).clamp(4, args.max_ops);
                    let ops = ops.div_ceil(batch) * batch;
                    let run = Run {
                        label,
                        masters,
                        creds,
                        transport,
                        hostname: &hostname,
                        place_ahead: args.place_ahead,
                    };
                    rows.extend(run_one(&run, size, clients, ops, batch).await?);
                    // Wait for a big run's removed space to be released, or
                    // the next run finds the segment full (NO_AVAILABLE_HANDLE
                    // counted as errors). Not timed.
                    let moved = size * (ops * clients) as u64;
                    if args.masters.is_none() && moved >= segment_bytes / 4 {
                        tokio::time::sleep(Duration::from_millis(2_500)).await;
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// Where and how one run connects.
struct Run<'a> {
    label: &'a str,
    masters: &'a str,
    creds: &'a Credentials,
    transport: &'a str,
    hostname: &'a str,
    place_ahead: bool,
}

/// A client as `run_at` says (its credentials, its host name).
async fn connect(run_at: &Run<'_>) -> anyhow::Result<Client> {
    connect_with(run_at, false).await
}

/// [`connect`], with the descriptor cache on or off.
async fn connect_with(run_at: &Run<'_>, descriptor_cache: bool) -> anyhow::Result<Client> {
    let tls = run_at.creds.tls.as_ref();
    Ok(Client::connect(ClientConfig {
        master: run_at.masters.to_string(),
        local_hostname: run_at.hostname.to_string(),
        token_file: run_at.creds.token_file.clone(),
        tls_cert: tls.map(|t| t.cert.clone()),
        tls_key: tls.map(|t| t.key.clone()),
        tls_ca: tls.map(|t| t.ca.clone()),
        data_tls: run_at.creds.data_tls,
        descriptor_cache,
        place_ahead: run_at.place_ahead,
        ..Default::default()
    })
    .await?)
}

/// Single gets (one client) of keys this client read a moment before, with
/// the descriptor cache on: each timed get reads the bytes with no master
/// call. Each key is first read untimed (its lookup, which leases it).
async fn cached_gets(run_at: &Run<'_>, prefix: &str, size: u64, ops: usize) -> anyhow::Result<Row> {
    let c = connect_with(run_at, true).await?;
    let mut buf = vec![1u8; size as usize];
    let mut lat = Vec::with_capacity(ops);
    let mut errors = 0;
    for i in 0..ops {
        let key = format!("{prefix}{i}");
        errors += usize::from(c.get_into(&key, &mut buf).await.is_err());
        let t = Instant::now();
        // A failed get is no cached read: counted below.
        let _ = c.get_into(&key, &mut buf).await;
        lat.push(t.elapsed());
    }
    let timed: Duration = lat.iter().sum();
    let cached = c
        .stats
        .cached_reads
        .load(std::sync::atomic::Ordering::Relaxed) as usize;
    // A timed get that failed, or had to ask the masters (its lease nearly
    // over), is not a cached one: counted as an error, so the row says so.
    errors += ops.saturating_sub(cached);
    lat.sort_unstable();
    Ok(Row {
        security: run_at.label.to_string(),
        batch: 1,
        transport: run_at.transport.to_string(),
        size,
        clients: 1,
        op: "get-cached",
        ops,
        gbps: ops as f64 * size as f64 / timed.as_secs_f64().max(1e-9) / 1e9,
        p50_ms: pct(&lat, 0.5),
        p99_ms: pct(&lat, 0.99),
        errors,
        ceiling: None,
        pass: None,
        placed_ahead: None,
    })
}

async fn run_one(
    run_at: &Run<'_>,
    size: u64,
    clients: usize,
    ops: usize,
    batch: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut handles = Vec::new();
    for _ in 0..clients {
        handles.push(Arc::new(connect(run_at).await?));
    }
    let run = crescent_client::master::new_client_id();
    let value = Arc::new((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let mut out = Vec::new();
    for op in ["put", "get"] {
        // Read buffers are allocated and faulted in before the clock starts:
        // at 16 MiB x 128 they are 2 GiB per client, and allocating them in
        // the timed part once halved the batch-128 rows.
        let mut client_bufs: Vec<Vec<Vec<u8>>> = (0..handles.len())
            .map(|_| {
                if op == "get" {
                    vec![vec![1u8; value.len()]; batch]
                } else {
                    Vec::new()
                }
            })
            .collect();
        let ahead_used = || -> usize {
            handles
                .iter()
                .map(|c| {
                    c.stats
                        .ahead
                        .used
                        .load(std::sync::atomic::Ordering::Relaxed) as usize
                })
                .sum()
        };
        let ahead_before = ahead_used();
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (ci, c) in handles.iter().enumerate() {
            let c = c.clone();
            let value = value.clone();
            let prefix = format!("bench-data/{run}/{ci}/");
            let mut bufs = std::mem::take(&mut client_bufs[ci]);
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(ops);
                let mut errors = 0;
                let cfg = ReplicateConfig {
                    replica_num: 1,
                    ..Default::default()
                };
                for first in (0..ops).step_by(batch) {
                    let keys: Vec<String> = (first..first + batch)
                        .map(|i| format!("{prefix}{i}"))
                        .collect();
                    let t = Instant::now();
                    let failed = if batch == 1 {
                        let ok = if op == "put" {
                            c.put(&keys[0], &value, &cfg).await.is_ok()
                        } else {
                            c.get_into(&keys[0], &mut bufs[0]).await.is_ok()
                        };
                        usize::from(!ok)
                    } else {
                        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                        if op == "put" {
                            let items: Vec<(&str, &[u8])> =
                                refs.iter().map(|k| (*k, value.as_slice())).collect();
                            match c.put_batch(&items, &cfg).await {
                                Ok(r) => r.iter().filter(|x| x.is_err()).count(),
                                Err(_) => batch,
                            }
                        } else {
                            let mut slices: Vec<&mut [u8]> =
                                bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                            match c.batch_get_into(&refs, &mut slices).await {
                                Ok(r) => r.iter().filter(|x| x.is_err()).count(),
                                Err(_) => batch,
                            }
                        }
                    };
                    lat.push(t.elapsed());
                    errors += failed;
                }
                (lat, errors)
            }));
        }
        let mut lat = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (l, e) = t.await?;
            lat.extend(l);
            errors += e;
        }
        let elapsed = start.elapsed().as_secs_f64();
        lat.sort_unstable();
        out.push(Row {
            security: run_at.label.to_string(),
            batch,
            transport: run_at.transport.to_string(),
            size,
            clients,
            op,
            ops: ops * clients,
            gbps: (ops * clients) as f64 * size as f64 / elapsed / 1e9,
            p50_ms: pct(&lat, 0.5),
            p99_ms: pct(&lat, 0.99),
            errors,
            ceiling: None,
            pass: None,
            placed_ahead: (op == "put").then(|| ahead_used() - ahead_before),
        });
    }
    if batch == 1 && run_at.transport == "tcp" {
        let prefix = format!("bench-data/{run}/0/");
        out.push(cached_gets(run_at, &prefix, size, ops).await?);
    }
    handles[0]
        .remove_by_regex(&format!("^bench-data/{run}/"), true)
        .await?;
    Ok(out)
}

fn print(
    rows: &[Row],
    tcp_ceiling: f64,
    memcpy: f64,
    grant_us: f64,
    (floor, floor_dir): (crate::floor::Floor, &std::path::Path),
    disk: Option<&disk::DiskInfo>,
    json_out: bool,
) {
    let ceiling = |r: &Row| {
        r.ceiling.unwrap_or(if r.transport == "tcp" {
            tcp_ceiling
        } else {
            memcpy
        })
    };
    if json_out {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"security": r.security, "transport": r.transport, "batch": r.batch, "size": r.size, "clients": r.clients, "op": r.op, "ops": r.ops,
                       "gb_per_s": r.gbps, "ceiling_gb_per_s": ceiling(r), "ratio_of_ceiling": r.gbps / ceiling(r),
                       "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "errors": r.errors, "disk_read_pass": r.pass,
                       "placed_ahead": r.placed_ahead})
            })
            .collect();
        let disk = disk.map(|d| {
            json!({"dirs": d.dirs, "cold": d.cold(), "cache_state": d.cache_state(),
                   "max_resident_bytes_when_timing_started": d.max_resident,
                   "ceiling": "sequential 1 MiB preads over a file of the row's total size, in the disk segment's directory, measured before the row"})
        });
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"loopback_tcp_gb_per_s": tcp_ceiling, "memcpy_gb_per_s": memcpy,
                "grant_sign_and_check_us": grant_us, "floor": floor.to_json(), "disk": disk, "results": v})
            )
            .unwrap_or_default()
        );
        return;
    }
    println!("ceilings: loopback TCP {tcp_ceiling:.2} GB/s (two local sockets), memcpy {memcpy:.2} GB/s (one thread)");
    if let Some(d) = disk {
        let dirs: Vec<String> = d.dirs.iter().map(|p| p.display().to_string()).collect();
        println!(
            "  disk rows: ceiling = sequential 1 MiB preads over a file of the row's size next to the disk segment, written just before the objects (its own GB/s in DISK GB/S); segment in {}",
            dirs.join(", ")
        );
        println!("  get-first: the first read of the objects since written, after the ceiling's first read; get and get-cached: runs of up to");
        println!("  64 MiB of keys, each read untimed, dropped from the page cache and read again timed, the ceiling's file likewise in the same runs");
        println!("  disk cache state: {}", d.cache_state());
        for copies in &d.copies {
            println!("  {copies}");
        }
        println!("  storage below the page cache (a VM host's cache) may serve re-reads faster: PASS is the how-manieth read");
        println!("  of the row's bytes in this run, the same for its gets and its ceiling (1: first read since written)");
    }
    println!(
        "{:<15} {:<10} {:>9} {:>5} {:>4} {:<10} {:>7} {:>8} {:>9} {:>9} {:>9} {:>6} {:>10} {:>4}",
        "SECURITY",
        "XPORT",
        "SIZE",
        "BATCH",
        "CLI",
        "OP",
        "OPS",
        "GB/S",
        "CEILING%",
        "P50 MS",
        "P99 MS",
        "ERRORS",
        "DISK GB/S",
        "PASS"
    );
    for r in rows {
        println!(
            "{:<15} {:<10} {:>9} {:>5} {:>4} {:<10} {:>7} {:>8.3} {:>8.1}% {:>9.3} {:>9.3} {:>6} {:>10} {:>4}",
            r.security,
            r.transport,
            format_size(r.size),
            r.batch,
            r.clients,
            r.op,
            r.ops,
            r.gbps,
            100.0 * r.gbps / ceiling(r),
            r.p50_ms,
            r.p99_ms,
            r.errors,
            r.ceiling.map(|c| format!("{c:.3}")).unwrap_or_default(),
            r.pass.map(|p| p.to_string()).unwrap_or_default()
        );
    }
    println!();
    println!("insecure: no tokens, clear-text gRPC and data port; tokens-tls: tokens, and mutual TLS on every");
    println!("gRPC connection (data port clear text, the default); tokens-tls-data: and mutual TLS on the stores'");
    println!("data port (--data-tls; TCP and disk rows; shm and disk-local rows copy without a socket, no TLS);");
    println!("data-plane grants are checked in every mode");
    println!("every request includes its master round trip (PutStart+PutEnd, or GetReplicaList) and crc32c of the values,");
    println!("but get-cached: its key's descriptor is this client's from a lookup moments before (no master call);");
    println!("latency is per request (BATCH objects)");
    let best = |t: &str, size: u64| {
        rows.iter()
            .filter(|r| r.transport == t && r.size == size && r.op == "get")
            .map(|r| r.gbps)
            .fold(0.0, f64::max)
    };
    if rows
        .iter()
        .any(|r| r.transport == "tcp" && r.size == 1 << 20)
    {
        let g = best("tcp", 1 << 20);
        println!(
            "  1 MiB gets over TCP: best {g:.2} GB/s = {:.0}% of loopback; target 70% {}",
            100.0 * g / tcp_ceiling,
            if g >= 0.7 * tcp_ceiling {
                "MET"
            } else {
                "NOT MET"
            }
        );
    }
    let cold = if disk.is_some_and(disk::DiskInfo::cold) {
        "both page-cache cold"
    } else {
        "NOT page-cache cold"
    };
    for r in rows
        .iter()
        .filter(|r| r.transport.starts_with("disk") && r.size == 1 << 20 && r.op.starts_with("get"))
    {
        let c = ceiling(r);
        let how = match (r.transport.as_str(), r.op) {
            ("disk", "get-first") => "over TCP, first read since written",
            ("disk", "get") => "over TCP",
            ("disk", _) => "over TCP, cached descriptors: no master call",
            (_, "get-first") => "same host, the client preads the file, first read since written",
            (_, "get") => "same host, the client preads the file",
            _ => "same host, the client preads the file, cached descriptors: no master call",
        };
        let met = if r.errors > 0 {
            "NOT MET (gets failed or went uncached: ERRORS)"
        } else if r.gbps >= 0.6 * c {
            "MET"
        } else {
            "NOT MET"
        };
        println!(
            "  1 MiB gets from disk replicas ({how}, {}, batch {}, pass {}): {:.2} GB/s = {:.0}% of sequential pread {c:.2} GB/s ({cold}); target 60% {met}",
            r.security,
            r.batch,
            r.pass.unwrap_or(0),
            r.gbps,
            100.0 * r.gbps / c,
        );
    }
    if rows.iter().any(|r| r.transport == "shm") {
        let g = rows
            .iter()
            .filter(|r| r.transport == "shm" && r.op == "get")
            .map(|r| r.gbps)
            .fold(0.0, f64::max);
        println!(
            "  shared-memory gets: best {g:.2} GB/s = {:.0}% of memcpy; target 50% {}",
            100.0 * g / memcpy,
            if g >= 0.5 * memcpy { "MET" } else { "NOT MET" }
        );
    }
    println!("{}", floor.describe(floor_dir));
    // Grants cannot be switched off, so their cost is measured directly:
    // one sign (master) and one check (store) per TCP transfer.
    println!("  data-plane grant (same run): sign + check {grant_us:.2} us per TCP transfer");
    for r in rows.iter().filter(|r| {
        r.transport == "tcp" && r.op == "get" && r.clients == 1 && r.batch == 1 && r.p50_ms > 0.0
    }) {
        println!(
            "    = {:.2}% of a {} TCP get's p50 ({:.3} ms); target for TLS + grants <= 10%",
            100.0 * grant_us / (r.p50_ms * 1000.0),
            format_size(r.size),
            r.p50_ms
        );
    }
    for r in rows
        .iter()
        .filter(|r| r.transport == "tcp" && r.size == 4096 && r.clients == 1 && r.batch == 1)
    {
        if r.op == "put" {
            println!(
                "{}",
                floor.put_line("4 KiB put over TCP, one client:", r.p50_ms, r.p99_ms)
            );
            println!(
                "{}",
                match r.placed_ahead {
                    // Most puts placed ahead: no PutStart round trip.
                    Some(n) if 2 * n > r.ops => floor.serial_flush_line_of(
                        "4 KiB put over TCP, one client:",
                        r.p50_ms,
                        3,
                        ", the put placed ahead",
                    ),
                    _ => floor.serial_flush_line("4 KiB put over TCP, one client:", r.p50_ms),
                }
            );
        } else if r.op == "get" {
            println!(
                "{}",
                floor.get_line("4 KiB get over TCP, one client:", r.p50_ms, 3.0)
            );
        } else {
            let what = "4 KiB get over TCP, one client, cached descriptor (no master call):";
            println!("{}", floor.get_line(what, r.p50_ms, 2.0));
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.transport == "tcp" && r.clients == 1 && r.op == "put")
    {
        if let Some(n) = r.placed_ahead {
            println!(
                "  {} puts over TCP, one client, batch {}: {n} of {} placed ahead (no PutStart for them)",
                format_size(r.size),
                r.batch,
                r.ops
            );
        }
        if r.size == 1 << 20 {
            let share = r.gbps / tcp_ceiling;
            println!(
                "  1 MiB puts over TCP, one client, batch {}: {:.3} GB/s = {:.1}% of loopback; target 20% {}",
                r.batch,
                r.gbps,
                100.0 * share,
                if share >= 0.2 { "MET" } else { "NOT MET" }
            );
        }
    }
    if let Some(r) = rows.iter().find(|r| {
        r.transport == "tcp" && r.size == 4096 && r.clients == 1 && r.batch == 1 && r.op == "get"
    }) {
        println!(
            "  4 KiB get p99 with one client over TCP: {:.3} ms; target 1 ms {}",
            r.p99_ms,
            if r.p99_ms <= 1.0 { "MET" } else { "NOT MET" }
        );
    }
    print_security_cost(rows);
}

/// Each secured run next to the same run against the insecure cluster
/// (same transport, size, batch and clients), over TCP. Targets:
/// TLS + grants cost <= 10 % of 1 MiB get throughput and <= 15 % of a
/// single put's latency.
fn print_security_cost(rows: &[Row]) {
    let secured = rows
        .iter()
        .filter(|r| r.security != "insecure" && r.security != "given" && r.transport == "tcp");
    for r in secured {
        let Some(open) = rows.iter().find(|o| {
            o.security == "insecure"
                && o.transport == r.transport
                && o.size == r.size
                && o.batch == r.batch
                && o.clients == r.clients
                && o.op == r.op
        }) else {
            continue;
        };
        let throughput_cost = (1.0 - r.gbps / open.gbps) * 100.0;
        let latency_cost = (r.p50_ms / open.p50_ms - 1.0) * 100.0;
        let verdict = |cost: f64, target: f64| {
            if cost <= target {
                format!("target <= {target:.0} %: MET")
            } else {
                format!("target <= {target:.0} %: NOT MET")
            }
        };
        let target = match (r.op, r.size, r.batch, r.clients) {
            ("get", s, _, _) if s == 1 << 20 => {
                format!("; throughput {}", verdict(throughput_cost, 10.0))
            }
            ("put", _, 1, 1) => format!("; latency {}", verdict(latency_cost, 15.0)),
            _ => String::new(),
        };
        println!(
            "{} cost: tcp {} batch {} x{} {}: {:.3} vs {:.3} GB/s insecure ({:+.1} % throughput), p50 {:.3} vs {:.3} ms ({:+.1} %){target}",
            r.security,
            format_size(r.size),
            r.batch,
            r.clients,
            r.op,
            r.gbps,
            open.gbps,
            -throughput_cost,
            r.p50_ms,
            open.p50_ms,
            latency_cost,
        );
    }
}
