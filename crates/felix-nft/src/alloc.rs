//! The allocator's settings, shared by the binaries that run the agent (`felix-nft`, and the
//! lab's, so that the lab measures what operators run).
//!
//! Each binary declares mimalloc as its global allocator: after a full load frees its hundreds
//! of thousands of small blocks, glibc's malloc consolidates them on the next larger request — a
//! 30–80 ms stall inside the first small update that follows — and keeps the heap fragmented
//! (higher RSS). mimalloc is built with `no_thp`: it otherwise asks for transparent huge pages on
//! its arenas, and every 4 KiB touched then makes 2 MiB resident (a fresh mid-scale `apply`
//! peaked at 71 MB with them, 55 MB without; no measurable CPU difference).

/// `mi_option_purge_delay` in the enum of mimalloc v3's `mimalloc.h` (libmimalloc-sys 0.1.49
/// builds v3; its Rust constants follow v2's enum and have no purge option).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's options; the first thing `main` does. Freed pages go back at once instead of
/// 1 s later (v3's default): a full sync frees the document, the renderer's temporaries (and in
/// `apply` the model) just before it builds the batch, and the delay kept them in the peak
/// (fresh `apply`: mid 75 → 55 MB, large 260 → 190 MB; no measurable CPU cost).
pub fn configure() {
    // SAFETY: sets a process-wide allocator option; mimalloc allows this at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}
