//! Launch observers: a record of every kernel call a program makes — the kernel, its operands'
//! dtypes and shapes, the case key — and, for a dry run, calls checked but not run.
//!
//! A library watched by an observer ([`Host::observed`](crate::Host::observed)) reports each
//! call to it before anything else. Where the observer is [`active`](Observer::active) (a dry
//! run) the call is checked — its operands' shapes and dtypes, as a queued call's are — and
//! answers without claiming, reading or writing any memory and without running its work; else
//! it runs as ever. Without an observer, every call runs and nothing is recorded.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use nx_kernels::observe::{Observer, Recording};
//! use nx_kernels::prog::{Prog, UnOp};
//! use nx_kernels::{Answer, Array, Dtype, Host, Kernels};
//!
//! let dev = nx_mesh::Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };
//! let dry = Arc::new(Recording::dry());
//! let host = Host::new().observed(dry.clone());
//! let (x, y) = (Array::<f32>::zeros(dev, &[4])?, Array::<f32>::zeros(dev, &[4])?);
//! let mut p = Prog::new(&[Dtype::F32]);
//! let v = p.load(0);
//! let e = p.unary(UnOp::Exp, v);
//! p.output(e);
//! assert_eq!(host.map(&p, &[4], &[&y], &[&x]), Answer::Done);
//! assert_eq!(y.to_vec()?, vec![0.0; 4], "checked, not run");
//! assert_eq!(dry.launches()[0].key, "map f32[4] <- f32[4]");
//! # Ok::<(), nx_kernels::Error>(())
//! ```

use std::sync::Mutex;

use crate::door::Operand;
use crate::Dtype;

/// One kernel call as an observer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The kernel (`map`, `reduce`, `contract`, `gather`, `attention`, …).
    pub kernel: &'static str,
    /// The written operands' dtypes and shapes, in the call's order.
    pub written: Vec<(Dtype, Vec<usize>)>,
    /// The read operands' dtypes and shapes.
    pub read: Vec<(Dtype, Vec<usize>)>,
    /// The case key: the kernel, then each written and read operand as `dtype[shape]`
    /// (`map f32[4] <- f32[4]`); calls of one key run the same case of the kernel.
    pub key: String,
}

impl Launch {
    /// The launch of `kernel` over `written` and `read`.
    pub fn of(kernel: &'static str, written: &[&dyn Operand], read: &[&dyn Operand]) -> Launch {
        let desc = |o: &&dyn Operand| (o.dtype(), o.layout().shape().to_vec());
        let (written, read): (Vec<_>, Vec<_>) = (written.iter().map(desc).collect(), read.iter().map(desc).collect());
        let text = |v: &[(Dtype, Vec<usize>)]| {
            v.iter()
                .map(|(d, s)| format!("{d}[{}]", s.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let key = format!("{kernel} {} <- {}", text(&written), text(&read));
        Launch { kernel, written, read, key }
    }

    /// Bytes the call's operands span (each operand's elements times its dtype's bits, in whole
    /// bytes; at most `u64::MAX`).
    pub fn bytes(&self) -> u64 {
        // saturating: a broadcast operand may describe more elements than memory holds
        self.written
            .iter()
            .chain(&self.read)
            .map(|(d, s)| s.iter().fold(d.bits() as u64, |a, &n| a.saturating_mul(n as u64)).div_ceil(8))
            .fold(0u64, u64::saturating_add)
    }
}

/// What watches a library's kernel calls.
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// Whether calls run dry: checked and recorded, not run.
    fn active(&self) -> bool;
    /// Takes one call, before it is checked or run.
    fn record(&self, launch: Launch);
}

/// An observer that keeps every launch in order: dry ([`Recording::dry`]) or a trace of calls
/// that run ([`Recording::trace`]).
#[derive(Debug, Default)]
pub struct Recording {
    dry: bool,
    launches: Mutex<Vec<Launch>>,
}

impl Recording {
    /// A dry run's record: calls are checked, not run.
    pub fn dry() -> Recording {
        Recording { dry: true, launches: Mutex::default() }
    }

    /// A trace: calls run, and are recorded.
    pub fn trace() -> Recording {
        Recording { dry: false, launches: Mutex::default() }
    }

    /// Returns the launches so far, in order.
    pub fn launches(&self) -> Vec<Launch> {
        self.launches.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Observer for Recording {
    fn active(&self) -> bool {
        self.dry
    }

    fn record(&self, launch: Launch) {
        self.launches.lock().unwrap_or_else(|e| e.into_inner()).push(launch);
    }
}
