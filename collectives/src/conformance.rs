//! The conformance suite: one body, generic over the backend, that every backend runs on every
//! rank (tests of the simulated backend call it on 1–8 ranks; the MPI tests under `mpirun`).
//!
//! Every expected value is computed on each rank alone, in term order (across hosts: per host,
//! then the hosts in order, as [`Communicator::hosts`] documents), from the ranks' known inputs,
//! and compared bit for bit: a backend that passes gives the same bits as every other.

use half::bf16;
use nx_kernels::dtype::fp8::F8E4M3;
use nx_placement::{plan, region, Device, Devices, Mesh, PlacementSpec};

use crate::reduce::by_host;
use crate::{place_in, Alloc, Communicator, Error, Groups, Heap, ReduceOp, Result};

/// The element types the suite moves; an allocator of them all gives its buffers.
pub trait Buffers:
    Alloc<f32> + Alloc<f64> + Alloc<i32> + Alloc<u8> + Alloc<u16> + Alloc<u32> + Alloc<u64> + Alloc<bf16> + Alloc<F8E4M3>
{
}

impl<A> Buffers for A where
    A: Alloc<f32>
        + Alloc<f64>
        + Alloc<i32>
        + Alloc<u8>
        + Alloc<u16>
        + Alloc<u32>
        + Alloc<u64>
        + Alloc<bf16>
        + Alloc<F8E4M3>
{
}

/// `len` elements of `T` from `alloc`, their values unspecified (a reused block's): a collective
/// must write every element of its output.
fn fresh<T, A: Alloc<T>>(alloc: &A, len: usize) -> Result<A::Buf> {
    alloc.uninit(len)
}

/// Rank r's input of `len` elements: distinct, inexact values.
pub fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((r * 7919 + i * 104_729) % 10_007) as f32 / 977.0 - 5.0).collect()
}

/// Terms `f(0)…` reduced by `op` in the documented association: each host's terms (`groups`, by
/// host in term order) in term order, each host's result rounded by `round`, then the hosts in
/// order (one host: term order itself).
fn across<A: Copy>(groups: &[Vec<usize>], f: impl Fn(usize) -> A, op: impl Fn(A, A) -> A, round: impl Fn(A) -> A) -> A {
    let part = |g: &Vec<usize>| g[1..].iter().fold(f(g[0]), |a, &q| op(a, f(q)));
    if groups.len() == 1 {
        return part(&groups[0]);
    }
    let hosts: Vec<A> = groups.iter().map(|g| round(part(g))).collect();
    hosts[1..].iter().fold(hosts[0], |a, &h| op(a, h))
}

fn check<T: PartialEq + std::fmt::Debug + ?Sized>(what: &str, rank: usize, got: &T, want: &T) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Invalid {
            func: "nx_collectives::conformance",
            why: format!("{what} on rank {rank}: got {got:?}, want {want:?}"),
        })
    }
}

/// Runs every collective on `c` with uneven counts and empty buffers, and checks each result;
/// outputs are fresh vectors ([`suite_in`] takes them from a device's pool).
///
/// # Errors
/// [`Error::Invalid`] describing the first wrong result; any error of the collectives.
pub fn suite<C: Communicator>(c: &C) -> Result<()> {
    suite_in(c, &Heap)
}

