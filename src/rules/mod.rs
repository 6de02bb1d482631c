//! Calico's rule semantics (reference §4–9, §17–18) rendered as nftables objects: mark bits,
//! names, static chains, endpoint/policy/profile chains, dispatch maps, NAT. Pure: no I/O.
