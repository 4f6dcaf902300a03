//! The instruction sets the host kernels dispatch to: one level a library, detected at run time
//! and capped by a setting ([`crate::host::HostOptions::simd`]), so that a test forces every
//! lower path on one CPU.

use std::fmt;
use std::str::FromStr;

/// A level of x86-64 SIMD instructions, lowest first; each includes those below it.
///
/// Every kernel nx writes with more than one path picks it from the library's level
/// ([`crate::Host::simd`]); the operations whose association the docs fix give the same bits at
/// every level (tested level by level against the baseline), but for the bf16 product at
/// [`Simd::Avx512Bf16`], whose instruction flushes subnormals, and for the bf16 product at
/// [`Simd::Amx`], whose tiles add in an order of their own (the product's docs state both). On
/// other architectures only [`Simd::Baseline`] is available.
///
/// # Examples
/// ```
/// use nx_kernels::{Host, Simd};
/// use nx_kernels::host::HostOptions;
///
/// let top = Simd::detected();
/// assert!(top.available());
/// // a library capped at the baseline runs only the portable loops, on any CPU
/// let plain = Host::with_options(HostOptions { simd: Some(Simd::Baseline), ..HostOptions::default() })?;
/// assert_eq!(plain.simd(), Simd::Baseline);
/// // a cap above the CPU's level is lowered to it
/// let all = Host::with_options(HostOptions { simd: Some(Simd::Amx), ..HostOptions::default() })?;
/// assert_eq!(all.simd(), top);
/// let top_but_tiles = Host::with_options(HostOptions { simd: Some(Simd::Avx512Bf16), ..HostOptions::default() })?;
/// assert!(!top_but_tiles.simd().amx());
/// assert_eq!("avx2".parse::<Simd>()?, Simd::Avx2);
/// # Ok::<(), nx_kernels::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Simd {
    /// What the target has without detection: SSE2 on x86-64; scalar fused multiply-adds where a
    /// kernel needs them.
    Baseline,
    /// AVX2 with FMA (Haswell, Zen and later).
    Avx2,
    /// AVX-512 F, BW, DQ and VL, with AVX2 and FMA (Skylake-SP, Zen 4 and later).
    Avx512,
    /// [`Simd::Avx512`] with AVX-512 BF16 (`vdpbf16ps`: Cooper Lake, Sapphire Rapids, Zen 4).
    Avx512Bf16,
    /// [`Simd::Avx512Bf16`] with AMX tiles and their bf16 products (`tdpbf16ps`: Sapphire Rapids
    /// and later), where Linux grants the process the tile state.
    Amx,
}

impl Simd {
    /// Every level, lowest first.
    pub const ALL: [Simd; 5] = [Simd::Baseline, Simd::Avx2, Simd::Avx512, Simd::Avx512Bf16, Simd::Amx];

    /// Answers the highest level this CPU runs.
    pub fn detected() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if !(has!("avx2") && has!("fma")) {
                return Simd::Baseline;
            }
            if !(has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl")) {
                return Simd::Avx2;
            }
            if !has!("avx512bf16") {
                return Simd::Avx512;
            }
            if !amx::granted() {
                return Simd::Avx512Bf16;
            }
            Simd::Amx
        }
        #[cfg(not(target_arch = "x86_64"))]
        Simd::Baseline
    }

    /// Answers whether this CPU runs the level.
    pub fn available(self) -> bool {
        self <= Simd::detected()
    }

    /// Answers the level a library capped at `cap` runs here: the lower of the two (the CPU's
    /// own level for no cap).
    pub fn capped(cap: Option<Simd>) -> Simd {
        let top = Simd::detected();
        cap.map_or(top, |c| c.min(top))
    }

    /// Answers the levels this CPU runs, lowest first.
    pub fn available_levels() -> Vec<Simd> {
        Simd::ALL.into_iter().filter(|s| s.available()).collect()
    }

    /// Answers the level's name, as [`FromStr`] reads it (`baseline`, `avx2`, `avx512`,
    /// `avx512bf16`, `amx`).
    pub fn name(self) -> &'static str {
        match self {
            Simd::Baseline => "baseline",
            Simd::Avx2 => "avx2",
            Simd::Avx512 => "avx512",
            Simd::Avx512Bf16 => "avx512bf16",
            Simd::Amx => "amx",
        }
    }

    /// Answers whether AVX2 and FMA may be used: the level allows them and this CPU has them
    /// (so that code guarded by it is sound whatever level it was given).
    pub fn avx2(self) -> bool {
        self.allows(Simd::Avx2)
    }

    /// Answers whether AVX-512 F, BW, DQ and VL may be used, as [`Simd::avx2`].
    pub fn avx512(self) -> bool {
        self.allows(Simd::Avx512)
    }

    /// Answers whether AVX-512 BF16 may be used, as [`Simd::avx2`].
    pub fn avx512bf16(self) -> bool {
        self.allows(Simd::Avx512Bf16)
    }

    /// Answers whether AMX tiles and their bf16 products may be used, as [`Simd::avx2`].
    pub fn amx(self) -> bool {
        self.allows(Simd::Amx)
    }

    fn allows(self, level: Simd) -> bool {
        self >= level && level.available()
    }
}