/// [`suite`] with every output buffer and `place`'s memory from `alloc` (a rig's pool: a
/// device's memory, reused blocks holding what earlier calls left in them).
///
/// # Errors
/// As [`suite`].
pub fn suite_in<C: Communicator, A: Buffers>(c: &C, alloc: &A) -> Result<()> {
    let (n, r) = (c.size(), c.rank());
    let hosts = by_host(c.hosts());
    let len = 3 * n + 1; // uneven on purpose
    let mine = input(r, len);
    let mut got = fresh::<f32, _>(alloc, len)?;
    c.all_reduce(&mine, &mut got, ReduceOp::Sum)?;
    let want: Vec<f32> = (0..len).map(|i| across(&hosts, |q| input(q, len)[i], |a, b| a + b, |a| a)).collect();
    check("all_reduce sum", r, &bits(&got), &bits(&want))?;
    c.all_reduce(&mine, &mut got, ReduceOp::Max)?;
    let want: Vec<f32> = (0..len).map(|i| (0..n).map(|q| input(q, len)[i]).fold(f32::NEG_INFINITY, f32::max)).collect();
    check("all_reduce max", r, &got[..], &want[..])?;
    // the product, each step rounded, and the least, in term order
    c.all_reduce(&mine, &mut got, ReduceOp::Prod)?;
    let want: Vec<f32> = (0..len).map(|i| across(&hosts, |q| input(q, len)[i], |a, b| a * b, |a| a)).collect();
    check("all_reduce prod", r, &bits(&got), &bits(&want))?;
    c.all_reduce(&mine, &mut got, ReduceOp::Min)?;
    let want: Vec<f32> = (0..len)
        .map(|i| (1..n).fold(input(0, len)[i], |acc, q| if input(q, len)[i] < acc { input(q, len)[i] } else { acc }))
        .collect();
    check("all_reduce min", r, &bits(&got), &bits(&want))?;
    // the greatest is a NaN where any term is, +0 over −0; the least −0 under +0: element i of
    // rank q is a NaN where i ≡ 0 (mod 6) and i / 6 ≡ q (mod n + 1) (so some elements have none),
    // a zero of rank-dependent sign where i ≡ 1, −0 where i ≡ 2, +0 where i ≡ 3
    let signed = |q: usize, nan: bool| -> Vec<f32> {
        (0..len)
            .map(|i| match i % 6 {
                0 if nan && (i / 6) % (n + 1) == q => f32::NAN,
                1 if (q + i / 6).is_multiple_of(2) => 0.0,
                1 | 2 => -0.0,
                3 => 0.0,
                _ => input(q, len)[i],
            })
            .collect()
    };
    c.all_reduce(&signed(r, true), &mut got, ReduceOp::Max)?;
    let want: Vec<f32> = (0..len).map(|i| (0..n).map(|q| signed(q, true)[i]).reduce(greatest).unwrap_or(0.0)).collect();
    check("all_reduce max (NaN, ±0)", r, &nan_bits(&got), &nan_bits(&want))?;
    c.all_reduce(&signed(r, false), &mut got, ReduceOp::Min)?;
    let want: Vec<f32> = (0..len).map(|i| (0..n).map(|q| signed(q, false)[i]).reduce(least).unwrap_or(0.0)).collect();
    check("all_reduce min (±0)", r, &bits(&got), &bits(&want))?;
    // integers wrap: each step's exact value (in i64 or u32) truncated to the type
    let ints = |q: usize| -> Vec<i32> {
        (0..len).map(|i| ((q * 7919 + i * 104_729) % 10_007) as i32 * 214_013 - 1_070_000_000).collect()
    };
    let mut gi = fresh::<i32, _>(alloc, len)?;
    for (op, name) in [(ReduceOp::Sum, "sum"), (ReduceOp::Prod, "prod"), (ReduceOp::Min, "min"), (ReduceOp::Max, "max")]
    {
        c.all_reduce(&ints(r), &mut gi, op)?;
        let want: Vec<i32> = (0..len)
            .map(|i| {
                (1..n).fold(ints(0)[i], |acc, q| {
                    let (a, b) = (i64::from(acc), i64::from(ints(q)[i]));
                    (match op {
                        ReduceOp::Sum => a + b,
                        ReduceOp::Prod => a * b,
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                    }) as i32
                })
            })
            .collect();
        check(&format!("all_reduce i32 {name}"), r, &gi[..], &want[..])?;
    }
    let bytes = |q: usize| -> Vec<u8> { (0..len).map(|i| ((q * 31 + i * 7) % 253 + 2) as u8).collect() };
    let mut gb = fresh::<u8, _>(alloc, len)?;
    c.all_reduce(&bytes(r), &mut gb, ReduceOp::Prod)?;
    let want: Vec<u8> = (0..len)
        .map(|i| (1..n).fold(bytes(0)[i], |acc, q| (u32::from(acc) * u32::from(bytes(q)[i]) % 256) as u8))
        .collect();
    check("all_reduce u8 prod", r, &gb[..], &want[..])?;
    c.all_reduce(&bytes(r), &mut gb, ReduceOp::Min)?;
    let want: Vec<u8> = (0..len).map(|i| (0..n).map(|q| bytes(q)[i]).fold(u8::MAX, u8::min)).collect();
    check("all_reduce u8 min", r, &gb[..], &want[..])?;
    // halves add in f32 and round once
    let halves: Vec<bf16> = mine.iter().map(|&x| bf16::from_f32(x)).collect();
    let mut hs = fresh::<bf16, _>(alloc, len)?;
    c.all_reduce(&halves, &mut hs, ReduceOp::Sum)?;
    let want: Vec<bf16> = (0..len)
        .map(|i| {
            let term = |q: usize| bf16::from_f32(input(q, len)[i]).to_f32();
            let host = |a: f32| nx_kernels::dtype::convert::f32_to_bf16(a).to_f32();
            let s = across(&hosts, term, |a, b| a + b, host);
            nx_kernels::dtype::convert::f32_to_bf16(s)
        })
        .collect();
    check("all_reduce bf16", r, &hs[..], &want[..])?;
    // and so do the fp8s (E4M3 saturating past 448)
    let fp8 = |x: f32| F8E4M3::from_bits(nx_kernels::dtype::fp8::Fp8::E4M3.cast(f64::from(x)));
    let eights: Vec<F8E4M3> = mine.iter().map(|&x| fp8(x * 40.0)).collect();
    let mut es = fresh::<F8E4M3, _>(alloc, len)?;
    c.all_reduce(&eights, &mut es, ReduceOp::Sum)?;
    let want: Vec<F8E4M3> = (0..len)
        .map(|i| {
            let term = |q: usize| fp8(input(q, len)[i] * 40.0).to_f32();
            let s = across(&hosts, term, |a, b| a + b, |a| fp8(a).to_f32());
            fp8(s)
        })
        .collect();
    check("all_reduce f8e4m3", r, &es[..], &want[..])?;
    // reduce-scatter, uneven: rank q keeps q + 1 elements
    let counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
    let total: usize = counts.iter().sum();
    let mut part = fresh::<f32, _>(alloc, counts[r])?;
    c.reduce_scatter_v(&input(r, total), &mut part, &counts, ReduceOp::Sum)?;
    let off: usize = counts[..r].iter().sum();
    let want: Vec<f32> =
        (0..counts[r]).map(|i| across(&hosts, |q| input(q, total)[off + i], |a, b| a + b, |a| a)).collect();
    check("reduce_scatter", r, &bits(&part), &bits(&want))?;
    let mut ip = fresh::<i32, _>(alloc, counts[r])?;
    let ints = |q: usize| -> Vec<i32> { input(q, total).iter().map(|&x| (x * 1000.0) as i32).collect() };
    c.reduce_scatter_v(&ints(r), &mut ip, &counts, ReduceOp::Min)?;
    let want: Vec<i32> = (0..counts[r]).map(|i| (0..n).map(|q| ints(q)[off + i]).fold(i32::MAX, i32::min)).collect();
    check("reduce_scatter i32 min", r, &ip[..], &want[..])?;
    c.reduce_scatter_v(&ints(r), &mut ip, &counts, ReduceOp::Prod)?;
    let want: Vec<i32> = (0..counts[r])
        .map(|i| (1..n).fold(ints(0)[off + i], |a, q| (i64::from(a) * i64::from(ints(q)[off + i])) as i32))
        .collect();
    check("reduce_scatter i32 prod", r, &ip[..], &want[..])?;
    // all-gather, uneven: rank q sends q elements (rank 0 none)
    let counts: Vec<usize> = (0..n).collect();
    let mut all = fresh::<i32, _>(alloc, counts.iter().sum())?;
    let send: Vec<i32> = (0..r).map(|i| (r * 100 + i) as i32).collect();
    c.all_gather_v(&send, &mut all, &counts)?;
    let want: Vec<i32> = (0..n).flat_map(|q| (0..q).map(move |i| (q * 100 + i) as i32)).collect();
    check("all_gather", r, &all[..], &want[..])?;
    // all-to-all, variable: rank r sends (r + j) % 3 elements to rank j
    let send_counts: Vec<usize> = (0..n).map(|j| (r + j) % 3).collect();
    let recv_counts: Vec<usize> = (0..n).map(|i| (i + r) % 3).collect();
    let send: Vec<u16> = (0..n).flat_map(|j| (0..(r + j) % 3).map(move |k| (r * 64 + j * 8 + k) as u16)).collect();
    let mut recv = fresh::<u16, _>(alloc, recv_counts.iter().sum())?;
    c.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
    let want: Vec<u16> = (0..n).flat_map(|i| (0..(i + r) % 3).map(move |k| (i * 64 + r * 8 + k) as u16)).collect();
    check("all_to_all", r, &recv[..], &want[..])?;
    // broadcast from the last rank
    let mut b: Vec<f64> = if r == n - 1 { vec![1.5, -2.0, 3.25] } else { vec![0.0; 3] };
    c.broadcast(&mut b, n - 1)?;
    check("broadcast", r, &b, &vec![1.5, -2.0, 3.25])?;
    // send/recv around a ring
    if n > 1 {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let mut x = [0u64; 2];
        if r % 2 == 0 {
            c.send(&[r as u64; 2], next)?;
            c.recv(&mut x, prev)?;
        } else {
            c.recv(&mut x, prev)?;
            c.send(&[r as u64; 2], next)?;
        }
        check("send/recv", r, &x, &[prev as u64; 2])?;
    }
    // split into even and odd ranks, numbered backwards
    let sub = c.split(Some(r % 2), n - r)?.expect("a color was given");
    let peers: Vec<usize> = (0..n).filter(|q| q % 2 == r % 2).collect();
    check("split size", r, &sub.size(), &peers.len())?;
    check("split rank", r, &sub.rank(), &(peers.len() - 1 - peers.iter().position(|&q| q == r).expect("in")))?;
    let mut s = [0u32];
    sub.all_reduce(&[r as u32], &mut s, ReduceOp::Sum)?;
    check("split all_reduce", r, &(s[0] as usize), &peers.iter().sum())?;
    if c.split(None, 0)?.is_some() {
        return Err(Error::Invalid { func: "nx_collectives::conformance", why: "split(None) gave a group".into() });
    }
    c.barrier()?;
    c.all_reduce::<f32>(&[], &mut [], ReduceOp::Sum)?;
    large(c, alloc)?;
    places_in(c, &Groups::new(), alloc)
}

