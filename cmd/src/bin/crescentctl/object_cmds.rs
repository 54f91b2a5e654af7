//! put / get / rm / exists through the client library.

use std::io::Write;
use std::path::PathBuf;

use crescent_client::{Client, ClientConfig, ReplicateConfig, Stored};

use crate::Target;

async fn client(target: &Target) -> anyhow::Result<Client> {
    let config = ClientConfig {
        master: target.master.clone(),
        token_file: target.token_file.clone(),
        tls_cert: target.tls[0].clone(),
        tls_key: target.tls[1].clone(),
        tls_ca: target.tls[2].clone(),
        etcd_tls: target.etcd_tls,
        data_tls: target.data_tls,
        // Never local-only: this process's memory dies with it, so a put
        // "stored" there while no master answers would be a false success.
        degrade_after: std::time::Duration::ZERO,
        ..ClientConfig::default()
    };
    Ok(Client::connect(config).await?)
}

pub async fn put(
    target: &Target,
    key: &str,
    value: Option<String>,
    file: Option<PathBuf>,
    replicas: u32,
) -> anyhow::Result<()> {
    let bytes = match (value, file) {
        (Some(v), None) => v.into_bytes(),
        (None, Some(f)) => {
            std::fs::read(&f).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?
        }
        _ => anyhow::bail!("give either a VALUE or --file F"),
    };
    anyhow::ensure!(replicas > 0, "--replicas must be at least 1");
    let c = client(target).await?;
    let cfg = ReplicateConfig {
        replica_num: replicas,
        ..Default::default()
    };
    let stored = c.put_placed(key, &bytes, &cfg).await?;
    // Cannot happen with `degrade_after` zero; checked so that a change
    // there can never turn into a false "stored" again.
    anyhow::ensure!(
        stored == Stored::InCluster,
        "no master reachable: {key} was not stored in the cluster"
    );
    eprintln!(
        "stored {key} ({} bytes, {replicas} replica(s))",
        bytes.len()
    );
    Ok(())
}

pub async fn get(target: &Target, key: &str, out: Option<PathBuf>) -> anyhow::Result<()> {
    let c = client(target).await?;
    let bytes = c.get(key).await?;
    match out {
        Some(path) => {
            std::fs::write(&path, &bytes)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            eprintln!("wrote {} bytes to {}", bytes.len(), path.display());
        }
        None => std::io::stdout().write_all(&bytes)?,
    }
    Ok(())
}

pub async fn rm(target: &Target, key: &str, force: bool) -> anyhow::Result<()> {
    client(target).await?.remove(key, force).await?;
    eprintln!("removed {key}");
    Ok(())
}

pub async fn exists(target: &Target, key: &str, json: bool) -> anyhow::Result<()> {
    let found = client(target).await?.exists(key).await?;
    if json {
        println!("{}", serde_json::json!({"key": key, "exists": found}));
    } else {
        println!("{}", if found { "yes" } else { "no" });
    }
    if !found {
        std::process::exit(2);
    }
    Ok(())
}
