#!/usr/bin/env bash
# deploy/gpu-pack.sh - packs this machine's build for a GPU machine that
# cannot build it (one with no package registry, like the development
# device tool's): the programs the GPU checks run and the shared
# libraries they need beyond the C and C++ runtimes and the CUDA toolkit
# (NVRTC, the driver), in .gpu/pack.tar.xz (git ignores .gpu; carry it).
# There, `NF_GPU_PACKED=1 deploy/gpu-check.sh` unpacks it and runs the
# checks without setup or build.  Needs a build (ninja -C build) here.
set -euo pipefail
cd "$(dirname "$0")/.."
ninja -C build >/dev/null
stage=.gpu/stage
rm -rf "$stage"
mkdir -p "$stage/.gpu/lib"
bins=(build/client/neoflow build/daemon/neoflowd build/daemon/search/neoflow-worker
      build/tests/test_cuda build/tests/test_session build/tests/test_gemm build/bench/nf_bench)
for b in "${bins[@]}"; do
  mkdir -p "$stage/$(dirname "$b")"
  cp "$b" "$stage/$b"
done
# the libraries, without the C/C++ runtimes and CUDA's own (the GPU
# machine has newer ones of those)
skip='/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libgcc_s|libstdc\+\+|libnvrtc[^/]*|libcuda)\.so'
for b in "${bins[@]}"; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev "$skip" | while read -r lib; do cp -L "$lib" "$stage/.gpu/lib/"; done
tar -C "$stage" -cJf .gpu/pack.tar.xz .
rm -rf "$stage"
echo "gpu-pack: .gpu/pack.tar.xz, $(du -h .gpu/pack.tar.xz | cut -f1) (carry .gpu; at most 64 MiB travel)"
