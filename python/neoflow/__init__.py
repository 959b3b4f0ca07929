"""neoflow - NeoFlow from Python (docs/python.md).

A thin layer over the public C API of libneoflow-client (ctypes, no second
implementation of anything): load `.nf` models, open training sessions on
their defs, feed NumPy arrays (without a copy where they are already
C-contiguous and of the input's type), step, evaluate, read tensors, save
and load parameters, and watch the kernels arrive.  Errors raise
neoflow.Error with the library's message.

    import neoflow, numpy as np
    m = neoflow.Model.load("examples/mlp.nf")
    with neoflow.Session(m, "mlp", optimizer="sgd", lr=0.01, params={"batch": 32},
                         daemon="none") as s:
        s.feed(X=x, labels=y)
        loss = s.step()

`neoflow.library` is the path of the libneoflow-client that was loaded.
"""

import ctypes
import sys

import numpy as np

from . import _lib

__all__ = ["Error", "Model", "Net", "Operator", "Session", "TensorInfo", "load_mnist", "library", "version"]

_c, library, _tried = _lib.load()
_lib.declare(_c)
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None

version = "0.10.0"

OK = 0
ERANGE = -10

_DTYPES = {0: np.dtype(np.bool_), 1: np.dtype(np.int32), 2: np.dtype(np.int64),
           3: np.dtype(np.float16), 4: np.dtype(np.uint16),  # bf16: its bits
           5: np.dtype(np.float32), 6: np.dtype(np.float64)}
_OPTIMIZERS = {"sgd": 0, "adam": 1, "adamw": 2}


