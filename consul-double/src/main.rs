//! The `consul-double` binary: runs the double as a standalone server until Ctrl-C or
//! SIGTERM, e.g. `consul-double --listen 127.0.0.1:8500`. Faults are scripted over
//! `/_test/...` (see the library docs).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use consul_double::duration::parse_go_duration;
use consul_double::{Config, ConsulDouble};

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    name = "consul-double",
    about = "Consul-compatible in-memory test server"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8500")]
    listen: SocketAddr,
    /// Node name reported by the agent.
    #[arg(long, default_value = "consul-double")]
    node_name: String,
    /// Smallest session TTL accepted (Go duration, e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    session_ttl_min: Duration,
    /// Sessions are invalidated TTL x this after their last renew.
    #[arg(long, default_value_t = 2)]
    session_ttl_multiplier: u32,
    /// Cap applied to session lock-delays (Go duration).
    #[arg(long, default_value = "60s", value_parser = parse_go_duration)]
    max_lock_delay: Duration,
    /// Largest KV value in bytes.
    #[arg(long, default_value_t = 512 * 1024)]
    kv_max_value_size: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = Config {
        listen: args.listen,
        node_name: args.node_name,
        session_ttl_min: args.session_ttl_min,
        session_ttl_multiplier: args.session_ttl_multiplier,
        max_lock_delay: args.max_lock_delay,
        kv_max_value_size: args.kv_max_value_size,
    };
    let double = match ConsulDouble::start(config).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("consul-double: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    eprintln!("consul-double listening on {}", double.url());
    wait_for_signal().await;
    double.stop().await;
    ExitCode::SUCCESS
}

/// Resolves on Ctrl-C, or on SIGTERM on Unix.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
