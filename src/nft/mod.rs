//! The nf_tables engine: object model, pure-Rust netlink codec, atomic transactions, read-back and
//! diff. Knows netlink, not Calico.

pub mod build;
pub mod model;
