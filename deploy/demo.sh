#!/usr/bin/env bash
# deploy/demo.sh - the README's main job: set up (Debian packages, the
# Fashion-MNIST dataset included), build, and train a convolutional network
# written wholly in .nf (examples/fashion_cnn.nf) on Fashion-MNIST.  The
# training starts at once on fallback kernels; a per-user neoflowd is
# started in the background, compiles and tunes the training step's
# subgraphs, and its kernels are verified and swapped in as they arrive.
# It ends with the test accuracy and ms/step by kernel tier, then opens a
# second session to show that a model tuned once starts fast from the
# daemon's cache.
#
#   EPOCHS        training epochs (default 4)
#   TUNE_TRIALS   the daemon's tuning budget per subgraph (default 8 trials,
#   TUNE_SECONDS  10 s), small so that the demo stays short on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
ninja -C build >/dev/null
NF=build/client/neoflow
export NEOFLOW_LIB="$PWD/lib"
EPOCHS=${EPOCHS:-4}
TUNE_TRIALS=${TUNE_TRIALS:-8}
TUNE_SECONDS=${TUNE_SECONDS:-10}
t0=$(date +%s)

echo "== the model: examples/fashion_cnn.nf"
$NF check examples/fashion_cnn.nf
echo
echo "== its training step: the loss, its gradient (derived from the expressions) and"
echo "   the Adam update, cut into the subgraphs that are compiled as kernels"
$NF partition examples/fashion_cnn.nf cnn | head -n 1
echo
echo "== training on Fashion-MNIST ($EPOCHS epochs of 60000 images, test split 10000)"
echo "   neoflow train examples/fashion_cnn.nf cnn --data fashion-mnist --epochs $EPOCHS"
echo "   (tier 0: fallback kernels; tier 1: the daemon's default kernels; tier 2: tuned ones)"
$NF train examples/fashion_cnn.nf cnn --data fashion-mnist --epochs "$EPOCHS" \
    --log-every 100 --tune-trials "$TUNE_TRIALS" --tune-seconds "$TUNE_SECONDS" | tee /tmp/neoflow-demo.$$
acc=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' /tmp/neoflow-demo.$$ | tail -n 1)
rm -f /tmp/neoflow-demo.$$
echo
echo "== a second session on the same model: its kernels come from neoflowd's cache and"
echo "   were verified on this machine before, so it runs compiled kernels from step 1"
$NF train examples/fashion_cnn.nf cnn --data fashion-mnist --steps 60 --log-every 20 \
    --tune-trials "$TUNE_TRIALS" --tune-seconds "$TUNE_SECONDS" --seed 2
echo
$NF status | head -n 12 || true
echo "(neoflowd keeps running for the next sessions of this user; it is a per-user"
echo " service: see docs/daemon.md to stop it or to run it under systemd)"
echo
echo "demo: test accuracy ${acc:-?}% after $EPOCHS epochs; $(( $(date +%s) - t0 )) s after the build"
