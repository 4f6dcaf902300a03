//! The door: each refusal provoked and its message checked, precedence, exact overlap detection
//! against brute force, and claims from many threads.

use std::collections::HashSet;

use nx_kernels::door::{identical, shares_byte};
use nx_kernels::{door, Answer, AnyArray, Array, Buffer, Error, Layout, Move, Operand};
use nx_mesh::{Device, DeviceKind};
use proptest::prelude::*;

fn answer(e: Error) -> (Answer, String) {
    match e {
        Error::Refused { answer, message } => (answer, message),
        other => panic!("expected a refusal, got {other}"),
    }
}

fn f32s(v: &[f32]) -> Array<f32> {
    Array::from_vec(Device::sim(0), &[v.len()], v.to_vec()).unwrap()
}

#[test]
fn wrong_dtype() {
    let a = f32s(&[1.0, 2.0, 3.0]).into_any();
    let b = Array::<f64>::zeros(Device::sim(0), &[3]).unwrap().into_any();
    let (ans, msg) = answer(AnyArray::transfer(&a, &b).unwrap_err());
    assert_eq!(ans, Answer::WrongDtype);
    assert_eq!(
        msg,
        "nx_kernels::AnyArray::transfer: an operand's dtype is not the one the kernel loads (f32 [3], f64 [3])"
    );
}

