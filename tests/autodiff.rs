//! Gradients through placements: every op at its placements, on meshes of 1–3 axes and 1–8
//! devices with uneven extents, against the one-device gradient and against central finite
//! differences of the one-device loss (in `f64`).

use nx::autodiff::{Tape, Var};
use nx::kernels::Contraction;
use nx::{launch_with, normal, Ctx, LaunchOptions, Mesh, Placement, Result, Tensor};

/// A case: builds its leaves through `mk` (each a normal sample of its seed) and answers a scalar
/// loss.
type Case = for<'d> fn(&Ctx<'d>, &Mesh<'d>, &mut Mk<'d>) -> Result<Var<'d, f64>>;

/// Makes leaves, perturbing one element of one for finite differences.
struct Mk<'d> {
    tape: Tape<'d, f64>,
    perturb: Option<(usize, usize, f64)>,
    leaves: Vec<Var<'d, f64>>,
    positive: bool,
}

impl<'d> Mk<'d> {
    fn leaf(&mut self, ctx: &Ctx<'d>, shape: &[usize], p: &Placement<'d>, seed: u64) -> Result<Var<'d, f64>> {
        let which = self.leaves.len();
        let strides: Vec<usize> = (0..shape.len()).map(|i| shape[i + 1..].iter().product()).collect();
        let (perturb, positive) = (self.perturb, self.positive);
        let t = Tensor::<f64>::from_fn(ctx, shape, p, |i| {
            let flat: usize = i.iter().zip(&strides).map(|(a, b)| a * b).sum();
            let mut v = normal(seed, flat as u64);
            if positive {
                v = v.abs() + 0.5;
            }
            match perturb {
                Some((l, e, d)) if l == which && e == flat => v + d,
                _ => v,
            }
        })?;
        let v = self.tape.leaf(t);
        self.leaves.push(v.clone());
        Ok(v)
    }

    fn constant<T: nx::collectives::Reducible>(&self, t: Tensor<'d, T>) -> Tensor<'d, T> {
        t
    }
}

/// `Σ out ∘ R` for a fixed random `R`, closed, as a scalar with copies.
fn weighted<'d>(ctx: &Ctx<'d>, out: &Var<'d, f64>, seed: u64) -> Result<Var<'d, f64>> {
    let o = if out.placement().is_partial() { out.place(&out.placement().closed())? } else { out.clone() };
    let r = Tensor::<f64>::randn(ctx, o.shape(), o.placement(), seed)?;
    let s = o.mul(&o.tape().constant(r))?.sum_all()?;
    s.place(&Placement::mesh(out.placement().mesh_of(), &[])?)
}

/// `f` as a program over any brand.
fn body<F>(f: F) -> F
where
    F: for<'d> Fn(&Ctx<'d>, &Mesh<'d>, &mut Mk<'d>) -> Result<Var<'d, f64>> + Sync,
{
    f
}

/// Every leaf's gradient (whole) and the loss, on the mesh `axes`.
fn run(
    axes: &[(&str, usize)],
    case: Case,
    perturb: Option<(usize, usize, f64)>,
    positive: bool,
) -> (f64, Vec<Vec<f64>>) {
    run_body(axes, &case, perturb, positive)
}

