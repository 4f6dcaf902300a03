//! Devices with timelines: random programs of kernels, host reads and writes and transfers over
//! arrays on the host and on queued devices with random delays give the bits of the same program
//! run at once; work on freed memory, donated memory and a lost device; the pool's reuse, limit
//! and statistics.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nx_kernels::rig::{QueueOptions, Rig, RigOptions, Work};
use nx_kernels::{Answer, Array, Dtype, Error, Host, Kernels, Prog};
use nx_mesh::Device;

/// SplitMix64.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `y = a·c + b` elementwise.
fn axpy(c: f64) -> Prog {
    let mut p = Prog::new(&[Dtype::F64, Dtype::F64]);
    let (a, b) = (p.load(0), p.load(1));
    let k = p.float(c);
    let m = p.mul(a, k);
    let s = p.add(m, b);
    p.output(s);
    p
}

const LEN: usize = 37;

/// Runs program `seed` over arrays on `rigs` (array k on rig k mod the rigs); answers what every
/// host read saw, then every array's final elements.
fn program(seed: u64, rigs: &[Rig], steps: usize) -> Vec<Vec<f64>> {
    let host = Host::with_threads(1).unwrap();
    let mut d = Draw(seed);
    let n = 6;
    let arrays: Vec<Array<f64>> = (0..n)
        .map(|k| Array::from_fn_on(&rigs[k % rigs.len()], &[LEN], |i| (i[0] * (k + 1)) as f64).unwrap())
        .collect();
    let mut seen = Vec::new();
    for _ in 0..steps {
        let (x, y, z) = (d.below(n), d.below(n), d.below(n));
        match d.below(5) {
            // a kernel writing z from x and y (z's rig runs it): read-after-write on x and y,
            // write-after-read and write-after-write on z; x, y, z may coincide
            0 | 1 => {
                let c = (d.below(7) as f64 - 3.0) * 0.5;
                let (a, b) = (arrays[x].clone(), arrays[y].clone());
                let dst = if z == x || z == y {
                    Array::from_fn_on(&rigs[z % rigs.len()], &[LEN], |_| 0.0).unwrap()
                } else {
                    arrays[z].clone()
                };
                assert_eq!(host.map(&axpy(c), &[LEN], &[&dst], &[&a, &b]), Answer::Done);
                if z == x || z == y {
                    Array::transfer(&dst, &arrays[z]).unwrap();
                }
            }
            // a host read
            2 => seen.push(arrays[x].to_vec().unwrap()),
            // a host write of one element
            3 => arrays[x].set(&[d.below(LEN)], d.below(100) as f64).unwrap(),
            // a transfer between devices
            _ => {
                if x != y {
                    Array::transfer(&arrays[x], &arrays[y]).unwrap();
                }
            }
        }
    }
    seen.extend(arrays.iter().map(|a| a.to_vec().unwrap()));
    seen
}

fn bits(v: &[Vec<f64>]) -> Vec<Vec<u64>> {
    v.iter().map(|x| x.iter().map(|f| f.to_bits()).collect()).collect()
}

#[test]
fn random_programs_on_queued_devices_give_the_bits_of_the_same_programs_run_at_once() {
    let at_once = [Rig::host(Device::sim(0)).unwrap()];
    let queued = |delay_us: u64, seed: u64| {
        vec![
            Rig::host(Device::sim(0)).unwrap(),
            Rig::queued(Device::sim(1), Duration::from_micros(delay_us), seed).unwrap(),
            Rig::queued(Device::sim(2), Duration::from_micros(delay_us), seed + 1).unwrap(),
        ]
    };
    for seed in 0..2000u64 {
        let rigs = queued(if seed % 10 == 0 { 300 } else { 20 }, seed);
        let want = program(seed, &at_once, 24);
        let got = program(seed, &rigs, 24);
        assert_eq!(bits(&got), bits(&want), "program {seed}");
    }
}

