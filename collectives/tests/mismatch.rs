//! The mismatch suite on the simulated backend, checked and unchecked: every rank refuses calls
//! whose lengths or counts differ, no byte outside a buffer changes, and the ranks stay in step.

use std::time::Duration;

use nx_collectives::sim::{self, SimOptions};
use nx_collectives::{mismatch, Communicator};

#[test]
fn lengths_that_differ_are_refused_on_every_rank_checked_or_not() {
    for checked in [false, true] {
        for n in [2, 3, 5] {
            let opts = SimOptions { checked, timeout: Duration::from_secs(30), ..Default::default() };
            let lines = sim::run(n, opts, |c| mismatch::suite(&c)).unwrap();
            for (r, lines) in lines.iter().enumerate() {
                let ops = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "ops", "barrier"];
                let p2p = (r == 0 || r == n - 1).then_some("send/recv");
                for op in ops.into_iter().chain(p2p) {
                    let want = format!("rank {r}: {op} refused (guards intact): nx collective mismatch: rank ");
                    assert!(lines.iter().any(|l| l.starts_with(&want)), "checked={checked}, {n} ranks: {lines:#?}");
                }
                let sum = (0..n).sum::<usize>();
                assert!(lines.contains(&format!("rank {r}: in step, sum {sum}")), "{lines:#?}");
                assert!(lines.iter().all(|l| !l.contains("NOT REFUSED") && !l.contains("BROKEN")), "{lines:#?}");
            }
        }
    }
}

#[test]
fn counts_that_overflow_are_refused_before_any_byte_moves() {
    // counts whose sum wraps to the buffers' lengths: refused on each rank by its own check
    let out = sim::run(2, SimOptions { checked: false, timeout: Duration::from_secs(30), ..Default::default() }, |c| {
        let counts = [usize::MAX, 2];
        let mut recv = [0f32; 2];
        let a = c.reduce_scatter_v(&[0f32; 1], &mut recv[..counts[1].min(2)], &counts, nx_collectives::ReduceOp::Sum);
        let b = c.all_gather_v(&[0f32; 2], &mut [0f32; 1], &counts);
        let sc = [usize::MAX, 3];
        let d = c.all_to_all_v(&[0f32; 2], &sc, &mut [0f32; 2], &[1, 1]);
        Ok::<_, nx_collectives::Error>([a, b, d].map(|e| e.map_err(|e| e.to_string())))
    })
    .unwrap();
    for (r, answers) in out.iter().enumerate() {
        for e in answers {
            let e = e.as_ref().expect_err("refused");
            assert!(e.starts_with("nx_collectives::") && e.contains("counts"), "rank {r}: {e}");
        }
    }
}
