//! Client configuration: `ClientConfig`, a Mooncake-style JSON file
//! (`MOONCAKE_CONFIG_PATH`) and `MOONCAKE_*` env vars, each with a `CRESCENT_*`
//! twin that wins when both are set.
//!
//! Precedence: defaults, then the JSON file, then `MOONCAKE_*`, then `CRESCENT_*`.

use std::time::Duration;

use crescent_proto::units::parse_size;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Rdma,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "rdma" => Ok(Protocol::Rdma),
            other => Err(format!("unknown protocol {other:?}: expected tcp or rdma")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Masters: `host:port` or a comma list (Mooncake `master_server_address`).
    pub master: String,
    /// This host's name as other components see it; same-host transports match on it.
    pub local_hostname: String,
    /// Memory this client contributes to the pool (0 = pure client).
    pub global_segment_size: u64,
    /// Memory for the client's own buffers and local-only cache.
    pub local_buffer_size: u64,
    pub protocol: Protocol,
    /// RDMA device name (empty: the first device).
    pub device_name: String,
    /// Where the embedded store (global_segment_size > 0) listens for transfers.
    pub transfer_listen: String,
    /// Put the embedded segment in /dev/shm so same-host clients copy directly.
    pub shm: bool,
    /// Replicas per object when a call does not say.
    pub default_replicas: u32,
    /// Overall deadline of one master call across retries.
    pub master_deadline: Duration,
    /// With no master answering this long, serve from local memory only
    /// (`MOONCAKE_DEGRADE_AFTER`/`CRESCENT_DEGRADE_AFTER`; 0 disables).
    pub degrade_after: Duration,
    /// On recovery, publish objects put while degraded (else drop them).
    pub publish_on_recover: bool,
    /// File holding the client token the masters require
    /// (`CRESCENT_TOKEN_FILE`, JSON `token_file`); `None` for a cluster
    /// started with `--insecure`.
    pub token_file: Option<std::path::PathBuf>,
    /// Mutual TLS towards the masters: this client's certificate, its key
    /// and the cluster's CA (`CRESCENT_TLS_CERT`, `CRESCENT_TLS_KEY`,
    /// `CRESCENT_TLS_CA`; JSON `tls_cert`, `tls_key`, `tls_ca`). All three
    /// or none.
    pub tls_cert: Option<std::path::PathBuf>,
    pub tls_key: Option<std::path::PathBuf>,
    pub tls_ca: Option<std::path::PathBuf>,
    /// Read an `etcd://` master address over TLS with the same files
    /// (`CRESCENT_ETCD_TLS`, JSON `etcd_tls`).
    pub etcd_tls: bool,
    /// Speak mutual TLS to the stores' data ports, and serve this client's
    /// own segment with it, with the same files (`CRESCENT_DATA_TLS`, JSON
    /// `data_tls`). Every store and engine of a cluster must agree; off by
    /// default (see `crescent_auth::tls::for_data_port`).
    pub data_tls: bool,
    /// Directory of this client's disk segment (the disk tier), contributed
    /// to the pool beside its memory: the masters demote objects there from
    /// memory past the watermark, and they stay readable across a restart of
    /// this process on the same directory. One process per directory (the
    /// file is locked). `CRESCENT_DISK_PATH`, JSON `disk_path`; Mooncake's
    /// `enable_ssd_offload` with `ssd_offload_path` (JSON, and Python's
    /// `setup`) or `MOONCAKE_ENABLE_SSD_OFFLOAD` with
    /// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`. `None`: memory only.
    pub disk_path: Option<std::path::PathBuf>,
    /// Size of the disk segment, pre-allocated (`CRESCENT_DISK_SIZE`, JSON
    /// `disk_size`).
    pub disk_size: u64,
    /// Format the disk segment anew at `disk_size` when its file was
    /// formatted for another size, discarding its objects
    /// (`CRESCENT_DISK_REFORMAT`, JSON `disk_reformat`; off by default: such
    /// a file is left as it is and `connect` fails, naming the size that
    /// would serve its objects again).
    pub disk_reformat: bool,
    /// Read a key again straight from the store while the read lease its
    /// last lookup granted lasts, with no master call
    /// (`CRESCENT_DESCRIPTOR_CACHE`, JSON `descriptor_cache`; off by
    /// default). The cost: a key removed with `force` (which ignores read
    /// leases) or lost with its store, and put again meanwhile, may be read
    /// with its previous value until that lease ends. See docs/guarantees.md.
    pub descriptor_cache: bool,
    /// While a put runs, ask the leader to place the next put of the same
    /// size and config, so that put writes its bytes at once and needs one
    /// master round trip instead of two (`CRESCENT_PLACE_AHEAD`, JSON
    /// `place_ahead`; on by default). The cost: a put of a key that already
    /// exists moves its bytes before it learns so, and a placement this
    /// client does not use is given back (or, if the client dies, held until
    /// the leader's release timeout). docs/one-commit-puts.md.
    pub place_ahead: bool,
}

