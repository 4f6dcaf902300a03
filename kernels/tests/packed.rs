//! The packed dtypes (`int4`, `uint4`, `bit`) as arrays: their bits in memory (element 0 in the
//! low bits), the bits beside the last element, views and bitcasts to and from byte dtypes,
//! stores keeping a byte's other elements from several threads at once, maps over them (casts
//! against numpy's `ml_dtypes` in `data/int4_conformance.txt`, arithmetic against wrapping
//! arithmetic written here), the door's byte overlap at bit granularity, and every other kernel
//! refusing them.

use nx_kernels::dtype::packed::{Bit, I4, U4};
use nx_kernels::host::{HostOptions, Store};
use nx_kernels::prog::{BinOp, Prog};
use nx_kernels::{Answer, Array, Buffer, Contraction, Dtype, Element, Host, Kernels, Layout, Move, Reduction};
use nx_mesh::Device;

const DEV: Device = Device { kind: nx_mesh::DeviceKind::Sim, ordinal: 0, rank: 0 };
const TABLE: &str = include_str!("data/int4_conformance.txt");

/// The bytes of `a`'s whole buffer, read as `u8`.
fn bytes_of<T: Element>(a: &Array<T>) -> Vec<u8> {
    let b: &Buffer = a.buffer();
    Array::<u8>::new(Layout::contiguous(&[b.bytes()]).unwrap(), b.clone()).unwrap().to_vec().unwrap()
}

/// The reference packing: element k's `bits` at bit k·bits, low bits first.
fn packed(fields: &[u8], bits: usize) -> Vec<u8> {
    let mut out = vec![0u8; (fields.len() * bits).div_ceil(8)];
    for (k, &f) in fields.iter().enumerate() {
        out[k * bits / 8] |= (f & ((1u16 << bits) - 1) as u8) << (k * bits % 8);
    }
    out
}

#[test]
fn memory_holds_element_zero_in_the_low_bits_and_zeros_past_the_last() {
    for n in [0usize, 1, 2, 7, 8, 9, 17] {
        let vals: Vec<i8> = (0..n).map(|k| (k as i8 * 5) % 16 - 8).collect();
        let a = Array::<I4>::from_vec(DEV, &[n], vals.iter().map(|&v| I4::new(v).unwrap()).collect()).unwrap();
        assert_eq!(a.buffer().bytes(), n.div_ceil(2), "int4 × {n}");
        assert_eq!(bytes_of(&a), packed(&vals.iter().map(|&v| v as u8).collect::<Vec<_>>(), 4), "int4 × {n}");
        assert_eq!(a.to_vec().unwrap().iter().map(|x| x.get()).collect::<Vec<_>>(), vals);
        let us: Vec<u8> = (0..n).map(|k| (k * 7 % 16) as u8).collect();
        let u = Array::<U4>::from_vec(DEV, &[n], us.iter().map(|&v| U4::new(v).unwrap()).collect()).unwrap();
        assert_eq!(bytes_of(&u), packed(&us, 4), "uint4 × {n}");
        let bs: Vec<bool> = (0..n).map(|k| k % 3 != 1).collect();
        let b = Array::<Bit>::from_vec(DEV, &[n], bs.iter().map(|&v| Bit(v)).collect()).unwrap();
        assert_eq!(b.buffer().bytes(), n.div_ceil(8), "bit × {n}");
        assert_eq!(bytes_of(&b), packed(&bs.iter().map(|&v| u8::from(v)).collect::<Vec<_>>(), 1), "bit × {n}");
        assert_eq!(b.to_vec().unwrap().iter().map(|x| x.get()).collect::<Vec<_>>(), bs);
    }
    // uneven shapes, rank 0, an empty axis
    let a = Array::<U4>::from_fn(DEV, &[3, 5], |i| U4::wrapping((i[0] * 5 + i[1]) as i128)).unwrap();
    assert_eq!(a.buffer().bytes(), 8);
    assert_eq!(a.get(&[2, 4]).unwrap().get(), 14);
    let s = Array::<Bit>::from_vec(DEV, &[], vec![Bit(true)]).unwrap();
    assert_eq!((s.get(&[]).unwrap(), s.buffer().bytes()), (Bit(true), 1));
    let e = Array::<I4>::zeros(DEV, &[4, 0, 3]).unwrap();
    assert_eq!((e.to_vec().unwrap().len(), e.buffer().bytes()), (0, 0));
}