class Error(Exception):
    """A NeoFlow error: .status is the library's NEOFLOW_E* code (negative),
    the message its text (file:line:col: error: ... for a model)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _check(rc, what):
    if rc != OK:
        raise Error(rc, "%s: %s" % (what, _c.nf_strerror(rc).decode()))


def _take_err(p):
    """The library's malloc'd message *p (freed), or ''."""
    if not p.value:
        return ""
    msg = ctypes.string_at(p.value).decode(errors="replace").rstrip("\n")
    _libc.free(p.value)
    return msg


class Model:
    """A loaded `.nf` file with its imports (`import nn` finds the standard
    library through $NEOFLOW_LIB or the installed data directory)."""

    def __init__(self, handle, name):
        self._h = handle
        self.name = name

    @classmethod
    def load(cls, path):
        err = ctypes.c_void_p()
        h = _c.nf_model_load(str(path).encode(), ctypes.byref(err))
        if not h:
            raise Error(-3, _take_err(err) or "cannot load %s" % path)
        return cls(h, str(path))

    @classmethod
    def from_source(cls, text, name="<string>.nf"):
        err = ctypes.c_void_p()
        h = _c.nf_model_load_source(name.encode(), text.encode(), ctypes.byref(err))
        if not h:
            raise Error(-3, _take_err(err) or "cannot load %s" % name)
        return cls(h, name)

    def close(self):
        if self._h:
            _c.nf_model_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


_INITS = {"zeros": 0, "ones": 1, "constant": 2, "uniform": 3, "normal": 4, "xavier_uniform": 5,
          "xavier_normal": 6, "kaiming_uniform": 7, "kaiming_normal": 8}
_ELEMS = {np.dtype(np.bool_): 0, np.dtype(np.int32): 1, np.dtype(np.int64): 2,
          np.dtype(np.float16): 3, np.dtype(np.float32): 5, np.dtype(np.float64): 6}


class Net:
    """A def written from Python (nf_net_*): inputs, parameters and the
    results of applying the model's defs to them; tensors are integer
    handles.  Train it with Session(net, ...).

        net = neoflow.Net(model)
        X = net.input("X", (32, 784)); y = net.input("labels", (32,), np.int64)
        W = net.param("W", (10, 784), "kaiming_uniform")
        b = net.param("b", (10,), "zeros")
        logits = net.apply("linear", X, W, b)
        net.loss(net.apply("cross_entropy", logits, y))
    """

    def __init__(self, model):
        self.model = model
        self._h = _c.nf_net_new(model._h)
        if not self._h:
            raise Error(-1, "out of memory")

    def _ok(self, rc, what):
        if rc < 0:
            msg = (_c.nf_net_error(self._h) or b"").decode(errors="replace")
            raise Error(rc, "%s: %s" % (what, msg or _c.nf_strerror(rc).decode()))
        return rc

    @staticmethod
    def _dims(shape):
        shape = tuple(int(d) for d in shape)
        return len(shape), (ctypes.c_int64 * max(len(shape), 1))(*shape)

    def input(self, name, shape, dtype=np.float32):
        rank, dims = self._dims(shape)
        return self._ok(_c.nf_net_input(self._h, name.encode(), _ELEMS[np.dtype(dtype)], rank,
                                        dims), "input '%s'" % name)

    def param(self, name, shape, init="kaiming_uniform", a=0.0, b=0.0, dtype=np.float32):
        """A trainable parameter; init is an initializer of docs/language.md
        (a, b its arguments) or an array of its initial values."""
        rank, dims = self._dims(shape)
        ini = _lib.nf_init()
        keep = None
        if isinstance(init, str):
            if init not in _INITS:
                raise ValueError("unknown initializer %r (%s)" % (init, ", ".join(_INITS)))
            ini.fn, ini.a, ini.b = _INITS[init], a, b
        else:
            keep = np.ascontiguousarray(init, dtype=np.float32).reshape(-1)
            ini.fn = 9  # NF_INIT_FN_BUFFER
            ini.data = keep.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        return self._ok(_c.nf_net_param(self._h, name.encode(), _ELEMS[np.dtype(dtype)], rank,
                                        dims, ini), "param '%s'" % name)

    def apply(self, def_name, *tensors, n_out=1, **params):
        """def applied to tensors (integer parameters as keywords): its
        result, or a tuple of n_out results."""
        names = (ctypes.c_char_p * max(len(params), 1))(*[k.encode() for k in params])
        vals = (ctypes.c_int64 * max(len(params), 1))(*[int(v) for v in params.values()])
        ins = (ctypes.c_int * max(len(tensors), 1))(*tensors)
        outs = (ctypes.c_int * n_out)()
        self._ok(_c.nf_net_apply(self._h, def_name.encode(), len(params),
                                 ctypes.cast(names, ctypes.POINTER(ctypes.c_char_p)), vals,
                                 len(tensors), ins, n_out, outs), "applying %s" % def_name)
        return outs[0] if n_out == 1 else tuple(outs)

    def loss(self, tensor):
        self._ok(_c.nf_net_loss(self._h, tensor), "loss")

    def output(self, name, tensor):
        self._ok(_c.nf_net_output(self._h, name.encode(), tensor), "output '%s'" % name)

    def grad(self, tensor):
        self._ok(_c.nf_grad(self._h, tensor), "grad")

    @property
    def source(self):
        """The .nf text the net stands for."""
        return (_c.nf_net_source(self._h) or b"").decode()

    def close(self):
        if getattr(self, "_h", None):
            _c.nf_net_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


def load_mnist(directory=None, split="train"):
    """An MNIST-style split (Fashion-MNIST from Debian's
    dataset-fashion-mnist by default): (images float32 [n, rows, cols],
    normalised with Fashion-MNIST's training statistics; labels int64 [n])."""
    ds = _lib.nf_dataset()
    err = ctypes.c_void_p()
    rc = _c.nf_dataset_mnist_load(directory.encode() if directory else None, split.encode(),
                                  ctypes.byref(ds), ctypes.byref(err))
    if rc != OK:
        raise Error(rc, _take_err(err) or "loading the %s split" % split)
    try:
        n, r, c = ds.n, ds.rows, ds.cols
        images = np.ctypeslib.as_array(ds.images, shape=(n * r * c,)).reshape(n, r, c).copy()
        labels = np.ctypeslib.as_array(ds.labels, shape=(n,)).copy()
    finally:
        _c.nf_dataset_free(ctypes.byref(ds))
    return images, labels


class TensorInfo:
    """An input, parameter or output of a session: its name, NumPy dtype
    and shape."""

    def __init__(self, name, dtype, shape):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)

    def __repr__(self):
        return "TensorInfo(%r, %s, %s)" % (self.name, self.dtype, list(self.shape))


