//! Where a simulated launch runs its ranks' bodies: a one-device body on a worker of the host
//! kernels' pool (kernels split from there with no hand-off), the ranks of a larger mesh on
//! threads of their own (they wait on each other in collectives, which pool workers must not).

use nx::{launch_with, LaunchOptions};

#[test]
fn a_one_device_body_runs_on_a_pool_worker_and_a_meshs_ranks_on_their_own_threads() {
    for n in [1, 2, 3] {
        let opts = LaunchOptions { devices: Some(n), ..Default::default() };
        let on_worker = launch_with(&opts, |_| Ok(rayon::current_thread_index().is_some())).unwrap();
        assert_eq!(on_worker, vec![n == 1; n], "{n} devices");
    }
}
