//! Sending a batch and turning the kernel's answers into one result: success, `Restart`
//! (generation moved: re-read and retry), or the first refused object with errno and
//! extended-ACK text.
//!
//! Dry-run caveat: the kernel validates every message of a batch
//! without END, but a jump loop formed entirely inside a *new* table is only caught at commit
//! (EMLINK). A clean dry-run is not a proof that the commit succeeds.

use super::batch::Encoded;
use super::consts::ERESTART;
use super::error::NftError;
use super::socket::NfSocket;

/// Sends `enc` in one `sendmsg` and checks every reply. A dry-run (no END) succeeds when no
/// message was refused; the kernel keeps nothing either way.
pub fn send_batch(sock: &mut NfSocket, enc: &Encoded) -> Result<(), NftError> {
    if enc.is_empty() {
        return Ok(());
    }
    sock.send_all(&enc.bytes)?;
    let replies = sock.drain()?;
    let last = enc.first_seq.wrapping_add(enc.messages() as u32 + 1);
    let mut errors: Vec<_> = replies
        .iter()
        .filter_map(|r| r.as_error())
        .filter(|e| {
            e.errno != 0 && e.seq.wrapping_sub(enc.first_seq) <= last.wrapping_sub(enc.first_seq)
        })
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    errors.sort_by_key(|e| e.seq.wrapping_sub(enc.first_seq));
    let first = errors.remove(0);
    if first.errno == ERESTART {
        return Err(NftError::Restart);
    }
    tracing::debug!(
        seq = first.seq,
        errno = first.errno,
        ext_ack = ?first.ext_ack,
        others = errors.len(),
        "nf_tables batch refused"
    );
    Err(NftError::Rejected {
        object: enc.describe(first.seq),
        errno: first.errno,
        ext_ack: first.ext_ack,
        attr_offset: first.attr_offset,
        more: errors.len(),
        target: enc.target(first.seq).map(Box::new),
        source: std::io::Error::from_raw_os_error(first.errno),
    })
}
