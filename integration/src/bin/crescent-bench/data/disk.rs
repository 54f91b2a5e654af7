//! The `disk` and `disk-local` transports of `crescent-bench data`: gets of
//! objects the masters demoted to a store's disk segment, over TCP (`disk`)
//! or read from the store's file by a same-host client (`disk-local`), next
//! to the disk's sequential-read ceiling measured in the same run (a plain
//! loop of 1 MiB preads over a file of the same total size, in the same
//! directory as the disk segment).
//!
//! Storage below the page cache may cache too (a hypervisor's host page
//! cache serves a virtual disk's re-reads several times faster than its
//! first read, and recent writes too). So the gets and their ceiling are
//! given the same read history:
//! - `get-first`: the first read of every object since it was written,
//!   right after the first read of the ceiling's file, which is written
//!   just before the objects are put;
//! - `get` (looked up) and `get-cached` (a client with the descriptor
//!   cache), per batch size: runs of at most 64 MiB of keys, each read
//!   once untimed, dropped from the page cache and read again timed; the
//!   same-size range of the ceiling's file likewise, in the same run.
//!
//! (Reading every key once, cold, against a ceiling read just before them
//! would compare bytes last touched seconds earlier with a file read a
//! moment before, and measure the storage's memory of them: the same
//! looked-up gets read in runs as above ran 2.4x faster at batch 1, as fast
//! as the cached ones; docs/benchmarks-history.md.)
//!
//! Both are measured cold: before each measurement both files' dirty pages
//! are written back (fdatasync, so no writeback competes with the reads)
//! and the measured file's pages dropped from the page cache
//! (`posix_fadvise(POSIX_FADV_DONTNEED)`); how much of it was still resident
//! when the clock started is checked (mincore) and printed, so a file system
//! that cannot drop pages (tmpfs) shows as warm. Each row also says how many
//! times its bytes had been read in this run (`pass`), the same for the
//! gets and their ceiling.

use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use crescent_client::ReplicateConfig;
use crescent_integration::{LocalCluster, Security};
use crescent_proto::pb;
use crescent_proto::units::format_size;

use super::{pct, Credentials, Row, Run, LOCAL_LEASE_TTL};

/// Size of the filler objects put after the measured ones so that those
/// become the coldest in memory and are demoted (and of a ceiling pread).
const PIECE: u64 = 1 << 20;
/// Most rounds of fillers (one memory segment's worth each).
const MAX_FILLER_ROUNDS: u64 = 4;
/// How long the measured objects may take to all be disk replicas, from
/// the end of their puts.
const DEMOTE_BUDGET: Duration = Duration::from_secs(60);
/// How long the puts of one size may take (they wait for demotions to free
/// memory).
const PUT_BUDGET: Duration = Duration::from_secs(120);
/// Bytes still resident after dropping a file's pages above which a
/// measurement is reported as not cold (a few pages of readahead or of the
/// header do not count).
const COLD_SLACK: u64 = 4 << 20;

/// How the disk rows were measured, for the summary.
#[derive(Default)]
pub struct DiskInfo {
    /// The disk segments' directories (one per security mode).
    pub dirs: Vec<PathBuf>,
    /// Most bytes of the disk segment's file, or of the ceiling's file,
    /// resident in the page cache when a timed read started.
    pub max_resident: u64,
    /// Bytes read by the measurement in which `max_resident` was seen.
    pub resident_of: u64,
    /// Per cluster (security mode), what its leader says of its copies
    /// between tiers ([`tier_copies`]).
    pub copies: Vec<String>,
}

impl DiskInfo {
    /// Whether every measurement started with (practically) nothing cached.
    pub fn cold(&self) -> bool {
        self.max_resident <= COLD_SLACK.max(self.resident_of / 100)
    }

