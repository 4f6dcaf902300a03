//! How values are stored: the dtype a store without some formats holds in their place
//! ([`storage_dtype`]), and the bytes a stored representation takes, quantised ones included
//! ([`representation_bytes`]).
//!
//! A representation is named `ELEMENT[-gGROUP[-sym|-asym][-SCALE]]` or an MX format:
//!
//! | name | bytes for `n` elements |
//! |---|---|
//! | a dtype (`float32`, `bf16`, `F8_E4M3`, …) | `n · size` |
//! | `int4`, `uint4` (two to a byte) | `⌈n / 2⌉` |
//! | `ELEMENT-gG` or `ELEMENT-gG-sym` | the elements, and one scale per group of `G` (`⌈n / G⌉` groups) |
//! | `ELEMENT-gG-asym` | the elements, and a scale and a minimum (zero point) per group |
//! | `mxfp8` (`mxfp8_e4m3`), `mxfp8_e5m2`, `mxint8`, `mxfp6_e2m3`, `mxfp6_e3m2`, `mxfp4` | the elements (8, 6 or 4 bits), packed, and one `u8` exponent per block of 32 (the OCP MX formats) |
//!
//! A group's scale and minimum are `float16` unless the name ends in another float dtype
//! (`int4-g128-asym-bf16`, `int8-g64-f32`). The element of a grouped name is `int4`, `uint4` or
//! any integer or float dtype.

use super::Dtype;
use crate::{Error, Result};

/// The formats a store holds natively; [`Stores::all`] holds every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stores {
    /// `f64` and `c128`.
    pub fp64: bool,
    /// `f16`.
    pub fp16: bool,
    /// `bf16`.
    pub bf16: bool,
    /// The fp8s.
    pub fp8: bool,
}

impl Stores {
    /// A store of every format.
    pub const fn all() -> Stores {
        Stores { fp64: true, fp16: true, bf16: true, fp8: true }
    }
}

impl Default for Stores {
    /// [`Stores::all`].
    fn default() -> Stores {
        Stores::all()
    }
}

/// The dtype a store of the formats `stores` holds values of `d` in: `d` where it holds it,
/// else the narrowest dtype it holds that holds every value of `d` exactly but for range and
/// precision a `f64` loses in `f32` — `f64` → `f32`, `c128` → `c64`, `bf16` → `f32`, `f16` →
/// `f32`, an fp8 → `f16` (or `bf16`, or `f32`, whichever is held first).
///
/// # Examples
/// ```
/// use nx_kernels::dtype::storage::{storage_dtype, Stores};
/// use nx_kernels::Dtype;
/// let no_fp64 = Stores { fp64: false, ..Stores::all() };
/// assert_eq!(storage_dtype(Dtype::F64, no_fp64), Dtype::F32);
/// assert_eq!(storage_dtype(Dtype::I64, no_fp64), Dtype::I64);
/// ```
pub fn storage_dtype(d: Dtype, stores: Stores) -> Dtype {
    match d {
        Dtype::F64 if !stores.fp64 => Dtype::F32,
        Dtype::C128 if !stores.fp64 => Dtype::C64,
        Dtype::BF16 if !stores.bf16 => Dtype::F32,
        Dtype::F16 if !stores.fp16 => Dtype::F32,
        Dtype::F8E4M3 | Dtype::F8E5M2 if !stores.fp8 => {
            if stores.fp16 {
                Dtype::F16
            } else if stores.bf16 {
                Dtype::BF16
            } else {
                Dtype::F32
            }
        }
        d => d,
    }
}

/// Bits of one element of a representation's element name: a dtype's, or 4 for `int4`/`uint4`.
fn element_bits(name: &str) -> Option<u64> {
    match name.to_ascii_lowercase().as_str() {
        "int4" | "uint4" | "i4" | "u4" => Some(4),
        _ => name.parse::<Dtype>().ok().filter(|d| d.kind() != super::Kind::Complex).map(|d| 8 * d.size() as u64),
    }
}

/// The bytes `n` elements stored as representation `name` take (the module's table): elements
/// packed, then their group or block scales.
///
/// # Examples
/// ```
/// use nx_kernels::dtype::storage::representation_bytes;
/// // a packed int4 weight with float16 scales and minima per group of 128
/// assert_eq!(representation_bytes("int4-g128-asym", 256).unwrap(), 128 + 2 * (2 + 2));
/// assert_eq!(representation_bytes("mxfp4", 64).unwrap(), 32 + 2);
/// assert_eq!(representation_bytes("bfloat16", 3).unwrap(), 6);
/// ```
///
/// # Errors
/// [`Error::Invalid`] naming `name` for a name the table has not (an unknown element, a group of
/// 0, a complex element in a grouped name), and naming `n` where the bytes overflow `u64`.
pub fn representation_bytes(name: &str, n: u64) -> Result<u64> {
    const FUNC: &str = "nx_kernels::dtype::storage::representation_bytes";
    let bad = |why: String| Error::Invalid { func: FUNC, why };
    let overflow = || bad(format!("{n} elements of {name:?} overflow u64 bytes"));
    let packed = |bits: u64| n.checked_mul(bits).map(|b| b.div_ceil(8)).ok_or_else(overflow);
    let lower = name.trim().to_ascii_lowercase();
    let mx = match lower.as_str() {
        "mxfp8" | "mxfp8_e4m3" | "mxfp8_e5m2" | "mxint8" => Some(8),
        "mxfp6_e2m3" | "mxfp6_e3m2" => Some(6),
        "mxfp4" | "mxfp4_e2m1" => Some(4),
        _ => None,
    };
    if let Some(bits) = mx {
        return packed(bits)?.checked_add(n.div_ceil(32)).ok_or_else(overflow);
    }
    let mut parts = name.trim().split('-');
    let element = parts.next().unwrap_or_default();
    let Some(bits) = element_bits(element) else {
        return Err(bad(format!("unknown representation {name:?}: {element:?} is no element dtype")));
    };
    let Some(group) = parts.next() else {
        return packed(bits);
    };
    let g: u64 = group
        .strip_prefix(['g', 'G'])
        .and_then(|g| g.parse().ok())
        .filter(|&g| g > 0)
        .ok_or_else(|| bad(format!("unknown representation {name:?}: {group:?} is not a group gN, N > 0")))?;
    let (mut per_group, mut scale) = (1u64, Dtype::F16);
    for p in parts {
        match p.to_ascii_lowercase().as_str() {
            "sym" => per_group = 1,
            "asym" => per_group = 2,
            _ => match p.parse::<Dtype>() {
                Ok(d) if d.kind() == super::Kind::Float => scale = d,
                _ => {
                    return Err(bad(format!(
                        "unknown representation {name:?}: {p:?} is neither sym, asym nor a float scale dtype"
                    )))
                }
            },
        }
    }
    let scales = n.div_ceil(g).checked_mul(per_group * scale.size() as u64).ok_or_else(overflow)?;
    packed(bits)?.checked_add(scales).ok_or_else(overflow)
}
