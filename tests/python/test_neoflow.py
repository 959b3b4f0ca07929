"""The Python package (python/neoflow) over this build's libneoflow-client:
run by `meson test python` (tests/meson.build) with NEOFLOW_LIBRARY set to
the build's library and python/ on PYTHONPATH."""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import neoflow

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MLP = os.path.join(ROOT, "examples", "mlp.nf")


def mlp_session(**kw):
    m = neoflow.Model.load(MLP)
    opts = dict(optimizer="sgd", lr=0.05, params={"batch": 16, "hidden": 16}, daemon="none",
                threads=1, seed=3)
    opts.update(kw)
    return m, neoflow.Session(m, "mlp", **opts)


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((10, 784)).astype(np.float32)
    for _ in range(n):
        X = rng.standard_normal((16, 784)).astype(np.float32)
        yield X, np.argmax(X @ W.T, axis=1)


def test_the_library_loaded_is_this_builds():
    assert os.path.exists(neoflow.library), neoflow.library
    want = os.environ.get("NEOFLOW_LIBRARY")
    if want:
        assert os.path.realpath(neoflow.library) == os.path.realpath(want)


def test_a_session_trains_and_says_its_tensors():
    m, s = mlp_session()
    with s:
        assert [t.name for t in s.inputs] == ["X", "labels"]
        assert s.inputs[1].dtype == np.int64 and s.inputs[0].shape == (16, 784)
        assert [t.name for t in s.params] == ["W1", "b1", "W2", "b2", "W3", "b3"]
        losses = []
        for X, y in batches(40):
            s.feed(X=X, labels=y)
            losses.append(s.step())
        assert np.isfinite(losses).all()
        assert np.mean(losses[-5:]) < np.mean(losses[:5])
        st = s.stats()
        assert st["step"] == 40 and st["kernels"] > 0 and not st["connected"]
        g = s.read("grad_W3")
        assert g.shape == (10, 16) and g.dtype == np.float32 and np.abs(g).sum() > 0
        # eval runs the forward only: the parameters do not move
        W1 = s.read("W1")
        s.eval()
        assert np.array_equal(W1, s.read("W1"))


def test_two_sessions_with_the_same_seed_and_data_agree():
    runs = []
    for _ in range(2):
        m, s = mlp_session()
        with s:
            runs.append([(s.feed(X=X, labels=y), s.step())[1] for X, y in batches(5)])
    assert runs[0] == runs[1]


def test_save_load_and_set_param():
    m, s = mlp_session()
    with s, tempfile.TemporaryDirectory() as d:
        for X, y in batches(3):
            s.feed(X=X, labels=y)
            s.step()
        path = os.path.join(d, "p.params")
        s.save(path)
        W1 = s.read("W1")
        s.set_param("W1", np.zeros_like(W1))
        assert not s.read("W1").any()
        s.load(path)
        assert np.array_equal(s.read("W1"), W1)


def test_the_training_report_from_python():
    m, s = mlp_session()
    with s, tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "report.html")
        s.report_to(path)
        for X, y in batches(5):
            s.feed(X=X, labels=y)
            s.step()
        s.note("test accuracy", 0.5)
        s.report()
        page = open(path, encoding="utf-8").read()
        for section in ("step-time", "loss", "graph", "tuning", "profile"):
            assert 'id="%s"' % section in page
        assert ">test accuracy<" in page
        with pytest.raises(neoflow.Error):
            s.report(os.path.join(d, "no", "such", "dir.html"))
        s.report_to(None)  # (its directory goes before the session does)