#[test]
fn views_sets_and_copies_keep_the_other_elements_of_a_byte() {
    let n = 13;
    let a = Array::<I4>::from_fn(DEV, &[n], |i| I4::wrapping(i[0] as i128 - 6)).unwrap();
    // every other element, from position 1, reversed: a strided, offset, negative view
    let odd = a.apply(&Move::Slice { axis: 0, start: Some(1), stop: None, step: 2 }).unwrap().unwrap();
    let odd = odd.apply(&Move::Flip(0)).unwrap().unwrap();
    assert_eq!(odd.to_vec().unwrap().iter().map(|x| x.get()).collect::<Vec<_>>(), vec![5, 3, 1, -1, -3, -5]);
    for k in 0..6 {
        odd.set(&[k], I4::new(-8 + k as i8).unwrap()).unwrap();
    }
    let want: Vec<i8> = (0..n).map(|p| if p % 2 == 1 { -8 + ((11 - p) / 2) as i8 } else { p as i8 - 6 }).collect();
    assert_eq!(a.to_vec().unwrap().iter().map(|x| x.get()).collect::<Vec<_>>(), want, "the even elements kept");
    // a copy of the view, a transfer into another view, to_device
    let c = odd.copy().unwrap();
    assert_eq!(c.to_vec().unwrap(), odd.to_vec().unwrap());
    assert_eq!(c.buffer().bytes(), 3);
    let dst = Array::<I4>::zeros(DEV, &[12]).unwrap();
    let evens = dst.apply(&Move::Slice { axis: 0, start: Some(0), stop: None, step: 2 }).unwrap().unwrap();
    Array::transfer(&odd, &evens).unwrap();
    let got: Vec<i8> = dst.to_vec().unwrap().iter().map(|x| x.get()).collect();
    let mut expect = vec![0i8; 12];
    for (k, v) in odd.to_vec().unwrap().iter().enumerate() {
        expect[2 * k] = v.get();
    }
    assert_eq!(got, expect, "a transfer writes its elements and no neighbour");
    let moved = odd.to_device(DEV).unwrap();
    assert_eq!(moved.to_vec().unwrap(), odd.to_vec().unwrap());
    // no slice holds packed elements
    let e = a.with_slice(|_| ()).unwrap_err().to_string();
    assert!(e.contains("with_slice") && e.contains("i4") && e.contains("packed"), "{e}");
}

#[test]
fn to_device_keeps_a_fitting_layout_and_the_bits_beside_it() {
    // bytes 0x21 0x43 0x65 0x87 0xA9: nibbles 1..=10 low first
    let raw = Array::<u8>::from_vec(DEV, &[5], vec![0x21, 0x43, 0x65, 0x87, 0xA9]).unwrap();
    let nib = raw.bitcast::<U4>().unwrap().unwrap().apply(&Move::Reshape(vec![10])).unwrap().unwrap();
    // positions 3..=7 span bytes 1..=3, the three bytes five elements take: the layout is kept,
    // shifted by one byte, and the copy's first and last bytes keep nibbles 3 and 9 beside them
    let mid = nib.apply(&Move::Slice { axis: 0, start: Some(3), stop: Some(8), step: 1 }).unwrap().unwrap();
    let moved = mid.to_device(DEV).unwrap();
    assert_eq!((moved.layout().offset(), moved.layout().strides()), (1, &[1isize][..]));
    assert_eq!(moved.to_vec().unwrap(), mid.to_vec().unwrap());
    let bytes = |a: &Array<U4>| {
        let whole =
            Array::<U4>::new(Layout::new(vec![a.buffer().bytes(), 2], vec![2, 1], 0).unwrap(), a.buffer().clone())
                .unwrap();
        whole.bitcast::<u8>().unwrap().unwrap().to_vec().unwrap()
    };
    assert_eq!(bytes(&moved), vec![0x43, 0x65, 0x87]);
    // reversed, the same bytes: kept too
    let rev = mid.apply(&Move::Flip(0)).unwrap().unwrap();
    let moved = rev.to_device(DEV).unwrap();
    assert_eq!((moved.layout().offset(), moved.layout().strides()), (5, &[-1isize][..]));
    assert_eq!(moved.to_vec().unwrap(), rev.to_vec().unwrap());
    assert_eq!(bytes(&moved), vec![0x43, 0x65, 0x87]);
    // positions 3..=6 span bytes 1..=3, more than four elements take: packed, zeros beside
    let short = nib.apply(&Move::Slice { axis: 0, start: Some(3), stop: Some(7), step: 1 }).unwrap().unwrap();
    let moved = short.to_device(DEV).unwrap();
    assert_eq!((moved.layout().offset(), bytes(&moved)), (0, vec![0x54, 0x76]));
    // bits: positions 1..=6 of a byte keep bits 0 and 7 of it
    let bits = raw.bitcast::<Bit>().unwrap().unwrap().apply(&Move::Reshape(vec![40])).unwrap().unwrap();
    let six = bits.apply(&Move::Slice { axis: 0, start: Some(1), stop: Some(7), step: 1 }).unwrap().unwrap();
    let moved = six.to_device(DEV).unwrap();
    assert_eq!(moved.to_vec().unwrap(), six.to_vec().unwrap());
    assert_eq!(moved.layout().offset(), 1);
    let whole = Array::<Bit>::new(Layout::new(vec![1, 8], vec![8, 1], 0).unwrap(), moved.buffer().clone()).unwrap();
    assert_eq!(whole.bitcast::<u8>().unwrap().unwrap().to_vec().unwrap(), vec![0x21], "bits 0 and 7 kept");
}