#[test]
fn dead_buffers_say_why_they_died() {
    let a = f32s(&[1.0, 2.0, 3.0]);
    let b = f32s(&[1.0, 2.0, 3.0]);
    a.buffer().free().unwrap();
    let (ans, msg) = answer(a.to_vec().unwrap_err());
    assert_eq!(ans, Answer::DeadBuffer);
    assert_eq!(msg, "nx_kernels::Array::to_vec: f32 [3] was freed");
    let kept = b.buffer().donate("nx::mul (f32 [3], f32 [3])").unwrap();
    let (ans, msg) = answer(Array::transfer(&a, &b).unwrap_err());
    assert_eq!(ans, Answer::DeadBuffer);
    assert_eq!(
        msg,
        "nx_kernels::Array::transfer: f32 [3] was freed; f32 [3] was donated to nx::mul (f32 [3], f32 [3])"
    );
    // the donation's output lives over the same bytes
    let out = Array::<f32>::new(b.layout().clone(), kept).unwrap();
    assert_eq!(out.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    assert!(matches!(a.buffer().free(), Err(Error::Dead { .. })));
    let e = Array::<f32>::new(a.layout().clone(), a.buffer().clone()).unwrap_err();
    assert_eq!(e.to_string(), "nx_kernels::Array::new: the buffer is dead: it was freed");
}

#[test]
fn off_host_memory_is_refused() {
    let gpu = Device::new(DeviceKind::Cuda, 0, 0);
    let far = Array::<f32>::new(Layout::contiguous(&[4]).unwrap(), Buffer::unaddressed(gpu, 16)).unwrap();
    let (ans, msg) = answer(far.to_vec().unwrap_err());
    assert_eq!(ans, Answer::OffHost);
    assert!(msg.starts_with("nx_kernels::Array::to_vec: the host does not address"), "{msg}");
}

#[test]
fn memory_held_exclusive_is_refused_not_waited_for() {
    let a = f32s(&[1.0, 2.0]);
    let inner = door(&[&a], &[], || a.to_vec()).unwrap();
    let (ans, msg) = answer(inner.unwrap_err());
    assert_eq!(ans, Answer::HeldExclusive);
    assert_eq!(msg, "nx_kernels::Array::to_vec: an operand's memory is held exclusive (f32 [2])");
    // a shared claim admits other readers, not writers
    let ok = door(&[], &[&a], || a.to_vec()).unwrap();
    assert_eq!(ok.unwrap(), [1.0, 2.0]);
    let w = door(&[], &[&a], || a.set(&[0], 5.0)).unwrap();
    assert_eq!(answer(w.unwrap_err()).0, Answer::HeldExclusive);
    // and the buffer cannot be freed under a claim
    let f = door(&[], &[&a], || a.buffer().free()).unwrap();
    assert!(matches!(f, Err(Error::Busy { .. })));
    assert!(!a.buffer().is_held_exclusive(), "claims are released");
}

#[test]
fn read_only_memory_is_not_written() {
    let a = f32s(&[1.0, 2.0]);
    let ro = Array::<f32>::new(a.layout().clone(), a.buffer().read_only()).unwrap();
    assert_eq!(ro.to_vec().unwrap(), [1.0, 2.0]);
    let (ans, msg) = answer(ro.set(&[1], 0.0).unwrap_err());
    assert_eq!(ans, Answer::ReadOnly);
    assert_eq!(msg, "nx_kernels::Array::set: a written operand's memory is read-only (f32 [2])");
}

#[test]
fn repeated_elements_are_not_written() {
    let a = f32s(&[1.0]);
    let wide = a.apply(&Move::Expand(vec![3])).unwrap().unwrap();
    assert_eq!(wide.to_vec().unwrap(), [1.0, 1.0, 1.0]);
    let (ans, msg) = answer(wide.set(&[1], 2.0).unwrap_err());
    assert_eq!(ans, Answer::RepeatedElements);
    assert_eq!(msg, "nx_kernels::Array::set: a written operand reaches an element twice (f32 [3])");
    let src = f32s(&[4.0, 5.0, 6.0]);
    assert_eq!(answer(Array::transfer(&src, &wide).unwrap_err()).0, Answer::RepeatedElements);
}

#[test]
fn overlapping_operands_are_refused_and_identical_ones_allowed() {
    let a = f32s(&[0.0, 1.0, 2.0, 3.0]);
    let lo = a.apply(&Move::Slice { axis: 0, start: Some(0), stop: Some(3), step: 1 }).unwrap().unwrap();
    let hi = a.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 1 }).unwrap().unwrap();
    let (ans, msg) = answer(Array::transfer(&lo, &hi).unwrap_err());
    assert_eq!(ans, Answer::Overlapping);
    assert_eq!(
        msg,
        "nx_kernels::Array::transfer: a written operand shares bytes with another operand it is not identical to (f32 [3], f32 [3])"
    );
    // identical: allowed (an in-place transfer)
    Array::transfer(&lo, &lo.clone()).unwrap();
    // interleaved but disjoint: allowed
    let even = a.apply(&Move::Slice { axis: 0, start: None, stop: None, step: 2 }).unwrap().unwrap();
    let odd = a.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    Array::transfer(&even, &odd).unwrap();
    assert_eq!(a.to_vec().unwrap(), [0.0, 0.0, 2.0, 2.0]);
    // two buffers over one memory overlap too
    let ro = Array::<f32>::new(a.layout().clone(), a.buffer().read_only()).unwrap();
    let flipped = a.apply(&Move::Flip(0)).unwrap().unwrap();
    assert_eq!(answer(Array::transfer(&ro, &flipped).unwrap_err()).0, Answer::Overlapping);
}

#[test]
fn shape_mismatch_comes_last() {
    let a = f32s(&[1.0, 2.0]);
    let b = f32s(&[1.0, 2.0, 3.0]);
    let (ans, msg) = answer(Array::transfer(&a, &b).unwrap_err());
    assert_eq!(ans, Answer::ShapeMismatch);
    assert_eq!(msg, "nx_kernels::Array::transfer: the operands' shapes do not fit the operation (f32 [2], f32 [3])");
}

#[test]
fn precedence_dead_before_everything() {
    let a = f32s(&[1.0]);
    let ro = Array::<f32>::new(a.layout().clone(), a.buffer().read_only()).unwrap();
    let wide = ro.apply(&Move::Expand(vec![2])).unwrap().unwrap();
    ro.buffer().free().unwrap();
    // dead, read-only and repeating: dead wins
    assert_eq!(answer(wide.set(&[0], 1.0).unwrap_err()).0, Answer::DeadBuffer);
    let ro2 = Array::<f32>::new(a.layout().clone(), a.buffer().read_only()).unwrap();
    let wide2 = ro2.apply(&Move::Expand(vec![2])).unwrap().unwrap();
    // read-only and repeating: read-only wins (claiming answers it)
    assert_eq!(answer(wide2.set(&[0], 1.0).unwrap_err()).0, Answer::ReadOnly);
}

