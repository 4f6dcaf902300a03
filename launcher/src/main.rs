//! The `nx` command: show where a placement lays a value, and plan a change of placement.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod bench;
mod bench_coll;
mod bench_index;
mod bench_mem;
mod bench_numeric;
mod ckpt;
mod info;
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
    /// Start N ranks of a program, connect them through a store, and supervise them.
    Run(RunArgs),
    /// The backends compiled in, the libraries found, the devices a program gets, the host's facts.
    Info(info::InfoArgs),
    /// Checkpoints: list one, or merge it into one safetensors file.
    #[command(subcommand)]
    Ckpt(ckpt::Ckpt),
    /// The wrapper `nx run --mpi` starts each rank through (under mpirun).
    #[command(hide = true)]
    Rank(nx_launcher::rank::RankArgs),
}

/// Arguments of `nx run`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Ranks to start (1 to 4096).
    #[arg(short = 'n', long = "np", default_value_t = 1, value_parser = args::ranks, allow_hyphen_values = true)]
    n: usize,
    /// Hosts and their slots, as `a:4,b:4`: through mpirun, or (--direct) through --agent.
    #[arg(long)]
    hosts: Option<String>,
    /// The remote shell that starts direct ranks on --hosts, called as `AGENT HOST COMMAND`
    /// (default: $NX_AGENT, else ssh); it must pass signals on (a cluster's agent does).
    #[arg(long)]
    agent: Option<String>,
    /// Start the ranks through mpirun (the default where mpirun is found).
    #[arg(long, conflicts_with = "direct")]
    mpi: bool,
    /// Start the ranks as child processes of nx run (for ranks that need no MPI).
    #[arg(long)]
    direct: bool,
    /// Stop every rank after this many seconds.
    #[arg(long, value_parser = args::timeout, allow_hyphen_values = true)]
    timeout: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL when stopping ranks.
    #[arg(long, default_value_t = 5.0, value_parser = args::grace, allow_hyphen_values = true)]
    grace: f64,
    /// Prefix every output line with its rank, as `[3] `.
    #[arg(long)]
    tag_output: bool,
    /// Where the rendezvous store listens (default: 127.0.0.1:0, or with --hosts this host's
    /// address that the first host reaches).
    #[arg(long)]
    store_addr: Option<String>,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true)]
    program: Vec<String>,
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

fn run_cmd(a: RunArgs) -> ExitCode {
    use nx_launcher::run::{run, Mode, Options};
    let mode = if a.direct {
        Mode::Direct
    } else if a.mpi || on_path("mpirun") {
        Mode::Mpi
    } else {
        Mode::Direct
    };
    if mode == Mode::Mpi && !on_path("mpirun") {
        eprintln!("nx: --mpi needs mpirun on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)");
        return ExitCode::from(2);
    }
    let hosts = match a.hosts.as_deref().map(nx_launcher::run::parse_hosts).transpose() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("nx: {e}");
            return ExitCode::from(2);
        }
    };
    let store_addr = a.store_addr.unwrap_or_else(|| match &hosts {
        Some(h) => {
            let at = nx_launcher::run::address_toward(&h[0].0);
            if at.starts_with("127.") {
                eprintln!(
                    "nx: no route to --hosts' first host {} but the loopback: the store listens on {at}, which other hosts cannot reach (give --store-addr)",
                    h[0].0
                );
            }
            format!("{at}:0")
        }
        None => "127.0.0.1:0".to_string(),
    });
    let code = run(Options {
        n: a.n,
        mode,
        hosts: a.hosts,
        agent: a.agent.or_else(|| std::env::var("NX_AGENT").ok()).unwrap_or_else(|| "ssh".to_string()),
        timeout: a.timeout.map(std::time::Duration::from_secs_f64),
        grace: std::time::Duration::from_secs_f64(a.grace),
        tag_output: a.tag_output,
        store_addr,
        program: a.program,
    });
    ExitCode::from(code.clamp(0, 255) as u8)
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
            // One clear line naming the problem (a first line ending in ':' takes the next one,
            // which names what is missing).
            let text = e.render().to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let mut first = lines.next().unwrap_or("error: bad arguments").trim_start_matches("error: ").to_string();
            if first.ends_with(':') {
                if let Some(next) = lines.next() {
                    first = format!("{first} {next}");
                }
            }
            eprintln!("nx: {first}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Run(a) => return run_cmd(a),
        Command::Rank(a) => return ExitCode::from(nx_launcher::rank::rank(&a).clamp(0, 255) as u8),
        Command::Info(a) => info::info(&a),
        Command::Show(a) => show::show(&a),
        Command::Plan(a) => show::plan(&a),
        Command::Ckpt(c) => ckpt::ckpt(&c).map_err(Into::into),
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
