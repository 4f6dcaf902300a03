//! [`Lease`]: elements of a buffer from a rig's pool, held exclusive by the host while the lease
//! lives, as a `&mut [T]`: the scratch and outputs of host code (the collectives' plan executor)
//! without a fresh allocation once the pool is warm.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::buffer::{Claim, Claims};
use crate::rig::Rig;
use crate::{Array, Buffer, Dtype, Element, Error, Layout, Result};

/// `len` elements of `T` in memory from a rig's pool, held exclusive (every other access to the
/// buffer is refused) until the lease ends or becomes an [`Array`] ([`Lease::into_array`]). It
/// dereferences to `[T]`; the memory returns to the pool when the last handle of its buffer ends.
///
/// ```
/// let rig = nx_kernels::rig::Rig::host(nx_mesh::Device::sim(0))?;
/// let mut out = nx_kernels::Lease::<f32>::zeroed(&rig, 3)?;
/// out[1] = 2.5;
/// let a = out.into_array(&[3])?;
/// assert_eq!(a.to_vec()?, [0.0, 2.5, 0.0]);
/// # Ok::<(), nx_kernels::Error>(())
/// ```
pub struct Lease<T: Element> {
    ptr: NonNull<T>,
    len: usize,
    // dropped before the buffer: the claim ends, then the memory may go back to the pool
    claims: Claims,
    buffer: Buffer,
    elem: PhantomData<T>,
}

// SAFETY: the lease owns an exclusive claim on its memory, so the elements are reached only
// through it; moving it to another thread moves that access, as moving a `Vec<T>` does.
unsafe impl<T: Element> Send for Lease<T> {}
// SAFETY: shared references to the lease give shared access to the elements only.
unsafe impl<T: Element> Sync for Lease<T> {}

impl<T: Element> std::fmt::Debug for Lease<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease<{}>({} elements of {:?})", T::DTYPE, self.len, self.buffer)
    }
}

impl<T: Element> Lease<T> {
    fn take(func: &'static str, rig: &Rig, len: usize, zeroed: bool) -> Result<Lease<T>> {
        if T::DTYPE.is_packed() {
            return Err(Error::Invalid {
                func,
                why: format!("{} is packed (elements narrower than a byte): no slice holds them", T::DTYPE),
            });
        }
        let bytes = len.checked_mul(T::DTYPE.size()).ok_or_else(|| Error::Invalid {
            func,
            why: format!("{len} elements of {} overflow the address space", T::DTYPE),
        })?;
        // booleans take two bit patterns only: their memory is always zeroed
        let buffer = if zeroed || T::DTYPE == Dtype::Bool { rig.alloc(bytes)? } else { rig.alloc_uninit(bytes)? };
        let Some(base) = buffer.host_ptr() else {
            return Err(Error::Invalid { func, why: format!("{} has no host memory to lease", rig.device()) });
        };
        // no work touches a block the pool hands out (work holds its buffers until it has run),
        // so the host may write it at once
        let claims = Claims::take(&[(buffer.clone(), Claim::Exclusive)])
            .map_err(|_| Error::Invalid { func, why: "a fresh buffer is already claimed".into() })?;
        Ok(Lease { ptr: base.cast::<T>(), len, claims, buffer, elem: PhantomData })
    }

    /// `len` elements from `rig`'s pool whose values are unspecified (a reused block's, or zeros;
    /// `bool` elements are `false`): for code that writes them all.
    ///
    /// # Errors
    /// As [`Rig::alloc`]; [`Error::Invalid`] for a packed dtype, where `len` elements overflow the
    /// address space, or where the rig's memory is off the host.
    pub fn uninit(rig: &Rig, len: usize) -> Result<Lease<T>> {
        Lease::take("nx_kernels::Lease::uninit", rig, len, false)
    }

    /// `len` zero elements (`false`, `0`, `+0.0`) from `rig`'s pool.
    ///
    /// # Errors
    /// As [`Lease::uninit`].
    pub fn zeroed(rig: &Rig, len: usize) -> Result<Lease<T>> {
        Lease::take("nx_kernels::Lease::zeroed", rig, len, true)
    }

    /// The buffer the elements lie in (held exclusive by the lease).
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The elements as a C-contiguous array of `shape`, the claim released.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] unless `shape` has one index per element; as
    /// [`Layout::contiguous`].
    pub fn into_array(self, shape: &[usize]) -> Result<Array<T>> {
        let layout = Layout::contiguous(shape)?;
        if layout.numel() != self.len {
            return Err(Error::LengthMismatch {
                func: "nx_kernels::Lease::into_array",
                what: format!("the elements of shape {shape:?} and the lease's"),
                left: layout.numel(),
                right: self.len,
            });
        }
        let Lease { claims, buffer, .. } = self;
        drop(claims);
        Array::new(layout, buffer)
    }
}

impl<T: Element> Deref for Lease<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the buffer holds at least `len` elements of T from its 64-byte aligned base
        // (its size was asked for `len`), initialised (zeroed when fresh, else written before),
        // and nx's elements take every bit pattern their memory can hold (booleans are zeroed);
        // the exclusive claim rules out every access but the lease's.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> DerefMut for Lease<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, through the lease's unique borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nx_mesh::Device;

    #[test]
    fn a_lease_holds_its_buffer_exclusive_and_returns_it_to_the_pool() {
        let rig = Rig::host(Device::sim(0)).unwrap();
        let mut l = Lease::<f64>::uninit(&rig, 1000).unwrap();
        assert!(l.buffer().is_held_exclusive());
        for (i, x) in l.iter_mut().enumerate() {
            *x = i as f64;
        }
        assert_eq!(l.len(), 1000);
        drop(l);
        let before = rig.pool_stats();
        let l = Lease::<f64>::uninit(&rig, 1000).unwrap();
        let after = rig.pool_stats();
        assert_eq!((after.reused, after.fresh), (before.reused + 1, before.fresh));
        let a = l.into_array(&[10, 100]).unwrap();
        assert!(!a.buffer().is_held_exclusive());
        assert_eq!(a.get(&[3, 7]).unwrap(), 307.0, "the reused block's values are what was written");
    }

    #[test]
    fn zeroed_leases_are_zero_even_from_a_used_block_and_shapes_must_fit() {
        let rig = Rig::queued(Device::sim(1), std::time::Duration::from_micros(50), 3).unwrap();
        let mut l = Lease::<i32>::uninit(&rig, 77).unwrap();
        l.fill(-1);
        drop(l);
        let z = Lease::<i32>::zeroed(&rig, 77).unwrap();
        assert!(z.iter().all(|&x| x == 0));
        let e = z.into_array(&[7, 10]).unwrap_err();
        assert!(e.to_string().contains("Lease::into_array") && e.to_string().contains("70"), "{e}");
        // booleans from a block that held other bytes: zeroed all the same
        let mut l = Lease::<u8>::uninit(&rig, 5).unwrap();
        l.fill(7);
        drop(l);
        let before = rig.pool_stats().reused;
        let b = Lease::<bool>::uninit(&rig, 5).unwrap();
        assert_eq!(rig.pool_stats().reused, before + 1, "the block of sevens is reused");
        assert!(b.iter().all(|&x| !x));
        let empty = Lease::<f32>::uninit(&rig, 0).unwrap();
        assert_eq!(empty.into_array(&[0, 3]).unwrap().numel(), 0);
        let e = Lease::<f64>::uninit(&rig, usize::MAX / 4).unwrap_err();
        assert!(e.to_string().contains("Lease::uninit"), "{e}");
    }
}