#[test]
fn bitcasts_to_and_from_bytes() {
    let raw = Array::<u8>::from_vec(DEV, &[2, 3], vec![0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB]).unwrap();
    let nib = raw.bitcast::<U4>().unwrap().unwrap();
    assert_eq!(nib.shape(), [2, 3, 2]);
    assert_eq!(nib.to_vec().unwrap().iter().map(|x| x.get()).collect::<Vec<_>>(), (1..=12).collect::<Vec<u8>>());
    let ints = raw.bitcast::<I4>().unwrap().unwrap();
    assert_eq!(ints.get(&[1, 2, 1]).unwrap().get(), -4, "0xC as two's complement");
    let bits = raw.bitcast::<Bit>().unwrap().unwrap();
    assert_eq!(bits.shape(), [2, 3, 8]);
    let b: Vec<bool> = bits.to_vec().unwrap().iter().map(|x| x.get()).collect();
    for (k, &byte) in [0x21u8, 0x43, 0x65, 0x87, 0xA9, 0xCB].iter().enumerate() {
        for j in 0..8 {
            assert_eq!(b[k * 8 + j], (byte >> j) & 1 == 1, "byte {k} bit {j}");
        }
    }
    // and back: the trailing axis of 2 (8) folds into bytes
    let back = nib.bitcast::<u8>().unwrap().unwrap();
    assert_eq!(back.to_vec().unwrap(), raw.to_vec().unwrap());
    let back = bits.bitcast::<u8>().unwrap().unwrap();
    assert_eq!(back.to_vec().unwrap(), raw.to_vec().unwrap());
    // a bit view of int4s: each nibble's four bits
    let four = ints.bitcast::<Bit>().unwrap().unwrap();
    assert_eq!(four.shape(), [2, 3, 2, 4]);
    assert_eq!(four.get(&[0, 0, 1, 1]).unwrap(), Bit(true), "0x2's bit 1");
    // f32s into bits and back
    let f = Array::<f32>::from_vec(DEV, &[2], vec![1.0, -2.0]).unwrap();
    let fb = f.bitcast::<Bit>().unwrap().unwrap();
    assert_eq!(fb.shape(), [2, 32]);
    assert_eq!(fb.get(&[1, 31]).unwrap(), Bit(true), "the sign of -2");
    assert_eq!(fb.bitcast::<f32>().unwrap().unwrap().to_vec().unwrap(), vec![1.0, -2.0]);
    // widening needs a whole trailing group: 5 nibbles are no bytes, nor is an odd start
    let five = Array::<I4>::zeros(DEV, &[5]).unwrap();
    assert!(five.bitcast::<u8>().unwrap().is_none());
    let shifted = Array::<I4>::zeros(DEV, &[6]).unwrap();
    let s = shifted.apply(&Move::Slice { axis: 0, start: Some(1), stop: Some(5), step: 1 }).unwrap().unwrap();
    let s = s.apply(&Move::Reshape(vec![2, 2])).unwrap().unwrap();
    assert!(s.bitcast::<u8>().unwrap().is_none(), "an odd first element lies mid-byte");
}

