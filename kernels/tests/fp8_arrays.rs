//! The fp8 dtypes as arrays, against references written here: every bit pattern's value read from
//! the independent table (`data/fp8_conformance.txt`, numpy's `ml_dtypes` and PyTorch), and a
//! rounding by nearest-value search over those values (ties to the even pattern; E4M3 saturates
//! as the format's own cast does, E5M2 overflows to ±∞) — never `Fp8::encode`.
//!
//! Casts through maps and bulk conversion; every pair of patterns added and multiplied (one
//! rounding of the exact result); reductions, scans, sorts, contractions (plain, into `f32`, and
//! MX-style with `Exponent` block scales) against f64 loops; names, safetensors and DLPack codes.

use nx_kernels::dtype::fp8::{F8E4M3, F8E5M2};
use nx_kernels::prog::{BinOp, Prog};
use nx_kernels::{
    binary_result, dlpack, Answer, Array, Contraction, Dtype, Element, Extreme, Factor, Host, Kernels, Reduction, Scale,
};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };
const TABLE: &str = include_str!("data/fp8_conformance.txt");

/// One format's facts from the table alone.
struct Format {
    name: &'static str,
    /// The value of each pattern.
    values: [f32; 256],
    /// (f32 bits, pattern) of every encode line of the format's own cast.
    encodes: Vec<(u32, u8)>,
}

fn format(name: &'static str) -> Format {
    // the format's own cast: torch's saturating one for E4M3, ml_dtypes' (= torch's) for E5M2
    let cast = if name == "e4m3" { "e4m3sat" } else { "e5m2" };
    let mut values = [f32::NAN; 256];
    let mut encodes = Vec::new();
    for line in TABLE.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (a, b) = (u32::from_str_radix(f[2], 16).unwrap(), u32::from_str_radix(f[3], 16).unwrap());
        if f[0] == name && f[1] == "decode" {
            values[a as usize] = f32::from_bits(b);
        }
        if f[0] == cast && f[1] == "encode" {
            encodes.push((a, b as u8));
        }
    }
    assert!(encodes.len() > 1500, "{name}: {} encode lines", encodes.len());
    Format { name, values, encodes }
}

impl Format {
    /// `x` rounded once into the format by a search over the table's values: the nearest, a tie
    /// to the even pattern; past the largest finite value E4M3 saturates, E5M2 rounds as if ∞
    /// were the next value (2^16), so that the tie at 61440 goes to ∞.
    fn round(&self, x: f64) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_nan() {
            return sign | 0x7F; // a NaN of either format (compared by is_nan)
        }
        let a = x.abs();
        let mut best: Option<(f64, u8)> = None;
        let mut cands: Vec<(f64, u8)> = (0..0x80u8)
            .filter(|&b| self.values[b as usize].is_finite())
            .map(|b| (f64::from(self.values[b as usize]), b))
            .collect();
        if self.name == "e5m2" {
            cands.push((65536.0, 0x7C));
        }
        if a.is_infinite() {
            return sign | if self.name == "e5m2" { 0x7C } else { 0x7E };
        }
        for (v, b) in cands {
            let d = (v - a).abs();
            best = match best {
                None => Some((d, b)),
                Some((bd, bb)) if d < bd || (d == bd && b % 2 == 0 && bb % 2 == 1) => Some((d, b)),
                keep => keep,
            };
        }
        sign | best.unwrap().1
    }

    fn value(&self, b: u8) -> f64 {
        f64::from(self.values[b as usize])
    }
}

/// Asserts pattern `got` is `want` (any NaN for a NaN).
fn same(f: &Format, got: u8, want: u8, what: &str) {
    if f.values[want as usize].is_nan() {
        assert!(f.values[got as usize].is_nan(), "{}: {what}: {got:#04x}, want a NaN", f.name);
    } else {
        assert_eq!(got, want, "{}: {what}", f.name);
    }
}

/// The dtype of a format's elements, and its patterns as elements.
trait Fp8El: Element {
    fn bits(self) -> u8;
    fn of(b: u8) -> Self;
}
impl Fp8El for F8E4M3 {
    fn bits(self) -> u8 {
        self.to_bits()
    }
    fn of(b: u8) -> Self {
        F8E4M3::from_bits(b)
    }
}
impl Fp8El for F8E5M2 {
    fn bits(self) -> u8 {
        self.to_bits()
    }
    fn of(b: u8) -> Self {
        F8E5M2::from_bits(b)
    }
}

