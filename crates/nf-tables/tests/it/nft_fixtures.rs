//! nf_tables model values that the codec, diff, dump and kernel tests and the codec bench all
//! build the same way: plain IPv4 address sets with their elements, and interface-name verdict
//! maps like the workload dispatch maps.
#![allow(dead_code)]

use nf_tables::model::*;

/// `n` consecutive IPv4 address elements starting at `first` (no interval end, no data).
pub fn ipv4_elements(first: u32, n: u32) -> Vec<Element> {
    (0..n)
        .map(|i| Element {
            key: (first + i).to_be_bytes()[..].into(),
            key_end: None,
            flags: 0,
            data: None,
        })
        .collect()
}

/// A plain IPv4 address set: no flags, no counters.
pub fn ipv4_set(name: &str, size: Option<u32>, elements: Vec<Element>) -> Set {
    Set {
        counter: false,
        counters: Default::default(),
        name: name.into(),
        key: vec![DataType::Ipv4Addr],
        flags: 0,
        data: None,
        size,
        elements,
    }
}

/// An empty map from interface name to verdict.
pub fn ifname_vmap(name: &str) -> Set {
    Set {
        counter: false,
        counters: Default::default(),
        name: name.into(),
        key: vec![DataType::IfName],
        flags: 0,
        data: Some(DataType::Verdict),
        size: None,
        elements: vec![],
    }
}

/// A verdict-map element for packets of interface `ifname`, its key padded to IFNAMSIZ as the
/// kernel compares it.
pub fn ifname_element(ifname: &str, verdict: Verdict) -> Element {
    let mut key = ifname.as_bytes().to_vec();
    key.resize(16, 0);
    Element {
        key: key.into(),
        key_end: None,
        flags: 0,
        data: Some(Box::new(ElemData::Verdict(verdict))),
    }
}

/// Loads the IPv4 source address (network header, offset 12, 4 bytes) into R1.
pub fn load_ip_saddr() -> Expr {
    Expr::Payload {
        base: PayloadBase::Network,
        offset: 12,
        len: 4,
        dreg: Reg::R1,
    }
}
