"""_lib.py - finding libneoflow-client and declaring its C API for ctypes.

The library is found as a C program's would be: NEOFLOW_LIBRARY (an
explicit path), then the dynamic linker's search (LD_LIBRARY_PATH, the
installed library), then the build tree next to this package
(<repo>/build/client, for a package used from the source tree).  The
structures mirrored here are checked against the library's own sizes
(nf_session_abi_size) when it is loaded.
"""

import ctypes
import ctypes.util
import os

SONAME = "libneoflow-client.so.1"


class nf_optimizer(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("lr", ctypes.c_double), ("momentum", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)

_cstrs = ctypes.POINTER(ctypes.c_char_p)


class nf_session_opts(ctypes.Structure):
    _fields_ = [
        ("optim", nf_optimizer), ("threads", ctypes.c_int), ("seed", ctypes.c_uint64),
        ("daemon", ctypes.c_char_p), ("no_spawn", ctypes.c_int), ("compile_only", ctypes.c_int),
        ("tune_trials", ctypes.c_int), ("tune_seconds", ctypes.c_int),
        ("n_iparams", ctypes.c_int), ("inames", _cstrs),
        ("ivalues", ctypes.POINTER(ctypes.c_int64)),
        ("n_shapes", ctypes.c_int), ("shape_names", _cstrs),
        ("shape_ranks", ctypes.POINTER(ctypes.c_int)),
        ("shape_dims", ctypes.POINTER(ctypes.POINTER(ctypes.c_int64))),
        ("n_trainable", ctypes.c_int), ("trainable", _cstrs), ("quiet", ctypes.c_int),
        ("device", ctypes.c_char_p), ("daemon_key", ctypes.c_char_p), ("n_trust", ctypes.c_int),
        ("trust", _cstrs), ("log", LOG_FN), ("log_user", ctypes.c_void_p)]


class nf_session_stats(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64), ("loss", ctypes.c_double), ("ms", ctypes.c_double),
        ("ms_avg", ctypes.c_double), ("kernels", ctypes.c_int), ("tier1", ctypes.c_int),
        ("tier2", ctypes.c_int), ("blas", ctypes.c_int), ("tuning", ctypes.c_int),
        ("trials", ctypes.c_int64), ("trials_max", ctypes.c_int64), ("connected", ctypes.c_int),
        ("reconnects", ctypes.c_int64), ("rejected", ctypes.c_int64), ("swaps", ctypes.c_int64),
        ("trusted", ctypes.c_int64), ("first_step_ms", ctypes.c_double),
        ("blas_kept", ctypes.c_int), ("generated", ctypes.c_int), ("graph_runs", ctypes.c_int64),
        ("tier0_kept", ctypes.c_int), ("remembered", ctypes.c_int64)]


class nf_dataset(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int64), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("classes", ctypes.c_int64), ("images", ctypes.POINTER(ctypes.c_float)),
                ("labels", ctypes.POINTER(ctypes.c_int64))]


class nf_init(ctypes.Structure):
    _fields_ = [("fn", ctypes.c_int), ("a", ctypes.c_double), ("b", ctypes.c_double),
                ("data", ctypes.POINTER(ctypes.c_float))]


class nf_view(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("elem", ctypes.c_int), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * 8)]


def _candidates():
    env = os.environ.get("NEOFLOW_LIBRARY")
    if env:
        yield env
        return
    yield SONAME
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (os.path.join(here, "..", ".."), os.path.join(here, "..", "..", "..")):
        yield os.path.normpath(os.path.join(up, "build", "client", SONAME))


