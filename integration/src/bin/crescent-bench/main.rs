//! crescent-bench: Crescent's benchmarks, each printing its figures next to
//! a ceiling or floor measured in the same run. `crescentctl bench ...`
//! runs this program. It lives with the test harness because most runs
//! start their own local clusters; it is not part of any production binary.

mod data;
mod failover;
mod floor;
mod journal;
mod meta;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "crescent-bench",
    version,
    about = "Benchmark Crescent: metadata, data path, failover"
)]
struct Cli {
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,

    /// Accepted and ignored, as `crescentctl`'s global flag always was here:
    /// `meta` takes `--masters`, the others start their own clusters.
    #[arg(long, global = true, hide = true)]
    master: Option<String>,

    #[command(subcommand)]
    what: BenchCmd,
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// PutStart+PutEnd and GetReplicaList throughput/latency. Without --masters it
    /// starts a 1-node and a 3-node local cluster (persisted, fsynced log) and
    /// compares them in one run.
    Meta(meta::MetaArgs),
    /// Put/get of real bytes over TCP and shared memory, with the loopback and
    /// memcpy ceilings measured in the same run.
    Data(data::DataArgs),
    /// Repeatedly SIGKILL the leader under a put workload (restarting it each
    /// time); time to the first successful write, and acknowledged writes lost.
    Failover(failover::FailoverArgs),
    /// The masters' Raft log file alone, kept compacting: the writer's time
    /// per batch (write, fdatasync, compaction check) against a 4 KiB
    /// fdatasync measured in the same directory.
    Journal(journal::JournalArgs),
}

fn main() -> std::process::ExitCode {
    crescent_runtime::init_tool_logging("warn");
    let cli = Cli::parse();
    crescent_runtime::run_tool(async move {
        match cli.what {
            BenchCmd::Meta(args) => meta::run(args, cli.json).await,
            BenchCmd::Data(args) => data::run(args, cli.json).await,
            BenchCmd::Failover(args) => failover::run(args, cli.json).await,
            BenchCmd::Journal(args) => journal::run(args, cli.json).await,
        }
    })
}

/// The token for a `--masters` cluster in token mode: the file named by
/// `CRESCENT_TOKEN_FILE` (clusters the benchmark starts itself run
/// `--insecure`, where a token is ignored).
pub fn env_token() -> anyhow::Result<crescent_auth::BearerToken> {
    let file = std::env::var_os("CRESCENT_TOKEN_FILE").map(std::path::PathBuf::from);
    Ok(crescent_auth::BearerToken::from_optional_file(
        file.as_deref(),
    )?)
}

/// A master client for given masters: an `etcd://` address is read over
/// TLS with `tls` when CRESCENT_ETCD_TLS says so (as the client library
/// reads it).
pub async fn connect_masters(
    masters: &str,
    tls: Option<&crescent_auth::tls::TlsFiles>,
) -> anyhow::Result<crescent_client::MasterClient> {
    let etcd_tls = crescent_client::ClientConfig::from_env()?.etcd_tls;
    let etcd_tls = crescent_auth::tls::for_etcd(etcd_tls, tls)?;
    Ok(crescent_client::MasterClient::connect_with_etcd_tls(masters, etcd_tls).await?)
}

/// Mutual TLS towards given masters from CRESCENT_TLS_CERT, _KEY and _CA.
pub fn env_tls() -> anyhow::Result<Option<crescent_auth::tls::TlsFiles>> {
    let var = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
    let (cert, key, ca) = (
        var("CRESCENT_TLS_CERT"),
        var("CRESCENT_TLS_KEY"),
        var("CRESCENT_TLS_CA"),
    );
    Ok(crescent_auth::tls::TlsFiles::from_flags(
        cert.as_deref(),
        key.as_deref(),
        ca.as_deref(),
    )?)
}
