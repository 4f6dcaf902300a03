//! `nx-rank-helper MODE [ARG]`: a stand-in rank for the tests of `nx run`. It reads its rank from
//! `NX_RANK` (or Open MPI's variable), writes its pid (and its child's) into `$NX_TEST_DIR`, and
//! then, by mode: `ok`, `child` (leaves a `sleep` child in its group, exits 0), `panic R`,
//! `sigkill R` (rank R kills itself with SIGKILL), `hang [R]` (every rank, or rank R alone while
//! the others exit 0), `lines K`, `store` (meets the others through the store, twice at one
//! barrier), `env` (prints the rank's variables).

use std::time::Duration;

fn rank() -> usize {
    ["NX_RANK", "OMPI_COMM_WORLD_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn note_pid(pid: u32) {
    if let Ok(dir) = std::env::var("NX_TEST_DIR") {
        let _ = std::fs::write(std::path::Path::new(&dir).join(format!("pid-{pid}")), format!("{}", rank()));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, arg) =
        (args.first().map(String::as_str).unwrap_or("ok"), args.get(1).and_then(|a| a.parse::<usize>().ok()));
    let r = rank();
    note_pid(std::process::id());
    let long = || std::thread::sleep(Duration::from_secs(60));
    match mode {
        "ok" => println!("rank {r} ok"),
        "child" => {
            // deliberately left running: nx run must end it with the rank's process group
            #[allow(clippy::zombie_processes)]
            let c = std::process::Command::new("sleep").arg("60").spawn().expect("sleep starts");
            note_pid(c.id());
            println!("rank {r} left a child");
        }
        "panic" => {
            if Some(r) == arg {
                std::thread::sleep(Duration::from_millis(200));
                panic!("boom from rank {r}");
            }
            long();
        }
        "sigkill" => {
            if Some(r) == arg {
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: raising a signal on this process has no memory-safety preconditions.
                unsafe {
                    libc::raise(libc::SIGKILL);
                }
            }
            long();
        }
        "hang" => match arg {
            Some(h) if h != r => println!("rank {r} ok"),
            _ => long(),
        },
        "env" => {
            let v = |k: &str| std::env::var(k).unwrap_or_else(|_| "unset".into());
            println!(
                "rank {r}: NX_RANK={} NX_WORLD_SIZE={} NX_LOCAL_RANK={} NX_LOCAL_WORLD_SIZE={}",
                v("NX_RANK"),
                v("NX_WORLD_SIZE"),
                v("NX_LOCAL_RANK"),
                v("NX_LOCAL_WORLD_SIZE")
            );
        }
        "lines" => {
            for i in 0..arg.unwrap_or(100) {
                println!("rank {r} line {i} {}", "x".repeat(200));
            }
        }
        "store" => {
            let n: usize = std::env::var("NX_WORLD_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
            let mut s = nx::store::StoreClient::from_env(Duration::from_secs(10)).expect("the store");
            s.set(&format!("rank/{r}"), &format!("hello-{r}")).expect("set");
            s.add("count", 1).expect("add");
            let peer = s.wait(&format!("rank/{}", (r + 1) % n), Duration::from_secs(10)).expect("wait");
            s.barrier("all", n, Duration::from_secs(10)).expect("barrier");
            // the same barrier again: it is reusable
            s.barrier("all", n, Duration::from_secs(10)).expect("a second barrier");
            println!("rank {r} met {peer}");
        }
        other => {
            eprintln!("nx-rank-helper: unknown mode {other:?}");
            std::process::exit(2);
        }
    }
}
