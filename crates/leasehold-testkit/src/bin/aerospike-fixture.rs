//! `aerospike-fixture`: serves the leasehold Aerospike test fixture until SIGINT or SIGTERM.
//!
//! ```text
//! aerospike-fixture --bind 127.0.0.1:3000 --namespace test
//! ```
//!
//! Prints exactly one line, `listening on <addr>`, on stdout once it accepts connections.
//! Logs (malformed frames, unsupported requests) go to stderr, filtered by `RUST_LOG`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use leasehold_testkit::aerospike::AerospikeFixture;

/// Serve an in-memory Aerospike test server speaking the real wire protocol.
#[derive(Debug, Parser)]
#[command(name = "aerospike-fixture", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    bind: SocketAddr,
    /// Namespace to serve.
    #[arg(long, default_value = "test")]
    namespace: String,
    /// Cluster name to report.
    #[arg(long)]
    cluster_name: Option<String>,
    /// Namespace default TTL in seconds (writes with expiration 0); default: never expire.
    #[arg(long)]
    default_ttl: Option<u64>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let mut builder = AerospikeFixture::builder()
        .bind(args.bind)
        .namespace(args.namespace);
    if let Some(name) = args.cluster_name {
        builder = builder.cluster_name(name);
    }
    if let Some(ttl) = args.default_ttl {
        builder = builder.default_ttl(Duration::from_secs(ttl));
    }
    let fixture = builder.start().await?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening on {}", fixture.addr())?;
        stdout.flush()?;
    }
    wait_for_signal().await?;
    fixture.shutdown().await;
    Ok(())
}

#[cfg(unix)]
async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}
