//! Every SIMD level this CPU runs, forced by `HostOptions::simd`, against the baseline library
//! (bit for bit: every association below is fixed by the docs, the same at every level but for
//! the bf16 product at `amx`, whose tiles fix their own) and against naive f64 loops
//! written here: fused maps, sums of every term type, f32, bf16 and i32 products at sizes that
//! are not multiples of any tile, sorts with NaNs and signed zeros, and attention. On a CPU
//! without AVX2 only the baseline runs, and the references still check it.

use half::bf16;
use nx_kernels::host::{HostOptions, Store};
use nx_kernels::prog::{BinOp, UnOp};
use nx_kernels::{Answer, Array, Attention, Contraction, Dtype, Host, Kernels, Kv, Prog, Reduction, Simd};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };

fn val(k: usize, salt: usize) -> f64 {
    (((k * 7919 + salt * 104_729) % 10007) as f64 / 10007.0 - 0.5) * 2.0
}

/// A library capped at `simd`, on 2 threads, splitting from 1 element (every parallel branch).
fn host(simd: Simd) -> Host {
    let h = Host::with_options(HostOptions {
        threads: Some(2),
        map: Some(1),
        reduce: Some(1),
        convert: Some(1),
        store: Store::Memory,
        simd: Some(simd),
        ..HostOptions::default()
    })
    .unwrap();
    assert_eq!(h.simd(), simd, "an available level is kept");
    h
}

/// The additions on a term's way into a sum of `n` terms in the documented association: at most
/// 256 in its lane's chain within a chunk of 2048, 3 in the lanes' tree, one a level of the
/// chunks' tree.
fn depth(n: usize) -> f64 {
    (n.div_ceil(8).min(256) + 3 + (usize::BITS - n.div_ceil(2048).leading_zeros()) as usize) as f64
}

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `f` on the baseline library and on every other level this CPU runs: each level's
/// result equals the baseline's, which `check` compares with the naive reference.
fn each_level<R: PartialEq + std::fmt::Debug>(what: &str, f: impl Fn(&Host) -> R, check: impl Fn(&R)) {
    each_level_but(what, &[], f, check)
}

/// As [`each_level`], but for the levels in `own`, whose results have bits of their own (the
/// docs say so): those are checked against the naive reference alone.
fn each_level_but<R: PartialEq + std::fmt::Debug>(
    what: &str,
    own: &[Simd],
    f: impl Fn(&Host) -> R,
    check: impl Fn(&R),
) {
    let base = f(&host(Simd::Baseline));
    check(&base);
    for simd in Simd::available_levels() {
        let got = f(&host(simd));
        if own.contains(&simd) {
            check(&got);
        } else {
            assert_eq!(got, base, "{what} at {simd}");
        }
    }
}

#[test]
fn a_cap_above_the_cpu_is_lowered_and_the_default_is_the_cpu() {
    let top = Simd::detected();
    let h = Host::with_options(HostOptions { simd: Some(Simd::Amx), ..HostOptions::default() }).unwrap();
    assert_eq!(h.simd(), top);
    assert_eq!(Host::new().simd(), top);
    assert_eq!(host(Simd::Baseline).simd(), Simd::Baseline);
}