#[test]
fn concurrent_stores_keep_a_bytes_other_elements() {
    // the element stores themselves: 8 threads, one bit each of one byte, 20 000 stores apiece
    let mut byte = vec![0u8; 1];
    let p = byte.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for k in 0..20_000 {
                    // SAFETY: `byte` outlives the scope; every access to it is an element store.
                    unsafe { <Bit as Element>::store_at(p as *mut u8, t, Bit((k + t as usize) % 2 == 1)) }
                }
            });
        }
    });
    // each thread's last store: k = 19 999
    let want: u8 = (0..8).map(|t| u8::from((19_999 + t) % 2 == 1) << t).sum();
    assert_eq!(byte[0], want);
    // two threads on the two nibbles of each byte of an int4 array
    let mut nibbles = vec![0u8; 64];
    let p = nibbles.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..2isize {
            s.spawn(move || {
                for round in 0..300i32 {
                    for b in 0..64isize {
                        let v = I4::wrapping(i128::from(round) + b as i128 * (t as i128 + 1));
                        // SAFETY: as above.
                        unsafe { <I4 as Element>::store_at(p as *mut u8, 2 * b + t, v) }
                    }
                }
            });
        }
    });
    for (b, &got) in nibbles.iter().enumerate() {
        let (lo, hi) = (I4::wrapping(299 + b as i128), I4::wrapping(299 + 2 * b as i128));
        assert_eq!(got, lo.to_bits() | hi.to_bits() << 4, "byte {b}");
    }
    // Array::set from several threads: each set claims the array (a set meeting another's claim is
    // refused, and retried here); every element ends as its thread left it
    let a = Array::<I4>::zeros(DEV, &[16]).unwrap();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let a = &a;
            s.spawn(move || {
                for k in 0..200 {
                    for j in 0..4 {
                        let v = I4::wrapping((k + t + j) as i128);
                        // another set's claim is refused; anything else is a failure
                        while let Err(e) = a.set(&[j * 4 + t], v) {
                            assert!(
                                matches!(e, nx_kernels::Error::Refused { answer: Answer::HeldExclusive, .. }),
                                "{e}"
                            );
                            std::hint::spin_loop();
                        }
                    }
                }
            });
        }
    });
    let got = a.to_vec().unwrap();
    for (i, &g) in got.iter().enumerate() {
        let (j, t) = (i / 4, i % 4);
        assert_eq!(g, I4::wrapping((199 + t + j) as i128), "element {i}");
    }
}

/// The table's lines of `format`: (kind, input, pattern).
fn table(format: &str) -> Vec<(&'static str, String, u8)> {
    TABLE
        .lines()
        .filter_map(|l| {
            let f: Vec<&'static str> = l.split(' ').collect();
            (f[0] == format).then(|| (f[1], f[2].to_string(), u8::from_str_radix(f[3].trim(), 16).unwrap_or(0)))
        })
        .collect()
}

fn cast(from: Dtype, to: Dtype) -> Prog {
    let mut p = Prog::new(&[from]);
    let l = p.load(0);
    let c = p.cast(l, to);
    p.output(c);
    p
}

