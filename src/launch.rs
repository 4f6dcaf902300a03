//! `nx::launch`: runs the SPMD body once per rank.
//!
//! - Under `mpirun` (Open MPI's or a PMI launcher's variables in the environment) this process is
//!   one rank and collectives go over MPI (feature `mpi`; without it, an error says how to build).
//! - Otherwise the embedded default: a simulated mesh of N ranks, threads of this process, N from
//!   [`LaunchOptions::devices`], else `NX_SIM_DEVICES`, else 4.
//!
//! The same program text runs in every mode.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use nx_collectives::sim::{self, SimComm, SimOptions};
use nx_collectives::{Communicator, ReduceOp, Reducible};
use nx_kernels::host::HostOptions;
use nx_kernels::observe::{Launch, Observer, Recording};
use nx_kernels::rig::{QueueOptions, Rig, RigOptions};
use nx_kernels::Host;
use nx_mesh::{Device, Devices, Mesh};

use crate::{Error, Result};

/// Settings of a launch, passed explicitly.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchOptions {
    /// Simulated ranks (default: `NX_SIM_DEVICES`, else 4). Ignored under `mpirun`.
    pub devices: Option<usize>,
    /// Checked collectives (default: on in debug builds).
    pub checked: Option<bool>,
    /// Collective timeout (default: `NX_TIMEOUT` seconds where set, else five minutes).
    pub timeout: Option<Duration>,
    /// Place a map's operand that is placed otherwise (of the same shape) as the map's first
    /// operand, logging each move, instead of failing (default: off: no byte moves silently).
    pub auto_place: bool,
    /// Faults to inject on the simulated mesh (a rank fails, panics, stalls or is delayed at its
    /// n-th collective: [`nx_collectives::sim::Fault`]); ignored under mpirun.
    pub faults: Vec<nx_collectives::sim::Fault>,
    /// Run each simulated rank's work on a queued device (a worker thread per device, each item
    /// after a random delay of up to `delay`: [`nx_kernels::rig`]), the stand-in for a GPU stream
    /// (default: `NX_SIM_QUEUED`, a delay in microseconds, else work runs at once on the host).
    pub queued: Option<QueueOptions>,
    /// The most bytes each device's buffers may hold (default: the system's).
    pub memory_limit: Option<usize>,
    /// Run on a simulated mesh of this process even under `mpirun` or `nx run` (a one-device
    /// reference beside a distributed run).
    pub local: bool,
    /// Lay the simulated ranks over hosts, this many ranks a host in rank order (`[2, 2]`: ranks
    /// 0–1 on one host, 2–3 on another), so that reductions associate as MPI ranks laid out so
    /// do (per host, then across hosts: the same bits); default `NX_SIM_HOSTS` (`2,2`) where set
    /// and the launch is not `local`, else one host.
    pub sim_hosts: Option<Vec<usize>>,
    /// Watch every kernel call of each rank ([`crate::dry`]): record them, and where
    /// [`Observe::Dry`] check them without running them (default: neither).
    pub observe: Option<Observe>,
}

/// How a launch watches its kernel calls ([`LaunchOptions::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observe {
    /// A dry run: each call is recorded and checked, not run (values are left as they were).
    Dry,
    /// A trace: each call is recorded and runs.
    Trace,
}

/// Each rank's library watched as `observe` asks, and the record it keeps.
fn observed(host: &Host, observe: Option<Observe>) -> (Host, Option<Arc<Recording>>) {
    match observe {
        None => (host.clone(), None),
        Some(o) => {
            let rec = Arc::new(if o == Observe::Dry { Recording::dry() } else { Recording::trace() });
            (host.observed(rec.clone()), Some(rec))
        }
    }
}

/// The communicator a rank was launched with.
#[derive(Debug)]
pub enum Comm {
    /// A simulated rank.
    Sim(SimComm),
    /// An MPI rank.
    #[cfg(feature = "mpi")]
    Mpi(nx_collectives::mpi::MpiComm),
}

macro_rules! delegate {
    ($self:ident, $c:ident => $e:expr) => {
        match $self {
            Comm::Sim($c) => $e,
            #[cfg(feature = "mpi")]
            Comm::Mpi($c) => $e,
        }
    };
}

