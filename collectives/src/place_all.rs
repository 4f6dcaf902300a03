//! Executing many plans at once, with the closings of partial sums over the same groups fused
//! into one all-reduce each (the gradient buckets of data parallelism).
//!
//! A plan that is one all-reduce (a partial value closed where it lies: a gradient summed over
//! `dp`) joins the bucket of the plans whose all-reduce has the same groups: each rank copies its
//! windows of a bucket end to end into one message, closes it with one all-reduce over its group,
//! and copies each window's part back out. A sum's association is per element (term order, term
//! 0 first: see the crate's determinism contract), so each value gets the same bits as its own
//! all-reduce would give. Every other plan runs on its own, as [`place_in`] runs it, in the order
//! given; the buckets run after them, in the order of their first plan, each of at most
//! [`BUCKET_BYTES`] of values (a larger value alone).

use nx_placement::region::volume;
use nx_placement::{Op, Plan};

use crate::log::{traffic, Op as Call};
use crate::place::{owned, place_in, Alloc};
use crate::{Communicator, Error, Groups, ReduceOp, Reducible, Result};

/// A bucket's key (its all-reduce's groups, as world ranks, and mesh axes), its values' indices
/// and their global bytes.
type Bucket<'p> = ((Vec<Vec<usize>>, &'p [String]), Vec<usize>, usize);

/// The most global bytes of the values of one bucket (a value larger goes alone): bounds each
/// message (MPI's counts, and the memory a bucket's message and result take beside the values),
/// as DDP's 25 MiB buckets do.
pub const BUCKET_BYTES: usize = 32 << 20;

/// Whether `plan` is one all-reduce whose windows stay as they are.
fn one_all_reduce(plan: &Plan) -> bool {
    matches!(plan.steps.as_slice(), [s] if s.op == Op::AllReduce) && plan.old == plan.new
}

/// Runs each of `plans` on this rank's window of its value (`locals[i]` for `plans[i]`, as
/// [`place_in`] takes it), closing the values whose plan is one all-reduce over the same groups in
/// one all-reduce; answers each value's window at its plan's `to`, in the order of `plans`. Every
/// rank of `comm` calls it with the same plans in the same order.
///
/// ```
/// use nx_collectives::{place_all_in, sim, Communicator, Groups};
/// use nx_kernels::rig::Rig;
/// use nx_placement::{plan, Device, Devices, MeshSpec, Placement, PlacementSpec};
///
/// // two partial sums over 2 devices closed (both all-reduces over the same group: one call)
/// let got = sim::run(2, Default::default(), |c| -> nx_collectives::Result<Vec<Vec<f32>>> {
///     let rig = Rig::host(Device::sim(c.rank()))?;
///     let pl = |n: usize| {
///         Devices::with(Device::sims(2), |set| {
///             let mesh = MeshSpec::new(&[("x", 2)]).unwrap().over(&set).unwrap();
///             let sum = "partial(x)".parse::<PlacementSpec>().unwrap().over(&mesh).unwrap();
///             plan(&sum, &Placement::on(&set), &[n], 4)
///         })
///         .map_err(nx_placement::Error::from)?
///     };
///     let (a, b) = (pl(3)?, pl(2)?);
///     let x = c.rank() as f32;
///     let (ta, tb) = ([x, 1.0, 2.0], [10.0 * x, 5.0]);
///     let out = place_all_in(&c, &Groups::new(), &[&a, &b], &[Some(&ta[..]), Some(&tb[..])], &rig)?;
///     Ok(out.into_iter().map(|o| o.expect("a window").to_vec()).collect())
/// })?;
/// assert_eq!(got[0], vec![vec![1.0, 2.0, 4.0], vec![10.0, 10.0]]);
/// # Ok::<(), nx_collectives::Error>(())
/// ```
///
/// # Errors
/// [`Error::Invalid`] where `plans` and `locals` differ in length or a window does not match its
/// plan; as [`place_in`] otherwise.
pub fn place_all_in<T: Reducible, C: Communicator, A: Alloc<T>>(
    comm: &C,
    groups: &Groups<C>,
    plans: &[&Plan],
    locals: &[Option<&[T]>],
    alloc: &A,
) -> Result<Vec<Option<A::Buf>>> {
    const FUNC: &str = "nx_collectives::place_all_in";
    if plans.len() != locals.len() {
        return Err(Error::Invalid { func: FUNC, why: format!("{} plans for {} windows", plans.len(), locals.len()) });
    }
    let mut out: Vec<Option<Option<A::Buf>>> = (0..plans.len()).map(|_| None).collect();
    // buckets by the all-reduce's groups (as world ranks) and mesh axes: the values' indices
    let mut buckets: Vec<Bucket<'_>> = Vec::new();
    for (i, (plan, local)) in plans.iter().zip(locals).enumerate() {
        if !one_all_reduce(plan) {
            out[i] = Some(place_in(comm, groups, plan, *local, alloc)?);
            continue;
        }
        let step = &plan.steps[0];
        let world: Vec<Vec<usize>> =
            step.groups.iter().map(|g| g.iter().map(|&u| plan.devices[u].rank).collect()).collect();
        let key = (world, step.mesh_axes.as_slice());
        // the value's global bytes: the same on every rank, so every rank cuts the same buckets
        let bytes = plan.shape.iter().fold(plan.elem_bytes, |a, &n| a.saturating_mul(n));
        match buckets.iter_mut().rev().find(|b| b.0 == key) {
            Some(b) if b.2.saturating_add(bytes) <= BUCKET_BYTES => {
                b.1.push(i);
                b.2 += bytes;
            }
            _ => buckets.push((key, vec![i], bytes)),
        }
    }
    for ((world, axes), members, _) in &buckets {
        close_bucket(comm, groups, (world, axes), (plans, locals), members, alloc, &mut out)?;
    }
    Ok(out.into_iter().map(|o| o.expect("every plan ran")).collect())
}