    pub fn cache_state(&self) -> String {
        if self.cold() {
            format!(
                "page cache cold: fdatasync + posix_fadvise(DONTNEED) on {} and on the ceiling's file before each measurement (at most {} of either resident when timing started)",
                crescent_store::disk::DISK_FILE,
                format_size(self.max_resident)
            )
        } else {
            format!(
                "NOT cold: {} of {} read was still in the page cache after posix_fadvise(DONTNEED) (tmpfs?); figures are partly or wholly warm",
                format_size(self.max_resident),
                format_size(self.resident_of)
            )
        }
    }

    fn saw(&mut self, resident: u64, of: u64) {
        if resident >= self.max_resident {
            self.max_resident = resident;
            self.resident_of = of;
        }
    }
}

/// Objects read per size (as the other rows with one client).
fn object_count(size: u64, per_run: u64, max_ops: usize) -> usize {
    ((per_run / size) as usize).clamp(4, max_ops.max(4))
}

/// The memory segment: small, so that the measured objects overflow it,
/// but four of the largest objects at least. Not smaller than 128 MiB: a
/// demoted object's memory stays held for a lease TTL (2 s), so puts that
/// overflow memory go at about half a segment per lease TTL (32 MiB made
/// 512 MiB of puts take 47 s).
fn memory_bytes(sizes: &[u64]) -> u64 {
    let largest = sizes.iter().copied().max().unwrap_or(PIECE);
    (128 << 20).max(4 * largest.next_multiple_of(PIECE))
}

/// The disk segment: the largest size's objects plus every filler round,
/// with room to stay well under the disk watermark (0.95), where disk
/// objects would be dropped. Sizes run one after the other and each
/// removes its objects before the next.
fn disk_bytes(sizes: &[u64], per_run: u64, max_ops: usize) -> u64 {
    let objects = sizes
        .iter()
        .map(|&s| s.next_multiple_of(4096) * object_count(s, per_run, max_ops) as u64)
        .max()
        .unwrap_or(0);
    let need = objects + (MAX_FILLER_ROUNDS + 1) * memory_bytes(sizes);
    (need + need / 4).next_multiple_of(PIECE) + (64 << 20)
}

/// A cluster whose one store has a small memory segment and a disk segment
/// in `dir`, its masters demoting early (the memory watermark at 0.5).
pub async fn start_cluster(
    security: Security,
    data_tls: bool,
    dir: &Path,
    sizes: &[u64],
    per_run: u64,
    max_ops: usize,
) -> anyhow::Result<LocalCluster> {
    let mut flags: Vec<String> = [
        "--lease-ttl",
        LOCAL_LEASE_TTL,
        "--eviction-high-watermark",
        "0.5",
        "--eviction-ratio",
        "0.3",
        "--demotion-timeout",
        "15s",
        // The row measures reads of disk replicas: no promotion copies
        // them back to memory while it reads.
        "--promotion-reads",
        "0",
    ]
    .map(String::from)
    .to_vec();
    if data_tls {
        // The leader copies demoted bytes from and to the store's data
        // ports, which then speak TLS only.
        flags.push("--data-tls".into());
    }
    let mut c = LocalCluster::start_as(3, &flags, security)?;
    c.wait_for_leader(Duration::from_secs(20)).await?;
    c.data_tls = data_tls;
    let (memory, disk) = (memory_bytes(sizes), disk_bytes(sizes, per_run, max_ops));
    eprintln!(
        "disk store: {} memory segment, {} disk segment in {}",
        format_size(memory),
        format_size(disk),
        dir.display()
    );
    c.start_store(
        &memory.to_string(),
        &[
            "--disk-path".to_string(),
            dir.display().to_string(),
            "--disk-size".into(),
            disk.to_string(),
            // Same-host clients may read the file (disk-local rows); the
            // TCP rows' client names another host, so it does not.
            "--shm".into(),
        ],
    )?;
    c.wait_for_segments(2, Duration::from_secs(20))
        .await
        .context("the store's memory and disk segments did not both mount")?;
    Ok(c)
}