def test_errors_carry_the_librarys_message():
    with pytest.raises(neoflow.Error) as e:
        neoflow.Model.from_source("def f(X: f32[N]) -> (Y: f32[N]) {\n  Y = exp(Hiden)\n}\n",
                                  "t.nf")
    assert "t.nf:2:11: error: unknown tensor 'Hiden'" in str(e.value)
    with pytest.raises(neoflow.Error) as e:
        neoflow.Model.load("/nonexistent/m.nf")
    assert "cannot open '/nonexistent/m.nf'" in str(e.value)
    m = neoflow.Model.load(MLP)
    with pytest.raises(neoflow.Error) as e:
        neoflow.Session(m, "nope", daemon="none")
    assert "nope" in str(e.value)
    m, s = mlp_session()
    with s:
        with pytest.raises(ValueError) as e:
            s.feed(X=np.zeros((3, 784), np.float32))
        assert "input 'X': shape [3, 784], the session's is [16, 784]" in str(e.value)
        with pytest.raises(KeyError):
            s.feed(Z=np.zeros(3))
        with pytest.raises(TypeError):
            s.feed(labels=np.zeros(16, np.float32))
        with pytest.raises(ValueError):
            neoflow.Session(m, "mlp", optimizer="lbfgs")


def test_messages_go_to_the_log_function():
    got = []
    m = neoflow.Model.load(MLP)
    with neoflow.Session(m, "mlp", params={"batch": 4}, daemon="none", device="cuda:99",
                         log=lambda level, msg: got.append((level, msg))) as s:
        assert s.stats()["kernels"] > 0
    assert any("cuda:99" in msg for _, msg in got), got


@pytest.mark.skipif(shutil.which("pip3") is None and
                    subprocess.run([sys.executable, "-m", "pip", "--version"],
                                   capture_output=True).returncode != 0,
                    reason="no pip")
def test_pip_installs_the_package_into_a_venv():
    with tempfile.TemporaryDirectory() as d:
        venv = os.path.join(d, "venv")
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip("python3 -m venv is not available: %s" % r.stderr.strip()[-200:])
        py = os.path.join(venv, "bin", "python")
        src = os.path.join(d, "python")  # (a copy: pip builds in the directory)
        shutil.copytree(os.path.join(ROOT, "python"), src,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                            "--quiet", src], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        # found as a C program finds it: through LD_LIBRARY_PATH
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("NEOFLOW_LIBRARY", None)
        env["LD_LIBRARY_PATH"] = os.path.dirname(os.path.realpath(neoflow.library))
        r = subprocess.run([py, "-c", "import neoflow, os; print(neoflow.__file__); "
                            "print(neoflow.library)"], capture_output=True, text=True, env=env,
                           cwd=d)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0].startswith(venv), r.stdout
        assert os.path.realpath(r.stdout.splitlines()[1]) == os.path.realpath(neoflow.library)


