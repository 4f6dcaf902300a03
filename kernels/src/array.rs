//! Arrays: a dtype, a layout and a buffer, checked to stay inside the buffer.

use std::fmt;
use std::marker::PhantomData;

use nx_mesh::Device;

use crate::buffer::Buffer;
use crate::door::{refused, Operand};
use crate::layout::{Layout, Move};
use crate::rig::Rig;
use crate::{Dtype, Element, Error, Result};

/// An array of `T` elements over a buffer: its layout reaches only bytes of the buffer, at
/// non-negative positions, and its first element is aligned for `T`. Only this module makes one,
/// so every array keeps these facts. Cloning shares the buffer (a view).
///
/// Element access takes the buffer's claims through [`door`]: reads of a buffer held exclusive,
/// or of a dead one, are errors, never races.
///
/// # Examples
///
/// ```
/// use nx_kernels::{Array, Move};
/// use nx_mesh::Device;
///
/// let a = Array::from_fn(Device::sim(0), &[2, 3], |i| (i[0] * 10 + i[1]) as f32).unwrap();
/// let t = a.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
/// assert_eq!(t.to_vec().unwrap(), [0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
/// assert!(t.apply(&Move::Reshape(vec![6])).unwrap().is_none(), "a transposed layout flattens only by a copy");
/// ```
pub struct Array<T: Element> {
    layout: Layout,
    buffer: Buffer,
    elem: PhantomData<T>,
}

impl<T: Element> Clone for Array<T> {
    fn clone(&self) -> Self {
        Array { layout: self.layout.clone(), buffer: self.buffer.clone(), elem: PhantomData }
    }
}

impl<T: Element> fmt::Debug for Array<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array<{}>({:?} on {})", T::DTYPE, self.layout, self.buffer.device())
    }
}

impl<T: Element> Operand for Array<T> {
    fn dtype(&self) -> Dtype {
        T::DTYPE
    }
    fn layout(&self) -> &Layout {
        &self.layout
    }
    fn buffer(&self) -> &Buffer {
        &self.buffer
    }
}

/// An array whose dtype is chosen at run time; [`AnyArray::expect`] recovers the static type.
#[derive(Clone, Debug)]
pub struct AnyArray {
    dtype: Dtype,
    layout: Layout,
    buffer: Buffer,
}

impl Operand for AnyArray {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn layout(&self) -> &Layout {
        &self.layout
    }
    fn buffer(&self) -> &Buffer {
        &self.buffer
    }
}

impl AnyArray {
    /// The array at element type `T`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming both dtypes unless the array's dtype is `T`'s.
    pub fn expect<T: Element>(self) -> Result<Array<T>> {
        if self.dtype != T::DTYPE {
            return Err(Error::Invalid {
                func: "nx_kernels::AnyArray::expect",
                why: format!("the array is {}, not {}", self.dtype, T::DTYPE),
            });
        }
        Ok(Array { layout: self.layout, buffer: self.buffer, elem: PhantomData })
    }
}

impl AnyArray {
    /// An owned view of operand `o`: its dtype, layout and buffer (shared).
    pub(crate) fn of(o: &dyn Operand) -> AnyArray {
        AnyArray { dtype: o.dtype(), layout: o.layout().clone(), buffer: o.buffer().clone() }
    }

