//! Every move keeps every element at the same bits as a copy would, and never reaches outside the
//! buffer: checked against a dense C-order reference model.

use nx_kernels::{Array, Layout, Move};
use nx_mesh::Device;
use proptest::prelude::*;

/// A dense reference: shape and C-order values.
#[derive(Clone, Debug)]
struct Dense {
    shape: Vec<usize>,
    data: Vec<u32>,
}

fn index_of(flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    let mut r = flat;
    for d in (0..shape.len()).rev() {
        idx[d] = r % shape[d];
        r /= shape[d];
    }
    idx
}

fn flat_of(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

impl Dense {
    fn map(&self, shape: Vec<usize>, from: impl Fn(&[usize]) -> Vec<usize>) -> Dense {
        let n: usize = shape.iter().product();
        let data = (0..n).map(|k| self.data[flat_of(&from(&index_of(k, &shape)), &self.shape)]).collect();
        Dense { shape, data }
    }

    /// The reference result of `m`, or `None` where the move is refused as an argument error.
    fn apply(&self, m: &Move) -> Option<Dense> {
        let r = self.shape.len();
        Some(match m {
            Move::Reshape(s) => {
                if s.iter().product::<usize>() != self.data.len() {
                    return None;
                }
                Dense { shape: s.clone(), data: self.data.clone() }
            }
            Move::Permute(p) => {
                let mut sorted = p.clone();
                sorted.sort_unstable();
                if sorted != (0..r).collect::<Vec<_>>() {
                    return None;
                }
                let shape = p.iter().map(|&a| self.shape[a]).collect();
                self.map(shape, |i| {
                    let mut src = vec![0; r];
                    for (k, &a) in p.iter().enumerate() {
                        src[a] = i[k];
                    }
                    src
                })
            }
            Move::Expand(s) => {
                if s.len() < r || s.len() > nx_kernels::MAX_RANK {
                    return None;
                }
                let lead = s.len() - r;
                if !self.shape.iter().zip(&s[lead..]).all(|(&a, &b)| a == b || a == 1) {
                    return None;
                }
                self.map(s.clone(), |i| (0..r).map(|d| if self.shape[d] == 1 { 0 } else { i[d + lead] }).collect())
            }
            Move::Slice { axis, start, stop, step } => {
                if *axis >= r || *step == 0 {
                    return None;
                }
                // Python's range(len)[start:stop:step], written out
                let n = self.shape[*axis] as isize;
                let picks: Vec<isize> = {
                    let norm = |i: isize| if i < 0 { i + n } else { i };
                    if *step > 0 {
                        let s = start.map_or(0, |s| norm(s).clamp(0, n));
                        let e = stop.map_or(n, |e| norm(e).clamp(0, n));
                        (s..e).step_by(*step as usize).collect()
                    } else {
                        let s = start.map_or(n - 1, |s| norm(s).clamp(-1, n - 1));
                        let e = stop.map_or(-1, |e| norm(e).clamp(-1, n - 1));
                        let mut v = Vec::new();
                        let mut i = s;
                        while i > e {
                            v.push(i);
                            i += step;
                        }
                        v
                    }
                };
                let mut shape = self.shape.clone();
                shape[*axis] = picks.len();
                self.map(shape, |i| {
                    let mut src = i.to_vec();
                    src[*axis] = picks[i[*axis]] as usize;
                    src
                })
            }
            Move::Flip(axis) => {
                if *axis >= r {
                    return None;
                }
                self.map(self.shape.clone(), |i| {
                    let mut src = i.to_vec();
                    src[*axis] = self.shape[*axis] - 1 - i[*axis];
                    src
                })
            }
            Move::Squeeze(axis) => {
                if *axis >= r || self.shape[*axis] != 1 {
                    return None;
                }
                let mut shape = self.shape.clone();
                shape.remove(*axis);
                Dense { shape, data: self.data.clone() }
            }
            Move::Unsqueeze(axis) => {
                if *axis > r || r == nx_kernels::MAX_RANK {
                    return None;
                }
                let mut shape = self.shape.clone();
                shape.insert(*axis, 1);
                Dense { shape, data: self.data.clone() }
            }
            Move::Window(w) => {
                if w.size.len() != r || w.stride.len() != r || w.dilation.len() != r || 2 * r > nx_kernels::MAX_RANK {
                    return None;
                }
                if (0..r).any(|d| w.size[d] == 0 || w.stride[d] == 0 || w.dilation[d] == 0) {
                    return None;
                }
                // window i's element e along axis d is element i·stride + e·dilation
                let counts = (0..r).map(|d| {
                    let span = (w.size[d] - 1) * w.dilation[d] + 1;
                    if self.shape[d] < span {
                        0
                    } else {
                        (self.shape[d] - span) / w.stride[d] + 1
                    }
                });
                let shape = counts.chain(w.size.iter().copied()).collect();
                self.map(shape, |i| (0..r).map(|d| i[d] * w.stride[d] + i[r + d] * w.dilation[d]).collect())
            }
        })
    }
}

fn arb_move(rank: usize) -> impl Strategy<Value = Move> {
    let r = rank.max(1);
    prop_oneof![
        prop::collection::vec(0usize..4, 0..4).prop_map(Move::Reshape),
        Just(()).prop_perturb(move |_, mut rng| {
            let mut p: Vec<usize> = (0..rank).collect();
            for i in (1..p.len()).rev() {
                p.swap(i, rng.random_range(0..=i));
            }
            Move::Permute(p)
        }),
        prop::collection::vec(0usize..4, 0..5).prop_map(Move::Expand),
        (0..r, prop::option::of(-6isize..6), prop::option::of(-6isize..6), prop_oneof![-3isize..0, 1isize..4])
            .prop_map(|(axis, start, stop, step)| Move::Slice { axis, start, stop, step }),
        (0..r).prop_map(Move::Flip),
        (0..r).prop_map(Move::Squeeze),
        (0..=rank).prop_map(Move::Unsqueeze),
        (
            prop::collection::vec(0usize..4, rank..=rank + 1),
            prop::collection::vec(0usize..4, rank..=rank),
            prop::collection::vec(1usize..3, rank..=rank)
        )
            .prop_map(|(size, stride, dilation)| Move::Window(nx_kernels::Windows { size, stride, dilation })),
    ]
}

fn arb_chain() -> impl Strategy<Value = (Vec<usize>, Vec<Move>)> {
    prop::collection::vec(0usize..5, 0..4).prop_flat_map(|shape| {
        let moves = prop::collection::vec(arb_move(shape.len()), 1..5);
        (Just(shape), moves)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20000))]

    #[test]
    fn moves_match_the_dense_reference((shape, moves) in arb_chain()) {
        let n: usize = shape.iter().product();
        let a = Array::<u32>::from_vec(Device::sim(0), &shape, (0..n as u32).map(|x| x * 7 + 1).collect()).unwrap();
        let mut dense = Dense { shape: shape.clone(), data: a.to_vec().unwrap() };
        let mut view = a.clone();
        for m in &moves {
            let want = dense.apply(m);
            match view.apply(m) {
                Err(_) => { prop_assert!(want.is_none(), "{m:?} refused on {:?}", view.shape()); break; }
                Ok(None) => {
                    // not a view: only a reshape may say so, and a copy then reshapes
                    prop_assert!(matches!(m, Move::Reshape(_)));
                    let want = want.unwrap();
                    view = view.copy().unwrap().apply(m).unwrap().expect("a contiguous array reshapes as a view");
                    dense = want;
                }
                Ok(Some(v)) => {
                    let want = want.expect("the reference accepts what the layout accepts");
                    view = v;
                    dense = want;
                }
            }
            prop_assert_eq!(view.shape(), &dense.shape[..]);
            prop_assert_eq!(view.to_vec().unwrap(), dense.data.clone(), "after {:?}", m);
            if let Some((lo, hi)) = view.layout().span() {
                // the view's own buffer: a copy (a reshape that is not a view) has a new one
                let bytes = view.buffer().bytes() as isize;
                prop_assert!(lo >= 0 && (hi + 1) * 4 <= bytes, "inside the buffer");
            }
        }
    }

    #[test]
    fn contiguous_reshapes_are_always_views((shape, _m) in arb_chain()) {
        let n: usize = shape.iter().product();
        let l = Layout::contiguous(&shape).unwrap();
        prop_assert!(l.is_contiguous());
        if n > 0 {
            prop_assert!(l.apply(&Move::Reshape(vec![n])).unwrap().is_some());
        }
    }
}