/// What the leader of `c` says of its copies between tiers (demotions and
/// promotions): how many, how many its store made itself (COPY), and their
/// mean time and rate per object, from its `/metrics`.
pub async fn tier_copies(c: &LocalCluster, label: &str) -> String {
    let Ok((leader, _, _)) = c.wait_for_leader(Duration::from_secs(5)).await else {
        return format!("{label}: tier copies: no leader to ask");
    };
    let Some(m) = c.masters.iter().find(|m| m.id == leader) else {
        return format!("{label}: tier copies: no leader to ask");
    };
    let body = match crescent_integration::http_request(&m.http, "GET", "/metrics", &[]).await {
        Ok((200, body)) => body,
        other => return format!("{label}: tier copies: leader's /metrics: {other:?}"),
    };
    let metric = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let done = metric("master_tier_copy_seconds_count");
    let secs = metric("master_tier_copy_seconds_sum");
    let bytes = metric("master_demotion_bytes_total") + metric("master_promotion_bytes_total");
    let by_store = metric("master_tier_copies_on_store_total");
    if done == 0.0 {
        return format!("{label}: tier copies: none done");
    }
    // The leader's CPU time over its whole life (puts and lookups too): a
    // leader that copies reads and writes every byte itself.
    let cpu = m
        .pid()
        .and_then(process_cpu_secs)
        .map_or_else(|| "unknown".to_string(), |s| format!("{s:.2} s"));
    format!(
        "{label}: tier copies (leader's /metrics): {done:.0} done, {by_store:.0} of them by the store itself; mean {:.2} ms and {:.2} GB/s per object copy ({} copied, {} failed); the leader's CPU time in the run {cpu}",
        secs / done * 1e3,
        bytes / secs / 1e9,
        format_size(bytes as u64),
        metric("master_demotion_failures_total") + metric("master_promotion_failures_total")
    )
}

/// User + system CPU seconds of process `pid` (Linux `/proc`), if readable.
fn process_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses:
    // utime and stime are the 14th and 15th fields of the line.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