fn run_body<F>(
    axes: &[(&str, usize)],
    case: &F,
    perturb: Option<(usize, usize, f64)>,
    positive: bool,
) -> (f64, Vec<Vec<f64>>)
where
    F: for<'d> Fn(&Ctx<'d>, &Mesh<'d>, &mut Mk<'d>) -> Result<Var<'d, f64>> + Sync,
{
    let n: usize = axes.iter().map(|a| a.1).product();
    let axes: Vec<(String, usize)> = axes.iter().map(|(a, k)| (a.to_string(), *k)).collect();
    let out = launch_with(&LaunchOptions { devices: Some(n), ..Default::default() }, |ctx| {
        let named: Vec<(&str, usize)> = axes.iter().map(|(a, k)| (a.as_str(), *k)).collect();
        let mesh = ctx.mesh(&named)?;
        let mut mk = Mk { tape: Tape::new(), perturb, leaves: Vec::new(), positive };
        let loss = case(ctx, &mesh, &mut mk)?;
        let l = loss.value().full()?.to_vec()?[0];
        let grads = mk.tape.backward(&loss)?;
        let gs = mk
            .leaves
            .iter()
            .map(|v| match grads.of(v) {
                Some(g) => g.full()?.to_vec().map_err(Into::into),
                None => Ok(vec![0.0; v.shape().iter().product()]),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((l, gs))
    })
    .unwrap();
    for o in &out[1..] {
        assert_eq!(o.1.len(), out[0].1.len());
    }
    out.into_iter().next().unwrap()
}

/// Checks `case`'s gradients on each mesh against one device, and one device's against finite
/// differences.
fn check(case: Case, meshes: &[&[(&str, usize)]], positive: bool) {
    let one: Vec<(&str, usize)> = meshes[0].iter().map(|a| (a.0, 1)).collect();
    let (loss, reference) = run(&one, case, None, positive);
    // finite differences on one device
    let h = 1e-5;
    for (l, g) in reference.iter().enumerate() {
        for (e, &ge) in g.iter().enumerate() {
            let up = run(&one, case, Some((l, e, h)), positive).0;
            let down = run(&one, case, Some((l, e, -h)), positive).0;
            let fd = (up - down) / (2.0 * h);
            assert!(
                (fd - ge).abs() <= 1e-5 * (1.0 + fd.abs()),
                "leaf {l} element {e}: backward {ge}, finite differences {fd}"
            );
        }
    }
    for m in meshes {
        let (l, gs) = run(m, case, None, positive);
        assert!((l - loss).abs() <= 1e-10 * (1.0 + loss.abs()), "{m:?}: loss {l} vs one device {loss}");
        for (i, (a, b)) in gs.iter().zip(&reference).enumerate() {
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() <= 1e-10 * (1.0 + y.abs()), "{m:?}: leaf {i} element {k}: {x} vs one device {y}");
            }
        }
    }
}

const THREE: &[&[(&str, usize)]] = &[&[("a", 2), ("b", 2), ("c", 2)], &[("a", 1), ("b", 2), ("c", 3)]];
/// Meshes of 1–8 devices over 2 and 3 axes (the ops' cases name `a` and `b` only).
const ALL: &[&[(&str, usize)]] = &[
    &[("a", 1), ("b", 1), ("c", 1)],
    &[("a", 2), ("b", 1), ("c", 1)],
    &[("a", 2), ("b", 2), ("c", 1)],
    &[("a", 1), ("b", 3), ("c", 1)],
    &[("a", 2), ("b", 3), ("c", 1)],
    &[("a", 2), ("b", 2), ("c", 2)],
    &[("a", 1), ("b", 2), ("c", 3)],
];

#[test]
fn column_and_row_parallel_matmul() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let x = mk.leaf(ctx, &[5, 7], &Placement::mesh(m, &[(0, &["a"])])?, 1)?;
        let w1 = mk.leaf(ctx, &[7, 5], &Placement::mesh(m, &[(1, &["b"])])?, 2)?;
        let w2 = mk.leaf(ctx, &[5, 3], &Placement::mesh(m, &[(0, &["b"])])?, 3)?;
        let h = x.matmul(&w1)?.tanh()?;
        let y = h.matmul(&w2)?; // a sum over b
        weighted(ctx, &y, 9)
    }
    check(case, ALL, false);
}

