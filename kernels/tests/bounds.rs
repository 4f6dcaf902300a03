//! Safe code never reaches outside a buffer: random shapes (overflowing ones among them), strides
//! and offsets go through every public constructor and view, and each answer is an error or an
//! array whose every element lies inside its buffer, aligned — checked in `i128` arithmetic here,
//! independent of the layout's own.

use nx_kernels::{Array, Buffer, Element, Layout, Move};
use nx_mesh::Device;
use proptest::prelude::*;

/// Extents: small, empty, and large enough that products overflow.
fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..5,
        1 => Just(1usize << 32),
        1 => Just(1usize << 62),
        1 => Just(usize::MAX / 3),
        1 => Just(usize::MAX),
    ]
}

/// Strides and offsets: small of both signs, and huge.
fn signed() -> impl Strategy<Value = isize> {
    prop_oneof![
        6 => -6isize..7,
        1 => Just(isize::MAX),
        1 => Just(isize::MIN),
        1 => Just(1isize << 60),
        1 => Just(-(1isize << 58)),
    ]
}

fn moves() -> impl Strategy<Value = Move> {
    let axis = 0usize..4;
    prop_oneof![
        prop::collection::vec(extent(), 0..4).prop_map(Move::Reshape),
        prop::collection::vec(0usize..4, 0..4).prop_map(Move::Permute),
        prop::collection::vec(extent(), 0..5).prop_map(Move::Expand),
        (axis.clone(), prop::option::of(signed()), prop::option::of(signed()), signed())
            .prop_map(|(axis, start, stop, step)| Move::Slice { axis, start, stop, step }),
        axis.clone().prop_map(Move::Flip),
        axis.clone().prop_map(Move::Squeeze),
        axis.prop_map(Move::Unsqueeze),
    ]
}

