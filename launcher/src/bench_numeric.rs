//! `nx bench kernels`' numeric rows: Fourier transforms (2²⁰ complex f32 points, and 1024
//! transforms of 1024 along the rows of a 1024 × 1024 array) and the Cholesky factor of a
//! 1024 × 1024 f64 matrix and its SVD, and a grouped matmul (4096 tokens of 1024 against 8
//! experts of 1024 × 1024 in f32, each token's expert by its id: the segmented contraction),
//! timed against numpy (`np.fft`, `np.linalg.cholesky`, `svd`)
//! and, where torch is given, torch (`torch.fft`, `torch.linalg.cholesky`, `svd`; the grouped matmul as a user writes it, a
//! matmul per expert of the rows its ids select) on the same threads
//! (`benches/peer_numeric.py`), in rounds of the peers then nx back to back; `peer_ratio` is the
//! median over rounds of (peer's time) / (nx's time).

use num_complex::Complex32;
use nx::kernels::rig::Rig;
use nx::kernels::{Answer, Array, Contraction, Direction, Factor, Host, Kernels, Segmented, Segments};
use nx::Device;

use crate::bench::{median, time, Row};

type Error = Box<dyn std::error::Error>;

/// Rounds of the peers and nx back to back.
const ROUNDS: usize = 3;

/// The cases: the peer's JSON key, the row's name.
const CASES: [(&str, &str); 5] = [
    ("fft", "fft 2^20 c64"),
    ("fft_batched", "fft 1024 x 1024 c64 along rows"),
    ("cholesky", "cholesky 1024 f64"),
    ("svd", "svd 1024 f64 (values and vectors)"),
    ("grouped_matmul", "grouped matmul f32, 8 experts (4096 x 1024 by 1024 x 1024)"),
];

/// The peers' medians, by case; `Err` where they cannot run.
fn peers(python: &str, repeats: usize) -> Result<serde_json::Value, String> {
    crate::bench::python_peer(python, "benches/peer_numeric.py", &[repeats.to_string()])
}

