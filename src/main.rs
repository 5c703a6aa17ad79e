//! The `sluice` command line: parses arguments, sets up tracing, and calls
//! one library function per subcommand.

use clap::Parser;
use sluice::cli::{Cli, Command};

/// mimalloc, for every process the binary runs. glibc's malloc cost a dispatcher a lock shared
/// by its threads (one arena, to keep its memory from fragmenting) and a trim of the whole heap
/// every few seconds (up to 55 ms with every allocation waiting); mimalloc's per-thread heaps
/// need neither and give freed pages back on their own.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's index of its `purge_delay` option (the same in its v2 and v3 headers).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A dispatcher gives memory it freed back to the OS at once. By default mimalloc (v3, as built
/// here) purges freed memory only a second later, and then only when the allocator next runs
/// its purges: after 100,000 short jobs the leader held 53-60 MiB resident; with immediate
/// purging, 38-43 MiB, with the same CPU under 1,000 workers and 10,000 clients.
fn purge_freed_memory_at_once() {
    // SAFETY: sets one integer option; called before the runtime starts any other thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Command::Dispatcher(args) = &cli.command {
        purge_freed_memory_at_once();
        if let Some(threads) = args.threads {
            runtime.worker_threads(threads.into());
        }
    }
    sluice::cli::init_tracing(&cli);
    let runtime = match runtime.enable_all().build() {
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
