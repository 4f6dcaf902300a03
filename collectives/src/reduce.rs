//! Reductions of collectives, in term (rank) order, halves in f32; across hosts, per host first
//! ([`reduce_grouped`]).

use half::{bf16, f16};
use num_complex::{Complex32, Complex64};
use nx_kernels::dtype::fp8::{F8E4M3, F8E5M2};
use nx_kernels::{Element, Simd};

/// How a reduction combines terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum (integers wrap).
    Sum,
    /// The product (integers wrap).
    Prod,
    /// The greatest (a NaN where one is; −0 below +0).
    Max,
    /// The least.
    Min,
}

impl ReduceOp {
    /// The fingerprint name of the reducing collective `what` (`all_reduce` or `reduce_scatter`)
    /// with this op: the op is part of what ranks agree on.
    pub fn fingerprint_name(self, what: &'static str) -> &'static str {
        match (what, self) {
            ("all_reduce", ReduceOp::Sum) => "all_reduce_sum",
            ("all_reduce", ReduceOp::Prod) => "all_reduce_prod",
            ("all_reduce", ReduceOp::Max) => "all_reduce_max",
            ("all_reduce", ReduceOp::Min) => "all_reduce_min",
            (_, ReduceOp::Sum) => "reduce_scatter_sum",
            (_, ReduceOp::Prod) => "reduce_scatter_prod",
            (_, ReduceOp::Max) => "reduce_scatter_max",
            (_, ReduceOp::Min) => "reduce_scatter_min",
        }
    }

    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// An element collectives can move and reduce: every dtype of nx. `Acc` is the carrier a
/// reduction adds in (`f32` for the halves and the fp8s).
pub trait Reducible: Element {
    /// The carrier.
    type Acc: Copy + Send + Sync;
    /// The term widened to the carrier, exactly.
    fn widen(self) -> Self::Acc;
    /// The carrier rounded once into the element.
    fn narrow(a: Self::Acc) -> Self;
    /// `a op b` in the carrier; `None` for an op the dtype has not (a sum of booleans, an extreme of
    /// complex numbers).
    fn combine(op: super::ReduceOp, a: Self::Acc, b: Self::Acc) -> Option<Self::Acc>;
}

fn fmax<T: PartialOrd + Copy>(a: T, b: T, nan: impl Fn(T) -> bool, neg: impl Fn(T) -> bool, max: bool) -> T {
    if nan(a) {
        a
    } else if nan(b) {
        b
    } else if a == b {
        if max == neg(a) {
            b
        } else {
            a
        }
    } else if (a > b) == max {
        a
    } else {
        b
    }
}

macro_rules! float_reducible {
    ($t:ty, $acc:ty, $w:expr, $n:expr) => {
        impl Reducible for $t {
            type Acc = $acc;
            #[inline]
            fn widen(self) -> $acc {
                let f: fn($t) -> $acc = $w;
                f(self)
            }
            #[inline]
            fn narrow(a: $acc) -> $t {
                let f: fn($acc) -> $t = $n;
                f(a)
            }
            #[inline]
            fn combine(op: ReduceOp, a: $acc, b: $acc) -> Option<$acc> {
                Some(match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Max => fmax(a, b, |x: $acc| x.is_nan(), |x: $acc| x.is_sign_negative(), true),
                    ReduceOp::Min => fmax(a, b, |x: $acc| x.is_nan(), |x: $acc| x.is_sign_negative(), false),
                })
            }
        }
    };
}
float_reducible!(f32, f32, |x| x, |x| x);
float_reducible!(f64, f64, |x| x, |x| x);
float_reducible!(f16, f32, f16::to_f32, nx_kernels::dtype::convert::f32_to_f16);
float_reducible!(bf16, f32, bf16::to_f32, nx_kernels::dtype::convert::f32_to_bf16);
float_reducible!(F8E4M3, f32, F8E4M3::to_f32, F8E4M3::from_f32);
float_reducible!(F8E5M2, f32, F8E5M2::to_f32, F8E5M2::from_f32);

macro_rules! int_reducible {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            type Acc = $t;
            #[inline]
            fn widen(self) -> $t {
                self
            }
            #[inline]
            fn narrow(a: $t) -> $t {
                a
            }
            #[inline]
            fn combine(op: ReduceOp, a: $t, b: $t) -> Option<$t> {
                Some(match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                })
            }
        }
    )*};
}
int_reducible!(i8, i16, i32, i64, u8, u16, u32, u64);

