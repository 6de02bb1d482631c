//! The one error type of the nf_tables engine. Every variant names the operation and the object;
//! kernel refusals keep errno and the kernel's extended-ACK text.

use std::io;

use super::codec::CodecError;
use super::model::Family;

/// The object a batch message was about, for a caller that must know which of its inputs the
/// kernel refused (a rule names its chain, an element list its set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Family of the table.
    pub family: Family,
    /// Name of the table.
    pub table: String,
    /// The object in it.
    pub object: ObjectRef,
}

/// An object in a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectRef {
    /// The table itself.
    Table,
    /// A chain, or one of its rules.
    Chain(String),
    /// A set or map, or some of its elements.
    Set(String),
}

/// Errors of talking to nf_tables.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// A socket operation failed (open, bind, setsockopt, send, recv).
    #[error("nf_tables socket: {op}")]
    Socket {
        /// The call that failed (`"sendmsg"`, `"SO_SNDBUF"`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a message of a batch; the whole batch was rolled back.
    #[error("the kernel refused {object}{}{}", .ext_ack.as_ref().map(|m| format!(": {m}")).unwrap_or_default(), if *.more > 0 { format!(" (and {} more errors in the batch)", .more) } else { String::new() })]
    Rejected {
        /// What the message did ("adding rule 3 of chain filter-cali-tw-cali12 in table ip calico").
        object: String,
        /// Positive errno.
        errno: i32,
        /// The kernel's extended-ACK message, when it sent one.
        ext_ack: Option<String>,
        /// Byte offset of the offending attribute in the message (`NLMSGERR_ATTR_OFFS`).
        attr_offset: Option<u32>,
        /// Further errors reported for later messages of the same batch.
        more: usize,
        /// The object the refused message was about, when it was about one (not the batch's
        /// BEGIN or END).
        target: Option<Box<Target>>,
        /// The errno as an OS error.
        #[source]
        source: io::Error,
    },
    /// The ruleset changed since we read it (`ERESTART` on the batch generation id): re-read and
    /// retry.
    #[error("the nf_tables ruleset generation changed since it was read (ERESTART)")]
    Restart,
    /// A read of the kernel's state failed; never to be taken for an empty table.
    #[error("reading {what}")]
    Read {
        /// What was read (`"table ip calico"`).
        what: String,
        /// Why it failed.
        #[source]
        source: Box<NftError>,
    },
    /// A dump stayed inconsistent (`NLM_F_DUMP_INTR`, duplicate elements, generation moved)
    /// after retries.
    #[error("dump of {what} stayed inconsistent after {tries} attempts")]
    Inconsistent {
        /// What was read.
        what: String,
        /// Reads tried.
        tries: u32,
    },
    /// A message could not be encoded or a reply could not be decoded.
    #[error("{op}")]
    Codec {
        /// What was being encoded or decoded.
        op: String,
        /// The codec's error.
        #[source]
        source: CodecError,
    },
    /// The kernel's reply did not follow the protocol.
    #[error("unexpected nf_tables reply: {0}")]
    Protocol(String),
}

impl NftError {
    /// True when the batch was refused because the generation moved: the caller re-reads and
    /// retries.
    pub fn is_restart(&self) -> bool {
        match self {
            NftError::Restart => true,
            NftError::Rejected { errno, .. } => *errno == super::consts::ERESTART,
            _ => false,
        }
    }

    /// The object a refused batch message was about.
    pub fn target(&self) -> Option<&Target> {
        match self {
            NftError::Rejected { target, .. } => target.as_deref(),
            _ => None,
        }
    }

    /// True when the kernel refused a message of a batch (not the generation check): the
    /// batch held something the kernel would not take.
    pub fn is_refusal(&self) -> bool {
        matches!(self, NftError::Rejected { .. }) && !self.is_restart()
    }

    /// The errno of a kernel refusal (or of the socket failure).
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Rejected { errno, .. } => Some(*errno),
            NftError::Socket { source, .. } => source.raw_os_error(),
            NftError::Read { source, .. } => source.errno(),
            _ => None,
        }
    }
}
