//! Measuring one operation: a baseline tool spawned directly inside the benchmark's namespace
//! (no `ip netns exec` in the timed path), wall time around spawn+wait, user/sys CPU from
//! `wait4`'s rusage, and peak RSS from GNU time's `%M` when asked
//! (`wait4`'s `ru_maxrss` of a vfork'd child starts at the parent's RSS, so it cannot be used).
//! felix-nft's in-process numbers come from the daemon's own path: [`Dataplane`] →
//! [`Reconciler`] over one long-lived socket.
//!
//! This is the one place production code runs external programs: the baselines themselves.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::BenchError;
use felix_api::ToDataplane;
use felix_nft::dataplane::kernel::follow_features;
use felix_nft::dataplane::{Dataplane, DataplaneConfig};
use felix_nft_rules::RulesConfig;
use nf_tables::model::{elem_flags, Family};
use nf_tables::reconcile::{Nft, NftKernel, Reconciler, SyncOptions};
use rtnl::netns::NetNs;

/// GNU time, for peak RSS of a spawned tool.
pub const GNU_TIME: &str = "/usr/bin/time";

/// One measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Sample {
    pub wall_ms: f64,
    pub user_ms: f64,
    pub sys_ms: f64,
    /// Peak resident set size, kB (when measured).
    pub rss_kb: Option<u64>,
    /// felix-nft in-process only: the part spent rendering the whole desired state (wall ms).
    pub render_ms: Option<f64>,
}

impl Sample {
    /// Two steps of one operation (ipset restore + iptables-restore): times add, RSS is the max.
    pub fn plus(self, o: Sample) -> Sample {
        Sample {
            wall_ms: self.wall_ms + o.wall_ms,
            user_ms: self.user_ms + o.user_ms,
            sys_ms: self.sys_ms + o.sys_ms,
            rss_kb: match (self.rss_kb, o.rss_kb) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            render_ms: None,
        }
    }
}

fn ns_inode(path: &str) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether the calling thread is in the same network namespace as PID 1 (the host's, here).
pub fn in_root_netns() -> bool {
    let me = ns_inode("/proc/thread-self/ns/net");
    me.is_none() || me == ns_inode("/proc/1/ns/net")
}

fn tv_ms(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 * 1e3 + tv.tv_usec as f64 / 1e3
}

/// A command to time: program, arguments, optional stdin file, extra environment.
#[derive(Debug, Clone)]
pub struct Tool {
    pub argv: Vec<String>,
    pub stdin: Option<PathBuf>,
    pub env: Vec<(String, String)>,
}

impl Tool {
    pub fn new(argv: &[&str]) -> Tool {
        Tool {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: None,
            env: Vec::new(),
        }
    }

    pub fn stdin(mut self, p: &Path) -> Tool {
        self.stdin = Some(p.to_path_buf());
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Tool {
        self.env.push((k.into(), v.into()));
        self
    }

    fn label(&self) -> String {
        self.argv.join(" ")
    }
}

/// Runs `tool` inside `ns` (entered on this thread only for the spawn), waits with `wait4`, and
/// fails unless it exits 0. With `rss`, runs it under GNU time for `%M`. `scratch` holds stderr
/// and GNU time's output.
pub fn spawn_in(ns: &NetNs, tool: &Tool, rss: bool, scratch: &Path) -> Result<Sample, BenchError> {
    let guard = ns.enter().map_err(|source| BenchError::Netns {
        op: "entering the benchmark namespace",
        source,
    })?;
    // The baselines write firewall state: never let one run in the host's namespace.
    if in_root_netns() {
        return Err(BenchError::Refused(format!(
            "{} would run in the host's network namespace",
            tool.label()
        )));
    }
    let io = |op: &str| {
        let op = format!("{op} for {}", tool.label());
        move |source: std::io::Error| BenchError::Io { op, source }
    };
    let err_path = scratch.join("stderr.txt");
    let rss_path = scratch.join("rss.txt");
    let mut argv: Vec<String> = Vec::new();
    if rss {
        argv.extend(
            [GNU_TIME, "-f", "%M", "-o"]
                .iter()
                .map(|s| s.to_string())
                .chain([rss_path.display().to_string()]),
        );
    }
    argv.extend(tool.argv.iter().cloned());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(File::create(&err_path).map_err(io("creating the stderr file"))?);
    match &tool.stdin {
        Some(p) => cmd.stdin(File::open(p).map_err(io("opening the input"))?),
        None => cmd.stdin(Stdio::null()),
    };
    for (k, v) in &tool.env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let child = cmd.spawn().map_err(io("spawning"))?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child; status and ru are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(io("waiting")(e));
        }
    }
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    drop(guard);
    drop(child);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        return Err(BenchError::ToolFailed {
            tool: tool.label(),
            status,
            stderr: stderr
                .trim()
                .replace('\n', " / ")
                .chars()
                .take(2000)
                .collect(),
        });
    }
    let rss_kb = if rss {
        std::fs::read_to_string(&rss_path)
            .ok()
            .and_then(|s| s.lines().last().and_then(|l| l.trim().parse().ok()))
    } else {
        None
    };
    Ok(Sample {
        wall_ms,
        user_ms: tv_ms(ru.ru_utime),
        sys_ms: tv_ms(ru.ru_stime),
        rss_kb,
        render_ms: None,
    })
}

