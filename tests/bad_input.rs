//! The library's public constructors given bad input: each answers an error naming the function
//! and the values, never a panic, a hang or a huge allocation.

use nx::{launch_with, LaunchOptions, MeshSpec, PlacementSpec, Tensor};
use proptest::prelude::*;

fn opts(n: usize) -> LaunchOptions {
    LaunchOptions { devices: Some(n), ..Default::default() }
}

#[test]
fn mesh_specs_refuse_bad_axes_naming_them() {
    let cases: &[(&[(&str, usize)], &str)] = &[
        (&[("x", 0)], "nx_mesh::MeshSpec::new"),
        (&[("x", usize::MAX), ("y", 2)], "multiply past the most devices a mesh spans"),
        (&[("x", 1 << 32), ("y", 1 << 32)], "multiply past the most devices a mesh spans"),
        (&[("x", (1 << 20) + 1)], "1048576"),
        (&[("", 2)], "nx_mesh::MeshSpec::new"),
        (&[("x", 2), ("x", 2)], "nx_mesh::MeshSpec::new"),
    ];
    for (axes, want) in cases {
        let e = MeshSpec::new(axes).unwrap_err().to_string();
        assert!(e.contains(want), "{axes:?}: {e}");
    }
    for text in ["x=100000000000", "x=0", "x", "=3", "x=2,,y=2", "x=-1", "x=2,y=18446744073709551615", "x=1e3"] {
        let e = text.parse::<MeshSpec>().unwrap_err().to_string();
        assert!(e.starts_with("nx_mesh::MeshSpec"), "{text:?}: {e}");
    }
}

#[test]
fn launches_of_no_ranks_or_too_many_are_refused() {
    for n in [0, 5000, usize::MAX] {
        let e = launch_with(&opts(n), |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("sim::run") && e.contains(&format!("a world of {n} ranks")), "{n}: {e}");
    }
}

#[test]
fn tensors_of_shapes_past_memory_or_counting_are_refused() {
    // [2^31, 2^31] f64 over 2 ranks: each window 2^64 bytes, past what a layout reaches; the
    // others have more elements than 64 bits count
    let cases: [(&[usize], &str); 3] = [
        (&[1 << 31, 1 << 31], "nx_kernels::layout::contiguous_strides: shape ["),
        (&[usize::MAX, 3], "shape [18446744073709551615, 3] has more elements than 64 bits count"),
        (&[1 << 40, 1 << 40, 1 << 40], "has more elements than 64 bits count"),
    ];
    let out = launch_with(&opts(2), |ctx| {
        let mut errors = Vec::new();
        for (shape, want) in cases {
            let split = nx::Placement::split(0, ctx.devices())?;
            for e in [
                Tensor::<f64>::zeros(ctx, shape, &split).err(),
                Tensor::<f64>::randn(ctx, shape, &split, 7).err(),
                Tensor::<f32>::rand(ctx, shape, &nx::Placement::on(ctx.devices()), 7).err(),
            ] {
                errors.push((e.map(|e| e.to_string()), want));
            }
        }
        Ok(errors)
    })
    .unwrap();
    for errors in out {
        for (e, want) in errors {
            let e = e.expect("refused");
            assert!(e.contains(want), "{e} lacks {want:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn placement_text_never_panics_and_round_trips(text in "[onsplitdevcemharu()0-9:;., xy]{0,24}") {
        if let Ok(spec) = text.parse::<PlacementSpec>() {
            let again: PlacementSpec = spec.to_string().parse().expect("the printed form reads back");
            prop_assert_eq!(again, spec);
        }
    }

    #[test]
    fn mesh_text_never_panics_and_round_trips(text in "[xyz=0-9,]{0,16}") {
        if let Ok(spec) = text.parse::<MeshSpec>() {
            let again: MeshSpec = spec.to_string().parse().expect("the printed form reads back");
            prop_assert_eq!(again, spec);
        }
    }
}