    /// The buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// [`Array::transfer`] for arrays whose dtypes are known at run time.
    ///
    /// # Errors
    /// [`Error::Refused`] with `WrongDtype` where the dtypes differ (checked first), then as
    /// [`Array::transfer`].
    pub fn transfer(src: &AnyArray, dst: &AnyArray) -> Result<()> {
        if src.dtype != dst.dtype {
            return Err(refused("nx_kernels::AnyArray::transfer", crate::Answer::WrongDtype, &[src, dst]));
        }
        macro_rules! typed {
            ($($d:ident => $t:ty),*) => {
                match src.dtype {
                    $(Dtype::$d => Array::<$t>::transfer(&src.clone().expect()?, &dst.clone().expect()?),)*
                }
            };
        }
        use half::{bf16, f16};
        use num_complex::{Complex32, Complex64};
        typed!(Bool => bool, I8 => i8, I16 => i16, I32 => i32, I64 => i64, U8 => u8, U16 => u16, U32 => u32,
            U64 => u64, F16 => f16, BF16 => bf16, F8E4M3 => crate::dtype::fp8::F8E4M3,
            F8E5M2 => crate::dtype::fp8::F8E5M2, F32 => f32, F64 => f64, C64 => Complex32, C128 => Complex64,
            I4 => crate::dtype::packed::I4, U4 => crate::dtype::packed::U4, Bit => crate::dtype::packed::Bit)
    }
}

/// Why a host access did not run: the door's refusal, or a lost device it must wait for.
enum Refusal {
    Door(crate::Answer),
    Lost(Error),
}

/// The door of a host access: claims `written` and `read`, waits for the work pending on every
/// one's memory (a device's queued kernels), then runs `f`.
fn host_door<R>(
    written: &[&dyn Operand],
    read: &[&dyn Operand],
    f: impl FnOnce() -> R,
) -> std::result::Result<R, Refusal> {
    let r = crate::door::door_packed(written, read, || -> Result<R> {
        for o in written.iter().chain(read) {
            o.buffer().wait()?;
        }
        Ok(f())
    });
    r.map_err(Refusal::Door)?.map_err(Refusal::Lost)
}

fn raise<T>(func: &'static str, r: std::result::Result<T, Refusal>, ops: &[&dyn Operand]) -> Result<T> {
    match r {
        Ok(v) => Ok(v),
        Err(Refusal::Door(a)) => Err(refused(func, a, ops)),
        Err(Refusal::Lost(Error::Lost { device, why, .. })) => Err(Error::Lost { func, device, why }),
        Err(Refusal::Lost(e)) => Err(e),
    }
}

impl<T: Element> Array<T> {
    /// The array of `T` elements laid out by `layout` over `buffer`.
    ///
    /// # Errors
    /// [`Error::Dead`] for a dead buffer; [`Error::Invalid`] where the layout reaches a negative
    /// position or a byte past the buffer, or its first element is not aligned for `T`.
    pub fn new(layout: Layout, buffer: Buffer) -> Result<Array<T>> {
        const FUNC: &str = "nx_kernels::Array::new";
        if let Some(d) = buffer.death() {
            return Err(Error::Dead { func: FUNC, why: d.to_string() });
        }
        let (size, bits) = (T::DTYPE.size() as isize, T::DTYPE.bits() as isize);
        if let Some((lo, hi)) = layout.span() {
            // positions lie within ±MAX_POSITION = isize::MAX / 32 (checked by `Layout::new`):
            // the byte offset fits (a packed element's bits are at most 4)
            let end = if T::DTYPE.is_packed() { ((hi + 1) * bits + 7) / 8 } else { (hi + 1) * size };
            if lo < 0 || end > buffer.bytes() as isize {
                return Err(Error::Invalid {
                    func: FUNC,
                    why: format!(
                        "layout {:?} at strides {:?} from {} reaches elements {lo}..={hi} of {}, past a buffer of {} bytes",
                        layout.shape(),
                        layout.strides(),
                        layout.offset(),
                        T::DTYPE,
                        buffer.bytes()
                    ),
                });
            }
            if !T::DTYPE.is_packed() && !((layout.offset() * size) as usize).is_multiple_of(T::DTYPE.align()) {
                return Err(Error::Invalid {
                    func: FUNC,
                    why: format!("first element at offset {} is misaligned", layout.offset()),
                });
            }
        }
        Ok(Array { layout, buffer, elem: PhantomData })
    }

