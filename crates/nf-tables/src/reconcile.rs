//! The reconciler API: read our tables, diff against the desired ones, commit one atomic batch
//! carrying the generation id, and retry from a fresh read when another writer got in first
//! (ERESTART). Calico's table reconciler minus the `nft` exec.
//!
//! [`NftKernel`] is the seam: [`Nft`] is the real kernel over one long-lived socket;
//! [`FakeNft`] holds tables in memory with the kernel's referential checks, so the dataplane
//! loop can be tested without privilege. Everything here is blocking: call it from a dedicated
//! thread, never from an async worker.

use std::collections::BTreeMap;
use std::time::Duration;

use super::batch::Batch;
use super::diff::{self, Plan};
use super::dump::{self, TableState};
use super::error::NftError;
use super::features::{Features, KernelRelease};
use super::model::*;
use super::socket::NfSocket;
use super::txn;
use super::watch::Watch;

/// What the reconciler needs from nf_tables.
pub trait NftKernel {
    /// The ruleset generation id (`NFT_MSG_GETGEN`).
    fn generation(&mut self) -> Result<u32, NftError>;
    /// One of our tables, `None` if the kernel says it does not exist.
    fn read_table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError>;
    /// Commits the plans as ONE batch (or validates them only, `dry_run`). With `genid` the
    /// kernel refuses a stale batch with [`NftError::Restart`].
    fn commit(&mut self, plans: &[Plan], genid: Option<u32>, dry_run: bool)
        -> Result<(), NftError>;
    /// Our owner id (netlink port) as the kernel reports it in `NFTA_TABLE_OWNER`.
    fn owner_id(&self) -> Option<u32>;
    /// Whether tables may carry `OWNER|PERSIST` (kernel ≥ 6.9).
    fn supports_owner_persist(&mut self) -> Result<bool, NftError>;
    /// The latest generation up to which every commit since the state at `genid` is known to
    /// have left `ours` alone (see [`super::watch`]); `None` when not known.
    fn quiet_since(&mut self, _genid: u32, _ours: &[(Family, &str)]) -> Option<u32> {
        None
    }
    /// We know the kernel holds our state at `genid` (read back, nothing to change): watch
    /// for other commits from there.
    fn watch_from(&mut self, _genid: u32) {}
    /// A file descriptor that becomes readable when another process commits (the watch's
    /// socket), for the daemon's loop to wait on; `None` without a watch.
    fn watch_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Whether another process's commit touched `ours` since the last call (see
    /// [`Watch::take_touched`]).
    fn take_touched(&mut self, _ours: &[(Family, &str)]) -> bool {
        false
    }
    /// Bytes and netlink messages of the last batch sent.
    fn last_batch(&self) -> (usize, usize) {
        (0, 0)
    }
}

/// The real kernel: one long-lived `NETLINK_NETFILTER` socket in the current namespace, and
/// a [`Watch`] of other processes' commits.
pub struct Nft {
    sock: NfSocket,
    persist: Option<bool>,
    watch: Option<Watch>,
    last_batch: (usize, usize),
    /// How element lists name a set the same batch creates ([`Features::set_elements_by_id`]).
    elems_by_id: bool,
}

impl Nft {
    /// Opens the sockets in the calling thread's network namespace. Without the watch (it
    /// could not be opened) every commit of another process costs a read-back.
    pub fn open() -> Result<Nft, NftError> {
        let watch = Watch::open()
            .inspect_err(|e| tracing::warn!(error = %e, "no nf_tables event socket: any other program's commit will cost a read-back of our tables"))
            .ok();
        // Until `use_features`: what the release calls for (an unreadable release: by ID).
        let elems_by_id = KernelRelease::current().map_or(true, |r| r.at_least(6, 12));
        Ok(Nft {
            sock: NfSocket::open()?,
            persist: None,
            watch,
            last_batch: (0, 0),
            elems_by_id,
        })
    }

    /// The running kernel's features: the release's decisions and the owner + persist probe.
    pub fn features(&mut self) -> Result<Features, NftError> {
        let release = KernelRelease::current().map_err(NftError::Protocol)?;
        let owner_persist = self.supports_owner_persist()?;
        Ok(Features::decide(release, owner_persist))
    }

    /// The running kernel's features without committing anything: the owner + persist probe
    /// is a dry run (the kernel checks the flags and keeps nothing), for a report.
    pub fn features_dry_run(&mut self) -> Result<Features, NftError> {
        let release = KernelRelease::current().map_err(NftError::Protocol)?;
        let owner_persist = self.probe_owner_persist(true)?;
        Ok(Features::decide(release, owner_persist))
    }

