//! Network namespaces: naming the namespace the agent acts in, and entering it per thread.
//!
//! A netlink socket belongs to the namespace of the thread that created it, and a `/proc/sys/net`
//! file to the namespace of the thread that opened it. So "act in namespace N" means: enter N on
//! the current thread, create the sockets / open the files, and leave again. [`NetNs::enter`]
//! does that with a guard that restores the previous namespace on drop (the pattern of aya's
//! `NetNsGuard`). Entering a namespace needs CAP_SYS_ADMIN.
//!
//! [`NetNs::new_private`] makes a fresh, unnamed namespace for the current thread — the way tests
//! get a private network stack that disappears with the thread.
//!
//! [`NetNs::create_named`] does what `ip netns add NAME` does, with the same syscalls and no
//! external program (iproute2 `ip/ipnetns.c`): make `/run/netns` a shared mount point (bind it
//! onto itself first when it is not a mount point yet), create `/run/netns/NAME`, unshare a new
//! network namespace on a helper thread and bind-mount that thread's `/proc/thread-self/ns/net`
//! onto the file. The bind mount keeps the namespace alive with no process in it, and makes it
//! visible to `ip -n NAME`. [`NetNs::delete_named`] is `ip netns del NAME`: lazy unmount
//! (`MNT_DETACH`) and unlink; the kernel frees the namespace — and destroys the veths in it — once
//! the last reference (open handle, socket) is gone. [`NamedNetNs`] deletes on drop, also when a
//! test panics; [`unique_netns_name`] gives names that parallel tests cannot collide on.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where `ip netns add NAME` bind-mounts named namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Errors entering or naming a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    #[error("opening network namespace {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entering network namespace {what}")]
    Enter {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("creating a private network namespace (needs root / CAP_SYS_ADMIN)")]
    Unshare(#[source] io::Error),
    /// A step of creating or deleting a named namespace failed (`op` names the step).
    #[error("{op} for named network namespace {name:?} (needs root / CAP_SYS_ADMIN)")]
    Named {
        op: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
    /// The name cannot be a file name under `/run/netns`.
    #[error("invalid network namespace name {0:?}")]
    InvalidName(String),
}

/// A handle on a network namespace (an open nsfs file).
#[derive(Debug)]
pub struct NetNs {
    file: File,
    label: String,
}

impl NetNs {
    /// Resolves `--netns`: a bare name is looked up under `/run/netns`; anything containing a `/`
    /// is a path (`/proc/<pid>/ns/net`, `/run/netns/x`, ...).
    pub fn open(spec: &str) -> Result<NetNs, NetNsError> {
        let path = if spec.contains('/') {
            PathBuf::from(spec)
        } else {
            Path::new(NETNS_RUN_DIR).join(spec)
        };
        let label = path.display().to_string();
        NetNs::open_path(path, label)
    }

    /// The namespace the current thread is in.
    pub fn current() -> Result<NetNs, NetNsError> {
        NetNs::open_path(
            PathBuf::from("/proc/thread-self/ns/net"),
            "current".to_string(),
        )
    }

    /// Opens the nsfs file at `path`, named `label` in messages.
    fn open_path(path: PathBuf, label: String) -> Result<NetNs, NetNsError> {
        let file = File::open(&path).map_err(|source| NetNsError::Open { path, source })?;
        Ok(NetNs { file, label })
    }

    /// Moves the current thread into a new, empty network namespace and returns a guard that
    /// moves it back on drop. The namespace is freed once nothing (thread, socket, bind mount)
    /// refers to it any more.
    pub fn new_private() -> Result<NetNsGuard, NetNsError> {
        let previous = NetNs::current()?;
        // SAFETY: unshare(2) only changes the calling thread's namespace membership.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(NetNsError::Unshare(io::Error::last_os_error()));
        }
        Ok(NetNsGuard {
            previous: Some(previous),
        })
    }

    /// Creates the named namespace `/run/netns/NAME`, like `ip netns add NAME` (see the module
    /// doc), and returns a guard that deletes it on drop. Fails with `EEXIST` in the source when
    /// the name is taken; the calling thread's namespace is never changed.
    pub fn create_named(name: &str) -> Result<NamedNetNs, NetNsError> {
        validate_name(name)?;
        let err = |op: &'static str| {
            let name = name.to_string();
            move |source: io::Error| NetNsError::Named { op, name, source }
        };
        let run_dir = Path::new(NETNS_RUN_DIR);
        match std::fs::create_dir(run_dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(err("creating /run/netns")(e))
            }
            _ => {}
        }
        make_shared_mount_point(run_dir).map_err(err("making /run/netns a shared mount"))?;
        let path = run_dir.join(name);
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(err("creating the mount point file"))?;
        // From here on a failure must not leave the file behind.
        let bound = bind_new_netns(&path).map_err(err("binding a new namespace"));
        if let Err(e) = bound {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let ns = match NetNs::open(path.to_string_lossy().as_ref()) {
            Ok(ns) => ns,
            Err(e) => {
                let _ = delete_mount(&path);
                return Err(e);
            }
        };
        Ok(NamedNetNs {
            name: name.to_string(),
            ns,
            keep: false,
        })
    }

    /// Deletes the named namespace `/run/netns/NAME`, like `ip netns del NAME`: lazy unmount,
    /// then unlink. The namespace itself lives on while anything still refers to it.
    pub fn delete_named(name: &str) -> Result<(), NetNsError> {
        validate_name(name)?;
        delete_mount(&Path::new(NETNS_RUN_DIR).join(name)).map_err(|(op, source)| {
            NetNsError::Named {
                op,
                name: name.to_string(),
                source,
            }
        })
    }

    /// Human-readable name (the path it was opened from).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Enters this namespace on the current thread until the guard is dropped.
    pub fn enter(&self) -> Result<NetNsGuard, NetNsError> {
        let previous = NetNs::current()?;
        setns(&self.file, &self.label)?;
        Ok(NetNsGuard {
            previous: Some(previous),
        })
    }

    /// Runs `f` with the current thread inside this namespace.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, NetNsError> {
        let _guard = self.enter()?;
        Ok(f())
    }

    /// Duplicates the handle (for passing to another thread).
    pub fn try_clone(&self) -> io::Result<NetNs> {
        Ok(NetNs {
            file: self.file.try_clone()?,
            label: self.label.clone(),
        })
    }

    /// The raw nsfs descriptor, for callers that need to pass it on.
    pub fn as_fd_owned(&self) -> io::Result<OwnedFd> {
        Ok(self.file.try_clone()?.into())
    }
}