#[test]
fn contractions_plus_a_bias_column_and_row_parallel() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let spec = Contraction { batch: vec![], contracting: vec![(2, 0)] };
        let x = mk.leaf(ctx, &[3, 2, 7], &Placement::mesh(m, &[(0, &["a"])])?, 1)?;
        // column-parallel: the bias cut as the columns, the product's initial value
        let w1 = mk.leaf(ctx, &[7, 5], &Placement::mesh(m, &[(1, &["b"])])?, 2)?;
        let b1 = mk.leaf(ctx, &[5], &Placement::mesh(m, &[(0, &["b"])])?, 3)?;
        let h = x.contract_add(&w1, &spec, &b1)?.tanh()?;
        // row-parallel: a sum over b closed, then the replicated bias added
        let w2 = mk.leaf(ctx, &[5, 3], &Placement::mesh(m, &[(0, &["b"])])?, 4)?;
        let b2 = mk.leaf(ctx, &[3], &Placement::mesh(m, &[])?, 5)?;
        let y = h.contract_add(&w2, &spec, &b2)?;
        assert!(!y.placement().is_partial());
        // a bias broadcast over its leading axis too ([1, 3] against [3, 2, 3])
        let b3 = mk.leaf(ctx, &[1, 3], &Placement::mesh(m, &[])?, 6)?;
        let z = h.contract_add(&w2, &spec, &b3)?;
        weighted(ctx, &y, 9)?.add(&weighted(ctx, &z, 10)?)
    }
    check(case, ALL, false);
}

#[test]
fn contractions_of_rank_three_and_batched() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let x = mk.leaf(ctx, &[3, 2, 5], &Placement::mesh(m, &[(0, &["a"])])?, 1)?;
        let w = mk.leaf(ctx, &[5, 4], &Placement::mesh(m, &[(1, &["b"])])?, 2)?;
        let y = x.contract(&w, &Contraction { batch: vec![], contracting: vec![(2, 0)] })?; // [3, 2, 4]
        let q = mk.leaf(ctx, &[3, 4, 2, 3], &Placement::mesh(m, &[(1, &["b"])])?, 3)?;
        let k = mk.leaf(ctx, &[3, 4, 3, 3], &Placement::mesh(m, &[(1, &["b"])])?, 4)?;
        let s = q.contract(&k, &Contraction { batch: vec![(0, 0), (1, 1)], contracting: vec![(3, 2)] })?; // [3,4,2,3]
        let a = weighted(ctx, &y, 7)?;
        let b = weighted(ctx, &s, 8)?;
        a.add(&b)
    }
    check(case, ALL, false);
}

#[test]
fn broadcasts_and_pointwise_functions() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let p = Placement::mesh(m, &[(0, &["a"]), (1, &["b"])])?;
        let x = mk.leaf(ctx, &[5, 4], &p, 1)?;
        let bias = mk.leaf(ctx, &[4], &Placement::mesh(m, &[(0, &["b"])])?, 2)?;
        let row = mk.leaf(ctx, &[1, 4], &Placement::mesh(m, &[(1, &["b"])])?, 3)?;
        let y = x.add(&bias)?.gelu()?.mul(&row)?.silu()?;
        let z = y.exp()?.add_scalar(1.0)?.log()?.sub(&bias)?.scale(0.5)?;
        let d = z.div(&row.square()?.add_scalar(1.0)?.rsqrt()?)?;
        let r = x.relu()?.add(&x.tanh()?)?;
        weighted(ctx, &d.add(&r)?, 5)
    }
    check(case, ALL, false);
}

#[test]
fn sums_means_and_maxima_over_cut_axes() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let x = mk.leaf(ctx, &[7, 5], &Placement::mesh(m, &[(0, &["a"]), (1, &["b"])])?, 1)?;
        let s = x.sum(0)?; // a sum over a
        let mu = x.mean(1)?; // over b
        let mx = x.max(1)?; // maxima gathered over b
        let mx0 = x.max(0)?;
        // exact ties: every maximum twice (on two ranks where b cuts the axis), its gradient
        // split between the copies
        let rows = x.place(&Placement::mesh(m, &[(0, &["a"])])?)?;
        let tied = rows.concat(&[&rows], 1)?.place(&Placement::mesh(m, &[(0, &["a"]), (1, &["b"])])?)?.max(1)?;
        let t = weighted(ctx, &s, 2)?.add(&weighted(ctx, &mu, 3)?)?;
        t.add(&weighted(ctx, &mx, 4)?)?.add(&weighted(ctx, &mx0, 5)?)?.add(&weighted(ctx, &tied, 6)?)
    }
    check(case, ALL, false);
}