/// The disk segment's size when none is given (as `crescent-store --disk-size`).
pub const DEFAULT_DISK_SIZE: u64 = 16 << 30;

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            master: "127.0.0.1:50051".into(),
            local_hostname: system_hostname(),
            global_segment_size: 0,
            local_buffer_size: 512 << 20,
            protocol: Protocol::Tcp,
            device_name: String::new(),
            transfer_listen: "0.0.0.0:0".into(),
            shm: false,
            default_replicas: 1,
            master_deadline: Duration::from_secs(15),
            degrade_after: Duration::from_secs(3),
            publish_on_recover: true,
            token_file: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            etcd_tls: false,
            data_tls: false,
            disk_path: None,
            disk_size: DEFAULT_DISK_SIZE,
            disk_reformat: false,
            descriptor_cache: false,
            place_ahead: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("client configuration: {0}")]
pub struct ConfigError(pub String);

/// A yes/no variable as the binaries' flags read it (clap's boolish
/// values), so one environment means the same to an engine and to a store.
fn boolish(name: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "y" | "yes" | "t" | "true" | "on" => Ok(true),
        "0" | "n" | "no" | "f" | "false" | "off" | "" => Ok(false),
        other => Err(ConfigError(format!(
            "{name}={other:?}: expected true or false"
        ))),
    }
}

/// Mooncake's JSON field names; sizes may be numbers or strings like "4gb".
/// Engines write their own fields into the same file (vLLM, LMCache), so
/// unknown fields are logged and ignored rather than refused.
#[derive(Debug, Deserialize, Default)]
struct JsonConfig {
    local_hostname: Option<String>,
    master_server_address: Option<String>,
    metadata_server: Option<String>,
    global_segment_size: Option<SizeValue>,
    local_buffer_size: Option<SizeValue>,
    protocol: Option<String>,
    device_name: Option<String>,
    /// Crescent's addition: the client token's file.
    token_file: Option<String>,
    /// Crescent's addition: mutual TLS files.
    tls_cert: Option<String>,
    tls_key: Option<String>,
    tls_ca: Option<String>,
    etcd_tls: Option<bool>,
    data_tls: Option<bool>,
    /// Mooncake's switch for `ssd_offload_path`.
    enable_ssd_offload: Option<bool>,
    ssd_offload_path: Option<String>,
    /// Crescent's names for the disk tier (`disk_path` needs no switch).
    disk_path: Option<String>,
    disk_size: Option<SizeValue>,
    disk_reformat: Option<bool>,
    descriptor_cache: Option<bool>,
    place_ahead: Option<bool>,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Num(u64),
    Text(String),
}

impl SizeValue {
    fn bytes(&self, field: &str) -> Result<u64, ConfigError> {
        match self {
            SizeValue::Num(n) => Ok(*n),
            SizeValue::Text(s) => parse_size(s).map_err(|e| ConfigError(format!("{field}: {e}"))),
        }
    }
}

/// The directory an offload switch that is on names; `missing` says which
/// setting is absent when it names none.
pub fn offload_path(
    path: Option<String>,
    missing: &str,
) -> Result<std::path::PathBuf, ConfigError> {
    match path {
        Some(p) if !p.trim().is_empty() => Ok(p.into()),
        _ => Err(ConfigError(missing.to_string())),
    }
}

