//! The `sluice` command line: parses arguments, sets up tracing, and calls
//! one library function per subcommand.

use clap::Parser;
use sluice::cli::Cli;

/// mimalloc, for every process the binary runs. glibc's malloc cost a dispatcher a lock shared
/// by its threads (one arena, to keep its memory from fragmenting) and a trim of the whole heap
/// every few seconds (up to 55 ms with every allocation waiting); mimalloc's per-thread heaps
/// need neither and give freed pages back on their own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