#[test]
fn a_kernel_on_a_queued_device_answers_before_its_work_runs() {
    let rig = Rig::queued(Device::sim(1), Duration::from_millis(200), 1).unwrap();
    let x = Array::<f64>::from_fn_on(&rig, &[LEN], |i| i[0] as f64).unwrap();
    let y = Array::<f64>::zeros_on(&rig, &[LEN]).unwrap();
    let t = std::time::Instant::now();
    assert_eq!(Host::new().map(&axpy(2.0), &[LEN], &[&y], &[&x, &x]), Answer::Done);
    assert!(t.elapsed() < Duration::from_millis(100), "queued, not run: {:?}", t.elapsed());
    assert!(y.buffer().is_pending());
    assert_eq!(y.to_vec().unwrap()[5], 15.0);
    assert!(!y.buffer().is_pending());
}

#[test]
fn freeing_or_donating_a_buffer_while_work_is_pending_keeps_the_work_and_the_reuse_ordered() {
    let rig = Rig::queued(Device::sim(1), Duration::from_millis(1), 3).unwrap();
    let x = Array::<f64>::from_fn_on(&rig, &[LEN], |i| i[0] as f64).unwrap();
    let slow = Rig::queued(Device::sim(2), Duration::from_millis(150), 4).unwrap();
    // slow work on `slow` writes y; y is freed at once, its memory goes back when the work ends
    let y = Array::<f64>::zeros_on(&slow, &[LEN]).unwrap();
    assert_eq!(Host::new().map(&axpy(1.0), &[LEN], &[&y], &[&x, &x]), Answer::Done);
    y.buffer().free().unwrap();
    assert!(y.to_vec().unwrap_err().to_string().contains("freed"));
    // the last handle: the queued work still holds y's memory, so no new array gets it while the
    // work may write it (a new one is fresh); once the work has run, the pool hands it out again
    drop(y);
    let z = Array::<f64>::from_vec_on(&slow, &[LEN], vec![7.0; LEN]).unwrap();
    assert_eq!((slow.pool_stats().reused, slow.pool_stats().fresh), (0, 2), "{:?}", slow.pool_stats());
    slow.synchronize().unwrap();
    assert_eq!(z.to_vec().unwrap(), vec![7.0; LEN]);
    let again = Array::<f64>::from_vec_on(&slow, &[LEN], vec![9.0; LEN]).unwrap();
    assert_eq!(slow.pool_stats().reused, 1, "{:?}", slow.pool_stats());
    assert_eq!((again.to_vec().unwrap(), z.to_vec().unwrap()), (vec![9.0; LEN], vec![7.0; LEN]));
    // donation: the buffer dies naming its consumer; the successor holds the memory once the
    // work that writes it is done
    let w = Array::<f64>::zeros_on(&slow, &[LEN]).unwrap();
    assert_eq!(Host::new().map(&axpy(3.0), &[LEN], &[&w], &[&x, &x]), Answer::Done);
    let next = Array::<f64>::new(w.layout().clone(), w.buffer().donate("nx::test").unwrap()).unwrap();
    assert!(w.to_vec().unwrap_err().to_string().contains("donated to nx::test"));
    assert_eq!(next.to_vec().unwrap()[2], 8.0);
}

