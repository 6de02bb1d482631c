//! The integration tests of `rtnl`, one module per suite, in one binary (a binary per
//! suite would link the crate once each).

mod oneshot_routes;
mod rtnl_batch;
mod rtnl_conntrack;
mod rtnl_ctevents;
mod rtnl_devconf;
mod rtnl_links;
mod rtnl_monitor;
mod rtnl_neigh;
mod rtnl_nexthops;
mod rtnl_nflog;
mod rtnl_routes;
mod rtnl_vxlan;
mod rtnl_wireguard;
