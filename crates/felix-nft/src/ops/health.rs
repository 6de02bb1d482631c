//! Health reporting, after Felix's health aggregator (libcalico-go `health`; §10.2).
//!
//! Components register a *reporter* with a name and a timeout, then report `live`/`ready` from
//! their own task. The HTTP handlers only read a snapshot ([`HealthAggregator::summary`]): they
//! take a short read lock on each reporter's last report and never wait on the loop, so a hung
//! loop shows up as a timed-out reporter instead of a hung health check.
//!
//! Semantics follow Felix: a reporter that reports liveness is *not live* when its last report
//! said so or when it has not reported within its timeout; the same for readiness. With no
//! reporters the process is live and ready. `HealthTimeoutOverrides` replaces a reporter's
//! timeout by name.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::config::{Config, KeyDuration};

/// The reporter name of the dataplane loop, as Felix names it.
pub const DATAPLANE_REPORTER: &str = "InternalDataplaneMainLoop";

/// Felix never lets the dataplane liveness timeout go below this (§10.2).
pub const MIN_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(20);

/// The dataplane loop's liveness timeout: `DataplaneWatchdogTimeout`, at least 20 s.
pub fn dataplane_watchdog_timeout(config: &Config) -> Duration {
    config.dataplane_watchdog_timeout.max(MIN_WATCHDOG_TIMEOUT)
}

/// What one component says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthReport {
    pub live: bool,
    pub ready: bool,
    /// Why it is not ready or not live; empty when all is well.
    pub detail: String,
    /// When the component last did its job successfully (the dataplane: its last good apply).
    /// Shown in the detail as an age, computed when the snapshot is taken.
    pub last_success: Option<SystemTime>,
}

/// Which of the two qualities a reporter takes part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reports {
    pub live: bool,
    pub ready: bool,
}

impl Reports {
    /// Reports both liveness and readiness.
    pub const BOTH: Reports = Reports {
        live: true,
        ready: true,
    };
}

#[derive(Debug)]
struct Slot {
    name: String,
    reports: Reports,
    /// Zero: never times out.
    timeout: Duration,
    overridden: bool,
    last: RwLock<(Instant, HealthReport)>,
}

/// The shared health state: cheap to clone, one per process.
#[derive(Debug, Clone, Default)]
pub struct HealthAggregator {
    slots: Arc<RwLock<Vec<Arc<Slot>>>>,
    overrides: Arc<BTreeMap<String, Duration>>,
}

/// A component's handle for reporting its health. Cloning shares the same reporter.
#[derive(Debug, Clone)]
pub struct HealthReporter {
    slot: Arc<Slot>,
}

/// How one component stands, as the handlers show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentHealth {
    pub name: String,
    /// The effective timeout (zero: none).
    pub timeout: Duration,
    /// The timeout came from `HealthTimeoutOverrides`.
    pub timeout_overridden: bool,
    /// `None` when the component does not report liveness.
    pub live: Option<Quality>,
    /// `None` when the component does not report readiness.
    pub ready: Option<Quality>,
    /// The component's detail, plus the age of its last success when it has one.
    pub detail: String,
    /// When the component last did its job successfully (the dataplane: its last good apply).
    pub last_success: Option<SystemTime>,
    /// Time since the component last reported.
    pub since_report: Duration,
}

/// The state of one quality (liveness or readiness) of one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quality {
    Good,
    /// The component's last report said no.
    ReportedBad,
    /// The component has not reported within its timeout.
    TimedOut,
}

impl Quality {
    fn is_good(self) -> bool {
        self == Quality::Good
    }

    /// Felix's wording in its health table.
    fn describe(self, good: &'static str, bad: &'static str) -> &'static str {
        match self {
            Quality::Good => good,
            Quality::ReportedBad => bad,
            Quality::TimedOut => "timed out",
        }
    }
}

