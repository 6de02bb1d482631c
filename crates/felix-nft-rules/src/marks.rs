//! Mark bits (§4): allocated from the configured mask, lowest free bit first, in the
//! order accept, pass, drop, scratch0, scratch1 (and wireguard, when WireGuard is on); then, from the top of what is left, felix-nft's
//! two side-table hand-off bits (see [`crate::side`]); the bits left over form the
//! endpoint-mark field (used by Felix only in kube-proxy IPVS mode, which nftables mode does not
//! support).

use crate::RulesError;

/// The mark bits every rule uses; each is a single bit inside the configured mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MarkBits {
    /// "A policy or profile allowed this packet"; also the cross-hook verdict.
    pub accept: u32,
    /// "Pass to the next tier".
    pub pass: u32,
    /// Set by deny rules just before dropping.
    pub drop: u32,
    /// Short-lived: OR blocks (§9.3) and "came from a workload" in raw PREROUTING.
    pub scratch0: u32,
    /// Short-lived: the second OR block.
    pub scratch1: u32,
    /// WireGuard's own UDP (the device's fwmark), which skips WireGuard's routing table; 0 when
    /// WireGuard is off.
    pub wireguard: u32,
    /// "Handed to the side table at the from-workload dispatch" (0 when
    /// the mask has no room: no side table).
    pub side_from: u32,
    /// "Handed to the side table at the to-workload dispatch" (0 when the mask has no room).
    pub side_to: u32,
    /// The remaining bits of the mask.
    pub endpoint: u32,
}

impl MarkBits {
    /// Allocates the bits from `mask`, lowest first. A mask with fewer than five bits (six with
    /// `wireguard`) is a configuration error (Felix refuses to start in that case).
    pub fn allocate(mask: u32, wireguard: bool) -> Result<MarkBits, RulesError> {
        let mut free = mask;
        let mut take = || {
            if free == 0 {
                return None;
            }
            let bit = free & free.wrapping_neg();
            free &= !bit;
            Some(bit)
        };
        let mut next = |what: &'static str| {
            take().ok_or(RulesError::MarkMaskTooSmall {
                mask,
                bits: mask.count_ones(),
                what,
            })
        };
        let accept = next("accept")?;
        let pass = next("pass")?;
        let drop = next("drop")?;
        let scratch0 = next("scratch0")?;
        let scratch1 = next("scratch1")?;
        let wireguard = if wireguard { next("wireguard")? } else { 0 };
        // The side-table hand-off bits come from the top, so the endpoint field keeps its low bits.
        let (side_from, side_to) = if free.count_ones() >= 2 {
            let hi = |f: u32| 1u32 << (31 - f.leading_zeros());
            let a = hi(free);
            let b = hi(free & !a);
            free &= !(a | b);
            (b, a)
        } else {
            (0, 0)
        };
        Ok(MarkBits {
            accept,
            pass,
            drop,
            scratch0,
            scratch1,
            wireguard,
            side_from,
            side_to,
            endpoint: free,
        })
    }

    /// The bits cleared at Calico's entry points: accept|pass|scratch0|scratch1 (§4).
    /// Whether the side-table hand-off bits were allocated.
    pub fn can_side(&self) -> bool {
        self.side_from != 0 && self.side_to != 0
    }

    pub fn all(&self) -> u32 {
        self.accept | self.pass | self.scratch0 | self.scratch1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_mask_matches_felix() {
        let m = MarkBits::allocate(0xffff_0000, false).unwrap();
        assert_eq!(
            (m.accept, m.pass, m.drop, m.scratch0, m.scratch1, m.endpoint),
            (0x10000, 0x20000, 0x40000, 0x80000, 0x100000, 0x3fe0_0000)
        );
        assert_eq!((m.side_from, m.side_to), (0x4000_0000, 0x8000_0000));
        assert_eq!(m.wireguard, 0);
        // WireGuard's bit is the sixth, as Felix allocates it, and no Calico clear touches it.
        let m = MarkBits::allocate(0xffff_0000, true).unwrap();
        assert_eq!((m.scratch1, m.wireguard), (0x100000, 0x200000));
        assert_eq!(m.endpoint, 0x3fc0_0000);
        assert_eq!(m.all() & m.wireguard, 0);
    }

    #[test]
    fn odd_masks_take_lowest_free_bits_in_order() {
        // Scattered bits: 0b1010_1010_1 → bits 0,2,4,6,8 then the rest.
        let m = MarkBits::allocate(0b1_0101_0101 | 0x8000_0000, false).unwrap();
        assert_eq!(
            (m.accept, m.pass, m.drop, m.scratch0, m.scratch1),
            (0x1, 0x4, 0x10, 0x40, 0x100)
        );
        // One bit left over: no side table, the endpoint field keeps it.
        assert_eq!(m.endpoint, 0x8000_0000);
        assert!(!m.can_side());
        // Exactly five bits: nothing left for the endpoint field.
        let m = MarkBits::allocate(0x1f0, false).unwrap();
        assert_eq!((m.accept, m.scratch1, m.endpoint), (0x10, 0x100, 0));
        // Seven bits: the top two are the side-table hand-off bits.
        let m = MarkBits::allocate(0x7f0, false).unwrap();
        assert_eq!((m.side_from, m.side_to, m.endpoint), (0x200, 0x400, 0));
        // The top bit is usable.
        let m = MarkBits::allocate(0xf800_0000, false).unwrap();
        assert_eq!((m.accept, m.scratch1), (0x0800_0000, 0x8000_0000));
    }

    #[test]
    fn too_small_mask_is_a_config_error() {
        let err = MarkBits::allocate(0xf000, false).unwrap_err();
        assert!(
            matches!(
                err,
                RulesError::MarkMaskTooSmall {
                    mask: 0xf000,
                    bits: 4,
                    what: "scratch1"
                }
            ),
            "{err}"
        );
        assert!(MarkBits::allocate(0, false).is_err());
    }
}
