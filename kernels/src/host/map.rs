//! The map kernel.

use super::eval::{reads, Bound, Ptr};
use super::fused::{Float, Fused, LANES};
use super::{reg, through_door, Work};
use crate::door::Operand;
use crate::loads::Load;
use crate::prog::{map_refusal, Prog};
use crate::Answer;

/// The most indices of one task.
const TASK: usize = 1 << 16;
const BLOCK: usize = 2048;
/// Output bytes from which a map stores with streaming stores.
pub(crate) const STREAM_MIN: usize = 8 << 20;

pub(crate) fn map(
    par: &std::sync::Arc<super::par::Par>,
    prog: &Prog,
    shape: &[usize],
    dsts: &[&dyn Operand],
    loads: &[Load<'_>],
) -> Answer {
    let dt: Vec<_> = dsts.iter().map(|d| d.dtype()).collect();
    let lt: Vec<_> = loads.iter().map(|l| l.operand().dtype()).collect();
    if let Some((answer, _)) = map_refusal(prog, shape.len(), &dt, &lt) {
        return answer;
    }
    let (prog, shape, reads) = (prog.clone(), shape.to_vec(), reads(loads));
    let loads: Vec<&dyn Operand> = loads.iter().map(Load::operand).collect();
    let n = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b)).unwrap_or(usize::MAX);
    let task = if par.inline(Work::Map, n) {
        n.max(1)
    } else {
        n.div_ceil(par.threads().saturating_mul(4)).clamp(BLOCK, TASK)
    };
    let simd = par.simd();
    through_door(par, "map", Some((Work::Map, n)), dsts, &loads, move |dsts, loads, execute| {
        let (prog, shape) = (&prog, &shape[..]);
        if dsts.iter().any(|d| d.layout().shape() != shape) {
            return Answer::ShapeMismatch;
        }
        if dsts.iter().any(|d| !d.layout().is_contiguous()) {
            return Answer::Declined;
        }
        let perm: Vec<usize> = (0..shape.len()).collect();
        let bound = match Bound::new(prog, shape, &perm, loads, &reads) {
            Ok(b) => b,
            Err(a) => return a,
        };
        if !execute {
            return Answer::Done;
        }
        let outs: Vec<(Ptr, isize, crate::Dtype)> =
            dsts.iter().map(|d| (Ptr::of(*d), d.layout().offset(), d.dtype())).collect();
        let dtypes: Vec<_> = outs.iter().map(|o| o.2).collect();
        if let Some(f) = Fused::<f32>::new(simd, &bound, &dtypes) {
            run(&bound, Some(&f), &outs, task);
        } else if let Some(f) = Fused::<f64>::new(simd, &bound, &dtypes) {
            run(&bound, Some(&f), &outs, task);
        } else {
            run::<f32>(&bound, None, &outs, task);
        }
        Answer::Done
    })
}

/// Runs the loop in tasks of `task` indices over the rayon pool (one task: on the calling
/// thread): runs of [`LANES`] through `fused` where given, the rest (and everything where not)
/// through the register evaluator.
fn run<T: Float>(bound: &Bound<'_>, fused: Option<&Fused<T>>, outs: &[(Ptr, isize, crate::Dtype)], task: usize) {
    let n = bound.numel();
    // Outputs far past the caches go to memory with streaming stores: their lines are not read
    // first, and do not evict the operands.
    let out_bytes: usize = outs.iter().map(|o| o.2.size() * n).sum();
    let streaming = out_bytes >= STREAM_MIN;
    let lanes_outs: Vec<(Ptr, isize)> = outs.iter().map(|o| (o.0, o.1)).collect();
    // registers made once per worker, not per task; the register evaluator's only where a run
    // reaches it (a fused loop's tail, or no fused loop)
    let tasks = n.div_ceil(task);
    super::par::for_each_init(
        tasks <= 1,
        tasks,
        1,
        || (None, fused.map(Fused::registers)),
        |(regs, lanes), t| {
            let end = ((t + 1) * task).min(n);
            let mut start = t * task;
            if let (Some(f), Some(lanes)) = (fused, lanes) {
                let whole = start + (end - start) / LANES * LANES;
                // SAFETY: the door holds every claim for the whole call; this task writes the
                // destinations' elements start..end alone.
                unsafe { f.run(lanes, start, whole, &lanes_outs, streaming) };
                start = whole;
            }
            while start < end {
                let len = BLOCK.min(end - start);
                let regs = regs.get_or_insert_with(|| bound.registers(BLOCK));
                // SAFETY: as above.
                unsafe {
                    bound.eval(start, len, regs);
                    for (i, &(p, off, d)) in outs.iter().enumerate() {
                        let r = bound.output(regs, i, start, len);
                        if d.is_packed() {
                            reg::store_packed(r, d, p.byte(0), off + start as isize);
                        } else {
                            reg::store(r, d, p.at(d, off + start as isize), streaming);
                        }
                    }
                }
                start += len;
            }
            if streaming {
                reg::fence();
            }
        },
    );
}
