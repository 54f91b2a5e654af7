//! Data-plane capabilities: what lets a store serve a
//! read or a write without asking the master.
//!
//! A store generates a random [`SegmentKey`] for each segment it mounts and
//! hands it to the masters with the mount (it lives in the replicated state,
//! so every leader can sign). With each placement (PutStart) and each replica
//! descriptor (GetReplicaList) the leader signs a [`Capability`] — segment,
//! range, operation, expiry — with that key. The client sends the capability
//! and its [`CapabilityMac`] with every transfer request, and the store serves
//! only requests inside a capability it can verify, for the operation it
//! names, before it expires. There is no unchecked request.
//!
//! Pure: no I/O and no clock (the caller passes "now").

use hmac::Mac;

/// Bytes of a segment key.
pub const SEGMENT_KEY_LEN: usize = 32;
/// Bytes of a capability's MAC (HMAC-SHA256 truncated to 128 bits).
pub const MAC_LEN: usize = 16;

/// Domain separation: no other HMAC in Crescent can be replayed as one of these.
const DOMAIN: &[u8] = b"crescent-capability-v1";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// A segment's secret, shared by the store serving it and the masters.
/// Its `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct SegmentKey([u8; SEGMENT_KEY_LEN]);

impl std::fmt::Debug for SegmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SegmentKey(..)")
    }
}

impl SegmentKey {
    /// A fresh random key (the store's, at mount).
    pub fn generate() -> Self {
        let mut k = [0u8; SEGMENT_KEY_LEN];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut k);
        Self(k)
    }

    /// A key received on the wire; `None` unless exactly [`SEGMENT_KEY_LEN`] bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let k: [u8; SEGMENT_KEY_LEN] = bytes.try_into().ok()?;
        Some(Self(k))
    }

    pub fn as_bytes(&self) -> &[u8; SEGMENT_KEY_LEN] {
        &self.0
    }

    /// Constant-time equality (a re-mount proves it holds the key).
    pub fn matches(&self, other: &[u8]) -> bool {
        crate::constant_time_eq(&self.0, other)
    }

    /// A keyed signer, prepared once and cloned per capability.
    pub fn signer(&self) -> Signer {
        Signer(HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length"))
    }

    pub fn sign(&self, cap: &Capability) -> CapabilityMac {
        self.signer().sign(cap)
    }
}

/// Which transfer a capability allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read = 1,
    Write = 2,
}

/// Permission to `access` `[offset, offset+len)` of segment `segment_id`
/// until `expiry_ms` (Unix milliseconds on the signing master's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability {
    pub segment_id: u64,
    pub offset: u64,
    pub len: u64,
    pub access: Access,
    pub expiry_ms: u64,
}

/// The truncated HMAC that proves a capability was signed with the segment's key.
pub type CapabilityMac = [u8; MAC_LEN];

impl Capability {
    fn message(&self) -> [u8; 33] {
        let mut m = [0u8; 33];
        m[0..8].copy_from_slice(&self.segment_id.to_le_bytes());
        m[8..16].copy_from_slice(&self.offset.to_le_bytes());
        m[16..24].copy_from_slice(&self.len.to_le_bytes());
        m[24..32].copy_from_slice(&self.expiry_ms.to_le_bytes());
        m[32] = self.access as u8;
        m
    }

    /// True when `[offset, offset+len)` lies inside this capability's range.
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        let (Some(end), Some(cap_end)) =
            (offset.checked_add(len), self.offset.checked_add(self.len))
        else {
            return false;
        };
        offset >= self.offset && end <= cap_end
    }
}

/// A key prepared for signing and verifying many capabilities.
#[derive(Clone)]
pub struct Signer(HmacSha256);

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    fn mac(&self, cap: &Capability) -> HmacSha256 {
        let mut h = self.0.clone();
        h.update(DOMAIN);
        h.update(&cap.message());
        h
    }

    pub fn sign(&self, cap: &Capability) -> CapabilityMac {
        let full = self.mac(cap).finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// Checks a request to `access` `[offset, offset+len)` of `segment_id`
    /// against the capability it carries. `grace_ms` allows for the store's
    /// clock running ahead of the master's.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        cap: &Capability,
        mac: &CapabilityMac,
        segment_id: u64,
        access: Access,
        offset: u64,
        len: u64,
        now_ms: u64,
        grace_ms: u64,
    ) -> Result<(), Refusal> {
        // The MAC first: nothing about an unsigned capability is worth reporting.
        if self.mac(cap).verify_truncated_left(mac).is_err() {
            return Err(Refusal::BadMac);
        }
        if cap.segment_id != segment_id {
            return Err(Refusal::OtherSegment);
        }
        if cap.access != access {
            return Err(Refusal::WrongAccess);
        }
        if now_ms > cap.expiry_ms.saturating_add(grace_ms) {
            return Err(Refusal::Expired {
                expired_ms_ago: now_ms - cap.expiry_ms,
            });
        }
        if !cap.covers(offset, len) {
            return Err(Refusal::OutsideRange);
        }
        Ok(())
    }
}