fn cast_prog(from: Dtype, to: Dtype) -> Prog {
    let mut p = Prog::new(&[from]);
    let l = p.load(0);
    let c = p.cast(l, to);
    p.output(c);
    p
}

fn bits<T: Fp8El>(a: &Array<T>) -> Vec<u8> {
    a.to_vec().unwrap().into_iter().map(Fp8El::bits).collect()
}

fn casts<T: Fp8El>(f: &Format) {
    let host = Host::new();
    let d = T::DTYPE;
    // f32 -> fp8, by a map and by bulk conversion: the table's encodings
    let xs: Vec<f32> = f.encodes.iter().map(|&(x, _)| f32::from_bits(x)).collect();
    let n = xs.len();
    let src = Array::<f32>::from_vec(DEV, &[n], xs.clone()).unwrap();
    let out = Array::<T>::zeros(DEV, &[n]).unwrap();
    assert_eq!(host.map(&cast_prog(Dtype::F32, d), &[n], &[&out], &[&src]), Answer::Done);
    let mut bulk = vec![T::default(); n];
    host.convert(&xs, &mut bulk).unwrap();
    for ((&(x, want), got), b) in f.encodes.iter().zip(bits(&out)).zip(&bulk) {
        same(f, got, want, &format!("map cast of {:e}", f32::from_bits(x)));
        same(f, b.bits(), want, &format!("convert of {:e}", f32::from_bits(x)));
    }
    // fp8 -> f32, f64, bf16, i32: every pattern's value, exactly (an integer truncates)
    let pats: Vec<T> = (0..=255u8).map(T::of).collect();
    let p = Array::<T>::from_vec(DEV, &[256], pats).unwrap();
    let (o32, o64) = (Array::<f32>::zeros(DEV, &[256]).unwrap(), Array::<f64>::zeros(DEV, &[256]).unwrap());
    let (obf, oi) = (Array::<half::bf16>::zeros(DEV, &[256]).unwrap(), Array::<i32>::zeros(DEV, &[256]).unwrap());
    assert_eq!(host.map(&cast_prog(d, Dtype::F32), &[256], &[&o32], &[&p]), Answer::Done);
    assert_eq!(host.map(&cast_prog(d, Dtype::F64), &[256], &[&o64], &[&p]), Answer::Done);
    assert_eq!(host.map(&cast_prog(d, Dtype::BF16), &[256], &[&obf], &[&p]), Answer::Done);
    assert_eq!(host.map(&cast_prog(d, Dtype::I32), &[256], &[&oi], &[&p]), Answer::Done);
    let (v32, v64, vbf, vi) =
        (o32.to_vec().unwrap(), o64.to_vec().unwrap(), obf.to_vec().unwrap(), oi.to_vec().unwrap());
    for b in 0..256usize {
        let want = f.values[b];
        if want.is_nan() {
            assert!(v32[b].is_nan() && v64[b].is_nan() && vbf[b].is_nan() && vi[b] == 0, "{}: {b:#04x}", f.name);
        } else {
            assert_eq!(v32[b].to_bits(), want.to_bits(), "{}: {b:#04x} to f32", f.name);
            assert_eq!(v64[b], f64::from(want), "{}: {b:#04x} to f64", f.name);
            assert_eq!(vbf[b].to_f32().to_bits(), want.to_bits(), "{}: {b:#04x} to bf16 (exact)", f.name);
            let t = want.trunc();
            let sat = t.clamp(i32::MIN as f32, i32::MAX as f32) as i32;
            assert_eq!(vi[b], if want.is_infinite() { sat } else { t as i32 }, "{}: {b:#04x} to i32", f.name);
        }
    }
}

#[test]
fn casts_match_the_table_in_both_directions() {
    casts::<F8E4M3>(&format("e4m3"));
    casts::<F8E5M2>(&format("e5m2"));
}

