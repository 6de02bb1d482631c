//! One-shot commands over the same dataplane: `apply STATE [--dry-run]`,
//! `plan STATE`, `dump [--json]`, `cleanup`, each acting in `--netns` or the current namespace.
//!
//! `apply` and `plan` share one input path: configuration → state document (every decode error
//! listed) → [`validate::validate_all`] (every error listed) — all before any kernel socket is
//! opened, so a bad document leaves the kernel untouched — then a [`Dataplane`] fed with a link
//! and address dump and the document, both InSyncs marked. Then the loop's own apply runs once
//! ([`crate::dataplane::driver::Driver::apply`], the phases in its fixed order, §10.3: globals →
//! tables (one transaction) → VXLAN devices → routes → neighbours → sysctls of workload
//! interfaces that are up) over a kernel that records what each phase changes: `apply` writes
//! through the real kernel, `plan` writes nothing, `--dry-run` sends the nf_tables batch without
//! its END. Each phase is planned by the same code before it is applied.
//!
//! What is ours (and what `dump` shows and `cleanup` removes): the `calico` tables of both
//! families; routes the §15 ownership rule claims ([`RouteSyncer::list_owned`]); permanent IPv4
//! neighbours on workload interfaces; the VXLAN devices (`vxlan.calico`, `vxlan-v6.calico`) and
//! what lives on them.
//!
//! Table flags: one-shot commands create plain tables (no `OWNER|PERSIST`). The owner flag
//! protects the tables of a *running* agent and is released the moment the process that set it
//! exits, so a one-shot owner would only make every later `apply` re-adopt the table (one
//! operation) instead of finding nothing to do. The daemon adds the flags when it starts.
//!
//! This file holds the entry points the CLI calls, their errors and the input path;
//! `converge` runs `apply` and `plan` over `kernel` (the recording kernel), `report` prints what
//! they change, `dump` reads our objects and `cleanup` removes them.

mod cleanup;
mod converge;
mod dump;
mod kernel;
mod report;

pub use cleanup::{cleanup, CleanupReport};
pub use converge::{converge, Retained};
pub use dump::{snapshot, Snapshot};
pub use report::{ConvergeReport, SysctlChange, VxlanChange};

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{self, ConfigError};
use crate::dataplane::kernel::KernelError;
use crate::dataplane::validate::{self, InputError, Valid};
use crate::dataplane::{Dataplane, DataplaneConfig};
use crate::source::state::{self, StateError};
use felix_api::ToDataplane;
use felix_nft_rules::RulesError;
use nf_tables::reconcile::TableOwnership;
use nf_tables::NftError;
use rtnl::netns::{NetNs, NetNsError};
use rtnl::routes::{RouteSyncer, RT_TABLE_MAIN};
use rtnl::{IpFamily, RtnlError};

use converge::converge_retaining;

/// Exit code: converged / nothing went wrong.
pub const EXIT_OK: u8 = 0;
/// Exit code: bad input, or the kernel refused something.
pub const EXIT_FAILED: u8 = 1;

/// Why a one-shot command failed.
#[derive(Debug, thiserror::Error)]
pub enum OneShotError {
    #[error("loading the configuration")]
    Config(#[source] ConfigError),
    #[error("loading the state document {}", path.display())]
    State {
        path: PathBuf,
        #[source]
        source: StateError,
    },
    #[error("the state document {} has {} message(s) that do not decode; nothing was changed{}", path.display(), errors.len(), list_rejected(errors))]
    Undecodable {
        path: PathBuf,
        errors: Vec<crate::source::Rejected>,
    },
    #[error("the state document has {} invalid message(s); nothing was changed{}", .0.len(), list_input_errors(.0))]
    Invalid(Vec<(usize, InputError)>),
    #[error("opening the network namespace")]
    NetNs(#[source] NetNsError),
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("rendering the desired state")]
    Render(#[source] RulesError),
    #[error("{op}")]
    Kernel {
        op: &'static str,
        #[source]
        source: Box<KernelError>,
    },
    #[error("{op}")]
    Rtnl {
        op: &'static str,
        #[source]
        source: Box<RtnlError>,
    },
    #[error("{op}")]
    Nft {
        op: &'static str,
        #[source]
        source: Box<NftError>,
    },
}

fn list_rejected(errors: &[crate::source::Rejected]) -> String {
    let mut s = String::new();
    for r in errors {
        let _ = write!(s, "\n  {}: {}", r.origin, r.reason);
    }
    s
}

fn list_input_errors(errors: &[(usize, InputError)]) -> String {
    let mut s = String::new();
    for (i, e) in errors {
        let _ = write!(s, "\n  message {i}: {e}");
    }
    s
}

impl OneShotError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            OneShotError::Config(_) => config::EXIT_BAD_CONFIG,
            _ => EXIT_FAILED,
        }
    }
}

fn rtnl(op: &'static str) -> impl FnOnce(RtnlError) -> OneShotError {
    move |source| OneShotError::Rtnl {
        op,
        source: Box::new(source),
    }
}

fn kern(op: &'static str) -> impl FnOnce(KernelError) -> OneShotError {
    move |source| OneShotError::Kernel {
        op,
        source: Box::new(source),
    }
}

/// What the one-shot commands share from the command line.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// `--netns`: a name under /run/netns or a path.
    pub netns: Option<String>,
    /// `--config`.
    pub config: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// Entry points (the CLI arms call these)
// ---------------------------------------------------------------------------------------------

/// What a one-shot command prints on standard output, and its exit code; or why it failed
/// (its exit code is [`OneShotError::exit_code`]). The caller prints and exits.
pub type CommandResult = Result<(String, u8), OneShotError>;

