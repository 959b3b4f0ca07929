#!/usr/bin/env bash
# deploy/setup.sh [EXTRA-PACKAGE...] - installs what NeoFlow needs on
# Debian 12 (idempotent: quick when everything is there), plus any extra
# packages named, then configures the build directory.
#
#   BUILD_DIR   build directory (default: build)
#   NF_WERROR   1 (default in CI) to configure with -Dwerror=true
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(meson ninja-build pkg-config gcc g++ check libsubunit-dev libsodium-dev
      python3 python3-numpy llvm-14-dev binutils libxgboost-dev
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsqlite3-dev sqlite3 libinih-dev
      libopenblas-dev zlib1g-dev dataset-fashion-mnist libopenmpi-dev openmpi-bin "$@")

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
werror=false
if [ "${NF_WERROR:-0}" = 1 ]; then werror=true; fi
if [ -f "$BUILD_DIR/build.ninja" ]; then
  meson configure "$BUILD_DIR" -Dwerror=$werror >/dev/null
else
  meson setup "$BUILD_DIR" -Dwerror=$werror
fi
