//! Attention with a score program (`Kernels::attention_scored`) against a naive softmax in f64
//! written here, the program's visibility and score applied pair by pair: ALiBi biases from a
//! load and the coordinates, sliding windows, soft-capping, a mask load; grouped query heads,
//! causal masks, lengths, paged tables with holes, rows with no visible key, f32 and f64
//! accumulators within the library's bound, 1, 2 and 8 threads, refusals.

use nx_kernels::host::HostOptions;
use nx_kernels::prog::{Prog, UnOp};
use nx_kernels::{Answer, Array, Attention, Dtype, Element, Host, Kernels, Kv, Operand, Scores};
use nx_mesh::Device;
use proptest::prelude::*;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn val(k: usize, salt: usize) -> f64 {
    (((k * 7919 + salt * 104_729) % 10007) as f64 / 10007.0 - 0.5) * 2.0
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// score − slope[h]·(i − t), slopes a load of [hq, 1, 1]
    Alibi,
    /// visible where t ≤ i and i − t < 3
    Window,
    /// 2·tanh(score / 2)
    Softcap,
    /// visible where a [tq, tk] boolean load holds
    Mask,
}

struct Case {
    lead: usize,
    hq: usize,
    hk: usize,
    tq: usize,
    tk: usize,
    dk: usize,
    dv: usize,
    causal: Option<i64>,
}

fn slope(h: usize) -> f64 {
    0.5f64.powi(h as i32 + 1)
}

fn mask(i: usize, t: usize) -> bool {
    !(i * 3 + t * 5).is_multiple_of(7)
}

/// The program's (visible, score) of pair (h, i, t) with score `s`, in f64.
fn naive_prog(kind: Kind, h: usize, i: usize, t: usize, s: f64) -> (bool, f64) {
    match kind {
        Kind::Alibi => (true, s - slope(h) * (i as f64 - t as f64)),
        Kind::Window => (t <= i && i - t < 3, s),
        Kind::Softcap => (true, 2.0 * (s / 2.0).tanh()),
        Kind::Mask => (mask(i, t), s),
    }
}

/// The program over the accumulator `acc`, and its loads after the score.
fn program(kind: Kind, acc: Dtype, c: &Case) -> (Prog, Vec<Array<f32>>, Vec<Array<bool>>) {
    let mut loads = vec![acc];
    match kind {
        Kind::Alibi => loads.push(Dtype::F32),
        Kind::Mask => loads.push(Dtype::Bool),
        _ => {}
    }
    let mut p = Prog::new(&loads);
    let score = p.load(0);
    // the loop is [lead, hq, tq, tk]: coord(2) the query row, coord(3) the key
    let (i, t) = (p.coord(2), p.coord(3));
    let yes = p.boolean(true);
    let (mut f32s, mut bools) = (Vec::new(), Vec::new());
    let (vis, out) = match kind {
        Kind::Alibi => {
            let s = p.load(1);
            let d = p.sub(i, t);
            let d = p.cast(d, acc);
            let s = p.cast(s, acc);
            let b = p.mul(s, d);
            f32s.push(Array::from_fn(DEV, &[c.hq, 1, 1], |x| slope(x[0]) as f32).unwrap());
            (yes, p.sub(score, b))
        }
        Kind::Window => {
            let seen = p.compare(nx_kernels::prog::CmpOp::Le, t, i);
            let d = p.sub(i, t);
            let three = p.int(3);
            let near = p.compare(nx_kernels::prog::CmpOp::Lt, d, three);
            let both = p.min(seen, near);
            (both, score)
        }
        Kind::Softcap => {
            let two = p.float(2.0);
            let x = p.div(score, two);
            let x = p.unary(UnOp::Tanh, x);
            (yes, p.mul(two, x))
        }
        Kind::Mask => {
            bools.push(Array::from_fn(DEV, &[c.tq, c.tk], |x| mask(x[0], x[1])).unwrap());
            (p.load(1), score)
        }
    };
    p.output(vis);
    p.output(out);
    (p, f32s, bools)
}

