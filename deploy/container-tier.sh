#!/usr/bin/env bash
# `make container` (run by `make test`): the container tier (tests/container, marker `container`).
# Gets a Docker engine (deploy/dockerd.sh: installs docker.io and starts a private dockerd when none
# answers), builds the image once (deploy/build-image.sh; the debootstrap base is reused when it
# exists), runs the tier, and says plainly whether it ran. Without an engine it fails (exit 1)
# with the reason; RAFTBROKER_CONTAINER_TIER=skip skips it on purpose, and says so.
# Usage: deploy/container-tier.sh PYTEST [PYTEST ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=$1; shift
if [ "${RAFTBROKER_CONTAINER_TIER:-}" = skip ]; then
  echo "container tier: NOT RUN (RAFTBROKER_CONTAINER_TIER=skip)"; exit 0
fi
ROOT=${RAFTBROKER_DOCKER_ROOT:-/var/lib/raftbroker-docker}
started_here=
[ -f "$ROOT/dockerd.pid" ] && kill -0 "$(cat "$ROOT/dockerd.pid")" 2>/dev/null || started_here=1
if ! engine=$(deploy/dockerd.sh); then
  echo "container tier: NOT RUN: no Docker engine could be had (see the lines above); failing"; exit 1
fi
export "${engine?}"
echo "container tier: engine $DOCKER_HOST; building the image"
start=$(date +%s)
if ! image=$(deploy/build-image.sh | tail -1); then
  echo "container tier: NOT RUN: deploy/build-image.sh failed; failing"; exit 1
fi
echo "container tier: image $image built in $(( $(date +%s) - start )) s; running tests/container"
RAFTBROKER_IMAGE=$image "$PYTEST" -m container tests/container "$@"
rc=$?
echo "container tier: RAN, pytest exit $rc, $(( $(date +%s) - start )) s in all"
# a private dockerd this run started is stopped again (its images stay in $ROOT for the next run)
if [ -n "$started_here" ] && [ "$DOCKER_HOST" = "unix://$ROOT/docker.sock" ] && [ -f "$ROOT/dockerd.pid" ]; then
  kill "$(cat "$ROOT/dockerd.pid")" 2>/dev/null && echo "container tier: stopped the dockerd it started"
fi
exit $rc