#[test]
fn a_lost_device_fails_its_dependants_and_the_host_never_hangs() {
    let a = Rig::queued(Device::sim(1), Duration::from_millis(100), 5).unwrap();
    let b = Rig::queued(Device::sim(2), Duration::ZERO, 6).unwrap();
    let x = Array::<f64>::from_fn_on(&a, &[LEN], |i| i[0] as f64).unwrap();
    let y = Array::<f64>::zeros_on(&a, &[LEN]).unwrap();
    assert_eq!(Host::new().map(&axpy(1.0), &[LEN], &[&y], &[&x, &x]), Answer::Done);
    // work on another device that must follow y's
    let z = Array::<f64>::zeros_on(&b, &[LEN]).unwrap();
    assert_eq!(Host::new().map(&axpy(1.0), &[LEN], &[&z], &[&y, &y]), Answer::Done);
    a.lose("pulled from its slot");
    let t = std::time::Instant::now();
    let e = y.to_vec().unwrap_err().to_string();
    assert!(e.contains("nx_kernels::Array::to_vec: sim:1 is lost: pulled from its slot"), "{e}");
    let e = z.to_vec().unwrap_err().to_string();
    assert!(e.contains("sim:2 is lost") && e.contains("it must follow work on sim:1 is lost"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // later work on the lost device, and host kernels that must follow it, answer Lost
    assert_eq!(Host::new().map(&axpy(1.0), &[LEN], &[&x], &[&x, &x]), Answer::Lost);
    let h = Array::<f64>::zeros(Device::sim(0), &[LEN]).unwrap();
    assert_eq!(Host::new().map(&axpy(1.0), &[LEN], &[&h], &[&y, &y]), Answer::Lost);
    assert!(matches!(a.synchronize(), Err(Error::Lost { .. })));
}

#[test]
fn work_that_fails_on_a_queued_device_loses_it() {
    let a = Rig::queued(Device::sim(1), Duration::ZERO, 7).unwrap();
    let x = Array::<f64>::zeros_on(&a, &[LEN]).unwrap();
    let e = a.submit(&[], &[x.buffer()], Box::new(|| Err("a failing kernel".into()))).unwrap();
    assert!(e.is_some());
    let err = x.to_vec().unwrap_err().to_string();
    assert!(err.contains("sim:1 is lost: a failing kernel"), "{err}");
    let err = a.submit(&[], &[], Box::new(|| Ok(()))).unwrap_err().to_string();
    assert!(err.contains("is lost"), "{err}");
}

#[test]
fn the_pool_reuses_blocks_without_fresh_memory_and_keeps_its_limit() {
    let rig = Rig::new(Device::sim(0), RigOptions { limit: Some(64 << 20), ..RigOptions::default() }).unwrap();
    for _ in 0..20 {
        let a = Array::<f32>::uninit_on(&rig, &[4 << 20]).unwrap(); // 16 MiB
        drop(a);
    }
    let s = rig.pool_stats();
    assert_eq!((s.fresh, s.reused), (1, 19), "{s:?}");
    assert_eq!((s.in_use, s.cached), (0, 16 << 20));
    // past the limit: a clear error naming the device, the request and what is in use
    let keep: Vec<Array<f32>> = (0..4).map(|_| Array::<f32>::uninit_on(&rig, &[4 << 20]).unwrap()).collect();
    let e = Array::<f32>::uninit_on(&rig, &[1]).unwrap_err().to_string();
    assert!(
        e.contains(
            "nx_kernels::Rig::alloc: cannot allocate 4 bytes on sim:0: past the limit of 67108864 B; 67108864 B in use"
        ),
        "{e}"
    );
    drop(keep);
    // zeroed allocations of a reused block are zero
    let z = Array::<f32>::zeros_on(&rig, &[4 << 20]).unwrap();
    assert!(z.with_slice(|s| s.iter().all(|&x| x == 0.0)).unwrap());
}

#[test]
fn random_sizes_keep_the_cache_bounded_under_a_limit() {
    let limit = 256 << 20;
    let rig = Rig::new(
        Device::sim(0),
        RigOptions { queue: Some(QueueOptions::default()), limit: Some(limit), ..RigOptions::default() },
    )
    .unwrap();
    let mut d = Draw(11);
    let mut live: Vec<Array<u8>> = Vec::new();
    for _ in 0..3000 {
        if live.len() > 8 || (d.below(2) == 0 && !live.is_empty()) {
            live.swap_remove(d.below(live.len()));
        } else {
            let bytes = 1 + d.below(24 << 20);
            live.push(Array::<u8>::uninit_on(&rig, &[bytes]).unwrap());
        }
        let s = rig.pool_stats();
        assert!(s.in_use + s.cached <= limit, "{s:?}");
    }
    let s = rig.pool_stats();
    assert!(s.reused > s.fresh, "reuse dominates: {s:?}");
}

#[test]
fn the_pool_keeps_memory_kinds_apart() {
    use nx_kernels::MemoryKind;
    let rig = Rig::host(Device::sim(0)).unwrap();
    let d = Array::<f32>::zeros_on(&rig, &[1 << 10]).unwrap();
    assert_eq!(d.buffer().memory_kind(), Some(MemoryKind::Device));
    drop(d);
    // a cached Device block of the class never serves a Host or Mapped request
    for kind in [MemoryKind::Host, MemoryKind::Mapped] {
        let h = Array::<f32>::zeros_in(&rig, kind, &[1 << 10]).unwrap();
        assert_eq!(h.buffer().memory_kind(), Some(kind));
        assert!(h.with_slice(|s| s.iter().all(|&x| x == 0.0)).unwrap());
    }
    let s = rig.pool_stats();
    assert_eq!((s.fresh, s.reused), (3, 0), "{s:?}");
    // each kind's block serves its own kind again
    for kind in [MemoryKind::Device, MemoryKind::Host, MemoryKind::Mapped] {
        drop(Array::<f32>::zeros_in(&rig, kind, &[1 << 10]).unwrap());
    }
    let s = rig.pool_stats();
    assert_eq!((s.fresh, s.reused), (3, 3), "{s:?}");
    assert_eq!(nx_kernels::Buffer::unaddressed(Device::sim(1), 8).memory_kind(), None);
}

/// Runs `f` on a thread of its own and answers its result, or fails the test where it has not
/// ended within `secs` seconds (a hang).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).expect("hung")
}

#[test]
fn a_rigs_last_handle_may_end_in_any_devices_work_without_a_hang() {
    // x on `a`, summed into y by slow work on `b`; `a`'s last handles end while that work is
    // queued, so they end in `b`'s worker, which must neither wait on its own work nor on `a`'s
    within(20, || {
        let a = Rig::queued(Device::sim(0), Duration::ZERO, 1).unwrap();
        let b = Rig::queued(Device::sim(1), Duration::from_millis(20), 2).unwrap();
        let x = Array::<f64>::from_vec_on(&a, &[LEN], vec![1.5; LEN]).unwrap();
        let y = Array::<f64>::zeros_on(&b, &[LEN]).unwrap();
        assert_eq!(Host::new().map(&axpy(1.0), &[LEN], &[&y], &[&x, &x]), Answer::Done);
        drop((x, a));
        assert_eq!(y.to_vec().unwrap(), vec![3.0; LEN]);
        drop((y, b));
    });
    // `a`'s worker waits for work on `b` that holds `a`'s last handle
    within(20, || {
        let a = Rig::queued(Device::sim(0), Duration::ZERO, 1).unwrap();
        let b = Rig::queued(Device::sim(1), Duration::from_millis(20), 2).unwrap();
        let on_a = a.alloc(64).unwrap();
        let on_b = b.alloc(64).unwrap();
        let host = nx_kernels::Buffer::new(Device::sim(0), 64).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r1 = ran.clone();
        let first: Work = Box::new(move || {
            r1.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        b.submit(&[&on_a], &[&on_b], first).unwrap();
        let r2 = ran.clone();
        let second: Work = Box::new(move || {
            r2.fetch_add(10, Ordering::SeqCst);
            Ok(())
        });
        let e = a.submit(&[&on_b], &[&host], second).unwrap().expect("queued");
        drop((on_a, a));
        e.wait().unwrap();
        host.wait().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 11, "both ran, in order");
    });
    // a rig whose last handle is held by its own queued work: the work runs, then the worker ends
    within(20, || {
        let c = Rig::queued(Device::sim(2), Duration::from_millis(10), 3).unwrap();
        let x = Array::<f64>::zeros_on(&c, &[LEN]).unwrap();
        let src = Array::<f64>::from_vec(Device::sim(2), &[LEN], vec![2.0; LEN]).unwrap();
        assert_eq!(Host::new().map(&axpy(0.0), &[LEN], &[&x], &[&src, &src]), Answer::Done);
        let event_of_x = x.borrow(&Rig::host(Device::sim(2)).unwrap()).unwrap().expect("host memory");
        drop((x, c));
        assert_eq!(event_of_x.to_vec().unwrap(), vec![2.0; LEN]);
    });
}

#[test]
fn a_lost_device_never_runs_work_waiting_out_its_delay() {
    let rig = Rig::queued(Device::sim(3), Duration::from_millis(200), 9).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let buf = rig.alloc(8).unwrap();
    let work: Work = Box::new(move || {
        r.store(true, Ordering::SeqCst);
        Ok(())
    });
    let e = rig.submit(&[], &[&buf], work).unwrap().expect("queued");
    // lost while the item waits out its delay (this seed's first draw is past 30 ms of 200)
    std::thread::sleep(Duration::from_millis(30));
    rig.lose("pulled");
    assert!(e.wait().is_err());
    assert!(!ran.load(Ordering::SeqCst), "the work of a lost device ran");
}