pub fn system_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl ClientConfig {
    /// Defaults overridden by the JSON file and env vars of this process.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Same as [`from_env`](Self::from_env) with an explicit variable lookup (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = ClientConfig::default();
        let var = |name: &str| {
            get(&format!("CRESCENT_{name}")).or_else(|| get(&format!("MOONCAKE_{name}")))
        };
        if let Some(path) = var("CONFIG_PATH") {
            c.apply_json_file(&path)?;
        }
        if let Some(v) = var("MASTER") {
            c.master = v;
        }
        if let Some(v) = var("LOCAL_HOSTNAME") {
            c.local_hostname = v;
        }
        if let Some(v) = var("GLOBAL_SEGMENT_SIZE") {
            c.global_segment_size =
                parse_size(&v).map_err(|e| ConfigError(format!("GLOBAL_SEGMENT_SIZE: {e}")))?;
        }
        if let Some(v) = var("LOCAL_BUFFER_SIZE") {
            c.local_buffer_size =
                parse_size(&v).map_err(|e| ConfigError(format!("LOCAL_BUFFER_SIZE: {e}")))?;
        }
        if let Some(v) = var("PROTOCOL") {
            c.protocol = v.parse().map_err(ConfigError)?;
        }
        if let Some(v) = var("DEVICE") {
            c.device_name = v;
        }
        if let Some(v) = get("CRESCENT_TRANSFER_LISTEN") {
            c.transfer_listen = v;
        }
        if let Some(v) = var("DEGRADE_AFTER") {
            c.degrade_after = crescent_proto::units::parse_duration(&v)
                .map_err(|e| ConfigError(format!("DEGRADE_AFTER: {e}")))?;
        }
        if let Some(v) = get("CRESCENT_PUBLISH_ON_RECOVER") {
            c.publish_on_recover = !matches!(v.as_str(), "0" | "false" | "no");
        }
        if let Some(v) = get("CRESCENT_TOKEN_FILE") {
            c.token_file = Some(v.into());
        }
        if let Some(v) = get("CRESCENT_TLS_CERT") {
            c.tls_cert = Some(v.into());
        }
        if let Some(v) = get("CRESCENT_TLS_KEY") {
            c.tls_key = Some(v.into());
        }
        if let Some(v) = get("CRESCENT_TLS_CA") {
            c.tls_ca = Some(v.into());
        }
        if let Some(v) = get("CRESCENT_ETCD_TLS") {
            c.etcd_tls = boolish("CRESCENT_ETCD_TLS", &v)?;
        }
        if let Some(v) = get("CRESCENT_DATA_TLS") {
            c.data_tls = boolish("CRESCENT_DATA_TLS", &v)?;
        }
        if let Some(v) = get("CRESCENT_SHM") {
            c.shm = matches!(v.as_str(), "1" | "true" | "yes");
        }
        // Mooncake's offload path counts only with its switch on, as there
        // (and as crescent-store reads the same two variables).
        // Off, it turns off what the JSON file turned on.
        if let Some(on) = get("MOONCAKE_ENABLE_SSD_OFFLOAD") {
            c.disk_path = if boolish("MOONCAKE_ENABLE_SSD_OFFLOAD", &on)? {
                Some(offload_path(
                    get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"),
                    "MOONCAKE_ENABLE_SSD_OFFLOAD is on but MOONCAKE_OFFLOAD_FILE_STORAGE_PATH is not set",
                )?)
            } else {
                None
            };
        }
        if let Some(v) = get("CRESCENT_DISK_PATH").filter(|v| !v.is_empty()) {
            c.disk_path = Some(v.into());
        }
        if let Some(v) = get("CRESCENT_DISK_REFORMAT") {
            c.disk_reformat = boolish("CRESCENT_DISK_REFORMAT", &v)?;
        }
        if let Some(v) = get("CRESCENT_DESCRIPTOR_CACHE") {
            c.descriptor_cache = boolish("CRESCENT_DESCRIPTOR_CACHE", &v)?;
        }
        if let Some(v) = get("CRESCENT_PLACE_AHEAD") {
            c.place_ahead = boolish("CRESCENT_PLACE_AHEAD", &v)?;
        }
        if let Some(v) = get("CRESCENT_DISK_SIZE") {
            c.disk_size =
                parse_size(&v).map_err(|e| ConfigError(format!("CRESCENT_DISK_SIZE: {e}")))?;
        }
        Ok(c)
    }

    pub fn apply_json_file(&mut self, path: &str) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {path}: {e}")))?;
        self.apply_json(&text)
            .map_err(|e| ConfigError(format!("{path}: {}", e.0)))
    }

    pub fn apply_json(&mut self, text: &str) -> Result<(), ConfigError> {
        let j: JsonConfig = serde_json::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        if !j.other.is_empty() {
            let names: Vec<&str> = j.other.keys().map(String::as_str).collect();
            tracing::warn!(fields = ?names, "Mooncake config: fields Crescent does not use are ignored");
        }
        if let Some(v) = j.local_hostname {
            self.local_hostname = v;
        }
        if let Some(v) = j.master_server_address {
            self.master = v;
        }
        // Mooncake's separate metadata server has no counterpart: masters hold all metadata.
        let _ = j.metadata_server;
        if let Some(v) = j.global_segment_size {
            self.global_segment_size = v.bytes("global_segment_size")?;
        }
        if let Some(v) = j.local_buffer_size {
            self.local_buffer_size = v.bytes("local_buffer_size")?;
        }
        if let Some(v) = j.protocol {
            self.protocol = v.parse().map_err(ConfigError)?;
        }
        if let Some(v) = j.device_name {
            self.device_name = v;
        }
        if let Some(v) = j.token_file {
            self.token_file = Some(v.into());
        }
        if let Some(v) = j.tls_cert {
            self.tls_cert = Some(v.into());
        }
        if let Some(v) = j.tls_key {
            self.tls_key = Some(v.into());
        }
        if let Some(v) = j.tls_ca {
            self.tls_ca = Some(v.into());
        }
        if let Some(v) = j.etcd_tls {
            self.etcd_tls = v;
        }
        if let Some(v) = j.data_tls {
            self.data_tls = v;
        }
        let disk_path = j.disk_path.filter(|v| !v.is_empty());
        if j.enable_ssd_offload == Some(true) {
            self.disk_path = Some(offload_path(
                j.ssd_offload_path
                    .filter(|p| !p.trim().is_empty())
                    .or(disk_path.clone()),
                "enable_ssd_offload is true but neither ssd_offload_path nor disk_path is set",
            )?);
        }
        if let Some(v) = disk_path {
            self.disk_path = Some(v.into());
        }
        if let Some(v) = j.disk_size {
            self.disk_size = v.bytes("disk_size")?;
        }
        if let Some(v) = j.disk_reformat {
            self.disk_reformat = v;
        }
        if let Some(v) = j.descriptor_cache {
            self.descriptor_cache = v;
        }
        if let Some(v) = j.place_ahead {
            self.place_ahead = v;
        }
        Ok(())
    }

    /// The TLS files, read and checked (`None`: plain HTTP/2).
    pub fn tls(&self) -> Result<Option<crescent_auth::tls::TlsFiles>, ConfigError> {
        crescent_auth::tls::TlsFiles::from_flags(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_ca.as_deref(),
        )
        .map_err(|e| ConfigError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn mooncake_env_names_work_and_crescent_twins_win() {
        let c = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_MASTER", "m1:50051"),
            ("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb"),
            ("MOONCAKE_LOCAL_BUFFER_SIZE", "16mb"),
            ("MOONCAKE_PROTOCOL", "tcp"),
            ("MOONCAKE_LOCAL_HOSTNAME", "node-a"),
            ("CRESCENT_LOCAL_HOSTNAME", "node-b"),
        ]))
        .unwrap();
        assert_eq!(c.master, "m1:50051");
        assert_eq!(c.global_segment_size, 4 << 30);
        assert_eq!(c.local_buffer_size, 16 << 20);
        assert_eq!(c.local_hostname, "node-b");
        assert_eq!(c.token_file, None);
        assert!(!c.descriptor_cache, "off unless asked for");
        let cached = ClientConfig::from_lookup(lookup(&[("CRESCENT_DESCRIPTOR_CACHE", "1")]));
        assert!(cached.unwrap().descriptor_cache);
        assert!(
            ClientConfig::from_lookup(lookup(&[("CRESCENT_DESCRIPTOR_CACHE", "lots")])).is_err()
        );
        assert!(c.place_ahead, "on unless turned off");
        let off = ClientConfig::from_lookup(lookup(&[("CRESCENT_PLACE_AHEAD", "0")]));
        assert!(!off.unwrap().place_ahead);
        assert!(ClientConfig::from_lookup(lookup(&[("CRESCENT_PLACE_AHEAD", "maybe")])).is_err());
        let c = ClientConfig::from_lookup(lookup(&[("CRESCENT_TOKEN_FILE", "/run/t")])).unwrap();
        assert_eq!(
            c.token_file.as_deref(),
            Some(std::path::Path::new("/run/t"))
        );
        assert!(
            ClientConfig::from_lookup(lookup(&[("MOONCAKE_PROTOCOL", "carrier-pigeon")])).is_err()
        );
        let c = ClientConfig::from_lookup(lookup(&[("CRESCENT_TLS_CA", "/run/ca.pem")])).unwrap();
        assert_eq!(
            c.tls_ca.as_deref(),
            Some(std::path::Path::new("/run/ca.pem"))
        );
        let err = c.tls().unwrap_err().to_string();
        assert!(
            err.contains("--tls-cert"),
            "half a TLS set-up is refused: {err}"
        );
        assert!(
            ClientConfig::from_lookup(lookup(&[("MOONCAKE_GLOBAL_SEGMENT_SIZE", "lots")])).is_err()
        );
        // etcd over TLS needs the TLS files, and says so.
        let etcd_files = |c: &ClientConfig| {
            let tls = c.tls().unwrap();
            crescent_auth::tls::for_etcd(c.etcd_tls, tls.as_ref()).map(|f| f.is_some())
        };
        let c = ClientConfig::from_lookup(lookup(&[("CRESCENT_ETCD_TLS", "1")])).unwrap();
        assert!(c.etcd_tls);
        let err = etcd_files(&c).unwrap_err().to_string();
        assert!(
            err.contains("etcd_tls") && err.contains("tls_cert"),
            "{err}"
        );
        let c = ClientConfig::from_lookup(lookup(&[("CRESCENT_ETCD_TLS", "0")])).unwrap();
        assert!(!etcd_files(&c).unwrap());
        let c = ClientConfig::from_lookup(lookup(&[("CRESCENT_ETCD_TLS", "On")])).unwrap();
        assert!(c.etcd_tls);
        assert!(ClientConfig::from_lookup(lookup(&[("CRESCENT_ETCD_TLS", "maybe")])).is_err());
        // The data port's switch reads the same way, and needs the files too.
        let c = ClientConfig::from_lookup(lookup(&[("CRESCENT_DATA_TLS", "yes")])).unwrap();
        assert!(c.data_tls);
        assert!(crescent_auth::tls::for_data_port(c.data_tls, None).is_err());
        assert!(ClientConfig::from_lookup(lookup(&[("CRESCENT_DATA_TLS", "maybe")])).is_err());
        let c = ClientConfig::from_lookup(lookup(&[])).unwrap();
        assert!(!c.data_tls, "the data port is clear text unless asked");
    }

    #[test]
    fn mooncake_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mooncake.json");
        std::fs::write(
            &path,
            r#"{"local_hostname": "h1", "master_server_address": "m:1", "global_segment_size": "1gb",
                "local_buffer_size": 1048576, "protocol": "rdma", "device_name": "mlx5_0", "metadata_server": "P2PHANDSHAKE"}"#,
        )
        .unwrap();
        let p = path.display().to_string();
        let c = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_CONFIG_PATH", &p),
            ("MOONCAKE_MASTER", "env:2"),
        ]))
        .unwrap();
        assert_eq!(c.local_hostname, "h1");
        assert_eq!(c.master, "env:2", "env overrides the file");
        assert_eq!(c.global_segment_size, 1 << 30);
        assert_eq!(c.local_buffer_size, 1 << 20);
        assert_eq!(c.protocol, Protocol::Rdma);
        assert_eq!(c.device_name, "mlx5_0");
        // Fields engines add for themselves are ignored; bad values are not.
        std::fs::write(
            &path,
            r#"{"transfer_timeout": 1, "master_server_address": "m:2"}"#,
        )
        .unwrap();
        let c = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap();
        assert_eq!(c.master, "m:2");
        std::fs::write(&path, r#"{"global_segment_size": "lots"}"#).unwrap();
        assert!(ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).is_err());
        std::fs::write(&path, r#"{"protocol": 7}"#).unwrap();
        assert!(ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).is_err());
    }

    #[test]
    fn the_disk_tier_is_named_as_mooncake_names_its_offload() {
        let none = ClientConfig::from_lookup(lookup(&[])).unwrap();
        assert_eq!((none.disk_path, none.disk_size), (None, DEFAULT_DISK_SIZE));
        // Mooncake's path counts only with its switch on.
        let off = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/ssd/a"),
            ("MOONCAKE_ENABLE_SSD_OFFLOAD", "0"),
        ]))
        .unwrap();
        assert_eq!(off.disk_path, None);
        let on = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/ssd/a"),
            ("MOONCAKE_ENABLE_SSD_OFFLOAD", "true"),
            ("CRESCENT_DISK_SIZE", "2gb"),
        ]))
        .unwrap();
        assert_eq!(
            on.disk_path.as_deref(),
            Some(std::path::Path::new("/ssd/a"))
        );
        assert_eq!(on.disk_size, 2 << 30);
        assert!(
            !on.disk_reformat,
            "a file of another size is refused unless asked"
        );
        let reformat =
            ClientConfig::from_lookup(lookup(&[("CRESCENT_DISK_REFORMAT", "yes")])).unwrap();
        assert!(reformat.disk_reformat);
        assert!(
            ClientConfig::from_lookup(lookup(&[("CRESCENT_DISK_REFORMAT", "perhaps")])).is_err()
        );
        let crescent_wins = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/ssd/a"),
            ("MOONCAKE_ENABLE_SSD_OFFLOAD", "1"),
            ("CRESCENT_DISK_PATH", "/ssd/b"),
        ]))
        .unwrap();
        let b = Some(std::path::Path::new("/ssd/b"));
        assert_eq!(crescent_wins.disk_path.as_deref(), b);
        // The switch with no path, or a bad size, is an error, not memory only.
        let e =
            ClientConfig::from_lookup(lookup(&[("MOONCAKE_ENABLE_SSD_OFFLOAD", "1")])).unwrap_err();
        assert!(e.0.contains("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"), "{e}");
        assert!(ClientConfig::from_lookup(lookup(&[("CRESCENT_DISK_SIZE", "big")])).is_err());
        assert!(
            ClientConfig::from_lookup(lookup(&[("MOONCAKE_ENABLE_SSD_OFFLOAD", "maybe")])).is_err()
        );

        // JSON: Mooncake's pair, Crescent's names; the environment wins.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mooncake.json");
        let p = path.display().to_string();
        std::fs::write(
            &path,
            r#"{"enable_ssd_offload": true, "ssd_offload_path": "/ssd/j", "disk_size": "1gb"}"#,
        )
        .unwrap();
        let j = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap();
        assert_eq!(j.disk_path.as_deref(), Some(std::path::Path::new("/ssd/j")));
        assert_eq!(j.disk_size, 1 << 30);
        assert!(!j.disk_reformat);
        std::fs::write(&path, r#"{"disk_path": "/ssd/j", "disk_reformat": true}"#).unwrap();
        let jr = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap();
        assert!(jr.disk_reformat);
        std::fs::write(
            &path,
            r#"{"enable_ssd_offload": true, "ssd_offload_path": "/ssd/j", "disk_size": "1gb"}"#,
        )
        .unwrap();
        let env = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_CONFIG_PATH", &p),
            ("CRESCENT_DISK_PATH", "/ssd/e"),
        ]))
        .unwrap();
        assert_eq!(
            env.disk_path.as_deref(),
            Some(std::path::Path::new("/ssd/e"))
        );
        std::fs::write(
            &path,
            r#"{"enable_ssd_offload": false, "ssd_offload_path": "/ssd/j"}"#,
        )
        .unwrap();
        let j = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap();
        assert_eq!(j.disk_path, None);
        std::fs::write(&path, r#"{"disk_path": "/ssd/c"}"#).unwrap();
        let j = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap();
        assert_eq!(j.disk_path.as_deref(), Some(std::path::Path::new("/ssd/c")));
        std::fs::write(&path, r#"{"enable_ssd_offload": true}"#).unwrap();
        let e = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap_err();
        assert!(e.0.contains("ssd_offload_path"), "{e}");
        // The switch with Crescent's name for the directory; the
        // environment's switch, off, turns the file's off.
        std::fs::write(
            &path,
            r#"{"enable_ssd_offload": true, "disk_path": "/ssd/d"}"#,
        )
        .unwrap();
        let j = ClientConfig::from_lookup(lookup(&[("MOONCAKE_CONFIG_PATH", &p)])).unwrap();
        assert_eq!(j.disk_path.as_deref(), Some(std::path::Path::new("/ssd/d")));
        std::fs::write(
            &path,
            r#"{"enable_ssd_offload": true, "ssd_offload_path": "/ssd/j"}"#,
        )
        .unwrap();
        let off = ClientConfig::from_lookup(lookup(&[
            ("MOONCAKE_CONFIG_PATH", &p),
            ("MOONCAKE_ENABLE_SSD_OFFLOAD", "false"),
        ]))
        .unwrap();
        assert_eq!(off.disk_path, None);
    }
}
