#!/usr/bin/env bash
# Builds pyfuse3 with fallocate and copy_file_range handlers, DelveFS's request path
# (custom I/O with the KILLPRIV flags, a leaner session loop) and FUSE passthrough
# (README.md beside this file)
# and installs it into the virtual environment of PYTHON:
#
#   contrib/pyfuse3/install.sh .venv/bin/python
#
# The pinned sdist comes from PyPI through pip and is checked against its sha256; pip
# builds it in an isolated environment with the Cython, setuptools and setuptools_scm its
# pyproject.toml asks for, Cython pinned by build-constraints.txt (needs a C compiler,
# Python's headers, libfuse3-dev >= 3.4 and pkg-config). Idempotent: the installed version
# carries the hash of the patches and the constraints as a local label
# (3.5.0+delvefs.<hash>): nothing is done when that version is installed; a changed patch,
# or a pip that replaced it with PyPI's build, is rebuilt.
set -euo pipefail

PYTHON=${1:?usage: install.sh PYTHON}
here=$(cd "$(dirname "$0")" && pwd)
PYFUSE3_VERSION=3.5.0
PYFUSE3_SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
# applied in this order
patches=("$here/fallocate-copy-file-range.patch" "$here/request-path.patch" "$here/passthrough.patch")

want="$PYFUSE3_VERSION+delvefs.$(cat "${patches[@]}" "$here/build-constraints.txt" | sha256sum | cut -c1-12)"
have=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("pyfuse3"))' 2>/dev/null || true)
[ "$have" = "$want" ] && exit 0

printf '[pyfuse3 %s] building pyfuse3 %s (about a minute, once)\n' "$(date +%T)" "$want"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q --no-binary :all: --no-deps -d "$work" "pyfuse3==$PYFUSE3_VERSION"
sdist="$work/pyfuse3-$PYFUSE3_VERSION.tar.gz"
echo "$PYFUSE3_SHA256  $sdist" | sha256sum -c --quiet -
tar xzf "$sdist" --no-same-owner -C "$work"
src="$work/pyfuse3-$PYFUSE3_VERSION"
for patch_file in "${patches[@]}"; do
  patch -d "$src" -p1 --batch --quiet < "$patch_file"
done
# the sdist ships the C file generated from the unpatched .pyx: removed, the build
# cannot compile it instead of the patched sources
rm -f "$src/src/pyfuse3/__init__.c"
# PIP_CONSTRAINT reaches the isolated build environment: the verified Cython
SETUPTOOLS_SCM_PRETEND_VERSION_FOR_PYFUSE3="$want" PIP_CONSTRAINT="$here/build-constraints.txt" \
  "$PYTHON" -m pip install -q --no-cache-dir --force-reinstall --no-deps "$src"
# its one dependency, in case pip has not installed it yet
"$PYTHON" -m pip install -q "trio>=0.15"
"$PYTHON" -c 'import pyfuse3; assert hasattr(pyfuse3.Operations, "copy_file_range") and hasattr(pyfuse3, "killpriv_flags") and hasattr(pyfuse3, "backing_open")'
