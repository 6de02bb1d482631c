//! The dataplane driver (reference §10–14): managers that record desired state, the apply loop
//! that programs it in a fixed order, and endpoint status. Never encodes netlink itself.
