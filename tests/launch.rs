//! Where a simulated launch runs its ranks' bodies: a one-device body on a worker of the host
//! kernels' pool, the ranks of a larger mesh each on its own thread as the first thread of a
//! pool of its own (its share of the cores, at least one): kernels split from there with no
//! hand-off into a pool and back, and the ranks' and pools' threads never outnumber the cores.

use nx::{launch_with, LaunchOptions, Placement, Tensor};

#[test]
fn each_rank_runs_its_kernels_from_its_own_thread_on_its_share_of_the_cores() {
    let cores = nx::kernels::Host::new().threads();
    for n in [1, 2, 3, 4, 8] {
        let opts = LaunchOptions { devices: Some(n), ..Default::default() };
        let seen = launch_with(&opts, |ctx| {
            let me = std::thread::current().id();
            let host = ctx.host();
            // a call into the library runs on this thread (the pool's worker it is)
            let stays = host.install(|| std::thread::current().id()) == me;
            // a product on every rank: [[0, 1, 2], [3, 4, 5], …] · [[1, 0], [0, 1], [1, 1]]
            let on = Placement::on(ctx.devices());
            let x = Tensor::<f32>::from_fn(ctx, &[5, 3], &on, |i| (i[0] * 3 + i[1]) as f32)?;
            let w = Tensor::<f32>::from_fn(ctx, &[3, 2], &on, |i| f32::from(i[0] == 2 || i[0] == i[1]))?;
            let y = x.matmul(&w)?.full()?.to_vec()?;
            Ok((rayon::current_thread_index().is_some(), stays, host.threads(), y[2..4].to_vec()))
        })
        .unwrap();
        let want = if n == 1 { cores } else { (cores / n).max(1) };
        // row 1: [3 + 5, 4 + 5]
        assert_eq!(seen, vec![(true, true, want, vec![8.0, 9.0]); n], "{n} devices on {cores} cores");
    }
}