/// `relu(a·x + b)` and `exp` lane-fused over f32 and f64 operands (a tail of fewer than 128
/// through the register evaluator): the same bits at every level, within rounding of the f64 loop.
#[test]
fn maps_at_every_level() {
    for n in [0usize, 1, 127, 129, 4097] {
        for d in [Dtype::F32, Dtype::F64] {
            let mut p = Prog::new(&[d, d, d]);
            let (a, x, b) = (p.load(0), p.load(1), p.load(2));
            let ax = p.binary(BinOp::Mul, a, x);
            let y = p.binary(BinOp::Add, ax, b);
            let zero = p.constant(0.0, nx_kernels::prog::Ty::of(d));
            let z = p.binary(BinOp::Max, y, zero);
            p.output(z);
            let e = p.unary(UnOp::Exp, x);
            p.output(e);
            let (av, xv, bv): (Vec<f64>, Vec<f64>, Vec<f64>) = (
                (0..n).map(|i| val(i, 1)).collect(),
                (0..n).map(|i| val(i, 2)).collect(),
                (0..n).map(|i| val(i, 3)).collect(),
            );
            let run = |h: &Host| -> Vec<u64> {
                macro_rules! go {
                    ($t:ty) => {{
                        let arr =
                            |v: &[f64]| Array::<$t>::from_vec(DEV, &[n], v.iter().map(|&x| x as $t).collect()).unwrap();
                        let (a, x, b) = (arr(&av), arr(&xv), arr(&bv));
                        let (z, e) = (Array::<$t>::zeros(DEV, &[n]).unwrap(), Array::<$t>::zeros(DEV, &[n]).unwrap());
                        assert_eq!(h.map(&p, &[n], &[&z, &e], &[&a, &x, &b]), Answer::Done);
                        let mut out: Vec<u64> = z.to_vec().unwrap().iter().map(|v| v.to_bits() as u64).collect();
                        out.extend(e.to_vec().unwrap().iter().map(|v| v.to_bits() as u64));
                        out
                    }};
                }
                match d {
                    Dtype::F32 => go!(f32),
                    _ => go!(f64),
                }
            };
            each_level(&format!("map {d} {n}"), run, |got| {
                let eps = if d == Dtype::F32 { f64::from(f32::EPSILON) } else { f64::EPSILON };
                let back =
                    |b: u64| if d == Dtype::F32 { f64::from(f32::from_bits(b as u32)) } else { f64::from_bits(b) };
                for i in 0..n {
                    let (a, x, b) = if d == Dtype::F32 {
                        (f64::from(av[i] as f32), f64::from(xv[i] as f32), f64::from(bv[i] as f32))
                    } else {
                        (av[i], xv[i], bv[i])
                    };
                    let want = (a * x + b).max(0.0);
                    assert!((back(got[i]) - want).abs() <= 2.0 * eps * (a * x).abs().max(b.abs()), "{d} relu at {i}");
                    let want = x.exp();
                    assert!((back(got[n + i]) - want).abs() <= 4.0 * eps * want, "{d} exp at {i}");
                }
            });
        }
    }
}

