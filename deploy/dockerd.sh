#!/usr/bin/env bash
# Make sure a Docker engine answers for the container tier, and print the DOCKER_HOST to use.
#
# An engine already answering on $DOCKER_HOST, the default socket or our private socket is used as it is. Otherwise
# (as root) Debian's docker.io is installed when missing and a private dockerd is started with its
# own data root, exec root, socket and pid file under $RAFTBROKER_DOCKER_ROOT (default
# /var/lib/raftbroker-docker), with --iptables=false and --ip-forward=false so that it leaves the
# host's firewall and forwarding alone: containers on one user-defined network still reach each other
# (one bridge) and resolve each other's names (docker's embedded DNS), which is all the tier needs;
# they cannot reach beyond the host, which the tier does not need. The engine is left running for
# the caller (deploy/container-tier.sh stops it again after the tier when it started it); stop it
# by hand with `kill $(cat $ROOT/dockerd.pid)`.
#
# Output: one line `DOCKER_HOST=unix://...` on stdout; exit 1 with the reason on stderr if no
# engine could be had.
set -euo pipefail
ROOT=${RAFTBROKER_DOCKER_ROOT:-/var/lib/raftbroker-docker}
SOCK="$ROOT/docker.sock"
answers() { DOCKER_HOST="$1" timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if [ -n "${DOCKER_HOST:-}" ] && command -v docker >/dev/null && answers "$DOCKER_HOST"; then
  echo "DOCKER_HOST=$DOCKER_HOST"; exit 0
fi
if command -v docker >/dev/null && [ -S /var/run/docker.sock ] && answers unix:///var/run/docker.sock; then
  echo "DOCKER_HOST=unix:///var/run/docker.sock"; exit 0
fi
if command -v docker >/dev/null && answers "unix://$SOCK"; then
  echo "DOCKER_HOST=unix://$SOCK"; exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "dockerd.sh: no Docker engine answers and this is not root: cannot install or start one" >&2; exit 1
fi
if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  echo "dockerd.sh: installing docker.io" >&2
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io; } >&2 \
    || { echo "dockerd.sh: apt-get install docker.io failed" >&2; exit 1; }
fi
mkdir -p "$ROOT/data" "$ROOT/exec"
echo "dockerd.sh: starting dockerd (data root $ROOT/data, log $ROOT/dockerd.log)" >&2
nohup setsid dockerd --data-root "$ROOT/data" --exec-root "$ROOT/exec" -H "unix://$SOCK" \
  --pidfile "$ROOT/dockerd.pid" --iptables=false --ip-forward=false --ip-masq=false \
  >"$ROOT/dockerd.log" 2>&1 </dev/null &
for _ in $(seq 1 120); do
  if answers "unix://$SOCK"; then echo "DOCKER_HOST=unix://$SOCK"; exit 0; fi
  sleep 0.5
done
echo "dockerd.sh: dockerd did not answer within 60 s; its log:" >&2
tail -20 "$ROOT/dockerd.log" >&2
exit 1