    /// The C-contiguous layout of `shape` and its bytes of `T`.
    fn sized(func: &'static str, shape: &[usize]) -> Result<(Layout, usize)> {
        let layout = Layout::contiguous(shape)?;
        let bytes = T::DTYPE.bytes(layout.numel()).ok_or_else(|| Error::Invalid {
            func,
            why: format!("shape {shape:?} of {} overflows the address space", T::DTYPE),
        })?;
        Ok((layout, bytes))
    }

    /// A fresh C-contiguous array of `shape` on `device`, every element zero (`false`, `0`, `+0.0`),
    /// in memory fresh from the system (see [`Array::zeros_on`] for a device's pool).
    ///
    /// # Errors
    /// As [`Buffer::new`] and [`Layout::contiguous`].
    pub fn zeros(device: Device, shape: &[usize]) -> Result<Array<T>> {
        let (layout, bytes) = Array::<T>::sized("nx_kernels::Array::zeros", shape)?;
        Array::new(layout, Buffer::new(device, bytes)?)
    }

    /// A fresh C-contiguous array of `shape` on `rig`, every element zero, from its pool (a reused
    /// block zeroed at once: no work touches a cached block); on a dry rig ([`Rig::is_dry`]) its
    /// elements are unspecified.
    ///
    /// # Errors
    /// As [`Rig::alloc`] and [`Layout::contiguous`].
    pub fn zeros_on(rig: &Rig, shape: &[usize]) -> Result<Array<T>> {
        let (layout, bytes) = Array::<T>::sized("nx_kernels::Array::zeros_on", shape)?;
        Array::new(layout, rig.alloc(bytes)?)
    }

    /// As [`Array::zeros_on`], in memory of `kind` ([`Rig::alloc_in`]).
    ///
    /// # Errors
    /// As [`Array::zeros_on`].
    pub fn zeros_in(rig: &Rig, kind: crate::MemoryKind, shape: &[usize]) -> Result<Array<T>> {
        let (layout, bytes) = Array::<T>::sized("nx_kernels::Array::zeros_in", shape)?;
        Array::new(layout, rig.alloc_in(kind, bytes)?)
    }

    /// A fresh C-contiguous array of `shape` on `rig` from its pool, for a kernel to write whole:
    /// its elements are unspecified (a reused block's, or zeros; `bool` arrays are zeroed, as no
    /// other bytes are booleans).
    ///
    /// # Errors
    /// As [`Array::zeros_on`].
    pub fn uninit_on(rig: &Rig, shape: &[usize]) -> Result<Array<T>> {
        let (layout, bytes) = Array::<T>::sized("nx_kernels::Array::uninit_on", shape)?;
        // booleans and packed elements are zeroed: no other bytes are booleans, and the bits
        // beside a packed array's last element are zero
        let buffer =
            if T::DTYPE == Dtype::Bool || T::DTYPE.is_packed() { rig.alloc(bytes)? } else { rig.alloc_uninit(bytes)? };
        Array::new(layout, buffer)
    }

    /// A fresh C-contiguous array of `shape` on `device` holding `data` in C order.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] unless `data` has one element per index; as [`Array::zeros`].
    pub fn from_vec(device: Device, shape: &[usize], data: Vec<T>) -> Result<Array<T>> {
        Array::<T>::check_len("nx_kernels::Array::from_vec", shape, data.len())?;
        let a = Array::zeros(device, shape)?;
        a.fill_contiguous(data.into_iter())?;
        Ok(a)
    }

    /// [`Array::from_vec`] on `rig`, from its pool; on a dry rig ([`Rig::is_dry`]) its elements
    /// are unspecified (`data` is dropped: nothing writes a dry rig's memory).
    ///
    /// # Errors
    /// As [`Array::from_vec`] and [`Array::zeros_on`].
    pub fn from_vec_on(rig: &Rig, shape: &[usize], data: Vec<T>) -> Result<Array<T>> {
        Array::<T>::check_len("nx_kernels::Array::from_vec_on", shape, data.len())?;
        let a = Array::uninit_on(rig, shape)?;
        if !rig.is_dry() {
            a.fill_contiguous(data.into_iter())?;
        }
        Ok(a)
    }

