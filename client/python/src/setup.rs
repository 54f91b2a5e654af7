//! Mooncake's `setup` arguments, by its names, in every form it accepts
//! (positional, keyword, a config dict), and sizes given as numbers or text.

use super::*;

/// A size given as a number or as text like "4gb" (Mooncake's config files
/// and SGLang's env vars use both).
pub(crate) fn size_arg(name: &str, v: &Bound<'_, PyAny>) -> Result<u64, String> {
    if let Ok(n) = v.extract::<i64>() {
        return u64::try_from(n).map_err(|_| format!("{name} must not be negative, got {n}"));
    }
    if let Ok(s) = v.extract::<String>() {
        return crescent_proto::units::parse_size(&s).map_err(|e| format!("{name}: {e}"));
    }
    Err(format!(
        "{name} must be an int or a size string like \"4gb\""
    ))
}

/// `size_arg` for an argument that may be absent or None.
pub(crate) fn opt_size(name: &str, v: Option<&Bound<'_, PyAny>>) -> Result<Option<u64>, String> {
    v.filter(|v| !v.is_none())
        .map(|v| size_arg(name, v))
        .transpose()
}

/// Setup arguments, by Mooncake's names, whether passed positionally, by
/// keyword or as `setup(config: dict)`.
pub(crate) struct SetupArgs {
    pub(crate) local_hostname: Option<String>,
    pub(crate) global_segment_size: Option<u64>,
    pub(crate) local_buffer_size: Option<u64>,
    pub(crate) protocol: Option<String>,
    pub(crate) rdma_devices: Option<String>,
    pub(crate) master_server_addr: Option<String>,
    pub(crate) enable_ssd_offload: bool,
    pub(crate) ssd_offload_path: Option<String>,
}

impl SetupArgs {
    pub(crate) fn from_dict(d: &Bound<'_, PyDict>) -> Result<Self, String> {
        let text = |names: &[&str]| -> Result<Option<String>, String> {
            for n in names {
                if let Some(v) = d.get_item(n).map_err(|e| e.to_string())? {
                    if v.is_none() {
                        continue;
                    }
                    return v
                        .extract::<String>()
                        .map(Some)
                        .map_err(|_| format!("{n} must be a string"));
                }
            }
            Ok(None)
        };
        let size = |n: &str| -> Result<Option<u64>, String> {
            opt_size(n, d.get_item(n).map_err(|e| e.to_string())?.as_ref())
        };
        Ok(SetupArgs {
            local_hostname: text(&["local_hostname"])?,
            global_segment_size: size("global_segment_size")?,
            local_buffer_size: size("local_buffer_size")?,
            protocol: text(&["protocol"])?,
            rdma_devices: text(&["rdma_devices", "device_name"])?,
            master_server_addr: text(&["master_server_addr", "master_server_address"])?,
            enable_ssd_offload: d
                .get_item("enable_ssd_offload")
                .map_err(|e| e.to_string())?
                .map(|v| v.is_truthy().unwrap_or(false))
                .unwrap_or(false),
            ssd_offload_path: text(&["ssd_offload_path"])?,
        })
    }

    /// The environment's configuration (`MOONCAKE_CONFIG_PATH`, `MOONCAKE_*`,
    /// `CRESCENT_*`) with these arguments on top.
    pub(crate) fn config(self) -> Result<ClientConfig, String> {
        let mut c = ClientConfig::from_env().map_err(|e| e.to_string())?;
        if let Some(h) = self.local_hostname.filter(|h| !h.is_empty()) {
            // Mooncake's local_hostname may carry a port ("host:12345"):
            // the name is what same-host transports match on.
            c.local_hostname = match h.rsplit_once(':') {
                Some((host, port)) if port.parse::<u16>().is_ok() && !host.contains(':') => {
                    host.to_string()
                }
                _ => h,
            };
        }
        if let Some(s) = self.global_segment_size {
            c.global_segment_size = s;
        }
        if let Some(s) = self.local_buffer_size {
            c.local_buffer_size = s;
        }
        if let Some(m) = self.master_server_addr.filter(|m| !m.is_empty()) {
            c.master = m;
        }
        if let Some(d) = self.rdma_devices {
            c.device_name = d;
        }
        if let Some(p) = self.protocol.filter(|p| !p.is_empty()) {
            c.protocol = p.parse()?;
        }
        if c.protocol == Protocol::Rdma {
            // Engines configured for Mooncake usually say rdma; the client's
            // data path is TCP and same-host shared memory today.
            tracing::warn!("protocol rdma requested: Crescent's client moves bytes over TCP and shared memory; using tcp");
            c.protocol = Protocol::Tcp;
        }
        if self.enable_ssd_offload {
            // The argument's directory, else the one the environment or the
            // config file gave (as `from_env` ranks them), else Mooncake's
            // variable even without its switch: this call is the switch.
            let path = self
                .ssd_offload_path
                .filter(|p| !p.trim().is_empty())
                .or_else(|| c.disk_path.as_ref().map(|p| p.display().to_string()))
                .or_else(|| {
                    std::env::var("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
                        .ok()
                        .filter(|p| !p.trim().is_empty())
                });
            c.disk_path = Some(
                crescent_client::config::offload_path(
                    path,
                    "enable_ssd_offload needs ssd_offload_path (or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)",
                )
                .map_err(|e| e.to_string())?,
            );
        }
        Ok(c)
    }
}
