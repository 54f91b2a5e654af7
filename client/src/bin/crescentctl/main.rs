//! crescentctl: the operator's CLI for a Crescent cluster.

mod bench;
mod bench_data;
mod bench_failover;
mod cluster_cmds;
mod object_cmds;

use clap::{Parser, Subcommand};
use crescent_client::MasterClient;

#[derive(Parser, Debug)]
#[command(
    name = "crescentctl",
    version,
    about = "Operate a Crescent cluster: leader, members, status, objects, benchmarks"
)]
struct Cli {
    /// Master address: host:port or a comma list (any master; the leader is found).
    #[arg(
        long,
        global = true,
        env = "CRESCENT_MASTER",
        default_value = "127.0.0.1:50051"
    )]
    master: String,

    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Show the current leader (id, address, term).
    Leader,
    /// List the members with their replication state as seen by the leader.
    Members {
        #[command(subcommand)]
        action: Option<MembersCmd>,
    },
    /// Every master's role, term, log indexes and lag, and whether there is a quorum.
    Status,
    /// Hand leadership to another voter.
    TransferLeader {
        /// Node id of the new leader.
        id: u64,
    },
    /// Store an object: `put KEY VALUE` or `put KEY --file F`.
    Put {
        key: String,
        /// The value as text (use --file for binary data).
        value: Option<String>,
        #[arg(long, conflicts_with = "value")]
        file: Option<std::path::PathBuf>,
        /// Replicas on distinct segments.
        #[arg(long, default_value_t = 1)]
        replicas: u32,
    },
    /// Fetch an object to stdout or --out F.
    Get {
        key: String,
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Remove an object (--force ignores read leases and pins).
    Rm {
        key: String,
        #[arg(long)]
        force: bool,
    },
    /// Whether an object exists (exit status 0 when it does, 2 when not).
    Exists { key: String },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCmd,
    },
}

#[derive(Subcommand, Debug)]
enum MembersCmd {
    /// Add a master: first as a learner, then (unless --learner) as a voter.
    Add {
        id: u64,
        addr: String,
        #[arg(long)]
        learner: bool,
    },
    /// Remove a master from the membership (an explicit, never automatic, action).
    Remove { id: u64 },
}

fn main() {
    crescent_runtime::init_tool_logging("warn");
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async move {
        match run(cli).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        }
    });
    std::process::exit(code);
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Cmd::Bench { what } = cli.command {
        return bench::run(what, &cli.master, cli.json).await;
    }
    let client = MasterClient::connect(&cli.master).await?;
    match cli.command {
        Cmd::Leader => cluster_cmds::leader(&client, cli.json).await,
        Cmd::Members { action: None } => cluster_cmds::members(&client, cli.json).await,
        Cmd::Members {
            action: Some(MembersCmd::Add { id, addr, learner }),
        } => cluster_cmds::add_member(&client, id, &addr, learner).await,
        Cmd::Members {
            action: Some(MembersCmd::Remove { id }),
        } => cluster_cmds::remove_member(&client, id).await,
        Cmd::Status => cluster_cmds::status(&client, cli.json).await,
        Cmd::TransferLeader { id } => cluster_cmds::transfer_leader(&client, id).await,
        Cmd::Put {
            key,
            value,
            file,
            replicas,
        } => object_cmds::put(&cli.master, &key, value, file, replicas).await,
        Cmd::Get { key, out } => object_cmds::get(&cli.master, &key, out).await,
        Cmd::Rm { key, force } => object_cmds::rm(&cli.master, &key, force).await,
        Cmd::Exists { key } => object_cmds::exists(&cli.master, &key, cli.json).await,
        Cmd::Bench { .. } => unreachable!("handled above"),
    }
}
