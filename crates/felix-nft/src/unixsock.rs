//! A unix socket only its owner can reach: bound inside a fresh 0700 directory, set to 0600 and
//! renamed into place, so it never exists with looser permissions. A stale socket at the path
//! (nobody listening) is replaced; a live one, or any other kind of file, is refused.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Binds `path` for its owner only; the listener is blocking. On failure, what was being done
/// (for the caller's error, followed by the path) and the cause.
pub fn bind_private(path: &Path) -> Result<UnixListener, (&'static str, io::Error)> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err((
                "refusing to replace a non-socket file with",
                io::Error::from(io::ErrorKind::AlreadyExists),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err((
                "another process is serving",
                io::Error::from(io::ErrorKind::AddrInUse),
            ));
        }
        fs::remove_file(path).map_err(|e| ("removing the stale", e))?;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "socket".into());
    let staging = parent.join(format!(".{file_name}.{}.tmp", std::process::id()));
    DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(|e| ("making a private directory for", e))?;
    let staged = staging.join("s");
    let bound = (|| {
        let listener = UnixListener::bind(&staged).map_err(|e| ("binding", e))?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(0o600))
            .map_err(|e| ("setting mode 0600 on", e))?;
        fs::rename(&staged, path).map_err(|e| ("moving into place", e))?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&staged);
    let _ = fs::remove_dir(&staging);
    bound
}