    /// A transaction that adds a table carrying `OWNER|PERSIST` and deletes it again: the kernel
    /// checks the flags and keeps nothing. EOPNOTSUPP/EINVAL = not supported (kernel < 6.9).
    /// Committed rather than a dry run at the agent's start: an aborted batch waits for an RCU
    /// grace period in the kernel, which costs tens of milliseconds.
    fn probe_owner_persist(&mut self, dry_run: bool) -> Result<bool, NftError> {
        let probe = Plan {
            family: Family::Inet,
            // Our own name: a probe of another process at the same time is not ours to touch.
            table: format!("nf-tables-probe-{}", self.sock.port()),
            ops: vec![
                diff::Op::AddTable {
                    flags: table_flags::OWNER | table_flags::PERSIST,
                },
                diff::Op::DelTable,
            ],
        };
        match self.send(&[probe], None, dry_run) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.errno(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Follows `f` (overrides included) from now on.
    pub fn use_features(&mut self, f: &Features) {
        self.persist = Some(f.owner_persist_tables.on);
        self.elems_by_id = f.set_elements_by_id.on;
    }

    /// The underlying socket (for tests and tools).
    pub fn socket(&mut self) -> &mut NfSocket {
        &mut self.sock
    }

    /// Encodes plans into one batch and sends it.
    fn send(
        &mut self,
        plans: &[Plan],
        genid: Option<u32>,
        dry_run: bool,
    ) -> Result<usize, NftError> {
        let seq = self.sock.take_seq(0);
        let mut b = Batch::new(seq, genid).with_elems_by_id(self.elems_by_id);
        let reserved: usize = plans.iter().map(Plan::size_hint).sum();
        b.reserve(reserved);
        for p in plans {
            p.encode(&mut b).map_err(|source| NftError::Codec {
                op: format!(
                    "encoding the batch for table {} {}",
                    p.family.name(),
                    p.table
                ),
                source,
            })?;
        }
        self.sock.take_seq(b.seq_count());
        let enc = b.finish(!dry_run);
        let n = enc.messages();
        self.last_batch = (enc.bytes.len(), n);
        tracing::trace!(bytes = enc.bytes.len(), messages = n, "nf_tables batch");
        let start = std::time::Instant::now();
        txn::send_batch(&mut self.sock, &enc)?;
        // The driver logs every apply at info; one line per transaction is debug.
        tracing::debug!(
            messages = n,
            bytes = enc.bytes.len(),
            reserved,
            dry_run,
            duration_ms = start.elapsed().as_secs_f64() * 1e3,
            "nf_tables transaction done"
        );
        Ok(n)
    }
}

impl NftKernel for Nft {
    fn generation(&mut self) -> Result<u32, NftError> {
        dump::generation(&mut self.sock)
    }

    fn read_table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        dump::read_table(&mut self.sock, family, name)
    }

    fn commit(
        &mut self,
        plans: &[Plan],
        genid: Option<u32>,
        dry_run: bool,
    ) -> Result<(), NftError> {
        if let Some(w) = &mut self.watch {
            w.pause();
        }
        let r = self.send(plans, genid, dry_run).map(|_| ());
        let after = match (&r, genid) {
            (Ok(()), Some(g)) if !dry_run => Some(g.wrapping_add(1)),
            (Ok(()), Some(g)) => Some(g),
            _ => None,
        };
        if let (Some(w), Some(g)) = (&mut self.watch, after) {
            let sock = &mut self.sock;
            w.start(g, || dump::generation(sock));
        }
        r
    }

    fn quiet_since(&mut self, genid: u32, ours: &[(Family, &str)]) -> Option<u32> {
        self.watch.as_mut()?.clean_since(genid, ours)
    }

    fn watch_fd(&self) -> Option<std::os::fd::RawFd> {
        self.watch.as_ref().map(Watch::fd)
    }

    fn take_touched(&mut self, ours: &[(Family, &str)]) -> bool {
        self.watch.as_mut().is_some_and(|w| w.take_touched(ours))
    }

    fn last_batch(&self) -> (usize, usize) {
        self.last_batch
    }

    fn watch_from(&mut self, genid: u32) {
        if let Some(w) = &mut self.watch {
            let sock = &mut self.sock;
            w.start(genid, || dump::generation(sock));
        }
    }

    fn owner_id(&self) -> Option<u32> {
        Some(self.sock.port())
    }

    /// Probed once (see `probe_owner_persist`), then remembered.
    fn supports_owner_persist(&mut self) -> Result<bool, NftError> {
        if let Some(p) = self.persist {
            return Ok(p);
        }
        let ok = self.probe_owner_persist(false)?;
        self.persist = Some(ok);
        Ok(ok)
    }
}

/// Our tables by family and name, as the watch matches them.
fn ours(desired: &[Table]) -> Vec<(Family, &str)> {
    desired
        .iter()
        .map(|t| (t.family, t.name.as_str()))
        .collect()
}

/// Whether our tables carry the owner flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TableOwnership {
    /// `OWNER|PERSIST` where the kernel supports it, plain tables elsewhere.
    #[default]
    OwnerPersist,
    /// Plain tables (anyone with CAP_NET_ADMIN may write them).
    Off,
}

/// How to sync.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Validate the batch in the kernel and keep nothing.
    pub dry_run: bool,
    /// Attempts when the generation moves under us (ERESTART).
    pub max_attempts: u32,
    /// Whether our tables carry `OWNER|PERSIST`.
    pub ownership: TableOwnership,
    /// Rebuild every table (delete + add in one batch) instead of diffing.
    pub rebuild: bool,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            dry_run: false,
            max_attempts: 10,
            ownership: TableOwnership::OwnerPersist,
            rebuild: false,
        }
    }
}

