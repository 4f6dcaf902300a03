//! `Tensor::grouped_matmul` on meshes of 1–8 simulated ranks, tokens cut along their rows over
//! one or two mesh axes, against naive f64 loops written here (uneven token counts, ids outside
//! the experts' range); errors for a cut contracting axis, ids placed apart, experts cut.

use nx::{launch_with, LaunchOptions, Placement, PlacementSpec, Tensor};

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

fn x(i: &[usize]) -> f64 {
    ((i[0] * 7 + i[1] * 3) % 13) as f64 * 0.25 - 1.5
}

fn w(i: &[usize]) -> f64 {
    ((i[0] * 5 + i[1] * 11 + i[2] * 2) % 17) as f64 * 0.125 - 1.0
}

fn id(t: usize, g: usize) -> i64 {
    (t * 5 % (g + 2)) as i64 - 1
}

#[test]
fn grouped_matmul_matches_naive_loops_on_every_mesh() {
    for (dp, ep) in [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (4, 2), (8, 1)] {
        let (t, k, n, g) = (3 * dp * ep + 1, 6, 5, 3);
        launch_with(&opts(dp * ep), |ctx| {
            let mesh = ctx.mesh(&[("dp", dp), ("ep", ep)])?;
            let p = |s: &str| -> nx::Result<Placement<'_>> { Ok(s.parse::<PlacementSpec>()?.over(&mesh)?) };
            let rows = p("mesh(0:dp.ep)")?;
            let tokens = Tensor::<f64>::from_fn(ctx, &[t, k], &rows, x)?;
            let ids = Tensor::<i64>::from_fn(ctx, &[t], &rows, |i| id(i[0], g))?;
            let experts = Tensor::<f64>::from_fn(ctx, &[g, k, n], &rows.uncut(), w)?;
            let out = tokens.grouped_matmul(&experts, &ids)?;
            assert!(out.placement().equal(&rows));
            let got = out.full()?.to_vec()?;
            for r in 0..t {
                for c in 0..n {
                    let e = id(r, g);
                    let want = if (0..g as i64).contains(&e) {
                        (0..k).map(|q| x(&[r, q]) * w(&[e as usize, q, c])).sum::<f64>()
                    } else {
                        0.0
                    };
                    // the values are multiples of 1/32 with small sums: exact in f64
                    assert_eq!(got[r * n + c], want, "row {r} col {c} on {dp}×{ep}");
                }
            }
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn grouped_matmul_errors_name_the_placement() {
    launch_with(&opts(2), |ctx| {
        let rows = Placement::split(0, ctx.devices())?;
        let cols = Placement::split(1, ctx.devices())?;
        let whole = Placement::on(ctx.devices());
        let tokens = Tensor::<f32>::from_fn(ctx, &[4, 2], &rows, |i| i[0] as f32)?;
        let ids = Tensor::<i64>::from_fn(ctx, &[4], &rows, |_| 0)?;
        let experts = Tensor::<f32>::from_fn(ctx, &[2, 2, 3], &whole, |_| 1.0)?;
        let msg = |r: nx::Result<Tensor<'_, f32>>| r.err().map(|e| e.to_string()).unwrap_or_default();
        // contracting axis cut
        let by_cols = Tensor::<f32>::from_fn(ctx, &[4, 2], &cols, |_| 1.0)?;
        assert!(msg(by_cols.grouped_matmul(&experts, &ids)).contains("axis 1 is cut"), "cut k");
        // ids placed otherwise
        let ids_whole = Tensor::<i64>::from_fn(ctx, &[4], &whole, |_| 0)?;
        assert!(msg(tokens.grouped_matmul(&experts, &ids_whole)).contains("place them alike"));
        // experts cut over the ranks
        let cut_experts = Tensor::<f32>::from_fn(ctx, &[2, 2, 3], &rows, |_| 1.0)?;
        assert!(msg(tokens.grouped_matmul(&cut_experts, &ids)).contains("needs them whole"));
        // shapes
        let short = Tensor::<i64>::from_fn(ctx, &[3], &whole, |_| 0)?;
        assert!(msg(tokens.grouped_matmul(&experts, &short)).contains("nx::Tensor::grouped_matmul"));
        let bad = Tensor::<f32>::from_fn(ctx, &[2, 3, 3], &whole, |_| 1.0)?;
        assert!(msg(tokens.grouped_matmul(&bad, &ids)).contains("[g, k, n]"));
        Ok(())
    })
    .unwrap();
}
