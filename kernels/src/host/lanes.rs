//! Lanes: the runs of an array along one axis, one per index of its other axes, as the kernels
//! that work along an axis (scans, sorts, gathers, scatters) walk them.

use crate::layout::Layout;

/// The lanes of a layout along `axis`: lane `k` (in C order of the other axes' indices) starts at
/// [`Lanes::start`]`(k)` and steps by [`Lanes::stride`] for [`Lanes::len`] elements.
#[derive(Debug, Clone)]
pub(crate) struct Lanes {
    /// The other axes' extents and strides, in order.
    outer: Vec<(usize, isize)>,
    offset: isize,
    stride: isize,
    len: usize,
    count: usize,
}

impl Lanes {
    /// The lanes of `layout` along `axis` (an axis of its shape; rank 0 has one lane of one
    /// element along no axis, `axis` then ignored).
    pub(crate) fn new(layout: &Layout, axis: usize) -> Lanes {
        let (shape, strides) = (layout.shape(), layout.strides());
        if shape.is_empty() {
            return Lanes { outer: Vec::new(), offset: layout.offset(), stride: 0, len: 1, count: 1 };
        }
        let outer: Vec<(usize, isize)> =
            (0..shape.len()).filter(|&d| d != axis).map(|d| (shape[d], strides[d])).collect();
        let count = outer.iter().map(|o| o.0).product();
        Lanes { outer, offset: layout.offset(), stride: strides[axis], len: shape[axis], count }
    }

    /// Every element of `layout` as a lane of one, in C order of its indices (a scan's carry: one
    /// element per lane of the operand).
    pub(crate) fn points(layout: &Layout) -> Lanes {
        let outer: Vec<(usize, isize)> = layout.shape().iter().copied().zip(layout.strides().iter().copied()).collect();
        let count = outer.iter().map(|o| o.0).product();
        Lanes { outer, offset: layout.offset(), stride: 0, len: 1, count }
    }

    /// How many lanes there are (the product of the other axes' extents).
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The elements a lane holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The step between a lane's elements, in elements.
    pub(crate) fn stride(&self) -> isize {
        self.stride
    }

    /// The position of lane `k`'s first element.
    pub(crate) fn start(&self, mut k: usize) -> isize {
        let mut at = self.offset;
        for &(n, s) in self.outer.iter().rev() {
            at += (k % n) as isize * s;
            k /= n;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_walk_every_element_once_in_c_order_of_the_other_axes() {
        // [2, 3, 4] C-contiguous, along axis 1: lanes (i, k) start at 12 i + k, step 4
        let l = Layout::contiguous(&[2, 3, 4]).unwrap();
        let lanes = Lanes::new(&l, 1);
        assert_eq!((lanes.count(), lanes.len(), lanes.stride()), (8, 3, 4));
        let starts: Vec<isize> = (0..8).map(|k| lanes.start(k)).collect();
        assert_eq!(starts, [0, 1, 2, 3, 12, 13, 14, 15]);
        // a strided, offset layout: [3, 2] at strides [1, 5] from 7, along axis 0
        let l = Layout::new(vec![3, 2], vec![1, 5], 7).unwrap();
        let lanes = Lanes::new(&l, 0);
        assert_eq!((lanes.count(), lanes.len(), lanes.stride(), lanes.start(1)), (2, 3, 1, 12));
        let scalar = Lanes::new(&Layout::contiguous(&[]).unwrap(), 0);
        assert_eq!((scalar.count(), scalar.len(), scalar.start(0)), (1, 1, 0));
        let empty = Lanes::new(&Layout::contiguous(&[0, 5]).unwrap(), 1);
        assert_eq!((empty.count(), empty.len()), (0, 5));
    }
}
