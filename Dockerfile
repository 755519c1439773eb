# One image with Palisade's three binaries: palisade-controller,
# palisade-enforcer and palisade-cni (which the enforcer DaemonSet's init
# container copies onto the node). Not built in this repository's CI, which
# has no container engine; see README.md, "Installing with Helm".
#
#   docker build -t ghcr.io/palisade/palisade:0.1.0 .

# ---- build: Rust, and clang for the eBPF programs (C, compiled by
# ebpf/build.rs with clang -target bpf against libbpf's headers).
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      clang llvm libbpf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
      -p policy-controller --bin palisade-controller \
      -p node-enforcer --bin palisade-enforcer --bin palisade-cni \
 && mkdir -p /out \
 && cp target/release/palisade-controller target/release/palisade-enforcer \
       target/release/palisade-cni /out/

# ---- run: distroless with glibc (the binaries link it dynamically; the
# CNI plugin also runs on the host, whose glibc is at least bookworm's on
# supported nodes). No shell, no package manager.
FROM gcr.io/distroless/cc-debian12
COPY --from=build /out/ /usr/local/bin/
# The controller runs as this user (the chart sets it too); the enforcer
# and the init container override it with root plus only the capabilities
# they need (see helm/palisade/templates/enforcer.yaml).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/palisade-controller"]
