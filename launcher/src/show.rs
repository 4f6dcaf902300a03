//! `nx show` and `nx plan`.

use nx::placement::{Placement, Window};
use nx::{Device, Devices, Dtype, MeshSpec, PlacementSpec};
use serde::Serialize;

/// Arguments of `nx show`.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// The mesh, as `dp=2,tp=3`.
    #[arg(long)]
    mesh: MeshSpec,
    /// The placement, as `mesh(0:dp.tp)`.
    #[arg(long)]
    placement: PlacementSpec,
    /// The value's global shape, as `7,5` (empty for a rank-0 value).
    #[arg(long, value_parser = parse_shape, allow_hyphen_values = true)]
    shape: Shape,
    /// Print JSON instead of a drawing.
    #[arg(long)]
    json: bool,
}

/// The most devices `nx plan` plans for.
const MAX_PLAN_DEVICES: usize = 4096;

/// Arguments of `nx plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The mesh, as `dp=2,tp=4`.
    #[arg(long)]
    mesh: MeshSpec,
    /// The value's global shape, as `4096,4096`.
    #[arg(long, value_parser = parse_shape)]
    shape: Shape,
    /// The element dtype (`f32`, `bf16`, `float16`, …).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// The placement the value leaves.
    #[arg(long)]
    from: PlacementSpec,
    /// The placement the value reaches.
    #[arg(long)]
    to: PlacementSpec,
    /// Print JSON instead of words.
    #[arg(long)]
    json: bool,
    /// Lay the devices over hosts, this many a host in device order (`2,2`): bytes by kind of
    /// link and the predicted time from each kind's bandwidth.
    #[arg(long, value_parser = parse_hosts)]
    hosts: Option<Hosts>,
    /// Gbit/s a device moves to devices of its host (with --hosts).
    #[arg(long, default_value_t = 80.0)]
    within_gbps: f64,
    /// Gbit/s a host's link carries each way, shared by its devices (with --hosts).
    #[arg(long, default_value_t = 10.0)]
    across_gbps: f64,
}

#[derive(Debug, Clone)]
struct Hosts(Vec<usize>);

fn parse_hosts(text: &str) -> Result<Hosts, String> {
    text.split(',')
        .map(|k| k.trim().parse::<usize>().ok().filter(|&k| k > 0))
        .collect::<Option<Vec<usize>>>()
        .map(Hosts)
        .ok_or_else(|| format!("{text:?} is not a list of devices a host, as 2,2"))
}

#[derive(Debug, Clone)]
struct Shape(Vec<usize>);

fn parse_shape(text: &str) -> Result<Shape, String> {
    let t = text.trim().trim_start_matches('[').trim_end_matches(']');
    if t.trim().is_empty() {
        return Ok(Shape(Vec::new()));
    }
    t.split(',')
        .map(|p| p.trim().parse::<usize>().map_err(|_| format!("{p:?} in shape {text:?} is not an extent")))
        .collect::<Result<_, _>>()
        .map(Shape)
}

type Error = Box<dyn std::error::Error>;

fn over_sims<R>(mesh: &MeshSpec, body: impl for<'d> FnOnce(nx::Mesh<'d>) -> Result<R, Error>) -> Result<R, Error> {
    Devices::with(Device::sims(mesh.size()), |set| body(mesh.over(&set)?))?
}

#[derive(Serialize)]
struct ShowJson<'a> {
    mesh: Vec<(&'a str, usize)>,
    shape: &'a [usize],
    placement: String,
    devices: Vec<DeviceJson>,
}

#[derive(Serialize)]
struct DeviceJson {
    index: usize,
    device: String,
    coords: Vec<usize>,
    window: Option<Vec<[usize; 2]>>,
    term: Option<usize>,
}

/// `nx show`: the drawing (a grid for rank ≤ 2, a table beyond), or JSON.
pub fn show(a: &ShowArgs) -> Result<String, Error> {
    over_sims(&a.mesh, |mesh| {
        let p = a.placement.over(&mesh)?;
        let shape = &a.shape.0;
        let windows = p.windows(shape)?;
        if a.json {
            let devices = (0..mesh.len())
                .map(|d| -> Result<DeviceJson, Error> {
                    Ok(DeviceJson {
                        index: d,
                        device: mesh.devices().as_slice()[d].to_string(),
                        coords: mesh.coords_of(d)?,
                        window: windows[d].as_ref().map(|w| w.iter().map(|r| [r.start, r.end]).collect()),
                        term: p.term(d)?,
                    })
                })
                .collect::<Result<_, _>>()?;
            let j = ShowJson {
                mesh: mesh.axes().iter().map(|(n, e)| (n.as_str(), *e)).collect(),
                shape,
                placement: p.to_string(),
                devices,
            };
            return Ok(serde_json::to_string(&j)?);
        }
        Ok(draw(&p, shape, &windows))
    })
}

