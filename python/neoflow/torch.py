"""neoflow.torch - a `.nf` def as a PyTorch operator (docs/python.md).

    import neoflow.torch
    lltm = neoflow.torch.op("examples/workloads.nf", "lltm_step")
    h, c = lltm(x, h, c, W, b)        # inside any nn.Module's forward

The callable's forward and backward run NeoFlow's kernels on CPU tensors
(the backward is the def's gradient from expression autodiff, reading the
values the forward kept, as autograd's saved tensors), through the
public C API's operators (nf_operator): each new combination of input
shapes is specialised once and kept, starts on fallback kernels, and is
compiled and tuned by the daemon like any session's, its kernels swapped
in as they arrive.  Tensors of a def declared in f32 may be float64: the
def then runs in f64 throughout (torch.autograd.gradcheck).  Integer
outputs are not differentiable; integer inputs get no gradient.
"""

import numpy as np
import torch

import neoflow

__all__ = ["op", "Op"]

# options of the operator, not integer parameters of the def
_OPTIONS = ("threads", "daemon", "spawn", "compile_only", "tune_trials", "tune_seconds",
            "trust", "daemon_key", "quiet", "log")


def _numpy(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError("input '%s' is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("input '%s' is on %s: NeoFlow operators take CPU tensors in this "
                         "version" % (name, t.device))
    return t.detach().contiguous().numpy()


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, *xs):
        arrs = [_numpy(x, n) for x, n in zip(xs, op.inputs)]
        specs = op.operator.output_specs(*arrs)
        outs = [torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dt)).dtype)
                for shape, dt in specs]
        op.operator.forward(*arrs, out=[o.numpy() for o in outs])
        ctx.op = op
        ctx.token = op.operator.saved  # (its values kept for the backward)
        ctx.save_for_backward(*xs)
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        op = ctx.op
        xs = ctx.saved_tensors
        want = [bool(ctx.needs_input_grad[i + 1]) for i in range(len(xs))]
        if not any(want):
            return (None,) + (None,) * len(xs)
        arrs = [_numpy(x, n) for x, n in zip(xs, op.inputs)]
        gouts = [None if g is None else _numpy(g, "grad_" + n) for g, n in zip(grads, op.outputs)]
        gins = op.operator.backward(arrs, gouts, want=want, saved=ctx.token)
        return (None,) + tuple(None if g is None else torch.from_numpy(g) for g in gins)


class Op:
    """A def of a `.nf` model as a PyTorch operator (see neoflow.torch.op).
    Calling it applies the def to tensors (its declared inputs, then its
    `param` declarations, in order) and returns its output, or a tuple
    of its outputs."""

    def __init__(self, model, def_name, **kw):
        if isinstance(model, str):
            model = neoflow.Model.load(model)
        opts = {k: kw.pop(k) for k in list(kw) if k in _OPTIONS}
        self.operator = neoflow.Operator(model, def_name, params=kw, **opts)
        self.def_name = def_name
        self.inputs = self.operator.inputs
        self.outputs = self.operator.outputs

    def __call__(self, *tensors):
        if len(tensors) != len(self.inputs):
            raise TypeError("%s takes %d tensors (%s), got %d"
                            % (self.def_name, len(self.inputs), ", ".join(self.inputs),
                               len(tensors)))
        outs = _Apply.apply(self, *tensors)
        return outs[0] if len(outs) == 1 else outs

    def stats(self):
        """The kernels' tiers and the runs (nf_operator_stats), as a dict."""
        return self.operator.stats()

    def wait_kernels(self, timeout_ms=0, tier=1):
        """Waits until every shape's kernels came from the daemon."""
        return self.operator.wait_kernels(timeout_ms, tier)

    def __repr__(self):
        return "neoflow.torch.op(%r: %s -> %s)" % (self.def_name, ", ".join(self.inputs),
                                                   ", ".join(self.outputs))


def op(model, def_name, **kw):
    """A callable running def `def_name` of model (a `.nf` path or a
    neoflow.Model) as a differentiable PyTorch operator.  Keywords: the
    def's integer parameters (e.g. stride=2), and the options threads,
    daemon ("none": fallback kernels only), spawn, compile_only,
    tune_trials, tune_seconds, trust, daemon_key, quiet, log (as
    neoflow.Session's)."""
    return Op(model, def_name, **kw)