#[test]
fn reshape_permute_narrow_concat() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        // [b, t, c] with c cut over b: heads cut as the columns (b divides the 6 heads)
        let x = mk.leaf(ctx, &[3, 2, 12], &Placement::mesh(m, &[(0, &["a"]), (2, &["b"])])?, 1)?;
        let h = x.reshape(&[3, 2, 6, 2])?.permute(&[0, 2, 1, 3])?; // [b, h, t, d]
        let y = h.tanh()?.permute(&[0, 2, 1, 3])?.reshape(&[3, 2, 12])?;
        let n = x.place(&Placement::mesh(m, &[(0, &["a"])])?)?.narrow(2, 1, 4)?;
        let c = n.concat(&[&n.scale(2.0)?], 1)?;
        weighted(ctx, &y, 2)?.add(&weighted(ctx, &c, 3)?)
    }
    check(case, ALL, false);
}

#[test]
fn softmax_layer_norm_and_rms_norm() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let rows = Placement::mesh(m, &[(0, &["a"])])?;
        let x = mk.leaf(ctx, &[5, 6], &rows, 1)?;
        let g = mk.leaf(ctx, &[6], &Placement::mesh(m, &[])?, 2)?;
        let b = mk.leaf(ctx, &[6], &Placement::mesh(m, &[])?, 3)?;
        let y = x.layer_norm(&g, &b, 1e-5)?;
        let z = x.rms_norm(&g, 1e-6)?.softmax(1)?;
        let w = x.log_softmax(1)?;
        weighted(ctx, &y, 4)?.add(&weighted(ctx, &z, 5)?)?.add(&weighted(ctx, &w, 6)?)
    }
    check(case, ALL, false);
}

#[test]
fn embeddings_replicated_and_vocabulary_parallel_with_cross_entropy() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let ids_p = Placement::mesh(m, &[(0, &["a"])])?;
        let ids = mk.constant(Tensor::<i64>::from_fn(ctx, &[5, 3], &ids_p, |i| ((i[0] * 5 + i[1] * 3) % 7) as i64)?);
        let table = mk.leaf(ctx, &[7, 4], &Placement::mesh(m, &[])?, 1)?;
        let vocab = mk.leaf(ctx, &[7, 4], &Placement::mesh(m, &[(0, &["b"])])?, 2)?;
        let e1 = table.embedding(&ids)?; // [5, 3, 4] cut over a
        let e2 = vocab.embedding(&ids)?.place(&Placement::mesh(m, &[(0, &["a"])])?)?; // a sum over b, closed
        let h = e1.add(&e2)?;
        // a head cut over b: logits [5, 3, 7] with classes over b
        let w = mk.leaf(ctx, &[4, 7], &Placement::mesh(m, &[(1, &["b"])])?, 3)?;
        let logits = h.contract(&w, &Contraction { batch: vec![], contracting: vec![(2, 0)] })?;
        // some labels ignored (−1)
        let labels = Tensor::<i64>::from_fn(ctx, &[5, 3], &ids_p, |i| ((i[0] + 2 * i[1]) % 8) as i64 - 1)?;
        logits.cross_entropy(&labels)
    }
    check(case, ALL, false);
}

#[test]
fn attention_with_heads_cut() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let p = Placement::mesh(m, &[(0, &["a"]), (1, &["b"])])?;
        let q = mk.leaf(ctx, &[2, 3, 4, 2], &p, 1)?;
        let k = mk.leaf(ctx, &[2, 3, 4, 2], &p, 2)?;
        let v = mk.leaf(ctx, &[2, 3, 4, 2], &p, 3)?;
        let o = q.attention(&k, &v, true)?;
        let o2 = q.attention(&k, &v, false)?;
        weighted(ctx, &o, 4)?.add(&weighted(ctx, &o2, 5)?)
    }
    check(case, ALL, false);
}

