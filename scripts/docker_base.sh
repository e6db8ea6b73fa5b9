#!/usr/bin/env bash
# A Docker engine and a registry-free Debian base image for the CPU experiment image.
#
#   bash scripts/docker_base.sh engine   # start dockerd unless one answers; prints STARTED <pid>
#   bash scripts/docker_base.sh base     # make the base image (debootstrap + docker import)
#   bash scripts/docker_base.sh stop PID # stop a dockerd this script started
#
# The engine is started as the project's hosts allow it: `--storage-driver=vfs` (no overlay in
# a container), `--iptables=false --bridge=none` (benchmark containers get `network_mode=none`
# anyway), its data under the cache folder so built images survive for the next run (CI keeps
# ~/.cache). Root is needed to install packages and start the engine; an engine that already
# answers (DOCKER_HOST or the default socket) is used as it is.
set -euo pipefail
cache=${TILEGYM_DOCKER_CACHE:-$HOME/.cache/tilegym/docker}
base_image=${TILEGYM_DOCKER_BASE:-tilegym-base:bookworm}
suite=${TILEGYM_DOCKER_SUITE:-bookworm}
mirror=${TILEGYM_DOCKER_MIRROR:-http://deb.debian.org/debian}
start_timeout=${TILEGYM_DOCKER_START_TIMEOUT:-60}

die() {
  echo "error: $*" >&2
  exit 1
}

need_package() { # need_package COMMAND PACKAGE: install PACKAGE when COMMAND is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "$1 is missing and only root can install it (apt-get install $2)"
  echo "docker: installing $2" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$2" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends "$2" >/dev/null; } ||
    die "cannot install $2"
}

engine_answers() { docker info >/dev/null 2>&1; }

start_engine() {
  need_package docker docker.io
  if engine_answers; then
    echo "docker: using the engine that answers" >&2
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "no Docker engine answers and only root can start one"
  need_package dockerd docker.io
  [ -z "${DOCKER_HOST:-}" ] || die "DOCKER_HOST=$DOCKER_HOST does not answer; unset it to start a local engine"
  mkdir -p "$cache/engine"
  echo "docker: starting dockerd (vfs, no bridge, data in $cache/engine)" >&2
  dockerd --storage-driver=vfs --iptables=false --bridge=none \
    --data-root "$cache/engine" --pidfile "$cache/dockerd.pid" \
    >"$cache/dockerd.log" 2>&1 </dev/null &
  local pid=$! waited=0
  until engine_answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 5 "$cache/dockerd.log" >&2
      die "dockerd exited at start (log: $cache/dockerd.log)"
    fi
    if [ "$waited" -ge "$start_timeout" ]; then
      kill "$pid" 2>/dev/null || true
      die "dockerd did not answer within ${start_timeout} s (log: $cache/dockerd.log)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "STARTED $pid"
}

stop_engine() {
  local pid=$1 waited=0
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge 30 ]; then
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "docker: stopped dockerd $pid" >&2
}

make_base() {
  if docker image inspect "$base_image" >/dev/null 2>&1; then
    echo "docker: base image $base_image present" >&2
    return 0
  fi
  need_package debootstrap debootstrap
  local root
  root=$(mktemp -d "${TMPDIR:-/tmp}/tilegym-rootfs.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the folder is local
  trap "rm -rf '$root'" EXIT
  echo "docker: debootstrap $suite (minbase + python3, venv, git, CAs) into $root" >&2
  debootstrap --variant=minbase --include=python3,python3-venv,git,ca-certificates \
    "$suite" "$root/fs" "$mirror" >"$root/debootstrap.log" 2>&1 ||
    { tail -n 5 "$root/debootstrap.log" >&2; die "debootstrap failed (see above)"; }
  rm -rf "$root/fs/var/cache/apt/archives/"*.deb "$root/fs/var/lib/apt/lists/"* \
    "$root/fs/usr/share/doc" "$root/fs/usr/share/man" "$root/fs/usr/share/locale"
  tar -C "$root/fs" --numeric-owner -c . |
    docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "$base_image" >/dev/null
  echo "docker: base image $base_image imported" >&2
}

case "${1:-}" in
  engine) start_engine ;;
  base) make_base ;;
  stop) stop_engine "${2:?stop needs the dockerd pid}" ;;
  *) die "usage: docker_base.sh engine | base | stop PID" ;;
esac
