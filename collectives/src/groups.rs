//! [`Groups`]: the sub-communicators a plan's steps meet in, split once and reused.
//!
//! Splitting is a collective of the parent communicator (and under MPI a `MPI_Comm_split`, tens of
//! microseconds): a training step placing the same values each iteration would pay it per step
//! and per plan step. A cache keyed by what every rank computes alike — the groups as world ranks
//! and their mesh axes — hits or misses on every rank at once. A hit still agrees on the key with
//! one all-gather of its hash on the parent (under MPI's shared path about 2 µs), so ranks that
//! disagree about the groups meet in an error naming both, checked or not, never in collectives
//! of different communicators: ranks that hit with different keys see each other's hashes, and a
//! rank that misses calls `split` where the others call `all_gather`, a mismatch.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use crate::{Communicator, Error, Result};

/// A cache of one communicator's sub-communicators, keyed by their groups (world ranks) and mesh
/// axes; at most [`Groups::CAPACITY`] kept, the oldest dropped first (the same on every rank, as
/// every rank asks for the same groups in the same order).
///
/// ```
/// use nx_collectives::{sim, Communicator, Groups};
///
/// sim::run(4, Default::default(), |c| -> nx_collectives::Result<()> {
///     let groups = Groups::new();
///     let pairs = vec![vec![0, 1], vec![2, 3]];
///     let g = groups.get(&c, &pairs, &["dp".to_string()])?;
///     assert_eq!(g.as_ref().as_ref().map(|g| g.size()), Some(2));
///     // the second time, the same communicator, without a collective
///     let again = groups.get(&c, &pairs, &["dp".to_string()])?;
///     assert!(std::rc::Rc::ptr_eq(&g, &again));
///     Ok(())
/// })?;
/// # Ok::<(), nx_collectives::Error>(())
/// ```
pub struct Groups<C> {
    cache: RefCell<VecDeque<(Key, Rc<Option<C>>)>>,
}

/// Groups as world ranks, and the mesh axes they span.
type Key = (Vec<Vec<usize>>, Vec<String>);

/// A hash of a key, the same in every process (FNV-1a over its numbers and bytes).
fn key_hash(groups: &[Vec<usize>], axes: &[String]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(groups.len() as u64);
    for g in groups {
        eat(g.len() as u64);
        g.iter().for_each(|&r| eat(r as u64));
    }
    for a in axes {
        eat(a.len() as u64);
        a.bytes().for_each(|b| eat(u64::from(b)));
    }
    h
}

impl<C> std::fmt::Debug for Groups<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Groups({} cached)", self.cache.borrow().len())
    }
}

impl<C> Default for Groups<C> {
    fn default() -> Self {
        Groups { cache: RefCell::new(VecDeque::new()) }
    }
}

impl<C: Communicator> Groups<C> {
    /// The most sub-communicators kept.
    pub const CAPACITY: usize = 64;

    /// An empty cache.
    pub fn new() -> Groups<C> {
        Groups::default()
    }

    /// The sub-communicator of `comm` over the group of `groups` (disjoint lists of world ranks,
    /// each in its members' order, the same on every rank of `comm`) that holds this rank, spanning
    /// mesh axes `axes`; `None` inside the `Rc` where no group holds it. Split on the first call for
    /// these groups (a collective of `comm`: every rank calls it), reused after (with one
    /// all-gather of the key's hash, so that ranks asking for different groups fail).
    ///
    /// # Errors
    /// As [`Communicator::split_over`]; [`Error::Mismatch`] naming this rank and one that asked for
    /// other groups.
    #[track_caller]
    pub fn get(&self, comm: &C, groups: &[Vec<usize>], axes: &[String]) -> Result<Rc<Option<C>>> {
        let hit = self.cache.borrow().iter().find(|(k, _)| k.0 == groups && k.1 == axes).map(|(_, c)| c.clone());
        if let Some(c) = hit {
            let mine = key_hash(groups, axes);
            let mut all = vec![0u64; comm.size()];
            // logged as a split: a plan's steps do not count it
            let mut agree = || comm.all_gather(&[mine], &mut all);
            match comm.recorder() {
                Some(r) => r.as_split(agree)?,
                None => agree()?,
            }
            if let Some(q) = all.iter().position(|&h| h != mine) {
                return Err(Error::Mismatch {
                    rank_a: comm.world_rank(),
                    call_a: format!("a step over groups {groups:?} (axes {axes:?})"),
                    rank_b: q,
                    call_b: format!("a step over other groups (key hash {:#x}, not {mine:#x})", all[q]),
                });
            }
            return Ok(c);
        }
        let me = comm.world_rank();
        let (color, key) = groups
            .iter()
            .enumerate()
            .find_map(|(g, m)| m.iter().position(|&r| r == me).map(|p| (Some(g), p)))
            .unwrap_or((None, 0));
        let sub = Rc::new(comm.split_over(color, key, axes)?);
        let mut cache = self.cache.borrow_mut();
        if cache.len() == Self::CAPACITY {
            cache.pop_front();
        }
        cache.push_back(((groups.to_vec(), axes.to_vec()), sub.clone()));
        Ok(sub)
    }

    /// How many sub-communicators are kept.
    pub fn len(&self) -> usize {
        self.cache.borrow().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
