#!/usr/bin/env bash
# Idempotent set-up of everything DelveFS needs on a fresh Debian machine:
#   1. Debian packages (fuse3, RabbitMQ, LevelDB headers, the peers and tools the
#      benchmarks and demo use), installed only when missing;
#   2. a pinned MinIO server built with `go install` into $DELVEFS_BIN (outside the repo);
#   3. .venv/ with the project installed editable (C extension compiled) plus test extras,
#      re-installed only when pyproject.toml or native/ changed.
# Every step is skipped when already done, so `make test` stays cheap on a warm machine.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

MINIO_VERSION=${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
DELVEFS_BIN=${DELVEFS_BIN:-$HOME/.cache/delvefs/bin}
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config rabbitmq-server s3fs rclone bowtie2 samtools docker-compose)

log() { printf '[bootstrap %s] %s\n' "$(date +%T)" "$*"; }
started=$(date +%s)

# --- 1. Debian packages --------------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -q
  # policy-rc.d may refuse to start the system broker; we never use it (tests start their own).
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The packaged broker service is not ours: stop it if the package started it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet rabbitmq-server 2>/dev/null; then
  systemctl stop rabbitmq-server || true
fi

# --- 2. MinIO, pinned ------------------------------------------------------------------------
stamp="$DELVEFS_BIN/.minio-version"
if [ ! -x "$DELVEFS_BIN/minio" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$MINIO_VERSION" ]; then
  command -v go >/dev/null || { echo "bootstrap: Go is needed to build MinIO" >&2; exit 1; }
  log "building MinIO $MINIO_VERSION with go install (about 3 minutes, once)"
  mkdir -p "$DELVEFS_BIN"
  GOBIN="$DELVEFS_BIN" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION"
  echo "$MINIO_VERSION" > "$stamp"
fi

# --- 3. Python environment -------------------------------------------------------------------
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
want=$(cat pyproject.toml native/*.c native/*.h 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.delvefs-installed 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import rulesets._native" 2>/dev/null; then
  log "installing the project into .venv (editable, C extension, test extras)"
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e ".[test,bench]"
  echo "$want" > .venv/.delvefs-installed
fi

log "ready in $(( $(date +%s) - started )) s (minio: $DELVEFS_BIN/minio)"