/// Sums of all elements and along each axis, of f32, f64 and i64 terms: the same bits at every
/// level, within the stated bound of the f64 sum (integers exactly).
#[test]
fn sums_at_every_level() {
    for (rows, cols) in [(1usize, 1usize), (3, 2049), (5, 3 * 2048 + 5), (2048 + 1, 3)] {
        let n = rows * cols;
        let xs: Vec<f64> = (0..n).map(|i| val(i, 7) * 100.0).collect();
        let mut p = Prog::new(&[Dtype::F32]);
        let x = p.load(0);
        p.output(x);
        let run = |h: &Host| -> Vec<Vec<u32>> {
            let src = Array::<f32>::from_vec(DEV, &[rows, cols], xs.iter().map(|&x| x as f32).collect()).unwrap();
            let mut out = Vec::new();
            for axes in [vec![0usize, 1], vec![0], vec![1]] {
                let len = if axes.len() == 2 {
                    1
                } else if axes[0] == 0 {
                    cols
                } else {
                    rows
                };
                let shape: &[usize] = if axes.len() == 2 { &[] } else { &[len] };
                let dst = Array::<f32>::zeros(DEV, shape).unwrap();
                assert_eq!(h.reduce(&p, &[rows, cols], &axes, &[Reduction::Sum], &[&dst], &[&src]), Answer::Done);
                out.push(bits32(&dst.to_vec().unwrap()));
            }
            out
        };
        each_level(&format!("f32 sums {rows}x{cols}"), run, |got| {
            let whole: f64 = xs.iter().map(|&x| f64::from(x as f32)).sum();
            let mag: f64 = xs.iter().map(|&x| f64::from(x as f32).abs()).sum();
            let g = f64::from(f32::from_bits(got[0][0]));
            assert!(
                (g - whole).abs() <= mag * depth(n) * f64::from(f32::EPSILON) / 2.0 + 1e-30,
                "{rows}x{cols}: {g} against {whole}"
            );
            for r in 0..rows {
                let want: f64 = (0..cols).map(|c| f64::from(xs[r * cols + c] as f32)).sum();
                let mag: f64 = (0..cols).map(|c| f64::from(xs[r * cols + c] as f32).abs()).sum();
                let g = f64::from(f32::from_bits(got[2][r]));
                assert!((g - want).abs() <= mag * depth(cols) * f64::from(f32::EPSILON) / 2.0 + 1e-30, "row {r}");
            }
        });
        // f64 and i64: all elements
        let mut p64 = Prog::new(&[Dtype::F64]);
        let x = p64.load(0);
        p64.output(x);
        let mut pi = Prog::new(&[Dtype::I64]);
        let x = pi.load(0);
        pi.output(x);
        let ints: Vec<i64> = (0..n).map(|i| (val(i, 9) * 4e18) as i64).collect();
        let run = |h: &Host| -> (u64, i64) {
            let src = Array::<f64>::from_vec(DEV, &[n], xs.clone()).unwrap();
            let d = Array::<f64>::zeros(DEV, &[]).unwrap();
            assert_eq!(h.reduce(&p64, &[n], &[0], &[Reduction::Sum], &[&d], &[&src]), Answer::Done);
            let isrc = Array::<i64>::from_vec(DEV, &[n], ints.clone()).unwrap();
            let di = Array::<i64>::zeros(DEV, &[]).unwrap();
            assert_eq!(h.reduce(&pi, &[n], &[0], &[Reduction::Sum], &[&di], &[&isrc]), Answer::Done);
            (d.to_vec().unwrap()[0].to_bits(), di.to_vec().unwrap()[0])
        };
        each_level(&format!("f64/i64 sums {n}"), run, |&(f, i)| {
            let want: f64 = xs.iter().sum();
            let mag: f64 = xs.iter().map(|x| x.abs()).sum();
            assert!((f64::from_bits(f) - want).abs() <= mag * depth(n) * f64::EPSILON / 2.0 + 1e-300);
            assert_eq!(i, ints.iter().fold(0i64, |a, &x| a.wrapping_add(x)));
        });
    }
}

