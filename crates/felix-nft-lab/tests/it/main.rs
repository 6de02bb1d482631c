//! The integration tests of `felix-nft-lab`, one module per suite, in one binary (a binary per
//! suite would link the crate once each).

mod e2e_common;
#[allow(dead_code)]
#[path = "../../../felix-nft/tests/it/goldmane_common.rs"]
mod goldmane_common;
#[allow(dead_code)]
mod route_oracle;
mod testbed_common;

mod bench_compare;
mod bench_flowlogs;
mod bench_spotcheck;
mod cluster_controller;
mod cluster_ipip;
mod cluster_vxlan;
mod cluster_wireguard;
mod daemon_netns;
mod demo_cli;
mod e2e_flowlogs;
mod e2e_hostile;
mod e2e_noexec;
mod e2e_scenarios;
mod quarantine_kernel;
mod resilience_agent;
mod testbed_cluster;
mod testbed_netns;
mod testbed_noexec;
mod testbed_topology;
mod testbed_traffic;
