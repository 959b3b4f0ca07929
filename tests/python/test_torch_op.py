"""neoflow.torch.op and neoflow.Operator: a `.nf` def as a PyTorch operator
(nf_operator of the C API).  Run by `meson test python` with Debian's
python3-torch (skipped without it)."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import neoflow

torch = pytest.importorskip("torch")
import neoflow.torch as nft  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORKLOADS = os.path.join(ROOT, "examples", "workloads.nf")
B, I, S, T = 4, 6, 5, 3


def lltm_ref(x, h, c, W, b):
    """The LLTM cell of PyTorch's C++-extension tutorial, in PyTorch."""
    gates = torch.nn.functional.linear(torch.cat([x, h], 1), W, b)
    ig, og, gc = gates.chunk(3, 1)
    c2 = c + torch.nn.functional.elu(gc) * torch.sigmoid(ig)
    return torch.tanh(c2) * torch.sigmoid(og), c2


def lltm_inputs(dtype, batch=B, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(batch, I), (batch, S), (batch, S), (3 * S, I + S), (3 * S,)]
    return [(0.5 * torch.randn(*s, generator=g, dtype=dtype)).requires_grad_() for s in shapes]


@pytest.fixture(scope="module")
def lltm():
    return nft.op(WORKLOADS, "lltm_step", daemon="none", threads=1)


def test_the_op_says_its_tensors(lltm):
    assert lltm.inputs == ["X", "H", "C", "W", "b"]
    assert lltm.outputs == ["H2", "C2"]
    assert "lltm_step" in repr(lltm)


def test_forward_and_gradients_match_pytorch(lltm):
    xs = lltm_inputs(torch.float32)
    got, want = lltm(*xs), lltm_ref(*xs)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    g = [torch.randn_like(t) for t in want]
    ga = torch.autograd.grad(got, xs, g)
    gb = torch.autograd.grad(want, xs, g)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gradcheck_in_float64(lltm):
    xs = lltm_inputs(torch.float64, batch=3, seed=1)
    assert torch.autograd.gradcheck(lltm, tuple(xs), eps=1e-6, atol=1e-7, rtol=1e-5)


class Model(torch.nn.Module):
    """An input layer, T steps of an LLTM cell, a classifier head."""

    def __init__(self, cell):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.cell = cell
        self.inp = torch.nn.Linear(8, I)
        self.W = torch.nn.Parameter(0.3 * torch.randn(3 * S, I + S, generator=g))
        self.b = torch.nn.Parameter(0.1 * torch.randn(3 * S, generator=g))
        self.head = torch.nn.Linear(S, 3)

    def forward(self, X):
        h = X.new_zeros(X.shape[1], S)
        c = X.new_zeros(X.shape[1], S)
        for t in range(X.shape[0]):
            h, c = self.cell(torch.tanh(self.inp(X[t])), h, c, self.W, self.b)
        return self.head(h)


def train(model, steps=20):
    g = torch.Generator().manual_seed(11)
    X = torch.randn(steps, T, B, 8, generator=g)
    y = torch.randint(0, 3, (steps, B), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for k in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X[k]), y[k])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses)


def test_a_model_with_a_neoflow_op_trains_like_pytorch(lltm):
    torch.manual_seed(3)
    ours = Model(lltm)
    theirs = Model(lltm_ref)
    theirs.load_state_dict(ours.state_dict())
    a, b = train(ours), train(theirs)
    assert np.isfinite(a).all() and a[-5:].mean() < a[:5].mean()  # it learns
    assert np.abs(a - b).max() / np.abs(b).max() < 1e-5, (a, b)
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)


def test_only_the_gradients_asked_are_formed(lltm):
    xs = lltm_inputs(torch.float32, seed=2)
    frozen = [x.detach() for x in xs[:3]] + xs[3:]
    h2, c2 = lltm(*frozen)
    (h2.sum() + c2.sum()).backward()
    assert xs[3].grad is not None and xs[4].grad is not None
    want = torch.autograd.grad(sum(t.sum() for t in lltm_ref(*xs)), xs[3:])
    torch.testing.assert_close(xs[3].grad, want[0], rtol=1e-4, atol=1e-5)


