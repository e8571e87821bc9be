"""Cross-entropy, sequence log-prob and softmax: the numba backend against torch autograd (fp32).

Parity means rtol 1e-5 on values and on every gradient entry (atol only for entries that are
exactly 0 in one backend and fp32 dust in the other).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training_assets_kernels import losses as K
from training_assets.trainers import objectives

RTOL, ATOL = 1e-5, 1e-7


def _run(fn, tensors, backend, **kw):
    """Call fn on fresh leaf copies; return (output, grads of the float leaves)."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*leaves, backend=backend, **kw)
    weights = torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)  # a non-trivial upstream gradient
    (out * weights).sum().backward()
    return out.detach(), [t.grad for t in leaves if t.is_floating_point()]


def _assert_parity(fn, tensors, **kw):
    out_t, grads_t = _run(fn, tensors, "torch", **kw)
    out_n, grads_n = _run(fn, tensors, "numba", **kw)
    torch.testing.assert_close(out_n, out_t, rtol=RTOL, atol=ATOL)
    for g_n, g_t in zip(grads_n, grads_t, strict=True):
        torch.testing.assert_close(g_n, g_t, rtol=RTOL, atol=ATOL)
    return out_n, grads_n


def test_exp_inside_the_kernels_is_accurate_to_fp32_rounding():
    # softmax of the row [x, 0] is (sigma(x), sigma(-x)): checks the polynomial exp over [-80, 80]
    x = np.linspace(-80.0, 80.0, 20_001, dtype=np.float32)
    rows = np.stack([x, np.zeros_like(x)], axis=1)
    out = np.empty_like(rows)
    K.softmax(rows, out)
    x64 = x.astype(np.float64)
    exact = np.stack([1 / (1 + np.exp(-x64)), 1 / (1 + np.exp(x64))], axis=1)
    assert np.max(np.abs(out - exact) / exact) < 1e-6
    probs = np.empty((1, 3), np.float32)
    K.softmax(np.array([[0.0, -np.inf, -1e4]], np.float32), probs)
    assert probs.tolist() == [[1.0, 0.0, 0.0]], "exp(-inf) and exp(-1e4) are exactly 0"


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_softmax_and_log_softmax_match_torch(scale):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(1)) * scale
    x[0, 3] = float("-inf")
    out = np.empty((5, 37), np.float32)
    K.softmax(x.numpy(), out)
    torch.testing.assert_close(torch.from_numpy(out), torch.softmax(x, -1), rtol=RTOL, atol=ATOL)
    K.log_softmax(x.numpy(), out)
    torch.testing.assert_close(torch.from_numpy(out), torch.log_softmax(x, -1), rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("vocab", [1, 7, 100])
def test_cross_entropy_matches_torch_with_ignored_rows(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=gen) * 3
    labels = torch.randint(0, vocab, (9,), generator=gen)
    labels[[1, 4]] = -100
    loss, (grad,) = _assert_parity(objectives.cross_entropy, [logits, labels])
    assert torch.all(grad[[1, 4]] == 0), "ignored rows get no gradient"
    if vocab == 1:
        assert loss.item() == 0.0


def test_cross_entropy_extreme_and_infinite_logits():
    logits = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    logits[0] = 1e4
    logits[1, :8] = -1e4
    logits[2, 5] = 1e4
    logits[3, [0, 2, 9]] = float("-inf")
    labels = torch.tensor([3, 1, 5, 4, 0, 15])
    _assert_parity(objectives.cross_entropy, [logits, labels])
    # a label on a -inf logit has infinite loss in both backends, with the same finite gradient
    labels[3] = 2
    out_t, (g_t,) = _run(objectives.cross_entropy, [logits, labels], "torch")
    out_n, (g_n,) = _run(objectives.cross_entropy, [logits, labels], "numba")
    assert out_t.item() == out_n.item() == float("inf")
    torch.testing.assert_close(g_n, g_t, rtol=RTOL, atol=ATOL)


def test_cross_entropy_one_token_and_all_ignored():
    logits = torch.randn(1, 5)
    _assert_parity(objectives.cross_entropy, [logits, torch.tensor([2])])
    out, (grad,) = _run(objectives.cross_entropy, [logits, torch.tensor([-100])], "numba")
    assert torch.isnan(out) and torch.all(grad == 0), "0/0 is NaN with a zero gradient, as in torch"


def test_cross_entropy_loss_scaled_backward_and_no_grad_path():
    logits = torch.randn(4, 11, requires_grad=True)
    labels = torch.tensor([1, 2, 3, -100])
    (3.0 * objectives.cross_entropy(logits, labels, backend="numba")).backward()
    expected = torch.autograd.grad(3.0 * F.cross_entropy(logits, labels), logits)[0]
    torch.testing.assert_close(logits.grad, expected, rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        assert objectives.cross_entropy(logits, labels, backend="numba").item() == pytest.approx(
            F.cross_entropy(logits, labels).item(), rel=RTOL)


def test_a_second_backward_through_the_fused_gradient_is_refused():
    logits = torch.randn(3, 5, requires_grad=True)
    loss = objectives.cross_entropy(logits, torch.tensor([0, 1, 2]), backend="numba")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()


@pytest.mark.parametrize("vocab", [1, 13])
def test_sequence_logprob_matches_torch(vocab):
    gen = torch.Generator().manual_seed(3 + vocab)
    logits = torch.randn(3, 6, vocab, generator=gen) * 4
    labels = torch.randint(0, vocab, (3, 6), generator=gen)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, :2] = 0
    mask[2] = 0  # a fully masked row: log-prob 0, no gradient
    labels[mask == 0] = -100
    logits[1, 2, (labels[1, 2] + 1) % vocab] = float("-inf") if vocab > 1 else logits[1, 2, 0]
    logits[1, 3] *= 2500  # logits of order 1e4
    out, (grad,) = _assert_parity(objectives.sequence_logprob, [logits, labels, mask])
    assert out[2].item() == 0.0 and torch.all(grad[2] == 0)


def test_sequence_logprob_one_token():
    logits = torch.randn(1, 1, 4)
    _assert_parity(objectives.sequence_logprob, [logits, torch.tensor([[3]]), torch.tensor([[1]])])


def test_sequence_logprob_of_strided_logits_matches_torch():
    logits = torch.randn(2, 5, 9)
    labels = torch.randint(0, 9, (2, 4))
    _assert_parity(lambda x, y, m, backend: objectives.sequence_logprob(x[:, :-1], y, m, backend=backend),
                   [logits, labels, torch.ones(2, 4, dtype=torch.long)])


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_empty_batch_is_a_clear_error(backend):
    with pytest.raises(ValueError, match="empty"):
        objectives.cross_entropy(torch.empty(0, 5), torch.empty(0, dtype=torch.long), backend=backend)
    with pytest.raises(ValueError, match="empty"):
        objectives.sequence_logprob(torch.empty(0, 3, 5), torch.empty(0, 3, dtype=torch.long), torch.empty(0, 3),
                                    backend=backend)


def test_numba_backend_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="label 7 .* outside the vocabulary"):
        objectives.cross_entropy(torch.randn(2, 5), torch.tensor([1, 7]), backend="numba")
    with pytest.raises(ValueError, match="fp32"):
        objectives.cross_entropy(torch.randn(2, 5, dtype=torch.float64), torch.tensor([1, 2]), backend="numba")
    with pytest.raises(ValueError, match="backend"):
        objectives.cross_entropy(torch.randn(2, 5), torch.tensor([1, 2]), backend="jax")


