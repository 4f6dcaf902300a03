//! Faults injected into a simulated world, passed in its options (never global): rank `rank`
//! fails, panics, stalls or is delayed at its `at`-th call — counted from 0 over every
//! communicator of the world, as the rank's collective log would list its calls from the start
//! of the run: collectives, splits (`place` splits once for each step that meets in groups),
//! sends and receives. Its peers see what a real run shows: the rank named, and released at once
//! (a failure or panic) or after their timeout (a stall).

use std::time::Duration;

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The collective returns [`crate::Error::Injected`] on that rank (its body then fails).
    Fail,
    /// The rank panics in the collective.
    Panic,
    /// The rank stops before the call: it never arrives, its peers time out naming it, and it
    /// returns [`crate::Error::Injected`] once every peer has left (or after three timeouts and a
    /// second, whichever comes first).
    Stall,
    /// The rank sleeps this long, then calls the collective.
    Delay(Duration),
}

/// A fault injected at one rank's `at`-th collective.
///
/// # Examples
///
/// ```
/// use nx_collectives::sim::{self, Fault, FaultKind, SimOptions};
/// use nx_collectives::{Communicator, Error};
///
/// let opts = SimOptions { faults: vec![Fault { rank: 2, at: 1, kind: FaultKind::Fail }], ..Default::default() };
/// let e = sim::run(3, opts, |c| {
///     c.barrier()?;
///     c.barrier() // rank 2 fails here; ranks 0 and 1 are told at once
/// })
/// .unwrap_err();
/// assert!(matches!(e, Error::RankFailed { rank: 2, .. }), "{e}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The world rank.
    pub rank: usize,
    /// Which of its calls, from 0.
    pub at: usize,
    /// What happens.
    pub kind: FaultKind,
}
