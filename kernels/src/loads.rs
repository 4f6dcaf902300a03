//! Padded and windowed reads of an operand: [`Pad`] (elements before, after and between an
//! axis's, or a crop) and [`Windows`] (the windows a fold reduces), with the shapes they give.
//! The padded operand is never materialised by a fold: a read outside the operand is the fill.

/// Paddings of an operand of rank r: along axis i, `lo[i]` elements of the fill before the
/// operand's, `hi[i]` after and `interior[i]` between neighbours; a negative `lo` or `hi` crops.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Pad {
    /// Elements before each axis's (negative: cropped from its start).
    pub lo: Vec<isize>,
    /// Elements after (negative: cropped from its end).
    pub hi: Vec<isize>,
    /// Elements between neighbours.
    pub interior: Vec<usize>,
}

impl Pad {
    /// No padding of rank `rank`.
    pub fn none(rank: usize) -> Pad {
        Pad { lo: vec![0; rank], hi: vec![0; rank], interior: vec![0; rank] }
    }

    /// `lo` before and `hi` after each axis, nothing between.
    pub fn edges(lo: &[isize], hi: &[isize]) -> Pad {
        Pad { lo: lo.to_vec(), hi: hi.to_vec(), interior: vec![0; lo.len()] }
    }

    /// The padded shape of an operand of `shape`: `lo + n + (n − 1)·interior + hi` along each
    /// axis (`lo + hi` for an empty one).
    ///
    /// # Errors
    /// Why not, in words: lists of another length than the rank, an extent below 0 or past the
    /// address space.
    pub fn shape(&self, shape: &[usize]) -> Result<Vec<usize>, String> {
        let r = shape.len();
        if self.lo.len() != r || self.hi.len() != r || self.interior.len() != r {
            return Err(format!("a padding of rank {} for an operand of rank {r}", self.lo.len()));
        }
        (0..r)
            .map(|d| {
                let n = shape[d] as i128;
                let inner = if n == 0 { 0 } else { n + (n - 1) * self.interior[d] as i128 };
                let e = self.lo[d] as i128 + inner + self.hi[d] as i128;
                usize::try_from(e)
                    .map_err(|_| format!("axis {d} of extent {} padded by {self:?} has extent {e}", shape[d]))
            })
            .collect()
    }

    /// The operand index a padded position `p` of axis `d` reads, or `None` for the fill.
    #[inline(always)]
    pub(crate) fn source(&self, d: usize, p: usize, n: usize) -> Option<usize> {
        let q = p as isize - self.lo[d];
        let step = self.interior[d] as isize + 1;
        if q < 0 || q % step != 0 {
            return None;
        }
        let i = (q / step) as usize;
        (i < n).then_some(i)
    }
}

/// The windows of a fold along each axis: `size` elements `dilation` apart, a window every
/// `stride` elements from 0, as many as fit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Windows {
    /// Elements a window holds along each axis.
    pub size: Vec<usize>,
    /// The step between windows' first elements (at least 1).
    pub stride: Vec<usize>,
    /// The step between a window's elements (at least 1).
    pub dilation: Vec<usize>,
}

impl Windows {
    /// Windows of `size` at stride `stride`, undilated.
    pub fn new(size: &[usize], stride: &[usize]) -> Windows {
        Windows { size: size.to_vec(), stride: stride.to_vec(), dilation: vec![1; size.len()] }
    }

    /// How many windows fit along each axis of a (padded) operand of `shape`: the result's shape.
    ///
    /// # Errors
    /// Why not, in words: lists of another length than the rank, a stride or dilation of 0, an
    /// empty window.
    pub fn shape(&self, shape: &[usize]) -> Result<Vec<usize>, String> {
        let r = shape.len();
        if self.size.len() != r || self.stride.len() != r || self.dilation.len() != r {
            return Err(format!("windows of rank {} for an operand of rank {r}", self.size.len()));
        }
        (0..r)
            .map(|d| {
                let (k, s, g) = (self.size[d], self.stride[d], self.dilation[d]);
                if k == 0 || s == 0 || g == 0 {
                    return Err(format!("axis {d}: window {k}, stride {s}, dilation {g} (each at least 1)"));
                }
                let span =
                    (k - 1).checked_mul(g).and_then(|x| x.checked_add(1)).ok_or("a window past the address space")?;
                Ok(if shape[d] < span { 0 } else { (shape[d] - span) / s + 1 })
            })
            .collect()
    }
}
