//! The windows and terms of `tests/data/placements.json`, computed by an independent
//! implementation of the reference, must be ours exactly.

use std::path::PathBuf;

use nx_placement::{Device, Devices, MeshSpec, PlacementSpec};
use serde_json::Value;

fn conformance(name: &str) -> Value {
    let dir = std::env::var_os("NX_CONFORMANCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"));
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {} (set NX_CONFORMANCE): {e}", path.display()));
    serde_json::from_str(&text).expect("conformance file is JSON")
}

#[test]
fn placements_match_the_conformance_vectors() {
    let data = conformance("placements.json");
    let cases = data["cases"].as_array().expect("cases");
    assert!(cases.len() >= 50, "expected the full vector set, got {}", cases.len());
    for case in cases {
        let mesh: MeshSpec = case["mesh"].as_str().unwrap().parse().unwrap();
        let shape: Vec<usize> =
            case["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let spec: PlacementSpec = case["placement"].as_str().unwrap().parse().unwrap();
        assert_eq!(spec.to_string(), case["placement"].as_str().unwrap(), "canonical text");
        let devices = Devices::unbranded(Device::sims(mesh.size())).unwrap();
        let m = mesh.over(&devices).unwrap();
        let p = spec.over(&m).unwrap();
        for dev in case["devices"].as_array().unwrap() {
            let index = dev["index"].as_u64().unwrap() as usize;
            let want_window: Option<Vec<(usize, usize)>> = dev["window"].as_array().map(|w| {
                w.iter().map(|r| (r[0].as_u64().unwrap() as usize, r[1].as_u64().unwrap() as usize)).collect()
            });
            let got = p.window(&shape, index).unwrap().map(|w| w.iter().map(|r| (r.start, r.end)).collect());
            assert_eq!(got, want_window, "window of device {index} in {case}");
            let want_term = dev["term"].as_u64().map(|t| t as usize);
            assert_eq!(p.term(index).unwrap(), want_term, "term of device {index} in {case}");
        }
    }
}
