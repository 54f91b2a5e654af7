//! `etcd://h1:2379,h2:2379[/cluster]` master addresses (Mooncake's convention):
//! read the registered masters and the published leader from etcd, then watch
//! them so a client follows membership and leadership changes by itself. The
//! leader key is only a hint: a stale one costs one NOT_LEADER redirect.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use etcd_client::{Client, GetOptions, WatchOptions};

pub const DEFAULT_CLUSTER: &str = "crescent";

/// Why the masters could not be found (a master client reports it as its
/// own error).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DiscoveryError {
    #[error("invalid master address {0:?}: expected host:port or a comma-separated list")]
    BadAddress(String),
    #[error("no master reachable: {0}")]
    Unavailable(String),
}

/// Where the masters are: seeds and the believed leader. Shared with the etcd
/// watcher, which keeps them current when the address was `etcd://...`.
/// Read on every request and written only when the cluster changes, so both
/// are swapped whole (`arc-swap`) rather than locked.
#[derive(Default)]
pub struct Targets {
    pub(crate) seeds: ArcSwap<Vec<String>>,
    pub(crate) leader: ArcSwapOption<String>,
}

impl Targets {
    pub fn set_seeds(&self, seeds: Vec<String>) {
        if !seeds.is_empty() {
            self.seeds.store(Arc::new(seeds));
        }
    }

    pub fn set_leader_hint(&self, addr: Option<String>) {
        if let Some(addr) = addr {
            self.leader.store(Some(Arc::new(addr)));
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSpec {
    pub endpoints: Vec<String>,
    pub cluster: String,
}

impl EtcdSpec {
    /// `None` when `s` is not an etcd address; `Some(Err)` when it is a bad one.
    pub fn parse(s: &str) -> Option<Result<Self, DiscoveryError>> {
        let rest = s.trim().strip_prefix("etcd://")?;
        let (hosts, cluster) = match rest.split_once('/') {
            Some((h, c)) if !c.is_empty() => (h, c.to_string()),
            Some((h, _)) => (h, DEFAULT_CLUSTER.to_string()),
            None => (
                rest,
                std::env::var("CRESCENT_CLUSTER").unwrap_or_else(|_| DEFAULT_CLUSTER.to_string()),
            ),
        };
        let endpoints: Vec<String> = hosts
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        if endpoints.is_empty() || endpoints.iter().any(|e| !e.contains(':')) {
            return Some(Err(DiscoveryError::BadAddress(s.to_string())));
        }
        Some(Ok(Self { endpoints, cluster }))
    }

    fn masters_prefix(&self) -> String {
        format!("/crescent/{}/masters/", self.cluster)
    }

    fn leader_key(&self) -> String {
        format!("/crescent/{}/leader", self.cluster)
    }
}

fn leader_addr(value: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(value).ok()?;
    v.get("addr")?.as_str().map(str::to_string)
}

/// TLS towards etcd: the client configuration of this process's TLS files.
pub type EtcdTls = Option<tonic::transport::ClientTlsConfig>;

async fn connect(spec: &EtcdSpec, tls: &EtcdTls) -> Result<Client, DiscoveryError> {
    let mut opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(3));
    if let Some(tls) = tls {
        opts = opts.with_tls(tls.clone());
    }
    Client::connect(&spec.endpoints, Some(opts))
        .await
        .map_err(|e| DiscoveryError::Unavailable(format!("etcd {}: {e}", spec.endpoints.join(","))))
}

/// Reads the masters and leader into `targets`.
async fn refresh(
    client: &mut Client,
    spec: &EtcdSpec,
    targets: &Targets,
) -> Result<usize, DiscoveryError> {
    let err = |e: etcd_client::Error| DiscoveryError::Unavailable(format!("etcd: {e}"));
    let resp = client
        .get(spec.masters_prefix(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(err)?;
    let seeds: Vec<String> = resp
        .kvs()
        .iter()
        // "host:port", then (token mode) the member's tag: the address is
        // the first word.
        .filter_map(|kv| {
            kv.value_str()
                .ok()?
                .split_whitespace()
                .next()
                .map(str::to_string)
        })
        .collect();
    let n = seeds.len();
    targets.set_seeds(seeds);
    let leader = client.get(spec.leader_key(), None).await.map_err(err)?;
    targets.set_leader_hint(
        leader
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok())
            .and_then(leader_addr),
    );
    Ok(n)
}

/// Fills `targets` from etcd and keeps them current in the background.
pub async fn start(
    spec: EtcdSpec,
    tls: EtcdTls,
    targets: Arc<Targets>,
) -> Result<(), DiscoveryError> {
    let mut client = connect(&spec, &tls).await?;
    let n = refresh(&mut client, &spec, &targets).await?;
    if n == 0 {
        tracing::warn!(
            cluster = spec.cluster,
            "etcd lists no masters yet; will keep watching"
        );
    }
    tokio::spawn(watch_loop(spec, tls, targets, client));
    Ok(())
}

async fn watch_loop(spec: EtcdSpec, tls: EtcdTls, targets: Arc<Targets>, mut client: Client) {
    let prefix = format!("/crescent/{}/", spec.cluster);
    loop {
        match client
            .watch(prefix.clone(), Some(WatchOptions::new().with_prefix()))
            .await
        {
            Ok(mut stream) => {
                while let Ok(Some(_event)) = stream.message().await {
                    // Any change under the prefix: re-read (small, and simpler than
                    // applying events one by one).
                    if let Err(e) = refresh(&mut client, &spec, &targets).await {
                        tracing::debug!(error = %e, "etcd refresh failed");
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "etcd watch failed"),
        }
        // Lost the watch (etcd restart or partition): keep the last known
        // masters and retry.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(c) = connect(&spec, &tls).await {
            client = c;
            let _ = refresh(&mut client, &spec, &targets).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_etcd_addresses() {
        assert!(EtcdSpec::parse("127.0.0.1:50051").is_none());
        let s = EtcdSpec::parse("etcd://h1:2379,h2:2379").unwrap().unwrap();
        assert_eq!(s.endpoints, vec!["h1:2379", "h2:2379"]);
        let s = EtcdSpec::parse("etcd://h1:2379/prod").unwrap().unwrap();
        assert_eq!(s.cluster, "prod");
        assert!(EtcdSpec::parse("etcd://").unwrap().is_err());
        assert!(EtcdSpec::parse("etcd://nohostport").unwrap().is_err());
        assert_eq!(
            leader_addr(r#"{"id":1,"addr":"a:1","term":2}"#),
            Some("a:1".into())
        );
        assert_eq!(leader_addr("garbage"), None);
    }
}
