//! The `felix-nft-lab` binary: parse arguments, hand over to the library.

/// mimalloc, as the agent's binary (`felix_nft::alloc`), so that the lab measures what
/// operators run.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    felix_nft::alloc::configure();
    felix_nft_lab::cli::main()
}
