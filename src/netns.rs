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

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

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
        let file = File::open(&path).map_err(|source| NetNsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(NetNs {
            file,
            label: path.display().to_string(),
        })
    }

    /// The namespace the current thread is in.
    pub fn current() -> Result<NetNs, NetNsError> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let file = File::open(&path).map_err(|source| NetNsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(NetNs {
            file,
            label: "current".to_string(),
        })
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
