//! Contractions' attributes: the axis pairs ([`Contraction`]), block scales of an operand
//! ([`Scale`], [`Factor`]), segments cutting a contraction into groups ([`Segments`]), and which
//! dtypes a contraction computes in ([`accumulates`], [`contraction_accumulator`]).

use crate::door::Operand;
use crate::Dtype;

/// A general contraction of `a` with `b`: the batch pairs, then the contracting pairs (axis of
/// `a`, axis of `b`), each pair of one extent. The result's axes are the batch pairs, then `a`'s
/// free axes, then `b`'s, each in its operand's order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Contraction {
    /// Axes summed over: (axis of `a`, axis of `b`).
    pub contracting: Vec<(usize, usize)>,
    /// Axes kept and paired: (axis of `a`, axis of `b`).
    pub batch: Vec<(usize, usize)>,
}

impl Contraction {
    /// Batched matrix product: `a [.., m, k] · b [.., k, n]`, the leading `batch` axes paired.
    pub fn matmul(batch: usize) -> Contraction {
        Contraction { contracting: vec![(batch + 1, batch)], batch: (0..batch).map(|i| (i, i)).collect() }
    }

    /// The result's shape for operands of shapes `a` and `b`, or why they do not fit.
    ///
    /// # Errors
    /// Why not, in words: an axis past an operand's rank or in two pairs, or a pair of two extents.
    pub fn shape(&self, a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
        let pairs = self.batch.iter().chain(&self.contracting);
        let (mut used_a, mut used_b) = (vec![false; a.len()], vec![false; b.len()]);
        for &(x, y) in pairs {
            if x >= a.len() || y >= b.len() {
                return Err(format!("pair ({x}, {y}) is past the operands' ranks {} and {}", a.len(), b.len()));
            }
            if std::mem::replace(&mut used_a[x], true) || std::mem::replace(&mut used_b[y], true) {
                return Err(format!("axis pair ({x}, {y}) repeats an axis"));
            }
            if a[x] != b[y] {
                return Err(format!("pair ({x}, {y}) has extents {} and {}", a[x], b[y]));
            }
        }
        let mut out: Vec<usize> = self.batch.iter().map(|&(x, _)| a[x]).collect();
        out.extend((0..a.len()).filter(|&i| !used_a[i]).map(|i| a[i]));
        out.extend((0..b.len()).filter(|&i| !used_b[i]).map(|i| b[i]));
        Ok(out)
    }
}

/// The axes of a contraction's operands by role, each list in its operand's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Axes {
    pub batch_a: Vec<usize>,
    pub batch_b: Vec<usize>,
    pub con_a: Vec<usize>,
    pub con_b: Vec<usize>,
    pub free_a: Vec<usize>,
    pub free_b: Vec<usize>,
}

impl Contraction {
    /// The operands' axes by role, for operands of ranks `ra` and `rb` (the pairs checked).
    pub(crate) fn axes(&self, ra: usize, rb: usize) -> Axes {
        let batch_a: Vec<usize> = self.batch.iter().map(|p| p.0).collect();
        let batch_b: Vec<usize> = self.batch.iter().map(|p| p.1).collect();
        let con_a: Vec<usize> = self.contracting.iter().map(|p| p.0).collect();
        let con_b: Vec<usize> = self.contracting.iter().map(|p| p.1).collect();
        let free_a = (0..ra).filter(|x| !batch_a.contains(x) && !con_a.contains(x)).collect();
        let free_b = (0..rb).filter(|x| !batch_b.contains(x) && !con_b.contains(x)).collect();
        Axes { batch_a, batch_b, con_a, con_b, free_a, free_b }
    }

