//! The assemble kernel: pieces written into one result at their offsets, in order (bits copied).

use rayon::prelude::*;

use super::eval::Ptr;
use super::lanes::Lanes;
use super::{overlaps, through_door};
use crate::door::Operand;
use crate::Answer;

pub(crate) fn assemble(
    par: &std::sync::Arc<super::par::Par>,
    dst: &dyn Operand,
    pieces: &[(&[usize], &dyn Operand)],
) -> Answer {
    if pieces.iter().any(|(_, p)| p.dtype() != dst.dtype()) {
        return Answer::WrongDtype;
    }
    let offsets: Vec<Vec<usize>> = pieces.iter().map(|(o, _)| o.to_vec()).collect();
    let read: Vec<&dyn Operand> = pieces.iter().map(|(_, p)| *p).collect();
    through_door(par, "assemble", None, &[dst], &read, move |w, r, execute| {
        let dst = w[0];
        let shape = dst.layout().shape();
        for (o, p) in offsets.iter().zip(r) {
            let ps = p.layout().shape();
            let fits = o.len() == shape.len()
                && ps.len() == shape.len()
                && (0..shape.len()).all(|d| o[d].checked_add(ps[d]).is_some_and(|end| end <= shape[d]));
            if !fits {
                return Answer::ShapeMismatch;
            }
        }
        if !dst.layout().is_contiguous() {
            return Answer::Declined;
        }
        // the first piece may be the result itself, where it is the whole result; no other
        let size = dst.dtype().size();
        let own = |p: &dyn Operand| {
            p.buffer().memory_id() == dst.buffer().memory_id()
                && crate::door::identical(p.layout(), size, dst.layout(), size)
        };
        for (k, p) in r.iter().enumerate() {
            if overlaps(dst, *p) && !(k == 0 && own(*p) && offsets[0].iter().all(|&o| o == 0)) {
                return Answer::Overlapping;
            }
        }
        if !execute {
            return Answer::Done;
        }
        let dp = Ptr::of(dst);
        let rank = shape.len();
        let strides: Vec<usize> = (0..rank).map(|d| shape[d + 1..].iter().product()).collect();
        for (o, p) in offsets.iter().zip(r) {
            let l = p.layout();
            if own(*p) {
                continue; // the result's own elements, where they are
            }
            let base = dst.layout().offset() as usize + o.iter().zip(&strides).map(|(a, s)| a * s).sum::<usize>();
            let lanes = Lanes::new(l, rank.saturating_sub(1));
            let (n, step) = (lanes.len(), lanes.stride());
            let outer: Vec<usize> = l.shape()[..rank.saturating_sub(1)].to_vec();
            let sp = Ptr::of(*p);
            (0..lanes.count()).into_par_iter().with_min_len(64).for_each(|k| {
                // the lane's index along the outer axes, into the result's position
                let (mut rest, mut at) = (k, base);
                for d in (0..outer.len()).rev() {
                    at += (rest % outer[d]) * strides[d];
                    rest /= outer[d];
                }
                let from = sp.byte(lanes.start(k) * size as isize);
                let to = dp.byte((at * size) as isize);
                // SAFETY: the door holds the claims; positions come from the checked layouts and the
                // checked box; lane k of this piece is written by this task alone (pieces go in
                // order, one after another), apart from the piece (the door refuses overlap).
                unsafe {
                    if step == 1 || n <= 1 {
                        std::ptr::copy_nonoverlapping(from, to, n * size);
                    } else {
                        for t in 0..n {
                            std::ptr::copy_nonoverlapping(
                                from.wrapping_offset(t as isize * step * size as isize),
                                to.add(t * size),
                                size,
                            );
                        }
                    }
                }
            });
        }
        Answer::Done
    })
}