def _log_to_stderr(user, level, message):
    sys.stderr.write("neoflow: %s%s\n" % ("warning: " if level == 1 else "",
                                            message.decode(errors="replace")))


def _options(params=None, shapes=None, trainable=(), threads=0, seed=1, daemon=None,
             spawn=True, compile_only=False, tune_trials=0, tune_seconds=0, device=None,
             trust=(), daemon_key=None, quiet=False, log=None):
    """An nf_session_opts for the keywords Session and Operator share:
    (the structure, what it points to (keep it alive while the library
    reads it), the log callback (keep it alive as long as the object))."""
    o = _lib.nf_session_opts()
    o.threads, o.seed = threads, seed
    o.no_spawn, o.compile_only = int(not spawn), int(compile_only)
    o.tune_trials, o.tune_seconds, o.quiet = tune_trials, tune_seconds, int(quiet)
    keep = []

    def cstr(s):
        if s is None:
            return None
        b = s.encode()
        keep.append(b)
        return b

    def cstrs(items):
        arr = (ctypes.c_char_p * max(len(items), 1))(*[cstr(x) for x in items])
        keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))

    o.daemon, o.device, o.daemon_key = cstr(daemon), cstr(device), cstr(daemon_key)
    params = dict(params or {})
    o.n_iparams = len(params)
    o.inames = cstrs(list(params))
    iv = (ctypes.c_int64 * max(len(params), 1))(*[int(v) for v in params.values()])
    keep.append(iv)
    o.ivalues = iv
    shapes = dict(shapes or {})
    o.n_shapes = len(shapes)
    o.shape_names = cstrs(list(shapes))
    ranks = (ctypes.c_int * max(len(shapes), 1))(*[len(v) for v in shapes.values()])
    dims = (ctypes.POINTER(ctypes.c_int64) * max(len(shapes), 1))()
    for k, v in enumerate(shapes.values()):
        d = (ctypes.c_int64 * max(len(v), 1))(*[int(x) for x in v])
        keep.append(d)
        dims[k] = d
    keep += [ranks, dims]
    o.shape_ranks, o.shape_dims = ranks, dims
    o.n_trainable = len(trainable)
    o.trainable = cstrs(list(trainable))
    o.n_trust = len(trust)
    o.trust = cstrs(list(trust))
    if log is None:
        logfn = _lib.LOG_FN(_log_to_stderr)
    else:
        logfn = _lib.LOG_FN(lambda user, level, msg: log(level, msg.decode(errors="replace")))
    o.log = logfn
    return o, keep, logfn


