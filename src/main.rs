//! The `felix-nft` binary: parse arguments, hand over to the library.

fn main() -> std::process::ExitCode {
    felix_nft::cli::main()
}
