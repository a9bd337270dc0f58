#!/usr/bin/env bash
# Proves the README's promise: on a fresh Debian 12 with only `make` and `git`, `make
# bootstrap` installs everything, and the result works. Not part of `make test` (it takes
# many minutes and needs root); run by hand or by CI on demand:
#
#   sudo scripts/test-clean-bootstrap.sh            # the repository's HEAD, cloned
#   sudo SOURCE=worktree scripts/test-clean-bootstrap.sh   # the working tree as it is
#
# Steps: debootstrap bookworm into a fresh directory, bind-mount /proc, /sys and /dev
# (/dev/fuse among them), install make and git, put the repository at /src, then in the
# chroot: `make bootstrap`, `.venv/bin/delvefs --version` and the unit tests. Every mount
# made here is undone on exit; the root file system is removed unless KEEP=1.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SOURCE=${SOURCE:-head}
WORK=${WORK:-$(mktemp -d /var/tmp/delvefs-clean-bootstrap.XXXXXX)}
mkdir -p "$WORK"
target="$WORK/root"

log() { printf '[clean-bootstrap %s] %s\n' "$(date +%T)" "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "test-clean-bootstrap: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
started=$(date +%s)

cleanup() {
  for m in dev/pts dev sys proc; do
    mountpoint -q "$target/$m" 2>/dev/null && umount -l "$target/$m"
  done
  if [ "${KEEP:-0}" != 1 ]; then rm -rf --one-file-system "$WORK"; else log "kept $WORK"; fi
}
trap cleanup EXIT

command -v debootstrap >/dev/null || { log "installing debootstrap"; apt-get install -y -q debootstrap >/dev/null; }

log "debootstrap $SUITE into $target"
debootstrap --variant=minbase "$SUITE" "$target" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log"; exit 1; }
mount -t proc proc "$target/proc"
mount --rbind /sys "$target/sys"
mount --bind /dev "$target/dev"
mount --bind /dev/pts "$target/dev/pts"
cp /etc/resolv.conf "$target/etc/resolv.conf"
# a chroot has no init: packages must not try to start their services (as in a container)
printf '#!/bin/sh\nexit 101\n' > "$target/usr/sbin/policy-rc.d"; chmod +x "$target/usr/sbin/policy-rc.d"

# A site behind a TLS-inspecting proxy trusts its CA system-wide: the host's local CAs
# (/usr/local/share/ca-certificates) go into the root file system, and pip, which trusts
# only its own bundle, is pointed at the system's (as the host does). Nothing else of
# the host is used.
site_env=""
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$target/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$target/usr/local/share/ca-certificates/"
  site_env="PIP_CERT=/etc/ssl/certs/ca-certificates.crt"
fi

in_root() { chroot "$target" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 $site_env \
              PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "$1"; }

log "installing only make and git"
in_root "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends make git ca-certificates >/dev/null && update-ca-certificates >/dev/null"

if [ "$SOURCE" = worktree ]; then
  log "copying the working tree of $repo to /src"
  mkdir -p "$target/src"
  (cd "$repo" && git ls-files -z -co --exclude-standard \
     | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$target/src"
else
  log "cloning $repo (HEAD) to /src"
  git clone -q "$repo" "$target/src"
fi

log "make bootstrap"
b0=$(date +%s)
in_root "cd /src && make bootstrap"
b1=$(date +%s)
log "make bootstrap took $((b1 - b0)) s"

log "quick check: delvefs --version, the unit tests"
in_root "cd /src && .venv/bin/delvefs --version && .venv/bin/python -m pytest -p no:cacheprovider -q -x tests/unit"
log "passed in $(( $(date +%s) - started )) s (bootstrap $((b1 - b0)) s)"
