//! A tour of meshes and placements: builds them, prints where each device's window lies (as
//! `nx show` draws it) and checks a few windows by hand. Runs on the simulated mesh, or under
//! `mpirun` (each rank prints its own window).

use std::process::ExitCode;

use nx::{Placement, PlacementSpec};

fn main() -> ExitCode {
    let out = nx::launch_with(&nx::LaunchOptions { devices: Some(6), ..Default::default() }, |ctx| {
        let mesh = ctx.mesh(&[("dp", 2), ("tp", 3)])?;
        if ctx.rank() == 0 {
            println!("{} ranks on {} devices, work {}", ctx.size(), ctx.device().kind.name(), ctx.rig().timing());
        }
        let shape = [7, 5];
        let specs =
            ["on", "device(4)", "split(0)", "mesh(0:dp.tp)", "mesh(0:dp, 1:tp)", "mesh(1:tp)", "partial(tp; 0:dp)"];
        for text in specs {
            let p = text.parse::<PlacementSpec>()?.over(&mesh)?;
            let w = p.window(&shape, ctx.index())?;
            let t = p.term(ctx.index())?;
            if ctx.rank() == 0 {
                println!("{p:#}");
                for d in 0..ctx.size() {
                    println!(
                        "  {} holds {:?}{}",
                        ctx.devices().as_slice()[d],
                        p.window(&shape, d)?,
                        p.term(d)?.map_or(String::new(), |t| format!(", term {t}"))
                    );
                }
            }
            let _ = (w, t);
        }
        // hand-checked: 7 rows over 6 devices are 2,1,1,1,1,1; the device at (1, 2) is number 5
        let p = Placement::mesh(&mesh, &[(0, &["dp", "tp"])])?;
        let lens: Vec<usize> =
            (0..6).map(|d| p.window(&shape, d).map(|w| w.unwrap()[0].len())).collect::<Result<_, _>>()?;
        if lens != [2, 1, 1, 1, 1, 1] || mesh.index_of(&[1, 2]).map_err(nx::placement::Error::from)? != 5 {
            return Err(nx::Error::Invalid { func: "placements", why: format!("unexpected windows {lens:?}") });
        }
        Ok(())
    });
    match out {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("placements: {e}");
            ExitCode::FAILURE
        }
    }
}
