//! `nx bench kernels`' indexing rows: gather (an embedding lookup), scatter-add (its gradient),
//! cumsum, a stable sort with positions, top-k, causal attention and its fused backward (against
//! `scaled_dot_product_attention`'s backward alone), each timed against PyTorch on
//! CPU in the same run (`benches/torch_indexing.py`, same thread count), in rounds of the peer
//! then nx back to back; `peer_ratio` is the median over rounds of (peer's time) / (nx's time).
//!
//! Sizes are the at `--size` 2²⁴ (50k×1024 table by 64k indices, 16M elements, 512 rows
//! of 50k, batch 4 × 16 heads × 2048 tokens × 64) and scale with `--size` (the peer scales alike).

use nx::kernels::rig::Rig;
use nx::kernels::{Answer, Array, Attention, AttentionGrad, Dtype, Host, Kernels, Kv, Reduction, Scatter};
use nx::Device;

use crate::bench::{median, time, Row};

type Error = Box<dyn std::error::Error>;

/// Rounds of the peer and nx back to back.
const ROUNDS: usize = 3;

/// The names of the cases, as the peer's JSON keys them, with the rows' names.
const CASES: [(&str, &str); 7] = [
    ("gather", "gather rows (embedding lookup)"),
    ("scatter_add", "scatter-add rows (its gradient)"),
    ("cumsum", "cumsum f32"),
    ("sort", "sort f32, stable, with positions"),
    ("topk", "top-50 of 50k per row"),
    ("attention", "causal attention f32 (b4 h16 d64)"),
    ("attention_grad", "its backward (dq, dk, dv)"),
];

fn scaled(x: usize, scale: f64) -> usize {
    ((x as f64 * scale) as usize).max(1)
}

/// The peer's medians, by case; `Err` where it cannot run.
fn peer(python: &str, scale: f64, repeats: usize) -> Result<serde_json::Value, String> {
    crate::bench::python_peer(python, "benches/torch_indexing.py", &[scale.to_string(), repeats.to_string()])
}

