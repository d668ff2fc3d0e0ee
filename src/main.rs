//! The `spindle` binary: parses the command line and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    spindle::cli::run(spindle::cli::Cli::parse()).await
}