def test_sequence_logprob_backward_twice_and_without_grad():
    logits = torch.randn(2, 3, 6, requires_grad=True)
    labels = torch.randint(0, 6, (2, 3))
    mask = torch.ones(2, 3, dtype=torch.long)
    seq = objectives.sequence_logprob(logits, labels, mask, backend="numba")
    (first,) = torch.autograd.grad(seq.sum(), logits, retain_graph=True)
    (second,) = torch.autograd.grad(seq.sum(), logits)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(objectives.sequence_logprob(logits, labels, mask, backend="numba"), seq.detach())


def test_gradient_workspace_reuses_only_buffers_nobody_holds():
    logits = torch.randn(4, 9, requires_grad=True)
    objectives.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), backend="numba").backward()
    held = logits.grad[1:]  # a view keeps the first gradient's buffer alive
    expected = held.clone()
    logits.grad = None
    objectives.cross_entropy(logits, torch.tensor([8, 7, 6, 5]), backend="numba").backward()
    assert torch.equal(held, expected), "a gradient still referenced is never overwritten"
    second = logits.grad.data_ptr()
    del held
    logits.grad = None
    objectives.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), backend="numba").backward()
    freed = {second, logits.grad.data_ptr()}
    logits.grad = None
    objectives.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), backend="numba").backward()
    assert logits.grad.data_ptr() in freed, "a released buffer is reused instead of page-faulting a new one"


def test_gradient_workspace_stays_bounded_when_shapes_vary():
    from training_assets.trainers.numba_ops import GradientWorkspace

    workspace = GradientWorkspace(capacity=2)
    held = [workspace.take((2, 3)), workspace.take((4, 5)), workspace.take((6, 7))]  # three in use at once
    assert len(workspace._buffers) == 2
    held.pop(0)
    workspace.take((8, 9))  # evicts the released (2, 3) buffer instead of growing
    assert sorted(b.shape for b in workspace._buffers) == [(4, 5), (8, 9)]