    /// The result's shape and the ids' shape of the contraction cut by `segments`, for operands
    /// of shapes `a` and `b`: for [`Segments::Rows`] the plain result without `b`'s `b_axis`, for
    /// [`Segments::Contracting`] the plain result after a leading axis of `groups`; the ids are
    /// the batch extents then the segmented axis's.
    ///
    /// # Examples
    /// ```
    /// use nx_kernels::{Contraction, Segments};
    /// // tokens [t, k] against experts [g, k, n], each token's expert by its id
    /// let spec = Contraction { contracting: vec![(1, 1)], batch: vec![] };
    /// let (out, ids) = spec.segmented_shape(&[10, 4], &[3, 4, 5], &Segments::Rows { a_axis: 0, b_axis: 0 }).unwrap();
    /// assert_eq!((out, ids), (vec![10, 5], vec![10]));
    /// // a [10, 4] · b [4, 5], the contracting axis cut into 2 groups
    /// let (out, ids) = Contraction::matmul(0)
    ///     .segmented_shape(&[10, 4], &[4, 5], &Segments::Contracting { pair: (1, 0), groups: 2 })
    ///     .unwrap();
    /// assert_eq!((out, ids), (vec![2, 10, 5], vec![4]));
    /// ```
    ///
    /// # Errors
    /// Why not, in words: as [`Contraction::shape`], or a segmented axis that is not a free axis
    /// (`Rows`) or not one of the contracting pairs (`Contracting`).
    pub fn segmented_shape(
        &self,
        a: &[usize],
        b: &[usize],
        segments: &Segments,
    ) -> Result<(Vec<usize>, Vec<usize>), String> {
        let plain = self.shape(a, b)?;
        let axes = self.axes(a.len(), b.len());
        let mut ids: Vec<usize> = self.batch.iter().map(|&(x, _)| a[x]).collect();
        match *segments {
            Segments::Rows { a_axis, b_axis } => {
                if !axes.free_a.contains(&a_axis) {
                    return Err(format!("rows axis {a_axis} is not a free axis of a (free: {:?})", axes.free_a));
                }
                let Some(at) = axes.free_b.iter().position(|&x| x == b_axis) else {
                    return Err(format!("group axis {b_axis} is not a free axis of b (free: {:?})", axes.free_b));
                };
                ids.push(a[a_axis]);
                let mut out = plain;
                out.remove(self.batch.len() + axes.free_a.len() + at);
                Ok((out, ids))
            }
            Segments::Contracting { pair, groups } => {
                if !self.contracting.contains(&pair) {
                    return Err(format!("segmented pair {pair:?} is not a contracting pair ({:?})", self.contracting));
                }
                ids.push(a[pair.0]);
                let mut out = vec![groups];
                out.extend(plain);
                Ok((out, ids))
            }
        }
    }
}

/// A block scale of a contraction operand: an array of the operand's rank, each extent dividing
/// the operand's (0 only along an empty axis). The operand's element at index `i` is in the scale
/// block `i / ratio`, axis by axis, the ratio being the two extents' quotient; the kernel applies
/// a scale by the operand's own index, whatever its layout. The caller must not pass an array's
/// scale for a view that cuts an axis within its scale blocks (the blocks would no longer line
/// up with the view's indices).
#[derive(Clone, Copy)]
pub enum Scale<'a> {
    /// `u8` codes, the MX formats' scales: `e` scales its block by `2^(e − 127)` (exactly), and
    /// 255 makes it NaN. Float and complex accumulators only.
    Exponent(&'a dyn Operand),
    /// Each scale read in its own dtype into the accumulator (a dtype that converts into it
    /// exactly), the element multiplied by it there.
    Value(&'a dyn Operand),
}

impl<'a> Scale<'a> {
    /// The array of scales.
    pub fn array(&self) -> &'a dyn Operand {
        match *self {
            Scale::Exponent(a) | Scale::Value(a) => a,
        }
    }
}

/// A contraction's operand: an array, through any layout, and its block scale, if any. Its
/// element at an index is the array's times its scale block's scale, in the accumulator.
#[derive(Clone, Copy)]
pub struct Factor<'a> {
    /// The elements.
    pub array: &'a dyn Operand,
    /// Their block scale; none multiplies by nothing (not even by 1).
    pub scale: Option<Scale<'a>>,
}

impl<'a> Factor<'a> {
    /// The operand `array`, unscaled.
    pub fn plain(array: &'a dyn Operand) -> Factor<'a> {
        Factor { array, scale: None }
    }

    /// The operand `array` scaled by `scale`.
    pub fn scaled(array: &'a dyn Operand, scale: Scale<'a>) -> Factor<'a> {
        Factor { array, scale: Some(scale) }
    }
}

