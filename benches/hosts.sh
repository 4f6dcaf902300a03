#!/usr/bin/env bash
# Collectives across hosts: 2 namespaced hosts (scripts/cluster) of 2 ranks each, every host's link
# limited to RATE (1gbit by default) both ways. nx's all-reduce and reduce-scatter of 64 MiB on
# the hierarchical path, on the flat exchange (NX_MPI_HIER=0), and the MPI library's own
# MPI_Allreduce / MPI_Reduce_scatter in the same runs (interleaved, medians of REPEATS), against
# the hierarchical floor from the link rate: a host sends S·(H−1)/H of a reduce-scatter of S bytes
# across its link (twice that for an all-reduce). Needs root and network namespaces.
#
#   benches/hosts.sh [RATE] [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-1gbit}"
repeats="${2:-5}"
case "$rate" in
    *gbit) bps=$(( ${rate%gbit} * 1000000000 )) ;;
    *mbit) bps=$(( ${rate%mbit} * 1000000 )) ;;
    *) echo "benches/hosts.sh: give the rate as Ngbit or Nmbit, not $rate" >&2; exit 2 ;;
esac
cargo build --release -q -p nx-launcher --features mpi
hosts="$(scripts/cluster up 2 --name bench --subnet 200 --rate "$rate")"
trap 'scripts/cluster down --name bench' EXIT
# shellcheck disable=SC1091
source "${NX_CLUSTER_DIR:-/tmp}/nx-cluster-bench/env"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out="$(mktemp -d)"
for hier in 1 0; do
    mpirun --oversubscribe -n 4 --host "$hosts" -x NX_MPI_HIER="$hier" \
        target/release/nx bench collectives --backend mpi --max-bytes $((64 << 20)) --repeats "$repeats" --json \
        >"$out/hier-$hier.json"
done
python3 - "$out" "$bps" <<'EOF'
import json, sys
out, bps = sys.argv[1], float(sys.argv[2])
rate = bps / 8  # bytes a second each way
H = 2
rows = {}
for hier in ("1", "0"):
    for line in open(f"{out}/hier-{hier}.json"):
        r = json.loads(line)
        if r["bytes"] == 64 << 20 and r["op"] in ("all_reduce", "reduce_scatter"):
            rows[(hier, r["op"])] = r
print(f"2 hosts x 2 ranks, links at {bps/1e9:.2f} Gbit/s, 64 MiB, medians of interleaved runs")
print(f"{'op':<16}{'nx hier (s)':>12}{'nx flat (s)':>12}{'plain MPI (s)':>14}{'floor (s)':>10}{'vs MPI':>8}{'of floor':>9}")
for op, factor in (("all_reduce", 2.0), ("reduce_scatter", 1.0)):
    h, f = rows[("1", op)], rows[("0", op)]
    plain = h.get("plain_mpi_seconds", float("nan"))
    floor = factor * (64 << 20) * (H - 1) / H / rate
    print(f"{op:<16}{h['seconds']:>12.3f}{f['seconds']:>12.3f}{plain:>14.3f}{floor:>10.3f}"
          f"{plain / h['seconds']:>8.2f}{floor / h['seconds']:>9.2f}")
EOF
rm -rf "$out"