/// A snapshot of every reporter: what `/liveness` and `/readiness` answer from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSummary {
    pub live: bool,
    pub ready: bool,
    pub components: Vec<ComponentHealth>,
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind; health must still
    // answer (and the panicking reporter will time out).
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl HealthAggregator {
    /// An aggregator with no reporters and no timeout overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// An aggregator applying `HealthTimeoutOverrides` (reporter name → timeout).
    pub fn with_overrides(overrides: &[KeyDuration]) -> Self {
        HealthAggregator {
            slots: Arc::default(),
            overrides: Arc::new(
                overrides
                    .iter()
                    .map(|o| (o.name.clone(), o.timeout))
                    .collect(),
            ),
        }
    }

    /// Registers a component. Its first report is `initial`, made now, so the timeout runs
    /// from registration. `timeout` zero means the reporter never times out.
    pub fn register(
        &self,
        name: &str,
        reports: Reports,
        timeout: Duration,
        initial: HealthReport,
    ) -> HealthReporter {
        let (timeout, overridden) = match self.overrides.get(name) {
            Some(t) => (*t, true),
            None => (timeout, false),
        };
        let slot = Arc::new(Slot {
            name: name.to_string(),
            reports,
            timeout,
            overridden,
            last: RwLock::new((Instant::now(), initial)),
        });
        write(&self.slots).push(Arc::clone(&slot));
        HealthReporter { slot }
    }

    /// The current state of every reporter. Takes only short read locks.
    pub fn summary(&self) -> HealthSummary {
        let now = Instant::now();
        let wall = SystemTime::now();
        let slots: Vec<Arc<Slot>> = read(&self.slots).clone();
        let mut summary = HealthSummary {
            live: true,
            ready: true,
            components: Vec::with_capacity(slots.len()),
        };
        for slot in slots {
            let (at, report) = read(&slot.last).clone();
            let since_report = now.saturating_duration_since(at);
            let timed_out = !slot.timeout.is_zero() && since_report > slot.timeout;
            let quality = |good: bool| {
                if timed_out {
                    Quality::TimedOut
                } else if good {
                    Quality::Good
                } else {
                    Quality::ReportedBad
                }
            };
            let live = slot.reports.live.then(|| quality(report.live));
            let ready = slot.reports.ready.then(|| quality(report.ready));
            summary.live &= live.is_none_or(Quality::is_good);
            summary.ready &= ready.is_none_or(Quality::is_good);
            let mut detail = report.detail;
            if let Some(ok_at) = report.last_success {
                let age = wall.duration_since(ok_at).unwrap_or_default();
                if !detail.is_empty() {
                    detail.push_str("; ");
                }
                let _ = write!(detail, "last success {:.1}s ago", age.as_secs_f64());
            }
            summary.components.push(ComponentHealth {
                name: slot.name.clone(),
                timeout: slot.timeout,
                timeout_overridden: slot.overridden,
                live,
                ready,
                detail,
                last_success: report.last_success,
                since_report,
            });
        }
        summary
    }
}

impl HealthReporter {
    /// Records a report, now.
    pub fn report(&self, report: HealthReport) {
        *write(&self.slot.last) = (Instant::now(), report);
    }

    /// The reporter's name.
    pub fn name(&self) -> &str {
        &self.slot.name
    }

    /// The effective timeout (after overrides).
    pub fn timeout(&self) -> Duration {
        self.slot.timeout
    }
}