#[test]
fn bitcasts_follow_the_references_rules() {
    let a = Array::<f32>::from_vec(Device::sim(0), &[2, 3], vec![1.0, -2.0, 0.5, f32::NAN, 3.0, -0.0]).unwrap();
    let bits = a.bitcast::<u32>().unwrap().unwrap();
    let want: Vec<u32> = a.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
    assert_eq!(bits.to_vec().unwrap(), want);
    // narrowing appends an axis of extent 4 at stride 1
    let bytes = a.bitcast::<u8>().unwrap().unwrap();
    assert_eq!(bytes.shape(), [2, 3, 4]);
    assert_eq!(bytes.layout().strides(), [12, 4, 1]);
    assert_eq!(bytes.get(&[0, 0, 3]).unwrap(), 0x3F, "1.0f32 little-endian");
    // and widening removes it again
    let back = bytes.bitcast::<f32>().unwrap().unwrap();
    assert_eq!(back.to_vec().unwrap()[..3], a.to_vec().unwrap()[..3]);
    // widening a transposed byte view fails: its trailing axis is not at stride 1
    let t = bytes.apply(&Move::Permute(vec![0, 2, 1])).unwrap().unwrap();
    assert!(t.bitcast::<u32>().unwrap().is_none());
    // an offset that is not a multiple of the ratio fails
    let off = bytes.apply(&Move::Slice { axis: 2, start: Some(1), stop: Some(3), step: 1 }).unwrap().unwrap();
    assert!(off.bitcast::<u16>().unwrap().is_none());
    // a u8 view read as bool is never an invalid bool
    let b = Array::<u8>::from_vec(Device::sim(0), &[3], vec![0, 2, 255]).unwrap();
    assert_eq!(b.bitcast::<bool>().unwrap().unwrap().to_vec().unwrap(), [false, true, true]);
    // narrowing an array of MAX_RANK axes is an error
    let full = Array::<u16>::zeros(Device::sim(0), &[1; nx_kernels::MAX_RANK]).unwrap();
    assert!(full.bitcast::<u8>().is_err());
}