/// The rows (one against numpy per case, one against torch where it ran), and a note naming the
/// peers (or why there are none). `python` runs the peers' script (`none` skips them).
pub(crate) fn rows(repeats: usize, python: &str) -> Result<(Vec<Row>, String), Error> {
    let (host, rig) = (Host::new(), Rig::host(Device::sim(0))?);
    let z = |seed: u64, k: usize| {
        Complex32::new(nx::normal(seed, 2 * k as u64) as f32, nx::normal(seed, 2 * k as u64 + 1) as f32)
    };
    let x = Array::<Complex32>::from_fn_on(&rig, &[1 << 20], |i| z(21, i[0]))?;
    let y = Array::<Complex32>::from_fn_on(&rig, &[1024, 1024], |i| z(22, i[0] * 1024 + i[1]))?;
    let (xo, yo) =
        (Array::<Complex32>::zeros_on(&rig, &[1 << 20])?, Array::<Complex32>::zeros_on(&rig, &[1024, 1024])?);
    // M·Mᵀ + 1024·I: positive definite, as the peers' matrix
    let m: Vec<f64> = (0..1024 * 1024).map(|k| nx::normal(23, k as u64)).collect();
    let mut spd = vec![0.0; 1024 * 1024];
    for i in 0..1024 {
        for j in 0..=i {
            let d: f64 = (0..1024).map(|k| m[i * 1024 + k] * m[j * 1024 + k]).sum();
            let s = d + if i == j { 1024.0 } else { 0.0 };
            spd[i * 1024 + j] = s;
            spd[j * 1024 + i] = s;
        }
    }
    let a = Array::<f64>::from_fn_on(&rig, &[1024, 1024], |i| spd[i[0] * 1024 + i[1]])?;
    let l = Array::<f64>::zeros_on(&rig, &[1024, 1024])?;
    let ma = Array::<f64>::from_fn_on(&rig, &[1024, 1024], |i| m[i[0] * 1024 + i[1]])?;
    let (u, s, vh) = (
        Array::<f64>::zeros_on(&rig, &[1024, 1024])?,
        Array::<f64>::zeros_on(&rig, &[1024])?,
        Array::<f64>::zeros_on(&rig, &[1024, 1024])?,
    );
    let (tokens, width, experts) = (4096, 1024, 8);
    let xt = Array::<f32>::from_fn_on(&rig, &[tokens, width], |i| nx::normal(24, (i[0] * width + i[1]) as u64) as f32)?;
    let we = Array::<f32>::from_fn_on(&rig, &[experts, width, width], |i| {
        nx::normal(25, ((i[0] * width + i[1]) * width + i[2]) as u64) as f32
    })?;
    // each token's expert uniform over the 8, as the peers' `randint`
    let ids = Array::<i64>::from_fn_on(&rig, &[tokens], |i| (nx::normal(26, i[0] as u64).to_bits() % 8) as i64)?;
    let go = Array::<f32>::zeros_on(&rig, &[tokens, width])?;
    let moe = Contraction { contracting: vec![(1, 1)], batch: vec![] };
    let seg = Segmented { segments: Segments::Rows { a_axis: 0, b_axis: 0 }, ids: &ids };
    let ok = |a: Answer| assert_eq!(a, Answer::Done, "a numeric benchmark's kernel");
    let mut run: Vec<Box<dyn FnMut()>> = vec![
        Box::new(|| ok(host.fft(Direction::Forward, &[0], &xo, &x))),
        Box::new(|| ok(host.fft(Direction::Forward, &[1], &yo, &y))),
        Box::new(|| ok(host.cholesky(&l, &a))),
        Box::new(|| ok(host.svd(Some(&u), &s, Some(&vh), &ma))),
        Box::new(|| ok(host.contract_general(&moe, Some(seg), &go, Factor::plain(&xt), Factor::plain(&we), None))),
    ];
    let n = CASES.len();
    let (mut ours, mut np, mut th) = (vec![Vec::new(); n], vec![Vec::new(); n], vec![Vec::new(); n]);
    let (mut np_r, mut th_r) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    let mut note = String::new();
    for round in 0..ROUNDS {
        let p = if python == "none" { Err("skipped (no Python)".to_string()) } else { peers(python, repeats) };
        match &p {
            Ok(v) if round == 0 => {
                note = format!("numpy {} (its FFT on one thread)", v["numpy"]);
                if v.get("torch").is_some() {
                    note.push_str(&format!(", torch {} on {} threads", v["torch"], v["torch_threads"]));
                }
            }
            Err(e) if round == 0 => note = format!("numeric peers: {e}"),
            _ => {}
        }
        for (c, f) in run.iter_mut().enumerate() {
            let s = time(repeats, &mut **f);
            ours[c].push(s);
            if let Ok(v) = &p {
                if let Some(t) = v[CASES[c].0].as_f64() {
                    np[c].push(t);
                    np_r[c].push(t / s);
                }
                if let Some(t) = v[format!("torch_{}", CASES[c].0)].as_f64() {
                    th[c].push(t);
                    th_r[c].push(t / s);
                }
            }
        }
        if p.is_err() {
            break; // without a peer one round is the figure
        }
    }
    let mut rows = Vec::new();
    for c in 0..n {
        let value = median(ours[c].clone()) * 1e3;
        let row = |peer: &str, times: &[f64], ratios: &[f64], suffix: &str| Row {
            name: format!("{}{suffix}", CASES[c].1),
            value,
            unit: "ms",
            peer: (!times.is_empty()).then(|| format!("{peer} {}", CASES[c].0)),
            peer_value: (!times.is_empty()).then(|| median(times.to_vec()) * 1e3),
            peer_ratio: (!ratios.is_empty()).then(|| median(ratios.to_vec())),
            ..Default::default()
        };
        rows.push(row("numpy", &np[c], &np_r[c], ""));
        if !th[c].is_empty() {
            rows.push(row("torch", &th[c], &th_r[c], " (torch peer)"));
        }
    }
    Ok((rows, note))
}