/// The naive (o, lse, A, B) of `c` with `kind`'s program, keys visible where `vis(b, t)`: A the
/// greatest s·Σ|q·k| of a row, B the greatest |score' − s·q·k| the program adds.
#[allow(clippy::type_complexity)]
fn naive(
    c: &Case,
    kind: Kind,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    scale: f64,
    vis: &dyn Fn(usize, usize) -> bool,
) -> (Vec<f64>, Vec<f64>, Vec<(f64, f64)>) {
    let (mut o, mut lse, mut ab) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..c.lead {
        for h in 0..c.hq {
            let g = h / (c.hq / c.hk);
            for i in 0..c.tq {
                let qrow = &q[((b * c.hq + h) * c.tq + i) * c.dk..][..c.dk];
                let (mut scores, mut a, mut bb) = (Vec::new(), 0.0f64, 0.0f64);
                for t in 0..c.tk {
                    if !vis(b, t) || c.causal.is_some_and(|off| t as i64 > i as i64 + off) {
                        continue;
                    }
                    let krow = &k[((b * c.hk + g) * c.tk + t) * c.dk..][..c.dk];
                    let dot: f64 = qrow.iter().zip(krow).map(|(x, y)| x * y).sum();
                    let (seen, s) = naive_prog(kind, h, i, t, scale * dot);
                    if !seen {
                        continue;
                    }
                    a = a.max(scale * qrow.iter().zip(krow).map(|(x, y)| (x * y).abs()).sum::<f64>());
                    bb = bb.max((s - scale * dot).abs());
                    scores.push((t, s));
                }
                ab.push((a, bb));
                if scores.is_empty() {
                    lse.push(f64::NEG_INFINITY);
                    o.extend(std::iter::repeat_n(0.0, c.dv));
                    continue;
                }
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let l = m + scores.iter().map(|s| (s.1 - m).exp()).sum::<f64>().ln();
                lse.push(l);
                for d in 0..c.dv {
                    o.push(
                        scores.iter().map(|&(t, s)| (s - l).exp() * v[((b * c.hk + g) * c.tk + t) * c.dv + d]).sum(),
                    );
                }
            }
        }
    }
    (o, lse, ab)
}

/// `o` and `lse` against the naive values within the library's bound for an accumulator of unit
/// roundoff `u` (ε = u·((dk + 2)·A + tk + 8 + |L|)), widened by the program's own roundings
/// (4·B·u, B what it adds to a score, and 8·u·|L| for its functions).
fn check(c: &Case, got_o: &[f64], got_l: &[f64], want: &(Vec<f64>, Vec<f64>, Vec<(f64, f64)>), u: f64) {
    let (o, l, ab) = want;
    for r in 0..l.len() {
        if l[r] == f64::NEG_INFINITY {
            assert_eq!(got_l[r], f64::NEG_INFINITY, "row {r}: no visible key");
            assert!(got_o[r * c.dv..(r + 1) * c.dv].iter().all(|x| x.to_bits() == 0), "row {r}: o = +0");
            continue;
        }
        let (a, b) = ab[r];
        let eps = u * ((c.dk + 2) as f64 * a + c.tk as f64 + 8.0 + 9.0 * l[r].abs() + 4.0 * b);
        assert!((got_l[r] - l[r]).abs() <= eps, "row {r}: lse {} vs {} (ε {eps})", got_l[r], l[r]);
        for d in 0..c.dv {
            let (g, w) = (got_o[r * c.dv + d], o[r * c.dv + d]);
            let bound = 2.0 * eps + (c.tk + 8) as f64 * u;
            assert!((g - w).abs() <= bound, "row {r}, {d}: o {g} vs {w} (bound {bound})");
        }
    }
}

