//! `crescentctl certs init DIR`: a CA and certificates for a test or demo
//! cluster's mutual TLS (masters, stores, clients). A production cluster
//! uses its own PKI; the flags take any PEM files.

use std::io::Write;
use std::path::{Path, PathBuf};

use crescent_auth::tls::{
    CA_CERT_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE, NODE_CERT_FILE, NODE_KEY_FILE,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Longest validity `--days` accepts (a test CA is not forever).
const MAX_DAYS: u32 = 3650;

/// Writes ca.pem, node.pem/node.key (masters and stores: server and client
/// use) and client.pem/client.key (engines, operators) into `dir`. The
/// node certificate names localhost, 127.0.0.1, ::1 and every `hosts`
/// entry. Existing files are kept unless `force`. Returns what was written.
pub fn init(dir: &Path, hosts: &[String], days: u32, force: bool) -> anyhow::Result<Vec<PathBuf>> {
    anyhow::ensure!(
        (1..=MAX_DAYS).contains(&days),
        "--days must be between 1 and {MAX_DAYS}"
    );
    let names = [
        CA_CERT_FILE,
        NODE_CERT_FILE,
        NODE_KEY_FILE,
        CLIENT_CERT_FILE,
        CLIENT_KEY_FILE,
    ];
    let existing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| dir.join(n).exists())
        .collect();
    if !force && !existing.is_empty() {
        // All five belong together: never mix a new CA with old certificates.
        anyhow::ensure!(
            existing.len() == names.len(),
            "{} holds only some of the certificate files ({}); --force writes a new set",
            dir.display(),
            existing.join(", ")
        );
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir)?;

    let now = time::OffsetDateTime::now_utc();
    let validity = |p: &mut CertificateParams| {
        // A day back: room for clocks behind this one.
        p.not_before = now - time::Duration::days(1);
        p.not_after = now + time::Duration::days(i64::from(days));
    };

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "Crescent test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut node_names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    for h in hosts {
        anyhow::ensure!(
            !h.is_empty() && h.len() <= 253,
            "--host {h:?} is not a host name"
        );
        if !node_names.contains(h) {
            node_names.push(h.clone());
        }
    }
    let node_key = KeyPair::generate()?;
    let mut node = CertificateParams::new(node_names)?;
    node.distinguished_name
        .push(DnType::CommonName, "crescent-node");
    // Masters serve and also call each other; stores call the masters.
    node.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    validity(&mut node);
    let node_cert = node.signed_by(&node_key, &issuer)?;

    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client
        .distinguished_name
        .push(DnType::CommonName, "crescent-client");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut client);
    let client_cert = client.signed_by(&client_key, &issuer)?;

    let files = [
        (CA_CERT_FILE, ca_cert.pem(), 0o644),
        (NODE_CERT_FILE, node_cert.pem(), 0o644),
        (NODE_KEY_FILE, node_key.serialize_pem(), 0o600),
        (CLIENT_CERT_FILE, client_cert.pem(), 0o644),
        (CLIENT_KEY_FILE, client_key.serialize_pem(), 0o600),
    ];
    let mut written = Vec::new();
    for (name, pem, mode) in files {
        let path = dir.join(name);
        write_file(&path, pem.as_bytes(), mode)?;
        written.push(path);
    }
    Ok(written)
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    // Replace, never rewrite in place: a key file is never briefly readable
    // with a wider mode.
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