impl Reducible for bool {
    type Acc = bool;
    fn widen(self) -> bool {
        self
    }
    fn narrow(a: bool) -> bool {
        a
    }
    fn combine(op: ReduceOp, a: bool, b: bool) -> Option<bool> {
        match op {
            ReduceOp::Max => Some(a | b),
            ReduceOp::Min => Some(a & b),
            ReduceOp::Sum | ReduceOp::Prod => None,
        }
    }
}

macro_rules! complex_reducible {
    ($t:ty) => {
        impl Reducible for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn narrow(a: $t) -> $t {
                a
            }
            fn combine(op: ReduceOp, a: $t, b: $t) -> Option<$t> {
                match op {
                    ReduceOp::Sum => Some(a + b),
                    ReduceOp::Prod => Some(a * b),
                    ReduceOp::Max | ReduceOp::Min => None,
                }
            }
        }
    };
}
complex_reducible!(Complex32);
complex_reducible!(Complex64);

/// `out[i] = terms[0][i] op terms[1][i] op …`, in term order, rounded once.
pub(crate) fn reduce_into<T: Reducible>(simd: Simd, op: ReduceOp, terms: &[&[T]], out: &mut [T]) -> bool {
    let Some(first) = terms.first() else { return true };
    if T::combine(op, first.first().copied().unwrap_or_default().widen(), T::default().widen()).is_none() {
        return false;
    }
    fold_op(simd, op, terms, out);
    true
}