/// Resets this process's peak RSS (`VmHWM`) to its current RSS by writing `5` to
/// `/proc/self/clear_refs` (proc(5), Linux ≥ 4.0). False when the kernel refuses.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak RSS since start or the last [`reset_peak_rss`], kB (`VmHWM`).
pub fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn thread_cpu() -> (f64, f64) {
    // SAFETY: plain old data filled by getrusage for the calling thread.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is valid for writes.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (tv_ms(ru.ru_utime), tv_ms(ru.ru_stime))
}

/// Times `f` on this thread: wall and this thread's CPU.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Sample) {
    let (u0, s0) = thread_cpu();
    let t0 = Instant::now();
    let out = f();
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (u1, s1) = thread_cpu();
    (
        out,
        Sample {
            wall_ms,
            user_ms: u1 - u0,
            sys_ms: s1 - s0,
            rss_kb: None,
            render_ms: None,
        },
    )
}

/// What one read-back of a ruleset held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub chains: usize,
    pub rules: usize,
    /// Set members (interval ends not counted) and map elements.
    pub elements: usize,
    /// Members of the workload's own IP sets only.
    pub workload_members: usize,
}

/// The dataplane configuration the benchmark uses: the daemon's defaults, IPv4 only (the
/// baselines program IPv4 only).
pub fn bench_dataplane_config() -> DataplaneConfig {
    bench_dataplane_config_for(false)
}

/// The benchmark's dataplane configuration, with IPv6 on for the dual-stack mode (Felix's
/// default, `Ipv6Support = true`).
pub fn bench_dataplane_config_for(dual_stack: bool) -> DataplaneConfig {
    DataplaneConfig {
        rules: RulesConfig {
            ipv6_enabled: dual_stack,
            ..RulesConfig::default()
        },
        ipv6: dual_stack,
        ..DataplaneConfig::default()
    }
}

/// felix-nft in-process: the daemon's desired-state core and reconciler with one long-lived
/// socket in the benchmark namespace.
pub struct InProcess {
    dp: Dataplane,
    rec: Reconciler<Nft>,
    tables: Vec<(Family, String)>,
}

