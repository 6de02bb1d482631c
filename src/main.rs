//! The `felix-nft` binary: parse arguments, hand over to the library.

/// mimalloc instead of glibc malloc (issue 9): after a full load frees its hundreds of thousands
/// of small blocks, glibc consolidates them on the next larger request — a 30–80 ms stall inside
/// the first small update that follows — and keeps the heap fragmented (higher RSS).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    felix_nft::cli::main()
}