/// Every size and batch of the disk transport, one client, against a
/// cluster from [`start_cluster`] with its disk segment in `dir`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    args: &super::DataArgs,
    transports: &[String],
    label: &str,
    masters: &str,
    creds: &Credentials,
    dir: &Path,
    sizes: &[u64],
    per_run: u64,
    info: &mut DiskInfo,
) -> anyhow::Result<Vec<Row>> {
    let here = crescent_client::config::system_hostname();
    let remote = format!("{here}-remote");
    let mut readers = Vec::new();
    for t in transports {
        let run_at = Run {
            label,
            masters,
            creds,
            transport: if t == "disk" { "disk" } else { "disk-local" },
            hostname: if t == "disk" { &remote } else { &here },
            place_ahead: args.place_ahead,
        };
        let client = super::connect(&run_at).await?;
        readers.push((run_at, client));
    }
    // The first transport's client puts the objects (and removes them).
    let client = &readers.first().context("no disk transport")?.1;
    let run = crescent_client::master::new_client_id();
    let segment_file = dir.join(crescent_store::disk::DISK_FILE);
    let ceiling_file = dir.join(format!(".crescent-bench-ceiling-{}", std::process::id()));
    let memory = memory_bytes(sizes);
    info.dirs.push(dir.to_path_buf());
    let mut rows = Vec::new();
    for &size in sizes {
        let n = object_count(size, per_run, args.max_ops);
        let prefix = format!("bench-data/{run}/disk/{size}/");
        let keys: Vec<String> = (0..n).map(|i| format!("{prefix}t{i}")).collect();
        eprintln!(
            "{label} disk {}: putting {n} objects through a {} memory segment ...",
            format_size(size),
            format_size(memory)
        );
        // The ceiling's file is written just before the objects, so that
        // both are as old when first read (storage below the page cache
        // may keep recent writes).
        let total = size * n as u64;
        let path = ceiling_file.clone();
        tokio::task::spawn_blocking(move || write_file(&path, total))
            .await?
            .with_context(|| format!("writing the ceiling's file {}", ceiling_file.display()))?;
        let started = Instant::now();
        let value = (0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
        let put_deadline = started + PUT_BUDGET;
        let mut refused = 0;
        for k in &keys {
            refused += put_retrying(client, k, &value, put_deadline).await?;
        }
        let put_secs = started.elapsed().as_secs_f64();
        let (rounds, wait_secs) = demote_all(client, &prefix, &keys, memory).await?;
        eprintln!(
            "{label} disk {}: {n} objects put in {put_secs:.1} s ({:.0} MB/s; {refused} put attempts failed and were retried, target 0), all disk replicas {wait_secs:.1} s later ({rounds} filler round(s) of {})",
            format_size(size),
            (size * n as u64) as f64 / put_secs / 1e6,
            format_size(memory)
        );

        let measured = measure_size(
            &readers,
            &keys,
            size,
            &segment_file,
            &ceiling_file,
            args,
            info,
        )
        .await;
        let _ = std::fs::remove_file(&ceiling_file);
        rows.extend(measured?);

        // The next size needs this one's disk and memory back: removed
        // objects' space is held for a lease TTL.
        client
            .remove_by_regex(&format!("^{prefix}"), true)
            .await
            .context("removing the disk run's objects")?;
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    Ok(rows)
}

/// The rows of one size. First `get-first`: the first transport's first
/// batch size reads every object for the first time since it was written,
/// after the ceiling's file is read for the first time (written just
/// before the objects). Then, for each transport's client and each batch,
/// `get` (looked up) and `get-cached` (a fresh client with the descriptor
/// cache), each with its ceiling read in the same runs (see
/// [`paired_runs`]), so that the gets and their ceiling have the same
/// read history.
async fn measure_size(
    readers: &[(Run<'_>, crescent_client::Client)],
    keys: &[String],
    size: u64,
    segment_file: &Path,
    ceiling_file: &Path,
    args: &super::DataArgs,
    info: &mut DiskInfo,
) -> anyhow::Result<Vec<Row>> {
    let total = size * keys.len() as u64;
    let mut rows = Vec::new();
    let row = |run_at: &Run<'_>, batch, op, get: Timed, ceiling_secs: f64, pass| {
        let (elapsed, mut lat, errors) = get;
        lat.sort_unstable();
        Row {
            security: run_at.label.to_string(),
            batch,
            transport: run_at.transport.to_string(),
            size,
            clients: 1,
            op,
            ops: keys.len(),
            gbps: total as f64 / elapsed / 1e9,
            p50_ms: pct(&lat, 0.5),
            p99_ms: pct(&lat, 0.99),
            errors,
            ceiling: Some(total as f64 / ceiling_secs / 1e9),
            pass: Some(pass),
            placed_ahead: None,
        }
    };
    let (first_at, first_client) = readers.first().context("no disk transport")?;
    let first_batch = *args.batch.first().context("no batch size")?;
    eprintln!(
        "{} {} {} x1 batch {first_batch}, first read since written (cold) ...",
        first_at.label,
        first_at.transport,
        format_size(size)
    );
    let mut bufs = vec![vec![1u8; size as usize]; first_batch.min(keys.len())];
    let ceiling_secs = cold_ceiling(segment_file, ceiling_file, (0, total), false, info).await?;
    let get = cold_gets(
        first_client,
        keys,
        first_batch,
        &mut bufs,
        segment_file,
        info,
    )
    .await?;
    rows.push(row(
        first_at,
        first_batch,
        "get-first",
        get,
        ceiling_secs,
        1,
    ));
    // How many times the row's bytes (and its ceiling's) have been read in
    // this run, counting the read being timed.
    let mut pass = 1;
    let runs = readers.iter().flat_map(|(run_at, client)| {
        args.batch
            .iter()
            .flat_map(move |&b| [(run_at, client, b, false), (run_at, client, b, true)])
    });
    for (run_at, client, batch, cached) in runs {
        eprintln!(
            "{} {} {} x1 batch {batch}{} (cold) ...",
            run_at.label,
            run_at.transport,
            format_size(size),
            if cached { ", cached descriptors" } else { "" }
        );
        let mut bufs = vec![vec![1u8; size as usize]; batch.min(keys.len())];
        // A client of its own per cached row: none of its descriptors (or
        // their background renewals) left from an earlier row.
        let fresh = if cached {
            Some(super::connect_with(run_at, true).await?)
        } else {
            None
        };
        let reader = fresh.as_ref().unwrap_or(client);
        let (get, ceiling_secs) = paired_runs(
            reader,
            keys,
            batch,
            &mut bufs,
            (segment_file, ceiling_file),
            cached,
            info,
        )
        .await?;
        pass += 2;
        let op = if cached { "get-cached" } else { "get" };
        rows.push(row(run_at, batch, op, get, ceiling_secs, pass));
    }
    Ok(rows)
}

/// Seconds taken, each request's latency, and the gets that failed (or,
/// for cached rows, went to the masters).
type Timed = (f64, Vec<Duration>, usize);

/// Most bytes of a row read per run of [`paired_runs`]: a run's timed
/// reads stay well inside the leases its untimed reads took (2 s, less
/// the client's 250 ms margin), even on a slow disk.
const RUN_BYTES: usize = 64 << 20;

/// A row's gets and its ceiling, a run of keys (and the same number of the
/// ceiling file's bytes) at a time: each read once untimed (the keys
/// looked up, and with `cached` their descriptors kept), both files'
/// pages dropped, then read again timed, the ceiling's range first. The
/// gets and the ceiling thus read bytes read once just before. With
/// `cached`, a timed get that failed or asked the masters after all counts
/// as an error, once, so the row says so. Returns the gets' figures and
/// the ceiling's seconds.
async fn paired_runs(
    client: &crescent_client::Client,
    keys: &[String],
    batch: usize,
    bufs: &mut [Vec<u8>],
    (segment_file, ceiling_file): (&Path, &Path),
    cached: bool,
    info: &mut DiskInfo,
) -> anyhow::Result<(Timed, f64)> {
    let size = bufs.first().map_or(1, Vec::len).max(1);
    let per_run = (RUN_BYTES / size / batch).max(1) * batch;
    let (mut elapsed, mut lat, mut errors, mut ceiling_secs) = (0.0, Vec::new(), 0, 0.0);
    let mut at = 0u64;
    for run in keys.chunks(per_run) {
        let len = (run.len() * size) as u64;
        let (warm, _) = timed_gets(client, run, batch, bufs).await;
        anyhow::ensure!(warm == 0, "{warm} untimed gets failed");
        ceiling_secs += cold_ceiling(segment_file, ceiling_file, (at, len), true, info).await?;
        at += len;
        let before = cached_reads(client);
        let (secs, l, failed) = cold_gets(client, run, batch, bufs, segment_file, info).await?;
        let uncached = if cached {
            (run.len() - failed).saturating_sub(cached_reads(client) - before)
        } else {
            0
        };
        elapsed += secs;
        lat.extend(l);
        errors += failed + uncached;
    }
    Ok(((elapsed, lat, errors), ceiling_secs))
}

fn cached_reads(c: &crescent_client::Client) -> usize {
    c.stats
        .cached_reads
        .load(std::sync::atomic::Ordering::Relaxed) as usize
}

/// The ceiling over `len` bytes of its file from `at`: read once untimed
/// first when `warm`, then both files dropped from the page cache and the
/// range read timed; its seconds.
async fn cold_ceiling(
    segment_file: &Path,
    ceiling_file: &Path,
    (at, len): (u64, u64),
    warm: bool,
    info: &mut DiskInfo,
) -> anyhow::Result<f64> {
    let (path, segment) = (ceiling_file.to_path_buf(), segment_file.to_path_buf());
    let (secs, resident) = tokio::task::spawn_blocking(move || {
        if warm {
            pread_range(&path, at, len)?;
        }
        let resident = drop_caches(&[&segment, &path], &path)?;
        Ok::<_, anyhow::Error>((pread_range(&path, at, len)?, resident))
    })
    .await??;
    info.saw(resident, len);
    Ok(secs)
}

/// Drops `files` from the page cache: the bytes of `measured` still
/// resident after (what the next measurement may find in memory).
fn drop_caches(files: &[&Path], measured: &Path) -> anyhow::Result<u64> {
    for f in files {
        drop_cache(f)?;
    }
    resident_bytes(measured)
}

/// Every key's get, `batch` at a time, the disk segment's pages dropped
/// first: seconds taken, each request's latency, and the gets that failed.
async fn cold_gets(
    client: &crescent_client::Client,
    keys: &[String],
    batch: usize,
    bufs: &mut [Vec<u8>],
    segment_file: &Path,
    info: &mut DiskInfo,
) -> anyhow::Result<Timed> {
    let path = segment_file.to_path_buf();
    let resident = tokio::task::spawn_blocking(move || drop_caches(&[&path], &path)).await??;
    let total = bufs.first().map_or(0, Vec::len) as u64 * keys.len() as u64;
    info.saw(resident, total);
    let start = Instant::now();
    let (errors, lat) = timed_gets(client, keys, batch, bufs).await;
    Ok((start.elapsed().as_secs_f64(), lat, errors))
}

/// Gets every key, `batch` at a time: the gets that failed, and each
/// request's latency.
async fn timed_gets(
    client: &crescent_client::Client,
    keys: &[String],
    batch: usize,
    bufs: &mut [Vec<u8>],
) -> (usize, Vec<Duration>) {
    let mut lat = Vec::with_capacity(keys.len().div_ceil(batch));
    let mut errors = 0;
    for chunk in keys.chunks(batch) {
        let t = Instant::now();
        errors += if batch == 1 {
            usize::from(client.get_into(&chunk[0], &mut bufs[0]).await.is_err())
        } else {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let mut slices: Vec<&mut [u8]> = bufs
                .iter_mut()
                .take(chunk.len())
                .map(|b| b.as_mut_slice())
                .collect();
            match client.batch_get_into(&refs, &mut slices).await {
                Ok(r) => r.iter().filter(|x| x.is_err()).count(),
                Err(_) => chunk.len(),
            }
        };
        lat.push(t.elapsed());
    }
    (errors, lat)
}

/// Puts `key`, retrying while memory is full (demotion frees it) until
/// `deadline`; returns how many attempts failed before it went through
/// (whether demotion kept up with the puts).
async fn put_retrying(
    c: &crescent_client::Client,
    key: &str,
    value: &[u8],
    deadline: Instant,
) -> anyhow::Result<u64> {
    let cfg = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    let mut failed = 0;
    loop {
        match c.put(key, value, &cfg).await {
            Ok(()) => return Ok(failed),
            Err(e) if Instant::now() >= deadline => {
                return Err(anyhow::anyhow!("put {key}: {e}")
                    .context("memory never freed up: are demotions running?"))
            }
            Err(_) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(20)).await
            }
        }
    }
}

/// Puts rounds of fillers (a memory segment's worth each) until every one
/// of `keys` is a disk replica only; returns the rounds and the seconds
/// taken. Lookups lease what they find for a lease TTL (a leased object is
/// never demoted), so each round waits that long after its checks.
async fn demote_all(
    c: &crescent_client::Client,
    prefix: &str,
    keys: &[String],
    memory: u64,
) -> anyhow::Result<(u64, f64)> {
    let started = Instant::now();
    let deadline = started + DEMOTE_BUDGET;
    let filler = vec![0x5au8; PIECE as usize];
    let mut next = 0u64;
    for round in 1..=MAX_FILLER_ROUNDS {
        for _ in 0..memory / PIECE {
            put_retrying(c, &format!("{prefix}f{next}"), &filler, deadline).await?;
            next += 1;
        }
        // Demotions run in the background: give them up to 3 s.
        let poll_end = Instant::now() + Duration::from_secs(3);
        let mut in_memory;
        loop {
            in_memory = not_on_disk(c, keys).await?;
            if in_memory == 0 {
                return Ok((round, started.elapsed().as_secs_f64()));
            }
            if Instant::now() >= poll_end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{in_memory} of {} objects still had a memory replica {DEMOTE_BUDGET:?} after their puts",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(2_100)).await;
    }
    anyhow::bail!(
        "objects still had a memory replica after {MAX_FILLER_ROUNDS} rounds of {} of fillers",
        format_size(memory)
    )
}

/// How many of `keys` still have a replica other than a disk one; an
/// error if any is gone (dropped at the disk watermark, say).
async fn not_on_disk(c: &crescent_client::Client, keys: &[String]) -> anyhow::Result<usize> {
    let lists = c
        .master()
        .batch_get_replica_list(keys.to_vec())
        .await
        .context("looking up where the measured objects are")?;
    let mut in_memory = 0;
    for (k, r) in keys.iter().zip(&lists) {
        let st = r.status.clone().unwrap_or_default();
        anyhow::ensure!(
            st.error_code() == crescent_proto::ErrorCode::Ok,
            "{k} is gone ({:?}: {}): dropped instead of demoted (a failed demotion copy, a full disk)?",
            st.error_code(),
            st.message
        );
        let disk = pb::ReplicaKind::Disk as i32;
        if r.replicas.is_empty() || r.replicas.iter().any(|d| d.kind != disk) {
            in_memory += 1;
        }
    }
    Ok(in_memory)
}

/// Writes `len` bytes (not a sparse file: reading holes costs no I/O) and
/// syncs them.
fn write_file(path: &Path, len: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let chunk: Vec<u8> = (0..PIECE).map(|i| (i % 253) as u8 ^ 0xa5).collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(PIECE) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_data()?;
    Ok(())
}

/// Writes `path`'s dirty pages back and drops its pages from the page cache.
fn drop_cache(path: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.sync_data()
        .with_context(|| format!("fdatasync {}", path.display()))?;
    // SAFETY: a plain syscall on a descriptor `f` owns for the call.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc))
            .with_context(|| format!("posix_fadvise(DONTNEED) {}", path.display()));
    }
    Ok(())
}

/// Bytes of `path` in the page cache (mincore over a read-only mapping,
/// which faults nothing in).
fn resident_bytes(path: &Path) -> anyhow::Result<u64> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => 4096,
    };
    // SAFETY: a fresh shared read-only mapping of the whole file; it is only
    // passed to mincore and unmapped below, never dereferenced.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mmap {}", path.display()));
    }
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `addr..addr+len` is the mapping above; `vec` has one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping above.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err).with_context(|| format!("mincore {}", path.display()));
    }
    Ok(vec.iter().filter(|v| *v & 1 != 0).count() as u64 * page as u64)
}

/// Seconds of a sequential loop of 1 MiB preads over `len` bytes of
/// `path` from `offset`.
fn pread_range(path: &Path, offset: u64, len: u64) -> anyhow::Result<f64> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; PIECE as usize];
    let start = Instant::now();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(PIECE) as usize;
        let at = offset + done;
        f.read_exact_at(&mut buf[..n], at)
            .with_context(|| format!("pread {} at {at}", path.display()))?;
        std::hint::black_box(&buf);
        done += n as u64;
    }
    Ok(start.elapsed().as_secs_f64())
}