/// What reached the kernel, for the metrics.
#[derive(Debug, Clone, Default)]
pub struct KernelStats {
    /// Each batch sent: bytes and netlink messages.
    pub batches: Vec<(usize, usize)>,
    /// Read-backs of our tables (whole reads and diffs).
    pub read_backs: u32,
}

/// What a sync did.
#[derive(Debug, Clone, Default)]
pub struct TableSyncReport {
    /// The plans committed (or validated); empty when nothing differed.
    pub plans: Vec<Plan>,
    /// Operations in them.
    pub ops: usize,
    /// Attempts used (1 = no ERESTART).
    pub attempts: u32,
    /// Operations beyond the update's own that put back what another process changed: set when
    /// a batch built on the state we trusted was refused because someone else wrote (ERESTART)
    /// and the read-back found more to do than the update.
    pub repaired: usize,
}

/// The owner flags the kernel and the options allow.
fn ownership_flags(kernel: &mut dyn NftKernel, ownership: TableOwnership) -> Result<u32, NftError> {
    Ok(match ownership {
        TableOwnership::OwnerPersist if kernel.supports_owner_persist()? => {
            table_flags::OWNER | table_flags::PERSIST
        }
        TableOwnership::Off | TableOwnership::OwnerPersist => 0,
    })
}

/// `flags` with its owner bits replaced by `ownership` (from [`ownership_flags`]).
fn with_owner_bits(flags: u32, ownership: u32) -> u32 {
    (flags & !(table_flags::OWNER | table_flags::PERSIST)) | ownership
}

/// The desired tables with the owner flags the kernel and the options allow.
pub fn with_ownership(
    kernel: &mut dyn NftKernel,
    desired: &[Table],
    ownership: TableOwnership,
) -> Result<Vec<Table>, NftError> {
    let flags = ownership_flags(kernel, ownership)?;
    Ok(desired
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.flags = with_owner_bits(t.flags, flags);
            t
        })
        .collect())
}

/// The plan from what the kernel holds of `t` to `t`. A table that should be ours (OWNER) but
/// is not owned by our socket `me` (orphaned, or another socket's) is re-adopted.
fn diff_against(t: &Table, actual: Option<&TableState>, me: Option<u32>) -> Plan {
    let readopt = t.flags & table_flags::OWNER != 0 && actual.is_some_and(|a| a.owner != me);
    diff::diff(t, actual.map(|a| &a.table), readopt)
}

/// Reads the tables and computes the plans (what `plan` prints). Returns the generation the
/// plans were computed against.
pub fn plan(
    kernel: &mut dyn NftKernel,
    desired: &[Table],
    rebuild: bool,
) -> Result<(u32, Vec<Plan>), NftError> {
    let genid = kernel.generation()?;
    let me = kernel.owner_id();
    let mut plans = Vec::new();
    for t in desired {
        let actual = kernel.read_table(t.family, &t.name)?;
        let p = match (&actual, rebuild) {
            (Some(_), true) => diff::rebuild(t),
            _ => diff_against(t, actual.as_ref(), me),
        };
        if !p.is_empty() {
            plans.push(p);
        }
    }
    Ok((genid, plans))
}

