//! The native half of the Python package `crescent`: Mooncake's
//! `MooncakeDistributedStore` API over the Rust [`crescent_client::Client`].
//!
//! Owns the translation between Python and the client: argument forms and
//! names as Mooncake's pybind module has them, its return conventions (0 or a
//! negative Mooncake error code, `b""` for a missed get), the registry of
//! caller buffers that raw-pointer calls must fall inside, and one tokio
//! runtime for every store object of the process. Every call that does I/O
//! releases the GIL. It must not implement any protocol (the client does) and
//! holds no state a master owns.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crescent_client::mooncake::{self, error_number};
use crescent_client::{Client, ClientConfig, Protocol};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

mod buffers;
mod descriptor;
mod host_memory;
mod replicate;
mod setup;
use buffers::*;
use descriptor::ReplicaDescriptor;
use host_memory::{HostBlocks, MemPool};
use replicate::{replicate_config, ObjectDataType, ReplicateConfig, SoftPinAction};
use setup::*;

/// One runtime for the process: engines create a store object or two and
/// call it from many threads; each call blocks its (GIL-free) thread on it.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let workers = std::thread::available_parallelism()
            .map(|n| n.get().clamp(2, 8))
            .unwrap_or(2);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("crescent-py")
            .enable_all()
            .build()
            .expect("cannot start the crescent runtime")
    })
}

/// Runs `f` on the runtime's workers with the GIL released, and waits for
/// it. Polling it on a worker rather than on this thread (`block_on`) saves a
/// cross-thread wake-up per I/O readiness event: a 1 MiB get does dozens.
fn block<F>(py: Python<'_>, f: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let task = async move {
            // Declared first, dropped last: `rx` below returns only after
            // `f` (and whatever it borrows) is gone.
            let tx = tx;
            let f = f;
            let _ = tx.send(f.await);
        };
        let task: std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> = Box::pin(task);
        // SAFETY: `f` may borrow from this stack frame. This thread waits
        // on `rx` until the task has sent its result or been dropped, so
        // nothing `f` borrows is used after this function returns. The
        // runtime is never shut down, so the task is not leaked mid-poll.
        let task: std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>> =
            unsafe { std::mem::transmute(task) };
        let handle = runtime().spawn(task);
        match rx.recv() {
            Ok(out) => out,
            // The task ended without a result: it panicked. Re-raise the
            // panic here (PyO3 turns it into a Python PanicException).
            Err(_) => match runtime().block_on(handle) {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                _ => panic!("a crescent task ended without a result"),
            },
        }
    })
}

/// Mooncake answers calls on a store that is not set up (or closed) with
/// this code: "request cannot be done in current status".
const NOT_SET_UP: i32 = mooncake::UNAVAILABLE_IN_CURRENT_STATUS;

/// A count or size, or Mooncake's negative code.
fn count_or_code(r: crescent_client::client::Result<u64>) -> i64 {
    match r {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(e) => error_number(&e).into(),
    }
}

fn code_of<T>(r: &crescent_client::client::Result<T>) -> i32 {
    match r {
        Ok(_) => mooncake::OK,
        Err(e) => error_number(e),
    }
}

