//! `spindle-manager`: the JobDB manager as its own binary, for deployments that name one
//! process per role. It is `spindle manager` (same options, same environment variables); the
//! logic lives in the library's `spindle::manager`.

use clap::Parser;

/// spindle-manager: keeps spare JobDBs, retires old ones, drops drained ones.
#[derive(Debug, Parser)]
#[command(name = "spindle-manager", version, about)]
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