fn brute_shares(a: &Layout, sa: usize, b: &Layout, sb: usize) -> bool {
    let bytes = |l: &Layout, s: usize| -> HashSet<isize> {
        l.positions().flat_map(|p| (0..s as isize).map(move |k| p * s as isize + k)).collect()
    };
    !bytes(a, sa).is_disjoint(&bytes(b, sb))
}

fn arb_layout() -> impl Strategy<Value = (Layout, usize)> {
    (
        prop::collection::vec((0usize..4, -4isize..5), 0..4),
        0isize..12,
        prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
    )
        .prop_map(|(axes, off, size)| {
            let shape: Vec<usize> = axes.iter().map(|a| a.0).collect();
            let strides: Vec<isize> = axes.iter().map(|a| a.1).collect();
            // shift so that no position is negative
            let neg: isize =
                shape.iter().zip(&strides).map(|(&n, &s)| if s < 0 && n > 0 { (n as isize - 1) * s } else { 0 }).sum();
            (Layout::new(shape, strides, off - neg).unwrap(), size)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn overlap_detection_is_exact((a, sa) in arb_layout(), (b, sb) in arb_layout()) {
        prop_assert_eq!(shares_byte(&a, sa, &b, sb), brute_shares(&a, sa, &b, sb), "{:?}x{} vs {:?}x{}", a, sa, b, sb);
        if identical(&a, sa, &b, sb) && a.numel() > 0 {
            prop_assert!(shares_byte(&a, sa, &b, sb));
        }
        let positions: Vec<isize> = a.positions().collect();
        let distinct: HashSet<isize> = positions.iter().copied().collect();
        prop_assert_eq!(a.is_distinct(), distinct.len() == positions.len());
    }
}

#[test]
fn many_threads_claim_without_deadlock() {
    let a = f32s(&[1.0; 64]);
    let b = f32s(&[2.0; 64]);
    let (mut done, mut held) = (0, 0);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let (a, b) = (a.clone(), b.clone());
                s.spawn(move || {
                    let mut counts = (0, 0);
                    for _ in 0..500 {
                        let r = if t % 2 == 0 { Array::transfer(&a, &b) } else { Array::transfer(&b, &a) };
                        match r {
                            Ok(()) => counts.0 += 1,
                            Err(Error::Refused { answer: Answer::HeldExclusive, .. }) => counts.1 += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    counts
                })
            })
            .collect();
        for h in hs {
            let (d, w) = h.join().unwrap();
            done += d;
            held += w;
        }
    });
    assert_eq!(done + held, 4000);
    assert!(done > 0);
    assert!(!a.buffer().is_held_exclusive() && !b.buffer().is_held_exclusive());
    assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap());
    let _ = (&a as &dyn Operand).dtype();
}

#[test]
fn slices_in_place_hold_their_claims() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0]);
    // a view with an offset reads from its own first element
    let tail = a.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 1 }).unwrap().unwrap();
    assert_eq!(tail.with_slice(|s| s.to_vec()).unwrap(), [2.0, 3.0, 4.0]);
    a.with_slice_mut(|s| s[0] = 10.0).unwrap();
    assert_eq!(a.to_vec().unwrap(), [10.0, 2.0, 3.0, 4.0]);
    // readers admit readers, not writers; a writer admits nobody
    let inner = a.with_slice(|_| (a.to_vec(), a.with_slice_mut(|_| ()))).unwrap();
    assert_eq!(inner.0.unwrap(), [10.0, 2.0, 3.0, 4.0]);
    let (ans, msg) = answer(inner.1.unwrap_err());
    assert_eq!(ans, Answer::HeldExclusive);
    assert!(msg.starts_with("nx_kernels::Array::with_slice_mut:"), "{msg}");
    let (ans, _) = answer(a.with_slice_mut(|_| a.with_slice(|_| ())).unwrap().unwrap_err());
    assert_eq!(ans, Answer::HeldExclusive);
    // not C-contiguous: refused, naming the layout
    let every_other = a.apply(&Move::Slice { axis: 0, start: None, stop: None, step: 2 }).unwrap().unwrap();
    let e = every_other.with_slice(|_| ()).unwrap_err();
    assert!(e.to_string().starts_with("nx_kernels::Array::with_slice: the layout"), "{e}");
    a.buffer().free().unwrap();
    assert_eq!(answer(a.with_slice(|_| ()).unwrap_err()).0, Answer::DeadBuffer);
}