impl InProcess {
    /// Opens the socket inside `ns`; the calling thread returns to its namespace at once. With
    /// `dual_stack`, IPv6 is on.
    pub fn open(ns: &NetNs, dual_stack: bool) -> Result<InProcess, BenchError> {
        let nft = {
            let _guard = ns.enter().map_err(|source| BenchError::Netns {
                op: "entering the benchmark namespace",
                source,
            })?;
            if in_root_netns() {
                return Err(BenchError::Refused(
                    "the felix-nft socket would open in the host's network namespace".into(),
                ));
            }
            Nft::open().map_err(|source| BenchError::Nft {
                op: "opening the nf_tables socket".into(),
                source,
            })?
        };
        let mut cfg = bench_dataplane_config_for(dual_stack);
        // As the daemon: this kernel's features, with Felix's override from the environment.
        let overrides = std::env::var("FELIX_FEATUREDETECTOVERRIDE").ok();
        let mut nft = nft;
        follow_features(&mut nft, overrides.as_deref(), &mut cfg.rules)
            .map_err(|e| BenchError::Refused(format!("deciding the kernel's features: {e}")))?;
        let dp = Dataplane::new(cfg.clone(), 1).map_err(|e| BenchError::Refused(e.to_string()))?;
        Ok(InProcess {
            dp,
            rec: Reconciler::new(
                nft,
                SyncOptions {
                    ownership: cfg.ownership,
                    ..SyncOptions::default()
                },
            ),
            tables: Vec::new(),
        })
    }

    /// Records `msgs`, renders what they changed and converges the kernel — what one apply
    /// of the daemon does (the driver's tables phase: `Dataplane::tables_patch` →
    /// `Reconciler::apply_patches`).
    pub fn apply(&mut self, msgs: &[ToDataplane]) -> Result<Sample, BenchError> {
        let (r, mut sample) = timed(|| -> Result<f64, BenchError> {
            for m in msgs {
                self.dp
                    .on_update(m)
                    .map_err(|e| BenchError::Refused(format!("update rejected: {e}")))?;
            }
            let t0 = Instant::now();
            let patches = self.dp.tables_patch();
            let render_ms = t0.elapsed().as_secs_f64() * 1e3;
            self.rec
                .apply_patches(patches)
                .map_err(|source| BenchError::Nft {
                    op: "applying the desired tables".into(),
                    source,
                })?;
            // As the driver does after a commit: the undo log starts again.
            self.dp.tables_committed();
            self.tables = self
                .rec
                .desired()
                .iter()
                .map(|t| (t.family, t.name.clone()))
                .collect();
            Ok(render_ms)
        });
        sample.render_ms = Some(r?);
        Ok(sample)
    }

    /// Merges the side table back into the main one as the idle daemon does (both steps),
    /// timed as one sample; `None` when there was nothing to merge.
    pub fn merge_side(&mut self) -> Result<Option<Sample>, BenchError> {
        let mut total: Option<Sample> = None;
        while self.dp.side_pending() {
            self.dp.request_side_merge();
            let s = self.apply(&[])?;
            total = Some(total.map_or(s, |t| t.plus(s)));
        }
        Ok(total)
    }

    /// Reads our tables back over the same socket (the refresh path's dump).
    pub fn read_back(&mut self) -> Result<(Sample, Counts), BenchError> {
        let tables = self.tables.clone();
        let (r, sample) = timed(|| {
            let mut c = Counts::default();
            for (family, name) in &tables {
                let st = self
                    .rec
                    .kernel
                    .read_table(*family, name)
                    .map_err(|source| BenchError::Nft {
                        op: format!("reading table {} {name}", family.name()),
                        source,
                    })?;
                let Some(st) = st else { continue };
                c.chains += st.table.chains.len();
                c.rules += st
                    .table
                    .chains
                    .values()
                    .map(|ch| ch.rules.len())
                    .sum::<usize>();
                for (sname, set) in &st.table.sets {
                    let n = set
                        .elements
                        .iter()
                        .filter(|e| e.flags & elem_flags::INTERVAL_END == 0)
                        .count();
                    c.elements += n;
                    if sname.starts_with("cali40s-bench") && name != felix_nft_rules::SIDE_TABLE {
                        c.workload_members += n;
                    }
                }
            }
            Ok::<Counts, BenchError>(c)
        });
        r.map(|c| (sample, c))
    }
}
