use super::*;
use crate::sim;
use crate::Communicator;
use nx_kernels::Simd;

/// Segments for `n` ranks in one heap allocation (world ranks from `world0`): their bases.
fn segments(n: usize, world0: usize) -> (std::sync::Arc<Vec<u64>>, Vec<usize>) {
    let mut mem = vec![0u64; SEGMENT / 8 * n + 8];
    let base = (mem.as_mut_ptr() as usize).next_multiple_of(64);
    let bases: Vec<usize> = (0..n).map(|q| base + q * SEGMENT).collect();
    for (q, &b) in bases.iter().enumerate() {
        // SAFETY: inside `mem`, 64-byte aligned, not yet shared.
        unsafe { Node::prepare(b as *mut u8, world0 + q) };
    }
    (std::sync::Arc::new(mem), bases)
}

/// A node over `bases` for host rank `me`, keeping `mem` alive; `direct`: data by
/// cross-memory attach (here the process reads itself), else through the halves.
fn node(mem: &std::sync::Arc<Vec<u64>>, bases: &[usize], me: usize, direct: bool) -> Rc<Node> {
    // SAFETY: `mem` holds the prepared segments and is kept by the node.
    let mut node = unsafe { Node::new(bases.to_vec(), me, Box::new(mem.clone())) };
    if direct {
        assert!(node.can_read_peers(), "a process may read itself");
        node.go_direct();
    }
    Rc::new(node)
}

/// Runs `body` on `n` threads standing for the ranks of one host, each with its node, for
/// both ways of moving data.
fn run<R: Send>(n: usize, body: impl Fn(Rc<Node>) -> R + Sync) -> Vec<R> {
    let halves = run_with(n, false, &body);
    let direct = run_with(n, true, &body);
    halves.into_iter().chain(direct).collect()
}

fn run_with<R: Send>(n: usize, direct: bool, body: &(impl Fn(Rc<Node>) -> R + Sync)) -> Vec<R> {
    let (mem, bases) = segments(n, 100);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (mem, bases) = (&mem, &bases);
                s.spawn(move || body(node(mem, bases, r, direct)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// The whole host as one communicator.
fn world(node: Rc<Node>) -> Shm {
    let n = node.bases.len();
    Shm::new(node, (0..n).collect(), Duration::from_secs(20), Simd::detected())
}

fn values(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7 + r * 13) % 97) as f32 * 0.37 - 11.0 + r as f32 * 1e-3).collect()
}

#[test]
fn matches_sim_bit_for_bit() {
    // lengths around the round size (f32: HALF/4 = 262,144 elements a half)
    for n in [1, 2, 3, 4] {
        for len in [0, 1, 5, 262_143, 262_145, 600_001] {
            let counts: Vec<usize> = (0..n).map(|j| len / n + usize::from(j < len % n)).collect();
            let ours = run(n, |node| {
                let s = world(node);
                let send = values(s.rank, len);
                let mut ar = vec![0f32; len];
                s.all_reduce(&send, &mut ar, ReduceOp::Sum).unwrap();
                let mut rs = vec![0f32; counts[s.rank]];
                s.reduce_scatter_v(&send, &mut rs, &counts, ReduceOp::Sum).unwrap();
                let mine = values(s.rank, counts[s.rank]);
                let mut ag = vec![0f32; len];
                s.all_gather_v(&mine, &mut ag, &counts).unwrap();
                // rank r sends counts[q] to q, receives counts[r] from each
                let sc = counts.clone();
                let rc = vec![counts[s.rank]; n];
                let total: usize = sc.iter().sum();
                let mut out = vec![0f32; rc.iter().sum()];
                s.all_to_all_v(&send[..total], &sc, &mut out, &rc).unwrap();
                let mut b = if s.rank == 0 { values(9, len) } else { vec![0f32; len] };
                s.broadcast(&mut b, 0).unwrap();
                s.barrier().unwrap();
                (ar, rs, ag, out, b)
            });
            let theirs = sim::run(n, sim::SimOptions::default(), |c| {
                let send = values(c.rank(), len);
                let mut ar = vec![0f32; len];
                c.all_reduce(&send, &mut ar, ReduceOp::Sum)?;
                let mut rs = vec![0f32; counts[c.rank()]];
                c.reduce_scatter_v(&send, &mut rs, &counts, ReduceOp::Sum)?;
                let mine = values(c.rank(), counts[c.rank()]);
                let mut ag = vec![0f32; len];
                c.all_gather_v(&mine, &mut ag, &counts)?;
                let sc = counts.clone();
                let rc = vec![counts[c.rank()]; n];
                let total: usize = sc.iter().sum();
                let mut out = vec![0f32; rc.iter().sum()];
                c.all_to_all_v(&send[..total], &sc, &mut out, &rc)?;
                let mut b = if c.rank() == 0 { values(9, len) } else { vec![0f32; len] };
                c.broadcast(&mut b, 0)?;
                Ok::<_, Error>((ar, rs, ag, out, b))
            })
            .unwrap();
            for (r, (a, b)) in ours.iter().zip(theirs.iter().cycle()).enumerate() {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.0), bits(&b.0), "all_reduce n={n} len={len} rank {r}");
                assert_eq!(bits(&a.1), bits(&b.1), "reduce_scatter n={n} len={len} rank {r}");
                assert_eq!(bits(&a.2), bits(&b.2), "all_gather n={n} len={len} rank {r}");
                assert_eq!(bits(&a.3), bits(&b.3), "all_to_all n={n} len={len} rank {r}");
                assert_eq!(bits(&a.4), bits(&b.4), "broadcast n={n} len={len} rank {r}");
            }
        }
    }
}