/// f32 and bf16 products (f32 accumulation) and wrapping i32 products at sizes off every tile
/// (1, 15, 16, 17, 31, 33, one past a contracting block and one past the AMX kit's, whose bf16
/// output then accumulates in f32 first): the same bits at every level, each
/// within (k + 2)·u·Σ|a·b| of the f64 product (integers exactly).
#[test]
fn products_at_every_level() {
    for (m, n, k) in [(1usize, 1usize, 1usize), (15, 17, 33), (16, 31, 16), (33, 15, 513), (17, 33, 31), (33, 40, 4200)]
    {
        let a: Vec<f64> = (0..m * k).map(|i| val(i, 11)).collect();
        let b: Vec<f64> = (0..k * n).map(|i| val(i, 12)).collect();
        let naive = |a: &[f64], b: &[f64]| -> (Vec<f64>, Vec<f64>) {
            let (mut c, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
            for i in 0..m {
                for j in 0..n {
                    for l in 0..k {
                        c[i * n + j] += a[i * k + l] * b[l * n + j];
                        mag[i * n + j] += (a[i * k + l] * b[l * n + j]).abs();
                    }
                }
            }
            (c, mag)
        };
        let spec = Contraction::matmul(0);
        let within = |got: &[f64], a: &[f64], b: &[f64], what: &str| {
            let (want, mag) = naive(a, b);
            for (i, (&g, (&w, &s))) in got.iter().zip(want.iter().zip(&mag)).enumerate() {
                let bound = (k + 2) as f64 * f64::from(f32::EPSILON) / 2.0 * s;
                assert!((g - w).abs() <= bound + 1e-30, "{what} {m}x{n}x{k} at {i}: {g} against {w}");
            }
        };
        // f32
        let run = |h: &Host| {
            let aa = Array::<f32>::from_vec(DEV, &[m, k], a.iter().map(|&x| x as f32).collect()).unwrap();
            let ba = Array::<f32>::from_vec(DEV, &[k, n], b.iter().map(|&x| x as f32).collect()).unwrap();
            let c = Array::<f32>::zeros(DEV, &[m, n]).unwrap();
            assert_eq!(h.contract(&spec, &c, &aa, &ba, None), Answer::Done);
            bits32(&c.to_vec().unwrap())
        };
        let (a32, b32): (Vec<f64>, Vec<f64>) =
            (a.iter().map(|&x| f64::from(x as f32)).collect(), b.iter().map(|&x| f64::from(x as f32)).collect());
        each_level("f32 product", run, |got| {
            let g: Vec<f64> = got.iter().map(|&x| f64::from(f32::from_bits(x))).collect();
            within(&g, &a32, &b32, "f32");
        });
        // bf16 operands, an f32 result (bf16 results round that once)
        let (ab, bb): (Vec<bf16>, Vec<bf16>) =
            (a.iter().map(|&x| bf16::from_f64(x)).collect(), b.iter().map(|&x| bf16::from_f64(x)).collect());
        let run = |h: &Host| {
            let aa = Array::<bf16>::from_vec(DEV, &[m, k], ab.clone()).unwrap();
            let ba = Array::<bf16>::from_vec(DEV, &[k, n], bb.clone()).unwrap();
            let c = Array::<bf16>::zeros(DEV, &[m, n]).unwrap();
            assert_eq!(h.contract(&spec, &c, &aa, &ba, None), Answer::Done);
            c.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<u16>>()
        };
        let (a16, b16): (Vec<f64>, Vec<f64>) =
            (ab.iter().map(|x| x.to_f64()).collect(), bb.iter().map(|x| x.to_f64()).collect());
        // AMX's tiles add in their own order (bgemm_amx.rs)
        each_level_but("bf16 product", &[Simd::Amx], run, |got| {
            let (want, mag) = naive(&a16, &b16);
            for (i, &g) in got.iter().enumerate() {
                let g = bf16::from_bits(g).to_f64();
                // f32 accumulation, then one rounding to bf16
                let bound =
                    (k + 2) as f64 * f64::from(f32::EPSILON) / 2.0 * mag[i] + want[i].abs() * 2f64.powi(-8) * 1.01;
                assert!((g - want[i]).abs() <= bound + 1e-30, "bf16 {m}x{n}x{k} at {i}: {g} against {}", want[i]);
            }
        });
        // i32, wrapping
        let (ai, bi): (Vec<i32>, Vec<i32>) = (
            (0..m * k).map(|i| (val(i, 13) * 2e9) as i32).collect(),
            (0..k * n).map(|i| (val(i, 14) * 2e9) as i32).collect(),
        );
        let run = |h: &Host| {
            let aa = Array::<i32>::from_vec(DEV, &[m, k], ai.clone()).unwrap();
            let ba = Array::<i32>::from_vec(DEV, &[k, n], bi.clone()).unwrap();
            let c = Array::<i32>::zeros(DEV, &[m, n]).unwrap();
            let f = nx_kernels::Factor::plain(&aa);
            let g = nx_kernels::Factor::plain(&ba);
            assert_eq!(h.contract_general(&spec, None, &c, f, g, None), Answer::Done);
            c.to_vec().unwrap()
        };
        each_level("i32 product", run, |got| {
            for i in 0..m {
                for j in 0..n {
                    let w = (0..k).fold(0i32, |s, l| s.wrapping_add(ai[i * k + l].wrapping_mul(bi[l * n + j])));
                    assert_eq!(got[i * n + j], w, "i32 {m}x{n}x{k} at ({i}, {j})");
                }
            }
        });
    }
}

/// The bf16 product of `ab` (m × k) and `bb` (k × n) at `simd` without init, after asserting
/// that its bits are those of the same product onto an init of zeros.
fn fresh_and_onto_zeros(simd: Simd, (m, n, k): (usize, usize, usize), ab: &[bf16], bb: &[bf16]) -> Vec<bf16> {
    let (h, spec) = (host(simd), Contraction::matmul(0));
    let aa = Array::<bf16>::from_vec(DEV, &[m, k], ab.to_vec()).unwrap();
    let ba = Array::<bf16>::from_vec(DEV, &[k, n], bb.to_vec()).unwrap();
    let (fresh, onto) = (Array::<bf16>::zeros(DEV, &[m, n]).unwrap(), Array::<bf16>::zeros(DEV, &[m, n]).unwrap());
    let zeros = Array::<bf16>::zeros(DEV, &[m, n]).unwrap();
    assert_eq!(h.contract(&spec, &fresh, &aa, &ba, None), Answer::Done);
    assert_eq!(h.contract(&spec, &onto, &aa, &ba, Some(&zeros)), Answer::Done);
    let (got, want) = (fresh.to_vec().unwrap(), onto.to_vec().unwrap());
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want), "fresh and onto zeros at {simd}");
    got
}