#[test]
fn attention_in_flash_attentions_layout_with_heads_cut() {
    // [b, t, h, d]: the heads (axis 2) cut, rows whole; uneven heads over the mesh's b
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let p = Placement::mesh(m, &[(0, &["a"]), (2, &["b"])])?;
        let q = mk.leaf(ctx, &[2, 5, 3, 2], &p, 1)?;
        let k = mk.leaf(ctx, &[2, 5, 3, 2], &p, 2)?;
        let v = mk.leaf(ctx, &[2, 5, 3, 2], &p, 3)?;
        let o = q.attention_thd(&k, &v, true)?;
        let o2 = q.attention_thd(&k, &v, false)?;
        weighted(ctx, &o, 4)?.add(&weighted(ctx, &o2, 5)?)
    }
    check(case, ALL, false);
}

#[test]
fn attention_of_packed_queries_keys_and_values_with_heads_cut() {
    // [b, t, 3, h, d]: q, k, v entries of axis 2; the heads (axis 3) cut unevenly over b
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let p = Placement::mesh(m, &[(0, &["a"]), (3, &["b"])])?;
        let x = mk.leaf(ctx, &[2, 5, 3, 3, 2], &p, 1)?;
        let o = x.attention_qkv(true)?;
        let o2 = x.attention_qkv(false)?;
        // a second use of the packed value: its gradients accumulate onto the fused backward's
        weighted(ctx, &o, 4)?.add(&weighted(ctx, &o2, 5)?)?.add(&weighted(ctx, &x.tanh()?, 6)?)
    }
    check(case, ALL, false);
}

#[test]
fn transitions_on_three_axes() {
    fn case<'d>(ctx: &Ctx<'d>, m: &Mesh<'d>, mk: &mut Mk<'d>) -> Result<Var<'d, f64>> {
        let x = mk.leaf(ctx, &[5, 3, 4], &Placement::mesh(m, &[(0, &["a"]), (2, &["c"])])?, 1)?;
        let y = x.place(&Placement::mesh(m, &[(1, &["a", "b"])])?)?.tanh()?; // all-to-all
        let z = y.place(&Placement::partial(m, &["c"], &[(1, &["a", "b"])])?)?; // zero fill into a sum
        let w = z.scale(3.0)?.place(&Placement::mesh(m, &[(0, &["c"])])?)?; // closed again
        let u = w.place(&Placement::mesh(m, &[])?)?.exp()?; // all-gather
        weighted(ctx, &u, 2)?.add(&weighted(ctx, &z, 3)?)
    }
    check(case, THREE, false);
}

/// A random program's op: what it does to the running value `v` `[m, n]`.
#[derive(Debug, Clone, Copy)]
enum Step {
    Tanh,
    Scale,
    /// `v + w` for a fresh leaf at `v`'s placement.
    AddLeaf,
    /// `v ∘ w` likewise.
    MulLeaf,
    /// `v` placed at placement number `k` (of `placements`).
    Place(usize),
    /// `v · w` for a leaf `[n, n]` cut to match, closed after.
    Matmul,
    /// `softmax` over axis 1, placed whole first.
    Softmax,
    /// The sum over axis 0 broadcast back (`v − mean₀ v`).
    Center,
}

/// Placement number `k` of a mesh with axes `a`, `b` (and maybe `c`) for a value of rank 2.
fn placements<'d>(m: &Mesh<'d>, k: usize) -> Result<Placement<'d>> {
    let three = m.axes().len() == 3;
    Ok(match k % if three { 7 } else { 6 } {
        0 => Placement::mesh(m, &[])?,
        1 => Placement::mesh(m, &[(0, &["a"])])?,
        2 => Placement::mesh(m, &[(1, &["b"])])?,
        3 => Placement::mesh(m, &[(0, &["a"]), (1, &["b"])])?,
        4 => Placement::partial(m, &["a"], &[(1, &["b"])])?,
        5 => Placement::mesh(m, &[(0, &["b", "a"])])?,
        _ => Placement::partial(m, &["c"], &[(0, &["a", "b"])])?,
    })
}