class _Handle:
    """What a session and an operator share: a library handle (_h) freed
    by _free, the kernels waited for with _wait, a context manager."""

    def wait_kernels(self, timeout_ms=0, tier=1):
        """Waits until every kernel has a daemon kernel (tier 1) or its
        final one (tier 2); False on timeout."""
        rc = type(self)._wait(self._h, int(timeout_ms), int(tier))
        if rc == ERANGE:
            return False
        if rc != OK:
            self._fail(rc, "wait_kernels")
        return True

    def close(self):
        if getattr(self, "_h", None):
            type(self)._free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Session(_Handle):
    """Training of def `def_name` of model (its first output the scalar
    loss, its `param` declarations the parameters), as nf_session_new_def,
    or of a Net (Session(net, ...), nf_session_new_net):

    optimizer  "sgd", "adam" (default) or "adamw"; lr, momentum, betas,
               eps, weight_decay as PyTorch's (0: PyTorch's defaults)
    params     integer parameters of the def ({"batch": 32})
    shapes     shapes of inputs with symbolic sizes ({"X": (32, 784)})
    trainable  inputs trained as parameters besides the `param`s
    threads, seed, daemon ("none": no daemon), spawn (start a per-user
    neoflowd when none answers), compile_only, tune_trials, tune_seconds,
    device ("cpu", "cuda", "cuda:N"), trust, daemon_key, quiet
    log        a function (level, message) for the library's messages
               (default: stderr, as the neoflow tool)
    """

    def __init__(self, model, def_name=None, *, optimizer="adam", lr=0.0, momentum=0.0,
                 betas=(0.0, 0.0), eps=0.0, weight_decay=0.0, params=None, shapes=None,
                 trainable=(), threads=0, seed=1, daemon=None, spawn=True, compile_only=False,
                 tune_trials=0, tune_seconds=0, device=None, trust=(), daemon_key=None,
                 quiet=False, log=None):
        if optimizer not in _OPTIMIZERS:
            raise ValueError("optimizer is sgd, adam or adamw, got %r" % (optimizer,))
        o, keep, self._log = _options(
            params=params, shapes=shapes, trainable=trainable, threads=threads, seed=seed,
            daemon=daemon, spawn=spawn, compile_only=compile_only, tune_trials=tune_trials,
            tune_seconds=tune_seconds, device=device, trust=trust, daemon_key=daemon_key,
            quiet=quiet, log=log)
        o.optim.kind = _OPTIMIZERS[optimizer]
        o.optim.lr, o.optim.momentum = lr, momentum
        o.optim.beta1, o.optim.beta2 = betas
        o.optim.eps, o.optim.weight_decay = eps, weight_decay
        self.model = model  # (the session reads the model's defs while open)
        err = ctypes.c_void_p()
        if isinstance(model, Net):
            self._h = _c.nf_session_new_net(model._h, ctypes.byref(o), ctypes.byref(err))
            def_name = "the net"
        else:
            if def_name is None:
                raise TypeError("Session(model, def_name, ...) or Session(net, ...)")
            self._h = _c.nf_session_new_def(model._h, def_name.encode(), ctypes.byref(o),
                                            ctypes.byref(err))
        if not self._h:
            raise Error(-2, _take_err(err) or "cannot open a session on %s" % def_name)
        self.def_name = def_name
        self.inputs = self._infos(_c.nf_session_n_inputs, _c.nf_session_input_info)
        self.params = self._infos(_c.nf_session_n_params, _c.nf_session_param_info)
        self.outputs = self._infos(_c.nf_session_n_outputs, _c.nf_session_output_info)
        self._named = {t.name: t for t in self.inputs + self.params + self.outputs}

    def _infos(self, count, info):
        res = []
        for i in range(count(self._h)):
            name, t, rank = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int()
            dims = (ctypes.c_int64 * 8)()
            _check(info(self._h, i, ctypes.byref(name), ctypes.byref(t), ctypes.byref(rank), dims),
                   "tensor info")
            res.append(TensorInfo(name.value.decode(), _DTYPES[t.value],
                                  [dims[d] for d in range(rank.value)]))
        return res

    def _fail(self, rc, what):
        msg = (_c.nf_session_error(self._h) or b"").decode(errors="replace")
        raise Error(rc, "%s: %s" % (what, msg or _c.nf_strerror(rc).decode()))

    def _array_for(self, info, value, what):
        a = np.asarray(value)
        if a.shape != info.shape:
            raise ValueError("%s '%s': shape %s, the session's is %s"
                             % (what, info.name, list(a.shape), list(info.shape)))
        if a.dtype != info.dtype:
            if not np.can_cast(a.dtype, info.dtype, casting="same_kind"):
                raise TypeError("%s '%s': dtype %s, the session's is %s"
                                % (what, info.name, a.dtype, info.dtype))
            a = a.astype(info.dtype)
        return np.ascontiguousarray(a)  # (no copy when it already is)

    def feed(self, *args, **arrays):
        """feed(name, array) or feed(X=array, labels=array): the next
        step's inputs (copied by the library)."""
        if args:
            if len(args) != 2:
                raise TypeError("feed(name, array) or feed(name=array, ...)")
            arrays = {args[0]: args[1]}
        for name, value in arrays.items():
            info = self._named.get(name)
            if info is None or info not in self.inputs:
                raise KeyError("%s has no input '%s' (its inputs: %s)"
                               % (self.def_name, name, ", ".join(t.name for t in self.inputs)))
            a = self._array_for(info, value, "input")
            rc = _c.nf_session_feed(self._h, name.encode(), a.ctypes.data, a.nbytes)
            if rc != OK:
                self._fail(rc, "feeding '%s'" % name)

    def step(self):
        """One training step on the inputs fed; returns the loss."""
        loss = ctypes.c_double()
        rc = _c.nf_session_step(self._h, ctypes.byref(loss))
        if rc != OK:
            self._fail(rc, "step")
        return loss.value

    def eval(self):
        """The forward outputs on the inputs fed, without an update;
        returns the loss (read the other outputs with read)."""
        loss = ctypes.c_double()
        rc = _c.nf_session_eval(self._h, ctypes.byref(loss))
        if rc != OK:
            self._fail(rc, "eval")
        return loss.value

    def read(self, name):
        """A copy of a tensor: an input, a parameter, an output, a gradient
        (grad_<param>), as a NumPy array."""
        info = self._named.get(name)
        if info is None and name.startswith("grad_") and name[5:] in self._named:
            base = self._named[name[5:]]
            info = TensorInfo(name, np.dtype(np.float32), base.shape)
        if info is None:
            raise KeyError("%s has no tensor '%s'" % (self.def_name, name))
        out = np.empty(info.shape, dtype=info.dtype)
        rc = _c.nf_session_read(self._h, name.encode(), out.ctypes.data, out.nbytes)
        if rc != OK:
            self._fail(rc, "reading '%s'" % name)
        return out

    def set_param(self, name, value):
        info = self._named.get(name)
        if info is None or info not in self.params:
            raise KeyError("%s has no parameter '%s'" % (self.def_name, name))
        a = self._array_for(info, value, "parameter").astype(np.float32, copy=False)
        rc = _c.nf_session_set_param(self._h, name.encode(), a.ctypes.data, a.size)
        if rc != OK:
            self._fail(rc, "setting '%s'" % name)

    def set_lr(self, lr):
        rc = _c.nf_session_set_lr(self._h, float(lr))
        if rc != OK:
            self._fail(rc, "set_lr")

    def save(self, path):
        rc = _c.nf_session_save(self._h, str(path).encode())
        if rc != OK:
            self._fail(rc, "saving %s" % path)

    def load(self, path):
        rc = _c.nf_session_load(self._h, str(path).encode())
        if rc != OK:
            self._fail(rc, "loading %s" % path)

    def stats(self):
        """The kernels' tiers and the steps' times (nf_session_stats), as a dict."""
        st = _lib.nf_session_stats()
        _check(_c.nf_session_stats_get(self._h, ctypes.byref(st)), "stats")
        return {f: getattr(st, f) for f, _ in st._fields_}

    def report_to(self, path, every_s=60.0):
        """Writes the training report (docs/report.md) to path every every_s
        seconds and when the session ends; None: no longer."""
        rc = _c.nf_session_report_to(self._h, str(path).encode() if path else None,
                                     float(every_s))
        if rc != OK:
            self._fail(rc, "report_to %s" % path)

    def report(self, path=None):
        """Writes the training report now (to path, else report_to's)."""
        rc = _c.nf_session_report(self._h, str(path).encode() if path else None)
        if rc != OK:
            self._fail(rc, "writing the report")

    def note(self, metric, value):
        """A metric's value at the current step (e.g. "test accuracy"),
        charted in the report."""
        rc = _c.nf_session_note(self._h, str(metric).encode(), float(value))
        if rc != OK:
            self._fail(rc, "note %s" % metric)



