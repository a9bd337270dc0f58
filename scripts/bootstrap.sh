#!/usr/bin/env bash
# Idempotent set-up of everything DelveFS needs on a fresh Debian 12 or Ubuntu 24.04 that
# has only `make` and `git` (README, "The two commands"):
#   1. Debian packages: a C compiler and Python's headers and venv module (the C extension,
#      .venv), fuse3, RabbitMQ, Debian's Go (only where no Go is on PATH), the peers and
#      tools the benchmarks, tests and demo use; installed only when missing;
#   2. a Go new enough for the pinned MinIO: a Go on PATH that is new enough is used as it
#      is; otherwise Go's own toolchain module (golang.org/toolchain, through the Go module
#      proxy, checksum-verified by the installed go) into $GO_DIR;
#   3. a pinned MinIO server built with `go install` into $DELVEFS_BIN (outside the repo),
#      and a pinned toxiproxy server (the benchmarks' distance to S3: delvefs/devtools/distance.py)
#      the same way, as $DELVEFS_BIN/toxiproxy-server;
#   4. .venv/ with pyfuse3 built from its pinned sdist with contrib/pyfuse3's patches
#      (fallocate and copy_file_range; KILLPRIV and the session loop; FUSE passthrough: INIT
#      flag, backing ids, FOPEN_PASSTHROUGH; rebuilt when a patch
#      changes) first, so that the project's
#      `pyfuse3>=3.3` finds it installed; then the project installed editable (C extension
#      compiled) plus test extras, re-installed only when pyproject.toml or native/ changed
#      (plyvel's wheel carries LevelDB: no LevelDB headers are needed);
#   5. as root: the fstab helper /sbin/mount.fuse.delvefs (docs/CONFIGURATION.md).
# Every step is skipped when already done, so `make test` stays cheap on a warm machine.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

