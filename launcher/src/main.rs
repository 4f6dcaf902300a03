//! The `nx` command: show where a placement lays a value, and plan a change of placement.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod bench_coll;
mod show;

/// nx: a distributed SPMD tensor framework.
#[derive(Parser, Debug)]
#[command(name = "nx", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Draw which device holds which block of a value.
    Show(show::ShowArgs),
    /// Plan a change of placement: steps, groups and bytes per device.
    Plan(show::PlanArgs),
    /// Benchmarks, each against a physical limit or a peer measured in the same run.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Host kernels: maps, sums and matmuls against the copy bandwidth and numpy.
    Kernels(bench::KernelArgs),
    /// Collectives: all-reduce, all-gather, reduce-scatter, all-to-all against the memory floor.
    Collectives(bench_coll::CollectiveArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One clear line naming the problem.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: bad arguments");
            eprintln!("nx: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Show(a) => show::show(&a),
        Command::Plan(a) => show::plan(&a),
        Command::Bench(Bench::Kernels(a)) => bench::kernels(&a),
        Command::Bench(Bench::Collectives(a)) => bench_coll::collectives(&a),
    };
    match result {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nx: {e}");
            ExitCode::FAILURE
        }
    }
}
