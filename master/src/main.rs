use crescent_master::config::MasterConfig;
use crescent_master::server::RunningMaster;
use tracing_subscriber::EnvFilter;

// The master allocates many small, short-lived objects per request (keys,
// protobuf messages, log entries); mimalloc measured faster than glibc here.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(format: &str) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,h2=warn,tower=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn main() -> anyhow::Result<()> {
    let config = MasterConfig::load()?;
    init_tracing(&config.log_format);
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
        tokio::select! {
            r = master.wait() => {
                r?;
            }
            _ = shutdown_signal() => {
                tracing::info!("shutting down");
                master.stop().await;
            }
        }
        Ok(())
    })
}
