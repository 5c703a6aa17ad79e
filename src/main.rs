//! The `sluice` command line: parses arguments, sets up tracing, and calls
//! one library function per subcommand.

use clap::Parser;
use sluice::cli::Cli;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, sluice::cli::Command::Dispatcher(_)) {
        sluice::malloc_arenas::cap_for_dispatcher();
    }
    sluice::cli::init_tracing(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sluice::cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", sluice::cli::one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
