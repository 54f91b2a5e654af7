//! Containers for the chaos suite and the container tests: a private Docker
//! network with fixed addresses, and containers on it that can be killed,
//! restarted, paused, cut off and healed.
//!
//! `testcontainers` owns each container's lifecycle (create from the local
//! image, start, restart, state, exit code, logs, remove); `bollard`, its own
//! Docker client, does what testcontainers does not: a network with a chosen
//! subnet, a fixed address per container, disconnecting and reconnecting a
//! container, and signals (SIGKILL, SIGSTOP, SIGCONT).
//!
//! Fixed addresses matter: a restarted or reconnected master must keep the
//! address its Raft peers and etcd know it by. testcontainers cannot ask for
//! one at creation, so a container starts on the engine's default bridge,
//! is connected to the private network with its address, and leaves the
//! bridge; its command waits (in the image's `sh`) for a marker file the
//! harness writes once that is done, so the process never opens a
//! connection from the bridge address. Docker keeps the address across
//! restarts, and the marker stays, so a restart starts at once.
//!
//! The engines on these machines speak API 1.41; bollard 0.21 sends
//! unversioned paths, which such an engine accepts (do not set
//! `DOCKER_API_VERSION`).

use std::path::Path;
use std::time::{Duration, Instant};

use bollard::models::{
    EndpointIpamConfig, EndpointSettings, Ipam, IpamConfig, NetworkConnectRequest,
    NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters::KillContainerOptions;
use bollard::Docker;
use testcontainers::core::{AccessMode, Mount};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// The engine's client, from `DOCKER_HOST` or the local socket.
pub fn engine() -> anyhow::Result<Docker> {
    Docker::connect_with_local_defaults().map_err(|e| anyhow::anyhow!("no Docker client: {e}"))
}

/// Why containers of `image` cannot run here, or None when they can.
pub async fn blocker(image: &str) -> Option<String> {
    let docker = match engine() {
        Ok(d) => d,
        Err(e) => return Some(e.to_string()),
    };
    if let Err(e) = docker.version().await {
        return Some(format!("no Docker engine answers ({e})"));
    }
    if docker.inspect_image(image).await.is_err() {
        return Some(format!("image {image} not built (run `make images`)"));
    }
    None
}

/// Whether a Docker engine answers here.
pub async fn engine_answers() -> bool {
    match engine() {
        Ok(d) => d.version().await.is_ok(),
        Err(_) => false,
    }
}

/// A host directory (or file) mounted into a container.
pub struct Bind<'a> {
    pub host: &'a Path,
    pub container: &'a str,
    pub read_only: bool,
}

struct Started {
    name: String,
    ip: String,
    container: ContainerAsync<GenericImage>,
}

/// Where the attach markers are mounted, and the wrapper that waits for one.
const MARKERS_MOUNT: &str = "/crescent-attached";
/// Never starts the process without its address: after 30 s without the
/// marker (or with no `sleep` in an image older than this harness) it fails.
const WAIT_FOR_ATTACH: &str = "m=$1; shift; n=0; \
     while [ ! -e \"$m\" ] && [ $n -lt 600 ]; do sleep 0.05 || exit 125; n=$((n+1)); done; \
     [ -e \"$m\" ] || { echo \"wait-for-attach: $m never appeared\" >&2; exit 125; }; \
     exec \"$@\"";

/// A private network and the containers on it; [`ContainerNet::remove`]
/// (or drop, inside a multi-threaded tokio runtime) removes them all.
pub struct ContainerNet {
    docker: Docker,
    name: String,
    subnet_base: String,
    image: (String, String),
    markers: tempfile::TempDir,
    containers: Vec<Started>,
    removed: bool,
}