/// Puts `values` (index into `keys`, bytes) in one batch and writes each
/// result into `codes`, which arrives holding the codes of items already
/// refused. A key twice in one batch is one object: the first occurrence is
/// put, the others get its result (Mooncake answers them "already exists",
/// which it reports as success).
fn put_each(
    py: Python<'_>,
    c: &Client,
    cfg: &crescent_client::ReplicateConfig,
    keys: &[String],
    mut codes: Vec<i32>,
    mut values: Vec<(usize, Cow<'_, [u8]>)>,
) -> Vec<i32> {
    let mut first_of: HashMap<&str, usize> = HashMap::new();
    let mut duplicates: Vec<(usize, usize)> = Vec::new();
    values.retain(|(i, _)| match first_of.get(keys[*i].as_str()) {
        Some(&first) => {
            duplicates.push((*i, first));
            false
        }
        None => {
            first_of.insert(keys[*i].as_str(), *i);
            true
        }
    });
    let items: Vec<(&str, &[u8])> = values
        .iter()
        .map(|(i, v)| (keys[*i].as_str(), v.as_ref()))
        .collect();
    match block(py, async { c.batch_put_from(&items, cfg).await }) {
        Ok(rs) => {
            for ((i, _), r) in values.iter().zip(&rs) {
                codes[*i] = code_of(r);
            }
        }
        Err(e) => {
            for (i, _) in &values {
                codes[*i] = error_number(&e);
            }
        }
    }
    for (dup, first) in duplicates {
        codes[dup] = codes[first];
    }
    codes
}

/// Mooncake's `MooncakeDistributedStore`, backed by a Crescent client.
/// Subclassed in Python (`crescent.store`), which adds the tensor calls.
#[pyclass(subclass, module = "crescent._native")]
struct MooncakeDistributedStore {
    client: Arc<ClientSlot>,
    registered: Mutex<Registered>,
    /// What `get_hostname` answers: the name this client registered under.
    hostname: Mutex<String>,
    mem_pool: Mutex<MemPool>,
}

impl MooncakeDistributedStore {
    fn client(&self) -> Option<Arc<Client>> {
        self.client.read().ok().and_then(|c| c.clone())
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registered> {
        self.registered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, MemPool> {
        self.mem_pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn connect(&self, py: Python<'_>, config: ClientConfig) -> i32 {
        if self.client().is_some() {
            tracing::warn!("setup called on a store that is already set up; close() it first");
            return mooncake::INVALID_PARAMS;
        }
        let hostname = config.local_hostname.clone();
        let client = match block(py, Client::connect(config)) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::warn!(error = %e, "setup failed");
                return error_number(&e);
            }
        };
        // LMCache passes get_hostname() as a preferred segment: with a
        // segment of our own, that is its name.
        let name = client
            .local_store()
            .map(|a| a.name.clone())
            .unwrap_or(hostname);
        let lost_race = match self.client.write() {
            Ok(mut slot) if slot.is_none() => {
                *slot = Some(client);
                remember_open(&self.client);
                None
            }
            // Another thread's setup finished first (or the lock is
            // poisoned): keep its client, close ours.
            _ => Some(client),
        };
        if let Some(extra) = lost_race {
            block(py, async move { extra.close().await });
            tracing::warn!("setup called concurrently on one store; the first one won");
            return mooncake::INVALID_PARAMS;
        }
        if let Ok(mut h) = self.hostname.lock() {
            *h = name;
        }
        mooncake::OK
    }

    /// The bytes of each buffer object; TypeError or ValueError for one that
    /// is not a C-contiguous buffer.
    fn buffers(values: &[Bound<'_, PyAny>]) -> PyResult<Vec<PyUntypedBuffer>> {
        values
            .iter()
            .map(|v| {
                let b = PyUntypedBuffer::get(v).map_err(|_| {
                    PyTypeError::new_err(format!(
                        "value must support the buffer protocol (bytes, bytearray, memoryview, ...), got {}",
                        v.get_type()
                    ))
                })?;
                if !b.is_c_contiguous() {
                    return Err(PyValueError::new_err("value buffer must be C-contiguous"));
                }
                Ok(b)
            })
            .collect()
    }
}

impl Drop for MooncakeDistributedStore {
    /// A store collected without close() still unmounts its segment, and
    /// waits for it (at most [`CLOSE_WAIT`]): the client's background work
    /// holds its own references and would keep the segment mounted for the
    /// life of the process, and one closed in the background may not finish
    /// before the process exits, leaving the masters placing puts on a
    /// segment nobody serves until its client TTL runs out.
    fn drop(&mut self) {
        let taken = self.client.write().ok().and_then(|mut c| c.take());
        close_all_within(taken.into_iter().collect(), CLOSE_WAIT);
    }
}

/// A store's connection, shared with the exit hook.
type ClientSlot = RwLock<Option<Arc<Client>>>;

/// Longest a store dropped or left open at exit waits for its close
/// (segment unmounted, placements ahead given back).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Stores set up and not closed, for the exit hook.
fn open_stores() -> std::sync::MutexGuard<'static, Vec<std::sync::Weak<ClientSlot>>> {
    static OPEN: OnceLock<Mutex<Vec<std::sync::Weak<ClientSlot>>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn remember_open(slot: &Arc<ClientSlot>) {
    let mut open = open_stores();
    open.retain(|w| w.strong_count() > 0);
    open.push(Arc::downgrade(slot));
}

/// Closes `clients` at once on the runtime and waits for all of them, at
/// most `wait`. Works from any thread, a runtime thread included.
fn close_all_within(clients: Vec<Arc<Client>>, wait: std::time::Duration) {
    if clients.is_empty() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        futures::future::join_all(clients.iter().map(|c| c.close())).await;
        let _ = tx.send(());
    });
    if rx.recv_timeout(wait).is_err() {
        tracing::warn!(?wait, "a store left open did not close in time; the masters unmount its segment after the client TTL");
    }
}

/// Registered with `atexit`: a process that exits without `close()` (or
/// whose stores are never collected) unmounts their segments first.
#[pyfunction]
fn _close_open_stores(py: Python<'_>) {
    let clients: Vec<Arc<Client>> = open_stores()
        .drain(..)
        .filter_map(|w| w.upgrade())
        .filter_map(|slot| slot.write().ok().and_then(|mut c| c.take()))
        .collect();
    py.detach(|| close_all_within(clients, CLOSE_WAIT));
}

#[pymethods]
impl MooncakeDistributedStore {
    #[new]
    fn new() -> Self {
        MooncakeDistributedStore {
            client: Arc::new(RwLock::new(None)),
            registered: Mutex::new(Registered::default()),
            hostname: Mutex::new(String::new()),
            mem_pool: Mutex::new(MemPool::default()),
        }
    }

    /// Connects to the masters; with `global_segment_size > 0` also
    /// contributes that much memory to the pool. Mooncake's arguments, by
    /// position or keyword, or one dict of them. `metadata_server` is
    /// accepted and unused (the masters hold all metadata).
    #[pyo3(signature = (local_hostname=None, metadata_server=None, global_segment_size=None, local_buffer_size=None, protocol=None, rdma_devices=None, master_server_addr=None, engine=None, enable_ssd_offload=false, ssd_offload_path=None, tenant_id=None, enable_client_http_server=false, client_http_port=9300))]
    #[allow(clippy::too_many_arguments)]
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: Option<Bound<'_, PyAny>>,
        metadata_server: Option<Bound<'_, PyAny>>,
        global_segment_size: Option<Bound<'_, PyAny>>,
        local_buffer_size: Option<Bound<'_, PyAny>>,
        protocol: Option<String>,
        rdma_devices: Option<String>,
        master_server_addr: Option<String>,
        engine: Option<Bound<'_, PyAny>>,
        enable_ssd_offload: bool,
        ssd_offload_path: Option<String>,
        tenant_id: Option<String>,
        enable_client_http_server: bool,
        client_http_port: i64,
    ) -> PyResult<i32> {
        let _ = (
            metadata_server,
            engine,
            enable_client_http_server,
            client_http_port,
        );
        if tenant_id.as_deref().is_some_and(|t| t != "default") {
            tracing::warn!("tenant_id is not supported yet; every tenant shares one namespace");
        }
        let args = match local_hostname.as_ref().map(|h| h.cast::<PyDict>()) {
            Some(Ok(dict)) => SetupArgs::from_dict(dict),
            _ => (|| {
                Ok(SetupArgs {
                    local_hostname: local_hostname
                        .as_ref()
                        .filter(|h| !h.is_none())
                        .map(|h| h.extract::<String>())
                        .transpose()
                        .map_err(|_| "local_hostname must be a string or a dict".to_string())?,
                    global_segment_size: opt_size(
                        "global_segment_size",
                        global_segment_size.as_ref(),
                    )?,
                    local_buffer_size: opt_size("local_buffer_size", local_buffer_size.as_ref())?,
                    protocol,
                    rdma_devices,
                    master_server_addr,
                    enable_ssd_offload,
                    ssd_offload_path,
                })
            })(),
        };
        let config = match args.and_then(SetupArgs::config) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("setup: {e}");
                return Ok(mooncake::INVALID_PARAMS);
            }
        };
        Ok(self.connect(py, config))
    }

    /// SGLang's standalone mode: this process holds no segment; the pool's
    /// memory is a separate `crescent-store` on this host, which this client
    /// reaches through shared memory. Masters come from the environment
    /// (`MOONCAKE_MASTER`, `MOONCAKE_CONFIG_PATH`); `server_address` is
    /// accepted for compatibility.
    #[pyo3(signature = (mem_pool_size, local_buffer_size, server_address))]
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: Bound<'_, PyAny>,
        local_buffer_size: Bound<'_, PyAny>,
        server_address: String,
    ) -> i32 {
        let _ = server_address;
        let config = (|| {
            let pool = size_arg("mem_pool_size", &mem_pool_size)?;
            let pool =
                usize::try_from(pool).map_err(|_| format!("mem_pool_size {pool} is too large"))?;
            let mut c = ClientConfig::from_env().map_err(|e| e.to_string())?;
            c.global_segment_size = 0;
            c.local_buffer_size = size_arg("local_buffer_size", &local_buffer_size)?;
            Ok::<_, String>((c, pool))
        })();
        match config {
            Ok((c, pool)) => {
                let code = self.connect(py, c);
                if code == mooncake::OK {
                    self.pool().open(pool);
                }
                code
            }
            Err(e) => {
                tracing::warn!("setup_dummy: {e}");
                mooncake::INVALID_PARAMS
            }
        }
    }

    /// Unmounts this client's segment (if any) and disconnects. Idempotent.
    fn close(&self, py: Python<'_>) -> i32 {
        let taken = self.client.write().ok().and_then(|mut c| c.take());
        if let Some(c) = taken {
            block(py, async move {
                c.close().await;
                drop(c);
            });
        }
        self.registry().0.clear();
        self.pool().retire();
        mooncake::OK
    }

    /// A dummy client's (`setup_dummy`) memory: the address of `size` bytes
    /// of its `mem_pool_size`, to register and use in zero-copy calls; 0 when
    /// the pool has no room, and always 0 for a client set up with `setup`.
    /// The memory lives as long as this store object.
    #[pyo3(signature = (size, /))]
    fn alloc_from_mem_pool(&self, size: usize) -> usize {
        self.pool().alloc(size)
    }

    /// 0 healthy, 1 not set up, 2 no master reachable (serving local-only).
    fn health_check(&self) -> i32 {
        match self.client() {
            None => 1,
            Some(c) if c.is_degraded() => 2,
            Some(_) => 0,
        }
    }

    fn get_hostname(&self) -> String {
        self.hostname.lock().map(|h| h.clone()).unwrap_or_default()
    }

    // ------------------------------------------------------------ copying

    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        value: Bound<'_, PyAny>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        let Some(cfg) = replicate_config(config.as_ref())? else {
            return Ok(mooncake::INVALID_PARAMS);
        };
        let bufs = Self::buffers(std::slice::from_ref(&value))?;
        let Some(c) = self.client() else {
            return Ok(NOT_SET_UP);
        };
        let data = buffer_slice(&bufs[0]);
        Ok(code_of(&block(py, async { c.put(&key, data, &cfg).await })))
    }

    /// One object made of the parts, in order.
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: Vec<Bound<'_, PyAny>>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        let Some(cfg) = replicate_config(config.as_ref())? else {
            return Ok(mooncake::INVALID_PARAMS);
        };
        let bufs = Self::buffers(&parts)?;
        let Some(c) = self.client() else {
            return Ok(NOT_SET_UP);
        };
        let mut value = Vec::with_capacity(bufs.iter().map(|b| b.len_bytes()).sum());
        for b in &bufs {
            value.extend_from_slice(buffer_slice(b));
        }
        Ok(code_of(&block(py, async {
            c.put(&key, &value, &cfg).await
        })))
    }

    /// One object per key, made of that key's parts in order (buffer
    /// objects, as `put_parts` takes); per key, 0 or a negative code.
    #[pyo3(signature = (keys, all_parts, config=None))]
    fn batch_put_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_parts: Vec<Vec<Bound<'_, PyAny>>>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i32>> {
        if keys.len() != all_parts.len() {
            return Ok(vec![mooncake::INVALID_PARAMS; keys.len()]);
        }
        let Some(cfg) = replicate_config(config.as_ref())? else {
            return Ok(vec![mooncake::INVALID_PARAMS; keys.len()]);
        };
        let bufs = all_parts
            .iter()
            .map(|parts| Self::buffers(parts))
            .collect::<PyResult<Vec<_>>>()?;
        let Some(c) = self.client() else {
            return Ok(vec![NOT_SET_UP; keys.len()]);
        };
        let values = bufs
            .iter()
            .enumerate()
            .map(|(i, parts)| {
                let value = match parts.as_slice() {
                    [one] => Cow::Borrowed(buffer_slice(one)),
                    many => {
                        let mut v = Vec::with_capacity(many.iter().map(|b| b.len_bytes()).sum());
                        for b in many {
                            v.extend_from_slice(buffer_slice(b));
                        }
                        Cow::Owned(v)
                    }
                };
                (i, value)
            })
            .collect();
        Ok(put_each(
            py,
            &c,
            &cfg,
            &keys,
            vec![mooncake::OK; keys.len()],
            values,
        ))
    }

    /// One code for the batch: 0, or the first item's error.
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        if keys.len() != values.len() {
            return Ok(mooncake::INVALID_PARAMS);
        }
        let Some(cfg) = replicate_config(config.as_ref())? else {
            return Ok(mooncake::INVALID_PARAMS);
        };
        let bufs = Self::buffers(&values)?;
        let Some(c) = self.client() else {
            return Ok(NOT_SET_UP);
        };
        // A key twice in one batch is one object (the first value wins).
        let mut seen = std::collections::HashSet::new();
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .map(String::as_str)
            .zip(bufs.iter().map(buffer_slice))
            .filter(|(k, _)| seen.insert(*k))
            .collect();
        Ok(match block(py, async { c.put_batch(&items, &cfg).await }) {
            Ok(rs) => rs.iter().map(code_of).find(|&code| code != 0).unwrap_or(0),
            Err(e) => error_number(&e),
        })
    }

    /// The object's bytes; `b""` when it is missing or cannot be read.
    fn get<'py>(&self, py: Python<'py>, key: String) -> Bound<'py, PyBytes> {
        let Some(c) = self.client() else {
            return PyBytes::new(py, b"");
        };
        match block(py, async { c.get(&key).await }) {
            Ok(v) => PyBytes::new(py, &v),
            Err(e) => {
                if !matches!(e, crescent_client::Error::NotFound(_)) {
                    tracing::warn!(key, error = %e, "get failed");
                }
                PyBytes::new(py, b"")
            }
        }
    }

    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        let empty = || PyBytes::new(py, b"");
        let Some(c) = self.client() else {
            return keys.iter().map(|_| empty()).collect();
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match block(py, async { c.get_batch(&refs).await }) {
            Ok(rs) => rs
                .into_iter()
                .map(|r| match r {
                    Ok(v) => PyBytes::new(py, &v),
                    Err(_) => empty(),
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "get_batch failed");
                keys.iter().map(|_| empty()).collect()
            }
        }
    }

    /// The object's bytes as a buffer, or None when it cannot be read.
    fn get_buffer(&self, py: Python<'_>, key: String) -> Option<BufferHandle> {
        let c = self.client()?;
        block(py, async { c.get(&key).await })
            .ok()
            .and_then(BufferHandle::of)
    }

    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<BufferHandle>> {
        let Some(c) = self.client() else {
            return keys.iter().map(|_| None).collect();
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match block(py, async { c.get_batch(&refs).await }) {
            Ok(rs) => rs
                .into_iter()
                .map(|r| r.ok().and_then(BufferHandle::of))
                .collect(),
            Err(_) => keys.iter().map(|_| None).collect(),
        }
    }

    /// The object's size in bytes, or a negative code.
    fn get_size(&self, py: Python<'_>, key: String) -> i64 {
        let Some(c) = self.client() else {
            return NOT_SET_UP.into();
        };
        count_or_code(block(py, async { c.get_size(&key).await }))
    }

    /// 1 present, 0 absent, or a negative code.
    fn is_exist(&self, py: Python<'_>, key: String) -> i32 {
        let Some(c) = self.client() else {
            return NOT_SET_UP;
        };
        match block(py, async { c.exists(&key).await }) {
            Ok(found) => found.into(),
            Err(e) => error_number(&e),
        }
    }

    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(c) = self.client() else {
            return vec![NOT_SET_UP; keys.len()];
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match block(py, async { c.batch_exists(&refs).await }) {
            Ok(rs) => rs
                .iter()
                .map(|r| match r {
                    Ok(found) => (*found).into(),
                    Err(e) => error_number(e),
                })
                .collect(),
            Err(e) => vec![error_number(&e); keys.len()],
        }
    }

    /// The replicas of `key`, memory first (empty when it is missing or
    /// the masters cannot be reached).
    fn get_replica_desc(&self, py: Python<'_>, key: String) -> Vec<ReplicaDescriptor> {
        let Some(c) = self.client() else {
            return Vec::new();
        };
        match block(py, async { c.master().get_replica_list(&key).await }) {
            Ok(r) => ReplicaDescriptor::list(&r),
            Err(_) => Vec::new(),
        }
    }

    /// `get_replica_desc` for each key: every key is in the dict, with an
    /// empty list when it is missing or could not be looked up.
    fn batch_get_replica_desc(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
    ) -> HashMap<String, Vec<ReplicaDescriptor>> {
        let Some(c) = self.client() else {
            return keys.into_iter().map(|k| (k, Vec::new())).collect();
        };
        let found = block(py, async {
            c.master().batch_get_replica_list(keys.clone()).await
        });
        let lists: Vec<Vec<ReplicaDescriptor>> = match found {
            Ok(rs) if rs.len() == keys.len() => rs
                .iter()
                .map(|r| {
                    let ok = r.status.as_ref().is_none_or(|s| s.code == 0);
                    if ok {
                        ReplicaDescriptor::list(r)
                    } else {
                        Vec::new()
                    }
                })
                .collect(),
            _ => keys.iter().map(|_| Vec::new()).collect(),
        };
        keys.into_iter().zip(lists).collect()
    }

    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: String, force: bool) -> i32 {
        let Some(c) = self.client() else {
            return NOT_SET_UP;
        };
        code_of(&block(py, async { c.remove(&key, force).await }))
    }

    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        let Some(c) = self.client() else {
            return vec![NOT_SET_UP; keys.len()];
        };
        block(py, async {
            futures::future::join_all(keys.iter().map(|k| c.remove(k, force))).await
        })
        .iter()
        .map(code_of)
        .collect()
    }

    /// The number of objects removed, or a negative code.
    #[pyo3(signature = (regex_pattern, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: String, force: bool) -> i64 {
        let Some(c) = self.client() else {
            return NOT_SET_UP.into();
        };
        count_or_code(block(py, async {
            c.remove_by_regex(&regex_pattern, force).await
        }))
    }

    /// The number of objects removed, or a negative code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let Some(c) = self.client() else {
            return NOT_SET_UP.into();
        };
        count_or_code(block(py, async { c.remove_all(force).await }))
    }

    // ------------------------------------------------------ raw pointers

    /// Lets raw-pointer calls use `[buffer_ptr, buffer_ptr + size)`. All of
    /// it must be mapped, readable host memory (a GPU pointer or a range with
    /// a hole is refused); gets may write into it only if it is writable.
    fn register_buffer(&self, buffer_ptr: usize, size: usize) -> i32 {
        if size == 0 || buffer_ptr == 0 || buffer_ptr.checked_add(size).is_none() {
            return mooncake::INVALID_PARAMS;
        }
        let maps = match std::fs::read_to_string("/proc/self/maps") {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "register_buffer: cannot read /proc/self/maps to check the range");
                return mooncake::INVALID_PARAMS;
            }
        };
        let Some(writable) = mapped_access(&maps, buffer_ptr, size) else {
            tracing::warn!(
                buffer_ptr,
                size,
                "register_buffer: not all mapped, readable host memory (a device pointer?)"
            );
            return mooncake::INVALID_PARAMS;
        };
        let mut reg = self.registry();
        // Overlaps would make "which buffer" ambiguous on unregister.
        let overlaps = reg
            .0
            .range(..buffer_ptr.saturating_add(size))
            .next_back()
            .is_some_and(|(&s, r)| s.saturating_add(r.len) > buffer_ptr);
        if overlaps {
            return mooncake::INVALID_PARAMS;
        }
        reg.0.insert(
            buffer_ptr,
            Region {
                len: size,
                writable,
            },
        );
        mooncake::OK
    }

    fn unregister_buffer(&self, buffer_ptr: usize) -> i32 {
        match self.registry().0.remove(&buffer_ptr) {
            Some(_) => mooncake::OK,
            None => mooncake::INVALID_PARAMS,
        }
    }

    /// Whether `[buffer_ptr, buffer_ptr + size)` lies in one registered
    /// buffer (a writable one when `writable`): the tensor calls check this
    /// before they read a caller's header or write a tensor they rebuilt.
    #[pyo3(signature = (buffer_ptr, size, writable=false))]
    fn _registered(&self, buffer_ptr: usize, size: usize, writable: bool) -> bool {
        let access = if writable {
            Access::Write
        } else {
            Access::Read
        };
        self.registry().covers(buffer_ptr, size, access)
    }

    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: usize,
        size: usize,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        let Some(cfg) = replicate_config(config.as_ref())? else {
            return Ok(mooncake::INVALID_PARAMS);
        };
        let Some(c) = self.client() else {
            return Ok(NOT_SET_UP);
        };
        if !self.registry().covers(buffer_ptr, size, Access::Read) {
            return Ok(mooncake::INVALID_PARAMS);
        }
        Ok(code_of(&block(py, async move {
            // SAFETY: covered (see `Registered`).
            let data = unsafe { std::slice::from_raw_parts(buffer_ptr as *const u8, size) };
            c.put_from(&key, data, &cfg).await
        })))
    }

    /// Bytes read, or a negative code.
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: usize, size: usize) -> i64 {
        let Some(c) = self.client() else {
            return NOT_SET_UP.into();
        };
        if !self.registry().covers(buffer_ptr, size, Access::Write) {
            return mooncake::INVALID_PARAMS.into();
        }
        match block(py, async move {
            // SAFETY: covered (see `Registered`).
            let buf = unsafe { std::slice::from_raw_parts_mut(buffer_ptr as *mut u8, size) };
            c.get_into(&key, buf).await
        }) {
            Ok(n) => n as i64,
            Err(e) => error_number(&e).into(),
        }
    }

    /// Per key: 0 or a negative code.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i32>> {
        match one_range_each(&buffer_ptrs, &sizes) {
            Some(ranges) => self.put_gathered(py, keys, ranges, config),
            None => Ok(vec![mooncake::INVALID_PARAMS; keys.len()]),
        }
    }

    /// Per key: bytes read or a negative code.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> Vec<i64> {
        match one_range_each(&buffer_ptrs, &sizes) {
            Some(ranges) => self.get_scattered(py, keys, ranges),
            None => vec![mooncake::INVALID_PARAMS.into(); keys.len()],
        }
    }

    /// One object per key, made of that key's buffers in order.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i32>> {
        match zip_ranges(&all_buffer_ptrs, &all_sizes) {
            Some(ranges) => self.put_gathered(py, keys, ranges, config),
            None => Ok(vec![mooncake::INVALID_PARAMS; keys.len()]),
        }
    }

    /// Per key: bytes read into that key's buffers (in order), or a negative code.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        match zip_ranges(&all_buffer_ptrs, &all_sizes) {
            Some(ranges) => self.get_scattered(py, keys, ranges),
            None => vec![mooncake::INVALID_PARAMS.into(); keys.len()],
        }
    }

    /// Ranges of objects read into registered buffers: for buffer `i`, key
    /// `all_keys[i][j]` gives `all_sizes[i][j][k]` bytes from offset
    /// `all_src_offsets[i][j][k]` of the object to offset
    /// `all_dst_offsets[i][j][k]` of the buffer. The answer is shaped like
    /// `all_dst_offsets`: bytes read, or a negative code per range
    /// (INVALID_PARAMS for a range outside its buffer or its object, or lists
    /// of different lengths).
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<usize>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<usize>>>,
        all_src_offsets: Vec<Vec<Vec<usize>>>,
        all_sizes: Vec<Vec<Vec<usize>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let invalid = i64::from(mooncake::INVALID_PARAMS);
        let mut out: Vec<Vec<Vec<i64>>> = all_dst_offsets
            .iter()
            .map(|per_key| per_key.iter().map(|d| vec![invalid; d.len()]).collect())
            .collect();
        let n = buffer_ptrs.len();
        if [
            all_keys.len(),
            all_src_offsets.len(),
            all_sizes.len(),
            all_dst_offsets.len(),
        ]
        .iter()
        .any(|&l| l != n)
        {
            return out;
        }
        let Some(c) = self.client() else {
            for r in out.iter_mut().flatten().flatten() {
                *r = NOT_SET_UP.into();
            }
            return out;
        };
        // (buffer, key index, range index, destination, source offset, size)
        let mut wanted: Vec<(usize, usize, usize, usize, usize, usize)> = Vec::new();
        {
            let reg = self.registry();
            for i in 0..n {
                let (keys, dst, src, sizes) = (
                    &all_keys[i],
                    &all_dst_offsets[i],
                    &all_src_offsets[i],
                    &all_sizes[i],
                );
                if keys.len() != dst.len() || keys.len() != src.len() || keys.len() != sizes.len() {
                    continue;
                }
                for j in 0..keys.len() {
                    if dst[j].len() != src[j].len() || dst[j].len() != sizes[j].len() {
                        continue;
                    }
                    for k in 0..dst[j].len() {
                        let Some(to) = buffer_ptrs[i].checked_add(dst[j][k]) else {
                            continue;
                        };
                        if reg.covers(to, sizes[j][k], Access::Write) {
                            wanted.push((i, j, k, to, src[j][k], sizes[j][k]));
                        }
                    }
                }
            }
        }
        let mut keys: Vec<&str> = wanted.iter().map(|w| all_keys[w.0][w.1].as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return out;
        }
        block(py, async {
            let values = match c.get_batch(&keys).await {
                Ok(vs) => vs,
                Err(e) => {
                    let code = i64::from(error_number(&e));
                    for w in &wanted {
                        out[w.0][w.1][w.2] = code;
                    }
                    return;
                }
            };
            for &(i, j, k, to, from, size) in &wanted {
                let Ok(at) = keys.binary_search(&all_keys[i][j].as_str()) else {
                    continue;
                };
                out[i][j][k] = match &values[at] {
                    Err(e) => error_number(e).into(),
                    Ok(v) => match from.checked_add(size).and_then(|end| v.get(from..end)) {
                        None => invalid,
                        Some(bytes) => {
                            // SAFETY: covered (see `Registered`); ranges are
                            // copied one after another, so overlapping
                            // destinations only overwrite each other.
                            unsafe {
                                std::ptr::copy_nonoverlapping(bytes.as_ptr(), to as *mut u8, size)
                            };
                            size as i64
                        }
                    },
                };
            }
        });
        out
    }
}