/// Closes the values `members` (plans of one all-reduce over the groups `world` of mesh axes
/// `axes`) in one all-reduce, writing each one's window into `out`.
fn close_bucket<T: Reducible, C: Communicator, A: Alloc<T>>(
    comm: &C,
    groups: &Groups<C>,
    (world, axes): (&[Vec<usize>], &[String]),
    (plans, locals): (&[&Plan], &[Option<&[T]>]),
    members: &[usize],
    alloc: &A,
    out: &mut [Option<Option<A::Buf>>],
) -> Result<()> {
    let dry = alloc.dry();
    let recorder = comm.recorder().cloned();
    let outer = recorder.as_ref().and_then(|r| {
        let over = if axes.is_empty() { String::new() } else { format!(" over {}", axes.join(".")) };
        r.set_step(Some(format!("0: all_reduce{over} (a bucket of {})", members.len())))
    });
    let mut run = || -> Result<()> {
        let sub = groups.get(comm, world, axes)?;
        // this rank's windows, checked against the plans (the values share their groups)
        let mut mine = Vec::with_capacity(members.len());
        for &i in members {
            let plan = plans[i];
            let me = plan.devices.iter().position(|d| d.rank == comm.world_rank());
            let old = me.and_then(|u| plan.old[u].as_ref());
            let want = old.map(|w| volume(w) as usize);
            if locals[i].map(<[T]>::len) != want {
                return Err(Error::Invalid {
                    func: "nx_collectives::place_all_in",
                    why: format!(
                        "rank {} holds {:?} elements, its window at {} is {old:?}",
                        comm.world_rank(),
                        locals[i].map(<[T]>::len),
                        plan.from
                    ),
                });
            }
            mine.push((i, locals[i]));
        }
        let Some(g) = Option::as_ref(&sub) else {
            // in no group: each window stays as it is
            for (i, l) in mine {
                out[i] = Some(l.map(|s| owned(alloc, s)).transpose()?);
            }
            return Ok(());
        };
        let total = mine.iter().try_fold(0usize, |a, (_, l)| a.checked_add(l.map_or(0, <[T]>::len)));
        let total = total.ok_or_else(|| Error::Invalid {
            func: "nx_collectives::place_all_in",
            why: "the bucket's elements overflow usize".into(),
        })?;
        // one window: closed from where it lies, into its own buffer
        if let [(i, Some(s))] = mine.as_slice() {
            let mut recv = alloc.uninit(s.len())?;
            reduce(g, s, &mut recv, dry)?;
            out[*i] = Some(Some(recv));
            return Ok(());
        }
        let mut send = alloc.uninit(total)?;
        let mut at = 0;
        for s in mine.iter().filter_map(|m| m.1) {
            if !dry {
                send[at..at + s.len()].copy_from_slice(s);
            }
            at += s.len();
        }
        let mut recv = alloc.uninit(total)?;
        reduce(g, &send, &mut recv, dry)?;
        drop(send);
        let mut at = 0;
        for (i, l) in mine {
            out[i] = match l {
                Some(s) => {
                    let b = owned(alloc, &recv[at..at + s.len()])?;
                    at += s.len();
                    Some(Some(b))
                }
                None => Some(None),
            };
        }
        Ok(())
    };
    let done = run();
    if let Some(r) = &recorder {
        r.set_step(outer);
    }
    done
}

/// The all-reduce of `send` into `recv` over `g` (in a dry run: recorded, nothing moved).
fn reduce<T: Reducible, C: Communicator>(g: &C, send: &[T], recv: &mut [T], dry: bool) -> Result<()> {
    if dry {
        let moved = traffic::all_reduce(send.len(), g.rank(), g.size(), size_of::<T>());
        g.note_skipped(Call::AllReduce, Some(ReduceOp::Sum), T::DTYPE, moved);
        Ok(())
    } else {
        g.all_reduce(send, recv, ReduceOp::Sum)
    }
}
