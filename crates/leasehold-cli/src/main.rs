//! `leasehold`: distributed locks from the shell.
//!
//! Run a command under a lock (like `etcdctl lock` and `consul lock`, on Aerospike and Redis),
//! inspect and break locks, watch the scenarios in a demo, and benchmark a store.
#![forbid(unsafe_code)]

mod admin;
mod bench;
mod cli;
mod demo;
mod elect;
mod events;
mod exit;
mod run;
mod scenarios;
mod store;
mod store_url;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                // The Aerospike client logs connection failures itself; leasehold reports them.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,aerospike_core=off")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("leasehold: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&cli.global, args).await,
            Command::Scenarios(args) => scenarios::scenarios(args),
            Command::History(args) => scenarios::history(&cli.global, args).await,
            Command::Inspect(args) => admin::inspect(&cli.global, args).await,
            Command::List(args) => admin::list(&cli.global, args).await,
            Command::Release(args) => admin::release(&cli.global, args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::Bench(args) => bench::bench(&cli.global, args).await,
            Command::Elect(args) => elect::elect(&cli.global, args).await,
            Command::Leader(args) => elect::leader(&cli.global, args).await,
        }
    });
    match result {
        Ok(status) => ExitCode::from(status),
        Err(error) => {
            // One line: causes from some clients span several lines.
            let line = error
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!("leasehold: {line}");
            error.exit_code()
        }
    }
}