impl Communicator for Comm {
    fn hosts(&self) -> Vec<usize> {
        delegate!(self, c => c.hosts())
    }
    fn rank(&self) -> usize {
        delegate!(self, c => c.rank())
    }
    fn size(&self) -> usize {
        delegate!(self, c => c.size())
    }
    fn backend(&self) -> &'static str {
        delegate!(self, c => c.backend())
    }
    fn world_rank(&self) -> usize {
        delegate!(self, c => c.world_rank())
    }
    fn recorder(&self) -> Option<&nx_collectives::log::Recorder> {
        delegate!(self, c => c.recorder())
    }
    fn note_skipped(
        &self,
        op: nx_collectives::log::Op,
        reduce: Option<ReduceOp>,
        dtype: nx_kernels::Dtype,
        bytes: (u64, u64),
    ) {
        delegate!(self, c => c.note_skipped(op, reduce, dtype, bytes))
    }
    #[track_caller]
    fn barrier(&self) -> nx_collectives::Result<()> {
        delegate!(self, c => c.barrier())
    }
    #[track_caller]
    fn broadcast<T: Reducible>(&self, buf: &mut [T], root: usize) -> nx_collectives::Result<()> {
        delegate!(self, c => c.broadcast(buf, root))
    }
    #[track_caller]
    fn all_reduce<T: Reducible>(&self, s: &[T], r: &mut [T], op: ReduceOp) -> nx_collectives::Result<()> {
        delegate!(self, c => c.all_reduce(s, r, op))
    }
    #[track_caller]
    fn reduce_scatter_v<T: Reducible>(
        &self,
        s: &[T],
        r: &mut [T],
        n: &[usize],
        op: ReduceOp,
    ) -> nx_collectives::Result<()> {
        delegate!(self, c => c.reduce_scatter_v(s, r, n, op))
    }
    #[track_caller]
    fn all_gather_v<T: Reducible>(&self, s: &[T], r: &mut [T], n: &[usize]) -> nx_collectives::Result<()> {
        delegate!(self, c => c.all_gather_v(s, r, n))
    }
    #[track_caller]
    fn all_to_all_v<T: Reducible>(
        &self,
        s: &[T],
        sc: &[usize],
        r: &mut [T],
        rc: &[usize],
    ) -> nx_collectives::Result<()> {
        delegate!(self, c => c.all_to_all_v(s, sc, r, rc))
    }
    #[track_caller]
    fn send<T: Reducible>(&self, b: &[T], to: usize) -> nx_collectives::Result<()> {
        delegate!(self, c => c.send(b, to))
    }
    #[track_caller]
    fn recv<T: Reducible>(&self, b: &mut [T], from: usize) -> nx_collectives::Result<()> {
        delegate!(self, c => c.recv(b, from))
    }
    #[track_caller]
    fn split_over(&self, color: Option<usize>, key: usize, axes: &[String]) -> nx_collectives::Result<Option<Comm>> {
        Ok(match self {
            Comm::Sim(c) => c.split_over(color, key, axes)?.map(Comm::Sim),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.split_over(color, key, axes)?.map(Comm::Mpi),
        })
    }
}

struct Inner<'d> {
    comm: Comm,
    /// The sub-communicators `place` meets in, split once.
    groups: nx_collectives::Groups<Comm>,
    devices: Devices<'d>,
    index: usize,
    host: Host,
    rig: Rig,
    auto_place: bool,
    /// The record of this rank's kernel calls, where the launch watches them.
    recording: Option<Arc<Recording>>,
}

/// What the SPMD body of [`launch`] receives on each rank: the world's device set, this rank's
/// device and communicator, and the host kernels. Cheap to clone (tensors hold one).
#[derive(Clone)]
pub struct Ctx<'d> {
    inner: Rc<Inner<'d>>,
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ctx(rank {} of {} on {}, {})", self.rank(), self.size(), self.device(), self.inner.comm.backend())
    }
}

