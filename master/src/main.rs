use crescent_master::config::MasterConfig;
use crescent_master::server::RunningMaster;

// The master allocates many small, short-lived objects per request (keys,
// protobuf messages, log entries); mimalloc measured faster than glibc here.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let config = MasterConfig::load()?;
    if config.unsafe_wall_clock {
        crescent_store::clock::read_the_wall_clock_unsafely();
    }
    crescent_runtime::init_server_logging(
        &config.log_format,
        "info,openraft=warn,h2=warn,tower=warn",
    );
    // Both listeners' caps, plus a reserve for Raft peers, etcd and the log.
    let needed =
        (config.max_connections + crescent_runtime::conn_limit::MAX_HTTP_CONNECTIONS + 1024) as u64;
    crescent_runtime::raise_open_file_limit(needed);
    // Early, so little of the heap is already backed by huge pages (the
    // kernel checks the flag when memory is first touched; see the function).
    crescent_runtime::disable_transparent_huge_pages();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("crescent-master")
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        tracing::info!(
            node_id = config.node_id,
            listen = %config.listen,
            advertise = config.advertise_addr(),
            data_dir = %config.data_dir.display(),
            peers = config.peers,
            "crescent-master starting"
        );
        let mut master = RunningMaster::start(config, listener).await?;
        // SIGHUP re-reads the token files (a rotation lists the new token
        // first and the old one second; see docs/security.md).
        let node = master.node.clone();
        crescent_runtime::on_hangup(move || node.reload_credentials());
        tokio::select! {
            r = master.wait() => {
                r?;
            }
            _ = crescent_runtime::shutdown_signal() => {
                tracing::info!("shutting down");
                master.stop().await;
            }
        }
        Ok(())
    })
}
