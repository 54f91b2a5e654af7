//! Verbs-level RDMA: device, protection domain, memory registration of a
//! segment (or a client buffer), a reliable-connected queue pair, and
//! one-sided RDMA READ/WRITE split into bounded work requests.
//!
//! Device discovery goes through the `ibverbs` crate; registering memory we
//! already own and posting one-sided operations need the raw verbs it wraps
//! (`ibverbs-sys`), because its safe API only registers memory it allocates
//! and only posts two-sided sends. Compiled in CI; never run here (no RDMA
//! hardware on these machines).

use std::ffi::CString;
use std::io;
use std::ptr;

use ibverbs_sys as ffi;

use super::{plan_chunks, RdmaPeerInfo};

const PORT_NUM: u8 = 1;
/// Largest single work request.
pub const MAX_WR_BYTES: u64 = 1 << 30;
const CQ_DEPTH: i32 = 1024;
const MAX_SEND_WR: u32 = 512;

/// Names of the RDMA devices present (empty on machines without RDMA).
pub fn list_devices() -> io::Result<Vec<String>> {
    let list = ibverbs::devices()?;
    Ok(list
        .iter()
        .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
        .collect())
}

/// An open device with one protection domain.
pub struct RdmaDevice {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    lid: u16,
    gid: [u8; 16],
}

// SAFETY: verbs objects are thread-safe per libibverbs' documentation.
unsafe impl Send for RdmaDevice {}
unsafe impl Sync for RdmaDevice {}

impl RdmaDevice {
    /// Opens `name` (or the first device when `None`).
    pub fn open(name: Option<&str>) -> io::Result<Self> {
        let mut n = 0;
        // SAFETY: plain verbs calls; every pointer is checked before use.
        unsafe {
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() || n == 0 {
                if !list.is_null() {
                    ffi::ibv_free_device_list(list);
                }
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no RDMA device present",
                ));
            }
            let wanted = name.map(|s| CString::new(s).unwrap_or_default());
            let mut chosen = ptr::null_mut();
            for i in 0..n as usize {
                let dev = *list.add(i);
                let dev_name = std::ffi::CStr::from_ptr(ffi::ibv_get_device_name(dev));
                if wanted.as_deref().is_none_or(|w| w == dev_name) {
                    chosen = dev;
                    break;
                }
            }
            if chosen.is_null() {
                ffi::ibv_free_device_list(list);
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("RDMA device {name:?} not found"),
                ));
            }
            let ctx = ffi::ibv_open_device(chosen);
            ffi::ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(io::Error::last_os_error());
            }
            let mut port: ffi::ibv_port_attr = std::mem::zeroed();
            let rc = ffi::ibv_query_port(
                ctx,
                PORT_NUM,
                &mut port as *mut ffi::ibv_port_attr as *mut _,
            );
            if rc != 0 {
                ffi::ibv_close_device(ctx);
                return Err(io::Error::from_raw_os_error(rc));
            }
            let mut gid: ffi::ibv_gid = std::mem::zeroed();
            let rc = ffi::ibv_query_gid(ctx, PORT_NUM, 0, &mut gid);
            if rc != 0 {
                ffi::ibv_close_device(ctx);
                return Err(io::Error::from_raw_os_error(rc));
            }
            let pd = ffi::ibv_alloc_pd(ctx);
            if pd.is_null() {
                ffi::ibv_close_device(ctx);
                return Err(io::Error::last_os_error());
            }
            Ok(Self {
                ctx,
                pd,
                lid: port.lid,
                gid: gid.raw,
            })
        }
    }

    /// Registers `[ptr, ptr+len)` for local and remote read/write.
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped.
    pub unsafe fn register(&self, ptr: *mut u8, len: u64) -> io::Result<MemoryRegion> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        let mr = ffi::ibv_reg_mr(self.pd, ptr as *mut _, len as usize, access.0 as i32);
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(MemoryRegion {
            mr,
            addr: ptr as u64,
            len,
        })
    }
}

impl Drop for RdmaDevice {
    fn drop(&mut self) {
        // SAFETY: created in `open`; regions and queue pairs borrow nothing from
        // us at the type level, so callers drop them first (documented).
        unsafe {
            ffi::ibv_dealloc_pd(self.pd);
            ffi::ibv_close_device(self.ctx);
        }
    }
}

/// A registered memory region.
pub struct MemoryRegion {
    mr: *mut ffi::ibv_mr,
    pub addr: u64,
    pub len: u64,
}

unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is valid while self lives.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `RdmaDevice::register`.
        unsafe {
            ffi::ibv_dereg_mr(self.mr);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Remote -> local.
    Read,
    /// Local -> remote.
    Write,
}

/// One reliable-connected queue pair with its completion queue.
pub struct RcConnection {
    ctx: *mut ffi::ibv_context,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    psn: u32,
}

unsafe impl Send for RcConnection {}

