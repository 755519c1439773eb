# Palisade's image: palisade-controller, palisade-enforcer and palisade-cni
# (which the enforcer DaemonSet's init container copies onto the node), the
# shared libraries the first two link (named by ldd), a passwd with the non-root user,
# CA certificates. Nothing else: no shell, no package manager.
#
# Built by scripts/image.sh, which compiles the release binaries and stages
# the build context this file copies (rootfs/); build it with that script,
# in CI as on a laptop:
#
#   scripts/image.sh              # -> ghcr.io/palisade/palisade:VERSION and :VERSION-COMMIT
#
# FROM scratch so that the image tested in this repository's CI (no registry,
# nothing to pull) is the image shipped. The libraries come from the build
# machine's Debian packages (listed in /usr/share/palisade/image-contents).
# palisade-cni, which also runs on the node itself, is linked statically:
# it needs nothing of the node's C library, whatever its version.
FROM scratch
COPY rootfs/ /
ARG VERSION
ARG REVISION
LABEL org.opencontainers.image.title="palisade" \
      org.opencontainers.image.description="Kubernetes NetworkPolicy enforcement with eBPF" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# The controller runs as this user (the chart sets it too); the enforcer
# and the init containers override it with root plus only the capabilities
# they need (see helm/palisade/templates/enforcer.yaml).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/palisade-controller"]