def test_a_net_built_from_python_trains_like_the_def():
    """The MLP of examples/mlp.nf written as a Net, with the def's
    initial values, gives the def's losses step for step."""
    m, s = mlp_session()
    with s:
        init = {p.name: s.read(p.name) for p in s.params}
        want = [(s.feed(X=X, labels=y), s.step())[1] for X, y in batches(4)]
    net = neoflow.Net(m)
    X = net.input("X", (16, 784))
    y = net.input("labels", (16,), np.int64)
    t = X
    for k in (1, 2, 3):
        W = net.param("W%d" % k, init["W%d" % k].shape, init["W%d" % k])
        b = net.param("b%d" % k, init["b%d" % k].shape, init["b%d" % k])
        t = net.apply("linear", t, W, b)
        if k < 3:
            t = net.apply("relu", t)
    net.loss(net.apply("cross_entropy", t, y))
    net.output("logits", t)
    assert "cross_entropy" in net.source
    with neoflow.Session(net, optimizer="sgd", lr=0.05, daemon="none", threads=1) as s2:
        got = [(s2.feed(X=X, labels=y), s2.step())[1] for X, y in batches(4)]
        assert s2.read("logits").shape == (16, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(neoflow.Error) as e:
        net.apply("no_such_def", X)
    assert "no_such_def" in str(e.value)


@pytest.mark.skipif(not os.path.exists("/usr/share/datasets/fashion-mnist"),
                    reason="no Fashion-MNIST (Debian's dataset-fashion-mnist)")
def test_fashion_mnist_loads():
    images, labels = neoflow.load_mnist(split="test")
    assert images.shape == (10000, 28, 28) and images.dtype == np.float32
    assert labels.shape == (10000,) and labels.min() == 0 and labels.max() == 9
    assert abs(float(images.mean())) < 0.2
    with pytest.raises(neoflow.Error) as e:
        neoflow.load_mnist("/nonexistent", "train")
    assert "/nonexistent" in str(e.value)


@pytest.mark.skipif(not os.path.exists("/usr/share/datasets/fashion-mnist"),
                    reason="no Fashion-MNIST (Debian's dataset-fashion-mnist)")
def test_the_fashion_example_runs():
    """examples/python/fashion_cnn.py, briefly (fallback kernels, 40 steps,
    256 test images): it prints its test accuracy as neoflow train does,
    above chance."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "fashion_cnn.py"),
                        "--steps", "40", "--test-limit", "256", "--daemon", "none",
                        "--threads", "1"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if "test accuracy" in l][-1]
    acc = float(line.split("test accuracy ")[1].split("%")[0])
    assert acc > 40.0, line


def test_an_operator_on_numpy_arrays():
    src = ("def scaled(X: f32[N, D], s: f32[D]) -> (Y: f32[N, D], Z: f32[N]) {\n"
           "  Y(n, d) = tanh(X(n, d)) * s(d)\n"
           "  Z(n) +=! X(n, d) * X(n, d)\n}\n")
    op = neoflow.Operator(neoflow.Model.from_source(src), "scaled", daemon="none", threads=1)
    assert op.inputs == ["X", "s"] and op.outputs == ["Y", "Z"]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 4)).astype(np.float32)
    s = rng.standard_normal(4).astype(np.float32)
    assert op.output_specs(X, s) == [((3, 4), np.dtype(np.float32)), ((3,), np.dtype(np.float32))]
    Y, Z = op.forward(X, s)
    np.testing.assert_allclose(Y, np.tanh(X) * s, rtol=1e-6)
    np.testing.assert_allclose(Z, (X * X).sum(1), rtol=1e-6)
    gY = rng.standard_normal((3, 4)).astype(np.float32)
    gX, gs = op.backward((X, s), (gY, None), saved=op.saved)
    np.testing.assert_allclose(gX, gY * s * (1 - np.tanh(X) ** 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gs, (gY * np.tanh(X)).sum(0), rtol=1e-5, atol=1e-6)
    # only s's gradient; the f64 run of the same def; a non-contiguous input
    gX2, gs2 = op.backward((X, s), (gY, None), want=[False, True])
    assert gX2 is None and np.array_equal(gs2, gs)
    Y64, _ = op.forward(X.astype(np.float64), s.astype(np.float64))
    assert Y64.dtype == np.float64
    np.testing.assert_allclose(Y64, np.tanh(X.astype(np.float64)) * s, rtol=1e-6)
    Yt, _ = op.forward(np.asfortranarray(X), s)
    np.testing.assert_array_equal(Yt, Y)
    with pytest.raises(neoflow.Error, match="input 1 's' must be f32\\[4\\]"):
        op.forward(X, np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="takes 2 inputs"):
        op.forward(X)
    with pytest.raises(TypeError, match="has 2 outputs, got 1 buffers"):
        op.forward(X, s, out=[np.empty((3, 4), np.float32)])
    with pytest.raises(TypeError, match="one boolean per input"):
        op.backward((X, s), (gY, None), want=[True])
    with pytest.raises(ValueError, match="must not overlap the inputs"):
        op.forward(X, s, out=[X, np.empty(3, np.float32)])
    op.close()
    # a 0-d input stays 0-d
    src0 = "def scale(X: f32[N], a: f32[]) -> (Y: f32[N]) {\n  Y(n) = X(n) * a()\n}\n"
    op0 = neoflow.Operator(neoflow.Model.from_source(src0), "scale", daemon="none")
    (Y0,) = op0.forward(np.arange(3, dtype=np.float32), np.float32(2))
    np.testing.assert_array_equal(Y0, [0, 2, 4])
    gx, ga = op0.backward((np.arange(3, dtype=np.float32), np.array(2, np.float32)),
                          (np.ones(3, np.float32),))
    assert ga.shape == () and float(ga) == 3.0
    op0.close()
