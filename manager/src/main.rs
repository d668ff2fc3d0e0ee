//! `spindle-manager`: the JobDB manager as its own binary, for deployments that name one
//! process per role. It is `spindle manager` (same options, same environment variables).
//!
//! This crate is only that binary. The manager's code is in the library, `spindle::manager`
//! (`src/manager/`), with its options in `spindle::cli` (`src/cli/lifecycle.rs`): `spindle dev`
//! and `spindle manager` run it in-process, and the library cannot depend on a crate that
//! depends on it.

use clap::Parser;

/// spindle-manager: keeps spare JobDBs, retires old ones, drops drained ones.
#[derive(Debug, Parser)]
// `about` spelled out: the Cargo.toml description says where the code is, for readers of the
// workspace; `--help` keeps saying what the command does.
#[command(
    name = "spindle-manager",
    version,
    about = "spindle JobDB manager (the `spindle manager` command as its own binary)"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "SPINDLE_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    args: spindle::cli::ManagerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    spindle::cli::run(spindle::cli::Cli {
        log: cli.log,
        command: spindle::cli::Command::Manager(cli.args),
    })
    .await
}