impl RcConnection {
    /// Creates a queue pair in INIT state, allowing remote read/write.
    pub fn new(dev: &RdmaDevice, psn: u32) -> io::Result<Self> {
        // SAFETY: verbs calls on valid device objects; results checked.
        unsafe {
            let cq = ffi::ibv_create_cq(dev.ctx, CQ_DEPTH, ptr::null_mut(), ptr::null_mut(), 0);
            if cq.is_null() {
                return Err(io::Error::last_os_error());
            }
            let mut init = ffi::ibv_qp_init_attr {
                qp_context: ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: MAX_SEND_WR,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            let qp = ffi::ibv_create_qp(dev.pd, &mut init);
            if qp.is_null() {
                let e = io::Error::last_os_error();
                ffi::ibv_destroy_cq(cq);
                return Err(e);
            }
            let conn = Self {
                ctx: dev.ctx,
                cq,
                qp,
                psn: psn & 0x00ff_ffff,
            };
            let mut attr = ffi::ibv_qp_attr {
                qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
                pkey_index: 0,
                port_num: PORT_NUM,
                qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                    | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                    | ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
                    .0,
                ..Default::default()
            };
            let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
                | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ffi::ibv_qp_attr_mask::IBV_QP_PORT
                | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
            conn.modify(&mut attr, mask)?;
            Ok(conn)
        }
    }

    /// What the peer needs to connect to us and address `region`.
    pub fn local_info(&self, dev: &RdmaDevice, region: &MemoryRegion) -> RdmaPeerInfo {
        RdmaPeerInfo {
            lid: dev.lid,
            // SAFETY: qp valid while self lives.
            qp_num: unsafe { (*self.qp).qp_num },
            psn: self.psn,
            gid: dev.gid,
            addr: region.addr,
            rkey: region.rkey(),
            len: region.len,
        }
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> io::Result<()> {
        // SAFETY: qp valid; attr initialised for the fields in mask.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Moves the queue pair to RTR then RTS against `remote`.
    pub fn connect(&mut self, remote: &RdmaPeerInfo) -> io::Result<()> {
        let mut rtr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: ffi::IBV_MTU_4096,
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ah_attr: ffi::ibv_ah_attr {
                dlid: remote.lid,
                sl: 0,
                src_path_bits: 0,
                port_num: PORT_NUM,
                ..Default::default()
            },
            ..Default::default()
        };
        if remote.gid != [0u8; 16] {
            // RoCE needs the global route header.
            rtr.ah_attr.is_global = 1;
            rtr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            rtr.ah_attr.grh.hop_limit = 0xff;
            rtr.ah_attr.grh.sgid_index = 0;
        }
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut rtr, mask)?;
        let mut rts = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: self.psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut rts, mask)
    }

    /// Moves `len` bytes between `local[local_off..]` and the peer's segment at
    /// `remote_off` with one-sided operations; blocks until all complete.
    pub fn transfer(
        &mut self,
        dir: Direction,
        local: &MemoryRegion,
        local_off: u64,
        remote: &RdmaPeerInfo,
        remote_off: u64,
        len: u64,
    ) -> io::Result<()> {
        if local_off.checked_add(len).is_none_or(|end| end > local.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "local range outside the registered region",
            ));
        }
        let chunks = plan_chunks(remote_off, len, remote.len, MAX_WR_BYTES).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "remote range outside the peer's segment",
            )
        })?;
        let mut outstanding = 0usize;
        for (i, c) in chunks.iter().enumerate() {
            if outstanding == MAX_SEND_WR as usize {
                outstanding -= self.wait_completions(1)?;
            }
            let mut sge = ffi::ibv_sge {
                addr: local.addr + local_off + c.local,
                length: c.len as u32,
                lkey: local.lkey(),
            };
            let mut wr = ffi::ibv_send_wr {
                wr_id: i as u64,
                sg_list: &mut sge,
                num_sge: 1,
                opcode: match dir {
                    Direction::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
                    Direction::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                },
                send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
                ..Default::default()
            };
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: remote.addr + c.remote,
                rkey: remote.rkey,
            };
            let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
            // SAFETY: post_send is the provider's entry point; wr and sge live
            // until the call returns, and the memory they name is registered.
            let rc = unsafe {
                let ops = &mut (*self.ctx).ops;
                match ops.post_send.as_mut() {
                    Some(post) => post(self.qp, &mut wr, &mut bad),
                    None => libc_enosys(),
                }
            };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            outstanding += 1;
        }
        while outstanding > 0 {
            outstanding -= self.wait_completions(outstanding)?;
        }
        Ok(())
    }

    /// Polls until at least one completion arrives; fails on an errored one.
    fn wait_completions(&mut self, max: usize) -> io::Result<usize> {
        let mut wcs: Vec<ffi::ibv_wc> = (0..max.max(1))
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        loop {
            // SAFETY: cq valid; wcs has room for `len` completions.
            let n = unsafe {
                let ops = &mut (*self.ctx).ops;
                match ops.poll_cq.as_mut() {
                    Some(poll) => poll(self.cq, wcs.len() as i32, wcs.as_mut_ptr()),
                    None => -libc_enosys(),
                }
            };
            if n < 0 {
                return Err(io::Error::other("ibv_poll_cq failed"));
            }
            if n > 0 {
                for wc in &wcs[..n as usize] {
                    if !wc.is_valid() {
                        return Err(io::Error::other(format!(
                            "RDMA work request {} failed",
                            wc.wr_id()
                        )));
                    }
                }
                return Ok(n as usize);
            }
            std::hint::spin_loop();
        }
    }
}

fn libc_enosys() -> i32 {
    38 // ENOSYS
}

impl Drop for RcConnection {
    fn drop(&mut self) {
        // SAFETY: created in `new`.
        unsafe {
            ffi::ibv_destroy_qp(self.qp);
            ffi::ibv_destroy_cq(self.cq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs everywhere the feature builds: on a machine without RDMA devices
    /// (like CI) opening fails cleanly instead of crashing.
    #[test]
    fn no_device_is_a_clean_error() {
        let devices = list_devices().unwrap_or_default();
        if devices.is_empty() {
            let err = RdmaDevice::open(None)
                .err()
                .expect("no device, so open must fail");
            assert_eq!(err.kind(), io::ErrorKind::NotFound);
        } else {
            eprintln!("RDMA devices present: {devices:?}; skipping the no-device check");
        }
    }
}
