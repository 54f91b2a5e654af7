//! Mooncake's `ReplicateConfig`, `SoftPinAction` and `ObjectDataType`, and
//! their translation into the client's [`crescent_client::ReplicateConfig`].
//!
//! Owns the Python-side names, defaults and checks of a put's replication
//! options; it must not decide placement or pinning (the masters do).

use std::sync::Once;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The longest soft pin a put may ask for, as Mooncake's masters default it
/// (`max_kv_soft_pin_ttl`, 24 h): a longer one is INVALID_PARAMS.
const MAX_SOFT_PIN_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// What a write does to the object's soft pin (Mooncake's values).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "crescent._native")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum SoftPinAction {
    /// Leave it as it is: a new object is not pinned.
    PRESERVE = 0,
    /// Pin it (a TTL of 0 means: store it as ordinary cache).
    ENABLE = 1,
    /// Unpin it.
    DISABLE = 2,
}

/// What an object holds. Mooncake records it; Crescent accepts it and
/// neither stores nor acts on it.
#[pyclass(eq, eq_int, frozen, from_py_object, module = "crescent._native")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms, non_camel_case_types)]
pub enum ObjectDataType {
    UNKNOWN = 0,
    KVCACHE = 1,
    TENSOR = 2,
    WEIGHT = 3,
    SAMPLE = 4,
    ACTIVATION = 5,
    GRADIENT = 6,
    OPTIMIZER_STATE = 7,
    METADATA = 8,
    GENERAL = 9,
}

/// Mooncake's `ReplicateConfig`. Other attributes may be set freely and are
/// ignored.
#[pyclass(dict, module = "crescent._native")]
pub struct ReplicateConfig {
    #[pyo3(get, set)]
    replica_num: i64,
    /// NVMe-oF replicas: Crescent has none, so a put asking for some is
    /// INVALID_PARAMS (as Mooncake built without NVMe-oF answers).
    #[pyo3(get, set)]
    nof_replica_num: i64,
    /// Replicas on a distributed file system: none here either.
    #[pyo3(get, set)]
    dfs_replica_num: i64,
    #[pyo3(get, set)]
    soft_pin_action: SoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    #[pyo3(get, set)]
    with_hard_pin: bool,
    #[pyo3(get, set)]
    preferred_segment: String,
    #[pyo3(get, set)]
    preferred_segments: Vec<String>,
    #[pyo3(get, set)]
    preferred_nof_segments: Vec<String>,
    #[pyo3(get, set)]
    prefer_alloc_in_same_node: bool,
    #[pyo3(get, set)]
    data_type: ObjectDataType,
    /// Mooncake's routing groups: kept as given (strings now, ints in
    /// older engines), not used.
    group_ids: Option<Py<PyAny>>,
}

/// `soft_pin_ttl_ms` takes None or an int in `0..2**64`; anything else is a
/// TypeError, as Mooncake's binding raises.
fn ttl_arg(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match v.filter(|v| !v.is_none()) {
        None => Ok(None),
        Some(v) => v.extract::<u64>().map(Some).map_err(|_| {
            PyTypeError::new_err(format!(
                "soft_pin_ttl_ms must be None or an int in 0..2**64, got {v}"
            ))
        }),
    }
}

#[pymethods]
impl ReplicateConfig {
    /// Mooncake builds it empty and sets attributes; keywords are accepted
    /// too, including the older `with_soft_pin`.
    #[new]
    #[pyo3(signature = (replica_num=1, with_soft_pin=false, with_hard_pin=false, preferred_segment=String::new(), preferred_segments=Vec::new(), prefer_alloc_in_same_node=false, soft_pin_action=SoftPinAction::PRESERVE, soft_pin_ttl_ms=None, nof_replica_num=0, dfs_replica_num=0, preferred_nof_segments=Vec::new(), data_type=ObjectDataType::UNKNOWN, group_ids=None, **_ignored))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        replica_num: i64,
        with_soft_pin: bool,
        with_hard_pin: bool,
        preferred_segment: String,
        preferred_segments: Vec<String>,
        prefer_alloc_in_same_node: bool,
        soft_pin_action: SoftPinAction,
        soft_pin_ttl_ms: Option<Bound<'_, PyAny>>,
        nof_replica_num: i64,
        dfs_replica_num: i64,
        preferred_nof_segments: Vec<String>,
        data_type: ObjectDataType,
        group_ids: Option<Bound<'_, PyAny>>,
        _ignored: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        Ok(ReplicateConfig {
            replica_num,
            nof_replica_num,
            dfs_replica_num,
            soft_pin_action: if with_soft_pin {
                SoftPinAction::ENABLE
            } else {
                soft_pin_action
            },
            soft_pin_ttl_ms: ttl_arg(soft_pin_ttl_ms.as_ref())?,
            with_hard_pin,
            preferred_segment,
            preferred_segments,
            preferred_nof_segments,
            prefer_alloc_in_same_node,
            data_type,
            group_ids: group_ids.filter(|g| !g.is_none()).map(Bound::unbind),
        })
    }

    #[getter]
    fn get_soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }

    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, v: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        self.soft_pin_ttl_ms = ttl_arg(v.as_ref())?;
        Ok(())
    }

    #[getter]
    fn get_group_ids(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.group_ids.as_ref().map(|g| g.clone_ref(py))
    }

    #[setter]
    fn set_group_ids(&mut self, v: Option<Bound<'_, PyAny>>) {
        self.group_ids = v.filter(|g| !g.is_none()).map(Bound::unbind);
    }

    /// The older Mooncake API's switch: true is `SoftPinAction.ENABLE`.
    #[getter]
    fn get_with_soft_pin(&self) -> bool {
        self.soft_pin_action == SoftPinAction::ENABLE
    }

    #[setter]
    fn set_with_soft_pin(&mut self, on: bool) {
        if on {
            self.soft_pin_action = SoftPinAction::ENABLE;
        } else if self.soft_pin_action == SoftPinAction::ENABLE {
            self.soft_pin_action = SoftPinAction::PRESERVE;
        }
    }

    fn __str__(&self) -> String {
        format!(
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, \
             soft_pin_action: {:?}, soft_pin_ttl_ms: {}, with_hard_pin: {}, \
             preferred_segments: {:?}, preferred_segment: {:?}, prefer_alloc_in_same_node: {}, \
             data_type: {:?} }}",
            self.replica_num,
            self.nof_replica_num,
            self.dfs_replica_num,
            self.soft_pin_action,
            self.soft_pin_ttl_ms
                .map_or_else(|| "None".to_string(), |t| t.to_string()),
            self.with_hard_pin,
            self.preferred_segments,
            self.preferred_segment,
            self.prefer_alloc_in_same_node,
            self.data_type,
        )
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }
}

