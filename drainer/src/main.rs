//! `spindle-drainer`: the drainer: moves retrying jobs out of a retired JobDB, archives expired ones to S3, drops it.
//!
//! A shell for now: the JobDB lifecycle is built in a later issue ("JobDB lifecycle"). The
//! binary exists so the workspace layout is the final one and deployments can name it.

use clap::Parser;

/// spindle-drainer: the drainer: moves retrying jobs out of a retired JobDB, archives expired ones to S3, drops it (not implemented yet).
#[derive(Debug, Parser)]
#[command(name = "spindle-drainer", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _ = Cli::parse();
    anyhow::bail!(
        "spindle-drainer is not implemented yet: the JobDB lifecycle lands in a later issue"
    )
}