/// Defines a function whose one body is compiled three times — for AVX-512 (F, BW, DQ, VL with
/// AVX2 and FMA), for AVX2 with FMA, and for the baseline — and which runs the build a
/// [`Simd`] level allows, given as its first parameter. The builds run the same operations in
/// the same order, so a body without fused multiply-adds of its own gives the same bits in each;
/// the wider builds only choose wider instructions. This is the host library's and the
/// collectives' one dispatch layer for loops written once; kernels written with a level's own
/// intrinsics take the level as a parameter instead.
///
/// The form is a plain `fn` (or `unsafe fn`, whose safety contract the caller keeps) with type
/// parameters of one bound each and parameters that are names, the first the level (a
/// [`Simd`]), which the body may pass on to the kernels it calls.
///
/// # Examples
/// ```
/// use nx_kernels::{simd_fn, Simd};
///
/// simd_fn! {
///     /// The sum of `xs` in 8 lanes, each in order.
///     fn lanes(simd: Simd, xs: &[f32]) -> f32 {
///         let mut l = [0.0f32; 8];
///         for (i, x) in xs.iter().enumerate() {
///             l[i % 8] += x;
///         }
///         l.iter().sum()
///     }
/// }
///
/// let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.1).collect();
/// let bits = lanes(Simd::Baseline, &xs).to_bits();
/// for level in Simd::available_levels() {
///     assert_eq!(lanes(level, &xs).to_bits(), bits);
/// }
/// ```
#[macro_export]
macro_rules! simd_fn {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident $(<$($g:ident : $bound:path),+>)? ($lv:ident : $lty:ty $(, $arg:ident : $ty:ty)* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments, unused_variables)]
            fn body $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? {
                    body($lv, $($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn half $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? {
                    body($lv, $($arg),*)
                }
                if $lv.avx512() {
                    // SAFETY: the CPU has the features (`avx512` and `avx2` check).
                    return unsafe { wide($lv, $($arg),*) };
                }
                if $lv.avx2() {
                    // SAFETY: as above.
                    return unsafe { half($lv, $($arg),*) };
                }
            }
            body($lv, $($arg),*)
        }
    };
    (
        $(#[$attr:meta])*
        $vis:vis unsafe fn $name:ident $(<$($g:ident : $bound:path),+>)? ($lv:ident : $lty:ty $(, $arg:ident : $ty:ty)* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis unsafe fn $name $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments, unused_variables)]
            unsafe fn body $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? {
                    // SAFETY: the caller's contract.
                    unsafe { body($lv, $($arg),*) }
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn half $(<$($g: $bound),+>)? ($lv: $lty, $($arg: $ty),*) $(-> $ret)? {
                    // SAFETY: the caller's contract.
                    unsafe { body($lv, $($arg),*) }
                }
                if $lv.avx512() {
                    // SAFETY: the CPU has the features (`avx512` and `avx2` check); the caller's contract.
                    return unsafe { wide($lv, $($arg),*) };
                }
                if $lv.avx2() {
                    // SAFETY: as above.
                    return unsafe { half($lv, $($arg),*) };
                }
            }
            // SAFETY: the caller's contract.
            unsafe { body($lv, $($arg),*) }
        }
    };
}

impl fmt::Display for Simd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Simd {
    type Err = crate::Error;

    /// Reads a level's [`Simd::name`] (any case).
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming the text and the names known.
    fn from_str(s: &str) -> Result<Simd, crate::Error> {
        Simd::ALL.into_iter().find(|l| l.name().eq_ignore_ascii_case(s)).ok_or_else(|| crate::Error::Invalid {
            func: "nx_kernels::Simd::from_str",
            why: format!("unknown SIMD level {s:?} (baseline, avx2, avx512, avx512bf16, amx)"),
        })
    }
}