fn arr<T: Element>(shape: &[usize], xs: &[f64], f: impl Fn(f64) -> T) -> Array<T> {
    Array::from_vec(DEV, shape, xs.iter().map(|&x| f(x)).collect()).unwrap()
}

fn to_f64<T: Element>(a: &Array<T>) -> Vec<f64> {
    a.to_vec()
        .unwrap()
        .into_iter()
        .map(|x| match x.to_value() {
            nx_kernels::Value::Float(f) => f,
            other => panic!("a float result, not {other:?}"),
        })
        .collect()
}

/// Runs the scored attention of `c` on `h`; answers (o, lse) as f64.
#[allow(clippy::too_many_arguments)]
fn run(
    h: &Host,
    c: &Case,
    kind: Kind,
    acc: Dtype,
    qa: &Array<f32>,
    kv: Kv<'_>,
    lengths: Option<&dyn Operand>,
) -> (Answer, Vec<f64>, Vec<f64>) {
    let (p, f32s, bools) = program(kind, acc, c);
    let mut loads: Vec<&dyn Operand> = f32s.iter().map(|a| a as &dyn Operand).collect();
    loads.extend(bools.iter().map(|a| a as &dyn Operand));
    let spec = Attention { scale: 1.0 / (c.dk as f64).sqrt(), causal: c.causal, acc };
    let o = Array::<f32>::zeros(DEV, &[c.lead, c.hq, c.tq, c.dv]).unwrap();
    let scores = Scores { prog: &p, loads: &loads };
    if acc == Dtype::F64 {
        let lse = Array::<f64>::zeros(DEV, &[c.lead, c.hq, c.tq]).unwrap();
        let a = h.attention_scored(&spec, scores, &o, &lse, qa, kv, lengths);
        (a, to_f64(&o), to_f64(&lse))
    } else {
        let lse = Array::<f32>::zeros(DEV, &[c.lead, c.hq, c.tq]).unwrap();
        let a = h.attention_scored(&spec, scores, &o, &lse, qa, kv, lengths);
        (a, to_f64(&o), to_f64(&lse))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn scored_attention_matches_the_naive_softmax(
        lead in 1usize..=2, hk in 1usize..=2, group in 1usize..=3, tq in 0usize..=40, tk in 0usize..=150,
        dk in 1usize..=6, dv in 1usize..=4, causal in prop::option::of(-2i64..=2), with_len in any::<bool>(),
        f64acc in any::<bool>(), kind in prop::sample::select(vec![Kind::Alibi, Kind::Window, Kind::Softcap, Kind::Mask]),
    ) {
        let hq = hk * group;
        let c = Case { lead, hq, hk, tq, tk, dk, dv, causal };
        let lengths = with_len.then(|| (0..lead).map(|b| (b * 37 + 5) % (tk + 1)).collect::<Vec<_>>());
        let q: Vec<f64> = (0..lead * hq * tq * dk).map(|k| val(k, 1) as f32 as f64).collect();
        let k: Vec<f64> = (0..lead * hk * tk * dk).map(|x| val(x, 2) as f32 as f64).collect();
        let v: Vec<f64> = (0..lead * hk * tk * dv).map(|x| val(x, 3) as f32 as f64).collect();
        let (qa, ka, va) = (arr(&[lead, hq, tq, dk], &q, |x| x as f32), arr(&[lead, hk, tk, dk], &k, |x| x as f32), arr(&[lead, hk, tk, dv], &v, |x| x as f32));
        let len_a = lengths.as_ref().map(|l| Array::from_vec(DEV, &[lead], l.iter().map(|&x| x as i64).collect()).unwrap());
        let acc = if f64acc { Dtype::F64 } else { Dtype::F32 };
        let (answer, o, l) = run(&Host::new(), &c, kind, acc, &qa, Kv::Dense { k: &ka, v: &va }, len_a.as_ref().map(|a| a as &dyn Operand));
        prop_assert_eq!(answer, Answer::Done);
        let want = naive(&c, kind, &q, &k, &v, 1.0 / (dk as f64).sqrt(), &|b, t| lengths.as_ref().is_none_or(|l| t < l[b]));
        let u = if f64acc { f64::EPSILON / 2.0 } else { f64::from(f32::EPSILON) / 2.0 };
        // o is stored as f32: its rounding adds u32·|o| ≤ u32·max|v|
        check(&c, &o, &l, &want, u + f64::from(f32::EPSILON));
    }
}

#[test]
fn paged_scored_attention_reads_through_holes_on_any_thread_count() {
    // pools of 6 pages of 4 keys; lead 0 reads pages 2, hole, 0, 5; lead 1 pages 1, 3, hole, 4
    let (pages, page, hk, hq, tq, dk, dv) = (6, 4, 2, 4, 9, 5, 3);
    let table: Vec<i64> = vec![2, -1, 0, 5, 1, 3, 7, 4];
    let c = Case { lead: 2, hq, hk, tq, tk: 16, dk, dv, causal: Some(7) };
    let kp: Vec<f64> = (0..pages * hk * page * dk).map(|x| val(x, 5) as f32 as f64).collect();
    let vp: Vec<f64> = (0..pages * hk * page * dv).map(|x| val(x, 6) as f32 as f64).collect();
    let q: Vec<f64> = (0..2 * hq * tq * dk).map(|x| val(x, 7) as f32 as f64).collect();
    // the dense keys the table gives (zeros at holes, never visible)
    let (mut k, mut v) = (vec![0.0; 2 * hk * 16 * dk], vec![0.0; 2 * hk * 16 * dv]);
    for b in 0..2 {
        for g in 0..hk {
            for t in 0..16 {
                let e = table[b * 4 + t / page];
                if !(0..pages as i64).contains(&e) {
                    continue;
                }
                let e = e as usize;
                for d in 0..dk {
                    k[((b * hk + g) * 16 + t) * dk + d] = kp[((e * hk + g) * page + t % page) * dk + d];
                }
                for d in 0..dv {
                    v[((b * hk + g) * 16 + t) * dv + d] = vp[((e * hk + g) * page + t % page) * dv + d];
                }
            }
        }
    }
    let qa = arr(&[2, hq, tq, dk], &q, |x| x as f32);
    let (ka, va) = (arr(&[pages, hk, page, dk], &kp, |x| x as f32), arr(&[pages, hk, page, dv], &vp, |x| x as f32));
    let ta = Array::from_vec(DEV, &[2, 4], table.clone()).unwrap();
    let lens = Array::from_vec(DEV, &[2], vec![14i64, 16]).unwrap();
    let visible = |b: usize, t: usize| {
        let e = table[b * 4 + t / page];
        (0..pages as i64).contains(&e) && t < [14, 16][b]
    };
    for kind in [Kind::Alibi, Kind::Window, Kind::Mask] {
        let want = naive(&c, kind, &q, &k, &v, 1.0 / (dk as f64).sqrt(), &visible);
        let mut bits = Vec::new();
        for t in [1, 2, 8] {
            let h = Host::with_options(HostOptions { threads: Some(t), ..HostOptions::default() }).unwrap();
            let kv = Kv::Paged { k: &ka, v: &va, table: &ta };
            let (answer, o, l) = run(&h, &c, kind, Dtype::F32, &qa, kv, Some(&lens));
            assert_eq!(answer, Answer::Done);
            check(&c, &o, &l, &want, 2.0 * f64::from(f32::EPSILON));
            bits.push((
                o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                l.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            ));
        }
        assert_eq!(bits[0], bits[1], "{kind:?}: 1 and 2 threads");
        assert_eq!(bits[0], bits[2], "{kind:?}: 1 and 8 threads");
        if matches!(kind, Kind::Window) {
            // row 0 sees keys 0 only where visible: lead 0's key 0 lies on page 2 (visible)
            assert!(want.1[0].is_finite());
        }
    }
}

/// A library with attention but no score programs: the trait's default declines them.
struct Plain(Host);

impl Kernels for Plain {
    fn name(&self) -> &'static str {
        "plain"
    }
    fn map(&self, p: &Prog, s: &[usize], d: &[&dyn Operand], l: &[&dyn Operand]) -> Answer {
        self.0.map(p, s, d, l)
    }
    fn reduce(
        &self,
        p: &Prog,
        s: &[usize],
        a: &[usize],
        r: &[nx_kernels::Reduction],
        d: &[&dyn Operand],
        l: &[&dyn Operand],
    ) -> Answer {
        self.0.reduce(p, s, a, r, d, l)
    }
    fn contract(
        &self,
        spec: &nx_kernels::Contraction,
        d: &dyn Operand,
        a: &dyn Operand,
        b: &dyn Operand,
        i: Option<&dyn Operand>,
    ) -> Answer {
        self.0.contract(spec, d, a, b, i)
    }
}

