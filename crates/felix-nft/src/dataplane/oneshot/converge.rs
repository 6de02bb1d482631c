//! `apply` and `plan`: the dataplane built from the document and the interface dump, and the
//! loop's own apply run once over the one-shot kernel ([`super::kernel`]), which writes (or
//! plans) and records what each phase changes.

use crate::dataplane::driver::{Driver, DriverError, LoopOptions};
use crate::dataplane::kernel::RealKernel;
use crate::dataplane::validate::Valid;
use crate::dataplane::{Dataplane, DataplaneConfig};
use felix_api::ToDataplane;
use rtnl::link::{list_addresses, list_links, LinkState};
use rtnl::monitor::{ExcludeList, IfaceEvent};
use rtnl::netns::NetNs;
use rtnl::RtnlHandle;

use super::kernel::OneShotKernel;
use super::report::ConvergeReport;
use super::{kern, rtnl, validated, Mode, OneShotError};

/// Feeds a link + address dump to the dataplane, as the interface monitor's first sync would.
async fn feed_ifaces(
    dp: &mut Dataplane,
    h: &RtnlHandle,
    cfg: &DataplaneConfig,
) -> Result<Vec<LinkState>, OneShotError> {
    let exclude = ExcludeList::new(&cfg.iface_exclude).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "InterfaceExclude has a bad regex; excluding nothing");
        ExcludeList::new(&[]).unwrap_or_else(|_| unreachable!("an empty list always compiles"))
    });
    let links = list_links(h).await.map_err(rtnl("listing interfaces"))?;
    let addrs = list_addresses(h)
        .await
        .map_err(rtnl("listing interface addresses"))?;
    for l in links.iter().filter(|l| !exclude.matches(&l.name)) {
        dp.on_iface(&IfaceEvent::Link(l.clone()));
        dp.on_iface(&IfaceEvent::Addrs {
            index: l.index,
            name: l.name.clone(),
            addrs: addrs
                .iter()
                .filter(|(i, _)| *i == l.index)
                .map(|(_, a)| *a)
                .collect(),
        });
    }
    dp.on_iface(&IfaceEvent::InSync);
    Ok(links)
}

/// Builds the dataplane from the document and runs (or plans) the phases once. The messages
/// are validated first, as a whole; any error changes nothing.
pub async fn converge(
    ns: Option<&NetNs>,
    cfg: &DataplaneConfig,
    msgs: Vec<ToDataplane>,
    mode: Mode,
) -> Result<ConvergeReport, OneShotError> {
    let msgs = validated(cfg, msgs)?;
    converge_retaining(ns, cfg, msgs, mode)
        .await
        .map(|(changes, _)| changes)
}

/// The big structures [`converge`] built, handed back so that a process about to exit can skip
/// freeing them.
pub struct Retained {
    _driver: Driver<OneShotKernel>,
}

/// [`converge`] of messages [`super::load_state`] validated: the dataplane fed with the
/// interface dump and the document, then one apply of the loop ([`Driver::apply`]): globals,
/// tables, VXLAN devices, routes, neighbours, interface sysctls.
pub(super) async fn converge_retaining(
    ns: Option<&NetNs>,
    cfg: &DataplaneConfig,
    msgs: Vec<Valid>,
    mode: Mode,
) -> Result<(ConvergeReport, Retained), OneShotError> {
    let real = RealKernel::open(ns, cfg).map_err(kern("opening the kernel sockets"))?;
    let mut dp = Dataplane::new(cfg.clone(), real.procsys().default_rp_filter())
        .map_err(OneShotError::Render)?;
    let links = feed_ifaces(&mut dp, real.rtnl(), cfg).await?;
    // Validated as a whole by `load_state` (validate_all), message by message in order.
    for v in msgs {
        dp.on_validated_update(v);
    }
    dp.set_datastore_in_sync();
    dp.set_ifaces_in_sync();
    let kernel = OneShotKernel::new(real, cfg, mode, links);
    let mut driver = Driver::new(dp, kernel, LoopOptions::default(), None, None);
    let res = driver.apply().await;
    let failed = driver.summary().failures > 0;
    if let Some(e) = driver.kernel.tables_failed.take() {
        let op = match mode {
            Mode::Apply => "programming nf_tables (one transaction; nothing was changed there)",
            Mode::DryRun => "validating the nf_tables batch (dry run)",
            Mode::Plan => "planning nf_tables",
        };
        return Err(kern(op)(e));
    }
    res.map_err(|e| match e {
        DriverError::Globals(e) => kern("start-of-day sysctls")(e),
        DriverError::GaveUp { last, .. } => kern("programming nf_tables")(last),
    })?;
    let mut report = std::mem::take(&mut driver.kernel.report);
    if failed && report.errors.is_empty() {
        report
            .errors
            .push("a phase failed; the log says which and why".into());
    }
    if mode == Mode::Apply {
        if report.table_ops == 0 {
            tracing::info!("nf_tables already converged: no transaction sent");
        } else {
            tracing::info!(ops = report.table_ops, "nf_tables transaction committed");
        }
    }
    Ok((report, Retained { _driver: driver }))
}