#[test]
fn uneven_all_to_all_agrees_on_rounds() {
    // only rank 0 -> rank 1 carries more than one round; the others learn it from the slots
    let n = 3;
    let big = 3 * (HALF / 8 / n) + 5;
    let sends = |r: usize| -> Vec<usize> { (0..n).map(|d| if r == 0 && d == 1 { big } else { r + d }).collect() };
    let out = run(n, |node| {
        let s = world(node);
        let sc = sends(s.rank);
        let rc: Vec<usize> = (0..n).map(|q| sends(q)[s.rank]).collect();
        let send: Vec<f64> = (0..sc.iter().sum::<usize>()).map(|i| (s.rank * 1_000_000 + i) as f64).collect();
        let mut recv = vec![0f64; rc.iter().sum()];
        // twice, so that the slots alternate
        s.all_to_all_v(&send, &sc, &mut recv, &rc).unwrap();
        s.all_to_all_v(&send, &sc, &mut recv, &rc).unwrap();
        recv
    });
    for (k, recv) in out.iter().enumerate() {
        let r = k % n;
        let mut at = 0;
        for q in 0..n {
            let sc = sends(q);
            let start: usize = sc[..r].iter().sum();
            for i in 0..sc[r] {
                assert_eq!(recv[at], (q * 1_000_000 + start + i) as f64, "rank {r} from {q} element {i}");
                at += 1;
            }
        }
    }
}

#[test]
fn communicators_over_subsets_share_the_segments() {
    // 4 host ranks: the whole host, the pairs {0,1} {2,3}, the pairs {0,2} {1,3}, interleaved;
    // sums in rank order, checked against a plain fold in that order
    let len = 3 * (HALF / 4) + 17;
    let sum = |ranks: &[usize]| -> Vec<f32> {
        let mut acc = values(ranks[0], len);
        for &r in &ranks[1..] {
            acc.iter_mut().zip(values(r, len)).for_each(|(a, x)| *a += x);
        }
        acc
    };
    let outs = run(4, |node| {
        let me = node.me;
        let all = Shm::new(node.clone(), vec![0, 1, 2, 3], Duration::from_secs(20), Simd::detected());
        let near = Shm::new(
            node.clone(),
            if me < 2 { vec![0, 1] } else { vec![2, 3] },
            Duration::from_secs(20),
            Simd::detected(),
        );
        let far = Shm::new(
            node,
            if me % 2 == 0 { vec![0, 2] } else { vec![1, 3] },
            Duration::from_secs(20),
            Simd::detected(),
        );
        let send = values(me, len);
        let mut got = Vec::new();
        for s in [&near, &all, &far, &near, &far, &all] {
            let mut out = vec![0f32; len];
            s.all_reduce(&send, &mut out, ReduceOp::Sum).unwrap();
            got.push(out);
        }
        got
    });
    for (k, got) in outs.iter().enumerate() {
        let me = k % 4;
        let near: Vec<usize> = if me < 2 { vec![0, 1] } else { vec![2, 3] };
        let far: Vec<usize> = if me % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
        let want = [sum(&near), sum(&[0, 1, 2, 3]), sum(&far)];
        for (k, g) in got.iter().enumerate() {
            let w = &want[[0, 1, 2, 0, 2, 1][k]];
            assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {me} call {k}");
        }
    }
}

#[test]
fn a_sleeping_rank_is_woken_when_its_peer_arrives() {
    // syncs sleep at once, for up to a minute a sleep: only a wake-up ends one early
    let (mem, bases) = segments(2, 0);
    let late = Duration::from_millis(300);
    // one clock for both ranks, started before either: rank 1's three sleeps all come after it
    let start = Instant::now();
    let took = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (mem, bases) = (&mem, &bases);
                s.spawn(move || {
                    // SAFETY: as `node`'s.
                    let mut n = unsafe { Node::new(bases.to_vec(), r, Box::new(mem.clone())) };
                    n.waits = (Duration::ZERO, Duration::from_secs(60));
                    let s = Shm::new(Rc::new(n), vec![0, 1], Duration::from_secs(120), Simd::detected());
                    for k in 0..3 {
                        if r == 1 {
                            std::thread::sleep(late);
                        }
                        s.barrier().unwrap_or_else(|e| panic!("barrier {k}: {e}"));
                    }
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect::<Vec<_>>()
    });
    // rank 0 slept through three barriers of rank 1's lateness, woken each time
    assert!(took[0] >= 3 * late && took[0] < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_missing_rank_is_named_after_the_timeout() {
    let (mem, bases) = segments(2, 40);
    // rank 1 never makes its view (it "skipped" the call)
    let s = Shm::new(node(&mem, &bases, 0, false), vec![0, 1], Duration::from_millis(200), Simd::detected());
    let e = s.all_reduce(&[1f32; 10], &mut [0f32; 10], ReduceOp::Sum).unwrap_err();
    match e {
        Error::Timeout { rank, missing, ref call, .. } => {
            assert_eq!((rank, missing, call.as_str()), (40, vec![41], "all_reduce"));
        }
        other => panic!("expected a timeout, got {other}"),
    }
}
