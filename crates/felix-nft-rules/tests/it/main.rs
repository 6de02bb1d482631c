//! The integration tests of `felix-nft-rules`, one module per suite, in one binary (a binary per
//! suite would link the crate once each).

mod rules_scale;
mod rules_scenarios;
mod rules_semantics;
mod rules_traffic;

/// A profile with one rule each way that matches every packet (no action is allow).
fn allow_all_profile() -> felix_api::types::Profile {
    use felix_api::types::{Profile, Rule};
    Profile {
        inbound_rules: vec![Rule::default()],
        outbound_rules: vec![Rule::default()],
    }
}
