#!/usr/bin/env bash
# bench/setup-peers.sh [--upgrade] - makes the virtual environment of the
# peer benchmark's current PyTorch (bench/run's peers eager and compile;
# bench/README.md): Debian's /usr/bin/python3, a current torch and NumPy
# from PyPI (the wheel brings its own MKL, oneDNN and OpenMP), checked by
# importing torch and running torch.compile (Inductor, C++ on the CPU) on a
# small training step.  Idempotent: when the environment is there and its
# check has passed, it says so and stops (quick); --upgrade asks pip for
# the newest torch again.  Never used by the tests.
#
#   PEERS_VENV   where (default: bench-out/peers-venv of the tree, as
#                bench/run --venv expects)
#   TORCH_SPEC   the requirement given to pip (default: torch, the newest;
#                e.g. TORCH_SPEC='torch==2.15.0')
#
# The Linux torch wheel on PyPI links CUDA's libraries (cuBLAS, cuDNN,
# NCCL, ...) when it loads, even on a machine without a GPU, so pip
# installs them too (about 5 GB in the environment): `pip install
# --no-deps torch` with only its pure-Python requirements fails at `import
# torch` (libcufile.so.0 not found).  Where PyTorch's CPU-only index is
# reachable, PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# gets the much smaller CPU wheel instead (pip honours it here too).
set -euo pipefail
cd "$(dirname "$0")/.."

upgrade=0
case "${1:-}" in
  --upgrade) upgrade=1 ;;
  "") ;;
  *) echo "usage: bench/setup-peers.sh [--upgrade]" >&2; exit 2 ;;
esac

VENV=${PEERS_VENV:-bench-out/peers-venv}
SPEC=${TORCH_SPEC:-torch}
PY=/usr/bin/python3
STAMP=$VENV/.neoflow-peers-ok

# Debian's: the venv module, and for Inductor a C++ compiler and Python's
# headers (its kernels are C++ built and loaded at run time)
PKGS=(python3 python3-venv python3-dev g++)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-peers: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$upgrade" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC" ] \
   && v=$("$VENV/bin/python" -c "import torch, numpy; print(torch.__version__)" 2>/dev/null); then
  echo "setup-peers: $VENV is ready: PyTorch $v (nothing to do; --upgrade for the newest)"
  exit 0
fi

rm -f "$STAMP"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-peers: making $VENV ($PY -m venv)"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
fi
echo "setup-peers: pip install $SPEC numpy (PyPI; several GB the first time)"
pip_up=()
if [ "$upgrade" = 1 ]; then pip_up=(--upgrade); fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${pip_up[@]}" "$SPEC" numpy

# the check: the venv's torch (not Debian's 1.13), 2.x, and torch.compile
# of a forward, loss and backward on the CPU with Inductor
echo "setup-peers: checking import torch and torch.compile on the CPU ..."
"$VENV/bin/python" - <<'PY'
import os
import sys
import time
import torch
v = torch.__version__
if not torch.__file__.startswith(sys.prefix):
    sys.exit("setup-peers: torch comes from %s, not the environment" % torch.__file__)
if int(v.split(".")[0]) < 2:
    sys.exit("setup-peers: PyTorch %s is not 2.x" % v)
torch.set_num_threads(1)
w = torch.randn(16, 8, requires_grad=True)
x = torch.randn(4, 8)


def f(w, x):
    return torch.tanh(x @ w.t()).square().mean()


t = time.time()
loss = torch.compile(f)(w, x)
loss.backward()
want = w.grad.clone()
w.grad = None
f(w, x).backward()
if not torch.allclose(want, w.grad, rtol=1e-5, atol=1e-6):
    sys.exit("setup-peers: torch.compile's gradient differs from eager's")
print("setup-peers: PyTorch %s (%s), MKL %s, oneDNN %s; torch.compile works (%.1f s)"
      % (v, os.path.dirname(torch.__file__), torch.backends.mkl.is_available(),
         torch.backends.mkldnn.is_available(), time.time() - t))
PY
echo "$SPEC" > "$STAMP"
echo "setup-peers: $VENV is ready (bench/run finds it: peers eager and compile)"