fn setns(file: &File, label: &str) -> Result<(), NetNsError> {
    // SAFETY: setns(2) on an nsfs descriptor we own; affects only the calling thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(NetNsError::Enter {
            what: label.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Restores the thread's previous namespace when dropped.
#[derive(Debug)]
pub struct NetNsGuard {
    previous: Option<NetNs>,
}

impl NetNsGuard {
    /// A handle on the namespace the thread is in now (e.g. the private one just created).
    pub fn current(&self) -> Result<NetNs, NetNsError> {
        NetNs::current()
    }
}

impl Drop for NetNsGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous.take() {
            if let Err(e) = setns(&prev.file, &prev.label) {
                // A thread that cannot get back must not go on acting in the wrong namespace.
                tracing::error!(error = %e, "could not restore network namespace; aborting");
                std::process::abort();
            }
        }
    }
}

/// A named namespace made by [`NetNs::create_named`]; deleted (unmounted and unlinked) on drop,
/// also during a panic unwind.
#[derive(Debug)]
pub struct NamedNetNs {
    name: String,
    ns: NetNs,
    keep: bool,
}

impl NamedNetNs {
    /// The name under `/run/netns` (what `ip -n NAME` takes).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle on the namespace, for [`NetNs::enter`]/[`NetNs::run`] and rtnetlink.
    pub fn ns(&self) -> &NetNs {
        &self.ns
    }

    /// `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_RUN_DIR).join(&self.name)
    }

    /// Gives up the guard without deleting the namespace (left for inspection; delete it later
    /// with [`NetNs::delete_named`] or `ip netns del NAME`). Returns the name.
    pub fn keep(mut self) -> String {
        self.keep = true;
        self.name.clone()
    }
}

impl Drop for NamedNetNs {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Err(e) = NetNs::delete_named(&self.name) {
            tracing::warn!(netns = %self.name, error = %e, source = ?std::error::Error::source(&e),
                "could not delete named network namespace");
        }
    }
}

/// A namespace name unique to this process and call: `PREFIX-PID-N`. Parallel tests (threads of
/// one process, or several processes) never collide on it.
pub fn unique_netns_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// A name must be one plain file name under `/run/netns` (iproute2 refuses the same).
fn validate_name(name: &str) -> Result<(), NetNsError> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.len() > 255
    {
        return Err(NetNsError::InvalidName(name.to_string()));
    }
    Ok(())
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// `mount --make-shared /run/netns`, binding the directory onto itself first when it is not a
/// mount point (the kernel answers EINVAL), as iproute2 does: mounts made under it then propagate
/// to other mount namespaces that share it.
fn make_shared_mount_point(dir: &Path) -> io::Result<()> {
    let c = cstring(dir)?;
    let none = c"none";
    let mut bound = false;
    loop {
        // SAFETY: valid NUL-terminated strings; a propagation change takes no data argument.
        let rc = unsafe {
            libc::mount(
                c"".as_ptr(),
                c.as_ptr(),
                none.as_ptr(),
                libc::MS_SHARED | libc::MS_REC,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) || bound {
            return Err(e);
        }
        // SAFETY: as above; a bind mount of the directory onto itself.
        let rc = unsafe {
            libc::mount(
                c.as_ptr(),
                c.as_ptr(),
                none.as_ptr(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        bound = true;
    }
}

/// Unshares a new network namespace on a helper thread (so no caller thread ever changes
/// namespace) and bind-mounts it onto `target`. The thread ends right after; the bind mount keeps
/// the namespace alive.
fn bind_new_netns(target: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    let helper =
        std::thread::Builder::new()
            .name("netns-add".into())
            .spawn(move || -> io::Result<()> {
                // SAFETY: unshare(2) changes only this helper thread's namespace membership.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                let src = c"/proc/thread-self/ns/net";
                // SAFETY: valid NUL-terminated strings; a plain bind mount takes no data argument.
                let rc = unsafe {
                    libc::mount(
                        src.as_ptr(),
                        target.as_ptr(),
                        c"none".as_ptr(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            })?;
    helper
        .join()
        .map_err(|_| io::Error::other("namespace helper thread panicked"))?
}

/// Lazy unmount plus unlink; a missing file or a file that is not mounted is not an error (the
/// goal is "gone").
fn delete_mount(path: &Path) -> Result<(), (&'static str, io::Error)> {
    let c = cstring(path).map_err(|e| ("naming the mount point", e))?;
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = io::Error::last_os_error();
        // EINVAL: not a mount point (half-made); ENOENT: already gone.
        if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
            return Err(("unmounting", e));
        }
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(("unlinking", e)),
        _ => Ok(()),
    }
}