#[test]
fn casts_match_ml_dtypes_and_saturate_past_the_range() {
    let host = Host::new();
    for (format, d, lo, hi) in [("int4", Dtype::I4, -8i64, 7i64), ("uint4", Dtype::U4, 0, 15)] {
        let rows = table(format);
        // decode: every pattern's value, through a map to i32 from a bitcast byte array
        let decodes: Vec<(u8, i64)> = TABLE
            .lines()
            .filter(|l| l.starts_with(&format!("{format} decode ")))
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (u8::from_str_radix(f[2], 16).unwrap(), f[3].parse().unwrap())
            })
            .collect();
        assert_eq!(decodes.len(), 16);
        let raw = Array::<u8>::from_vec(DEV, &[8], (0..8u8).map(|k| (2 * k) | (2 * k + 1) << 4).collect()).unwrap();
        let out = Array::<i32>::zeros(DEV, &[16]).unwrap();
        macro_rules! decode {
            ($t:ty) => {{
                let view = raw.bitcast::<$t>().unwrap().unwrap().apply(&Move::Reshape(vec![16])).unwrap().unwrap();
                assert_eq!(host.map(&cast(d, Dtype::I32), &[16], &[&out], &[&view]), Answer::Done);
            }};
        }
        if d == Dtype::I4 {
            decode!(I4)
        } else {
            decode!(U4)
        }
        let got = out.to_vec().unwrap();
        for (p, v) in decodes {
            assert_eq!(i64::from(got[p as usize]), v, "{format} pattern {p:#x}");
        }
        // integers wrap, in-range floats truncate: the table's patterns
        let ints: Vec<(i32, u8)> = rows.iter().filter(|r| r.0 == "int").map(|r| (r.1.parse().unwrap(), r.2)).collect();
        let floats: Vec<(f32, u8)> = rows
            .iter()
            .filter(|r| r.0 == "float")
            .map(|r| (f32::from_bits(u32::from_str_radix(&r.1, 16).unwrap()), r.2))
            .collect();
        assert!(ints.len() == 601 && floats.len() > 400, "{format}: {} {}", ints.len(), floats.len());
        // past the range, nx saturates (ml_dtypes leaves it unspecified): written here
        let extra: Vec<(f32, u8)> = [-1e9f32, -100.5, f32::NEG_INFINITY, 99.0, 1e30, f32::INFINITY, f32::NAN]
            .iter()
            .map(|&x| {
                (
                    x,
                    if x.is_nan() {
                        0
                    } else if x < 0.0 {
                        lo as u8 & 0xF
                    } else {
                        hi as u8 & 0xF
                    },
                )
            })
            .collect();
        macro_rules! encode {
            ($t:ty, $src:ty, $sd:expr, $cases:expr) => {{
                let cases: Vec<($src, u8)> = $cases;
                let n = cases.len();
                let src = Array::<$src>::from_vec(DEV, &[n], cases.iter().map(|c| c.0).collect()).unwrap();
                let dst = Array::<$t>::zeros(DEV, &[n]).unwrap();
                assert_eq!(host.map(&cast($sd, d), &[n], &[&dst], &[&src]), Answer::Done);
                for ((x, want), got) in cases.iter().zip(dst.to_vec().unwrap()) {
                    assert_eq!(got.to_bits(), *want, "{format}: {x:?}");
                }
            }};
        }
        if d == Dtype::I4 {
            encode!(I4, i32, Dtype::I32, ints.clone());
            encode!(I4, f32, Dtype::F32, floats.iter().chain(&extra).copied().collect());
        } else {
            encode!(U4, i32, Dtype::I32, ints.clone());
            encode!(U4, f32, Dtype::F32, floats.iter().chain(&extra).copied().collect());
        }
    }
    // bit: nonzero is 1, from any dtype
    let xs = vec![0.0f32, -0.0, 1.0, -3.5, f32::NAN, 1e-45, 0.0];
    let src = Array::<f32>::from_vec(DEV, &[7], xs.clone()).unwrap();
    let dst = Array::<Bit>::zeros(DEV, &[7]).unwrap();
    assert_eq!(host.map(&cast(Dtype::F32, Dtype::Bit), &[7], &[&dst], &[&src]), Answer::Done);
    let got: Vec<bool> = dst.to_vec().unwrap().iter().map(|b| b.get()).collect();
    assert_eq!(got, xs.iter().map(|&x| x != 0.0 || x.is_nan()).collect::<Vec<_>>());
}