/// Every element of `a` lies inside its buffer at an aligned byte offset: its span, computed in
/// `i128`; and where it has few elements, each position by its index.
fn inside<T: Element>(a: &Array<T>) -> Result<(), TestCaseError> {
    let l = a.layout();
    let (shape, strides, offset) = (l.shape(), l.strides(), l.offset() as i128);
    let size = std::mem::size_of::<T>() as i128;
    let bytes = a.buffer().bytes() as i128;
    let count: i128 = if shape.contains(&0) {
        0
    } else {
        shape.iter().map(|&n| n as i128).try_fold(1i128, |a, n| a.checked_mul(n)).expect("a layout's count")
    };
    prop_assert_eq!(count, a.numel() as i128, "numel of {:?}", shape);
    if count == 0 {
        return Ok(());
    }
    let (mut lo, mut hi) = (offset, offset);
    for (&n, &s) in shape.iter().zip(strides) {
        let reach = (n as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    prop_assert!(lo >= 0 && (hi + 1) * size <= bytes, "{:?} reaches {}..={} of {} bytes", l, lo, hi, bytes);
    prop_assert_eq!((offset * size) % std::mem::align_of::<T>() as i128, 0, "misaligned {:?}", l);
    if count <= 512 {
        let mut index = vec![0usize; shape.len()];
        for _ in 0..count {
            let p: i128 = offset + index.iter().zip(strides).map(|(&i, &s)| i as i128 * s as i128).sum::<i128>();
            prop_assert!(p >= 0 && (p + 1) * size <= bytes);
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        if a.buffer().is_host() {
            // and reading them works: every element, through the door
            prop_assert_eq!(a.to_vec().map(|v| v.len() as i128).ok(), Some(count));
        }
    }
    Ok(())
}

/// Each move, then each bitcast, of `a`: errors or arrays inside the buffer.
fn views(a: &Array<f32>, ms: &[Move]) -> Result<(), TestCaseError> {
    let mut cur = a.clone();
    for m in ms {
        if let Ok(Some(v)) = cur.apply(m) {
            inside(&v)?;
            cur = v;
        }
    }
    if let Ok(Some(b)) = cur.bitcast::<u8>() {
        inside(&b)?;
    }
    if let Ok(Some(b)) = cur.bitcast::<f64>() {
        inside(&b)?;
    }
    if let Ok(Some(b)) = cur.bitcast::<num_complex::Complex64>() {
        inside(&b)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn constructors_answer_an_error_or_an_array_inside_its_buffer(
        shape in prop::collection::vec(extent(), 0..5),
        strides in prop::collection::vec(signed(), 0..5),
        offset in signed(),
        bytes in prop_oneof![0usize..512, Just(usize::MAX), Just(1usize << 40)],
        ms in prop::collection::vec(moves(), 0..4),
    ) {
        let dev = Device::sim(0);
        // fresh arrays of the shape: refused where its bytes pass the address space (never a
        // short buffer); made and checked where they are few (in between they would really
        // allocate gigabytes)
        let count = if shape.contains(&0) {
            0
        } else {
            shape.iter().try_fold(1u128, |a, &n| a.checked_mul(n as u128)).unwrap_or(u128::MAX)
        };
        if count.saturating_mul(16) > isize::MAX as u128 {
            prop_assert!(Array::<f32>::zeros(dev, &shape).is_err(), "zeros of {:?}", shape);
            prop_assert!(Array::<u8>::from_fn(dev, &shape, |_| 1).is_err(), "from_fn of {:?}", shape);
        } else if shape.iter().any(|&e| e > isize::MAX as usize) {
            // an empty shape with an extent past numpy's limit
            prop_assert!(Array::<f32>::zeros(dev, &shape).is_err(), "zeros of {:?}", shape);
        } else if count <= 1 << 16 {
            let a = Array::<f32>::zeros(dev, &shape).unwrap();
            inside(&a)?;
            views(&a, &ms)?;
            inside(&Array::<u8>::from_fn(dev, &shape, |_| 1).unwrap())?;
            inside(&Array::<f32>::from_vec(dev, &shape, vec![0.0; count as usize]).unwrap())?;
            prop_assert!(Array::<f32>::from_vec(dev, &shape, vec![0.0; count as usize + 1]).is_err());
        }
        // a layout of its own over a small buffer, and over a large one the host does not address
        let strides: Vec<isize> = strides.iter().copied().chain(std::iter::repeat(1)).take(shape.len()).collect();
        if let Ok(layout) = Layout::new(shape.clone(), strides, offset) {
            let small = Buffer::new(dev, bytes.min(4096)).unwrap();
            for buffer in [small, Buffer::unaddressed(dev, bytes)] {
                if let Ok(a) = Array::<f32>::new(layout.clone(), buffer.clone()) {
                    inside(&a)?;
                    views(&a, &ms)?;
                    let _ = a.with_slice(|s| s.len());
                }
                if let Ok(a) = Array::<num_complex::Complex64>::new(layout.clone(), buffer) {
                    inside(&a)?;
                }
            }
        }
    }
}

#[test]
fn the_issues_overflowing_shape_is_refused() {
    // [2^32, 2^32] f64 needs 2^67 bytes: once a 1-byte buffer, whose `get` read 16 GiB past it
    let e = Array::<f64>::zeros(Device::sim(0), &[1 << 32, 1 << 32]).unwrap_err().to_string();
    assert!(e.contains("contiguous_strides") && e.contains("[4294967296, 4294967296]"), "{e}");
    let e = Layout::new(vec![3, 1 << 62], vec![1 << 60, 1], 0).unwrap_err().to_string();
    assert!(e.starts_with("nx_kernels::Layout::new"), "{e}");
    let e = nx_kernels::layout::numel(&[usize::MAX, 2]).unwrap_err().to_string();
    assert!(e.starts_with("nx_kernels::layout::numel"), "{e}");
}

#[test]
fn an_empty_array_lends_an_empty_slice_wherever_it_lies() {
    // an empty layout may start anywhere, over memory the host does not address: no pointer is
    // formed from it
    let dev = Device::sim(0);
    let l = Layout::new(vec![0, 3], vec![3, 1], 1 << 40).unwrap();
    for b in [Buffer::unaddressed(dev, 8), Buffer::new(dev, 8).unwrap()] {
        let a = Array::<f64>::new(l.clone(), b).unwrap();
        assert_eq!(a.with_slice(|s| s.len()).unwrap(), 0);
        assert_eq!(a.with_slice_mut(|s| s.len()).unwrap(), 0);
    }
}

#[test]
fn claims_are_per_memory_not_per_handle() {
    // a read-only second handle on the same bytes: while one lends its elements, the other cannot
    // lend them for writing (no `&[T]` and `&mut [T]` over one byte at once)
    let a = Array::<f32>::zeros(Device::sim(0), &[4]).unwrap();
    let ro = Array::<f32>::new(a.layout().clone(), a.buffer().read_only()).unwrap();
    let inner = ro.with_slice(|_| a.with_slice_mut(|s| s[0] = 1.0).map_err(|e| e.to_string())).unwrap();
    assert!(inner.unwrap_err().contains("held exclusive"));
    let inner = a.with_slice_mut(|_| ro.with_slice(|s| s[0]).map_err(|e| e.to_string())).unwrap();
    assert!(inner.unwrap_err().contains("held exclusive"));
    // a busy memory cannot be freed or donated through either handle
    let busy = ro.with_slice(|_| a.buffer().free().map_err(|e| e.to_string())).unwrap();
    assert!(busy.unwrap_err().contains("Buffer::free"));
    // and with no claim held, both lend again
    assert_eq!(ro.with_slice(|s| s.len()).unwrap(), 4);
    a.with_slice_mut(|s| s[0] = 2.0).unwrap();
    assert_eq!(ro.to_vec().unwrap()[0], 2.0);
    // a donated buffer's successor shares the memory's claims with the read-only handle too
    let next = Array::<f32>::new(a.layout().clone(), a.buffer().donate("nx::test").unwrap()).unwrap();
    let inner = ro.with_slice(|_| next.with_slice_mut(|s| s[0] = 3.0).map_err(|e| e.to_string())).unwrap();
    assert!(inner.unwrap_err().contains("held exclusive"));
    assert!(a.to_vec().unwrap_err().to_string().contains("donated to nx::test"));
}

#[test]
fn a_broadcast_of_more_elements_than_memory_is_an_error_when_read() {
    // [1] expanded to 2^40 indices is a valid view (one element, read many times); reading it
    // whole would need 4 TiB: an error, not an abort
    let a = Array::<f32>::zeros(Device::sim(0), &[1]).unwrap();
    let big = a.apply(&Move::Expand(vec![1 << 40])).unwrap().unwrap();
    assert_eq!(big.numel(), 1 << 40);
    assert_eq!(big.get(&[(1 << 40) - 1]).unwrap(), 0.0);
    let e = big.to_vec().unwrap_err().to_string();
    assert!(e.contains("nx_kernels::Array::to_vec: cannot allocate 4398046511104 bytes"), "{e}");
}