/// Every pair of patterns added and multiplied by a map: the exact f64 result rounded once.
fn pairs<T: Fp8El>(f: &Format) {
    let host = Host::new();
    let d = T::DTYPE;
    let n = 256 * 256;
    let a = Array::<T>::from_fn(DEV, &[256, 256], |i| T::of(i[0] as u8)).unwrap();
    let b = Array::<T>::from_fn(DEV, &[256, 256], |i| T::of(i[1] as u8)).unwrap();
    for op in [BinOp::Add, BinOp::Mul, BinOp::Sub] {
        let mut p = Prog::new(&[d, d]);
        let (x, y) = (p.load(0), p.load(1));
        let z = p.binary(op, x, y);
        p.output(z);
        let out = Array::<T>::zeros(DEV, &[256, 256]).unwrap();
        assert_eq!(host.map(&p, &[256, 256], &[&out], &[&a, &b]), Answer::Done, "{op:?}");
        let got = bits(&out);
        assert_eq!(got.len(), n);
        for (k, &g) in got.iter().enumerate() {
            let (x, y) = (f.value((k / 256) as u8), f.value((k % 256) as u8));
            let exact = match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                _ => x * y,
            };
            same(f, g, f.round(exact), &format!("{x} {op:?} {y}"));
        }
    }
}

#[test]
fn every_pair_added_and_multiplied_rounds_once() {
    pairs::<F8E4M3>(&format("e4m3"));
    pairs::<F8E5M2>(&format("e5m2"));
}

#[test]
fn reductions_and_scans_carry_f32_and_round_once() {
    let f = format("e4m3");
    let host = Host::new();
    // 5 rows of 13 (uneven), finite patterns only, mixed signs
    let (m, n) = (5usize, 13usize);
    let pat = |i: usize, j: usize| -> u8 {
        let b = ((i * 37 + j * 11) % 0x7E) as u8;
        if (i + j).is_multiple_of(3) {
            b | 0x80
        } else {
            b
        }
    };
    let x = Array::<F8E4M3>::from_fn(DEV, &[m, n], |i| F8E4M3::from_bits(pat(i[0], i[1]))).unwrap();
    let mut sum_p = Prog::new(&[Dtype::F8E4M3]);
    let l = sum_p.load(0);
    sum_p.output(l);
    let sum = Array::<F8E4M3>::zeros(DEV, &[m]).unwrap();
    let sum32 = Array::<f32>::zeros(DEV, &[m]).unwrap();
    let (mx, at) = (Array::<F8E4M3>::zeros(DEV, &[m]).unwrap(), Array::<i64>::zeros(DEV, &[m]).unwrap());
    let shape = [m, n];
    assert_eq!(host.reduce(&sum_p, &shape, &[1], &[Reduction::Sum], &[&sum], &[&x]), Answer::Done);
    assert_eq!(host.reduce(&sum_p, &shape, &[1], &[Reduction::Sum], &[&sum32], &[&x]), Answer::Done);
    assert_eq!(host.reduce(&sum_p, &shape, &[1], &[Reduction::Arg(Extreme::Max)], &[&mx, &at], &[&x]), Answer::Done);
    let scan = Array::<F8E4M3>::zeros(DEV, &[m, n]).unwrap();
    assert_eq!(host.scan(Reduction::Sum, 1, None, &[&scan], &x), Answer::Done);
    let (s, s32, mxv, atv, sc) = (bits(&sum), sum32.to_vec().unwrap(), bits(&mx), at.to_vec().unwrap(), bits(&scan));
    for i in 0..m {
        let row: Vec<f64> = (0..n).map(|j| f.value(pat(i, j))).collect();
        // 13 terms of 4 significant bits within 2^-9..2^9: every partial sum is exact in f32 and f64
        let exact: f64 = row.iter().sum();
        same(&f, s[i], f.round(exact), &format!("row {i} sum"));
        assert_eq!(f64::from(s32[i]), exact, "row {i} sum into f32");
        let (best, pos) =
            row.iter().enumerate().fold((f64::NEG_INFINITY, 0), |(b, p), (j, &v)| if v > b { (v, j) } else { (b, p) });
        assert_eq!((f.value(mxv[i]), atv[i]), (best, pos as i64), "row {i} max");
        let mut acc = 0.0;
        for j in 0..n {
            acc += row[j];
            same(&f, sc[i * n + j], f.round(acc), &format!("row {i} prefix {j}"));
        }
    }
}