impl<'d> Ctx<'d> {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.inner.comm.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.inner.comm.size()
    }

    /// The world's devices, one per rank.
    pub fn devices(&self) -> &Devices<'d> {
        &self.inner.devices
    }

    /// This rank's device.
    pub fn device(&self) -> Device {
        self.inner.devices.as_slice()[self.inner.index]
    }

    /// This rank's device's position in [`Ctx::devices`].
    pub fn index(&self) -> usize {
        self.inner.index
    }

    /// The communicator over the world.
    pub fn comm(&self) -> &Comm {
        &self.inner.comm
    }

    /// The sub-communicators of the groups [`crate::Tensor::place`] has met in, split once.
    pub(crate) fn groups(&self) -> &nx_collectives::Groups<Comm> {
        &self.inner.groups
    }

    /// The host kernel library this rank computes with.
    pub fn host(&self) -> &Host {
        &self.inner.host
    }

    /// This rank's device as a running thing: its timeline (at once on the host, or queued) and
    /// the caching pool its tensors take memory from.
    pub fn rig(&self) -> &Rig {
        &self.inner.rig
    }

    /// Returns the kernel calls this rank made so far, in order, where the launch watches them
    /// ([`LaunchOptions::observe`]); else none.
    pub fn launches(&self) -> Vec<Launch> {
        self.inner.recording.as_ref().map(|r| r.launches()).unwrap_or_default()
    }

    /// Returns whether this launch is a dry run: kernels checked, not run.
    pub fn is_dry(&self) -> bool {
        self.inner.recording.as_ref().is_some_and(|r| r.active())
    }

    /// Whether maps place mismatched operands themselves ([`LaunchOptions::auto_place`]).
    pub fn auto_place(&self) -> bool {
        self.inner.auto_place
    }

    /// The backend's name (`sim` or `mpi`).
    pub fn backend(&self) -> &'static str {
        self.inner.comm.backend()
    }

    /// Runs `f` and answers its result with the log of every collective, send, receive and
    /// split this rank issued meanwhile ([`nx_collectives::log`]): op, dtype, group, bytes, plan
    /// step. Regions nest; a region ends however `f` ends (its log is lost with an error).
    ///
    /// # Examples
    ///
    /// ```
    /// use nx::collectives::log::Op;
    /// use nx::{LaunchOptions, Placement, Tensor};
    ///
    /// nx::launch_with(&LaunchOptions { devices: Some(2), ..Default::default() }, |ctx| {
    ///     let x = Tensor::<f32>::rand(ctx, &[6, 4], &Placement::split(0, ctx.devices())?, 1)?;
    ///     let (_, log) = ctx.record(|| x.full())?;
    ///     assert_eq!(log.count_any(Op::AllGather), 1);
    ///     assert_eq!(log.collectives().map(|e| e.bytes_received).sum::<u64>(), 3 * 4 * 4);
    ///     Ok(())
    /// })
    /// .unwrap();
    /// ```
    ///
    /// # Errors
    /// `f`'s.
    pub fn record<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(R, nx_collectives::log::Log)> {
        use nx_collectives::log::Recorder;
        /// Ends the region if `f` panics.
        struct Region<'a> {
            rec: &'a Recorder,
            mark: usize,
            rank: usize,
            open: bool,
        }
        impl Drop for Region<'_> {
            fn drop(&mut self) {
                if self.open {
                    self.rec.stop(self.mark, self.rank);
                }
            }
        }
        let rec = self.inner.comm.recorder().cloned().unwrap_or_default();
        let mut region = Region { rec: &rec, mark: rec.start(), rank: self.inner.comm.world_rank(), open: true };
        let out = f();
        region.open = false;
        let log = rec.stop(region.mark, region.rank);
        out.map(|r| (r, log))
    }

    /// A mesh of `axes` over the world's devices.
    ///
    /// # Errors
    /// As [`Mesh::new`]: bad names, or extents that do not multiply to the number of ranks.
    pub fn mesh(&self, axes: &[(&str, usize)]) -> Result<Mesh<'d>> {
        Ok(Mesh::new(&self.inner.devices, axes).map_err(nx_placement::Error::from)?)
    }
}

/// The queued timelines of a simulated launch: the options', else `NX_SIM_QUEUED` (a delay in
/// microseconds), else none.
fn sim_queue(opts: &LaunchOptions) -> Result<Option<QueueOptions>> {
    if opts.queued.is_some() {
        return Ok(opts.queued);
    }
    match std::env::var("NX_SIM_QUEUED") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(us) if us <= 10_000_000 => Ok(Some(QueueOptions { delay: Duration::from_micros(us), seed: 0 })),
            _ => Err(Error::Invalid {
                func: "nx::launch",
                why: format!("NX_SIM_QUEUED={v:?} is not a delay in microseconds (0 to 10000000)"),
            }),
        },
        Err(_) => Ok(None),
    }
}

