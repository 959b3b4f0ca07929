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

import torch

import neoflow

__all__ = ["op", "Op"]

# options of the operator, not integer parameters of the def
_OPTIONS = ("threads", "daemon", "spawn", "compile_only", "tune_trials", "tune_seconds",
            "trust", "daemon_key", "quiet", "log")


_ELEM = {torch.bool: 0, torch.int32: 1, torch.int64: 2, torch.float32: 5, torch.float64: 6}
_DTYPE = {v: k for k, v in _ELEM.items()}


def _buf(t, name):
    """(address, nf_elem, shape) of a CPU tensor, made contiguous (the
    tensor returned keeps the memory alive)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("input '%s' is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("input '%s' is on %s: NeoFlow operators take CPU tensors in this "
                         "version" % (name, t.device))
    e = _ELEM.get(t.dtype)
    if e is None:
        raise TypeError("input '%s' is %s: operators take bool, int32, int64, float32 and "
                        "float64" % (name, t.dtype))
    t = t.detach().contiguous()
    return t, (t.data_ptr() if t.numel() else None, e, tuple(t.shape))


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, *xs):
        o = op.operator
        held, bufs = zip(*[_buf(x, n) for x, n in zip(xs, op.inputs)]) if xs else ((), ())
        outs = [torch.empty(shape, dtype=_DTYPE[e]) for e, shape in o.specs(bufs)]
        ctx.token = o.run_forward(bufs, [(t.data_ptr() if t.numel() else None, _ELEM[t.dtype],
                                          tuple(t.shape)) for t in outs])
        ctx.op = op
        ctx.save_for_backward(*xs)
        ctx.mark_non_differentiable(*[t for t in outs if not t.is_floating_point()])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        op = ctx.op
        xs = ctx.saved_tensors
        want = [bool(ctx.needs_input_grad[i + 1]) and xs[i].is_floating_point()
                for i in range(len(xs))]
        if not any(want):
            return (None,) * (len(xs) + 1)
        held, bufs = zip(*[_buf(x, n) for x, n in zip(xs, op.inputs)])
        gheld, gouts = [], []
        for g, (e, shape), n in zip(grads, op.operator.specs(bufs), op.outputs):
            if g is None:
                gouts.append((None, e, shape))
                continue
            g, b = _buf(g.to(_DTYPE[e]), "grad_" + n)
            gheld.append(g)
            gouts.append(b)
        gins = [torch.empty_like(t) if w else None for t, w in zip(held, want)]
        op.operator.run_backward(ctx.token, bufs, gouts, [
            (g.data_ptr() if g is not None and g.numel() else None, e, shape)
            for g, (_, e, shape) in zip(gins, bufs)])
        return (None,) + tuple(gins)


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