/// None: options Mooncake refuses (INVALID_PARAMS), with the reason logged.
fn refuse(reason: String) -> Option<crescent_client::ReplicateConfig> {
    tracing::warn!("ReplicateConfig refused: {reason}");
    None
}

/// Replication options read from any object with Mooncake's
/// `ReplicateConfig` attribute names (absent ones take defaults). A value of
/// the wrong type raises; a combination Mooncake refuses is None, which the
/// calls answer with INVALID_PARAMS.
pub fn replicate_config(
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<crescent_client::ReplicateConfig>> {
    let mut out = crescent_client::ReplicateConfig::default();
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Some(out));
    };
    let attr = |name: &str| -> Option<Bound<'_, PyAny>> {
        obj.getattr(name).ok().filter(|v| !v.is_none())
    };
    let count = |name: &str| -> PyResult<i64> { attr(name).map_or(Ok(0), |v| v.extract::<i64>()) };
    if let Some(v) = attr("replica_num") {
        let n: i64 = v.extract()?;
        out.replica_num = u32::try_from(n).map_err(|_| {
            PyValueError::new_err(format!("replica_num must be 0..=2^32-1, got {n}"))
        })?;
    }
    for name in ["nof_replica_num", "dfs_replica_num"] {
        let n = count(name)?;
        if n != 0 {
            return Ok(refuse(format!(
                "{name} = {n}: Crescent keeps replicas in memory segments and its disk tier only"
            )));
        }
    }
    let action = match attr("soft_pin_action") {
        None => SoftPinAction::PRESERVE,
        Some(v) => match v.extract::<SoftPinAction>() {
            Ok(a) => a,
            Err(_) => match v.extract::<i64>()? {
                0 => SoftPinAction::PRESERVE,
                1 => SoftPinAction::ENABLE,
                2 => SoftPinAction::DISABLE,
                n => return Ok(refuse(format!("soft_pin_action {n} is not 0, 1 or 2"))),
            },
        },
    };
    // An object whose class has the older switch and not the action (any
    // config object other than this package's).
    let legacy_pin = attr("with_soft_pin")
        .map(|v| v.is_truthy())
        .transpose()?
        .unwrap_or(false);
    let ttl = ttl_arg(attr("soft_pin_ttl_ms").as_ref())?;
    out.soft_pin = match (action, ttl) {
        (SoftPinAction::PRESERVE | SoftPinAction::DISABLE, Some(_)) => {
            return Ok(refuse(format!(
                "soft_pin_ttl_ms is only for SoftPinAction.ENABLE, not {action:?}"
            )))
        }
        (SoftPinAction::ENABLE, Some(t)) if t > MAX_SOFT_PIN_TTL_MS => {
            return Ok(refuse(format!(
                "soft_pin_ttl_ms {t} is above the maximum {MAX_SOFT_PIN_TTL_MS}"
            )))
        }
        (SoftPinAction::ENABLE, Some(0)) => false,
        (SoftPinAction::ENABLE, Some(_)) => {
            static ONCE: Once = Once::new();
            ONCE.call_once(|| {
                tracing::warn!(
                    "soft_pin_ttl_ms is not applied per object: a soft pin lasts the masters' \
                     --soft-pin-ttl (default 30m)"
                )
            });
            true
        }
        (SoftPinAction::ENABLE, None) => true,
        (SoftPinAction::PRESERVE, None) => legacy_pin,
        (SoftPinAction::DISABLE, None) => false,
    };
    if let Some(v) = attr("with_hard_pin") {
        out.hard_pin = v.is_truthy()?;
    }
    if let Some(v) = attr("preferred_segments") {
        out.preferred_segments = v.extract()?;
    }
    if let Some(v) = attr("preferred_segment") {
        let s: String = v.extract()?;
        if !s.is_empty() && !out.preferred_segments.contains(&s) {
            out.preferred_segments.insert(0, s);
        }
    }
    Ok(Some(out))
}