fn sim_devices(opts: &LaunchOptions) -> Result<usize> {
    if let Some(n) = opts.devices {
        return Ok(n);
    }
    match std::env::var("NX_SIM_DEVICES") {
        Ok(v) => v.trim().parse().map_err(|_| Error::Invalid {
            func: "nx::launch",
            why: format!("NX_SIM_DEVICES={v:?} is not a number of devices"),
        }),
        Err(_) => Ok(4),
    }
}

/// The host of each of `n` simulated ranks, from [`LaunchOptions::sim_hosts`] or
/// `NX_SIM_HOSTS` (empty: one host).
fn sim_hosts(opts: &LaunchOptions, n: usize) -> Result<Vec<usize>> {
    let bad = |why: String| Error::Invalid { func: "nx::launch", why };
    let per: Vec<usize> = match (&opts.sim_hosts, std::env::var("NX_SIM_HOSTS")) {
        (Some(h), _) => h.clone(),
        (None, Ok(v)) if !opts.local => v
            .split(',')
            .map(|k| k.trim().parse::<usize>().ok().filter(|&k| k > 0))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad(format!("NX_SIM_HOSTS={v:?} is not a list of ranks a host, as 2,2")))?,
        _ => return Ok(Vec::new()),
    };
    let total = per.iter().try_fold(0usize, |a, &k| a.checked_add(k));
    if per.contains(&0) || total != Some(n) {
        return Err(bad(format!("hosts of {per:?} ranks do not lay out the {n} simulated ranks")));
    }
    Ok(per.iter().enumerate().flat_map(|(h, &k)| std::iter::repeat_n(h, k)).collect())
}

/// The collectives' timeout from `NX_TIMEOUT` (seconds, above 0), else five minutes.
fn env_timeout() -> Result<Duration> {
    match std::env::var("NX_TIMEOUT") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s <= 1e9 => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::Invalid {
                func: "nx::launch",
                why: format!("NX_TIMEOUT={v:?} is not a number of seconds above 0 and at most 1e9"),
            }),
        },
        Err(_) => Ok(Duration::from_secs(300)),
    }
}

/// Runs `body` once per rank with the defaults of [`LaunchOptions`]; answers the results of the
/// ranks of this process (every rank on a simulated mesh, this one under MPI).
///
/// Simulated ranks run on threads of their own; a mesh of one device runs its body on a worker
/// of the host kernels' pool (a rayon pool: the body's own `par_iter`s share its threads).
///
/// # Errors
/// The first failing rank's error ([`Error::Collectives`] with `RankFailed` on a simulated mesh);
/// under MPI a failing rank aborts the job instead. [`Error::Invalid`] for a bad `NX_SIM_DEVICES`
/// or `NX_TIMEOUT`, or MPI requested without the `mpi` feature.
pub fn launch<R, F>(body: F) -> Result<Vec<R>>
where
    R: Send,
    F: for<'d> Fn(&Ctx<'d>) -> Result<R> + Sync,
{
    launch_with(&LaunchOptions::default(), body)
}