/// Converges the kernel to `desired` in one atomic batch, retrying from a fresh read on
/// ERESTART. An empty diff sends nothing.
pub fn sync(
    kernel: &mut dyn NftKernel,
    desired: &[Table],
    opts: &SyncOptions,
) -> Result<TableSyncReport, NftError> {
    let desired = with_ownership(kernel, desired, opts.ownership)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (genid, plans) = plan(kernel, &desired, opts.rebuild)?;
        let ops = plans.iter().map(|p| p.ops.len()).sum();
        if plans.is_empty() {
            return Ok(TableSyncReport {
                plans,
                ops,
                attempts: attempt,
                repaired: 0,
            });
        }
        match kernel.commit(&plans, Some(genid), opts.dry_run) {
            Ok(()) => {
                return Ok(TableSyncReport {
                    plans,
                    ops,
                    attempts: attempt,
                    repaired: 0,
                })
            }
            Err(e) if e.is_restart() && attempt < opts.max_attempts => {
                tracing::debug!(attempt, "nf_tables generation moved; re-reading");
                // Felix backs off from 1 ms, doubling.
                std::thread::sleep(Duration::from_millis(1 << attempt.min(8)));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A reconciler that remembers what it last committed, so the steady state costs a diff and
/// the batch — no dump, no GETGEN.
///
/// It keeps the desired tables (one copy, with the ownership flags) and the generation its own
/// last commit (or read) left. A batch computed from that belief carries that generation, so the
/// kernel refuses it (ERESTART) if anyone else wrote since; that, a failure, or
/// [`Reconciler::mark_stale`] (the refresh timer) makes the next apply read the kernel and diff
/// everything. An apply with nothing to change sends nothing at all.
///
/// Two ways in: [`Reconciler::apply`] with the whole desired state (diffed whole), or
/// [`Reconciler::apply_patches`] with what changed (diffed only where the patches touch, so an
/// update costs what it changes).
pub struct Reconciler<K: NftKernel> {
    /// The kernel it commits to.
    pub kernel: K,
    /// How it syncs.
    pub opts: SyncOptions,
    /// The desired tables, ownership flags applied.
    desired: Vec<Table>,
    /// The kernel holds exactly `desired` at this generation.
    trusted: Option<u32>,
    /// The table flags the kernel and the options allow (probed once).
    flags: Option<u32>,
    /// Time spent in [`NftKernel::commit`] since [`Reconciler::take_commit_time`].
    commit_time: Duration,
    /// Since [`Reconciler::take_stats`]: batches sent (bytes, messages, count) and read-backs.
    stats: KernelStats,
}

impl<K: NftKernel> Reconciler<K> {
    /// A reconciler that trusts nothing yet: its first apply reads the kernel.
    pub fn new(kernel: K, opts: SyncOptions) -> Reconciler<K> {
        Reconciler {
            kernel,
            opts,
            desired: Vec::new(),
            trusted: None,
            flags: None,
            commit_time: Duration::ZERO,
            stats: KernelStats::default(),
        }
    }

    /// The kernel seam (to probe features or reach the socket).
    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    /// Time spent committing batches (encode, `sendmsg`, the kernel's commit, the ACK) since
    /// the last call: the kernel's share of an apply, for the daemon's log.
    pub fn take_commit_time(&mut self) -> Duration {
        std::mem::take(&mut self.commit_time)
    }

    /// [`NftKernel::commit`], timed and counted.
    fn commit(&mut self, plans: &[Plan], genid: u32, dry_run: bool) -> Result<(), NftError> {
        let start = std::time::Instant::now();
        let r = self.kernel.commit(plans, Some(genid), dry_run);
        self.commit_time += start.elapsed();
        let (bytes, messages) = self.kernel.last_batch();
        self.stats.batches.push((bytes, messages));
        r
    }

    /// What reached the kernel since the last call.
    pub fn take_stats(&mut self) -> KernelStats {
        std::mem::take(&mut self.stats)
    }

    /// Forget the believed state: the next apply re-reads the kernel (refresh, repair drift).
    pub fn mark_stale(&mut self) {
        self.trusted = None;
    }

    /// The refresh: keeps the believed state when the kernel's ruleset generation is still the
    /// one our last commit left — every change to nf_tables, anyone's, is a commit that moves
    /// it, so nothing can have drifted — and otherwise forgets it, so the next apply reads our
    /// tables back and repairs them. One GETGEN instead of a read-back that grows with the
    /// tables (seconds for a set of several hundred thousand members). Returns whether the
    /// state is still trusted.
    pub fn revalidate(&mut self) -> bool {
        self.advance_trusted();
        if let Some(genid) = self.trusted {
            if matches!(self.kernel.generation(), Ok(g) if g == genid) {
                return true;
            }
        }
        self.trusted = None;
        false
    }

    /// Moves the believed generation past other processes' commits that left our tables alone
    /// (the kernel's [`NftKernel::quiet_since`]), so a batch built on it is not refused and a
    /// refresh finds nothing to read.
    fn advance_trusted(&mut self) {
        let Some(genid) = self.trusted else {
            return;
        };
        let ours = ours(&self.desired);
        if let Some(g) = self.kernel.quiet_since(genid, &ours) {
            self.trusted = Some(g);
        }
    }

    /// Whether another process's commit touched our tables since the last call: an inserted
    /// rule, a deleted chain or table, a flushed ruleset. The caller repairs with a resync.
    pub fn tables_touched(&mut self) -> bool {
        let ours = ours(&self.desired);
        self.kernel.take_touched(&ours)
    }

    /// The watch's socket (see [`NftKernel::watch_fd`]).
    pub fn watch_fd(&self) -> Option<std::os::fd::RawFd> {
        self.kernel.watch_fd()
    }

    /// The desired tables as last given (ownership flags applied).
    pub fn desired(&self) -> &[Table] {
        &self.desired
    }

    fn table_flags(&mut self) -> Result<u32, NftError> {
        if let Some(f) = self.flags {
            return Ok(f);
        }
        let f = ownership_flags(&mut self.kernel, self.opts.ownership)?;
        self.flags = Some(f);
        Ok(f)
    }

    /// Converges the kernel to `desired` (the same list of tables every time).
    pub fn apply(&mut self, desired: &[Table]) -> Result<TableSyncReport, NftError> {
        self.apply_owned(desired.to_vec())
    }

    /// [`Reconciler::apply`] taking the tables by value (no copy is made).
    pub fn apply_owned(&mut self, desired: Vec<Table>) -> Result<TableSyncReport, NftError> {
        let r = self.apply_owned_inner(desired);
        if r.is_err() {
            // Whatever happened, the kernel may not hold what we believe any more.
            self.trusted = None;
        }
        r
    }

    fn apply_owned_inner(&mut self, mut desired: Vec<Table>) -> Result<TableSyncReport, NftError> {
        let flags = match self.table_flags() {
            Ok(f) => f,
            Err(e) => {
                // Keep what we were told: the next attempt works from it.
                self.desired = desired;
                return Err(e);
            }
        };
        for t in &mut desired {
            t.flags = with_owner_bits(t.flags, flags);
        }
        let same_tables = desired.len() == self.desired.len()
            && desired
                .iter()
                .zip(&self.desired)
                .all(|(a, b)| a.family == b.family && a.name == b.name);
        let old = std::mem::replace(&mut self.desired, desired);
        if !same_tables {
            self.trusted = None;
        }
        self.advance_trusted();
        if let (Some(genid), false, false) = (self.trusted, self.opts.rebuild, self.opts.dry_run) {
            // No GETGEN: the batch carries the generation we believe in, and the kernel
            // refuses it (ERESTART) if anyone else wrote since — then we read and diff all.
            {
                let plans: Vec<Plan> = self
                    .desired
                    .iter()
                    .zip(&old)
                    .map(|(t, a)| diff::diff(t, Some(a), false))
                    .filter(|p| !p.is_empty())
                    .collect();
                drop(old);
                let expected = plans.iter().map(|p| p.ops.len()).sum();
                return match self.commit_trusted(genid, plans)? {
                    Some(r) => Ok(r),
                    None => self.sync_after_outside_write(expected),
                };
            }
        }
        self.sync_from_kernel()
    }

    /// [`Self::sync_from_kernel`] after another process wrote under a batch of `expected`
    /// operations: what the read-back does beyond those is a repair.
    fn sync_after_outside_write(&mut self, expected: usize) -> Result<TableSyncReport, NftError> {
        let mut r = self.sync_from_kernel()?;
        r.repaired = r.ops.saturating_sub(expected);
        Ok(r)
    }

    /// Folds `patches` into the desired tables and converges the kernel, diffing only the
    /// objects the patches name while the kernel is trusted to hold the previous desired state.
    pub fn apply_patches(&mut self, patches: Vec<TablePatch>) -> Result<TableSyncReport, NftError> {
        let r = self.apply_patches_inner(patches);
        if r.is_err() {
            // The patches are folded in whatever happened; the next apply diffs everything.
            self.trusted = None;
        }
        r
    }

    fn apply_patches_inner(
        &mut self,
        mut patches: Vec<TablePatch>,
    ) -> Result<TableSyncReport, NftError> {
        for d in patches.iter_mut().flat_map(|p| p.elements.values_mut()) {
            d.cancel_unchanged();
        }
        if self.trusted.is_some()
            && !self.opts.rebuild
            && !self.opts.dry_run
            && patches.iter().all(TablePatch::is_empty)
        {
            // Nothing changed and the kernel held our last state: not even a GETGEN. Drift
            // is the refresh timer's business (`mark_stale`).
            return Ok(TableSyncReport {
                plans: Vec::new(),
                ops: 0,
                attempts: 1,
                repaired: 0,
            });
        }
        // Fold first, so nothing we were told is lost if anything below fails.
        let mut subs: Vec<(Table, Table)> = Vec::new();
        for p in patches {
            subs.extend(self.fold_patch(p));
        }
        let flags = self.table_flags()?;
        for t in &mut self.desired {
            t.flags = with_owner_bits(t.flags, flags);
        }
        for (new, old) in &mut subs {
            new.flags = with_owner_bits(new.flags, flags);
            old.flags = new.flags;
        }
        self.advance_trusted();
        if let (Some(genid), false, false) = (self.trusted, self.opts.rebuild, self.opts.dry_run) {
            // No GETGEN round trip: the batch carries the generation we believe in (see
            // `apply_owned_inner`).
            if let Some(plans) = in_place_plans(&subs) {
                let expected = plans.iter().map(|p| p.ops.len()).sum();
                return match self.commit_trusted(genid, plans)? {
                    Some(r) => Ok(r),
                    None => self.sync_after_outside_write(expected),
                };
            }
        }
        self.sync_from_kernel()
    }

    /// Folds one patch into the desired state. When the kernel is trusted to hold our last
    /// state, returns the patch's objects as a table beside what they replace, for a diff of
    /// just those; `None` when everything is to be diffed against the kernel anyway.
    fn fold_patch(&mut self, mut p: TablePatch) -> Option<(Table, Table)> {
        let idx = match self
            .desired
            .iter()
            .position(|t| t.family == p.family && t.name == p.name)
        {
            Some(i) => i,
            None => {
                // A table we have not had before: the kernel must be read to know it.
                self.trusted = None;
                self.desired.push(Table::new(p.family, p.name.clone()));
                self.desired.len() - 1
            }
        };
        let t = &mut self.desired[idx];
        if self.trusted.is_none() || self.opts.rebuild || self.opts.dry_run {
            // Everything is diffed against the kernel anyway: just fold.
            p.apply_to(t);
            return None;
        }
        sets_to_deltas(&mut p, t);
        let mut new = Table {
            flags: t.flags,
            ..Table::new(t.family, t.name.clone())
        };
        new.chains = p
            .chains
            .iter()
            .filter_map(|(n, c)| c.as_ref().map(|c| (n.clone(), c.clone())))
            .collect();
        new.sets = p
            .sets
            .iter()
            .filter_map(|(n, s)| s.as_ref().map(|s| (n.clone(), s.clone())))
            .collect();
        // Element deltas: the added elements that are really new, as a set with the same
        // definition; `apply_to` returns the removed ones the same way.
        for (n, d) in &p.elements {
            if p.sets.contains_key(n) {
                continue;
            }
            if let Some(cur) = t.sets.get(n) {
                let mut s = cur.clone_def();
                s.elements = d
                    .add
                    .iter()
                    .filter(|e| cur.elements.binary_search(e).is_err())
                    .cloned()
                    .collect();
                new.sets.insert(n.clone(), s);
            }
        }
        let old = p.apply_to(t);
        Some((new, old))
    }

    /// Commits plans computed against the trusted state. `None`: the generation moved under
    /// us (someone else wrote); the caller falls back to reading the kernel.
    fn commit_trusted(
        &mut self,
        genid: u32,
        plans: Vec<Plan>,
    ) -> Result<Option<TableSyncReport>, NftError> {
        let ops = plans.iter().map(|p| p.ops.len()).sum();
        if plans.is_empty() {
            return Ok(Some(TableSyncReport {
                plans,
                ops,
                attempts: 1,
                repaired: 0,
            }));
        }
        let mut genid = genid;
        let mut attempts = 1;
        loop {
            match self.commit(&plans, genid, false) {
                Ok(()) => {
                    self.trusted = Some(genid.wrapping_add(1));
                    return Ok(Some(TableSyncReport {
                        plans,
                        ops,
                        attempts,
                        repaired: 0,
                    }));
                }
                Err(e) if e.is_restart() && attempts < self.opts.max_attempts => {
                    // Someone else committed: if the watch saw it leave our tables alone, the
                    // plans still hold at the new generation.
                    let before = self.trusted;
                    self.advance_trusted();
                    match self.trusted {
                        Some(g) if Some(g) != before => {
                            genid = g;
                            attempts += 1;
                        }
                        _ => {
                            self.trusted = None;
                            return Ok(None);
                        }
                    }
                }
                Err(e) if e.is_restart() => {
                    self.trusted = None;
                    return Ok(None);
                }
                Err(e) => {
                    self.trusted = None;
                    return Err(e);
                }
            }
        }
    }

    /// Reads our tables from the kernel and converges them to the desired ones, retrying from
    /// a fresh read on ERESTART.
    fn sync_from_kernel(&mut self) -> Result<TableSyncReport, NftError> {
        self.trusted = None;
        self.stats.read_backs += 1;
        let me = self.kernel.owner_id();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let genid = self.kernel.generation()?;
            let mut plans = Vec::new();
            // Tables created from nothing lend their rules to the plan (no copy of the load).
            let mut lent: Vec<(usize, usize)> = Vec::new();
            for (i, t) in self.desired.iter_mut().enumerate() {
                let actual = match self.kernel.read_table(t.family, &t.name) {
                    Ok(a) => a,
                    Err(e) => {
                        give_back(&mut plans, &lent, &mut self.desired);
                        return Err(e);
                    }
                };
                let p = match (&actual, self.opts.rebuild) {
                    (Some(_), true) => diff::rebuild(t),
                    (None, _) if !self.opts.dry_run => {
                        lent.push((plans.len(), i));
                        diff::create_lending(t)
                    }
                    _ => diff_against(t, actual.as_ref(), me),
                };
                if !p.is_empty() {
                    plans.push(p);
                } else {
                    lent.retain(|(_, j)| *j != i);
                }
            }
            let ops = plans.iter().map(|p| p.ops.len()).sum();
            if plans.is_empty() {
                self.trusted = (!self.opts.dry_run).then_some(genid);
                if !self.opts.dry_run {
                    self.kernel.watch_from(genid);
                }
                return Ok(TableSyncReport {
                    plans,
                    ops,
                    attempts: attempt,
                    repaired: 0,
                });
            }
            let res = self.commit(&plans, genid, self.opts.dry_run);
            give_back(&mut plans, &lent, &mut self.desired);
            match res {
                Ok(()) => {
                    self.trusted = (!self.opts.dry_run).then_some(genid.wrapping_add(1));
                    return Ok(TableSyncReport {
                        plans,
                        ops,
                        attempts: attempt,
                        repaired: 0,
                    });
                }
                Err(e) if e.is_restart() && attempt < self.opts.max_attempts => {
                    std::thread::sleep(Duration::from_millis(1 << attempt.min(8)));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Turns `p`'s whole-set replacements of plain sets (no map, no intervals) whose definition is
/// unchanged into element deltas against `t`, by one merge of the two sorted element lists.
///
/// A caller that renders from its own model hands over a set that gained or lost a member
/// whole; as a delta neither the set is copied nor every element hashed to find the one that
/// changed (felix-nft's IP set member path). The fold and the diff give the same result either way. Element lists that
/// are not strictly sorted are left alone (the diff handles them whole).
fn sets_to_deltas(p: &mut TablePatch, t: &Table) {
    let plain = |s: &Set| s.data.is_none() && s.flags & set_flags::INTERVAL == 0;
    let strictly_sorted = |e: &[Element]| e.windows(2).all(|w| w[0] < w[1]);
    let names: Vec<String> = p
        .sets
        .iter()
        .filter_map(|(n, s)| {
            let (s, cur) = (s.as_ref()?, t.sets.get(n)?);
            let same_def = s.name == cur.name
                && s.key == cur.key
                && s.flags == cur.flags
                && s.data == cur.data
                && s.size == cur.size;
            (same_def
                && plain(s)
                && !p.elements.contains_key(n)
                && strictly_sorted(&s.elements)
                && strictly_sorted(&cur.elements))
            .then(|| n.clone())
        })
        .collect();
    for n in names {
        let (Some(Some(s)), Some(cur)) = (p.sets.remove(&n), t.sets.get(&n)) else {
            continue;
        };
        let d = sorted_delta(&cur.elements, s.elements);
        if !d.del.is_empty() || !d.add.is_empty() {
            p.elements.insert(n, d);
        }
    }
}

/// What turns the strictly sorted `from` into the strictly sorted `to`: (in `from` only, in
/// `to` only), both sorted.
fn sorted_delta(from: &[Element], to: Vec<Element>) -> ElementDelta {
    use std::cmp::Ordering;
    let mut d = ElementDelta::default();
    let mut old = from.iter().peekable();
    for e in to {
        loop {
            match old.peek().map(|o| (*o).cmp(&e)) {
                Some(Ordering::Less) => d.del.extend(old.next().cloned()),
                Some(Ordering::Equal) => {
                    old.next();
                    break;
                }
                Some(Ordering::Greater) | None => {
                    d.add.push(e);
                    break;
                }
            }
        }
    }
    d.del.extend(old.cloned());
    d
}

/// Returns the rules lent to create-plans ((plan index, table index)) to their tables.
fn give_back(plans: &mut [Plan], lent: &[(usize, usize)], desired: &mut [Table]) {
    for &(p, t) in lent {
        if let (Some(plan), Some(table)) = (plans.get_mut(p), desired.get_mut(t)) {
            diff::return_rules(plan, table);
        }
    }
}

/// Deletes our tables (cleanup), each only if it exists, in one batch.
pub fn remove_tables(
    kernel: &mut dyn NftKernel,
    tables: &[(Family, &str)],
) -> Result<usize, NftError> {
    let genid = kernel.generation()?;
    let mut plans = Vec::new();
    for (f, name) in tables {
        if kernel.read_table(*f, name)?.is_some() {
            plans.push(diff::delete(*f, name));
        }
    }
    if plans.is_empty() {
        return Ok(0);
    }
    kernel.commit(&plans, Some(genid), false)?;
    Ok(plans.len())
}

/// An in-memory kernel for tests of code above the reconciler.
#[derive(Debug, Default)]
pub struct FakeNft {
    /// The "kernel's" tables, by family and name.
    pub tables: BTreeMap<(Family, String), Table>,
    /// The ruleset generation: one up per committed batch (and per injected restart).
    pub generation: u32,
    /// Committed batches (dry-runs excluded).
    pub commits: usize,
    /// Makes the next N commits fail as if another writer moved the generation first.
    pub restarts_to_inject: u32,
    /// Answer of [`NftKernel::supports_owner_persist`].
    pub persist: bool,
    /// Table reads served.
    pub reads: usize,
}

impl NftKernel for FakeNft {
    fn generation(&mut self) -> Result<u32, NftError> {
        Ok(self.generation)
    }

    fn read_table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        self.reads += 1;
        Ok(self
            .tables
            .get(&(family, name.to_owned()))
            .map(|t| TableState {
                table: t.clone(),
                owner: (t.flags & table_flags::OWNER != 0).then_some(1),
            }))
    }

    fn commit(
        &mut self,
        plans: &[Plan],
        genid: Option<u32>,
        dry_run: bool,
    ) -> Result<(), NftError> {
        if self.restarts_to_inject > 0 {
            self.restarts_to_inject -= 1;
            self.generation += 1;
        }
        if genid.is_some_and(|g| g != self.generation) {
            return Err(NftError::Restart);
        }
        let mut tables = self.tables.clone();
        diff::apply(&mut tables, plans).map_err(|e| NftError::Rejected {
            object: e.what.clone(),
            errno: match e.errno {
                "ENOENT" => libc::ENOENT,
                "EEXIST" => libc::EEXIST,
                "EBUSY" => libc::EBUSY,
                _ => libc::EINVAL,
            },
            ext_ack: None,
            attr_offset: None,
            more: 0,
            target: None,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        if !dry_run {
            self.tables = tables;
            self.generation += 1;
            self.commits += 1;
        }
        Ok(())
    }

    fn owner_id(&self) -> Option<u32> {
        Some(1)
    }

    fn supports_owner_persist(&mut self) -> Result<bool, NftError> {
        Ok(self.persist)
    }
}

/// The plans that change each patched table in place, or `None` when one cannot be: something
/// the kernel cannot change in place makes the whole table rebuilt atomically (the diff of the
/// whole table decides that again).
fn in_place_plans(subs: &[(Table, Table)]) -> Option<Vec<Plan>> {
    let mut plans = Vec::new();
    for (new, old) in subs {
        let p = diff::diff(new, Some(old), false);
        if p.ops.first() == Some(&diff::Op::DelTable) {
            return None;
        }
        if !p.is_empty() {
            plans.push(p);
        }
    }
    Some(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elem(b: u8) -> Element {
        Element {
            key: ElemKey::from_slice(&[10, 0, 0, b]),
            key_end: None,
            flags: 0,
            data: None,
        }
    }

    fn table_with(set: Set) -> Table {
        let mut t = Table::new(Family::Ip, "calico");
        t.sets.insert(set.name.clone(), set);
        t
    }

    fn addr_set(name: &str, flags: u32, members: &[u8]) -> Set {
        Set {
            counter: false,
            counters: Default::default(),
            name: name.into(),
            key: vec![DataType::Ipv4Addr],
            flags,
            data: None,
            size: None,
            elements: members.iter().map(|&b| elem(b)).collect(),
        }
    }

    fn trusted(t: Table) -> Reconciler<FakeNft> {
        let mut r = Reconciler::new(FakeNft::default(), SyncOptions::default());
        r.apply(&[t]).unwrap();
        r
    }

    #[test]
    fn an_element_deleted_and_added_as_it_was_stays() {
        // A set holding 1 and 2; a patch deletes 1 and 2 and adds 1 (a map element whose
        // value stayed, beside one that went): 1 stays in the kernel, 2 goes.
        let mut t = Table::new(Family::Ip, "t");
        let mut s = crate::build::new_set("s", vec![crate::model::DataType::Ipv4Addr], 0, None);
        s.elements = vec![elem(1), elem(2)];
        t.sets.insert("s".into(), s);
        let mut r = Reconciler::new(FakeNft::default(), SyncOptions::default());
        r.apply(&[t]).unwrap();
        let mut p = TablePatch::new(Family::Ip, "t");
        p.elements.insert(
            "s".into(),
            ElementDelta {
                del: vec![elem(2), elem(1)],
                add: vec![elem(1)],
            },
        );
        r.apply_patches(vec![p]).unwrap();
        let held = &r.kernel.tables[&(Family::Ip, "t".to_string())].sets["s"].elements;
        assert_eq!(held, &vec![elem(1)]);
    }

    #[test]
    fn sorted_delta_gives_what_differs() {
        let d = sorted_delta(
            &[elem(1), elem(2), elem(3), elem(7)],
            vec![elem(0), elem(1), elem(3), elem(4), elem(9)],
        );
        assert_eq!(d.del, vec![elem(2), elem(7)]);
        assert_eq!(d.add, vec![elem(0), elem(4), elem(9)]);
        let d = sorted_delta(&[], vec![elem(1)]);
        assert_eq!((d.del, d.add), (vec![], vec![elem(1)]));
        let d = sorted_delta(&[elem(1)], vec![]);
        assert_eq!((d.del, d.add), (vec![elem(1)], vec![]));
    }

    /// A set re-rendered whole for one member goes to the kernel as that member only, and
    /// both the kernel and the believed state end up holding the new set.
    #[test]
    fn whole_plain_set_replacement_commits_only_the_member() {
        let mut r = trusted(table_with(addr_set("s", 0, &[1, 2, 3])));
        let mut p = TablePatch::new(Family::Ip, "calico");
        p.sets
            .insert("s".into(), Some(addr_set("s", 0, &[1, 3, 4])));
        let mut q = p.clone();
        sets_to_deltas(&mut q, &r.desired()[0]);
        assert!(q.sets.is_empty());
        assert_eq!(
            q.elements["s"],
            ElementDelta {
                del: vec![elem(2)],
                add: vec![elem(4)],
            }
        );
        let rep = r.apply_patches(vec![p]).unwrap();
        assert_eq!(rep.plans.len(), 1);
        assert_eq!(
            rep.plans[0].ops,
            vec![
                diff::Op::DelElements {
                    set: "s".into(),
                    elements: vec![elem(2)],
                },
                diff::Op::AddElements {
                    set: "s".into(),
                    elements: vec![elem(4)],
                },
            ]
        );
        let want = addr_set("s", 0, &[1, 3, 4]);
        assert_eq!(r.desired()[0].sets["s"], want);
        let k = &r.kernel.tables[&(Family::Ip, "calico".to_string())];
        assert_eq!(k.sets["s"], want);
        assert_eq!(
            r.kernel.reads, 1,
            "the update was committed from the trusted state"
        );
    }

    /// Interval sets and changed definitions keep the whole-set path; the result is the same.
    #[test]
    fn interval_and_redefined_sets_are_left_whole() {
        for (old, new) in [
            (
                addr_set("s", set_flags::INTERVAL, &[1, 2]),
                addr_set("s", set_flags::INTERVAL, &[1, 5]),
            ),
            (
                addr_set("s", 0, &[1, 2]),
                Set {
                    size: Some(16),
                    ..addr_set("s", 0, &[1, 5])
                },
            ),
        ] {
            let t = table_with(old.clone());
            let mut p = TablePatch::new(Family::Ip, "calico");
            p.sets.insert("s".into(), Some(new.clone()));
            sets_to_deltas(&mut p, &t);
            assert_eq!(p.sets.get("s"), Some(&Some(new.clone())));
            assert!(p.elements.is_empty());
            let mut r = trusted(t);
            let mut p = TablePatch::new(Family::Ip, "calico");
            p.sets.insert("s".into(), Some(new.clone()));
            r.apply_patches(vec![p]).unwrap();
            assert_eq!(r.desired()[0].sets["s"], new);
        }
    }
}