#[test]
fn score_programs_that_do_not_fit_are_refused() {
    let c = Case { lead: 1, hq: 2, hk: 1, tq: 3, tk: 4, dk: 2, dv: 2, causal: None };
    let qa = Array::<f32>::zeros(DEV, &[1, 2, 3, 2]).unwrap();
    let (ka, va) = (Array::<f32>::zeros(DEV, &[1, 1, 4, 2]).unwrap(), Array::<f32>::zeros(DEV, &[1, 1, 4, 2]).unwrap());
    let o = Array::<f32>::zeros(DEV, &[1, 2, 3, 2]).unwrap();
    let lse = Array::<f32>::zeros(DEV, &[1, 2, 3]).unwrap();
    let spec = Attention { scale: 1.0, causal: None, acc: Dtype::F32 };
    let h = Host::new();
    let go = |p: &Prog, loads: &[&dyn Operand]| {
        h.attention_scored(&spec, Scores { prog: p, loads }, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None)
    };
    let (good, f32s, _) = program(Kind::Alibi, Dtype::F32, &c);
    assert_eq!(go(&good, &[&f32s[0]]), Answer::Done);
    // one output; a score load of f64 for an f32 accumulator; a missing load; a load of another
    // dtype; a load that does not broadcast to [1, 2, 3, 4]; a coordinate past the loop
    let mut one = Prog::new(&[Dtype::F32]);
    let s = one.load(0);
    one.output(s);
    assert_eq!(go(&one, &[]), Answer::ShapeMismatch);
    let (wide, _, _) = program(Kind::Softcap, Dtype::F64, &c);
    assert_eq!(go(&wide, &[]), Answer::WrongDtype);
    assert_eq!(go(&good, &[]), Answer::ShapeMismatch);
    let i32s = Array::<i32>::zeros(DEV, &[2, 1, 1]).unwrap();
    assert_eq!(go(&good, &[&i32s]), Answer::WrongDtype);
    let bad = Array::<f32>::zeros(DEV, &[3, 1, 1]).unwrap();
    assert_eq!(go(&good, &[&bad]), Answer::ShapeMismatch);
    let mut far = Prog::new(&[Dtype::F32]);
    let (s, x) = (far.load(0), far.coord(4));
    let yes = far.boolean(true);
    let xs = far.cast(x, Dtype::F32);
    let out = far.add(s, xs);
    far.output(yes);
    far.output(out);
    assert_eq!(go(&far, &[]), Answer::ShapeMismatch);
    let mut vis_f = Prog::new(&[Dtype::F32]);
    let s = vis_f.load(0);
    vis_f.output(s);
    vis_f.output(s);
    assert_eq!(go(&vis_f, &[]), Answer::WrongDtype, "visibility is a bool");
    let plain = Plain(Host::new());
    let p = Scores { prog: &good, loads: &[&f32s[0]] };
    assert_eq!(plain.attention_scored(&spec, p, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None), Answer::Declined);
}
