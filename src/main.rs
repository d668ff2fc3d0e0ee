//! The `spindle` binary: parses the command line and hands over to the library.

use clap::Parser;

// glibc malloc showed up as ~13% of a Director's CPU under load; mimalloc halves that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    spindle::cli::run(spindle::cli::Cli::parse()).await
}
