//! Operations surface: health endpoints, Prometheus metrics, systemd notify, logging setup. Owns no
//! dataplane state.

pub mod logging;