/// [`launch`] with explicit options.
///
/// # Errors
/// As [`launch`].
pub fn launch_with<R, F>(opts: &LaunchOptions, body: F) -> Result<Vec<R>>
where
    R: Send,
    F: for<'d> Fn(&Ctx<'d>) -> Result<R> + Sync,
{
    let checked = opts.checked.unwrap_or(cfg!(debug_assertions));
    let timeout = match opts.timeout {
        Some(t) => t,
        None => env_timeout()?,
    };
    if nx_collectives::mpi::under_mpirun() && !opts.local {
        return launch_mpi(checked, timeout, opts, body);
    }
    if let (Ok(rank), false) = (std::env::var("NX_RANK"), opts.local) {
        return Err(Error::Invalid {
            func: "nx::launch",
            why: format!(
                "started by `nx run --direct` as rank {rank}, but CPU ranks need MPI to communicate: use `nx run --mpi` (or mpirun), or run without nx run for a simulated mesh"
            ),
        });
    }
    let n = sim_devices(opts)?;
    let queue = sim_queue(opts)?;
    let hosts = sim_hosts(opts, n)?;
    let sopts = SimOptions { checked, timeout, faults: opts.faults.clone(), hosts, simd: None };
    // the machine's cores shared out: one rank a library of all of them; more ranks a library
    // each of their part (at least one thread), so the ranks' threads and the pools' never
    // outnumber the cores
    let host = Host::new();
    let per = (host.threads() / n.max(1)).max(1);
    let rank = |comm: SimComm, own: Host| -> Result<R> {
        let index = comm.rank();
        let queue = queue.map(|q| QueueOptions { seed: q.seed ^ index as u64, ..q });
        let dry = opts.observe == Some(Observe::Dry);
        let rig = Rig::new(Device::sim(index), RigOptions { queue, limit: opts.memory_limit, dry })?;
        let (host, recording) = observed(&own, opts.observe);
        Devices::with(Device::sims(n), |devices| {
            let ctx = Ctx {
                inner: Rc::new(Inner {
                    comm: Comm::Sim(comm),
                    groups: Default::default(),
                    devices,
                    index,
                    host: host.clone(),
                    rig,
                    auto_place: opts.auto_place,
                    recording: recording.clone(),
                }),
            };
            body(&ctx)
        })
        .map_err(nx_placement::Error::from)?
    };
    // ranks' kernels: one rank's body runs on a worker of the pool, more ranks each on the first
    // thread of a pool of their own: their kernels split from there, with no hand-off into the
    // pool and back per call
    let ranks = |sopts| {
        sim::run(n, sopts, |comm: SimComm| {
            let own = match n {
                1 => host.clone(),
                _ => {
                    Host::with_options(HostOptions { threads: Some(per), this_thread: true, ..HostOptions::default() })?
                }
            };
            rank(comm, own)
        })
    };
    let out = if n == 1 { host.install(|| ranks(sopts)) } else { ranks(sopts) };
    Ok(out?)
}

#[cfg(feature = "mpi")]
fn launch_mpi<R, F>(checked: bool, timeout: Duration, opts: &LaunchOptions, body: F) -> Result<Vec<R>>
where
    F: for<'d> Fn(&Ctx<'d>) -> Result<R>,
{
    use nx_collectives::mpi::{self, MpiComm, MpiOptions};
    let (auto_place, limit, observe) = (opts.auto_place, opts.memory_limit, opts.observe);
    let r = mpi::run(MpiOptions { checked, timeout, simd: None }, |comm: MpiComm| -> Result<R> {
        let (n, index) = (comm.size(), comm.rank());
        let list: Vec<Device> = (0..n).map(|r| Device::new(nx_mesh::DeviceKind::Cpu, r, r)).collect();
        let rig =
            Rig::new(list[index], RigOptions { limit, dry: observe == Some(Observe::Dry), ..RigOptions::default() })?;
        Devices::with(list, |devices| {
            // the ranks sharing this host share its cores: a rank bound to some CPUs (mpirun's
            // binding) a pool of its cores, an unbound one its part of the host's
            let hosts = comm.hosts();
            let here = hosts.iter().filter(|&&h| h == hosts[index]).count().max(1);
            let readings = nx_kernels::facts::CpuReadings::read();
            let bound = !readings.allowed.is_empty() && readings.allowed.len() < readings.core_of.len();
            let cores = nx_kernels::facts::Cores::from_readings(&readings).count;
            let host = Host::with_threads(if bound { cores } else { (cores / here).max(1) })?;
            let (host, recording) = observed(&host, observe);
            let ctx = Ctx {
                inner: Rc::new(Inner {
                    comm: Comm::Mpi(comm),
                    groups: Default::default(),
                    devices,
                    index,
                    host,
                    rig,
                    auto_place,
                    recording,
                }),
            };
            body(&ctx)
        })
        .map_err(nx_placement::Error::from)?
    })?;
    Ok(vec![r])
}

#[cfg(not(feature = "mpi"))]
fn launch_mpi<R, F>(_: bool, _: Duration, _: &LaunchOptions, _: F) -> Result<Vec<R>>
where
    F: for<'d> Fn(&Ctx<'d>) -> Result<R>,
{
    Err(Error::Invalid {
        func: "nx::launch",
        why: "started under mpirun, but this program was built without the `mpi` feature: build with --features mpi"
            .into(),
    })
}