/// Past a block of the AMX tiles (k > 4096) a bf16 product without init runs through a fresh
/// f32 accumulator read back plus +0: its outputs have the bits of adding onto zeros there too,
/// where the tiles' running sum turns negative subnormal (output (0, 0): 2⁻¹²⁶ then −1.5·2⁻¹²⁶ a
/// group of 32 later, its other products −0, so that a −0 would stay): the tiles flush it to +0,
/// the f32 tiles keep the subnormal −2⁻¹²⁷.
#[test]
fn amx_products_past_a_block_overwrite_with_the_bits_of_adding_onto_zeros() {
    if !Simd::Amx.available() {
        eprintln!("this CPU has no AMX (or Linux refused its tiles): the AMX product is not tested here");
        return;
    }
    let (m, n, k) = (1024usize, 1024usize, 4100usize);
    let half = 2f64.powi(-63);
    let ab: Vec<bf16> = (0..m * k)
        .map(|i| {
            bf16::from_f64(match i {
                0 => half,
                32 => -1.5 * half,
                _ if i < k => -0.0,
                _ => val(i, 31),
            })
        })
        .collect();
    let bb: Vec<bf16> = (0..k * n).map(|i| bf16::from_f64(if i % n == 0 { half } else { val(i, 32) })).collect();
    for simd in [Simd::Avx512, Simd::Amx] {
        let got = fresh_and_onto_zeros(simd, (m, n, k), &ab, &bb);
        let corner = if simd == Simd::Amx { 0 } else { bf16::from_f64(-(2f64.powi(-127))).to_bits() };
        assert_eq!(got[0].to_bits(), corner, "output (0, 0) at {simd}");
    }
}

/// A bf16 product whose f32 accumulator passes 4 MiB (written over fresh memory, not added onto
/// zeros) against the same product onto an `init` of zeros and against f64 loops, at every level;
/// output (0, 0)'s products underflow to −0, and adding onto zeros made it +0.
#[test]
fn large_bf16_products_overwrite_a_fresh_accumulator_with_the_bits_of_adding_onto_zeros() {
    let (m, n, k) = (1025usize, 1031usize, 37usize);
    let tiny = 2f64.powi(-100);
    let ab: Vec<bf16> = (0..m * k).map(|i| bf16::from_f64(if i < k { -tiny } else { val(i, 21) })).collect();
    let bb: Vec<bf16> = (0..k * n).map(|i| bf16::from_f64(if i % n == 0 { tiny } else { val(i, 22) })).collect();
    for simd in Simd::available_levels() {
        let got = fresh_and_onto_zeros(simd, (m, n, k), &ab, &bb);
        assert_eq!(got[0].to_bits(), 0, "underflowed sum at {simd}");
        for i in (0..m).step_by(41) {
            for j in 0..n {
                let (mut exact, mut mag) = (0f64, 0f64);
                for l in 0..k {
                    let t = ab[i * k + l].to_f64() * bb[l * n + j].to_f64();
                    exact += t;
                    mag += t.abs();
                }
                let bound = (k + 2) as f64 * f64::from(f32::EPSILON) / 2.0 * mag + exact.abs() * 2f64.powi(-8) * 1.01;
                let g = got[i * n + j].to_f64();
                assert!((g - exact).abs() <= bound + 1e-30, "{simd} ({i}, {j}): {g} against {exact}");
            }
        }
    }
}