fn program<'d>(
    steps: &[Step],
    shape: (usize, usize),
    start: usize,
    ctx: &Ctx<'d>,
    m: &Mesh<'d>,
    mk: &mut Mk<'d>,
) -> Result<Var<'d, f64>> {
    let (rows, cols) = shape;
    let mut v = mk.leaf(ctx, &[rows, cols], &placements(m, start)?.closed(), 1)?;
    for (i, s) in steps.iter().enumerate() {
        let seed = 10 + i as u64;
        let closed =
            |v: Var<'d, f64>| if v.placement().is_partial() { v.place(&v.placement().closed()) } else { Ok(v) };
        v = match *s {
            Step::Tanh => closed(v)?.tanh()?,
            Step::Scale => v.scale(-1.5)?,
            Step::AddLeaf => {
                let w = mk.leaf(ctx, &[rows, cols], &v.placement().clone(), seed)?;
                v.add(&w)?
            }
            Step::MulLeaf => {
                let v = closed(v)?;
                let w = mk.leaf(ctx, &[rows, cols], &v.placement().clone(), seed)?;
                v.mul(&w)?
            }
            Step::Place(k) => v.place(&placements(m, k)?)?,
            Step::Matmul => {
                let v = closed(v)?.place(&Placement::mesh(m, &[(0, &["a"]), (1, &["b"])])?)?;
                let w = mk.leaf(ctx, &[cols, cols], &Placement::mesh(m, &[(0, &["b"])])?, seed)?;
                let y = v.matmul(&w)?;
                y.place(&y.placement().closed())?
            }
            Step::Softmax => closed(v)?.place(&Placement::mesh(m, &[(0, &["a"])])?)?.softmax(1)?,
            Step::Center => {
                let v = closed(v)?;
                let mu = v.mean(0)?;
                let mu = mu.place(&mu.placement().closed())?.reshape(&[1, cols])?;
                let mu = mu.place(&Placement::mesh(m, &[])?)?;
                v.place(&Placement::mesh(m, &[(0, &["a"])])?)?.sub(&mu)?
            }
        };
    }
    weighted(ctx, &v, 99)
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 64, ..Default::default() })]

    /// Random programs of random ops, placements and transitions: the gradients on a mesh of 1–3
    /// axes are the one-device program's.
    #[test]
    fn random_programs_have_the_one_device_gradients(
        mesh in 0usize..5,
        rows in 1usize..6,
        cols in 1usize..6,
        start in 0usize..7,
        ops in proptest::collection::vec((0u8..8, 0usize..7), 1..6),
    ) {
        let steps: Vec<Step> = ops.iter().map(|&(o, k)| match o {
            0 => Step::Tanh, 1 => Step::Scale, 2 => Step::AddLeaf, 3 => Step::MulLeaf,
            4 => Step::Place(k), 5 => Step::Matmul, 6 => Step::Softmax, _ => Step::Center,
        }).collect();
        let meshes: [&[(&str, usize)]; 5] = [
            &[("a", 1), ("b", 1)], &[("a", 2), ("b", 1)], &[("a", 2), ("b", 2)], &[("a", 1), ("b", 3)], &[("a", 2), ("b", 2), ("c", 2)],
        ];
        let axes = meshes[mesh];
        let one: Vec<(&str, usize)> = axes.iter().map(|a| (a.0, 1)).collect();
        let body = body(|ctx, m, mk| program(&steps, (rows, cols), start, ctx, m, mk));
        let (l1, g1) = run_body(&one, &body, None, false);
        let (l, g) = run_body(axes, &body, None, false);
        proptest::prop_assert!((l - l1).abs() <= 1e-10 * (1.0 + l1.abs()), "loss {} vs {}", l, l1);
        for (a, b) in g.iter().zip(&g1) {
            for (x, y) in a.iter().zip(b) {
                proptest::prop_assert!((x - y).abs() <= 1e-10 * (1.0 + y.abs()), "{:?}: gradient {} vs one device {}", steps, x, y);
            }
        }
    }
}

