//! Plans over devices laid out on hosts: each step's bytes within and across hosts, against the
//! hierarchical and flat formulas written out here, on uneven sizes; the predicted time from the
//! busiest host link.

use nx_placement::{plan, Device, Devices, LinkBytes, Placement, Topology};

fn sum(v: &[u64]) -> u64 {
    v.iter().sum()
}

/// Every byte sent is received, within and across alike.
fn conserved(lb: &LinkBytes) {
    assert_eq!(sum(&lb.within_sent), sum(&lb.within_received), "{lb:?}");
    assert_eq!(sum(&lb.across_sent), sum(&lb.across_received), "{lb:?}");
}

/// `per` devices a host, in order.
fn layout(per: &[usize]) -> Vec<usize> {
    per.iter().enumerate().flat_map(|(h, &k)| std::iter::repeat_n(h, k)).collect()
}

#[test]
fn a_sum_over_hosts_of_as_many_devices_crosses_at_the_hierarchical_floor() {
    // 2 hosts of 2, 3 hosts of 2, 2 hosts of 3: S bytes all-reduced cross S·(H−1)/(H·L) twice a
    // device, reduce-scattered once; within, (L−1)/L of the host's part
    for (hosts, per) in [(2usize, 2usize), (3, 2), (2, 3)] {
        let n = hosts * per;
        let on = layout(&vec![per; hosts]);
        Devices::with(Device::sims(n), |s| {
            let m = nx_placement::Mesh::new(&s, &[("x", n)]).unwrap();
            let part = Placement::partial(&m, &["x"], &[]).unwrap();
            let len = 60 * n; // divides evenly: the formulas are exact
            let bytes = (len * 4) as u64;
            let (h, l) = (hosts as u64, per as u64);
            let ar = plan(&part, &part.closed(), &[len], 4).unwrap();
            let lb = &ar.link_bytes(&on).unwrap()[0];
            conserved(lb);
            for d in 0..n {
                assert_eq!(lb.across_sent[d], 2 * bytes * (h - 1) / (h * l), "all-reduce, {hosts}x{per}, device {d}");
                assert_eq!(lb.within_sent[d], 2 * bytes * (l - 1) / (l * h) * h, "all-reduce within, device {d}");
            }
            let rs = plan(&part, &Placement::split(0, &s).unwrap(), &[len], 4).unwrap();
            let lb = &rs.link_bytes(&on).unwrap()[0];
            conserved(lb);
            for d in 0..n {
                assert_eq!(lb.across_sent[d], bytes * (h - 1) / (h * l), "reduce-scatter, {hosts}x{per}, device {d}");
            }
            // all-gather of S: each host receives the other hosts' S·(H−1)/H once
            let ag = plan(&Placement::split(0, &s).unwrap(), &Placement::on(&s), &[len], 4).unwrap();
            let lb = &ag.link_bytes(&on).unwrap()[0];
            conserved(lb);
            for host in 0..hosts {
                let got: u64 = (0..n).filter(|&d| on[d] == host).map(|d| lb.across_received[d]).sum();
                assert_eq!(got, bytes * (h - 1) / h, "all-gather, host {host}");
            }
        })
        .unwrap();
    }
}

#[test]
fn other_layouts_exchange_directly() {
    // 3 + 1 devices: no hierarchy; a reduce-scatter sends each block straight to its keeper, so a
    // device sends across what the devices of other hosts keep (7 elements over 4: 2, 2, 2, 1)
    Devices::with(Device::sims(4), |s| {
        let m = nx_placement::Mesh::new(&s, &[("x", 4)]).unwrap();
        let part = Placement::partial(&m, &["x"], &[]).unwrap();
        let rs = plan(&part, &Placement::split(0, &s).unwrap(), &[7], 8).unwrap();
        let on = layout(&[3, 1]);
        let lb = &rs.link_bytes(&on).unwrap()[0];
        conserved(lb);
        assert_eq!(lb.across_sent, [8, 8, 8, 6 * 8]);
        assert_eq!(lb.within_sent, [4 * 8, 4 * 8, 4 * 8, 0]);
        // one host: nothing across; hosts of one device: everything across
        let one = &rs.link_bytes(&[0; 4]).unwrap()[0];
        assert_eq!(sum(&one.across_sent), 0);
        let spread = &rs.link_bytes(&[0, 1, 2, 3]).unwrap()[0];
        assert_eq!(sum(&spread.within_sent), 0);
        assert_eq!(spread.across_sent, rs.steps[0].bytes_sent);
        // a layout of other length is refused, naming both
        let e = rs.link_bytes(&[0, 0]).unwrap_err().to_string();
        assert!(e.contains("hosts for 2 devices") && e.contains("over 4"), "{e}");
    })
    .unwrap();
}

#[test]
fn the_predicted_time_follows_the_busiest_host_link() {
    Devices::with(Device::sims(4), |s| {
        let m = nx_placement::Mesh::new(&s, &[("x", 4)]).unwrap();
        let part = Placement::partial(&m, &["x"], &[]).unwrap();
        let len = 1 << 20;
        let ar = plan(&part, &part.closed(), &[len], 4).unwrap();
        let topo = |hosts: Vec<usize>| Topology {
            hosts,
            within_bytes_per_second: 1e12,
            across_bytes_per_second: 1e8,
            step_latency_seconds: 0.0,
        };
        // 2 hosts of 2: a host sends 2·S·(H−1)/H = S across; within is nearly free
        let t = ar.predicted_seconds_on(&topo(layout(&[2, 2]))).unwrap();
        let want = (len * 4) as f64 / 1e8;
        assert!((t - want).abs() / want < 1e-3, "{t} vs {want}");
        // one host: within only
        let t1 = ar.predicted_seconds_on(&topo(vec![0; 4])).unwrap();
        assert!(t1 < want / 100.0, "{t1}");
    })
    .unwrap();
}