/// The members of a communicator grouped by host, from each member's host (in member order):
/// each group the positions of one host's members in member order, the groups in the order of
/// their first member.
pub(crate) fn by_host(hosts: impl IntoIterator<Item = usize>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, h) in hosts.into_iter().enumerate() {
        match groups.iter_mut().find(|g| g.0 == h) {
            Some(g) => g.1.push(i),
            None => groups.push((h, vec![i])),
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

/// The reduction of `terms` across hosts: each host's terms (`groups`, from [`by_host`]) reduced
/// in term order and rounded to `T`, then the host results in host order — the association of
/// the hierarchical path, which every path of every backend keeps so that results depend only
/// on the layout of the members over hosts. One host, or one member a host, is [`reduce_into`]
/// itself (the same bits).
pub(crate) fn reduce_grouped<T: Reducible>(
    simd: Simd,
    op: ReduceOp,
    terms: &[&[T]],
    groups: &[Vec<usize>],
    out: &mut [T],
) -> bool {
    if groups.len() <= 1 || groups.iter().all(|g| g.len() == 1) {
        return reduce_into(simd, op, terms, out);
    }
    let mut partials: Vec<Vec<T>> = Vec::with_capacity(groups.len());
    for g in groups {
        let mine: Vec<&[T]> = g.iter().map(|&i| terms[i]).collect();
        let mut p = vec![T::default(); out.len()];
        if !reduce_into(simd, op, &mine, &mut p) {
            return false;
        }
        partials.push(p);
    }
    let parts: Vec<&[T]> = partials.iter().map(Vec::as_slice).collect();
    reduce_into(simd, op, &parts, out)
}

nx_kernels::simd_fn! {
    /// One loop per op, the op a constant in each, so that each vectorises; built for the level
    /// (the same operations in the same order, so the same bits, the wider builds with fewer load
    /// instructions, which keeps more cache lines in flight).
    fn fold_op<T: Reducible>(simd: Simd, op: ReduceOp, terms: &[&[T]], out: &mut [T]) {
        match op {
            ReduceOp::Sum => fold(terms, out, |a, b| T::combine(ReduceOp::Sum, a, b).unwrap_or(a)),
            ReduceOp::Prod => fold(terms, out, |a, b| T::combine(ReduceOp::Prod, a, b).unwrap_or(a)),
            ReduceOp::Max => fold(terms, out, |a, b| T::combine(ReduceOp::Max, a, b).unwrap_or(a)),
            ReduceOp::Min => fold(terms, out, |a, b| T::combine(ReduceOp::Min, a, b).unwrap_or(a)),
        }
    }
}

/// `out[i] = f(…f(f(terms[0][i], terms[1][i]), terms[2][i])…)` in the carrier, a block at a time.
#[inline(always)]
fn fold<T: Reducible>(terms: &[&[T]], out: &mut [T], f: impl Fn(T::Acc, T::Acc) -> T::Acc) {
    const BLOCK: usize = 512;
    let mut acc: Vec<T::Acc> = Vec::with_capacity(BLOCK);
    for start in (0..out.len()).step_by(BLOCK) {
        let end = (start + BLOCK).min(out.len());
        acc.clear();
        acc.extend(terms[0][start..end].iter().map(|x| x.widen()));
        for t in &terms[1..] {
            for (a, x) in acc.iter_mut().zip(&t[start..end]) {
                *a = f(*a, x.widen());
            }
        }
        for (o, a) in out[start..end].iter_mut().zip(&acc) {
            *o = T::narrow(*a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented reductions written out naively, for one element across the terms: in term
    /// order from the first term, in the carrier (halves in f32, rounded once at the end), integers
    /// wrapping; the greatest is a NaN where one is and +0 over −0, the least −0 under +0.
    trait Naive: Reducible {
        fn naive(op: ReduceOp, column: &[Self]) -> Self;
        /// The same value: equal bits, or both NaN.
        fn same(a: Self, b: Self) -> bool;
    }

    fn naive_float(op: ReduceOp, column: &[f64]) -> f64 {
        let pick = |a: f64, b: f64, greatest: bool| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else if a == b {
                // ±0: the greatest is +0 unless both are −0, the least −0 unless both are +0
                if greatest == a.is_sign_negative() {
                    b
                } else {
                    a
                }
            } else if (a > b) == greatest {
                a
            } else {
                b
            }
        };
        column[1..].iter().fold(column[0], |a, &b| match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Max => pick(a, b, true),
            ReduceOp::Min => pick(a, b, false),
        })
    }

    impl Naive for f64 {
        fn naive(op: ReduceOp, column: &[f64]) -> f64 {
            naive_float(op, column)
        }
        fn same(a: f64, b: f64) -> bool {
            a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()
        }
    }

    // f32 and the halves: each step in f32, so each f64 result of a step is rounded to f32 (exact
    // here: the f64 operation of two f32 values, rounded to f32, is the f32 operation)
    macro_rules! naive_f32 {
        ($t:ty, $to:expr, $from:expr) => {
            impl Naive for $t {
                fn naive(op: ReduceOp, column: &[$t]) -> $t {
                    let to: fn($t) -> f32 = $to;
                    let from: fn(f32) -> $t = $from;
                    let mut acc = to(column[0]);
                    for &x in &column[1..] {
                        acc = naive_float(op, &[f64::from(acc), f64::from(to(x))]) as f32;
                    }
                    from(acc)
                }
                fn same(a: $t, b: $t) -> bool {
                    let (x, y) = (to_f64(a), to_f64(b));
                    x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan()
                }
            }
        };
    }
    fn to_f64<T: Element>(x: T) -> f64 {
        match x.to_value() {
            nx_kernels::Value::Float(f) => f,
            v => panic!("not a float: {v:?}"),
        }
    }
    naive_f32!(f32, |x| x, |x| x);
    naive_f32!(bf16, bf16::to_f32, bf16::from_f32);
    naive_f32!(f16, f16::to_f32, f16::from_f32);

    impl Naive for i32 {
        /// In i64, truncated to 32 bits after each step: the wrapping operation.
        fn naive(op: ReduceOp, column: &[i32]) -> i32 {
            column[1..].iter().fold(column[0], |a, &b| {
                let (a, b) = (i64::from(a), i64::from(b));
                (match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Max => {
                        if a > b {
                            a
                        } else {
                            b
                        }
                    }
                    ReduceOp::Min => {
                        if a < b {
                            a
                        } else {
                            b
                        }
                    }
                }) as i32
            })
        }
        fn same(a: i32, b: i32) -> bool {
            a == b
        }
    }

    /// Checks every op's loop on `terms` at level `simd`: against the naive reductions, and bit
    /// for bit against the baseline build.
    fn check<T: Naive>(terms: &[Vec<T>], simd: Simd) {
        let terms: Vec<&[T]> = terms.iter().map(|t| &t[..]).collect();
        let len = terms[0].len();
        let bytes = |v: &[T]| {
            // SAFETY: nx's dtypes are plain data without padding.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(v)) }.to_vec()
        };
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            let mut a = vec![T::default(); len];
            fold_op(simd, op, &terms, &mut a);
            for (i, &got) in a.iter().enumerate() {
                let column: Vec<T> = terms.iter().map(|t| t[i]).collect();
                let want = T::naive(op, &column);
                assert!(T::same(got, want), "{simd} {} {} at {i}: {got:?}, want {want:?}", T::DTYPE, op.name());
            }
            let mut b = vec![T::default(); len];
            fold_op(Simd::Baseline, op, &terms, &mut b);
            assert_eq!(bytes(&a), bytes(&b), "{simd} {} {}", T::DTYPE, op.name());
        }
    }

    /// [`check`] of three terms of every float dtype and of `i32`: past the loop's block of 512,
    /// specials at different elements in each term, ±0 in every term at every 31st element, and
    /// integers whose sums and products wrap.
    fn check_all(simd: Simd) {
        let specials = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, 1.0e-40, -3.5];
        let term = |k: usize| -> Vec<f32> {
            (0..1031)
                .map(|i| {
                    if i % 97 == k {
                        specials[i % 7]
                    } else if i % 31 == 0 {
                        [0.0, -0.0][(i / 31 + k) % 2]
                    } else {
                        ((i * 7919 + k * 131) % 1009) as f32 * 0.37 - 150.0
                    }
                })
                .collect()
        };
        let f: Vec<Vec<f32>> = (0..3).map(term).collect();
        check(&f, simd);
        check(&f.iter().map(|t| t.iter().map(|&x| f64::from(x) / 3.0).collect::<Vec<f64>>()).collect::<Vec<_>>(), simd);
        check(&f.iter().map(|t| t.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>()).collect::<Vec<_>>(), simd);
        check(&f.iter().map(|t| t.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>()).collect::<Vec<_>>(), simd);
        let ints: Vec<Vec<i32>> =
            f.iter().map(|t| t.iter().map(|&x| (x as i32).wrapping_mul(40_009).wrapping_add(7)).collect()).collect();
        assert!(ints[0]
            .iter()
            .zip(&ints[1])
            .any(|(&a, &b)| i64::from(a) * i64::from(b) != i64::from(a.wrapping_mul(b))));
        check(&ints, simd);
    }

    /// Every level's loops (the baseline on every CPU, the others where the CPU has them) give
    /// the naive reductions' values and the baseline build's bits, specials included.
    #[test]
    fn every_level_follows_the_naive_reductions_with_the_baseline_bits() {
        for simd in Simd::available_levels() {
            check_all(simd);
        }
    }

    /// Hosts of members in any order: the groups by host in the order of their first member.
    #[test]
    fn members_group_by_host_in_order_of_first_member() {
        assert_eq!(by_host([4, 4, 0, 4, 0, 9]), vec![vec![0, 1, 3], vec![2, 4], vec![5]]);
        assert_eq!(by_host([7, 7, 7]), vec![vec![0, 1, 2]]);
        assert_eq!(by_host(std::iter::empty()), Vec::<Vec<usize>>::new());
    }

    /// Across hosts: each host's column reduced naively and rounded, then the host results
    /// naively in host order; one host, or one member a host, the flat reduction's very bits.
    #[test]
    fn a_reduction_across_hosts_reduces_each_host_then_the_hosts() {
        let term = |k: usize| -> Vec<f32> {
            (0..700).map(|i| ((i * 37 + k * 101) % 997) as f32 * 1.0e-3 + 1.0e3 * k as f32).collect()
        };
        let f: Vec<Vec<f32>> = (0..5).map(term).collect();
        let terms: Vec<&[f32]> = f.iter().map(|t| &t[..]).collect();
        let layouts: [Vec<Vec<usize>>; 3] =
            [vec![vec![0, 1], vec![2, 3, 4]], vec![vec![0, 2, 4], vec![1, 3]], vec![vec![0, 1], vec![2], vec![3, 4]]];
        let mut differs = false;
        for groups in &layouts {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max] {
                let mut got = vec![0f32; 700];
                assert!(reduce_grouped(Simd::detected(), op, &terms, groups, &mut got));
                let mut flat = vec![0f32; 700];
                assert!(reduce_into(Simd::detected(), op, &terms, &mut flat));
                for i in 0..700 {
                    let hosts: Vec<f32> = groups
                        .iter()
                        .map(|g| f32::naive(op, &g.iter().map(|&k| f[k][i]).collect::<Vec<f32>>()))
                        .collect();
                    let want = f32::naive(op, &hosts);
                    assert!(f32::same(got[i], want), "{groups:?} {} at {i}: {} want {want}", op.name(), got[i]);
                    differs |= got[i].to_bits() != flat[i].to_bits();
                }
            }
        }
        assert!(differs, "the cases tell the two associations apart");
        for groups in [vec![vec![0, 1, 2, 3, 4]], vec![vec![0], vec![1], vec![2], vec![3], vec![4]]] {
            let (mut a, mut b) = (vec![0f32; 700], vec![0f32; 700]);
            reduce_grouped(Simd::detected(), ReduceOp::Sum, &terms, &groups, &mut a);
            reduce_into(Simd::detected(), ReduceOp::Sum, &terms, &mut b);
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
