#!/usr/bin/env bash
# Build the raftbroker image here, with no image registry (SPEC §8, docs/deploy.md):
#   1. a Debian bookworm base (python3 + venv, libjemalloc2 for the nodes) made with debootstrap and imported into the engine as
#      $BASE_IMAGE; skipped when that image exists already (it only changes with Debian);
#   2. the project's wheel (the setup.py hook generates the gRPC stubs) and its dependencies' wheels,
#      built on the host into deploy/.build/wheels (pip's cache makes this quick the second time);
#   3. `docker build` of deploy/Dockerfile, which installs those wheels with --no-index (the build
#      needs no network) into /opt/raftbroker.
# Usage: deploy/build-image.sh [IMAGE]  (default raftbroker:VERSION, also tagged raftbroker:latest)
# Env: DOCKER_HOST (the engine), PY (a Python 3.11 with pip; default .venv/bin/python),
#      BASE_IMAGE (default raftbroker-base:bookworm-jemalloc), DEBIAN_MIRROR (default: the host's apt source).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
IMAGE=${1:-raftbroker:$VERSION}
BASE_IMAGE=${BASE_IMAGE:-raftbroker-base:bookworm-jemalloc}
BUILD=deploy/.build

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { apt-get update -q && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; }
  mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
    | head -1)}
  rootfs=$(mktemp -d /var/tmp/raftbroker-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  echo "build-image: debootstrap bookworm into $rootfs (about a minute)" >&2
  debootstrap --variant=minbase --include=python3,python3-venv,libjemalloc2 bookworm "$rootfs" ${mirror:+"$mirror"} \
    >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  trap - EXIT
  echo "build-image: imported $BASE_IMAGE" >&2
fi

# the dependencies' wheels (deps/: the same bytes from pip's cache each time, so docker reuses its
# install layer) apart from the project's own wheel (app/: rebuilt every time)
rm -rf "$BUILD/app" "$BUILD/deps" "$BUILD/wheels" && mkdir -p "$BUILD/app" "$BUILD/deps"
"$PY" -m pip wheel -q --no-deps -w "$BUILD/app" . >"$BUILD/pip.log" 2>&1 \
  && "$PY" -m pip wheel -q -w "$BUILD/deps" "$BUILD"/app/raftbroker-*.whl >>"$BUILD/pip.log" 2>&1 \
  || { grep -v "^WARNING: Location" "$BUILD/pip.log" >&2; exit 1; }
rm -f "$BUILD"/deps/raftbroker-*.whl
cp deploy/membership.py "$BUILD/membership.py"
docker build -q -f deploy/Dockerfile --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" -t raftbroker:latest "$BUILD" >&2
# earlier builds' images that lost their tags (only ours, by label)
docker image prune -f --filter label=io.raftbroker.built-by=deploy/build-image.sh >/dev/null || true
echo "$IMAGE"