#[test]
fn sorts_order_by_value_and_move_bits() {
    for name in ["e4m3", "e5m2"] {
        let f = format(name);
        let host = Host::new();
        let perm: Vec<u8> = (0..256usize).map(|k| (k * 167 % 256) as u8).collect();
        let go = |d: Dtype| -> Vec<u8> {
            macro_rules! run {
                ($t:ty) => {{
                    let src =
                        Array::<$t>::from_vec(DEV, &[256], perm.iter().map(|&b| <$t>::from_bits(b)).collect()).unwrap();
                    let dst = Array::<$t>::zeros(DEV, &[256]).unwrap();
                    let pos = Array::<i64>::zeros(DEV, &[256]).unwrap();
                    assert_eq!(host.sort(0, false, Some(&dst), Some(&pos), &src), Answer::Done);
                    let p = pos.to_vec().unwrap();
                    let got: Vec<u8> = dst.to_vec().unwrap().into_iter().map(|x| x.to_bits()).collect();
                    for (k, &g) in got.iter().enumerate() {
                        assert_eq!(perm[p[k] as usize], g, "{name}: position {k} names its element");
                    }
                    got
                }};
            }
            if d == Dtype::F8E4M3 {
                run!(F8E4M3)
            } else {
                run!(F8E5M2)
            }
        };
        let got = go(if name == "e4m3" { Dtype::F8E4M3 } else { Dtype::F8E5M2 });
        let mut sorted = got.clone();
        sorted.sort_unstable();
        let mut all: Vec<u8> = (0..=255).collect();
        all.sort_unstable();
        assert_eq!(sorted, all, "{name}: a permutation of the patterns");
        let nans = got.iter().filter(|&&b| f.values[b as usize].is_nan()).count();
        assert!(got[256 - nans..].iter().all(|&b| f.values[b as usize].is_nan()), "{name}: NaNs last");
        for w in got[..256 - nans].windows(2) {
            let (x, y) = (f.value(w[0]), f.value(w[1]));
            assert!(x < y || (x == y && (w[0] == 0x80 && w[1] == 0)), "{name}: {:#04x} then {:#04x}", w[0], w[1]);
        }
    }
}

/// A pattern of E4M3 of magnitude in [0.5, 8), negative for every fifth `s`.
fn pick(s: usize) -> u8 {
    let mag = 0x30 + (s * 29 % 0x18) as u8; // 0x30 = 0.5 .. 0x47 = 7.5
    if s.is_multiple_of(5) {
        mag | 0x80
    } else {
        mag
    }
}

/// `a`'s pattern at `[i, j]`.
fn pa(i: usize, j: usize) -> u8 {
    pick(i * 131 + j * 7 + 1)
}

/// `b`'s pattern at `[j, c]`.
fn pb(j: usize, c: usize) -> u8 {
    pick(j * 17 + c * 59 + 3)
}

/// `a [m, k]` and `b [k, n]` of [`pa`] and [`pb`]: products in [0.25, 64) of 8 significant bits,
/// each a multiple of 2^-8, of mixed signs.
fn operands(m: usize, k: usize, n: usize) -> (Array<F8E4M3>, Array<F8E4M3>) {
    let a = Array::<F8E4M3>::from_fn(DEV, &[m, k], |i| F8E4M3::from_bits(pa(i[0], i[1]))).unwrap();
    let b = Array::<F8E4M3>::from_fn(DEV, &[k, n], |i| F8E4M3::from_bits(pb(i[0], i[1]))).unwrap();
    (a, b)
}

