#!/usr/bin/env bash
# bench/grad_flops.sh - the gradient cost table (issue 3, deliverable 6):
# for each public workload at its benchmark shapes and each library op at
# odd shapes, the largest ratio of a gradient statement's FLOPs to those of
# the forward statement it differentiates (nf_stmt_flops: executed
# operations, weighted; see common/flops.c), and every statement
# above 2x.  Run by hand: ./bench/grad_flops.sh [path/to/neoflow]
set -euo pipefail
cd "$(dirname "$0")/.."
NF=${1:-build/client/neoflow}
export NEOFLOW_LIB="$PWD/lib"

row() { # name file def wrt args...
  local name=$1 file=$2 def=$3 wrt=$4
  shift 4
  { "$NF" grad "$file" "$def" --wrt "$wrt" "$@" || echo "# failed"; } | awk -v name="$name" '
    /^#   [0-9]/ && $5 != "-" { n++; r = $6 + 0; if (r > max) max = r;
                                if ($7 == "scatter") sc++;
                                if (r > 2 && $7 != "scatter") over = over " " $3 "(" $6 ")" }
    /^# total/ { fwd = $4; grad = $8 }
    END { printf "%-26s %6d %8.2f %7d %14s %14s %s\n", name, n, max, sc, fwd, grad,
                 (over == "" ? "" : "over 2x:" over) }'
}

printf "%-26s %6s %8s %7s %14s %14s\n" "workload / op" "stmts" "max" "scatter" "forward" "gradient"
W=examples/workloads.nf
row matmul $W matmul_loss A,B --shape A=1024,1024 --shape B=1024,1024 --shape G=1024,1024
row conv2d $W conv2d_relu_loss Wt --shape I=8,64,56,56 --shape Wt=64,64,3,3
row lltm $W lltm_loss W,b --shape X=8,64,256 --shape H0=64,512 --shape C0=64,512 \
    --shape W=1536,768 --shape b=1536
row milstm $W milstm_loss W,U,alpha,beta1,beta2,b --shape X=8,64,512 --shape H0=64,512 \
    --shape C0=64,512 --shape W=2048,512 --shape U=2048,512 --shape alpha=2048 \
    --shape beta1=2048 --shape beta2=2048 --shape b=2048
row capsnet $W capsnet_loss W --shape u=32,1152,8 --shape W=1152,10,16,8 --shape targets=32,10
row mobilenet_dws $W mobilenet_dws_loss Wdw,Wpw --shape X=16,128,28,28 --shape Wdw=128,1,3,3 \
    --shape Wpw=128,128,1,1
L=lib/nn.nf
row "nn matmul" $L matmul A,B --shape A=7,13 --shape B=13,5
row "nn conv2d s2 d2 g3 p2" $L conv2d I,W --shape I=2,6,11,11 --shape W=6,2,3,3 \
    --param stride=2 --param dilation=2 --param groups=3 --param pad=2
row "nn max_pool2d k3 s2 p1" $L max_pool2d X --shape X=2,3,9,9 --param kernel=3 --param stride=2 --param pad=1
row "nn avg_pool2d k3 s2 p1" $L avg_pool2d X --shape X=2,3,9,9 --param kernel=3 --param stride=2 --param pad=1
for op in relu relu6 elu gelu sigmoid tanh softplus; do row "nn $op" $L $op X --shape X=5,7; done
row "nn softmax" $L softmax X --shape X=5,7
row "nn log_softmax" $L log_softmax X --shape X=5,7
row "nn cross_entropy" $L cross_entropy logits --shape logits=5,7 --shape labels=5
row "nn layer_norm" $L layer_norm X,gamma,beta --shape X=5,7 --shape gamma=7 --shape beta=7
row "nn batch_norm" $L batch_norm X,gamma,beta --shape X=2,3,5,7 --shape gamma=3 --shape beta=3
row "nn squash" $L squash S --shape S=5,7
row "nn margin_loss" $L margin_loss lengths --shape lengths=5,7 --shape targets=5,7
row "nn mse" $L mse X,Y --shape X=5,7 --shape Y=5,7
row "nn linear" $L linear X,W,b --shape X=5,7 --shape W=3,7 --shape b=3
row "nn batch_matmul" $L batch_matmul A,B --shape A=2,5,7 --shape B=2,7,3
row "nn embedding" $L embedding table --shape table=9,4 --shape idx=3,5
row "nn permute" $L permute X --shape X=2,3,4,5 --param p0=2 --param p1=0 --param p2=3 --param p3=1
row "nn channel_shuffle" $L channel_shuffle X --shape X=2,6,3,3 --param groups=3
row "nn concat" $L concat A,C --shape A=3,4 --shape C=3,5
row "nn split" $L split X --shape X=3,7 --param at=3
row "nn reshape" $L reshape X --shape X=4,6 --param r0=3 --param r1=8
row "nn flatten" $L flatten X --shape X=2,3,4,5
row "nn transpose" $L transpose X --shape X=2,3,4
row "nn badd" $L badd X,Y --shape X=2,3,4 --shape Y=3,4
row "nn bdiv" $L bdiv X,Y --shape X=2,3,4 --shape Y=3,4
row "nn div" $L div X,Y --shape X=3,4 --shape Y=3,4
