//! crescent-store: contributes one memory segment to a Crescent pool and serves
//! its bytes (TCP, mutual TLS with --tls-*; same-host shared memory with --shm),
//! and with --disk-path a disk segment whose objects survive a restart.

mod http;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use crescent_client::agent::{AgentConfig, StoreAgent};
use crescent_client::MasterClient;
use crescent_proto::units::{parse_duration, parse_size};
use crescent_runtime::conn_limit::{self, CappedListener};

#[derive(Parser, Debug)]
#[command(
    name = "crescent-store",
    version,
    about = "Contribute a memory segment to a Crescent pool and serve it"
)]
struct Args {
    /// Masters: host:port or a comma list.
    #[arg(long, env = "CRESCENT_MASTER", default_value = "127.0.0.1:50051")]
    master: String,
    /// Transfer listen address (loopback unless told otherwise: give
    /// `0.0.0.0:50061` to serve other hosts).
    #[arg(long, env = "CRESCENT_STORE_LISTEN", default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
    /// Host others use to reach the transfer port [default: the listen IP, or 127.0.0.1 on 0.0.0.0].
    #[arg(long, env = "CRESCENT_STORE_ADVERTISE")]
    advertise: Option<String>,
    /// Segment size (rounded up to whole pages), e.g. 4gb.
    #[arg(long, env = "CRESCENT_SEGMENT_SIZE", default_value = "4gb", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    segment_size: u64,
    /// Segment name, unique in the cluster [default: <endpoint>-<random>].
    #[arg(long, env = "CRESCENT_SEGMENT_NAME", default_value = "")]
    segment_name: String,
    /// Same-host copies without a socket: back the memory segment with
    /// /dev/shm, and let same-host clients read the disk segment's file
    /// (--disk-path) with pread. Clients need read access to those files
    /// (same user: they are created 0600).
    #[arg(long, env = "CRESCENT_SHM")]
    shm: bool,
    /// Allocate the memory segment's pages at start (`--prefault=false`:
    /// on first use). On, no put waits for a page fault (a fresh 1 MiB put
    /// here was ~0.9 ms slower without it), and a segment the host cannot
    /// hold (memory limit, a small /dev/shm) fails at start with a clear
    /// error, not with a SIGBUS or an OOM kill when the pool fills. Takes
    /// about a second per few GB.
    #[arg(long, env = "CRESCENT_PREFAULT", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    prefault: bool,
    /// Directory for the shared-memory file.
    #[arg(long, env = "CRESCENT_SHM_DIR", default_value = "/dev/shm")]
    shm_dir: PathBuf,
    /// This host's name for same-host transports (Mooncake's local_hostname).
    #[arg(long, env = "MOONCAKE_LOCAL_HOSTNAME")]
    hostname: Option<String>,
    /// Heartbeat period.
    #[arg(long, env = "CRESCENT_HEARTBEAT_INTERVAL", default_value = "1s", value_parser = |s: &str| parse_duration(s).map_err(|e| e.to_string()))]
    heartbeat_interval: Duration,
    /// Metrics/health HTTP address (empty disables it).
    #[arg(long, env = "CRESCENT_STORE_HTTP", default_value = "127.0.0.1:9103")]
    http: String,
    /// File holding the client token the masters require (`crescentctl
    /// tokens init DIR` writes one); leave it out for `--insecure` masters.
    #[arg(long, env = "CRESCENT_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// This store's TLS certificate (PEM), for mutual TLS to masters started
    /// with --tls-*; with --tls-key and --tls-ca. The metrics HTTP port then
    /// serves HTTPS, and with --data-tls the transfer port accepts only
    /// mutual TLS (clients presenting a certificate the CA signed).
    #[arg(long, env = "CRESCENT_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "CRESCENT_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The CA certificate (PEM) that signed the masters' and the clients'
    /// certificates.
    #[arg(long, env = "CRESCENT_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Read an etcd:// --master over TLS with the --tls-* files.
    #[arg(long, env = "CRESCENT_ETCD_TLS", value_parser = clap::builder::BoolishValueParser::new())]
    etcd_tls: bool,
    /// Serve the transfer (data) port with mutual TLS and the --tls-* files:
    /// clients must then set data_tls too, and --tls-cert must name the
    /// host clients reach this store at (--advertise). Off by default: it
    /// costs about half of 1 MiB transfer throughput here (no kernel TLS),
    /// and the masters' grants already decide who may read or write what.
    #[arg(long, env = "CRESCENT_DATA_TLS", value_parser = clap::builder::BoolishValueParser::new())]
    data_tls: bool,
    /// How far past its expiry a data-plane grant is still honoured: room for
    /// this host's clock running ahead of the masters'. At most 5s: the
    /// masters reuse a revoked put's range 10s after its grants expire.
    #[arg(long, env = "CRESCENT_GRANT_CLOCK_SKEW", default_value = "2s", value_parser = |s: &str| parse_duration(s).map_err(|e| e.to_string()))]
    grant_clock_skew: std::time::Duration,
    /// Directory of this store's disk segment (the disk tier): objects the
    /// masters demote from memory go there, and stay readable across a
    /// restart of this store on the same directory. Also read from
    /// Mooncake's MOONCAKE_OFFLOAD_FILE_STORAGE_PATH. None: memory only.
    #[arg(long, env = "CRESCENT_DISK_PATH")]
    disk_path: Option<PathBuf>,
    /// Size of the disk segment (pre-allocated), e.g. 200gb.
    #[arg(long, env = "CRESCENT_DISK_SIZE", default_value = "16gb", value_parser = |s: &str| parse_size(s).map_err(|e| e.to_string()))]
    disk_size: u64,
    /// Format the disk segment anew at --disk-size when its file was
    /// formatted for another size, discarding the objects it held. Without
    /// it such a file is left as it is and the store serves memory only,
    /// saying which --disk-size would serve its objects again: a mistyped
    /// size never empties the tier. (A damaged file, e.g. truncated while
    /// the store was down, is formatted anew either way.)
    #[arg(long, env = "CRESCENT_DISK_REFORMAT", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, default_value_t = false, value_parser = clap::builder::BoolishValueParser::new())]
    disk_reformat: bool,
    /// Transfer listen address of the disk segment [default: --listen's
    /// address, any free port].
    #[arg(long, env = "CRESCENT_DISK_LISTEN")]
    disk_listen: Option<SocketAddr>,
    /// TEST ONLY: delete the disk segment's file at start, so a restarted
    /// store comes back with an empty disk tier. Breaks the disk tier's
    /// guarantee on purpose; the chaos suite uses it to prove its checker
    /// notices disk objects lost across a store restart.
    #[arg(long, hide = true)]
    unsafe_forget_disk_on_restart: bool,
    /// TEST ONLY: read the wall clock for grant expiry and never refuse
    /// grants for a clock far from the leader's, so a master whose wall
    /// clock steps gets its stale grants honoured. The chaos suite uses it
    /// to prove its checker notices.
    #[arg(long, hide = true)]
    unsafe_wall_clock: bool,
    /// Log format: text or json. Filter with RUST_LOG.
    #[arg(long, env = "CRESCENT_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.unsafe_wall_clock {
        crescent_store::clock::read_the_wall_clock_unsafely();
    }
    crescent_runtime::init_server_logging(&args.log_format, "info,h2=warn,tower=warn");
    anyhow::ensure!(
        args.grant_clock_skew.as_millis() <= u128::from(crescent_proto::MAX_GRANT_CLOCK_SKEW_MS),
        "--grant-clock-skew must be at most {} ms: the masters reuse a revoked put's range a fixed margin after its grants expire",
        crescent_proto::MAX_GRANT_CLOCK_SKEW_MS
    );
    // The data port's cap, the metrics port's, and a reserve for the
    // master connection and shared-memory files.
    let needed = crescent_store::server::ServeLimits::default().max_connections
        + crescent_runtime::conn_limit::MAX_HTTP_CONNECTIONS as u64
        + 256;
    crescent_runtime::raise_open_file_limit(needed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("crescent-store")
        .build()?;
    rt.block_on(async move {
        let token = crescent_auth::BearerToken::from_optional_file(args.token_file.as_deref())?;
        let tls = crescent_auth::tls::TlsFiles::from_flags(
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
            args.tls_ca.as_deref(),
        )?;
        let etcd_tls = crescent_auth::tls::for_etcd(args.etcd_tls, tls.as_ref())?;
        let master = Arc::new(
            MasterClient::connect_with_etcd_tls(&args.master, etcd_tls)
                .await?
                .with_token(token.clone())
                .with_tls(tls.as_ref()),
        );
        // What the transfer and metrics ports serve with --tls-* (re-read on
        // SIGHUP; each new connection takes what is current).
        let serving_tls = match &tls {
            Some(files) => Some(Arc::new(crescent_auth::tls::ServingTls::new(files)?)),
            None => None,
        };
        // SIGHUP re-reads the token file (the token's clones share it) and
        // the TLS files: served on the transfer and metrics ports, and
        // presented to the masters.
        let reload_tls = serving_tls.clone();
        let presenting = master.clone();
        crescent_runtime::on_hangup(move || {
            match token.reload() {
                Ok(true) => tracing::info!("SIGHUP: token file reloaded"),
                Ok(false) => tracing::info!("SIGHUP: no token file to reload"),
                Err(e) => {
                    tracing::warn!(error = %e, "SIGHUP: token not reloaded; the old one stays")
                }
            }
            if let Some(tls) = &reload_tls {
                match tls.reload() {
                    Ok(files) => {
                        tracing::info!(
                            "SIGHUP: TLS files reloaded for the transfer and metrics ports"
                        );
                        match presenting.reload_tls(&files) {
                            Ok(()) => tracing::info!(
                                "SIGHUP: the masters are reached with the reloaded TLS files"
                            ),
                            Err(e) => tracing::warn!(
                                error = %e,
                                "SIGHUP: TLS files presented to the masters not reloaded"
                            ),
                        }
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "SIGHUP: TLS files not reloaded; the ones in use stay"
                    ),
                }
            }
        });
        let cfg = AgentConfig {
            name: args.segment_name.clone(),
            segment_size: args.segment_size,
            listen: args.listen,
            advertise_host: args.advertise.clone(),
            hostname: args
                .hostname
                .clone()
                .unwrap_or_else(crescent_client::config::system_hostname),
            shm: args.shm,
            shm_dir: args.shm_dir.clone(),
            heartbeat_interval: args.heartbeat_interval,
            limits: crescent_store::server::ServeLimits {
                grant_clock_skew: args.grant_clock_skew,
                ..Default::default()
            },
            // The same reloadable files, on the transfer port only when asked.
            tls: crescent_auth::tls::for_data_port(args.data_tls, tls.as_ref())?
                .and(serving_tls.clone()),
            disk_path: None,
            disk_reformat: false,
            prefault: args.prefault,
            // Shared with the disk agent (`..cfg.clone()` below): the
            // masters have this process copy between its two tiers.
            local_segments: Default::default(),
        };
        // Mooncake's offload path counts only with its switch on, as there.
        let mooncake_offload = std::env::var("MOONCAKE_ENABLE_SSD_OFFLOAD")
            .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        let disk_path = args.disk_path.clone().or_else(|| {
            std::env::var_os("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
                .filter(|v| !v.is_empty() && mooncake_offload)
                .map(PathBuf::from)
        });
        if let (true, Some(dir)) = (args.unsafe_forget_disk_on_restart, &disk_path) {
            let file = dir.join(crescent_store::disk::DISK_FILE);
            match std::fs::remove_file(&file) {
                Ok(()) => tracing::warn!(path = %file.display(), "--unsafe-forget-disk-on-restart: disk segment deleted"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %file.display(), error = %e, "--unsafe-forget-disk-on-restart: cannot delete"),
            }
        }
        let disk_cfg = disk_path.map(|dir| AgentConfig {
            segment_size: args.disk_size,
            listen: args
                .disk_listen
                .unwrap_or_else(|| SocketAddr::new(args.listen.ip(), 0)),
            disk_path: Some(dir),
            disk_reformat: args.disk_reformat,
            ..cfg.clone()
        });
        let agent = StoreAgent::start(master.clone(), cfg).await?;
        tracing::info!(
            endpoint = agent.endpoint,
            name = agent.name,
            "crescent-store started"
        );
        // A disk segment that cannot be opened is said, and the store serves
        // its memory anyway.
        let mut disk_error = None;
        let disk_agent = match disk_cfg {
            Some(mut disk_cfg) => {
                disk_cfg.name = format!("{}-disk", agent.name);
                let dir = disk_cfg.disk_path.clone().unwrap_or_default();
                // The previous process may still hold the file's lock for a
                // moment (an overlapping restart): retry that for a while.
                match StoreAgent::start_disk(master.clone(), disk_cfg, 30, Duration::from_secs(2))
                    .await
                {
                    Ok(d) => {
                        tracing::info!(endpoint = d.endpoint, name = d.name, "disk segment serving");
                        Some(d)
                    }
                    Err(e) => {
                        let why = match e.disk_formatted_for() {
                            Some(size) => format!(
                                "{e} (start with --disk-size {size} to serve its objects, \
                                 or once with --disk-reformat to discard them)"
                            ),
                            None => e.to_string(),
                        };
                        tracing::error!(path = %dir.display(), error = %why, "no disk tier: cannot open the disk segment; serving memory only");
                        disk_error = Some(why);
                        None
                    }
                }
            }
            None => None,
        };
        if !args.http.is_empty() {
            let listener = tokio::net::TcpListener::bind(&args.http)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen for HTTP on {}: {e}", args.http))?;
            let router = http::router(agent.clone(), disk_agent.clone(), disk_error);
            let listener = CappedListener::new(
                listener,
                conn_limit::MAX_HTTP_CONNECTIONS,
                conn_limit::HTTP_IDLE_TIMEOUT,
            );
            let https = serving_tls
                .clone()
                .map(|tls| -> conn_limit::TlsSource { Arc::new(move || tls.http_acceptor()) });
            tokio::spawn(conn_limit::serve_http(
                listener,
                router,
                conn_limit::HTTP_HEADER_READ_TIMEOUT,
                https,
            ));
        }
        crescent_runtime::shutdown_signal().await;
        tracing::info!("shutting down");
        agent.shutdown().await;
        if let Some(d) = disk_agent {
            d.shutdown().await;
        }
        Ok(())
    })
}