impl MooncakeDistributedStore {
    /// Puts one object per key from that key's registered ranges. A single
    /// range is sent from caller memory as is; several are gathered into one
    /// buffer first (the client sends one contiguous value per object).
    fn put_gathered(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ranges: Vec<Vec<(usize, usize)>>,
        config: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i32>> {
        if keys.len() != ranges.len() {
            return Ok(vec![mooncake::INVALID_PARAMS; keys.len()]);
        }
        let Some(cfg) = replicate_config(config.as_ref())? else {
            return Ok(vec![mooncake::INVALID_PARAMS; keys.len()]);
        };
        let Some(c) = self.client() else {
            return Ok(vec![NOT_SET_UP; keys.len()]);
        };
        let mut codes = vec![mooncake::OK; keys.len()];
        let mut values: Vec<(usize, Cow<'_, [u8]>)> = Vec::new();
        {
            let reg = self.registry();
            for (i, rs) in ranges.into_iter().enumerate() {
                if !reg.covers_all(&rs, Access::Read) {
                    codes[i] = mooncake::INVALID_PARAMS;
                    continue;
                }
                // SAFETY (both slices): covered (see `Registered`).
                let value = match rs.as_slice() {
                    [(p, s)] => {
                        Cow::Borrowed(unsafe { std::slice::from_raw_parts(*p as *const u8, *s) })
                    }
                    many => {
                        let mut v = Vec::with_capacity(many.iter().map(|r| r.1).sum());
                        for &(p, s) in many {
                            v.extend_from_slice(unsafe {
                                std::slice::from_raw_parts(p as *const u8, s)
                            });
                        }
                        Cow::Owned(v)
                    }
                };
                values.push((i, value));
            }
        }
        Ok(put_each(py, &c, &cfg, &keys, codes, values))
    }

    /// Reads one object per key into that key's registered ranges. A single
    /// range is read into directly; several get the object through one
    /// intermediate buffer, scattered in order. An object larger than its
    /// ranges is INVALID_PARAMS and leaves them untouched.
    fn get_scattered(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ranges: Vec<Vec<(usize, usize)>>,
    ) -> Vec<i64> {
        if keys.len() != ranges.len() {
            return vec![mooncake::INVALID_PARAMS.into(); keys.len()];
        }
        let Some(c) = self.client() else {
            return vec![NOT_SET_UP.into(); keys.len()];
        };
        let mut out: Vec<i64> = vec![0; keys.len()];
        let mut single: Vec<(usize, (usize, usize))> = Vec::new();
        let mut multi: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
        // Reads run concurrently: destinations that overlap would alias.
        if any_overlap(&ranges.concat()) {
            return vec![mooncake::INVALID_PARAMS.into(); keys.len()];
        }
        {
            let reg = self.registry();
            for (i, rs) in ranges.into_iter().enumerate() {
                if !reg.covers_all(&rs, Access::Write) {
                    out[i] = mooncake::INVALID_PARAMS.into();
                } else if rs.len() == 1 {
                    single.push((i, rs[0]));
                } else {
                    multi.push((i, rs));
                }
            }
        }
        block(py, async {
            if !single.is_empty() {
                let ks: Vec<&str> = single.iter().map(|(i, _)| keys[*i].as_str()).collect();
                // SAFETY: covered (see `Registered`), and checked above not
                // to overlap.
                let mut bufs: Vec<&mut [u8]> = single
                    .iter()
                    .map(|(_, (p, s))| unsafe { std::slice::from_raw_parts_mut(*p as *mut u8, *s) })
                    .collect();
                match c.batch_get_into(&ks, &mut bufs).await {
                    Ok(rs) => {
                        for ((i, _), r) in single.iter().zip(rs) {
                            out[*i] = match r {
                                Ok(n) => n as i64,
                                Err(e) => error_number(&e).into(),
                            };
                        }
                    }
                    Err(e) => {
                        for (i, _) in &single {
                            out[*i] = error_number(&e).into();
                        }
                    }
                }
            }
            if !multi.is_empty() {
                let ks: Vec<&str> = multi.iter().map(|(i, _)| keys[*i].as_str()).collect();
                match c.get_batch(&ks).await {
                    Ok(rs) => {
                        for ((i, ranges), r) in multi.iter().zip(rs) {
                            out[*i] = match r {
                                Ok(v) => scatter(&v, ranges),
                                Err(e) => error_number(&e).into(),
                            };
                        }
                    }
                    Err(e) => {
                        for (i, _) in &multi {
                            out[*i] = error_number(&e).into();
                        }
                    }
                }
            }
        });
        out
    }
}

/// `MooncakeHostMemAllocator`: page-aligned host memory for buffers an
/// engine registers (SGLang's standalone mode allocates its pool with it).
#[pyclass(module = "crescent._native")]
struct MooncakeHostMemAllocator {
    blocks: Mutex<HostBlocks>,
}

#[pymethods]
impl MooncakeHostMemAllocator {
    #[new]
    fn new() -> Self {
        MooncakeHostMemAllocator {
            blocks: Mutex::new(HostBlocks::default()),
        }
    }

    /// The address of `size` zeroed bytes, page-aligned.
    fn alloc(&self, size: usize) -> PyResult<usize> {
        self.blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(size)
            .map_err(pyo3::exceptions::PyMemoryError::new_err)
    }

    /// Frees an address from `alloc`: 0, or INVALID_PARAMS for any other.
    fn free(&self, ptr: usize) -> i32 {
        if self
            .blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(ptr)
        {
            mooncake::OK
        } else {
            mooncake::INVALID_PARAMS
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Warnings (bad setup arguments, failed gets) go to stderr, as
    // Mooncake's glog lines do; CRESCENT_LOG / RUST_LOG choose the level.
    let filter = std::env::var("CRESCENT_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    m.add_class::<MooncakeDistributedStore>()?;
    m.add_class::<ReplicateConfig>()?;
    m.add_class::<SoftPinAction>()?;
    m.add_class::<ObjectDataType>()?;
    m.add_class::<BufferHandle>()?;
    m.add_class::<ReplicaDescriptor>()?;
    m.add_class::<MooncakeHostMemAllocator>()?;
    let close_open = wrap_pyfunction!(_close_open_stores, m)?;
    m.add_function(close_open.clone())?;
    m.py()
        .import("atexit")?
        .call_method1("register", (close_open,))?;
    m.add("OBJECT_NOT_FOUND", mooncake::OBJECT_NOT_FOUND)?;
    m.add("INVALID_PARAMS", mooncake::INVALID_PARAMS)?;
    m.add("NO_AVAILABLE_HANDLE", mooncake::NO_AVAILABLE_HANDLE)?;
    m.add("RPC_FAIL", mooncake::RPC_FAIL)?;
    Ok(())
}
