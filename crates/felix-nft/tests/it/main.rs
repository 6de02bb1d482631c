//! The integration tests of `felix-nft`, one module per suite, in one binary (a binary per
//! suite would link the crate once each).

mod fuzz_targets;
#[allow(dead_code)]
mod goldmane_common;
mod loop_common;

mod cli_smoke;
mod config_cli;
mod config_parse;
mod config_props;
mod config_sources;
mod dataplane_apply_log;
mod dataplane_loop;
mod dependencies;
mod driver_fd34;
mod fuzz;
mod goldmane_export;
mod kernel_names;
mod oneshot_cli;
mod ops_http;
mod ops_logging;
mod ops_sdnotify;
mod ops_signal;
mod packaging;
mod quarantine_loop;
mod resilience_loop;
mod rtnl_routes_incremental;
mod rules_incremental;
mod source_felix;
mod source_state;
mod source_stream;
