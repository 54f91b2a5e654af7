//! crescentctl: the operator's CLI for a Crescent cluster.

mod certs;
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

    /// File holding the token to present: the client token, or the admin
    /// token (which may do everything the client token may).
    #[arg(long, global = true, env = "CRESCENT_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,

    /// File holding the admin token, used for members, transfer-leader
    /// and status instead of --token-file.
    #[arg(long, global = true, env = "CRESCENT_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<std::path::PathBuf>,

    /// This client's TLS certificate (PEM), for masters started with
    /// --tls-*; with --tls-key and --tls-ca (`certs init` writes client.pem).
    #[arg(long, global = true, env = "CRESCENT_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, env = "CRESCENT_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,

    /// The CA certificate (PEM) that signed the masters' certificates.
    #[arg(long, global = true, env = "CRESCENT_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,

    /// Read an etcd:// --master over TLS with the --tls-* files.
    #[arg(long, global = true, env = "CRESCENT_ETCD_TLS", value_parser = clap::builder::BoolishValueParser::new())]
    etcd_tls: bool,

    /// Speak mutual TLS to the stores' data ports (stores started with
    /// --data-tls) with the --tls-* files.
    #[arg(long, global = true, env = "CRESCENT_DATA_TLS", value_parser = clap::builder::BoolishValueParser::new())]
    data_tls: bool,

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
    /// Credentials: `tokens init DIR` writes a client, an admin and a
    /// cluster token (readable by the owner only).
    Tokens {
        #[command(subcommand)]
        action: TokensCmd,
    },
    /// TLS: `certs init DIR` writes a CA and certificates for a test or
    /// demo cluster (keys readable by the owner only).
    Certs {
        #[command(subcommand)]
        action: CertsCmd,
    },
    /// Benchmarks: runs `crescent-bench` (found next to this program) with
    /// the rest of the arguments, e.g. `bench meta --masters H:P`.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum TokensCmd {
    /// Write client.token, admin.token and cluster.token into DIR; existing
    /// files are kept unless --force. Give masters all three files
    /// (--token-file, --admin-token-file, --cluster-token-file), stores and
    /// engines client.token, operators admin.token.
    Init {
        dir: std::path::PathBuf,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
enum CertsCmd {
    /// Write ca.pem, node.pem + node.key (masters and stores: --tls-cert,
    /// --tls-key) and client.pem + client.key (engines, crescentctl) into
    /// DIR; every process gets ca.pem as --tls-ca. Existing files are kept
    /// unless --force.
    Init {
        dir: std::path::PathBuf,
        /// A name or address the masters and stores are reached by, beyond
        /// localhost, 127.0.0.1 and ::1 (repeat for several).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Validity of every certificate, in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
        #[arg(long)]
        force: bool,
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

fn main() -> std::process::ExitCode {
    crescent_runtime::init_tool_logging("warn");
    crescent_runtime::run_tool(run(Cli::parse()))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Cmd::Bench { args } = cli.command {
        return run_bench(args, cli.json);
    }
    if let Cmd::Tokens {
        action: TokensCmd::Init { dir, force },
    } = &cli.command
    {
        let written = crescent_auth::write_token_files(dir, *force)?;
        report_written(&written, dir, "tokens");
        return Ok(());
    }
    if let Cmd::Certs {
        action:
            CertsCmd::Init {
                dir,
                hosts,
                days,
                force,
            },
    } = &cli.command
    {
        let written = certs::init(dir, hosts, *days, *force)?;
        report_written(&written, dir, "certificates");
        return Ok(());
    }
    let tls = crescent_auth::tls::TlsFiles::from_flags(
        cli.tls_cert.as_deref(),
        cli.tls_key.as_deref(),
        cli.tls_ca.as_deref(),
    )?;
    let admin_command = matches!(
        cli.command,
        Cmd::Members { .. } | Cmd::TransferLeader { .. } | Cmd::Status
    );
    let token_file = match (&cli.admin_token_file, admin_command) {
        (Some(admin), true) => Some(admin.clone()),
        _ => cli.token_file.clone(),
    };
    let token = crescent_auth::BearerToken::from_optional_file(token_file.as_deref())?;
    let target = Target {
        master: cli.master.clone(),
        token_file,
        tls: [
            cli.tls_cert.clone(),
            cli.tls_key.clone(),
            cli.tls_ca.clone(),
        ],
        etcd_tls: cli.etcd_tls,
        data_tls: cli.data_tls,
    };
    let etcd_tls = crescent_auth::tls::for_etcd(cli.etcd_tls, tls.as_ref())?;
    let client = MasterClient::connect_with_etcd_tls(&cli.master, etcd_tls)
        .await?
        .with_token(token)
        .with_tls(tls.as_ref());
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
        } => object_cmds::put(&target, &key, value, file, replicas).await,
        Cmd::Get { key, out } => object_cmds::get(&target, &key, out).await,
        Cmd::Rm { key, force } => object_cmds::rm(&target, &key, force).await,
        Cmd::Exists { key } => object_cmds::exists(&target, &key, cli.json).await,
        Cmd::Bench { .. } | Cmd::Tokens { .. } | Cmd::Certs { .. } => {
            unreachable!("handled above")
        }
    }
}

/// What `tokens init` / `certs init` wrote, or that they kept what was there.
fn report_written(written: &[std::path::PathBuf], dir: &std::path::Path, what: &str) {
    for path in written {
        println!("wrote {}", path.display());
    }
    if written.is_empty() {
        println!(
            "kept the existing {what} in {} (--force replaces them)",
            dir.display()
        );
    }
}

/// Where the object commands connect, and with which token.
pub struct Target {
    pub master: String,
    pub token_file: Option<std::path::PathBuf>,
    /// --tls-cert, --tls-key, --tls-ca.
    pub tls: [Option<std::path::PathBuf>; 3],
    pub etcd_tls: bool,
    pub data_tls: bool,
}

/// The benchmarks are their own program (they start local clusters with the
/// test harness, which this CLI must not link); `crescentctl bench` keeps
/// working by running it with the same arguments and passing on its exit.
fn run_bench(args: Vec<String>, json: bool) -> anyhow::Result<()> {
    let bench = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("crescent-bench")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "crescent-bench".into());
    let mut cmd = std::process::Command::new(&bench);
    if json && !args.iter().any(|a| a == "--json") {
        cmd.arg("--json");
    }
    let status = cmd.args(&args).status().map_err(|e| {
        anyhow::anyhow!(
            "cannot run {}: {e} (build it with `cargo build --bins`)",
            bench.display()
        )
    })?;
    if !status.success() {
        // crescent-bench has said why; pass its exit status on.
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