    fn check_len(func: &'static str, shape: &[usize], len: usize) -> Result<()> {
        let n = crate::layout::numel(shape)?;
        if len != n {
            return Err(Error::LengthMismatch {
                func,
                what: format!("the elements for shape {shape:?} and the data given"),
                left: n,
                right: len,
            });
        }
        Ok(())
    }

    /// A fresh C-contiguous array of `shape` on `device` whose element at each index `i` is
    /// `f(i)`, called in C order.
    ///
    /// # Errors
    /// As [`Array::zeros`].
    pub fn from_fn(device: Device, shape: &[usize], f: impl FnMut(&[usize]) -> T) -> Result<Array<T>> {
        let a = Array::zeros(device, shape)?;
        a.fill_with(shape, f)?;
        Ok(a)
    }

    /// [`Array::from_fn`] on `rig`, from its pool; on a dry rig ([`Rig::is_dry`]) its elements
    /// are unspecified and `f` is not called.
    ///
    /// # Errors
    /// As [`Array::from_fn`] and [`Array::zeros_on`].
    pub fn from_fn_on(rig: &Rig, shape: &[usize], f: impl FnMut(&[usize]) -> T) -> Result<Array<T>> {
        let a = Array::uninit_on(rig, shape)?;
        if !rig.is_dry() {
            a.fill_with(shape, f)?;
        }
        Ok(a)
    }

    /// Fills a fresh array with `f` of each index, in C order.
    fn fill_with(&self, shape: &[usize], mut f: impl FnMut(&[usize]) -> T) -> Result<()> {
        let mut index = vec![0usize; shape.len()];
        let n = self.layout.numel();
        let values = (0..n).map(|k| {
            if k > 0 {
                for d in (0..index.len()).rev() {
                    index[d] += 1;
                    if index[d] < shape[d] {
                        break;
                    }
                    index[d] = 0;
                }
            }
            f(&index)
        });
        self.fill_contiguous(values.collect::<Vec<_>>().into_iter())
    }

    /// Writes a fresh, unshared array's elements; no claim is needed as no one else holds it, and
    /// no work touches fresh memory (a pool hands out only blocks no work touches).
    fn fill_contiguous(&self, values: impl Iterator<Item = T>) -> Result<()> {
        let base = self.buffer.host_ptr().expect("fresh host memory");
        for (k, v) in values.enumerate() {
            // SAFETY: the array is fresh and C-contiguous from offset 0, so element k lies at
            // position k, inside the buffer (checked by `new`) and aligned (64-byte base, k·size);
            // no work touches it.
            unsafe { T::store_at(base.as_ptr(), k as isize, v) }
        }
        Ok(())
    }