def _fill(v, ptr, elem, shape):
    """Fills nf_view v: data at address ptr (0/None: none), element type
    elem (nf_elem), shape."""
    if len(shape) > 7:
        raise ValueError("rank %d: operators take up to 7 dimensions" % len(shape))
    v.data = ptr or None
    v.elem = elem
    v.rank = len(shape)
    for d, n in enumerate(shape):
        v.dims[d] = n


def _elem(a):
    e = _ELEMS.get(a.dtype)
    if e is None:
        raise TypeError("dtype %s: operators take bool, int32, int64, float32 and float64"
                        % a.dtype)
    return e


class Operator(_Handle):
    """One def of a model as a function of NumPy arrays, forward and
    backward (nf_operator; the gradient from expression autodiff), for
    framework operators such as neoflow.torch.op.  Each new combination of
    input shapes is specialised once and kept; its kernels come from the
    daemon like a session's.  A def declared in f32 given float64 arrays
    runs in f64 throughout.

    params (the def's integer parameters), threads, daemon, spawn,
    compile_only, tune_trials, tune_seconds, trust, daemon_key, quiet, log:
    as Session's.  The operator runs on the CPU.

    The methods taking arrays are built on three taking raw buffers
    (lists of (address, nf_elem, shape)): specs, run_forward and
    run_backward, which other frameworks' bindings use (neoflow.torch).
    """

    def __init__(self, model, def_name, *, params=None, threads=0, daemon=None, spawn=True,
                 compile_only=False, tune_trials=0, tune_seconds=0, trust=(), daemon_key=None,
                 quiet=False, log=None):
        o, keep, self._log = _options(
            params=params, threads=threads, daemon=daemon, spawn=spawn,
            compile_only=compile_only, tune_trials=tune_trials, tune_seconds=tune_seconds,
            trust=trust, daemon_key=daemon_key, quiet=quiet, log=log)
        self.model = model  # (the operator instantiates the def for each new shape)
        err = ctypes.c_void_p()
        self._h = _c.nf_operator_new(model._h, def_name.encode(), ctypes.byref(o),
                                     ctypes.byref(err))
        if not self._h:
            raise Error(-2, _take_err(err) or "cannot make an operator of %s" % def_name)
        self.def_name = def_name
        self.inputs = [_c.nf_operator_input_name(self._h, i).decode()
                       for i in range(_c.nf_operator_n_inputs(self._h))]
        self.outputs = [_c.nf_operator_output_name(self._h, i).decode()
                        for i in range(_c.nf_operator_n_outputs(self._h))]
        self.saved = 0
        self._specs = {}  # ((elem, shape) per input) -> [(elem, shape)] per output

    def _fail(self, rc, what):
        msg = (_c.nf_operator_error(self._h) or b"").decode(errors="replace")
        raise Error(rc, "%s: %s" % (what, msg or _c.nf_strerror(rc).decode()))

    def _array(self, bufs, names, what):
        """A fresh nf_view array for bufs, one per name (views are made
        per call: another thread's call may be reading its own)."""
        if self._h is None:
            raise Error(-2, "the operator is closed")
        if len(bufs) != len(names):
            raise TypeError("%s takes %d %s (%s), got %d"
                            % (self.def_name, len(names), what, ", ".join(names), len(bufs)))
        views = (_lib.nf_view * max(len(names), 1))()
        for (ptr, elem, shape), v in zip(bufs, views):
            _fill(v, ptr, elem, shape)
        return views

    def _ins(self, bufs):
        return self._array(bufs, self.inputs, "inputs")

    def specs(self, bufs):
        """[(nf_elem, shape)] of the outputs for inputs bufs (their
        addresses unused); specialises for new shapes."""
        key = tuple((elem, tuple(shape)) for _, elem, shape in bufs)
        got = self._specs.get(key)
        if got is None:
            views = self._ins(bufs)
            outs = (_lib.nf_view * max(len(self.outputs), 1))()
            rc = _c.nf_operator_shapes(self._h, views, outs)
            if rc != OK:
                self._fail(rc, self.def_name)
            got = [(v.elem, tuple(v.dims[d] for d in range(v.rank)))
                   for v in outs[:len(self.outputs)]]
            if len(self._specs) > 64:
                self._specs.clear()
            self._specs[key] = got
        return got

    def run_forward(self, bufs, outs):
        """Runs the def on raw buffers; returns its token (for
        run_backward's saved)."""
        views = self._ins(bufs)
        ov = self._array(outs, self.outputs, "outputs")
        token = ctypes.c_uint64()
        rc = _c.nf_operator_forward(self._h, views, ov, ctypes.byref(token))
        self.saved = token.value
        if rc != OK:
            self._fail(rc, self.def_name)
        return token.value

    def run_backward(self, saved, bufs, grad_outs, grad_ins):
        """The gradients on raw buffers: grad_outs one (address or None,
        elem, shape) per output, grad_ins one per input (address None: not
        asked)."""
        views = self._ins(bufs)
        gv = self._array(grad_outs, self.outputs, "output gradients")
        dv = self._array(grad_ins, self.inputs, "input gradients")
        rc = _c.nf_operator_backward(self._h, int(saved), views, gv, dv)
        if rc != OK:
            self._fail(rc, self.def_name)

    @staticmethod
    def _bufs(arrays):
        arrs = [np.require(a, requirements="C") for a in arrays]  # (0-d stays 0-d)
        return arrs, [(a.ctypes.data if a.size else None, _elem(a), a.shape) for a in arrs]

    def output_specs(self, *arrays):
        """[(shape, dtype)] of the outputs for these inputs (specialises)."""
        arrs, bufs = self._bufs(arrays)
        return [(shape, _DTYPES[e]) for e, shape in self.specs(bufs)]

    def forward(self, *arrays, out=None):
        """The outputs for these inputs, as a tuple of arrays (written into
        `out`, a sequence of C-contiguous arrays, when given).  The run's
        token is left in .saved, for backward."""
        arrs, bufs = self._bufs(arrays)
        specs = self.specs(bufs)
        if out is None:
            out = [np.empty(shape, _DTYPES[e]) for e, shape in specs]
        if len(out) != len(self.outputs):
            raise TypeError("%s has %d outputs, got %d buffers"
                            % (self.def_name, len(self.outputs), len(out)))
        for a in out:
            if not a.flags.c_contiguous or not a.flags.writeable:
                raise ValueError("an output buffer must be C-contiguous and writeable")
            if any(np.may_share_memory(a, x) for x in arrs):
                raise ValueError("an output buffer must not overlap the inputs")
        self.run_forward(bufs, [(a.ctypes.data if a.size else None, _elem(a), a.shape)
                                for a in out])
        return tuple(out)

    def backward(self, arrays, grad_outputs, want=None, saved=0):
        """The gradients of the inputs given those of the outputs
        (grad_outputs: one array or None, a zero gradient, per output):
        a list with an array for each input asked (want: booleans per
        input; default every float input), None for the others.  saved:
        the token of the forward of these same, unchanged arrays (its
        values are then kept rather than recomputed, when no forward of
        these shapes came between)."""
        arrs, bufs = self._bufs(arrays)
        specs = self.specs(bufs)
        if len(grad_outputs) != len(self.outputs):
            raise TypeError("%s has %d outputs, got %d gradients"
                            % (self.def_name, len(self.outputs), len(grad_outputs)))
        gkeep, gouts = [], []
        for (e, shape), g in zip(specs, grad_outputs):
            if g is not None:
                g = np.require(g, dtype=_DTYPES[e], requirements="C")
                gkeep.append(g)
            gouts.append((g.ctypes.data if g is not None and g.size else None, e, shape))
        if want is None:
            want = [a.dtype.kind == "f" for a in arrs]
        if len(want) != len(arrs):
            raise TypeError("want: one boolean per input (%d), got %d" % (len(arrs), len(want)))
        grads = [np.empty(a.shape, a.dtype) if w else None for a, w in zip(arrs, want)]
        gins = [(g.ctypes.data if g is not None and g.size else None, e, shape)
                for g, (_, e, shape) in zip(grads, bufs)]
        self.run_backward(saved, bufs, gouts, gins)
        return grads

    def stats(self):
        """nf_operator_stats as a dict (summed over the shapes kept)."""
        st = _lib.nf_session_stats()
        _check(_c.nf_operator_stats(self._h, ctypes.byref(st)), "stats")
        return {f: getattr(st, f) for f, _ in st._fields_}



Session._free, Session._wait = (staticmethod(_c.nf_session_free),
                                staticmethod(_c.nf_session_wait_kernels))
Operator._free, Operator._wait = (staticmethod(_c.nf_operator_free),
                                  staticmethod(_c.nf_operator_wait_kernels))