/// Collectives of several MiB, uneven: past every chunk, push piece, window half and the size
/// from which the shared paths store with streaming stores.
fn large<C: Communicator, A: Alloc<f32>>(c: &C, alloc: &A) -> Result<()> {
    let (n, r) = (c.size(), c.rank());
    let len = 1_200_007;
    let inputs: Vec<Vec<f32>> = (0..n).map(|q| input(q, len)).collect();
    let hosts = by_host(c.hosts());
    let sum = |i: usize| across(&hosts, |q| inputs[q][i], |a, b| a + b, |a| a);
    let mut got = fresh::<f32, _>(alloc, len)?;
    c.all_reduce(&inputs[r], &mut got, ReduceOp::Sum)?;
    let want: Vec<f32> = (0..len).map(sum).collect();
    check("large all_reduce", r, &first_difference(&got, &want), &None)?;
    // reduce-scatter: rank 0 keeps most of it (its block past the streaming size)
    let counts: Vec<usize> = (0..n).map(|q| if q == 0 { len - (n - 1) * 33_001 } else { 33_001 }).collect();
    let off: usize = counts[..r].iter().sum();
    let mut part = fresh::<f32, _>(alloc, counts[r])?;
    c.reduce_scatter_v(&inputs[r], &mut part, &counts, ReduceOp::Sum)?;
    let want: Vec<f32> = (off..off + counts[r]).map(sum).collect();
    check("large reduce_scatter", r, &first_difference(&part, &want), &None)?;
    // all-gather: rank q sends 300_001 + q elements
    let counts: Vec<usize> = (0..n).map(|q| 300_001 + q).collect();
    let mut all = fresh::<f32, _>(alloc, counts.iter().sum())?;
    c.all_gather_v(&inputs[r][..counts[r]], &mut all, &counts)?;
    let want: Vec<f32> = (0..n).flat_map(|q| inputs[q][..counts[q]].iter().copied()).collect();
    check("large all_gather", r, &first_difference(&all, &want), &None)?;
    // all-to-all: rank q sends 200_003 + q + j elements to rank j, from offset 7 * j of its input
    let block = |q: usize, j: usize| &inputs[q][7 * j..7 * j + 200_003 + q + j];
    let send: Vec<f32> = (0..n).flat_map(|j| block(r, j).iter().copied()).collect();
    let send_counts: Vec<usize> = (0..n).map(|j| block(r, j).len()).collect();
    let recv_counts: Vec<usize> = (0..n).map(|q| block(q, r).len()).collect();
    let mut recv = fresh::<f32, _>(alloc, recv_counts.iter().sum())?;
    c.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)?;
    let want: Vec<f32> = (0..n).flat_map(|q| block(q, r).iter().copied()).collect();
    check("large all_to_all", r, &first_difference(&recv, &want), &None)
}

