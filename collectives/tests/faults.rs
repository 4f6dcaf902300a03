//! Faults injected on the simulated mesh, at every collective kind: the run reports the injected
//! rank as a real run would (its failure or panic as the root cause, its peers released at once;
//! a stall named by its peers' timeout), and never hangs.

use std::time::{Duration, Instant};

use nx_collectives::sim::{self, Fault, FaultKind, SimOptions};
use nx_collectives::{Communicator, Error, ReduceOp, Result};

/// Collective number 1 of each rank (after a barrier) is of kind `k`.
fn body(c: &sim::SimComm, k: usize) -> Result<()> {
    let n = c.size();
    c.barrier()?;
    let mut out = vec![0f32; 3 * n];
    match k {
        0 => c.barrier(),
        1 => c.broadcast(&mut out, 0),
        2 => c.all_reduce(&vec![1f32; 3 * n], &mut out, ReduceOp::Sum),
        3 => c.reduce_scatter(&vec![1f32; 3 * n], &mut out[..3], ReduceOp::Sum),
        4 => c.all_gather(&[1f32; 3], &mut out),
        5 => c.all_to_all(&vec![1f32; 3 * n], &mut out),
        _ => c.split(Some(0), c.rank()).map(|_| ()),
    }?;
    c.barrier()
}

const KINDS: [&str; 7] = ["barrier", "broadcast", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "split"];

fn run(kind: FaultKind, k: usize, timeout: Duration) -> (Result<Vec<()>>, Duration) {
    let opts =
        SimOptions { checked: true, timeout, faults: vec![Fault { rank: 1, at: 1, kind }], ..SimOptions::default() };
    let start = Instant::now();
    let out = sim::run(3, opts, |c| body(&c, k));
    (out, start.elapsed())
}

#[test]
fn a_failure_or_a_panic_is_the_root_cause_and_releases_the_peers_at_once() {
    for (k, what) in KINDS.iter().enumerate() {
        let (out, took) = run(FaultKind::Fail, k, Duration::from_secs(30));
        match out {
            Err(Error::RankFailed { rank: 1, why }) => {
                assert!(why.starts_with("nx fault injection: rank 1 failed at its collective 1, "), "{what}: {why}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(took < Duration::from_secs(5), "{what}: peers released at once, not after the timeout: {took:?}");
        let (out, took) = run(FaultKind::Panic, k, Duration::from_secs(30));
        match out {
            Err(Error::RankFailed { rank: 1, why }) => {
                assert!(
                    why.starts_with("panicked: nx fault injection: rank 1 panicked at its collective 1"),
                    "{what}: {why}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(took < Duration::from_secs(5), "{what}: {took:?}");
    }
}

#[test]
fn a_stall_is_named_by_its_peers_after_their_timeout_and_ends() {
    for (k, what) in KINDS.iter().enumerate() {
        let timeout = Duration::from_millis(300);
        let (out, took) = run(FaultKind::Stall, k, timeout);
        match out {
            Err(Error::RankFailed { rank, why }) => {
                assert_ne!(rank, 1, "{what}: the stalled rank is named by a peer");
                // rank 1, and the other peer where that one gave up first; never the reporter
                let list = why
                    .split_once("for ranks [")
                    .and_then(|(_, rest)| rest.split_once("], which did not arrive"))
                    .map(|(l, _)| l.split(", ").map(|r| r.parse::<usize>().unwrap()).collect::<Vec<_>>());
                let missing = list.unwrap_or_else(|| panic!("{what}: no missing ranks in {why}"));
                assert!(missing.contains(&1) && !missing.contains(&rank), "{what}: rank {rank}: {why}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(took >= timeout && took < timeout + Duration::from_secs(5), "{what}: {took:?}");
    }
}

#[test]
fn a_delay_only_delays() {
    for (k, what) in KINDS.iter().enumerate() {
        let d = Duration::from_millis(60);
        let (out, took) = run(FaultKind::Delay(d), k, Duration::from_secs(30));
        assert!(out.is_ok(), "{what}: {out:?}");
        assert!(took >= d, "{what}: {took:?}");
    }
}

#[test]
fn calls_are_counted_over_every_communicator_sends_and_receives_included() {
    // rank 2's calls: 0 the split, 1 a barrier of its pair {2, 3}, 2 a send, 3 the world's barrier
    for (at, named) in [(1usize, "barrier() over mesh axes pair"), (2, "send(f32, [4])"), (3, "barrier() at faults.rs")]
    {
        let opts = SimOptions {
            checked: true,
            timeout: Duration::from_secs(30),
            faults: vec![Fault { rank: 2, at, kind: FaultKind::Fail }],
            ..SimOptions::default()
        };
        let start = Instant::now();
        let e = sim::run(4, opts, |c| -> Result<()> {
            let pair = c.split_over(Some(c.rank() / 2), c.rank(), &["pair".to_string()])?.expect("a color");
            pair.barrier()?;
            match c.rank() {
                2 => c.send(&[1f32; 4], 3)?,
                3 => c.recv(&mut [0f32; 4], 2)?,
                _ => {}
            }
            c.barrier()
        })
        .unwrap_err();
        match e {
            Error::RankFailed { rank: 2, why } => {
                assert!(why.contains(&format!("at its collective {at}, {named}")), "{at}: {why}")
            }
            other => panic!("{at}: {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{at}: peers released at once");
    }
}

#[test]
fn a_delay_past_the_peers_timeout_ends_in_their_timeout_never_in_a_stale_meeting() {
    // rank 1 arrives long after its peers gave up: they name it; it finds them gone at the
    // all-reduce's first rendezvous (a late arrival never completes a rendezvous with ranks that
    // left — nor then reads and writes their buffers, which may be freed)
    let timeout = Duration::from_millis(200);
    let opts = SimOptions {
        checked: true,
        timeout,
        faults: vec![Fault { rank: 1, at: 1, kind: FaultKind::Delay(Duration::from_millis(700)) }],
        ..SimOptions::default()
    };
    let said = std::sync::Mutex::new(vec![String::new(); 3]);
    let out = sim::run(3, opts, |c| -> Result<()> {
        c.barrier()?;
        let mut out = vec![0f32; 6];
        // every rank notes what its all-reduce answered
        let e = c.all_reduce(&[c.rank() as f32; 6], &mut out, ReduceOp::Sum);
        said.lock().unwrap()[c.rank()] = e.as_ref().map_or_else(|e| e.to_string(), |_| "done".into());
        e
    });
    assert!(matches!(out, Err(Error::RankFailed { rank: 0 | 2, .. })), "{out:?}");
    let said = said.into_inner().unwrap();
    for r in [0, 2] {
        // rank 1, with the other peer where that gave up first: the list names 1
        let list = said[r].split("for ranks [").nth(1).and_then(|t| t.split(']').next()).unwrap_or("");
        let named = list.split(", ").any(|x| x == "1");
        assert!(named && said[r].contains("which did not arrive"), "rank {r}: {}", said[r]);
    }
    // at the first rendezvous, not at the end of a call it went on with
    assert!(said[1].starts_with("nx collective: all_reduce_sum(f32, [6]) at faults.rs"), "rank 1: {}", said[1]);
    assert!(said[1].contains(" on rank 1 cannot finish: rank "), "rank 1: {}", said[1]);
}
