//! One matmul chain through every placement transition: each step prints its plan (steps, groups,
//! bytes per device) and checks the value against a single-device computation. Runs on the
//! simulated mesh (4 ranks, dp=2,tp=2) or under `mpirun -n 4`.

use std::process::ExitCode;

use nx::{Placement, Tensor};

fn main() -> ExitCode {
    let out = nx::launch_with(&nx::LaunchOptions { devices: Some(4), ..Default::default() }, |ctx| {
        let mesh = ctx.mesh(&[("dp", 2), ("tp", 2)])?;
        if ctx.rank() == 0 {
            println!("{} ranks on {} devices, work {}", ctx.size(), ctx.device().kind.name(), ctx.rig().timing());
        }
        let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<nx::PlacementSpec>()?.over(&mesh)?) };
        let (m, k, n) = (9, 7, 5); // uneven on purpose
        let f = |i: &[usize]| (i[0] * 3 + i[1]) as f64 * 0.5;
        let g = |i: &[usize]| (i[0] + 2 * i[1]) as f64 - 3.0;
        let x = Tensor::<f64>::from_fn(ctx, &[m, k], &p("mesh(0:dp, 1:tp)")?, f)?;
        let w = Tensor::<f64>::from_fn(ctx, &[k, n], &p("mesh(0:tp)")?, g)?;
        let y = x.matmul(&w)?; // contracting axis cut over tp on both sides: a sum over tp
        let want: Vec<f64> = (0..m * n).map(|q| (0..k).map(|r| f(&[q / n, r]) * g(&[r, q % n])).sum()).collect();
        let mut cur = y;
        for to in [
            "mesh(0:dp, 1:tp)",
            "mesh(0:dp.tp)",
            "mesh(1:dp.tp)",
            "mesh(1:tp)",
            "device(2)",
            "on",
            "partial(dp)",
            "mesh()",
        ] {
            let target = p(to)?;
            let plan = cur.plan(&target)?;
            if ctx.rank() == 0 {
                println!("{} -> {to}\n{plan}\n", cur.placement());
            }
            cur = cur.place(&target)?;
            let got = cur.full()?.to_vec()?;
            if got.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-9) {
                return Err(nx::Error::Invalid { func: "tensor_parallel", why: format!("wrong value after {to}") });
            }
        }
        Ok(())
    });
    match out {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tensor_parallel: {e}");
            ExitCode::FAILURE
        }
    }
}
