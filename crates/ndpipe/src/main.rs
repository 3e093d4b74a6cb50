//! `ndpipe`: the photo store that labels and learns near the data.
//!
//! One binary, one subcommand per role or tool. The libraries do the work; this crate parses
//! flags and the configuration file, boots the servers, and turns errors into messages and exit
//! codes.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// jemalloc returns the memory of freed decode buffers to the system; glibc's malloc keeps it
/// (see the `jemalloc` feature in Cargo.toml).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_tracing();
    warn_about_secrets_in_arguments();
    end_process_on_panic();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NDPIPE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Warns when the bearer token was given as `--token`: the process list shows it to every user
/// of the machine. `--token-file` and `NDPIPE_TOKEN` do not.
fn warn_about_secrets_in_arguments() {
    let on_command_line = std::env::args_os().skip(1).any(|arg| {
        arg.to_str()
            .is_some_and(|a| a == "--token" || a.starts_with("--token="))
    });
    if on_command_line {
        tracing::warn!(
            "the bearer token was given as --token, which every user of this machine can read in \
             the process list; give it with --token-file FILE or the NDPIPE_TOKEN variable instead"
        );
    }
}

/// A panic in any thread (a request handler, the store writer, the labeller, a job) logs where
/// and why with a backtrace, then aborts the process: a server never limps on half alive, and
/// the supervisor restarts it into crash recovery, which is what the store is built for.
fn end_process_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(thread = name, %location, %message, "panic: ndpipe {} stops", env!("CARGO_PKG_VERSION"));
        eprintln!(
            "ndpipe {} panicked in thread {name} at {location}: {message}\n{}",
            env!("CARGO_PKG_VERSION"),
            std::backtrace::Backtrace::force_capture()
        );
        std::process::abort();
    }));
}