fn label(p: &Placement<'_>, d: usize) -> String {
    let name = p.devices().as_slice()[d].to_string();
    match p.term(d).ok().flatten() {
        Some(t) => format!("{name}·t{t}"),
        None => name,
    }
}

fn cuts(windows: &[Option<Window>], axis: usize, n: usize) -> Vec<(usize, usize)> {
    let mut b: Vec<usize> = vec![0, n];
    for w in windows.iter().flatten() {
        b.push(w[axis].start);
        b.push(w[axis].end);
    }
    b.sort_unstable();
    b.dedup();
    b.windows(2).map(|x| (x[0], x[1])).collect()
}

fn draw(p: &Placement<'_>, shape: &[usize], windows: &[Option<Window>]) -> String {
    let mut out = format!("shape {shape:?} at {p:#}\n");
    let nothing: Vec<String> = (0..windows.len()).filter(|&d| windows[d].is_none()).map(|d| label(p, d)).collect();
    if shape.len() > 2 || shape.contains(&0) {
        if shape.contains(&0) {
            out.push_str("(the value has no element)\n");
        }
        out.push_str("device   coords      term  window\n");
        let mesh = p.mesh_of();
        for (d, w) in windows.iter().enumerate() {
            let coords = mesh.coords_of(d).map(|c| format!("{c:?}")).unwrap_or_default();
            let term = p.term(d).ok().flatten().map_or("-".to_string(), |t| t.to_string());
            let win = w.as_ref().map_or("nothing".to_string(), |w| {
                w.iter().map(|r| format!("{}..{}", r.start, r.end)).collect::<Vec<_>>().join(", ")
            });
            out.push_str(&format!(
                "{:<8} {:<11} {:<5} [{win}]\n",
                label(p, d).split('·').next().unwrap_or(""),
                coords,
                term
            ));
        }
        return out.trim_end().to_string();
    }
    // rank 0, 1 or 2: a grid of blocks, each naming the devices that hold it
    let rows = if shape.len() == 2 { cuts(windows, 0, shape[0]) } else { vec![(0, 1)] };
    let cols = match shape.len() {
        0 => vec![(0, 1)],
        1 => cuts(windows, 0, shape[0]),
        _ => cuts(windows, 1, shape[1]),
    };
    let holds = |w: &Window, r: (usize, usize), c: (usize, usize)| match shape.len() {
        0 => true,
        1 => w[0].start <= c.0 && c.1 <= w[0].end,
        _ => w[0].start <= r.0 && r.1 <= w[0].end && w[1].start <= c.0 && c.1 <= w[1].end,
    };
    let cell: Vec<Vec<String>> = rows
        .iter()
        .map(|&r| {
            cols.iter()
                .map(|&c| {
                    let who: Vec<String> = (0..windows.len())
                        .filter(|&d| windows[d].as_ref().is_some_and(|w| holds(w, r, c)))
                        .map(|d| label(p, d))
                        .collect();
                    who.join(",")
                })
                .collect()
        })
        .collect();
    let col_head: Vec<String> =
        cols.iter().map(|c| if shape.is_empty() { String::new() } else { format!("{}..{}", c.0, c.1) }).collect();
    let width: Vec<usize> = (0..cols.len())
        .map(|j| cell.iter().map(|row| row[j].chars().count()).chain([col_head[j].len()]).max().unwrap_or(0) + 2)
        .collect();
    let row_head: Vec<String> =
        rows.iter().map(|r| if shape.len() == 2 { format!("{}..{}", r.0, r.1) } else { String::new() }).collect();
    let lw = row_head.iter().map(String::len).max().unwrap_or(0);
    let line = |l: char, m: char, r: char| {
        let parts: Vec<String> = width.iter().map(|&w| "─".repeat(w)).collect();
        format!("{:lw$} {l}{}{r}\n", "", parts.join(&m.to_string()))
    };
    let center = |s: &str, w: usize| {
        let n = s.chars().count();
        let left = (w - n) / 2;
        format!("{}{s}{}", " ".repeat(left), " ".repeat(w - n - left))
    };
    let head: Vec<String> = col_head.iter().zip(&width).map(|(h, &w)| center(h, w)).collect();
    let head = format!("{:lw$}  {}", "", head.join(" "));
    out.push_str(head.trim_end());
    out.push('\n');
    out.push_str(&line('┌', '┬', '┐'));
    for (i, row) in cell.iter().enumerate() {
        let body: Vec<String> = row.iter().zip(&width).map(|(s, &w)| center(s, w)).collect();
        out.push_str(&format!("{:>lw$} │{}│\n", row_head[i], body.join("│")));
        out.push_str(&if i + 1 < cell.len() { line('├', '┼', '┤') } else { line('└', '┴', '┘') });
    }
    if !nothing.is_empty() {
        out.push_str(&format!("holding nothing: {}\n", nothing.join(", ")));
    }
    out.trim_end().to_string()
}