def test_new_shapes_are_specialised_and_kept():
    op = nft.op(WORKLOADS, "lltm_step", daemon="none", threads=1)
    op(*lltm_inputs(torch.float32, batch=2))
    k1 = op.stats()["kernels"]
    op(*lltm_inputs(torch.float32, batch=7))
    k2 = op.stats()["kernels"]
    assert k2 > k1
    op(*lltm_inputs(torch.float32, batch=2))
    assert op.stats()["kernels"] == k2 and op.stats()["step"] == 3


def test_integer_inputs_have_no_gradient():
    src = ("def embed_scale(Idx: i64[N], E: f32[V, D], s: f32[D]) -> (Y: f32[N, D]) {\n"
           "  Y(n, d) = E(Idx(n), d) * s(d)\n}\n")
    op = nft.op(neoflow.Model.from_source(src), "embed_scale", daemon="none")
    idx = torch.tensor([2, 0, 2, 1])
    E = torch.randn(3, 4, requires_grad=True)
    s = torch.randn(4, requires_grad=True)
    y = op(idx, E, s)
    ref = torch.nn.functional.embedding(idx, E) * s
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, (E, s), g),
                               torch.autograd.grad(ref, (E, s), g))


def test_errors_name_the_input(lltm):
    xs = lltm_inputs(torch.float32)
    with pytest.raises(TypeError, match="takes 5 tensors"):
        lltm(*xs[:4])
    bad = list(xs)
    bad[4] = torch.zeros(3 * S + 1)
    with pytest.raises(neoflow.Error, match="'G' is"):
        lltm(*bad)
    bad[4] = torch.zeros(3 * S, dtype=torch.int32)
    with pytest.raises(neoflow.Error, match="input 4 'b' must be f32"):
        lltm(*bad)
    with pytest.raises(neoflow.Error, match="no def 'lltm_stp'"):
        nft.op(WORKLOADS, "lltm_stp", daemon="none")
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        lltm(*(xs[:4] + [np.zeros(3 * S, np.float32)]))
    lltm(*xs)  # and it still works


def test_kernels_come_from_the_daemon_and_are_swapped_in():
    exe = os.environ.get("NF_NEOFLOWD")
    if not exe:
        pytest.skip("NF_NEOFLOWD is not set (no daemon in this build)")
    d = tempfile.mkdtemp(prefix="nf_pyop_")
    sock = os.path.join(d, "run", "neoflowd.sock")
    conf = os.path.join(d, "neoflowd.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nsocket = %s\n[cache]\ncache = %s\n" % (sock, os.path.join(d, "c.db")))
    log = open(os.path.join(d, "neoflowd.log"), "w")
    p = subprocess.Popen([exe, "--config", conf], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            time.sleep(0.025)
        op = nft.op(WORKLOADS, "lltm_step", daemon=sock, spawn=False, compile_only=True,
                    threads=1)
        xs = lltm_inputs(torch.float32, seed=4)
        first = lltm_ref(*xs)
        g = [torch.ones_like(t) for t in first]
        out0 = op(*xs)
        grads0 = torch.autograd.grad(out0, xs, g)
        assert op.wait_kernels(120000)
        for _ in range(3):
            out = op(*xs)
            grads = torch.autograd.grad(out, xs, g)
        st = op.stats()
        assert st["swaps"] > 0 and st["rejected"] == 0, st
        assert st["tier1"] + st["tier0_kept"] == st["kernels"], st
        for a, b in zip(out + grads, out0 + grads0):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def test_the_lltm_example_runs():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "lltm_torch.py"),
                        "--steps", "3", "--daemon", "none"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    worst = float(r.stdout.split("largest relative difference of the losses: ")[1].split()[0])
    assert worst < 1e-5, r.stdout