/// The rows, and a note naming the peer (or why there is none).
pub(crate) fn rows(size: usize, repeats: usize, python: &str) -> Result<(Vec<Row>, String), Error> {
    let scale = size as f64 / (1u64 << 24) as f64;
    let dev = Device::sim(0);
    let (host, rig) = (Host::new(), Rig::host(dev)?);
    let ok = |a: Answer| assert_eq!(a, Answer::Done, "an indexing benchmark's kernel");
    let (vocab, width, tokens) = (scaled(50_000, scale), 1024, scaled(65_536, scale));
    let table = Array::<f32>::from_fn_on(&rig, &[vocab, width], |i| ((i[0] * 31 + i[1]) % 997) as f32 * 1e-3)?;
    let idx = Array::<i64>::from_fn_on(&rig, &[tokens], |i| ((i[0] * 7919) % vocab) as i64)?;
    let gathered = Array::<f32>::zeros_on(&rig, &[tokens, width])?;
    let grad = Array::<f32>::zeros_on(&rig, &[vocab, width])?;
    let m = scaled(1 << 24, scale);
    // standard normal values, as the peer's `randn`: every key byte varies, no radix pass skipped
    let x = Array::<f32>::from_fn_on(&rig, &[m], |i| nx::normal(11, i[0] as u64) as f32)?;
    let (cs, sv, sp) =
        (Array::<f32>::zeros_on(&rig, &[m])?, Array::<f32>::zeros_on(&rig, &[m])?, Array::<i64>::zeros_on(&rig, &[m])?);
    let rows_k = scaled(512, scale);
    let y =
        Array::<f32>::from_fn_on(&rig, &[rows_k, 50_000], |i| nx::normal(12, (i[0] * 50_000 + i[1]) as u64) as f32)?;
    let (tv, tp) = (Array::<f32>::zeros_on(&rig, &[rows_k, 50])?, Array::<i64>::zeros_on(&rig, &[rows_k, 50])?);
    let (b, h, t, d) = (4, 16, scaled(2048, scale), 64);
    let qkv: Vec<Array<f32>> = (0..3)
        .map(|s| {
            Array::<f32>::from_fn_on(&rig, &[b, h, t, d], |i| {
                (((i[2] * 64 + i[3]) * (s + 3) + i[1]) % 101) as f32 * 0.02 - 1.0
            })
        })
        .collect::<Result<_, _>>()?;
    let (o, lse) = (Array::<f32>::zeros_on(&rig, &[b, h, t, d])?, Array::<f32>::zeros_on(&rig, &[b, h, t])?);
    let spec = Attention { scale: 0.125, causal: Some(0), acc: Dtype::F32 };
    // the backward's inputs: the forward's o and lse (run once here), an output gradient
    ok(host.attention(&spec, &o, &lse, &qkv[0], Kv::Dense { k: &qkv[1], v: &qkv[2] }, None));
    let go =
        Array::<f32>::from_fn_on(&rig, &[b, h, t, d], |i| ((i[2] * 7 + i[3] * 3 + i[1]) % 89) as f32 * 0.02 - 0.9)?;
    let (o2, lse2) = (o.copy()?, lse.copy()?);
    let dqkv: Vec<Array<f32>> =
        (0..3).map(|_| Array::<f32>::zeros_on(&rig, &[b, h, t, d])).collect::<Result<_, _>>()?;
    let backward = AttentionGrad {
        q: &qkv[0],
        k: &qkv[1],
        v: &qkv[2],
        o: &o2,
        lse: &lse2,
        d_o: &go,
        dq: &dqkv[0],
        dk: &dqkv[1],
        dv: &dqkv[2],
    };
    let mut run: Vec<Box<dyn FnMut()>> = vec![
        Box::new(|| ok(host.gather(0, &gathered, &table, &idx))),
        Box::new(|| ok(host.scatter(Scatter::Add, 0, &grad, None, &gathered, &idx))),
        Box::new(|| ok(host.scan(Reduction::Sum, 0, None, &[&cs], &x))),
        Box::new(|| ok(host.sort(0, false, Some(&sv), Some(&sp), &x))),
        Box::new(|| ok(host.sort(1, true, Some(&tv), Some(&tp), &y))),
        Box::new(|| ok(host.attention(&spec, &o, &lse, &qkv[0], Kv::Dense { k: &qkv[1], v: &qkv[2] }, None))),
        Box::new(|| ok(host.attention_grad(&spec, backward))),
    ];
    let n = CASES.len();
    let (mut ours, mut theirs, mut ratios) = (vec![Vec::new(); n], vec![Vec::new(); n], vec![Vec::new(); n]);
    let mut note = String::new();
    for round in 0..ROUNDS {
        let p = if python == "none" { Err("skipped (--torch none)".to_string()) } else { peer(python, scale, repeats) };
        match &p {
            Ok(v) if round == 0 => note = format!("torch {} on {} threads", v["torch"], v["threads"]),
            Err(e) if round == 0 => note = format!("torch peer: {e}"),
            _ => {}
        }
        for (c, f) in run.iter_mut().enumerate() {
            let s = time(repeats, &mut **f);
            ours[c].push(s);
            if let Some(ps) = p.as_ref().ok().and_then(|v| v[CASES[c].0].as_f64()) {
                theirs[c].push(ps);
                ratios[c].push(ps / s);
            }
        }
        if p.is_err() {
            break; // without a peer one round is the figure
        }
    }
    let rows = (0..n)
        .map(|c| Row {
            name: CASES[c].1.into(),
            value: median(ours[c].clone()) * 1e3,
            unit: "ms",
            peer: (!theirs[c].is_empty()).then(|| format!("torch {}", CASES[c].0)),
            peer_value: (!theirs[c].is_empty()).then(|| median(theirs[c].clone()) * 1e3),
            peer_ratio: (!ratios[c].is_empty()).then(|| median(ratios[c].clone())),
            ..Default::default()
        })
        .collect();
    Ok((rows, note))
}