#[derive(Serialize)]
struct PlanJson {
    from: String,
    to: String,
    steps: Vec<StepJson>,
    bytes_sent: Vec<u64>,
    bytes_received: Vec<u64>,
    /// With --hosts: each step's bytes by link kind, and the predicted seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    links: Option<Vec<nx::placement::LinkBytes>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    predicted_seconds: Option<f64>,
}

#[derive(Serialize)]
struct StepJson {
    op: &'static str,
    mesh_axes: Vec<String>,
    bytes_sent: Vec<u64>,
    bytes_received: Vec<u64>,
}

/// `nx plan`: the plan in words, or JSON.
pub fn plan(a: &PlanArgs) -> Result<String, Error> {
    // the planner's work and memory grow with the square of the devices (2048: a second and
    // 300 MB here; 16,384: 100 s and 19 GB)
    if a.mesh.size() > MAX_PLAN_DEVICES {
        return Err(format!(
            "nx plan: the mesh {} spans {} devices; nx plan plans meshes of at most {MAX_PLAN_DEVICES} devices",
            a.mesh,
            a.mesh.size()
        )
        .into());
    }
    let topology = match &a.hosts {
        Some(Hosts(per)) => {
            let total = per.iter().try_fold(0usize, |t, &k| t.checked_add(k));
            if total != Some(a.mesh.size()) {
                let laid = total.map_or("more than 2^64".to_string(), |t| t.to_string());
                return Err(format!(
                    "nx plan: --hosts {per:?} lays out {laid} devices, the mesh {} has {}",
                    a.mesh,
                    a.mesh.size()
                )
                .into());
            }
            for (what, g) in [("--within-gbps", a.within_gbps), ("--across-gbps", a.across_gbps)] {
                if !(g.is_finite() && g > 0.0) {
                    return Err(format!("nx plan: {what} {g} is not a bandwidth above 0").into());
                }
            }
            Some(nx::placement::Topology {
                hosts: per.iter().enumerate().flat_map(|(h, &k)| std::iter::repeat_n(h, k)).collect(),
                within_bytes_per_second: a.within_gbps * 1e9 / 8.0,
                across_bytes_per_second: a.across_gbps * 1e9 / 8.0,
                step_latency_seconds: nx::placement::CostModel::default().step_latency_seconds,
            })
        }
        None => None,
    };
    over_sims(&a.mesh, |mesh| {
        let from = a.from.over(&mesh)?;
        let to = a.to.over(&mesh)?;
        let plan = nx::plan(&from, &to, &a.shape.0, a.dtype)?;
        // the plan's devices are the mesh's, in order (one set)
        let links = match &topology {
            Some(t) => Some((plan.link_bytes(&t.hosts)?, plan.predicted_seconds_on(t)?)),
            None => None,
        };
        if a.json {
            let j = PlanJson {
                from: from.to_string(),
                to: to.to_string(),
                steps: plan
                    .steps
                    .iter()
                    .map(|s| StepJson {
                        op: s.op.name(),
                        mesh_axes: s.mesh_axes.clone(),
                        bytes_sent: s.bytes_sent.clone(),
                        bytes_received: s.bytes_received.clone(),
                    })
                    .collect(),
                bytes_sent: plan.bytes_sent(),
                bytes_received: plan.bytes_received(),
                predicted_seconds: links.as_ref().map(|l| l.1),
                links: links.map(|l| l.0),
            };
            return Ok(serde_json::to_string(&j)?);
        }
        let mut text = plan.to_string();
        if let (Some((links, secs)), Some(t)) = (links, &topology) {
            let hosts = t.hosts.iter().max().map_or(0, |h| h + 1);
            text.push_str(&format!(
                "\n\nover {hosts} hosts ({}), bytes each device sends within its host / across hosts:",
                a.hosts.as_ref().map_or(String::new(), |h| format!("{:?} devices a host", h.0))
            ));
            for (k, (step, lb)) in plan.steps.iter().zip(&links).enumerate() {
                let cells: Vec<String> = lb
                    .within_sent
                    .iter()
                    .zip(&lb.across_sent)
                    .map(|(w, x)| {
                        format!("{} / {}", nx::placement::plan::human_bytes(*w), nx::placement::plan::human_bytes(*x))
                    })
                    .collect();
                text.push_str(&format!("\n  step {} {}: {}", k + 1, step.op.name(), cells.join(", ")));
            }
            text.push_str(&format!(
                "\npredicted: {:.3} ms ({} Gbit/s within a host, {} Gbit/s a host's link)",
                secs * 1e3,
                a.within_gbps,
                a.across_gbps
            ));
        }
        Ok(text)
    })
}
