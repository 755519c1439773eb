#!/bin/sh
# Fails if palisade-lab left anything behind: its network namespaces
# (pl<6 hex>-...), pin roots under /sys/fs/bpf, run dirs, the Services'
# nftables table in the root namespace, a controller or enforcer process,
# or what a lab's containerd (runtime: containerd) left: its cgroups, the
# daemon or a shim; or (--node-processes image) a container or a bpffs
# mount; or a benchmark's tracefs instance. CI runs it after the
# end-to-end suite.
set -u

status=0

leftover_ns=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^pl[0-9a-f]{6}-' || true)
if [ -n "$leftover_ns" ]; then
    echo "leftover network namespaces:"; echo "$leftover_ns" | sed 's/^/  /'
    status=1
fi

leftover_pins=$(ls -d /sys/fs/bpf/palisade-lab-* 2>/dev/null || true)
if [ -n "$leftover_pins" ]; then
    echo "leftover pin roots:"; echo "$leftover_pins" | sed 's/^/  /'
    status=1
fi

# A benchmark's tracefs instance (and the root tests' own).
leftover_traces=$(ls -d /sys/kernel/tracing/instances/palisade-* 2>/dev/null || true)
if [ -n "$leftover_traces" ]; then
    echo "leftover tracefs instances:"; echo "$leftover_traces" | sed 's/^/  /'
    status=1
fi

# The lab's Service table lives in each node namespace (and goes with it);
# one in the machine's own namespace would translate the machine's traffic.
if command -v nft >/dev/null 2>&1 && nft list tables ip 2>/dev/null | grep -qx 'table ip palisade-lab-svc'; then
    echo "leftover nftables table in the root namespace: ip palisade-lab-svc"
    status=1
fi

# Image mode: containers of a lab (labelled with its id) and its nodes'
# bpffs mounts.
if command -v podman >/dev/null 2>&1; then
    leftover_ctrs=$(podman ps --all --filter label=io.palisade.lab --format '{{.Names}}' 2>/dev/null || true)
    if [ -n "$leftover_ctrs" ]; then
        echo "leftover containers:"; echo "$leftover_ctrs" | sed 's/^/  /'
        status=1
    fi
fi
leftover_mounts=$(awk '$2 ~ "^/run/palisade-lab/" {print $2}' /proc/self/mounts)
if [ -n "$leftover_mounts" ]; then
    echo "leftover mounts:"; echo "$leftover_mounts" | sed 's/^/  /'
    status=1
fi

# Kept logs (--keep-logs) are allowed; anything else in a run dir is not.
leftover_runs=$(find /run/palisade-lab -mindepth 2 -maxdepth 2 ! -name logs 2>/dev/null || true)
if [ -n "$leftover_runs" ]; then
    echo "leftover run state:"; echo "$leftover_runs" | sed 's/^/  /'
    status=1
fi

# Match the executable name exactly (the comm field is cut at 15 chars).
leftover_procs=$(ps -eo pid=,args= | awk '{n=$2; sub(".*/", "", n); if (n == "palisade-controller" || n == "palisade-enforcer") print}')
if [ -n "$leftover_procs" ]; then
    echo "leftover processes:"; echo "$leftover_procs" | sed 's/^/  /'
    status=1
fi

# runtime: containerd: every sandbox sits under the lab's cgroup, in every
# hierarchy; containerd and its shims name the lab's run dir.
leftover_cgroups=$(ls -d /sys/fs/cgroup/palisade-lab-* /sys/fs/cgroup/*/palisade-lab-* 2>/dev/null || true)
if [ -n "$leftover_cgroups" ]; then
    echo "leftover cgroups:"; echo "$leftover_cgroups" | sed 's/^/  /'
    status=1
fi
leftover_runtime=$(ps -eo pid=,args= | awk '{n=$2; sub(".*/", "", n); if ((n == "containerd" || n == "containerd-shim-runc-v2") && index($0, "/run/palisade-lab/")) print}')
if [ -n "$leftover_runtime" ]; then
    echo "leftover containerd processes:"; echo "$leftover_runtime" | sed 's/^/  /'
    status=1
fi

if [ "$status" -eq 0 ]; then
    echo "clean: no palisade-lab leftovers"
fi
exit "$status"