/// Stable sorts of f32 rows holding NaNs and both zeros, ascending and descending, and a top-k
/// of few of many (the path that reads keys in vector registers): the same positions at every
/// level, each the stable order of the reference's total order (−0 before +0, NaN last).
#[test]
fn sorts_at_every_level() {
    let (rows, n) = (3usize, 1000usize);
    let xs: Vec<f32> = (0..rows * n)
        .map(|i| match i % 97 {
            5 => f32::NAN,
            6 => -0.0,
            7 => 0.0,
            _ => ((i * 7919 % 211) as f32 - 105.0) * 0.5,
        })
        .collect();
    for descending in [false, true] {
        for k in [n, 7] {
            let run = |h: &Host| {
                let a = Array::<f32>::from_vec(DEV, &[rows, n], xs.clone()).unwrap();
                let p = Array::<i64>::zeros(DEV, &[rows, k]).unwrap();
                assert_eq!(h.sort(1, descending, None, Some(&p), &a), Answer::Done);
                p.to_vec().unwrap()
            };
            each_level(&format!("sort descending {descending} k {k}"), run, |got| {
                // the order: NaN above every number, +0 above −0; ties by position
                let rank = |x: f32| -> (u8, f32, u8) {
                    if x.is_nan() {
                        (1, 0.0, 0)
                    } else {
                        (0, x, u8::from(!x.is_sign_negative()))
                    }
                };
                for r in 0..rows {
                    let mut want: Vec<usize> = (0..n).collect();
                    want.sort_by(|&i, &j| {
                        let (a, b) = (rank(xs[r * n + i]), rank(xs[r * n + j]));
                        let o = a.0.cmp(&b.0).then(a.1.partial_cmp(&b.1).unwrap()).then(a.2.cmp(&b.2));
                        if descending {
                            o.reverse()
                        } else {
                            o
                        }
                    });
                    let got: Vec<usize> = got[r * k..(r + 1) * k].iter().map(|&p| p as usize).collect();
                    assert_eq!(got, want[..k], "row {r} descending {descending} k {k}");
                }
            });
        }
    }
}