/// `felix-nft apply STATE [--dry-run]`.
pub fn apply_command(
    state: &Path,
    dry_run: bool,
    allow_empty: bool,
    target: &Target,
) -> CommandResult {
    let mode = if dry_run { Mode::DryRun } else { Mode::Apply };
    run_converge(state, mode, allow_empty, target)
}

/// `felix-nft plan STATE`.
pub fn plan_command(state: &Path, allow_empty: bool, target: &Target) -> CommandResult {
    run_converge(state, Mode::Plan, allow_empty, target)
}

/// `felix-nft dump [--json]`. The text form is written to standard output table by table as it
/// is read; the JSON form is returned.
pub fn dump_command(json: bool, target: &Target) -> CommandResult {
    (|| {
        let cfg = load_config(target)?;
        let ns = open_ns(target)?;
        let snap = block_on(snapshot(ns.as_ref(), &cfg))??;
        let text = if json {
            snap.json()
        } else {
            // Table by table straight to stdout: the text of a mid-scale table is 10 MB, and
            // one whole copy of it would be a sixth of the command's peak memory. A closed
            // pipe (`| head`) is not a failure of the command.
            let _ = snap.write_text(&mut std::io::stdout().lock());
            String::new()
        };
        // The process exits next: skip freeing the tables one allocation at a time.
        std::mem::forget(snap);
        Ok((text, EXIT_OK))
    })()
}

/// `felix-nft cleanup`.
pub fn cleanup_command(target: &Target) -> CommandResult {
    (|| {
        let cfg = load_config(target)?;
        let ns = open_ns(target)?;
        let rep = block_on(cleanup(ns.as_ref(), &cfg))??;
        let code = if rep.errors.is_empty() {
            EXIT_OK
        } else {
            EXIT_FAILED
        };
        Ok((rep.text(), code))
    })()
}

fn load_config(target: &Target) -> Result<DataplaneConfig, OneShotError> {
    let resolved = config::load_for_cli(target.config.as_deref()).map_err(OneShotError::Config)?;
    if let Err(e) = crate::ops::init_logging(&resolved.config) {
        eprintln!("felix-nft: logging not set up: {e}");
    }
    resolved.log_warnings();
    let mut cfg = DataplaneConfig::from_config(&resolved.config);
    // See the module documentation: a one-shot process cannot keep ownership.
    cfg.ownership = TableOwnership::Off;
    Ok(cfg)
}

fn open_ns(target: &Target) -> Result<Option<NetNs>, OneShotError> {
    target
        .netns
        .as_deref()
        .map(NetNs::open)
        .transpose()
        .map_err(OneShotError::NetNs)
}

fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, OneShotError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OneShotError::Runtime)?;
    Ok(rt.block_on(f))
}

// ---------------------------------------------------------------------------------------------
// apply / plan
// ---------------------------------------------------------------------------------------------

/// What `apply`/`plan` do with the desired state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Converge the kernel.
    Apply,
    /// Validate the nf_tables batch in the kernel (no END), write nothing else.
    DryRun,
    /// Compute the changes, send nothing.
    Plan,
}

fn run_converge(
    state_path: &Path,
    mode: Mode,
    allow_empty: bool,
    target: &Target,
) -> Result<(String, u8), OneShotError> {
    let cfg = load_config(target)?;
    let msgs = load_state(state_path, &cfg, allow_empty)?;
    let ns = open_ns(target)?;
    let (changes, retained) = block_on(converge_retaining(ns.as_ref(), &cfg, msgs, mode))??;
    // The process exits next: freeing the model, the rendered tables and the reconciler's
    // copies one small allocation at a time took 70 ms of a mid-scale `apply` (measured), and
    // the kernel reclaims the memory at exit anyway.
    std::mem::forget(retained);
    let code = if changes.errors.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILED
    };
    let text = changes.text(mode);
    // The plans hold every operation sent: as `retained`.
    std::mem::forget(changes);
    Ok((text, code))
}

/// Loads and validates a state document, refusing one that describes nothing or may have been
/// cut short unless `allow_empty` ([`state::check_complete`]). Touches no kernel.
pub fn load_state(
    path: &Path,
    cfg: &DataplaneConfig,
    allow_empty: bool,
) -> Result<Vec<Valid>, OneShotError> {
    let state_error = |source| match source {
        StateError::Invalid(errors) => OneShotError::Undecodable {
            path: path.to_path_buf(),
            errors,
        },
        source => OneShotError::State {
            path: path.to_path_buf(),
            source,
        },
    };
    let (msgs, form) = state::load_with_form(path).map_err(state_error)?;
    state::check_complete(&msgs, form, allow_empty).map_err(state_error)?;
    validated(cfg, msgs)
}

/// `msgs` if they are valid as a sequence (each against the state the ones before it make).
fn validated(cfg: &DataplaneConfig, msgs: Vec<ToDataplane>) -> Result<Vec<Valid>, OneShotError> {
    let base = Dataplane::new(cfg.clone(), 1).map_err(OneShotError::Render)?;
    validate::validate_all(base.model(), msgs).map_err(OneShotError::Invalid)
}

/// The route syncers of both families with the §15 ownership rule of `cfg`.
fn route_syncers(cfg: &DataplaneConfig, grace: Option<Duration>) -> [RouteSyncer; 2] {
    let own = cfg.route_ownership();
    [IpFamily::V4, IpFamily::V6].map(|f| {
        let s = RouteSyncer::new(f, RT_TABLE_MAIN, own.clone());
        match grace {
            Some(g) => s.with_grace(g),
            None => s,
        }
    })
}
