//! Kernel networking over rtnetlink (reference §14–16, §21): routes, static ARP, per-interface
//! sysctls, the interface monitor, conntrack. Knows interfaces and addresses, not Calico.