/// Each transition's backward is its dual: the adjoint of the identity (the gradient's global
/// value is the cotangent's), issuing the dual collective; on meshes of one, two and three axes,
/// 3–8 devices (5 rows over 8 devices: ranks with empty windows).
#[test]
fn transitions_backward_are_their_duals() {
    use nx::testing::Op;
    let data = [Op::AllReduce, Op::ReduceScatter, Op::AllGather, Op::AllToAll, Op::Broadcast, Op::Send, Op::Recv];
    let meshes: &[&[(&str, usize)]] =
        &[&[("a", 3)], &[("a", 2), ("b", 2)], &[("a", 2), ("b", 1), ("c", 3)], &[("a", 2), ("b", 4)]];
    for axes in meshes {
        let n: usize = axes.iter().map(|a| a.1).product();
        let out = launch_with(&LaunchOptions { devices: Some(n), ..Default::default() }, |ctx| {
            let m = ctx.mesh(axes)?;
            let all: Vec<&str> = axes.iter().map(|a| a.0).collect();
            let copies = Placement::mesh(&m, &[])?;
            let rows = Placement::mesh(&m, &[(0, &all)])?;
            let cols = Placement::mesh(&m, &[(1, &all)])?;
            let sum = Placement::partial(&m, &all, &[])?;
            // (from, to, cotangent's placement, the backward's collective or None)
            let cases: Vec<(&Placement<'_>, &Placement<'_>, &Placement<'_>, Option<Op>)> = vec![
                (&rows, &copies, &sum, Some(Op::ReduceScatter)), // all-gather ↔ reduce-scatter
                (&rows, &copies, &copies, None),                 // all-gather ↔ local slice
                (&copies, &rows, &rows, Some(Op::AllGather)),    // local slice ↔ all-gather
                (&rows, &cols, &cols, Some(Op::AllToAll)),       // all-to-all ↔ all-to-all back
                (&sum, &copies, &copies, None),                  // closing a sum ↔ nothing
                (&sum, &rows, &rows, Some(Op::AllGather)), // reduce-scatter ↔ all-gather (each term's gradient is the whole)
                (&copies, &sum, &copies, None),            // zero fill ↔ nothing
            ];
            let mut report = Vec::new();
            for (i, (from, to, gp, dual)) in cases.into_iter().enumerate() {
                let tape = Tape::new();
                let x = tape.leaf(Tensor::<f64>::randn(ctx, &[5, 7], from, 1)?);
                let y = x.place(to)?;
                let g = Tensor::<f64>::randn(ctx, &[5, 7], gp, 2 + i as u64)?;
                let (grads, log) = ctx.record(|| tape.backward_with(&y, g.clone()))?;
                let gx = grads.of(&x).expect("a gradient").clone();
                // the adjoint of the identity: the same global value as the cotangent
                let (a, b) = (gx.full()?.to_vec()?, g.full()?.to_vec()?);
                let same = a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= 1e-12 * (1.0 + q.abs()));
                let issued: Vec<Op> = data.iter().copied().filter(|&o| log.count_any(o) > 0).collect();
                report.push((i, same, issued, dual, gx.placement().closed().equal(&from.closed())));
            }
            Ok(report)
        })
        .unwrap();
        for (i, same, issued, dual, at) in &out[0] {
            assert!(same, "{axes:?} case {i}: the gradient is not the cotangent's value");
            assert!(at, "{axes:?} case {i}: the gradient is not at closed(from)");
            match dual {
                Some(op) => assert_eq!(issued, &vec![*op], "{axes:?} case {i}"),
                None => assert!(issued.is_empty(), "{axes:?} case {i}: issued {issued:?}"),
            }
        }
    }
}
