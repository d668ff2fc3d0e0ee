//! `spindle-drainer`: the drainer as its own binary, for deployments that name one process
//! per role. It is `spindle drainer` (same options, same environment variables).
//!
//! This crate is only that binary. The drainer's code is in the library, `spindle::drainer`
//! (`src/drainer/`), with its options in `spindle::cli` (`src/cli/lifecycle.rs`): `spindle dev`
//! and `spindle drainer` run it in-process, and the library cannot depend on a crate that
//! depends on it.

use clap::Parser;

/// spindle-drainer: moves retrying jobs out of retired JobDBs, archives expired ones to S3.
#[derive(Debug, Parser)]
// `about` spelled out: the Cargo.toml description says where the code is, for readers of the
// workspace; `--help` keeps saying what the command does.
#[command(
    name = "spindle-drainer",
    version,
    about = "spindle drainer: migrates retrying jobs out of a retired JobDB, archives expired ones, drops it"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "SPINDLE_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    args: spindle::cli::DrainerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    spindle::cli::run(spindle::cli::Cli {
        log: cli.log,
        command: spindle::cli::Command::Drainer(cli.args),
    })
    .await
}