/// AMX's presence: the CPU's flags, the operating system's support, and Linux's grant of the
/// tile data to this process.
#[cfg(target_arch = "x86_64")]
mod amx {
    use std::sync::OnceLock;

    /// `arch_prctl`'s number and its request for an extended state component.
    #[cfg(target_os = "linux")]
    const SYS_ARCH_PRCTL: std::ffi::c_long = 158;
    #[cfg(target_os = "linux")]
    const ARCH_REQ_XCOMP_PERM: std::ffi::c_long = 0x1023;
    /// The tile data's state component (XCR0 bit 18; the configuration is bit 17).
    #[cfg(target_os = "linux")]
    const XFEATURE_XTILEDATA: std::ffi::c_long = 18;

    #[cfg(target_os = "linux")]
    unsafe extern "C" {
        fn syscall(n: std::ffi::c_long, ...) -> std::ffi::c_long;
    }

    /// Answers whether this process may run AMX's bf16 tiles: CPUID leaf 7 says AMX-TILE and
    /// AMX-BF16, XCR0 enables the tile state, and (on Linux) `arch_prctl(ARCH_REQ_XCOMP_PERM)`
    /// grants it (other systems are not asked: no AMX there). The grant is the process's, for all its threads, once asked; the answer is
    /// kept, as std keeps its feature flags.
    pub(super) fn granted() -> bool {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        *GRANTED.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            if __cpuid(0).eax < 7 {
                return false;
            }
            let leaf7 = __cpuid_count(7, 0);
            let (tile, bf16) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 22 & 1 == 1);
            // OSXSAVE (leaf 1, ECX bit 27) makes XGETBV legal
            if !(tile && bf16) || __cpuid(1).ecx >> 27 & 1 == 0 {
                return false;
            }
            let xcr0: u64;
            // SAFETY: XGETBV with ECX = 0 reads XCR0, legal where OSXSAVE is set (checked).
            unsafe {
                let (lo, hi): (u32, u32);
                std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
                xcr0 = u64::from(hi) << 32 | u64::from(lo);
            }
            if xcr0 & (3 << 17) != 3 << 17 {
                return false;
            }
            #[cfg(target_os = "linux")]
            // SAFETY: arch_prctl with this request only changes the process's permitted state.
            return unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 };
            #[cfg(not(target_os = "linux"))]
            false
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_order_parse_and_cap() {
        for l in Simd::ALL {
            assert_eq!(l.name().parse::<Simd>().unwrap(), l);
            assert_eq!(l.name().to_uppercase().parse::<Simd>().unwrap(), l);
            assert_eq!(Simd::capped(Some(l)), l.min(Simd::detected()));
        }
        assert!("sse9".parse::<Simd>().unwrap_err().to_string().contains("\"sse9\""));
        assert_eq!(Simd::capped(None), Simd::detected());
        assert!(Simd::Baseline.available());
        assert_eq!(Simd::available_levels().last().copied(), Some(Simd::detected()));
        assert!(!Simd::Avx2.avx512() && !Simd::Baseline.avx2());
        assert_eq!(Simd::Avx512Bf16.avx512bf16(), Simd::Avx512Bf16.available());
    }

    /// The detected level matches the CPU's feature flags as std reports them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn detection_follows_the_feature_flags() {
        use std::arch::is_x86_feature_detected as has;
        let d = Simd::detected();
        assert_eq!(d.avx2(), has!("avx2") && has!("fma"));
        if d.avx512() {
            assert!(has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl"));
        }
        assert_eq!(d.avx512bf16(), d.avx512() && has!("avx512bf16"));
        // AMX from the kernel's flags, which Linux shows where it supports the tiles
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
            let has_flag = |f: &str| flags.split_whitespace().any(|w| w == f);
            let flagged = d.avx512bf16() && has_flag("amx_tile") && has_flag("amx_bf16");
            // the flags without the level: Linux refused the grant (a small signal stack, a
            // seccomp filter); the level without the flags is wrong
            assert!(!d.amx() || flagged, "amx detected without the CPU's flags");
            if flagged && !d.amx() {
                eprintln!("the CPU has AMX but this process was not granted the tile state");
            }
        }
    }
}