MINIO_VERSION=${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
# the toolchain line of that MinIO's go.mod; its go line (1.24.0) is the minimum
GO_TOOLCHAIN=${GO_TOOLCHAIN:-go1.24.8}
TOXIPROXY_VERSION=${TOXIPROXY_VERSION:-v2.5.0}
GO_MINIMUM=1.24
DELVEFS_BIN=${DELVEFS_BIN:-$HOME/.cache/delvefs/bin}
GO_DIR="$(dirname "$DELVEFS_BIN")/$GO_TOOLCHAIN"  # where a fetched toolchain goes
APT_PACKAGES=(build-essential python3-dev python3-venv ca-certificates
              fuse3 libfuse3-dev pkg-config rabbitmq-server s3fs rclone bowtie2 samtools docker-compose dbench fio)

log() { printf '[bootstrap %s] %s\n' "$(date +%T)" "$*"; }
started=$(date +%s)
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"

# --- 1. Debian packages --------------------------------------------------------------------
command -v go >/dev/null 2>&1 || [ -x "$GO_DIR/bin/go" ] || APT_PACKAGES+=(golang-go)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -q
  # policy-rc.d may refuse to start the system broker; we never use it (tests start their own).
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The packaged broker service is not ours: stop it if the package started it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet rabbitmq-server 2>/dev/null; then
  $sudo systemctl stop rabbitmq-server || true
fi

# --- 2. a Go for MinIO -----------------------------------------------------------------------
go_new_enough() {  # $1: a go binary; true when its version is at least $GO_MINIMUM
  local v; v=$("$1" env GOVERSION 2>/dev/null || "$1" version | awk '{print $3}')
  v=${v#go}
  [ "$(printf '%s\n%s\n' "$GO_MINIMUM" "$v" | sort -V | head -1)" = "$GO_MINIMUM" ]
}

pick_go() {
  local own="$GO_DIR/bin/go"
  if command -v go >/dev/null 2>&1 && go_new_enough "$(command -v go)"; then
    GO=$(command -v go); return
  fi
  if [ -x "$own" ]; then GO=$own; return; fi
  # Too old (Debian 12's is 1.19, before toolchain switching): fetch Go's own toolchain,
  # a module of the Go module proxy, with the old go (which checks it against sum.golang.org)
  local arch; arch=$(go env GOARCH)
  local module="golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch"
  log "fetching $GO_TOOLCHAIN ($module) with $(go version | awk '{print $3}')"
  local json dir
  json=$(cd / && GOFLAGS=-mod=mod go mod download -json "$module") \
    || { echo "bootstrap: could not fetch $module: $json" >&2; exit 1; }
  dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { echo "bootstrap: could not fetch $module: $json" >&2; exit 1; }
  local dest="$GO_DIR"
  rm -rf "$dest.partial"; mkdir -p "$(dirname "$dest")"
  cp -r "$dir" "$dest.partial"
  chmod -R u+w "$dest.partial"
  # module zips carry no file modes: the toolchain's programs must be executable again
  chmod +x "$dest.partial"/bin/* "$dest.partial"/pkg/tool/*/*
  mv "$dest.partial" "$dest"
  GO=$own
}

# --- 3. MinIO and toxiproxy, pinned ----------------------------------------------------------
stamp="$DELVEFS_BIN/.minio-version"
if [ ! -x "$DELVEFS_BIN/minio" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$MINIO_VERSION" ]; then
  pick_go
  log "building MinIO $MINIO_VERSION with $("$GO" version | awk '{print $3}') (about 3 minutes, once)"
  mkdir -p "$DELVEFS_BIN"
  # GOTOOLCHAIN=local: the Go picked above builds it, no second switch
  GOTOOLCHAIN=local GOBIN="$DELVEFS_BIN" GOFLAGS=-mod=mod "$GO" install "github.com/minio/minio@$MINIO_VERSION"
  echo "$MINIO_VERSION" > "$stamp"
fi

# toxiproxy, pinned: `go install` names its binary after the package (`server`); built into a
# directory of its own, then moved to $DELVEFS_BIN/toxiproxy-server
stamp="$DELVEFS_BIN/.toxiproxy-version"
if [ ! -x "$DELVEFS_BIN/toxiproxy-server" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$TOXIPROXY_VERSION" ]; then
  pick_go
  log "building toxiproxy $TOXIPROXY_VERSION with $("$GO" version | awk '{print $3}') (about 30 s, once)"
  build="$DELVEFS_BIN/.toxiproxy-build"
  rm -rf "$build"; mkdir -p "$build"
  GOTOOLCHAIN=local GOBIN="$build" GOFLAGS=-mod=mod "$GO" install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
  mv "$build/server" "$DELVEFS_BIN/toxiproxy-server"
  rm -rf "$build"
  echo "$TOXIPROXY_VERSION" > "$stamp"
fi

# --- 4. Python environment -------------------------------------------------------------------
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
contrib/pyfuse3/install.sh .venv/bin/python  # does nothing when this build is installed
want=$(cat pyproject.toml native/*.c native/*.h 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.delvefs-installed 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import rulesets._native" 2>/dev/null; then
  log "installing the project into .venv (editable, C extension, test extras)"
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e ".[test,bench]"
  echo "$want" > .venv/.delvefs-installed
fi

# --- 5. the fstab helper ---------------------------------------------------------------------
# mount(8) runs /sbin/mount.fuse.delvefs for a `fuse.delvefs` line of /etc/fstab; only root
# may put it there. Elsewhere (no root) fstab mounts are simply not set up.
helper="$root/.venv/bin/mount.fuse.delvefs"
if [ "$(id -u)" -eq 0 ] && [ -x "$helper" ] && [ "$(readlink /sbin/mount.fuse.delvefs 2>/dev/null)" != "$helper" ]; then
  log "linking /sbin/mount.fuse.delvefs -> $helper"
  ln -sfn "$helper" /sbin/mount.fuse.delvefs
fi

log "ready in $(( $(date +%s) - started )) s (minio: $DELVEFS_BIN/minio, toxiproxy: $DELVEFS_BIN/toxiproxy-server)"
