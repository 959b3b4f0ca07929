# Reproduction (found by the extended suite's `mha`, bench/extended.nf):
# the gradient of attention scores read straight from a packed projection
# (queries in columns 0:D, keys in D:2D, head h at h*E) does not compile,
# so a training session runs those gradient subgraphs on the interpreter
# for good (mha at its benchmark shapes: 3.2 s per step instead of tens
# of ms; the daemon logs "gave up on subgraph ...: compile: access of
# A.QKV: index 2 may be out of bounds ([256, 1023], size 768) (the
# schedule's index bounds cannot be proven)").
#
#   neoflow tune bench/repro/grad_packed_heads.nf scores --wrt A \
#       --shape A=5,8 --trials 2
#     -> no candidate ran correctly: "does not lower: access of A: index 1
#        may be out of bounds ([4, 11], size 8) (the schedule's index
#        bounds cannot be proven)"
#
# The forward def compiles (`neoflow compile ... scores --shape A=5,8`) and
# the interpreter evaluates the gradient (`neoflow grad ... --out DIR`).
# Autodiff inverts `h * E + e` into `y // E` and writes the read of the
# other operand as `y // E * E + (y - y // E * E) + D` under the guard
# `y // E <= heads - 1`: that index is y + D, in bounds under the guard,
# but neither the code generator's bounds proof nor the language's checker
# (`neoflow grad ... > g.nf; neoflow check g.nf scores_grad`: "dS(y1 // 2,
# y0, j) may be out of bounds") can show it, since the guard is not an
# affine expression of y.  Splitting the heads into their own tensor first
# (Q(h, i, e) = A(i, h * E + e), as bench/extended.nf's causal_mha does)
# avoids it.

# Scores of `heads` heads read from one packed [N, 2D] tensor.
def scores<heads = 2>(A: f32[N, G]) -> (S: f32[heads, N, N])
    where D = G // 2, E = D // heads
    require G % 2 == 0, D % heads == 0
{
  S(h, i, j) +=! A(i, h * E + e) * A(j, D + h * E + e) where e in 0:E
}
