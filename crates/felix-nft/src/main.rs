//! The `felix-nft` binary: parse arguments, hand over to the library.

/// mimalloc, for the reasons in `felix_nft::alloc`.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    felix_nft::alloc::configure();
    felix_nft::cli::main()
}