#[test]
fn maps_over_packed_operands_wrap_and_tasks_share_bytes() {
    // n with an odd task on 2 threads (16392 / 8 = 2049): two tasks store the nibbles of one byte
    for (threads, n) in [(1usize, 4099usize), (2, 16392), (8, 40_001)] {
        // every size past the threshold: the pool's tasks
        let opts = HostOptions { threads: Some(threads), map: Some(1), store: Store::Memory, ..Default::default() };
        let host = Host::with_options(opts).unwrap();
        let a = Array::<I4>::from_fn(DEV, &[n], |i| I4::wrapping((i[0] * 7) as i128)).unwrap();
        let b = Array::<I4>::from_fn(DEV, &[n], |i| I4::wrapping((i[0] * 3 + 1) as i128)).unwrap();
        for op in [BinOp::Add, BinOp::Mul, BinOp::Sub] {
            let mut p = Prog::new(&[Dtype::I4, Dtype::I4]);
            let (x, y) = (p.load(0), p.load(1));
            let z = p.binary(op, x, y);
            p.output(z);
            let out = Array::<I4>::zeros(DEV, &[n]).unwrap();
            assert_eq!(host.map(&p, &[n], &[&out], &[&a, &b]), Answer::Done);
            let got = out.to_vec().unwrap();
            for (k, g) in got.iter().enumerate() {
                let (x, y) = (
                    i64::from(I4::wrapping((k * 7) as i128).get()),
                    i64::from(I4::wrapping((k * 3 + 1) as i128).get()),
                );
                let exact = match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    _ => x * y,
                };
                // wrapping into 4 bits, two's complement: written out
                let want = ((exact.rem_euclid(16) + 8) % 16) - 8;
                assert_eq!(i64::from(g.get()), want, "{threads} threads, {op:?} at {k}");
            }
        }
    }
}

#[test]
fn the_door_sees_bytes_at_bit_granularity_and_other_kernels_refuse_packed_operands() {
    let host = Host::new();
    let a = Array::<U4>::from_fn(DEV, &[16], |i| U4::wrapping(i[0] as i128)).unwrap();
    let view = |start: isize, stop: isize, step: isize| {
        a.apply(&Move::Slice { axis: 0, start: Some(start), stop: Some(stop), step }).unwrap().unwrap()
    };
    let copy = cast(Dtype::U4, Dtype::U4);
    // the even elements written, the odd ones read: every byte shared
    let (evens, odds) = (view(0, 16, 2), view(1, 16, 2));
    assert_eq!(host.map(&copy, &[8], &[&evens], &[&odds]), Answer::Overlapping);
    // positions 0..8 (bytes 0..4) written from 8..16 (bytes 4..8): disjoint
    let (lo, hi) = (view(0, 8, 1), view(8, 16, 1));
    assert_eq!(host.map(&copy, &[8], &[&lo], &[&hi]), Answer::Done);
    assert_eq!(lo.to_vec().unwrap(), hi.to_vec().unwrap());
    // positions 0..7 and 7..14: byte 3 holds 6, 7 (written) and 7 read: shared
    assert_eq!(host.map(&copy, &[7], &[&view(0, 7, 1)], &[&view(7, 14, 1)]), Answer::Overlapping);
    // spans that meet, bytes that do not: positions 2 and 3 (byte 1) written, 0 and 8 (bytes 0,
    // 4) read; then 8 and 9 written (byte 4, shared)
    assert_eq!(host.map(&copy, &[2], &[&view(2, 4, 1)], &[&view(0, 16, 8)]), Answer::Done);
    assert_eq!(host.map(&copy, &[2], &[&view(8, 10, 1)], &[&view(0, 16, 8)]), Answer::Overlapping);
    // a broadcast read (stride 0) of one element: shared where its byte is written
    let lo4 = view(0, 4, 1);
    let one = |at: isize| view(at, at + 1, 1).apply(&Move::Expand(vec![4])).unwrap().unwrap();
    assert_eq!(host.map(&copy, &[4], &[&lo4], &[&one(3)]), Answer::Overlapping, "byte 1 holds 2, 3 and 3");
    assert_eq!(host.map(&copy, &[4], &[&lo4], &[&one(9)]), Answer::Done);
    assert_eq!(lo4.to_vec().unwrap(), vec![U4::new(9).unwrap(); 4]);
    // a byte view of the same memory read while nibbles are written: shared
    let bytes = a.bitcast::<u8>().unwrap();
    assert!(bytes.is_none(), "a [16] has no trailing pair axis");
    let pairs = a.apply(&Move::Reshape(vec![8, 2])).unwrap().unwrap().bitcast::<u8>().unwrap().unwrap();
    let mut widen = Prog::new(&[Dtype::U8]);
    let l = widen.load(0);
    let c = widen.cast(l, Dtype::U4);
    widen.output(c);
    assert_eq!(host.map(&widen, &[8], &[&view(0, 8, 1)], &[&pairs]), Answer::Overlapping);
    // every kernel but a map refuses packed operands
    let sum = {
        let mut p = Prog::new(&[Dtype::U4]);
        let l = p.load(0);
        p.output(l);
        p
    };
    let out = Array::<u8>::zeros(DEV, &[]).unwrap();
    assert_eq!(host.reduce(&sum, &[16], &[0], &[Reduction::Sum], &[&out], &[&a]), Answer::WrongDtype);
    let m = Array::<U4>::zeros(DEV, &[4, 4]).unwrap();
    let spec = Contraction { batch: vec![], contracting: vec![(1, 0)] };
    assert_eq!(host.contract(&spec, &m, &m, &m, None), Answer::Declined, "plain contractions are of floats");
    let (mi, out) = (Array::<i32>::zeros(DEV, &[4, 4]).unwrap(), Array::<i32>::zeros(DEV, &[4, 4]).unwrap());
    let (fm, fi) = (nx_kernels::Factor::plain(&m), nx_kernels::Factor::plain(&mi));
    assert_eq!(host.contract_general(&spec, None, &out, fm, fi, None), Answer::WrongDtype);
    assert_eq!(host.sort(0, false, Some(&a), None, &a.copy().unwrap()), Answer::WrongDtype);
    assert_eq!(host.scan(Reduction::Sum, 0, None, &[&a], &a.copy().unwrap()), Answer::WrongDtype);
    let e = nx_kernels::dlpack::export(&a.clone().into_any(), nx_kernels::Access::Read).unwrap_err();
    assert!(e.to_string().contains("packed"), "{e}");
    // the public door refuses them too (a kernel library addressing bytes)
    assert_eq!(nx_kernels::door(&[&a], &[], || ()).unwrap_err(), Answer::WrongDtype);
}