#[test]
fn arrays_check_their_layouts_and_elements() {
    let dev = Device::sim(0);
    let a = Array::<f64>::from_fn(dev, &[3, 4], |i| (i[0] * 4 + i[1]) as f64).unwrap();
    assert_eq!(a.get(&[2, 1]).unwrap(), 9.0);
    a.set(&[2, 1], -1.5).unwrap();
    assert_eq!(a.get(&[2, 1]).unwrap(), -1.5);
    let e = a.get(&[3, 0]).unwrap_err();
    assert!(e.to_string().contains("index [3, 0] is not an index of shape [3, 4]"), "{e}");
    let e = Array::<f64>::new(Layout::new(vec![2, 2], vec![2, 1], 9).unwrap(), a.buffer().clone()).unwrap_err();
    assert!(e.to_string().contains("past a buffer of 96 bytes"), "{e}");
    let e = Array::<f64>::new(Layout::new(vec![2], vec![-1], 0).unwrap(), a.buffer().clone()).unwrap_err();
    assert!(e.to_string().starts_with("nx_kernels::Array::new:"), "{e}");
    let e = Array::<u8>::from_vec(dev, &[2, 2], vec![1, 2, 3]).unwrap_err();
    assert!(e.to_string().contains("4 and 3"), "{e}");
    // rank 0 and empty arrays
    let s = Array::<i32>::from_vec(dev, &[], vec![42]).unwrap();
    assert_eq!(s.to_vec().unwrap(), [42]);
    assert_eq!(s.get(&[]).unwrap(), 42);
    let z = Array::<i32>::zeros(dev, &[3, 0, 2]).unwrap();
    assert_eq!(z.to_vec().unwrap(), Vec::<i32>::new());
    assert_eq!(z.copy().unwrap().shape(), [3, 0, 2]);
    // copy of a strided view is contiguous and equal
    let t = a.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    let c = t.copy().unwrap();
    assert!(c.layout().is_contiguous());
    assert_eq!(c.to_vec().unwrap(), t.to_vec().unwrap());
    assert_eq!(t.to_device(Device::sim(3)).unwrap().device(), Device::sim(3));
    // the buffer is 64-byte aligned host memory
    let any = c.clone().into_any();
    assert!(any.clone().expect::<f32>().is_err());
    assert_eq!(any.expect::<f64>().unwrap().to_vec().unwrap(), t.to_vec().unwrap());
    let e = Array::<f32>::zeros(Device::new(nx_mesh::DeviceKind::Cuda, 0, 0), &[2]).unwrap_err();
    assert!(e.to_string().contains("needs the `cuda` feature"), "{e}");
}
