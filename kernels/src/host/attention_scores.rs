//! An attention's score program ([`crate::Scores`]) over a tile of pairs: its loads read at the
//! pairs' positions of the loop `[lead…, hq, tq, tk]`, its coordinates from the pairs' indices,
//! its nodes by the register evaluator's functions ([`super::eval::compute`]).

use super::eval::{compute, live, Ptr};
use super::reg::{self, Reg, Src};
use crate::door::Operand;
use crate::layout::{Layout, Move};
use crate::prog::{Node, Prog};
use crate::{Answer, Dtype};

/// A score program bound to its loads over an attention's loop.
pub(crate) struct ScoreProg {
    prog: Prog,
    live: Vec<bool>,
    /// Loads 1…: each one's layout broadcast to the loop, memory and dtype.
    loads: Vec<(Layout, Ptr, Dtype)>,
    /// The loop's lead extents.
    lead: Vec<usize>,
}

/// The pairs of one tile: query rows `rows` (absolute) of head `h` at flat lead index `b`,
/// against the keys at positions `keys`, row-major.
pub(crate) struct Tile<'a> {
    pub(crate) b: usize,
    pub(crate) h: usize,
    pub(crate) rows: std::ops::Range<usize>,
    pub(crate) keys: &'a [usize],
}

impl ScoreProg {
    /// Binds `prog` to `loads` over the loop `shape`; `ShapeMismatch` for a load that does not
    /// broadcast to it.
    pub(crate) fn new(prog: &Prog, loads: &[&dyn Operand], shape: &[usize]) -> Result<ScoreProg, Answer> {
        let loads = loads
            .iter()
            .map(|l| {
                let wide =
                    l.layout().apply(&Move::Expand(shape.to_vec())).ok().flatten().ok_or(Answer::ShapeMismatch)?;
                Ok((wide, Ptr::of(*l), l.dtype()))
            })
            .collect::<Result<Vec<_>, Answer>>()?;
        let lead = shape[..shape.len() - 3].to_vec();
        Ok(ScoreProg { prog: prog.clone(), live: live(prog), loads, lead })
    }

    /// Registers for tiles of up to `cap` pairs.
    pub(crate) fn registers(&self, cap: usize) -> Vec<Reg> {
        self.prog.nodes.iter().map(|(_, t)| Reg::new(*t, cap)).collect()
    }

    /// Runs the program at the pairs of `tile`, `score` holding their scores `s × q·k` (a register
    /// of the accumulator's type, row-major), and answers its two outputs: visibility, then score.
    ///
    /// # Safety
    /// The door's claims on the loads are held.
    pub(crate) unsafe fn run<'r>(&self, regs: &'r mut [Reg], tile: &Tile<'_>, score: Reg) -> (Src<'r>, Src<'r>) {
        let (nk, n) = (tile.keys.len(), tile.rows.len() * tile.keys.len());
        // the lead index's digits, major first
        let mut digits = vec![0usize; self.lead.len()];
        let mut k = tile.b;
        for (d, &e) in self.lead.iter().enumerate().rev() {
            digits[d] = k % e;
            k /= e;
        }
        let r = self.lead.len();
        let mut score = Some(score);
        for i in 0..regs.len() {
            if !self.live[i] {
                continue;
            }
            let (done, rest) = regs.split_at_mut(i);
            let out = &mut rest[0];
            match &self.prog.nodes[i].0 {
                Node::Load(0) => *out = score.take().expect("one score load"),
                Node::Load(j) => {
                    let (l, p, d) = &self.loads[j - 1];
                    let st = l.strides();
                    let base = l.offset()
                        + digits.iter().zip(st).map(|(&x, &s)| x as isize * s).sum::<isize>()
                        + tile.h as isize * st[r];
                    let at: Vec<Option<isize>> = tile
                        .rows
                        .clone()
                        .flat_map(|q| {
                            tile.keys.iter().map(move |&t| Some(base + q as isize * st[r + 1] + t as isize * st[r + 2]))
                        })
                        .collect();
                    // SAFETY: the caller's claims; positions of the load's checked layout, broadcast
                    // to the loop at indices of the loop.
                    unsafe { reg::load_positions(*d, p.0, &at, crate::Value::Int(0), out) }
                }
                Node::Coord(a) => {
                    let Reg::I(v) = out else { unreachable!("coord is i64") };
                    v.clear();
                    let a = *a;
                    v.extend((0..n).map(|e| match a {
                        a if a < r => digits[a] as i64,
                        a if a == r => tile.h as i64,
                        a if a == r + 1 => (tile.rows.start + e / nk) as i64,
                        _ => tile.keys[e % nk] as i64,
                    }));
                }
                node => compute(node, n, |k| done[k].view(), out),
            }
        }
        let (v, s) = (self.prog.outputs[0].0, self.prog.outputs[1].0);
        let regs: &'r [Reg] = regs;
        (regs[v].view(), regs[s].view())
    }
}