/// Why a store refused a transfer request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("capability not signed with this segment's key")]
    BadMac,
    #[error("capability is for another segment")]
    OtherSegment,
    #[error("capability is for another operation")]
    WrongAccess,
    #[error("capability expired {expired_ms_ago} ms ago")]
    Expired { expired_ms_ago: u64 },
    #[error("request reaches outside the capability's range")]
    OutsideRange,
    #[error("segment not mounted yet: no key to check capabilities with")]
    NoKey,
    #[error("this store's clock differs from the leader's by more than the masters allow (leader minus store: {offset_ms} ms): no grant is honoured until they agree")]
    ClockOff { offset_ms: i64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> Capability {
        Capability {
            segment_id: 7,
            offset: 4096,
            len: 8192,
            access: Access::Read,
            expiry_ms: 1_000_000,
        }
    }

    #[test]
    fn a_signed_capability_is_served_inside_its_range_and_time() {
        let key = SegmentKey::generate();
        let s = key.signer();
        let c = cap();
        let mac = s.sign(&c);
        assert_eq!(
            s.check(&c, &mac, 7, Access::Read, 4096, 8192, 999_999, 0),
            Ok(())
        );
        assert_eq!(
            s.check(&c, &mac, 7, Access::Read, 8192, 100, 1_000_500, 1000),
            Ok(())
        );
        assert_eq!(
            s.check(&c, &mac, 7, Access::Read, 4096, 8193, 0, 0),
            Err(Refusal::OutsideRange)
        );
        assert_eq!(
            s.check(&c, &mac, 7, Access::Read, 4095, 1, 0, 0),
            Err(Refusal::OutsideRange)
        );
        assert_eq!(
            s.check(&c, &mac, 7, Access::Write, 4096, 1, 0, 0),
            Err(Refusal::WrongAccess)
        );
        assert_eq!(
            s.check(&c, &mac, 8, Access::Read, 4096, 1, 0, 0),
            Err(Refusal::OtherSegment)
        );
        assert_eq!(
            s.check(&c, &mac, 7, Access::Read, 4096, 1, 1_002_001, 1000),
            Err(Refusal::Expired {
                expired_ms_ago: 2001
            })
        );
        // Another segment's key signs nothing here.
        let other = SegmentKey::generate().sign(&c);
        assert_eq!(
            s.check(&c, &other, 7, Access::Read, 4096, 1, 0, 0),
            Err(Refusal::BadMac)
        );
        assert_eq!(format!("{key:?}"), "SegmentKey(..)");
    }

    #[test]
    fn keys_come_only_in_their_length() {
        assert!(SegmentKey::from_slice(&[1u8; 31]).is_none());
        assert!(SegmentKey::from_slice(&[1u8; 33]).is_none());
        let k = SegmentKey::from_slice(&[1u8; 32]).unwrap();
        assert!(k.matches(&[1u8; 32]));
        assert!(!k.matches(&[1u8; 31]));
        assert!(!k.matches(&[2u8; 32]));
    }

    fn any_access() -> impl proptest::strategy::Strategy<Value = Access> {
        proptest::prop_oneof![
            proptest::strategy::Just(Access::Read),
            proptest::strategy::Just(Access::Write)
        ]
    }

    proptest::proptest! {
        /// Changing any field of a signed capability, or any bit of its MAC,
        /// makes it refused: a client cannot widen, extend or redirect one.
        #[test]
        fn a_changed_capability_or_mac_is_refused(
            seg in 0u64..4, off in 0u64..1 << 20, len in 1u64..1 << 20, exp in 0u64..1 << 40,
            access in any_access(), field in 0usize..5, delta in 1u64..1 << 30, bit in 0usize..MAC_LEN * 8,
        ) {
            let key = SegmentKey::generate();
            let s = key.signer();
            let c = Capability { segment_id: seg, offset: off, len, access, expiry_ms: exp };
            let mac = s.sign(&c);
            proptest::prop_assert_eq!(s.check(&c, &mac, seg, access, off, len, exp, 0), Ok(()));
            let mut changed = c;
            match field {
                0 => changed.segment_id = seg.wrapping_add(delta),
                1 => changed.offset = off.wrapping_sub(delta),
                2 => changed.len = len.wrapping_add(delta),
                3 => changed.expiry_ms = exp.wrapping_add(delta),
                _ => changed.access = if access == Access::Read { Access::Write } else { Access::Read },
            }
            let asked = (changed.segment_id, changed.access, changed.offset, changed.len.min(1 << 20));
            proptest::prop_assert_eq!(
                s.check(&changed, &mac, asked.0, asked.1, asked.2, asked.3, 0, 0),
                Err(Refusal::BadMac)
            );
            let mut flipped = mac;
            flipped[bit / 8] ^= 1 << (bit % 8);
            proptest::prop_assert_eq!(
                s.check(&c, &flipped, seg, access, off, len, 0, 0),
                Err(Refusal::BadMac)
            );
        }

        /// `covers` is range inclusion, with no overflow.
        #[test]
        fn covers_is_inclusion(co in proptest::num::u64::ANY, cl in proptest::num::u64::ANY,
                               o in proptest::num::u64::ANY, l in proptest::num::u64::ANY) {
            let c = Capability { segment_id: 1, offset: co, len: cl, access: Access::Read, expiry_ms: 0 };
            let expect = (co as u128) <= (o as u128)
                && (o as u128 + l as u128) <= (co as u128 + cl as u128)
                && co.checked_add(cl).is_some()
                && o.checked_add(l).is_some();
            proptest::prop_assert_eq!(c.covers(o, l), expect);
        }
    }
}