/// The first index where `got` and `want` differ in bits (or in length), with both values.
fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    if got.len() != want.len() {
        return Some((got.len().min(want.len()), f32::NAN, f32::NAN));
    }
    got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()).map(|i| (i, got[i], want[i]))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The bits of each value, `None` for every NaN (whose payload no rule fixes).
fn nan_bits(v: &[f32]) -> Vec<Option<u32>> {
    v.iter().map(|x| (!x.is_nan()).then(|| x.to_bits())).collect()
}

/// The greater of two terms as `ReduceOp::Max` documents it: a NaN where one is, +0 over −0.
fn greatest(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a == b {
        if a.is_sign_negative() {
            b
        } else {
            a
        }
    } else if a > b {
        a
    } else {
        b
    }
}

/// The lesser of two terms, −0 under +0 (no NaN among them).
fn least(a: f32, b: f32) -> f32 {
    if a == b {
        if a.is_sign_negative() {
            a
        } else {
            b
        }
    } else if a < b {
        a
    } else {
        b
    }
}

/// The global value's element at flat index i, and term t's share of it.
fn global(i: usize) -> f32 {
    ((i * 7919) % 1009) as f32 / 31.0 - 16.0
}
fn term(i: usize, t: usize) -> f32 {
    global(i) / 3.0 + t as f32 * 0.25
}

