#!/usr/bin/env bash
# Builds Palisade's image from this tree: the release binaries, the shared
# libraries ldd names for them (from the build machine's Debian packages),
# a passwd with root and the non-root user, CA certificates, staged as the
# build context of ./Dockerfile (FROM scratch) and built with buildah.
#
#   scripts/image.sh [--repository REPO] [--profile release|dev] [--version V]
#
# Tags REPO:VERSION and REPO:VERSION-COMMIT (the workspace version, or V,
# and the commit, with "-dirty" when tracked files differ from it). V names
# a build of this tree as another version (the upgrade test's second image;
# a release candidate): the binaries are the same, the tags and the image's
# version label are V's. The build is
# reproducible: the layer's timestamps are the commit's, so the same tree
# gives the same image id, and an up-to-date image is not rebuilt. Prints
# key=value lines last: image= (the VERSION-COMMIT reference), id=,
# size_bytes=, built=yes|no. Needs root (buildah), cargo, and buildah
# (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

# The chart's image.repository is the one home of the default repository.
repository=$(sed -n 's/^  repository: *//p' helm/palisade/values.yaml | head -1)
[[ -n $repository ]] || { echo "image.sh: no image.repository in helm/palisade/values.yaml" >&2; exit 2; }
profile=release
version=
while (($#)); do
  case $1 in
    --repository) repository=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    *) echo "image.sh: unknown argument $1 (known: --repository REPO, --profile release|dev, --version V)" >&2; exit 2 ;;
  esac
done
# A tag's characters (the OCI distribution spec), and not a tag of its own
# kind: V-COMMIT must still say which commit.
if [[ -n $version && ! $version =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,80}$ ]]; then
  echo "image.sh: --version $version is not a valid image tag (letters, digits, _ . -; at most 81)" >&2
  exit 2
fi
case $profile in
  release) target_dir=target/release ;;
  dev) target_dir=target/debug ;;
  *) echo "image.sh: --profile must be release or dev, not $profile" >&2; exit 2 ;;
esac
command -v buildah >/dev/null || { echo "image.sh: buildah not found (scripts/setup.sh installs it)" >&2; exit 2; }
# One build at a time (tests in parallel share the image).
mkdir -p target
exec 9>target/.image.lock
flock 9

[[ -n $version ]] || version=$(cargo metadata --no-deps --format-version 1 --locked |
  python3 -c 'import json,sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["node-enforcer"])')
commit=$(git rev-parse --short=12 HEAD)
git diff --quiet HEAD -- || commit="$commit-dirty"
commit_time=$(git log -1 --format=%ct HEAD)
ref="$repository:$version-$commit"

cargo build --profile "$profile" --locked \
  -p policy-controller --bin palisade-controller \
  -p node-enforcer --bin palisade-enforcer >&2
# palisade-cni runs on the node itself (the init container copies it
# there), under whatever C library the node has: linked statically, so that
# a node older than this build machine (glibc before 2.34: RHEL 8, Amazon
# Linux 2) runs it too. An explicit --target keeps the flag off build
# scripts and proc macros, and this build in a target dir of its own.
host=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --profile "$profile" --locked --target "$host" \
  -p node-enforcer --bin palisade-cni >&2
cni_binary="target/$host/${target_dir#target/}/palisade-cni"

context=$(mktemp -d "${TMPDIR:-/tmp}/palisade-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
root="$context/rootfs"
mkdir -p "$root"

# Copies a host path into the image at the same path, recreating every
# symlink on the way (/lib64 -> usr/lib64, ...), so that the paths the
# binaries name (their interpreter, ldd's answers) resolve in the image as
# they do here.
stage_path() {
  local path=$1 prefix="" rest=${1#/} part target dir
  while [[ -n $rest ]]; do
    part=${rest%%/*}
    if [[ $rest == */* ]]; then rest=${rest#*/}; else rest=""; fi
    prefix="$prefix/$part"
    if [[ -L $prefix ]]; then
      target=$(readlink "$prefix")
      dir=$(dirname "$prefix")
      mkdir -p "$root$dir"
      [[ -L $root$prefix ]] || ln -s "$target" "$root$prefix"
      [[ $target == /* ]] || target="${dir%/}/$target"
      stage_path "$target${rest:+/$rest}"
      return
    fi
  done
  mkdir -p "$root$(dirname "$path")"
  cp "$path" "$root$path"
}

# The dynamically linked binaries; palisade-cni is static (above).
binaries=(palisade-controller palisade-enforcer)
mkdir -p "$root/usr/local/bin"
for b in "${binaries[@]}"; do
  install -m 0755 "$target_dir/$b" "$root/usr/local/bin/$b"
done
install -m 0755 "$cni_binary" "$root/usr/local/bin/palisade-cni"

# Every library any binary loads, and the dynamic loader itself.
mapfile -t libraries < <(for b in "${binaries[@]}"; do
    ldd "$target_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
  done | sort -u)
for lib in "${libraries[@]}"; do
  stage_path "$lib"
done

# Licences of the Debian packages whose files the image carries.
packages=()
for lib in "${libraries[@]}"; do
  packages+=("$(dpkg -S "$lib" | head -1 | cut -d: -f1)")
done
packages+=(ca-certificates)
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
for p in "${packages[@]}"; do
  stage_path "/usr/share/doc/$p/copyright"
done

mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/usr/share/palisade"
chmod 1777 "$root/tmp"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
# glibc resolves names from /etc/hosts first (hostAliases, the node's own
# names), then DNS.
echo 'hosts: files dns' >"$root/etc/nsswitch.conf"

# What the image holds and where each file came from; checked by the image
# test, readable in the image for whoever audits it.
{
  for p in "${packages[@]}"; do
    echo "package $p $(dpkg-query -W -f='${Version}' "$p")"
  done
  (cd "$root" && find . -type f -printf '%P\n' | sort | xargs sha256sum | sed 's/^/file /')
} >"$context/image-contents"
# Moved in after the listing, which would otherwise name itself.
mv "$context/image-contents" "$root/usr/share/palisade/image-contents"

cp Dockerfile "$context/Dockerfile"
find "$root" -exec touch -h -d "@$commit_time" {} +

# The build context's digest, as a label: an image that already has it is
# this very build, and is not rebuilt.
digest=$(cd "$context" && {
  find . -printf '%p %m %l\n' | sort
  find . -type f -print0 | sort -z | xargs -0 sha256sum
} | sha256sum | cut -c1-64)
built=no
if [[ $(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "io.palisade.context"}}' "$ref" 2>/dev/null) != "$digest" ]]; then
  buildah bud --quiet --isolation chroot --timestamp "$commit_time" \
    --build-arg VERSION="$version" --build-arg REVISION="$commit" \
    --label io.palisade.context="$digest" \
    --tag "$ref" -f "$context/Dockerfile" "$context" >&2
  built=yes
fi
buildah tag "$ref" "$repository:$version" >&2
id=$(buildah inspect --type image --format '{{.FromImageID}}' "$ref")
size=$(podman image inspect --format '{{.Size}}' "$ref" 2>/dev/null || echo unknown)
echo "image=$ref"
echo "id=$id"
echo "size_bytes=$size"
echo "built=$built"