/// A contraction cut into groups by ids: an `i64` array of the batch extents then the segmented
/// axis's ([`Contraction::segmented_shape`]). At each batch index, the segmented axis's index `r`
/// is in group `ids[.., r]` where that lies in `[0, g)`, and in no group otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Segments {
    /// `a`'s free axis `a_axis` is segmented; `b`'s free axis `b_axis`, of extent `g`, leaves the
    /// result: index `r` along `a_axis` multiplies `b`'s index `ids[.., r]` along `b_axis` (the
    /// grouped matmul of a mixture of experts). An output whose row is in no group has no
    /// products.
    Rows {
        /// The segmented free axis of `a`.
        a_axis: usize,
        /// The free axis of `b` the ids index.
        b_axis: usize,
    },
    /// The contracting pair `pair` is segmented on both sides into `groups` groups. The result
    /// gains a leading axis of `groups`, slice `e` summing group `e`'s indices alone, its products
    /// numbered by their order among the group's indices; a group of no index has no products.
    Contracting {
        /// One of the contraction's contracting pairs.
        pair: (usize, usize),
        /// The number of groups, `g`.
        groups: usize,
    },
}

/// Segments with their ids, for [`crate::Kernels::contract_general`].
#[derive(Clone, Copy)]
pub struct Segmented<'a> {
    /// How the contraction is cut.
    pub segments: Segments,
    /// The group of each index of the segmented axis, per batch index (`i64`).
    pub ids: &'a dyn Operand,
}

/// Whether a contraction computes in `d`: every dtype but `bool` and the floats narrower than
/// `f32` (`f16`, `bf16`, the fp8s).
///
/// # Examples
/// ```
/// use nx_kernels::{accumulates, Dtype};
/// assert!(accumulates(Dtype::I8) && accumulates(Dtype::F32) && accumulates(Dtype::C64));
/// assert!(!accumulates(Dtype::BF16) && !accumulates(Dtype::Bool));
/// ```
pub fn accumulates(d: Dtype) -> bool {
    !matches!(d, Dtype::Bool | Dtype::F16 | Dtype::BF16 | Dtype::F8E4M3 | Dtype::F8E5M2)
}

/// The dtype a contraction into a destination of dtype `d` computes in: `d` where it
/// [`accumulates`], its float carrier for a narrow float (`f32`), none for `bool`.
///
/// # Examples
/// ```
/// use nx_kernels::{contraction_accumulator, Dtype};
/// assert_eq!(contraction_accumulator(Dtype::F16), Some(Dtype::F32));
/// assert_eq!(contraction_accumulator(Dtype::I32), Some(Dtype::I32));
/// assert_eq!(contraction_accumulator(Dtype::Bool), None);
/// ```
pub fn contraction_accumulator(d: Dtype) -> Option<Dtype> {
    match d {
        Dtype::Bool => None,
        d if accumulates(d) => Some(d),
        d => crate::float_carrier(d),
    }
}

/// Whether an operand or a `Value` scale of dtype `x` converts exactly into the accumulator
/// `acc`: the same dtype, an integer whose range `acc`'s holds, a real float into a real float
/// at least as wide (`f16` and `bf16` into `f32` or `f64`, an fp8 into any wider float), `c64`
/// into `c128`.
///
/// # Examples
/// ```
/// use nx_kernels::{widens_into, Dtype};
/// assert!(widens_into(Dtype::I8, Dtype::I32) && widens_into(Dtype::U8, Dtype::I16));
/// assert!(widens_into(Dtype::BF16, Dtype::F32) && widens_into(Dtype::C64, Dtype::C128));
/// assert!(!widens_into(Dtype::I32, Dtype::U32) && !widens_into(Dtype::F64, Dtype::F32));
/// assert!(!widens_into(Dtype::I8, Dtype::F32) && !widens_into(Dtype::Bool, Dtype::I32));
/// ```
pub fn widens_into(x: Dtype, acc: Dtype) -> bool {
    use Dtype::*;
    if x == acc {
        return true;
    }
    match (x, acc) {
        (Bool, _) | (_, Bool) => false,
        (F16 | BF16, F32 | F64) | (F32, F64) | (C64, C128) => true,
        (F8E4M3 | F8E5M2, F16 | BF16 | F32 | F64) => true,
        _ => match (x.int_range(), acc.int_range()) {
            (Some((lo, hi)), Some((alo, ahi))) => alo <= lo && hi <= ahi,
            _ => false,
        },
    }
}