    /// The element dtype.
    pub fn dtype(&self) -> Dtype {
        T::DTYPE
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The device the array lives on.
    pub fn device(&self) -> Device {
        self.buffer.device()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The array with its dtype chosen at run time.
    pub fn into_any(self) -> AnyArray {
        AnyArray { dtype: T::DTYPE, layout: self.layout, buffer: self.buffer }
    }

    /// Reads the element at position `pos`.
    ///
    /// # Safety
    /// A claim on the buffer must be held, and `pos` must be a position of the layout.
    pub(crate) unsafe fn read_at(&self, base: *const u8, pos: isize) -> T {
        // SAFETY: positions of a checked layout lie inside the buffer and are aligned.
        unsafe { T::load_at(base, pos) }
    }

    /// Writes the element at position `pos`.
    ///
    /// # Safety
    /// An exclusive claim on the buffer must be held, and `pos` must be a position of the layout.
    pub(crate) unsafe fn write_at(&self, base: *mut u8, pos: isize, v: T) {
        // SAFETY: as `read_at`, with the exclusive claim ruling out other access (a packed
        // element's byte is stored atomically, keeping its other elements).
        unsafe { T::store_at(base, pos, v) }
    }

    fn base(&self) -> *mut u8 {
        self.buffer.host_ptr().map_or(std::ptr::null_mut(), |p| p.as_ptr())
    }

    /// The elements in C order of indices.
    ///
    /// # Errors
    /// [`Error::Refused`] for a dead buffer, memory held exclusive, or memory off the host;
    /// [`Error::OutOfMemory`] where the elements do not fit in memory (a broadcast view of many).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        // a broadcast view may have far more indices than its buffer has elements: the vector is
        // reserved first, and a size past memory is an error, never an abort
        let n = self.layout.numel();
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
            func: "nx_kernels::Array::to_vec",
            bytes: n.saturating_mul(size_of::<T>()),
            device: None,
            why: "the system refused (a view of more elements than its buffer holds)".into(),
        })?;
        let r = host_door(&[], &[self], || {
            let (base, l) = (self.base(), &self.layout);
            if T::DTYPE.is_packed() {
                // SAFETY: the door holds a shared claim; positions come from the checked layout.
                out.extend(l.positions().map(|p| unsafe { self.read_at(base, p) }));
                return out;
            }
            let mut runs = crate::runs::Runs::new(l.shape(), [l.strides()], [l.offset()], 0, n);
            let [s] = runs.inner_strides();
            while let Some(([p], k)) = runs.next_run() {
                // SAFETY: the door holds a shared claim; every position of the runs is one of the
                // checked layout's.
                out.extend((0..k as isize).map(|i| unsafe { self.read_at(base, p + i * s) }));
            }
            out
        });
        raise("nx_kernels::Array::to_vec", r, &[self])
    }

    /// Calls `f` with the elements of this C-contiguous array where they lie (no copy), holding
    /// a shared claim on its memory meanwhile (writers are refused until `f` returns); answers
    /// what `f` answers.
    ///
    /// # Errors
    /// [`Error::Invalid`] where the array is not C-contiguous; as [`Array::to_vec`].
    pub fn with_slice<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        const FUNC: &str = "nx_kernels::Array::with_slice";
        self.contiguous(FUNC)?;
        let r = host_door(&[], &[self], || {
            if self.layout.numel() == 0 {
                // no element: no address to form (an empty layout's offset may lie anywhere, and
                // memory off the host has none)
                return f(&[]);
            }
            // SAFETY: the door holds a shared claim on live host memory; a C-contiguous layout
            // holds numel elements from its offset inside the buffer (checked by `new`), aligned
            // (64-byte base, offsets in whole elements); nx's elements are plain data, and the
            // buffer holds values of T written through T's own stores.
            f(unsafe { std::slice::from_raw_parts(self.first(), self.layout.numel()) })
        });
        raise(FUNC, r, &[self])
    }

    /// Calls `f` with the elements of this C-contiguous array where they lie, to change them,
    /// holding an exclusive claim on its memory meanwhile (every other access is refused until `f`
    /// returns); answers what `f` answers.
    ///
    /// # Errors
    /// [`Error::Invalid`] where the array is not C-contiguous; [`Error::Refused`] for a dead or
    /// read-only buffer, memory held by another claim, or memory off the host.
    pub fn with_slice_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        const FUNC: &str = "nx_kernels::Array::with_slice_mut";
        self.contiguous(FUNC)?;
        let r = host_door(&[self], &[], || {
            if self.layout.numel() == 0 {
                return f(&mut []);
            }
            // SAFETY: as `with_slice`, with the door's exclusive claim ruling out every other
            // access to the memory while `f` runs; any value `f` stores is one of T's.
            f(unsafe { std::slice::from_raw_parts_mut(self.first(), self.layout.numel()) })
        });
        raise(FUNC, r, &[self])
    }

    /// `Ok` for a C-contiguous array of a dtype of whole bytes; else the refusal of `func`.
    fn contiguous(&self, func: &'static str) -> Result<()> {
        if T::DTYPE.is_packed() {
            return Err(Error::Invalid {
                func,
                why: format!("{} is packed (elements narrower than a byte): no slice holds them", T::DTYPE),
            });
        }
        if self.layout.is_contiguous() {
            return Ok(());
        }
        Err(Error::Invalid { func, why: format!("the layout {:?} is not C-contiguous", self.layout) })
    }

    /// The address of the element at the layout's offset (dereferenced only under a claim).
    fn first(&self) -> *mut T {
        self.base().wrapping_offset(self.layout.offset() * T::DTYPE.size() as isize).cast::<T>()
    }

    /// The element at `index`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an index that is not one of the shape; as [`Array::to_vec`].
    pub fn get(&self, index: &[usize]) -> Result<T> {
        let pos = self.layout.position(index)?;
        let r = host_door(&[], &[self], || {
            // SAFETY: shared claim held; `pos` is a position of the layout.
            unsafe { self.read_at(self.base(), pos) }
        });
        raise("nx_kernels::Array::get", r, &[self])
    }

    /// Stores `v` at `index`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an index that is not one of the shape; [`Error::Refused`] for a
    /// dead, held, read-only or off-host buffer, or an array reaching an element twice.
    pub fn set(&self, index: &[usize], v: T) -> Result<()> {
        let pos = self.layout.position(index)?;
        let r = host_door(&[self], &[], || {
            // SAFETY: exclusive claim held; `pos` is a position of the layout.
            unsafe { self.write_at(self.base(), pos, v) }
        });
        raise("nx_kernels::Array::set", r, &[self])
    }

    /// Stores `src`'s elements into `dst`, of the same shape, bit for bit (NaN payloads too). Writes
    /// `dst`'s elements and no other byte; into a dry rig's memory ([`Rig::is_dry`]: values
    /// unspecified), none.
    ///
    /// # Errors
    /// [`Error::Refused`] with `ShapeMismatch` for different shapes, and the door's refusals:
    /// `dst` reaching an element twice, sharing a byte with `src` without being identical to it,
    /// read-only, dead, held or off-host buffers.
    pub fn transfer(src: &Array<T>, dst: &Array<T>) -> Result<()> {
        let r = host_door(&[dst], &[src], || {
            if src.shape() != dst.shape() {
                return Err(crate::Answer::ShapeMismatch);
            }
            if dst.buffer.rig().is_some_and(Rig::is_dry) {
                return Ok(());
            }
            let (sb, db) = (src.base(), dst.base());
            let size = T::DTYPE.size();
            if src.layout.is_contiguous() && dst.layout.is_contiguous() && src.numel() > 0 && !T::DTYPE.is_packed() {
                // SAFETY: both claims held, both layouts dense over numel·size bytes from their
                // offsets, inside their buffers; `copy` allows the identical (same bytes) case.
                unsafe {
                    std::ptr::copy(
                        sb.offset(src.layout.offset() * size as isize),
                        db.offset(dst.layout.offset() * size as isize),
                        src.numel() * size,
                    )
                }
            } else if T::DTYPE.is_packed() {
                for (p, q) in src.layout.positions().zip(dst.layout.positions()) {
                    // SAFETY: claims held; positions of checked layouts.
                    unsafe { dst.write_at(db, q, src.read_at(sb, p)) }
                }
            } else {
                let (sl, dl) = (&src.layout, &dst.layout);
                let mut runs = crate::runs::Runs::new(
                    sl.shape(),
                    [sl.strides(), dl.strides()],
                    [sl.offset(), dl.offset()],
                    0,
                    sl.numel(),
                );
                let [ss, ds] = runs.inner_strides();
                while let Some(([p, q], n)) = runs.next_run() {
                    if ss == 1 && ds == 1 {
                        // SAFETY: claims held; a run of n elements from positions of checked
                        // layouts, contiguous in both; `copy` allows overlap.
                        unsafe { std::ptr::copy(sb.offset(p * size as isize), db.offset(q * size as isize), n * size) }
                    } else {
                        for i in 0..n as isize {
                            // SAFETY: claims held; each is a position of its checked layout.
                            unsafe { dst.write_at(db, q + i * ds, src.read_at(sb, p + i * ss)) }
                        }
                    }
                }
            }
            Ok(())
        });
        raise("nx_kernels::Array::transfer", r.and_then(|x| x.map_err(Refusal::Door)), &[src, dst])
    }

    /// A fresh C-contiguous array on this array's device holding its elements (from its rig's pool
    /// where it has one).
    ///
    /// # Errors
    /// As [`Array::zeros`] and [`Array::transfer`].
    pub fn copy(&self) -> Result<Array<T>> {
        let out = match self.buffer.rig() {
            Some(rig) => Array::uninit_on(rig, self.shape())?,
            None => Array::zeros(self.device(), self.shape())?,
        };
        Array::transfer(self, &out)?;
        Ok(out)
    }

    /// This array's elements on `device`, also when it is on `device`, in fresh memory of at most
    /// one element per index (an axis of stride 0 counted once), laid out by the reference's rule
    /// ([`Layout::copy_layout_bits`]): this layout shifted to position 0 where its span fits in that
    /// many elements (below a byte: shifted by whole bytes where the span's bytes fit, the bits
    /// beside its elements copied with them), else its axes packed by decreasing magnitude of
    /// stride. Shape [3, 2] at strides [2, 2] gets strides [2, 1].
    ///
    /// # Errors
    /// As [`Buffer::new`] and [`Array::transfer`].
    pub fn to_device(&self, device: Device) -> Result<Array<T>> {
        let (layout, count) = self.layout.copy_layout_bits(T::DTYPE.bits());
        self.copy_into(Array::new(layout, Buffer::new(device, Self::bytes_of(count)?)?)?)
    }

    /// The bytes of `count` elements, packed.
    fn bytes_of(count: usize) -> Result<usize> {
        T::DTYPE.bytes(count).ok_or_else(|| Error::Invalid {
            func: "nx_kernels::Array::to_device",
            why: format!("{count} elements of {} overflow the address space", T::DTYPE),
        })
    }

    /// Elements per byte of a packed dtype.
    fn per_byte() -> isize {
        (8 / T::DTYPE.bits().max(1)) as isize
    }

    /// Stores this array's elements into `out` (of its shape, laid out by
    /// [`Layout::copy_layout_bits`]): a kept layout by a copy of its whole span (its positions may
    /// repeat, as this one's do; below a byte, the span's whole bytes with their neighbours' bits),
    /// a packed one element by element, each position once where an axis is broadcast.
    fn copy_into(&self, out: Array<T>) -> Result<Array<T>> {
        let view = |a: &Array<T>, layout: Layout| Array::<T> { layout, buffer: a.buffer.clone(), elem: PhantomData };
        match self.layout.span() {
            Some((lo, hi))
                if T::DTYPE.is_packed()
                    && out.layout.strides() == self.layout.strides()
                    && out.layout.offset()
                        == self.layout.offset() - lo.div_euclid(Self::per_byte()) * Self::per_byte() =>
            {
                // The kept layout: the bytes from the first position's to the last's, neighbours'
                // bits included.
                let per = Self::per_byte();
                let (first, n) = (lo.div_euclid(per), (hi.div_euclid(per) - lo.div_euclid(per) + 1) as usize);
                let r = host_door(&[&out], &[self], || {
                    // SAFETY: both claims held; the source's bytes `first..first + n` hold its
                    // positions, inside its buffer; the copy's buffer holds at least `n` bytes
                    // (`copy_layout_bits`), and the buffers differ (the copy is fresh).
                    unsafe { std::ptr::copy_nonoverlapping(self.base().offset(first), out.base(), n) }
                });
                raise("nx_kernels::Array::to_device", r, &[self, &out])?;
            }
            Some((lo, hi)) if out.layout.strides() == self.layout.strides() => {
                let n = (hi - lo + 1) as usize;
                let (src, dst) = (Layout::new(vec![n], vec![1], lo)?, Layout::new(vec![n], vec![1], 0)?);
                Array::transfer(&view(self, src), &view(&out, dst))?;
            }
            Some(_) => Array::transfer(
                &view(self, self.layout.without_broadcast()),
                &view(&out, out.layout.without_broadcast()),
            )?,
            None => {}
        }
        Ok(out)
    }

    /// [`Array::to_device`] onto `rig`, from its pool.
    ///
    /// # Errors
    /// As [`Rig::alloc`] and [`Array::transfer`].
    pub fn to_rig(&self, rig: &Rig) -> Result<Array<T>> {
        let (layout, count) = self.layout.copy_layout_bits(T::DTYPE.bits());
        let bytes = Self::bytes_of(count)?;
        let buffer =
            if T::DTYPE == Dtype::Bool || T::DTYPE.is_packed() { rig.alloc(bytes)? } else { rig.alloc_uninit(bytes)? };
        self.copy_into(Array::new(layout, buffer)?)
    }

    /// This array on `rig` without a copy: its dtype and layout over a borrow of its buffer
    /// ([`Buffer::borrow`]), which shares the memory, so writes through either show in the other;
    /// this array itself where it is on `rig` already; `None` where `rig` cannot map its memory.
    ///
    /// # Errors
    /// [`Error::Dead`] for a dead buffer.
    pub fn borrow(&self, rig: &Rig) -> Result<Option<Array<T>>> {
        if let Some(d) = self.buffer.death() {
            return Err(Error::Dead { func: "nx_kernels::Array::borrow", why: d.to_string() });
        }
        if self.buffer.rig() == Some(rig) {
            return Ok(Some(self.clone()));
        }
        Ok(self.buffer.borrow(rig).map(|buffer| Array { layout: self.layout.clone(), buffer, elem: PhantomData }))
    }

    /// The array over this buffer laid out by `m` applied to this layout, or `None` where that is a
    /// reshape that cannot be a view (copy first).
    ///
    /// # Errors
    /// As [`Layout::apply`].
    pub fn apply(&self, m: &Move) -> Result<Option<Array<T>>> {
        Ok(self.layout.apply(m)?.map(|layout| Array { layout, buffer: self.buffer.clone(), elem: PhantomData }))
    }

    /// This array's bits read as `U` elements over the same buffer (see [`Layout::bitcast`]), or
    /// `None` where widening's conditions fail or the first element would be misaligned for `U`.
    ///
    /// # Errors
    /// [`Error::Dead`] for a dead buffer; [`Error::Invalid`] for a narrowing of an array of
    /// [`crate::MAX_RANK`] axes.
    pub fn bitcast<U: Element>(&self) -> Result<Option<Array<U>>> {
        if let Some(d) = self.buffer.death() {
            return Err(Error::Dead { func: "nx_kernels::Array::bitcast", why: d.to_string() });
        }
        let Some(layout) = self.layout.bitcast(T::DTYPE.bits(), U::DTYPE.bits())? else { return Ok(None) };
        if layout.numel() > 0
            && !U::DTYPE.is_packed()
            && !((layout.offset() * U::DTYPE.size() as isize) as usize).is_multiple_of(U::DTYPE.align())
        {
            return Ok(None);
        }
        Ok(Some(Array { layout, buffer: self.buffer.clone(), elem: PhantomData }))
    }
}