def _loaded_path(lib, name):
    """The file the dynamic linker mapped for lib (for a library found by
    its soname), from /proc/self/maps; name itself where that fails."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libneoflow-client.so"):
                    return path
    except OSError:
        pass
    return name


def load():
    """(the CDLL, the path it was loaded from, the places tried)."""
    tried = []
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            tried.append("%s (no such file)" % cand)
            continue
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append("%s (%s)" % (cand, e))
            continue
        return lib, _loaded_path(lib, cand), tried
    raise ImportError("neoflow: cannot load %s; tried: %s (set NEOFLOW_LIBRARY to its path, or "
                      "LD_LIBRARY_PATH to its directory)" % (SONAME, "; ".join(tried)))


def declare(lib):
    """Argument and result types of the functions used; the structures'
    sizes checked against the library's."""
    c_int, c_char_p, c_void_p, c_size_t = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
    p_err = ctypes.POINTER(ctypes.c_void_p)
    sig = {
        "nf_strerror": (c_char_p, [c_int]),
        "nf_model_load": (c_void_p, [c_char_p, p_err]),
        "nf_model_load_source": (c_void_p, [c_char_p, c_char_p, p_err]),
        "nf_model_free": (None, [c_void_p]),
        "nf_session_new_def": (c_void_p, [c_void_p, c_char_p, ctypes.POINTER(nf_session_opts),
                                          p_err]),
        "nf_session_free": (None, [c_void_p]),
        "nf_session_error": (c_char_p, [c_void_p]),
        "nf_session_n_inputs": (c_int, [c_void_p]),
        "nf_session_n_params": (c_int, [c_void_p]),
        "nf_session_n_outputs": (c_int, [c_void_p]),
        "nf_session_input_info": (c_int, [c_void_p, c_int, ctypes.POINTER(c_char_p),
                                          ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                          ctypes.POINTER(ctypes.c_int64)]),
        "nf_session_param_info": (c_int, [c_void_p, c_int, ctypes.POINTER(c_char_p),
                                          ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                          ctypes.POINTER(ctypes.c_int64)]),
        "nf_session_output_info": (c_int, [c_void_p, c_int, ctypes.POINTER(c_char_p),
                                           ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                           ctypes.POINTER(ctypes.c_int64)]),
        "nf_session_feed": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
        "nf_session_step": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_double)]),
        "nf_session_eval": (c_int, [c_void_p, ctypes.POINTER(ctypes.c_double)]),
        "nf_session_read": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
        "nf_session_set_param": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
        "nf_session_set_lr": (c_int, [c_void_p, ctypes.c_double]),
        "nf_session_save": (c_int, [c_void_p, c_char_p]),
        "nf_session_load": (c_int, [c_void_p, c_char_p]),
        "nf_session_report_to": (c_int, [c_void_p, c_char_p, ctypes.c_double]),
        "nf_session_report": (c_int, [c_void_p, c_char_p]),
        "nf_session_note": (c_int, [c_void_p, c_char_p, ctypes.c_double]),
        "nf_session_stats_get": (c_int, [c_void_p, ctypes.POINTER(nf_session_stats)]),
        "nf_session_wait_kernels": (c_int, [c_void_p, c_int, c_int]),
        "nf_session_abi_size": (c_size_t, [c_char_p]),
        "nf_session_new_net": (c_void_p, [c_void_p, ctypes.POINTER(nf_session_opts), p_err]),
        "nf_net_new": (c_void_p, [c_void_p]),
        "nf_net_free": (None, [c_void_p]),
        "nf_net_error": (c_char_p, [c_void_p]),
        "nf_net_input": (c_int, [c_void_p, c_char_p, c_int, c_int, ctypes.POINTER(ctypes.c_int64)]),
        "nf_net_param": (c_int, [c_void_p, c_char_p, c_int, c_int, ctypes.POINTER(ctypes.c_int64),
                                 nf_init]),
        "nf_net_apply": (c_int, [c_void_p, c_char_p, c_int, _cstrs, ctypes.POINTER(ctypes.c_int64),
                                 c_int, ctypes.POINTER(c_int), c_int, ctypes.POINTER(c_int)]),
        "nf_net_loss": (c_int, [c_void_p, c_int]),
        "nf_net_output": (c_int, [c_void_p, c_char_p, c_int]),
        "nf_grad": (c_int, [c_void_p, c_int]),
        "nf_net_source": (c_char_p, [c_void_p]),
        "nf_operator_new": (c_void_p, [c_void_p, c_char_p, ctypes.POINTER(nf_session_opts),
                                       p_err]),
        "nf_operator_free": (None, [c_void_p]),
        "nf_operator_error": (c_char_p, [c_void_p]),
        "nf_operator_n_inputs": (c_int, [c_void_p]),
        "nf_operator_n_outputs": (c_int, [c_void_p]),
        "nf_operator_input_name": (c_char_p, [c_void_p, c_int]),
        "nf_operator_output_name": (c_char_p, [c_void_p, c_int]),
        "nf_operator_shapes": (c_int, [c_void_p, ctypes.POINTER(nf_view),
                                       ctypes.POINTER(nf_view)]),
        "nf_operator_forward": (c_int, [c_void_p, ctypes.POINTER(nf_view),
                                        ctypes.POINTER(nf_view),
                                        ctypes.POINTER(ctypes.c_uint64)]),
        "nf_operator_backward": (c_int, [c_void_p, ctypes.c_uint64, ctypes.POINTER(nf_view),
                                         ctypes.POINTER(nf_view), ctypes.POINTER(nf_view)]),
        "nf_operator_stats": (c_int, [c_void_p, ctypes.POINTER(nf_session_stats)]),
        "nf_operator_wait_kernels": (c_int, [c_void_p, c_int, c_int]),
        "nf_dataset_mnist_load": (c_int, [c_char_p, c_char_p, ctypes.POINTER(nf_dataset), p_err]),
        "nf_dataset_free": (None, [ctypes.POINTER(nf_dataset)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    for what, st in (("opts", nf_session_opts), ("stats", nf_session_stats),
                     ("optimizer", nf_optimizer), ("view", nf_view)):
        theirs = lib.nf_session_abi_size(what.encode())
        if theirs != ctypes.sizeof(st):
            raise ImportError("neoflow: this package's %s is %d bytes but the library's is %d: "
                              "the package and libneoflow-client are of different versions"
                              % (st.__name__, ctypes.sizeof(st), theirs))