#[test]
fn large_buffers_are_mapped_zeroed_and_freed() {
    // past HUGE_MIN: mapped with a huge-page hint; zero until written, like every buffer
    let n = (nx_kernels::buffer::HUGE_MIN / 4) * 2 + 3;
    for _ in 0..3 {
        let a = Array::<f32>::zeros(Device::sim(0), &[n]).unwrap();
        assert!(a.with_slice(|s| s.iter().all(|&x| x == 0.0)).unwrap());
        a.with_slice_mut(|s| s.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32)).unwrap();
        assert_eq!(a.get(&[n - 1]).unwrap(), (n - 1) as f32);
        a.buffer().free().unwrap();
    }
}

/// Two views of a dense array's entries `i` and `j` along axis `axis` (that axis dropped), both
/// with one axis reversed where `flip`, their axes rotated by `rot.0` and `rot.1` (one lattice
/// listed in two orders): packed `q`, `k`, `v`.
fn entry_views(
    shape: &[usize],
    axis: usize,
    (i, j): (usize, usize),
    flip: Option<usize>,
    rot: (usize, usize),
) -> (Layout, Layout) {
    let mut strides = vec![1isize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1] as isize;
    }
    let view = |e: usize, rot: usize| {
        let mut sh: Vec<usize> = shape.to_vec();
        let mut st = strides.clone();
        let mut off = e as isize * st[axis];
        sh.remove(axis);
        st.remove(axis);
        if let Some(f) = flip.filter(|&f| f < sh.len()) {
            off += (sh[f] as isize - 1) * st[f];
            st[f] = -st[f];
        }
        let r = sh.len();
        let (sh, st): (Vec<usize>, Vec<isize>) = (0..r).map(|k| (sh[(k + rot) % r], st[(k + rot) % r])).unzip();
        Layout::new(sh, st, off).unwrap()
    };
    (view(i, rot.0), view(j, rot.1))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn interleaved_entries_of_one_array_meet_only_where_they_are_one_entry(
        shape in prop::collection::vec(1usize..5, 2..5),
        pick in (0usize..8, 0usize..8, 0usize..8),
        flip in prop::option::of(0usize..4),
        rot in (0usize..4, 0usize..4),
        size in prop_oneof![Just(1usize), Just(2), Just(4), Just(8)],
    ) {
        let axis = pick.0 % shape.len();
        let (i, j) = (pick.1 % shape[axis], pick.2 % shape[axis]);
        let (a, b) = entry_views(&shape, axis, (i, j), flip, rot);
        prop_assert_eq!(shares_byte(&a, size, &b, size), i == j, "{:?} vs {:?}", a, b);
        prop_assert_eq!(shares_byte(&a, size, &b, size), brute_shares(&a, size, &b, size));
    }

    #[test]
    fn a_strided_layout_moved_by_any_offset_meets_itself_exactly(
        axes in prop::collection::vec((1usize..4, 1isize..9, any::<bool>()), 1..4),
        shift in -40isize..40,
        size in prop_oneof![Just(1usize), Just(4)],
    ) {
        // strides of either sign (the offset keeps every position at 0 or past it)
        let shape: Vec<usize> = axes.iter().map(|a| a.0).collect();
        let strides: Vec<isize> = axes.iter().map(|a| if a.2 { -a.1 } else { a.1 }).collect();
        let a = Layout::new(shape.clone(), strides.clone(), 100).unwrap();
        let b = Layout::new(shape, strides, 100 + shift).unwrap();
        prop_assert_eq!(shares_byte(&a, size, &b, size), brute_shares(&a, size, &b, size), "{:?} vs {:?}", a, b);
    }
}