impl HealthSummary {
    /// Felix's detail table: one row per component. This is the body of both endpoints.
    pub fn table(&self) -> String {
        let header = ["COMPONENT", "TIMEOUT", "LIVENESS", "READINESS", "DETAIL"];
        let rows: Vec<[String; 5]> = self
            .components
            .iter()
            .map(|c| {
                let timeout = if c.timeout.is_zero() {
                    "-".to_string()
                } else {
                    let mut t = format!("{}s", c.timeout.as_secs_f64());
                    if c.timeout_overridden {
                        t.push_str(" (override)");
                    }
                    t
                };
                [
                    c.name.clone(),
                    timeout,
                    c.live
                        .map_or("-", |q| q.describe("reporting live", "reporting non-live"))
                        .to_string(),
                    c.ready
                        .map_or("-", |q| {
                            q.describe("reporting ready", "reporting non-ready")
                        })
                        .to_string(),
                    c.detail.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let rule: String = widths.iter().fold("+".to_string(), |mut s, w| {
            s.push_str(&"-".repeat(w + 2));
            s.push('+');
            s
        });
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut s = "|".to_string();
            for (cell, w) in cells.zip(widths) {
                let _ = write!(s, " {cell:<w$} |");
            }
            s
        };
        let mut out = String::new();
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(out, "{}", line(&mut header.iter().copied()));
        let _ = writeln!(out, "{rule}");
        for row in &rows {
            let _ = writeln!(out, "{}", line(&mut row.iter().map(String::as_str)));
        }
        let _ = writeln!(out, "{rule}");
        out
    }
}

/// The dataplane loop's view of its own health (§10.2): live whenever it reports
/// (a hung loop stops reporting and times out), ready once the first apply has succeeded and
/// the interface monitor is in sync. Owned by the loop; every change is reported at once.
#[derive(Debug)]
pub struct DataplaneHealth {
    reporter: HealthReporter,
    first_apply_done: bool,
    iface_in_sync: bool,
    last_success: Option<SystemTime>,
    consecutive_failures: u32,
    last_error: Option<String>,
}

impl DataplaneHealth {
    /// Registers [`DATAPLANE_REPORTER`] with the given liveness timeout (see
    /// [`dataplane_watchdog_timeout`]).
    pub fn register(aggregator: &HealthAggregator, timeout: Duration) -> Self {
        let mut dp = DataplaneHealth {
            reporter: aggregator.register(
                DATAPLANE_REPORTER,
                Reports::BOTH,
                timeout,
                HealthReport::default(),
            ),
            first_apply_done: false,
            iface_in_sync: false,
            last_success: None,
            consecutive_failures: 0,
            last_error: None,
        };
        dp.heartbeat();
        dp
    }

    /// The loop is alive: re-report the current state (Felix's 10 s health tick).
    pub fn heartbeat(&mut self) {
        let mut reasons = Vec::new();
        if !self.first_apply_done {
            reasons.push("waiting for the first successful apply".to_string());
        }
        if !self.iface_in_sync {
            reasons.push("interface monitor not in sync".to_string());
        }
        if let Some(err) = self
            .last_error
            .as_ref()
            .filter(|_| self.consecutive_failures > 0)
        {
            reasons.push(format!(
                "last {} apply(s) failed: {err}",
                self.consecutive_failures
            ));
        }
        self.reporter.report(HealthReport {
            live: true,
            ready: self.first_apply_done && self.iface_in_sync,
            detail: reasons.join("; "),
            last_success: self.last_success,
        });
    }

    /// The interface monitor finished its first sync.
    pub fn set_iface_in_sync(&mut self) {
        self.iface_in_sync = true;
        self.heartbeat();
    }

    /// An apply finished. Returns `true` for the first successful apply (the moment to send
    /// `DataplaneInSync` and systemd `READY=1`). A later failure does not make the agent
    /// unready (Felix): the last good rules stay programmed and the loop retries.
    pub fn applied(&mut self, result: Result<(), &dyn std::fmt::Display>) -> bool {
        let first = match result {
            Ok(()) => {
                self.consecutive_failures = 0;
                self.last_error = None;
                self.last_success = Some(SystemTime::now());
                !std::mem::replace(&mut self.first_apply_done, true)
            }
            Err(e) => {
                self.consecutive_failures += 1;
                self.last_error = Some(e.to_string());
                false
            }
        };
        self.heartbeat();
        first
    }

    /// Whether the first apply has succeeded.
    pub fn first_apply_done(&self) -> bool {
        self.first_apply_done
    }

    /// When the last apply succeeded.
    pub fn last_success(&self) -> Option<SystemTime> {
        self.last_success
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_reporters_is_live_and_ready() {
        let s = HealthAggregator::new().summary();
        assert!(s.live && s.ready);
    }

    #[test]
    fn dataplane_ready_needs_apply_and_iface_sync() {
        let agg = HealthAggregator::new();
        let mut dp = DataplaneHealth::register(&agg, Duration::from_secs(60));
        let s = agg.summary();
        assert!(s.live);
        assert!(!s.ready);
        assert!(s.components[0].detail.contains("first successful apply"));

        assert!(!dp.applied(Err(&"ENOBUFS")));
        let s = agg.summary();
        assert!(!s.ready);
        assert!(s.components[0].detail.contains("ENOBUFS"), "{s:?}");

        assert!(dp.applied(Ok(())));
        assert!(!agg.summary().ready, "interface monitor not yet in sync");
        dp.set_iface_in_sync();
        let s = agg.summary();
        assert!(s.ready && s.live);
        assert!(s.components[0].detail.starts_with("last success"));
        assert_eq!(s.components[0].last_success, dp.last_success());
        assert!(dp.last_success().is_some());
        assert!(!dp.applied(Ok(())), "only the first success is first");
        dp.applied(Err(&"EPERM"));
        assert!(agg.summary().ready, "a later failure keeps readiness");
    }

    #[test]
    fn timeout_makes_not_live_and_not_ready() {
        let agg = HealthAggregator::new();
        let mut dp = DataplaneHealth::register(&agg, Duration::from_millis(30));
        dp.set_iface_in_sync();
        dp.applied(Ok(()));
        assert!(agg.summary().live);
        std::thread::sleep(Duration::from_millis(60));
        let s = agg.summary();
        assert!(!s.live && !s.ready);
        assert_eq!(s.components[0].live, Some(Quality::TimedOut));
        assert!(s.table().contains("timed out"));
        dp.heartbeat();
        assert!(agg.summary().live);
    }

    #[test]
    fn overrides_replace_the_timeout() {
        let agg = HealthAggregator::with_overrides(&[KeyDuration {
            name: DATAPLANE_REPORTER.into(),
            timeout: Duration::from_secs(7),
        }]);
        let dp = DataplaneHealth::register(&agg, Duration::from_secs(90));
        assert_eq!(dp.reporter.timeout(), Duration::from_secs(7));
        assert!(agg.summary().table().contains("7s (override)"));
    }

    #[test]
    fn reporter_not_reporting_readiness_does_not_block_it() {
        let agg = HealthAggregator::new();
        let r = agg.register(
            "Liveonly",
            Reports {
                live: true,
                ready: false,
            },
            Duration::ZERO,
            HealthReport::default(),
        );
        let s = agg.summary();
        assert!(!s.live && s.ready);
        r.report(HealthReport {
            live: true,
            ..Default::default()
        });
        assert!(agg.summary().live);
    }

    #[test]
    fn watchdog_timeout_has_a_floor() {
        let with = |secs| Config {
            dataplane_watchdog_timeout: Duration::from_secs(secs),
            ..Config::default()
        };
        assert_eq!(dataplane_watchdog_timeout(&with(5)), MIN_WATCHDOG_TIMEOUT);
        assert_eq!(
            dataplane_watchdog_timeout(&with(90)),
            Duration::from_secs(90)
        );
    }
}