/// Runs [`crate::place()`] for a fixed set of transitions on a mesh of `c.size()` devices (a 2-axis
/// mesh where the size allows) and checks each rank's window bit for bit against the global value
/// (the term-order sum of a partial one).
///
/// # Errors
/// As [`suite`].
pub fn places<C: Communicator>(c: &C) -> Result<()> {
    places_in(c, &Groups::new(), &Heap)
}

/// [`places`] through [`place_in`] with `groups` and `alloc`: each transition twice, the second
/// warm (its sub-communicators cached, its buffers reused).
///
/// # Errors
/// As [`suite`].
pub fn places_in<C: Communicator, A: Alloc<f32>>(c: &C, groups: &Groups<C>, alloc: &A) -> Result<()> {
    let n = c.size();
    let (a, b) = if n.is_multiple_of(2) && n > 2 { (2, n / 2) } else { (1, n) };
    let specs = [
        ("mesh(0:dp.tp)", "mesh()"),
        ("mesh(0:tp)", "mesh(1:tp)"),
        ("partial(tp; 0:dp)", "mesh(0:dp.tp)"),
        ("partial(dp.tp)", "on"),
        ("device(0)", "on"),
        ("mesh(1:dp, 0:tp)", "mesh(0:dp)"),
        ("on", "partial(tp)"),
        ("split(1)", "mesh(0:tp.dp)"),
    ];
    let shape = [2 * n + 1, n + 2];
    for (from, to) in specs {
        let (fs, ts): (PlacementSpec, PlacementSpec) = (from.parse()?, to.parse()?);
        Devices::with(Device::sims(n), |set| -> Result<()> {
            let m = Mesh::new(&set, &[("dp", a), ("tp", b)]).map_err(nx_placement::Error::from)?;
            let (p, q) = (fs.over(&m)?, ts.over(&m)?);
            let pl = plan(&p, &q, &shape, 4)?;
            let r = c.rank();
            let elements = |w: &region::Window| -> Vec<usize> {
                let mut out = Vec::new();
                for i in w[0].clone() {
                    for j in w[1].clone() {
                        out.push(i * shape[1] + j);
                    }
                }
                out
            };
            let local = pl.old[r].as_ref().map(|w| {
                let t = p.term(r).expect("a device of the set");
                elements(w).into_iter().map(|i| t.map_or(global(i), |t| term(i, t))).collect::<Vec<f32>>()
            });
            let terms = p.terms();
            let hosts = c.hosts();
            let value = |i: usize| {
                if p.is_partial() {
                    // term t's host: that of the device holding term t's window of element i
                    // (the first, where copies hold it)
                    let holder = |t: usize| {
                        (0..n)
                            .find(|&d| {
                                p.term(d).ok().flatten() == Some(t)
                                    && pl.old[d].as_ref().is_some_and(|w| elements(w).contains(&i))
                            })
                            .map_or(0, |d| hosts[d])
                    };
                    across(&by_host((0..terms).map(holder)), |t| term(i, t), |a, b| a + b, |a| a)
                } else {
                    global(i)
                }
            };
            let want = pl.new[r].as_ref().map(|w| {
                let t = q.term(r).expect("a device of the set").unwrap_or(0);
                bits(&elements(w).into_iter().map(|i| if t > 0 { 0.0 } else { value(i) }).collect::<Vec<f32>>())
            });
            for warm in ["", " (warm)"] {
                let rec = c.recorder().cloned();
                let mark = rec.as_ref().map(|r| r.start());
                let got = place_in(c, groups, &pl, local.as_deref(), alloc);
                if let (Some(rec), Some(mark)) = (rec, mark) {
                    let log = rec.stop(mark, c.world_rank());
                    if got.is_ok() {
                        log.check_plan(&pl, r).map_err(|why| Error::Invalid {
                            func: "nx_collectives::conformance",
                            why: format!("place {from} -> {to}{warm}: {why}"),
                        })?;
                    }
                }
                let got = got?.map(|g| bits(&g));
                check(&format!("place {from} -> {to}{warm}"), r, &got, &want)?;
            }
            Ok(())
        })
        .map_err(nx_placement::Error::from)??;
    }
    Ok(())
}
