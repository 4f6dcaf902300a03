//! Padded and windowed reads of an operand: [`Pad`] (elements before, after and between an
//! axis's, or a crop) and [`Windows`] (the windows a fold reduces), with the shapes they give,
//! and [`Load`], an operand of a loop together with how the loop reads it (maps and reductions
//! take loads: convolution- and pooling-shaped work). The padded operand is never materialised:
//! a read outside the operand is the fill.

use crate::door::Operand;
use crate::Value;

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

/// A loop's operand together with how the loop reads it ([`crate::Kernels::map_loads`],
/// [`crate::Kernels::reduce_loads`]).
///
/// ```
/// use nx_kernels::loads::{Load, Pad, Windows};
/// use nx_kernels::{Array, Value};
/// use nx_mesh::Device;
///
/// // a 3 x 3 operand padded by one zero on every side, read as its 2 x 2 windows at stride 2:
/// // a load of shape [2, 2, 2, 2] (the windows' indices, then their elements')
/// let x = Array::<f32>::from_vec(Device::sim(0), &[3, 3], vec![1.0; 9])?;
/// let (pad, windows) = (Pad::edges(&[1, 1], &[1, 1]), Windows::new(&[2, 2], &[2, 2]));
/// let load = Load::padded(&x, &pad, Value::Float(0.0), Some(&windows));
/// assert_eq!(load.shape()?, vec![2, 2, 2, 2]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub enum Load<'a> {
    /// The operand as it lies, broadcast to the loop (numpy's rules).
    Plain(&'a dyn Operand),
    /// The operand padded, then read through windows where given.
    Padded(Padded<'a>),
}

/// A padded read of an operand: `pad` puts `fill` (as the operand's dtype converts it) around
/// and between its elements, or crops; then, where `windows` are given, the load is the windows
/// of the padded operand, of shape `[counts…, sizes…]` as [`crate::Move::Window`] lays them out.
/// Its shape ([`Load::shape`]) broadcasts to the loop as a plain operand's does.
#[derive(Clone, Copy)]
pub struct Padded<'a> {
    /// The operand.
    pub operand: &'a dyn Operand,
    /// Its padding.
    pub pad: &'a Pad,
    /// The padding's elements.
    pub fill: Value,
    /// The windows read, or `None` for the padded operand itself.
    pub windows: Option<&'a Windows>,
}

impl<'a> Load<'a> {
    /// A padded (and, with `windows`, windowed) load of `operand`.
    pub fn padded(operand: &'a dyn Operand, pad: &'a Pad, fill: Value, windows: Option<&'a Windows>) -> Load<'a> {
        Load::Padded(Padded { operand, pad, fill, windows })
    }

    /// The array the load reads.
    pub fn operand(&self) -> &'a dyn Operand {
        match self {
            Load::Plain(o) => *o,
            Load::Padded(p) => p.operand,
        }
    }

    /// The shape the loop reads: the operand's, or [`padded_shape`]'s.
    ///
    /// # Errors
    /// Why a padding or windows do not fit the operand, in words.
    pub fn shape(&self) -> Result<Vec<usize>, String> {
        match self {
            Load::Plain(o) => Ok(o.layout().shape().to_vec()),
            Load::Padded(p) => padded_shape(p.pad, p.windows, p.operand.layout().shape()),
        }
    }
}

/// The shape of an operand of `shape` padded by `pad` and, where given, read through `windows`
/// (the reference's `Shape.padded`): [`Pad::shape`], then the windows' counts
/// ([`Windows::shape`]) followed by their sizes (twice the rank).
///
/// # Errors
/// Why not, in words: a padding or windows of another rank, an extent below 0 or past the address
/// space, an empty window or a step of 0, or windows of more than half [`crate::MAX_RANK`] axes.
pub fn padded_shape(pad: &Pad, windows: Option<&Windows>, shape: &[usize]) -> Result<Vec<usize>, String> {
    let padded = pad.shape(shape)?;
    let Some(w) = windows else { return Ok(padded) };
    if 2 * shape.len() > crate::MAX_RANK {
        return Err(format!("windows of an operand of rank {}: at most {} axes", shape.len(), crate::MAX_RANK / 2));
    }
    let counts = w.shape(&padded)?;
    Ok(counts.into_iter().chain(w.size.iter().copied()).collect())
}
