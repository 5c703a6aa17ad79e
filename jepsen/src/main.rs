//! `sluice-jepsen`: parses arguments, sets up tracing, runs one command; the exit code is the
//! verdict (0 valid, 1 invalid, 2 unknown or harness failure).

use clap::Parser;
use sluice_jepsen::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("harness failure: tokio runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => sluice_jepsen::runner::main(args).await,
            Command::SelfTest(args) => sluice_jepsen::self_test::main(args).await,
            Command::Check(args) => sluice_jepsen::runner::check_main(args),
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    std::process::exit(code);
}
