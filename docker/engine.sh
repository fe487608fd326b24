#!/bin/bash
# A Docker engine that answers, and the stack's base image, on a machine that may have neither:
# - no engine running (no systemd here): Debian's dockerd is started by hand, in the background,
#   logging to build/docker/dockerd.log, and left running for the next build;
# - no registry reachable: when `docker pull` of the base fails, the same name is made locally
#   from Debian's packages (debootstrap's minbase into a folder, trimmed as the slim image is,
#   then `docker import`), from the mirrors this machine's apt is configured with (its sources and
#   its proxy; DEBIAN_MIRROR overrides the archive), which the image's own apt then uses too.
#
#   docker/engine.sh [BASE]     (default debian:bookworm-slim)
set -euo pipefail

BASE=${1:-debian:bookworm-slim}
WORK=$(cd "$(dirname "$0")/.." && pwd)/build/docker
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
mkdir -p "$WORK"

if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || { echo "dockerd is missing: apt-get install docker.io" >&2; exit 1; }
    echo "starting dockerd (log: $WORK/dockerd.log)"
    $SUDO setsid dockerd >"$WORK/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start:" >&2; tail -20 "$WORK/dockerd.log" >&2; exit 1; }
    echo "dockerd is left running for the next build and the stack (pid $(pgrep -xo dockerd));" \
        "stop it with: $SUDO pkill -x dockerd"
fi

if docker image inspect "$BASE" >/dev/null 2>&1; then
    exit 0
fi
if timeout 60 docker pull "$BASE" >/dev/null 2>&1; then
    echo "pulled $BASE"
    exit 0
fi

case "$BASE" in
    debian:bookworm-slim) suite=bookworm ;;
    *) echo "$BASE cannot be pulled, and only debian:bookworm-slim can be made here" >&2; exit 1 ;;
esac
eval "$(python3 "$(dirname "$0")/apt_sources.py" "$suite")"
MIRROR=${DEBIAN_MIRROR:-$MIRROR}
if [ -z "$MIRROR" ]; then
    echo "this machine's apt has no source for $suite: set DEBIAN_MIRROR to a Debian archive" >&2
    exit 1
fi
# the proxy apt uses, for debootstrap's downloads too
eval "$(apt-config shell http_proxy Acquire::http::Proxy)"
[ -n "${http_proxy:-}" ] && export http_proxy
echo "no registry: making $BASE with debootstrap from $MIRROR"
root="$WORK/rootfs-$suite"
$SUDO rm -rf "$root"
$SUDO env ${http_proxy:+http_proxy="$http_proxy"} debootstrap --variant=minbase "$suite" "$root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
# the slim image's sources (this machine's mirrors) and trimming: no package lists, caches,
# manuals or translations
{
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' "$MIRROR" "$suite" "$suite"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [ -n "$SECURITY_MIRROR" ]; then
        printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' "$SECURITY_MIRROR" "$suite"
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    else
        echo "(this machine's apt has no $suite-security source: the image has none either)" >&2
    fi
} | $SUDO tee "$root/etc/apt/sources.list.d/debian.sources" >/dev/null
$SUDO rm -f "$root/etc/apt/sources.list"
$SUDO rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
$SUDO tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$BASE" >/dev/null
$SUDO rm -rf "$root"
echo "made $BASE"
