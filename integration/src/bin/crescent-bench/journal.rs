//! `crescent-bench journal`: the masters' Raft log file alone, under a
//! workload that keeps it compacting. Each step is what the store's log
//! writer does per batch: one journal write (pwrite + fdatasync), then its
//! between-batches compaction check. A step's time is what the next Raft
//! request waits for the writer, so its tail shows compaction stalls.
//! Printed beside the floor measured in the same run and directory: a
//! 4 KiB write + fdatasync.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use crescent_proto::units::parse_size;
use crescent_raft::journal::{lock_dir, Journal, Record};
use serde_json::json;

use crate::data::pct;

#[derive(Args, Debug)]
pub struct JournalArgs {
    /// Directory to put the scratch journal in (put it on the masters'
    /// data disk); a temporary directory inside it is removed afterwards.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Bytes per log entry.
    #[arg(long, default_value = "16kb", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    entry_size: u64,
    /// Entries kept live; older ones are purged as a snapshotting Raft
    /// store purges them. With the defaults, 16 MB live, as the masters of
    /// a 30-minute soak had after compacting.
    #[arg(long, default_value_t = 1_000)]
    live_entries: u64,
    /// Steps (one entry each) to run.
    #[arg(long, default_value_t = 14_000)]
    writes: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub async fn run(args: JournalArgs, as_json: bool) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args, as_json)).await?
}

fn run_blocking(args: JournalArgs, as_json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.entry_size > 0, "--entry-size must be positive");
    anyhow::ensure!(args.live_entries > 0, "--live-entries must be positive");
    anyhow::ensure!(
        args.entry_size <= 64 << 20,
        "--entry-size is at most 64mb here"
    );
    let scratch = tempfile::Builder::new()
        .prefix(".crescent-bench-journal-")
        .tempdir_in(&args.dir)?;
    let floor = crate::floor::fsync_4k_p50(scratch.path(), 300)?;
    let (mut journal, _) = Journal::open(lock_dir(scratch.path())?, scratch.path(), "purged")?;
    let entry = vec![0xa5u8; args.entry_size as usize];
    let mut steps = Vec::with_capacity(args.writes as usize);
    let mut slowest_at = 0;
    // Steps that put a compacted file in place, and steps that grew the
    // file by a zeroed chunk.
    let (mut installs, mut growths) = (Vec::new(), Vec::new());
    // At each of those switches: bytes of batches the writer carried over
    // itself (the copy's thread carried the rest).
    let mut writer_carries = Vec::new();
    let started = Instant::now();
    for index in 1..=args.writes {
        let purge = index.checked_sub(args.live_entries).filter(|p| *p > 0);
        let mut records = vec![Record::Entry(index, &entry[..])];
        let purged_id = purge.map(|p| p.to_le_bytes());
        if let (Some(p), Some(id)) = (purge, purged_id.as_ref()) {
            records.push(Record::PurgeUpTo(p, id));
        }
        let (compactions_before, zeroed_before) = (journal.compactions(), journal.zeroed_len());
        let t = Instant::now();
        journal.write(&records)?;
        journal.compact_if_worth_it()?;
        let took = t.elapsed();
        if journal.compactions() > compactions_before {
            installs.push(took);
            writer_carries.push(journal.last_writer_carry());
        } else if journal.zeroed_len() > zeroed_before {
            growths.push(took);
        }
        if steps.iter().all(|s| *s <= took) {
            slowest_at = index;
        }
        steps.push(took);
    }
    let total = started.elapsed();
    let compactions = journal.compactions();
    drop(journal);
    let mut sorted = steps.clone();
    sorted.sort_unstable();
    let over = |limit_ms: f64| steps.iter().filter(|s| ms(**s) >= limit_ms).count();
    let max = pct(&sorted, 1.0);
    let written = args.writes * args.entry_size;
    if as_json {
        println!(
            "{}",
            json!({
                "fsync_4k_p50_ms": floor,
                "entry_size": args.entry_size, "live_entries": args.live_entries,
                "writes": args.writes, "bytes_written": written,
                "compactions": compactions,
                "step_p50_ms": pct(&sorted, 0.5), "step_p99_ms": pct(&sorted, 0.99),
                "step_p999_ms": pct(&sorted, 0.999), "step_max_ms": max,
                "steps_over_10ms": over(10.0), "steps_over_100ms": over(100.0),
                "install_steps_ms": installs.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
                "install_writer_carried_bytes": writer_carries,
                "growth_step_max_ms": growths.iter().copied().max().map(ms),
                "seconds": total.as_secs_f64(),
            })
        );
        return Ok(());
    }
    println!(
        "floor (same run): 4 KiB append + fdatasync p50 {floor:.3} ms in {} (the file grows; the journal overwrites zeroed blocks, so a step can beat it)",
        args.dir.display()
    );
    println!(
        "journal: {} steps of one {} B entry (+ a purge keeping {} live), {:.0} MB written in {:.1} s, {compactions} compactions",
        args.writes,
        args.entry_size,
        args.live_entries,
        written as f64 / 1e6,
        total.as_secs_f64()
    );
    let p50 = pct(&sorted, 0.5);
    for (name, v) in [
        ("p50", p50),
        ("p99", pct(&sorted, 0.99)),
        ("p99.9", pct(&sorted, 0.999)),
    ] {
        println!("  step {name} {v:.3} ms = {:.2}x floor", v / floor);
    }
    println!(
        "  step max {max:.3} ms = {:.0}x floor (step {slowest_at}); steps >= 10 ms: {}, >= 100 ms: {}",
        max / floor,
        over(10.0),
        over(100.0)
    );
    let list = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.1}", ms(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  steps that put a compacted file in place: {} ms (the writer carried over {} KiB there); steps that grew the file by a zeroed chunk: {}, max {:.1} ms",
        list(&installs),
        writer_carries
            .iter()
            .map(|b| (b / 1024).to_string())
            .collect::<Vec<_>>()
            .join(", "),
        growths.len(),
        growths.iter().copied().max().map_or(0.0, ms)
    );
    println!("a step is one journal write (pwrite + fdatasync) and the writer's compaction check after it: what the next Raft request waits for");
    Ok(())
}