/// Grouped-query attention with a causal mask, f32 accumulation: the same bits at every level,
/// within the stated bound of the naive f64 softmax(s·QKᵀ)V.
#[test]
fn attention_at_every_level() {
    let (hq, hk, tq, tk, dk, dv) = (4usize, 2usize, 37usize, 41usize, 24usize, 17usize);
    let q: Vec<f64> = (0..hq * tq * dk).map(|i| val(i, 21)).collect();
    let kk: Vec<f64> = (0..hk * tk * dk).map(|i| val(i, 22)).collect();
    let v: Vec<f64> = (0..hk * tk * dv).map(|i| val(i, 23)).collect();
    let spec = Attention { scale: 0.3, causal: Some(4), acc: Dtype::F32 };
    let arr =
        |shape: &[usize], x: &[f64]| Array::<f32>::from_vec(DEV, shape, x.iter().map(|&x| x as f32).collect()).unwrap();
    let run = |h: &Host| {
        let (qa, ka, va) = (arr(&[1, hq, tq, dk], &q), arr(&[1, hk, tk, dk], &kk), arr(&[1, hk, tk, dv], &v));
        let o = Array::<f32>::zeros(DEV, &[1, hq, tq, dv]).unwrap();
        let lse = Array::<f32>::zeros(DEV, &[1, hq, tq]).unwrap();
        assert_eq!(h.attention(&spec, &o, &lse, &qa, Kv::Dense { k: &ka, v: &va }, None), Answer::Done);
        (bits32(&o.to_vec().unwrap()), bits32(&lse.to_vec().unwrap()))
    };
    each_level("attention", run, |(o, lse)| {
        let f = |x: f64| f64::from(x as f32);
        for h in 0..hq {
            let g = h / (hq / hk);
            for i in 0..tq {
                // causal at offset 4: key t visible to query i where t <= i + 4
                let vis: Vec<usize> = (0..tk).filter(|&t| t <= i + 4).collect();
                let s: Vec<f64> = vis
                    .iter()
                    .map(|&t| {
                        0.3 * (0..dk).map(|d| f(q[(h * tq + i) * dk + d]) * f(kk[(g * tk + t) * dk + d])).sum::<f64>()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let want_lse = m + z.ln();
                let got_lse = f64::from(f32::from_bits(lse[h * tq + i]));
                assert!((got_lse - want_lse).abs() <= 1e-5 * (1.0 + want_lse.abs()), "lse ({h}, {i})");
                for d in 0..dv {
                    let want: f64 =
                        vis.iter().zip(&s).map(|(&t, x)| (x - m).exp() / z * f(v[(g * tk + t) * dv + d])).sum();
                    let got = f64::from(f32::from_bits(o[(h * tq + i) * dv + d]));
                    assert!((got - want).abs() <= 1e-5, "o ({h}, {i}, {d}): {got} against {want}");
                }
            }
        }
    });
}

/// `z = a·b + a` over bf16 and f16 operands into a destination of the same dtype: contiguous
/// operands run lane-fused (widened, computed in f32 and narrowed run by run), strided ones
/// through the register evaluator; both give the same bits at every level, and each element is
/// the f32 computation of the exactly widened operands rounded once by `half`'s own conversion
/// (NaNs the quiet one), specials and rounding ties included; with a cast to that dtype before
/// the store (as nx's maps end) or without.
#[test]
fn half_maps_lane_fused_at_every_level() {
    let n = 3 * 128 + 37;
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, 1.0e-40, 65504.0, 3.0e38];
    let a: Vec<f32> = (0..n).map(|i| if i % 29 == 3 { special[i % 8] } else { val(i, 31) as f32 * 3.0 }).collect();
    let b: Vec<f32> = (0..n).map(|i| if i % 31 == 5 { special[i % 8] } else { val(i, 32) as f32 * 5.0 }).collect();
    macro_rules! case {
        ($h:ty, $d:expr) => {{
            let (ah, bh): (Vec<$h>, Vec<$h>) =
                (a.iter().map(|&x| <$h>::from_f32(x)).collect(), b.iter().map(|&x| <$h>::from_f32(x)).collect());
            for cast in [false, true] {
                let mut p = Prog::new(&[$d, $d]);
                let (x, y) = (p.load(0), p.load(1));
                let xy = p.binary(BinOp::Mul, x, y);
                let z = p.binary(BinOp::Add, xy, x);
                // a cast to the destination's dtype before the store (as nx's maps end) is the
                // store's own rounding
                let z = if cast { p.cast(z, $d) } else { z };
                p.output(z);
                let run = |h: &Host, strided: bool| -> Vec<u16> {
                    let arr = |v: &[$h]| {
                        if strided {
                            // every element twice, the view every other: a strided operand
                            let twice: Vec<$h> = v.iter().flat_map(|&x| [x, x]).collect();
                            Array::<$h>::from_vec(DEV, &[2 * n], twice)
                                .unwrap()
                                .apply(&nx_kernels::Move::Slice { axis: 0, start: None, stop: None, step: 2 })
                                .unwrap()
                                .unwrap()
                        } else {
                            Array::<$h>::from_vec(DEV, &[n], v.to_vec()).unwrap()
                        }
                    };
                    let (x, y) = (arr(&ah), arr(&bh));
                    let z = Array::<$h>::zeros(DEV, &[n]).unwrap();
                    assert_eq!(h.map(&p, &[n], &[&z], &[&x, &y]), Answer::Done);
                    z.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
                };
                each_level(
                    &format!("{} map", $d),
                    |h| (run(h, false), run(h, true)),
                    |(fused, plain)| {
                        assert_eq!(fused, plain, "{}: lane-fused and register evaluator", $d);
                        for i in 0..n {
                            let (x, y) = (ah[i].to_f32(), bh[i].to_f32());
                            let want = <$h>::from_f32(x * y + x);
                            let got = <$h>::from_bits(fused[i]);
                            if want.is_nan() {
                                // every NaN the one quiet NaN nx's conversions give
                                let qnan = if $d == Dtype::BF16 { 0x7FC0 } else { 0x7E00 };
                                assert_eq!(fused[i], qnan, "{} at {i}: {got} (want the quiet NaN)", $d);
                            } else {
                                assert_eq!(fused[i], want.to_bits(), "{} at {i}: {x} * {y} + {x}", $d);
                            }
                        }
                    },
                );
            }
        }};
    }
    case!(bf16, Dtype::BF16);
    case!(half::f16, Dtype::F16);
}

/// A cast to a half that another node also reads, or that is stored as another half, is a real
/// rounding inside the program: `c = half(x·y)`, `w = c + x`, both stored as the half, and
/// `c` stored as the other half, against the f32 computation rounded where the program says.
#[test]
fn half_casts_read_inside_a_map_round_there() {
    let n = 2 * 128 + 19;
    let a: Vec<f32> = (0..n).map(|i| val(i, 41) as f32 * 3.0).collect();
    let b: Vec<f32> = (0..n).map(|i| val(i, 42) as f32 * 5.0).collect();
    let (ab, bb): (Vec<bf16>, Vec<bf16>) =
        (a.iter().map(|&x| bf16::from_f32(x)).collect(), b.iter().map(|&x| bf16::from_f32(x)).collect());
    let mut p = Prog::new(&[Dtype::BF16, Dtype::BF16]);
    let (x, y) = (p.load(0), p.load(1));
    let xy = p.binary(BinOp::Mul, x, y);
    let c = p.cast(xy, Dtype::BF16);
    let w = p.binary(BinOp::Add, c, x);
    p.output(c);
    p.output(w);
    p.output(c);
    let run = |h: &Host| -> Vec<Vec<u16>> {
        let (x, y) =
            (Array::<bf16>::from_vec(DEV, &[n], ab.clone()).unwrap(), Array::from_vec(DEV, &[n], bb.clone()).unwrap());
        let (dc, dw) = (Array::<bf16>::zeros(DEV, &[n]).unwrap(), Array::<bf16>::zeros(DEV, &[n]).unwrap());
        let df = Array::<half::f16>::zeros(DEV, &[n]).unwrap();
        assert_eq!(h.map(&p, &[n], &[&dc, &dw, &df], &[&x, &y]), Answer::Done);
        vec![
            dc.to_vec().unwrap().iter().map(|v| v.to_bits()).collect(),
            dw.to_vec().unwrap().iter().map(|v| v.to_bits()).collect(),
            df.to_vec().unwrap().iter().map(|v| v.to_bits()).collect(),
        ]
    };
    each_level("bf16 casts read inside", run, |got| {
        for i in 0..n {
            let (x, y) = (ab[i].to_f32(), bb[i].to_f32());
            let c = bf16::from_f32(x * y);
            assert_eq!(got[0][i], c.to_bits(), "c at {i}");
            assert_eq!(got[1][i], bf16::from_f32(c.to_f32() + x).to_bits(), "w at {i}");
            assert_eq!(got[2][i], half::f16::from_f32(c.to_f32()).to_bits(), "c as f16 at {i}");
        }
    });
}
