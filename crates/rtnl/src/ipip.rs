//! The IPv4-in-IPv4 device `tunl0`: the namespace's fallback tunnel, which the kernel's `ipip`
//! module creates in every namespace once it is loaded. Made to appear (a link of kind `ipip`
//! named `tunl0` is requested: the module loads and creates the fallback, so the answer EEXIST
//! is the expected one), then given its MTU, one IPv4 address (a /32) and brought up; or, when
//! the caller says so, stripped of its IPv4 addresses and otherwise left as it is (the kernel
//! owns the device and it cannot be deleted). Knows the device, not who wants it.
//!
//! Invariants:
//! - Nothing touches the kernel before [`IpipSyncer::apply`].
//! - The device is looked at (one RTM_GETLINK and one address dump) only when what is wanted
//!   changed, the caller reports the device changed, or on a resync.
//! - A link named `tunl0` of another kind is an error, never deleted.
//! - A kernel without the module answers the create with EOPNOTSUPP: the report says
//!   `unsupported` and the syncer waits for the next resync instead of retrying at once.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use netlink_packet_route::link::InfoKind;
use rtnetlink::LinkIpIp;

use super::link::{get_link_message, set_sole_address, DeviceState, SoleAddress};
use super::{Result, RtnlError, RtnlHandle};

/// The kernel's IPIP fallback device, Felix's IPIP device.
pub const IPIP_IFACE: &str = "tunl0";

/// How `tunl0` should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpipSpec {
    pub mtu: u32,
    /// The device's one IPv4 address, as a /32; others go (IPv6 ones stay).
    pub addr: Ipv4Addr,
}

/// What the caller wants of `tunl0`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum IpipWanted {
    /// Leave it as it is (IPIP on but not configurable yet, or off by configuration).
    #[default]
    Leave,
    /// Remove its IPv4 addresses, if it exists (IPIP off without being configured off).
    Strip,
    /// Create it if needed, and correct it to the spec.
    Configure(IpipSpec),
}

/// What one apply did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IpipReport {
    /// `tunl0` appeared (the module was loaded by the request).
    pub created: bool,
    /// What was corrected on it: `mtu 1480`, `+10.65.0.1/32`, `-10.0.0.9/32`, `up`.
    pub corrected: Vec<String>,
    /// The kernel has no `ipip` module.
    pub unsupported: bool,
}

/// `tunl0`: what is wanted, and the kernel writes to get there.
#[derive(Debug)]
pub struct IpipSyncer {
    want: IpipWanted,
    dirty: bool,
    resync: bool,
}

impl Default for IpipSyncer {
    /// Nothing wanted yet; the first apply with something wanted looks at the device.
    fn default() -> IpipSyncer {
        IpipSyncer {
            want: IpipWanted::Leave,
            dirty: false,
            resync: true,
        }
    }
}

impl IpipSyncer {
    /// Sets what is wanted. No kernel I/O.
    pub fn set(&mut self, want: IpipWanted) {
        if self.want != want {
            self.want = want;
            self.dirty = true;
        }
    }

    /// The device was reported changed (appeared, went down, its addresses changed).
    pub fn device_changed(&mut self) {
        self.dirty = true;
    }

    /// Look at the device again on the next apply.
    pub fn request_resync(&mut self) {
        self.resync = true;
    }

    /// True when an apply has work to do.
    pub fn needs_apply(&self) -> bool {
        self.want != IpipWanted::Leave && (self.dirty || self.resync)
    }

    /// Brings `tunl0` to what is wanted. On an error the next apply looks again.
    pub async fn apply(&mut self, h: &RtnlHandle) -> Result<IpipReport> {
        let mut report = IpipReport::default();
        if !self.needs_apply() {
            return Ok(report);
        }
        let res = match self.want.clone() {
            IpipWanted::Leave => Ok(()),
            IpipWanted::Strip => strip(h, &mut report).await,
            IpipWanted::Configure(spec) => configure(h, &spec, &mut report).await,
        };
        match res {
            Ok(()) => {
                self.dirty = false;
                self.resync = false;
                Ok(report)
            }
            Err(e) => {
                self.resync = true;
                Err(e)
            }
        }
    }
}

async fn configure(h: &RtnlHandle, spec: &IpipSpec, report: &mut IpipReport) -> Result<()> {
    let mut msg = get_link_message(h, IPIP_IFACE).await?;
    if msg.is_none() {
        let res = h
            .handle()
            .link()
            .add(LinkIpIp::new(IPIP_IFACE).build())
            .execute()
            .await;
        match res.map_err(|e| RtnlError::kernel("creating IPIP device", IPIP_IFACE, e)) {
            Ok(()) => {}
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => {
                report.unsupported = true;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        report.created = true;
        msg = get_link_message(h, IPIP_IFACE).await?;
    }
    let Some(e) = msg.as_ref().map(DeviceState::of) else {
        return Err(RtnlError::Unexpected {
            op: "creating IPIP device",
            what: format!("{IPIP_IFACE} is missing right after it was created"),
        });
    };
    if e.kind != Some(InfoKind::IpIp) {
        return Err(RtnlError::Unexpected {
            op: "configuring IPIP device",
            what: format!("{IPIP_IFACE} exists and is not an ipip device"),
        });
    }
    let want = IpNet::from(IpAddr::V4(spec.addr));
    let done = set_sole_address(h, IPIP_IFACE, e.index, false, Some(want)).await?;
    note_addresses(&done, report);
    if done.added {
        report.corrected.push(format!("+{want}"));
    }
    let fixed = e.correct_mtu_and_up(h, IPIP_IFACE, spec.mtu).await?;
    report.corrected.extend(fixed);
    Ok(())
}

/// Removes every IPv4 address of `tunl0`, if it exists.
async fn strip(h: &RtnlHandle, report: &mut IpipReport) -> Result<()> {
    let Some(e) = get_link_message(h, IPIP_IFACE)
        .await?
        .as_ref()
        .map(DeviceState::of)
    else {
        return Ok(());
    };
    let done = set_sole_address(h, IPIP_IFACE, e.index, false, None).await?;
    note_addresses(&done, report);
    Ok(())
}

fn note_addresses(done: &SoleAddress, report: &mut IpipReport) {
    report
        .corrected
        .extend(done.removed.iter().map(|a| format!("-{a}")));
}
