//! `spindle-manager`: the JobDB manager: keeps spare JobDBs, retires old ones, pairs drainers.
//!
//! A shell for now: the JobDB lifecycle is built in a later issue ("JobDB lifecycle"). The
//! binary exists so the workspace layout is the final one and deployments can name it.

use clap::Parser;

/// spindle-manager: the JobDB manager: keeps spare JobDBs, retires old ones, pairs drainers (not implemented yet).
#[derive(Debug, Parser)]
#[command(name = "spindle-manager", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _ = Cli::parse();
    anyhow::bail!(
        "spindle-manager is not implemented yet: the JobDB lifecycle lands in a later issue"
    )
}
