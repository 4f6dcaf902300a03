//! Moving arrays between devices by the reference's rules: `to_device`'s layout (the seed's
//! examples and random layouts, against a rule written here), `borrow`, `export` and `overlaps`.

use std::time::Duration;

use nx_kernels::rig::Rig;
use nx_kernels::{Array, Buffer, Layout, Move};
use nx_mesh::Device;
use proptest::prelude::*;

#[test]
fn to_device_keeps_a_dense_layout_shifted_and_packs_a_sparse_one_by_stride() {
    let dev = Device::sim(0);
    // the seed's example: shape [3, 2] at strides [2, 2] (positions 0..6 with gaps) gets [2, 1]
    let base = Array::<f32>::from_fn(dev, &[8], |i| i[0] as f32).unwrap();
    let a = Array::<f32>::new(Layout::new(vec![3, 2], vec![2, 2], 0).unwrap(), base.buffer().clone()).unwrap();
    let c = a.to_device(Device::sim(1)).unwrap();
    assert_eq!(c.layout().strides(), [2, 1]);
    assert_eq!(c.to_vec().unwrap(), a.to_vec().unwrap());
    assert_eq!(c.device(), Device::sim(1));
    // a transposed (dense) layout is kept, shifted to 0
    let t =
        base.apply(&Move::Reshape(vec![2, 4])).unwrap().unwrap().apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    let c = t.to_device(dev).unwrap();
    assert_eq!((c.layout().strides(), c.layout().offset()), (&[1, 4][..], 0));
    // a flipped one too, its least position at 0
    let f = base.apply(&Move::Flip(0)).unwrap().unwrap();
    let c = f.to_device(dev).unwrap();
    assert_eq!((c.layout().strides(), c.layout().offset()), (&[-1][..], 7));
    assert_eq!(c.to_vec().unwrap(), f.to_vec().unwrap());
    // a broadcast axis keeps stride 0 and is stored once
    let b = base.apply(&Move::Reshape(vec![8, 1])).unwrap().unwrap().apply(&Move::Expand(vec![8, 5])).unwrap().unwrap();
    let c = b.to_device(dev).unwrap();
    assert_eq!(c.layout().strides()[1], 0);
    assert_eq!(c.buffer().bytes(), 8 * 4);
    assert_eq!(c.to_vec().unwrap(), b.to_vec().unwrap());
}

/// The rule, written independently: the elements stored (stride-0 axes once); the layout.
fn rule(shape: &[usize], strides: &[isize], offset: isize) -> (Vec<isize>, isize, usize) {
    let count: usize = shape.iter().zip(strides).map(|(&e, &s)| if s == 0 { e.min(1) } else { e }).product();
    let n: usize = shape.iter().product();
    if n == 0 {
        return (strides.to_vec(), 0, count);
    }
    let lo: isize =
        offset + shape.iter().zip(strides).map(|(&e, &s)| if s < 0 { (e as isize - 1) * s } else { 0 }).sum::<isize>();
    let hi: isize =
        offset + shape.iter().zip(strides).map(|(&e, &s)| if s > 0 { (e as isize - 1) * s } else { 0 }).sum::<isize>();
    if ((hi - lo + 1) as usize) <= count {
        return (strides.to_vec(), offset - lo, count);
    }
    // by decreasing |stride|, ties in axis order: bubble-sorted here, packed from the last
    let mut order: Vec<usize> = (0..shape.len()).collect();
    for i in 0..order.len() {
        for j in 0..order.len() - 1 - i {
            let (a, b) = (order[j], order[j + 1]);
            if strides[a].abs() < strides[b].abs() {
                order.swap(j, j + 1);
            }
        }
    }
    let mut out = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for &a in order.iter().rev() {
        if strides[a] != 0 {
            out[a] = if strides[a] < 0 { -acc } else { acc };
            acc *= shape[a] as isize;
        }
    }
    let off: isize = shape.iter().zip(&out).map(|(&e, &s)| if s < 0 { -(e as isize - 1) * s } else { 0 }).sum();
    (out, off, count)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn to_device_follows_the_rule_on_random_layouts(
        shape in prop::collection::vec(0usize..4, 0..4),
        strides in prop::collection::vec(-7isize..8, 4),
    ) {
        let strides = &strides[..shape.len()];
        let reach: isize = shape.iter().zip(strides).map(|(&e, &s)| (e.max(1) as isize - 1) * s.abs()).sum();
        let offset: isize = shape.iter().zip(strides).map(|(&e, &s)| if s < 0 { (e.max(1) as isize - 1) * -s } else { 0 }).sum();
        let base = Array::<u16>::from_fn(Device::sim(0), &[reach as usize + 1], |i| i[0] as u16 * 3 + 1).unwrap();
        let a = Array::<u16>::new(Layout::new(shape.clone(), strides.to_vec(), offset).unwrap(), base.buffer().clone()).unwrap();
        let c = a.to_device(Device::sim(1)).unwrap();
        let (want_strides, want_offset, count) = rule(&shape, strides, offset);
        prop_assert_eq!(c.layout().strides(), &want_strides[..]);
        if shape.iter().product::<usize>() > 0 {
            prop_assert_eq!(c.layout().offset(), want_offset);
        }
        prop_assert_eq!(c.buffer().bytes(), count * 2);
        prop_assert_eq!(c.to_vec().unwrap(), a.to_vec().unwrap());
    }
}

#[test]
fn borrow_shares_memory_where_the_device_maps_it() {
    let host = Rig::host(Device::sim(0)).unwrap();
    let other = Rig::queued(Device::sim(1), Duration::ZERO, 1).unwrap();
    let a = Array::<f32>::from_vec_on(&host, &[3], vec![1.0, 2.0, 3.0]).unwrap();
    assert!(a.borrow(&host).unwrap().unwrap().buffer() == a.buffer(), "on its own rig: itself");
    let b = a.borrow(&other).unwrap().expect("host memory maps");
    assert_eq!(b.device(), Device::sim(1));
    b.set(&[1], 9.0).unwrap();
    assert_eq!(a.to_vec().unwrap(), [1.0, 9.0, 3.0]);
    assert!(a.buffer().overlaps(b.buffer()));
    // the claims are shared: one lends, the other cannot write
    let inner = a.with_slice(|_| b.set(&[0], 5.0).map_err(|e| e.to_string())).unwrap();
    assert!(inner.unwrap_err().contains("held exclusive"));
    // memory the host does not address cannot be borrowed
    let off = Array::<f32>::new(Layout::contiguous(&[3]).unwrap(), Buffer::unaddressed(Device::sim(5), 12)).unwrap();
    assert!(off.borrow(&other).unwrap().is_none());
}

#[test]
fn exported_memory_is_never_held_exclusive_again() {
    let a = Array::<f32>::zeros(Device::sim(0), &[4]).unwrap();
    let c = Array::<f32>::zeros(Device::sim(0), &[4]).unwrap();
    assert!(!a.buffer().overlaps(c.buffer()));
    a.buffer().export().unwrap();
    assert!(a.buffer().is_exported());
    assert_eq!(a.to_vec().unwrap(), [0.0; 4], "reads still go");
    let e = a.set(&[0], 1.0).unwrap_err().to_string();
    assert!(e.contains("held exclusive"), "{e}");
}
