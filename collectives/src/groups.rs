//! [`Groups`]: the sub-communicators a plan's steps meet in, split once and reused.
//!
//! Splitting is a collective of the parent communicator (and under MPI a `MPI_Comm_split`, tens of
//! microseconds): a training step placing the same values each iteration would pay it per step
//! and per plan step. A cache keyed by what every rank computes alike — the groups as world ranks
//! and their mesh axes — hits or misses on every rank at once, so a hit issues nothing and a miss
//! splits on every rank. Ranks that disagree about the plan still meet in an error: one that
//! splits meets the other's next collective, a mismatch naming both.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use crate::{Communicator, Result};

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
    /// these groups (a collective of `comm`: every rank calls it), reused after.
    ///
    /// # Errors
    /// As [`Communicator::split_over`].
    #[track_caller]
    pub fn get(&self, comm: &C, groups: &[Vec<usize>], axes: &[String]) -> Result<Rc<Option<C>>> {
        let hit = self.cache.borrow().iter().find(|(k, _)| k.0 == groups && k.1 == axes).map(|(_, c)| c.clone());
        if let Some(c) = hit {
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
