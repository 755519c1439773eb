#!/usr/bin/env bash
# Datapath benchmarks of issue 6, each printing tables and one key=value line
# per measurement:
#   verdict  the cost in ns per packet of the real TC programs via
#            BPF_PROG_TEST_RUN for pod policies of 10 to 100,000 CIDR rules,
#            as ratios to a bare parse of the same round (rows: established
#            and new flows, fragment_allowed/_denied: a later fragment), and
#            in the same run the same pod with 10 and 100 ClusterNetworkPolicy
#            Admin rules in front of those rules, the table compiled by the
#            enforcer (rows established_fwd_tiers, new_allowed_tiers,
#            new_denied_tiers, lines with admin=)
#            (node-enforcer/benches/verdict; ARGS: --rounds N --rules A,B,..
#            --admin A,B,.. or 0): bench=verdict row= rules= [admin=] ns= ratio=
#   cleanup  the conntrack sweep of 100k and 1M eBPF entries against a real
#            kernel conntrack table of the same size, asking the kernel by
#            lookups (the default) and by netlink dump
#            (node-enforcer/benches/conntrack_cleanup.rs; ARGS: sizes, and
#            lookup or dump for one method):
#            bench=cleanup method= entries= kernel_buckets= wall_s= cpu_s=
#            extra_mb=, and the kernel's own share: bare_dump_cpu_s=
#            bare_read_cpu_s=
#   churn    one pod joining and leaving a 10,000-address peer set that 100
#            local pods' policies name, on real maps and veths: map writes
#            and time to realize, in place vs a new table
#            (node-enforcer/benches/churn.rs; ARGS: peers= pods= groups= reps=):
#            bench=churn change=join|leave path=in_place|rewrite map_ops= ms=
#   compile  one pod's ingress policy of 1,000, 10,000 and 100,000 rules of
#            one /32 each, and of one rule of 100,000 peers, from the plan's
#            arrival to its realization on real maps and a real veth
#            through the reconciler loop (compiled off its thread, written
#            in slices; node-enforcer/benches/compile.rs; ARGS: rules= peers=
#            for one row), each in its own process so peaks do not mix:
#            bench=compile rules= peers= ms= map_ops= peak_mb=
#
#   attach   one pod's two programs attached to its host veth, 20 pods one
#            after another by the enforcer's own attach: fast (filters),
#            their promotion to TCX links, and TCX links at once, each with
#            the kernel's rcu_expedited off and on
#            (node-enforcer/benches/attach.rs; ARGS: pods=N):
#            bench=attach hook= rcu_expedited= pods= per_pod_p50_ms=
#            per_pod_p99_ms= total_ms=
#
#   scripts/bench-datapath.sh [verdict|cleanup|churn|compile|attach] [ARGS...]   (no argument: all)
#
# Root (BPF, bpffs, conntrack). Installs nothing beyond what scripts/setup.sh
# does. The cleanup part raises net.netfilter.nf_conntrack_max for its run
# and puts it back; the attach part sets /sys/kernel/rcu_expedited and
# puts it back.
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/setup.sh >/dev/null

what="${1:-all}"
case "$what" in
  verdict|cleanup|churn|compile|attach) shift ;;
  all) ;;
  *) what=verdict ;; # bare flags go to the verdict bench, as before
esac
if [[ "$what" == verdict || "$what" == all ]]; then
  cargo bench --quiet -p node-enforcer --bench verdict -- "$@"
fi
if [[ "$what" == cleanup || "$what" == all ]]; then
  cargo bench --quiet -p node-enforcer --bench conntrack_cleanup -- "$@"
fi
if [[ "$what" == churn || "$what" == all ]]; then
  cargo bench --quiet -p node-enforcer --bench churn -- "$@"
fi
if [[ "$what" == attach || "$what" == all ]]; then
  cargo bench --quiet -p node-enforcer --bench attach -- "$@"
fi
if [[ "$what" == compile || "$what" == all ]]; then
  if [[ $# -gt 0 ]]; then
    cargo bench --quiet -p node-enforcer --bench compile -- "$@"
  else
    for shape in "rules=1000" "rules=10000" "rules=100000" "rules=1 peers=100000"; do
      # shellcheck disable=SC2086
      cargo bench --quiet -p node-enforcer --bench compile -- $shape
    done
  fi
fi
