//! crescentctl: the operator's CLI for a Crescent cluster.

mod bench;
mod cluster_cmds;

use clap::{Parser, Subcommand};
use crescent_client::MasterClient;

#[derive(Parser, Debug)]
#[command(
    name = "crescentctl",
    version,
    about = "Operate a Crescent cluster: leader, members, status, benchmarks"
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
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
    let client = MasterClient::new(&cli.master)?;
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
        Cmd::Bench { .. } => unreachable!("handled above"),
    }
}
