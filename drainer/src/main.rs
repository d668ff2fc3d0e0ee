//! `spindle-drainer`: the drainer as its own binary, for deployments that name one process per
//! role. It is `spindle drainer` (same options, same environment variables); the logic lives in
//! the library's `spindle::drainer`.

use clap::Parser;

/// spindle-drainer: moves retrying jobs out of retired JobDBs, archives expired ones to S3.
#[derive(Debug, Parser)]
#[command(name = "spindle-drainer", version, about)]
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