#[test]
fn names_and_facts() {
    for (d, names, bits) in [
        (Dtype::I4, ["int4", "i4", "I4"], 4usize),
        (Dtype::U4, ["uint4", "u4", "U4"], 4),
        (Dtype::Bit, ["bit", "BIT", "b1"], 1),
    ] {
        for n in names {
            assert_eq!(n.parse::<Dtype>().unwrap(), d, "{n}");
        }
        assert_eq!((d.bits(), d.is_packed(), d.bytes(9)), (bits, true, Some((9 * bits).div_ceil(8))));
        assert_eq!(d.bytes(usize::MAX), if bits == 4 { None } else { Some(usize::MAX.div_ceil(8)) });
    }
    assert_eq!((Dtype::I4.carrier(), Dtype::U4.carrier(), Dtype::Bit.carrier()), (Dtype::I8, Dtype::U8, Dtype::Bool));
    assert_eq!(Dtype::I4.int_range(), Some((-8, 7)));
    assert_eq!(Dtype::U4.int_range(), Some((0, 15)));
    assert!(!Dtype::U8.is_packed() && Dtype::U8.bits() == 8 && Dtype::C128.bits() == 128);
}

#[test]
fn packed_dtypes_promote_by_their_bits() {
    use nx_kernels::binary_result as r;
    assert_eq!(r(Dtype::Bit, Dtype::Bool).unwrap(), Dtype::Bool);
    assert_eq!(r(Dtype::I4, Dtype::I8).unwrap(), Dtype::I8);
    assert_eq!(r(Dtype::U4, Dtype::I4).unwrap(), Dtype::I8, "the narrowest signed integer holding both");
    assert_eq!(r(Dtype::U4, Dtype::U8).unwrap(), Dtype::U8);
    assert_eq!(r(Dtype::U8, Dtype::I4).unwrap(), Dtype::I16);
    assert_eq!(r(Dtype::I4, Dtype::F16).unwrap(), Dtype::F16);
    assert_eq!(r(Dtype::Bit, Dtype::I4).unwrap(), Dtype::I4);
}