#[test]
fn contractions_plain_and_widened() {
    let f = format("e4m3");
    let host = Host::new();
    let (m, k, n) = (3usize, 65usize, 5usize);
    let (a, b) = operands(m, k, n);
    let spec = Contraction { batch: vec![], contracting: vec![(1, 0)] };
    // fp8 into fp8: computed in f32, rounded once
    let out8 = Array::<F8E4M3>::zeros(DEV, &[m, n]).unwrap();
    assert_eq!(host.contract(&spec, &out8, &a, &b, None), Answer::Done);
    // fp8 operands into f32, through the general contraction
    let out32 = Array::<f32>::zeros(DEV, &[m, n]).unwrap();
    assert_eq!(host.contract_general(&spec, None, &out32, Factor::plain(&a), Factor::plain(&b), None), Answer::Done);
    let (o8, o32) = (bits(&out8), out32.to_vec().unwrap());
    for i in 0..m {
        for c in 0..n {
            // 65 products, multiples of 2^-8 below 2^13 in all: every partial sum exact in f32
            let e: f64 = (0..k).map(|j| f.value(pa(i, j)) * f.value(pb(j, c))).sum();
            same(&f, o8[i * n + c], f.round(e), &format!("[{i}, {c}] into fp8"));
            assert_eq!(f64::from(o32[i * n + c]), e, "[{i}, {c}] into f32");
        }
    }
}

#[test]
fn mx_contraction_of_fp8_blocks_with_exponent_scales() {
    let f = format("e4m3");
    let host = Host::new();
    let (m, k, n) = (3usize, 96usize, 7usize); // blocks of 32 along k, three of them
    let (a, b) = operands(m, k, n);
    let spec = Contraction { batch: vec![], contracting: vec![(1, 0)] };
    let ea = |i: usize, blk: usize| (126 + (i + 2 * blk) % 3) as u8; // 2^-1 .. 2^1
    let eb = |blk: usize, c: usize| (127 + (blk * 3 + c) % 2) as u8; // 2^0 .. 2^1
    let sa_arr = Array::<u8>::from_fn(DEV, &[m, k / 32], |i| ea(i[0], i[1])).unwrap();
    let sb_arr = Array::<u8>::from_fn(DEV, &[k / 32, n], |i| eb(i[0], i[1])).unwrap();
    let out = Array::<f32>::zeros(DEV, &[m, n]).unwrap();
    let (fa, fb) = (Factor::scaled(&a, Scale::Exponent(&sa_arr)), Factor::scaled(&b, Scale::Exponent(&sb_arr)));
    assert_eq!(host.contract_general(&spec, None, &out, fa, fb, None), Answer::Done);
    let got = out.to_vec().unwrap();
    for i in 0..m {
        for c in 0..n {
            let want: f64 = (0..k)
                .map(|j| {
                    let s = 2f64.powi(i32::from(ea(i, j / 32)) + i32::from(eb(j / 32, c)) - 254);
                    f.value(pa(i, j)) * f.value(pb(j, c)) * s
                })
                .sum();
            // scaled products are multiples of 2^-9 below 2^15 in all: exact in f32
            assert_eq!(f64::from(got[i * n + c]), want, "[{i}, {c}]");
        }
    }
}

#[test]
fn names_promotion_and_interchange_codes() {
    for (d, names) in [
        (Dtype::F8E4M3, ["float8_e4m3fn", "f8e4m3", "F8_E4M3", "torch.float8_e4m3fn", "fp8_e4m3"]),
        (Dtype::F8E5M2, ["float8_e5m2", "f8e5m2", "F8_E5M2", "torch.float8_e5m2", "e5m2"]),
    ] {
        for name in names {
            assert_eq!(name.parse::<Dtype>().unwrap(), d, "{name}");
        }
        assert_eq!((d.size(), d.align(), d.kind()), (1, 1, nx_kernels::Kind::Float));
        assert_eq!(d.carrier(), Dtype::F32);
        assert_eq!(dlpack::dtype_of(dlpack::data_type(d)).unwrap(), d);
        assert_eq!(binary_result(d, Dtype::I32).unwrap(), d, "an integer never widens a float");
        for other in [Dtype::F16, Dtype::BF16, Dtype::F32, Dtype::F64, Dtype::C64] {
            let e = binary_result(d, other).unwrap_err();
            assert!(e.to_string().contains(&d.to_string()) && e.to_string().contains(&other.to_string()), "{e}");
        }
    }
    assert_eq!((dlpack::data_type(Dtype::F8E4M3).code, dlpack::data_type(Dtype::F8E5M2).code), (10, 12));
    assert_eq!((Dtype::F8E4M3.max_value(), Dtype::F8E5M2.min_value()), (448.0, -57344.0));
    assert!(binary_result(Dtype::F8E4M3, Dtype::F8E5M2).is_err());
}