impl ContainerNet {
    /// A network named `name` on a free 10.201.x.0/24 (.1 is the gateway,
    /// .2-.127 are ours to fix; the engine hands out only .128 and up).
    pub async fn create(name: &str, image: &str) -> anyhow::Result<Self> {
        let docker = engine()?;
        // A tag follows the last ':' after the last '/' (a registry's
        // "host:5000/name" has a port, not a tag).
        let (repo, tag) = match image.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, tag),
            _ => (image, "latest"),
        };
        let mut chosen = None;
        let mut last_error = String::new();
        for third in (40..250u32).step_by(7) {
            let base = format!("10.201.{third}");
            let request = NetworkCreateRequest {
                name: name.to_string(),
                driver: Some("bridge".into()),
                ipam: Some(Ipam {
                    config: Some(vec![IpamConfig {
                        subnet: Some(format!("{base}.0/24")),
                        ip_range: Some(format!("{base}.128/25")),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                labels: Some([("crescent-test".to_string(), name.to_string())].into()),
                ..Default::default()
            };
            match docker.create_network(request).await {
                Ok(_) => {
                    chosen = Some(base);
                    break;
                }
                Err(e) => last_error = e.to_string(),
            }
        }
        let subnet_base = chosen.ok_or_else(|| {
            anyhow::anyhow!("cannot create a private Docker network: {last_error}")
        })?;
        Ok(Self {
            docker,
            name: name.to_string(),
            subnet_base,
            image: (repo.to_string(), tag.to_string()),
            markers: tempfile::Builder::new()
                .prefix("crescent-attached-")
                .tempdir()?,
            containers: Vec::new(),
            removed: false,
        })
    }

    /// The network's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fixed address of host number `host` (2-127) on this network.
    pub fn ip(&self, host: u32) -> String {
        format!("{}.{host}", self.subnet_base)
    }

    /// Starts container `name` at [`ContainerNet::ip`]`(host)` running
    /// `cmd`, with `binds` mounted; returns once it runs on this network.
    pub async fn run(
        &mut self,
        name: &str,
        host: u32,
        binds: &[Bind<'_>],
        cmd: &[String],
    ) -> anyhow::Result<()> {
        let marker = format!("{MARKERS_MOUNT}/{name}");
        let wrapped: Vec<String> = ["sh", "-c", WAIT_FOR_ATTACH, "wait-for-attach", &marker]
            .iter()
            .map(|s| s.to_string())
            .chain(cmd.iter().cloned())
            .collect();
        let markers = self.markers.path().display().to_string();
        let mut request = GenericImage::new(self.image.0.as_str(), self.image.1.as_str())
            .with_container_name(name)
            .with_hostname(name)
            .with_label("crescent-test", self.name.as_str())
            .with_mount(
                Mount::bind_mount(markers, MARKERS_MOUNT).with_access_mode(AccessMode::ReadOnly),
            )
            .with_cmd(wrapped)
            // testcontainers publishes every exposed port on the host when no
            // mapping is given; the harness reaches containers by their
            // network address, and publishing etcd and admin ports to the
            // host's network is what it must not do.
            .with_host_config_modifier(|host| {
                host.publish_all_ports = Some(false);
                host.port_bindings = None;
            });
        for b in binds {
            let mode = if b.read_only {
                AccessMode::ReadOnly
            } else {
                AccessMode::ReadWrite
            };
            request = request.with_mount(
                Mount::bind_mount(b.host.display().to_string(), b.container).with_access_mode(mode),
            );
        }
        let container = request
            .start()
            .await
            .map_err(|e| anyhow::anyhow!("starting container {name}: {e}"))?;
        let ip = self.ip(host);
        self.containers.push(Started {
            name: name.to_string(),
            ip: ip.clone(),
            container,
        });
        self.connect(name, &ip).await?;
        self.docker
            .disconnect_network(
                "bridge",
                NetworkDisconnectRequest {
                    container: name.to_string(),
                    force: Some(true),
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{name}: leaving the default bridge: {e}"))?;
        std::fs::write(self.markers.path().join(name), b"")?;
        Ok(())
    }

    fn find(&self, name: &str) -> anyhow::Result<&Started> {
        self.containers
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| anyhow::anyhow!("no container {name} on {}", self.name))
    }

    async fn connect(&self, name: &str, ip: &str) -> anyhow::Result<()> {
        let request = NetworkConnectRequest {
            container: name.to_string(),
            endpoint_config: Some(EndpointSettings {
                ipam_config: Some(EndpointIpamConfig {
                    ipv4_address: Some(ip.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        self.docker
            .connect_network(&self.name, request)
            .await
            .map_err(|e| anyhow::anyhow!("connecting {name} to {} at {ip}: {e}", self.name))
    }

    /// Sends `signal` (e.g. "SIGKILL", "SIGSTOP", "SIGCONT") to `name`.
    pub async fn signal(&self, name: &str, signal: &str) -> anyhow::Result<()> {
        self.find(name)?;
        self.docker
            .kill_container(
                name,
                Some(KillContainerOptions {
                    signal: signal.to_string(),
                }),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{signal} to {name}: {e}"))
    }

    /// Starts `name` again after it stopped (same address, same command).
    pub async fn restart(&self, name: &str) -> anyhow::Result<()> {
        self.find(name)?
            .container
            .start()
            .await
            .map_err(|e| anyhow::anyhow!("starting {name} again: {e}"))
    }

    /// Cuts `name` off the network (a partition: it keeps running).
    pub async fn disconnect(&self, name: &str) -> anyhow::Result<()> {
        self.find(name)?;
        self.docker
            .disconnect_network(
                &self.name,
                NetworkDisconnectRequest {
                    container: name.to_string(),
                    force: Some(false),
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("disconnecting {name}: {e}"))
    }

    /// Connects `name` back at its own address.
    pub async fn reconnect(&self, name: &str) -> anyhow::Result<()> {
        let ip = self.find(name)?.ip.clone();
        self.connect(name, &ip).await
    }

    pub async fn is_running(&self, name: &str) -> anyhow::Result<bool> {
        Ok(self.find(name)?.container.is_running().await?)
    }

    pub async fn exit_code(&self, name: &str) -> anyhow::Result<Option<i64>> {
        Ok(self.find(name)?.container.exit_code().await?)
    }

    /// Everything `name` wrote so far, stdout then stderr.
    pub async fn logs(&self, name: &str) -> anyhow::Result<String> {
        let c = &self.find(name)?.container;
        let mut text = String::from_utf8_lossy(&c.stdout_to_vec().await?).into_owned();
        text.push_str(&String::from_utf8_lossy(&c.stderr_to_vec().await?));
        Ok(text)
    }

    /// Waits until `name` has logged `needle`.
    pub async fn wait_for_log(
        &self,
        name: &str,
        needle: &str,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if self.logs(name).await?.contains(needle) {
                return Ok(());
            }
            anyhow::ensure!(
                self.is_running(name).await?,
                "{name} exited before logging {needle:?}"
            );
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} did not log {needle:?} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Names of the containers started so far, in order.
    pub fn names(&self) -> Vec<String> {
        self.containers.iter().map(|c| c.name.clone()).collect()
    }

    /// Removes every container (with its anonymous volumes) and the network.
    pub async fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        for c in self.containers.drain(..) {
            if let Err(e) = c.container.rm().await {
                eprintln!("removing container {}: {e}", c.name);
            }
        }
        if let Err(e) = self.docker.remove_network(&self.name).await {
            eprintln!("removing network {}: {e}", self.name);
        }
    }
}

impl Drop for ContainerNet {
    fn drop(&mut self) {
        // Removing needs a multi-threaded runtime to block in (as the
        // containers' own drop does); elsewhere the engine keeps them, and
        // the network, until someone removes them.
        let multi_threaded = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_threaded && !self.removed {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(self.remove())
            });
        }
    }
}
