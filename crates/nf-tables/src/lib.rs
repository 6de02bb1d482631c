//! The nf_tables engine: object model, pure-Rust netlink codec, atomic transactions, read-back and
//! diff. Knows netlink, not Calico.
//!
//! What it covers, what it leaves out, and a worked example: [`README.md`](../README.md).
//!
//! - [`model`]: tables, chains, rules, sets as the kernel holds them (the renderer's contract).
//! - [`build`]: nftables idioms (`iifname cali*`, `ip saddr CIDR`, ...) as kernel expressions and
//!   `nft` text in lockstep; element constructors.
//! - [`consts`]: uapi constants. [`codec`]: encode/decode of every object and expression.
//! - [`batch`]: one transaction's messages (BEGIN … END), with a seq → object map for errors.
//! - [`socket`]: the blocking `NETLINK_NETFILTER` socket (on `netlink-sys`) and reply parsing.
//! - [`features`]: the kernel release and what it offers, decided once at start.
//! - [`txn`]: commit / dry-run and error attribution. [`dump`]: read-back of our tables.
//! - [`diff`]: desired vs actual → ordered operations. [`print`](mod@print): `nft --debug=netlink` text.
//! - [`reconcile`]: read → diff → one batch with the generation id → retry on ERESTART; the
//!   [`reconcile::NftKernel`] seam with the real [`reconcile::Nft`] and a [`reconcile::FakeNft`].
//!
//! Everything here is blocking (a batch is processed inside `sendmsg`): the daemon calls it
//! from its loop's thread under `block_in_place`, never from a thread that polls tokio's
//! reactor.
// A `pub` item no other crate can reach is `pub(crate)` or narrower: the public surface says
// what the crates above use.
#![warn(unreachable_pub)]
#![warn(missing_docs)]

pub mod batch;
pub mod build;
pub mod codec;
pub mod consts;
pub mod diff;
pub mod dump;
pub mod error;
pub mod features;
pub mod model;
pub mod print;
pub mod reconcile;
pub mod socket;
pub mod txn;
pub mod watch;

pub use error::NftError;
