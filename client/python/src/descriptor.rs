//! `ReplicaDescriptor`: where one copy of an object lives, as Mooncake's
//! `get_replica_desc` tells it.

use super::*;

/// Where one copy of an object lives, as Mooncake's replica descriptor
/// tells it: a memory replica, or one on a store's disk segment (Crescent's
/// disk tier; Mooncake's client-side `LOCAL_DISK` has no equivalent here).
#[pyclass(module = "crescent._native", frozen)]
pub(crate) struct ReplicaDescriptor {
    pub(crate) disk: bool,
    #[pyo3(get)]
    pub(crate) segment_name: String,
    #[pyo3(get)]
    pub(crate) endpoint: String,
    #[pyo3(get)]
    pub(crate) size: u64,
}

#[pymethods]
impl ReplicaDescriptor {
    fn is_memory_replica(&self) -> bool {
        !self.disk
    }

    fn is_disk_replica(&self) -> bool {
        self.disk
    }

    fn is_local_disk_replica(&self) -> bool {
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "ReplicaDescriptor({}, segment={:?}, endpoint={:?}, size={})",
            if self.disk { "disk" } else { "memory" },
            self.segment_name,
            self.endpoint,
            self.size
        )
    }
}

impl ReplicaDescriptor {
    pub(crate) fn list(r: &crescent_proto::pb::GetReplicaListResponse) -> Vec<ReplicaDescriptor> {
        r.replicas
            .iter()
            .map(|d| ReplicaDescriptor {
                disk: d.kind == crescent_proto::pb::ReplicaKind::Disk as i32,
                segment_name: d.segment_name.clone(),
                endpoint: d.endpoint.clone(),
                size: r.size,
            })
            .collect()
    }
}
