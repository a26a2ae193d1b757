"""rotary_embedding and its backward through the CPU kernels: Hugging Face's apply_rotary_pos_emb in PyTorch
(bit for bit), both layouts, (B, H, S, D) and (B, S, H, D) with unsqueeze_dim, position_ids tables, partial
rotary dims, GQA, 3-d inputs, the backward against autograd and finite differences, and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_grad import assert_gradient, numerical_vjp
from strategies import uniform, views

import xpuruntime as xrt
from xpuruntime.errors import DTypeError, ShapeError
from xpuruntime.ops.rotary import reference
from xpuruntime.ops.rotary_backward import reference as backward_reference

torch = pytest.importorskip("torch")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def hf_rotary(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, interleaved=False):
    """transformers' apply_rotary_pos_emb (Llama; GPT-J's rotate_every_two when interleaved), with partial
    rotary as GPT-NeoX / Phi apply it (the dims past cos.shape[-1] pass through)."""
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotate = rotate_every_two if interleaved else rotate_half
    r = cos.shape[-1]

    def apply(x):
        x_rot, x_pass = x[..., :r], x[..., r:]
        return torch.cat((x_rot * cos + rotate(x_rot) * sin, x_pass), dim=-1)

    return apply(q), apply(k)


def llama_tables(batch: int, seq: int, dim: int, dtype: torch.dtype, base: float = 10000.0):
    """cos, sin as LlamaRotaryEmbedding returns them: (batch, seq, dim), frequencies duplicated."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    positions = torch.arange(seq, dtype=torch.float32)[None].expand(batch, seq)
    emb = torch.cat([positions[..., None] * inv_freq] * 2, dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


CASES = [  # q shape, k shape, unsqueeze_dim, rotary dim, interleaved, position table rows (None: no ids)
    ((2, 8, 9, 16), (2, 2, 9, 16), 1, 16, False, None),  # Llama GQA, (B, H, S, D)
    ((2, 9, 8, 16), (2, 9, 2, 16), 2, 16, False, None),  # (B, S, H, D)
    ((2, 4, 9, 16), (2, 4, 9, 16), 1, 8, False, None),  # partial rotary (GPT-NeoX / Phi)
    ((2, 4, 9, 16), (2, 4, 9, 16), 1, 16, True, None),  # GPT-J's interleaved pairs
    ((2, 4, 9, 12), (2, 1, 9, 12), 1, 12, False, 20),  # position_ids into a (20, 12) table
    ((2, 9, 4, 12), (2, 9, 1, 12), 2, 6, True, 20),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_hf_bit_for_bit(case, dtype):
    q_shape, k_shape, unsqueeze_dim, rotary, interleaved, table = CASES[case]
    q, k = (torch.randn(s, dtype=torch.float64).to(dtype) for s in (q_shape, k_shape))
    seq = q_shape[2] if unsqueeze_dim == 1 else q_shape[1]
    position_ids = None
    if table is None:
        cos, sin = llama_tables(q_shape[0], seq, rotary, dtype)
    else:
        cos, sin = (torch.randn(table, rotary, dtype=torch.float64).to(dtype) for _ in range(2))
        position_ids = torch.randint(0, table, (q_shape[0], seq))
    got = xrt.ops.rotary_embedding(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved)
    want = hf_rotary(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved)
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.is_contiguous()
        assert torch.equal(g, w)


def test_fp32_tables_with_half_q_round_once():
    """Under autocast HF's q is bf16/fp16 and its cos fp32: the formula runs in fp32 (PyTorch promotes), and
    the attention after it casts back; here the result comes in q's dtype at once, the same values."""
    q, k = (torch.randn(1, 4, 7, 8, dtype=torch.float64).to(torch.float16) for _ in range(2))
    cos, sin = llama_tables(1, 7, 8, torch.float32)
    got = xrt.ops.rotary_embedding(q, k, cos, sin)
    want = hf_rotary(q, k, cos, sin)
    assert got[0].dtype == torch.float16 and want[0].dtype == torch.float32
    assert torch.equal(got[0], want[0].to(torch.float16)) and torch.equal(got[1], want[1].to(torch.float16))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_backward_matches_autograd(case):
    q_shape, k_shape, unsqueeze_dim, rotary, interleaved, table = CASES[case]
    q, k = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in (q_shape, k_shape))
    seq = q_shape[2] if unsqueeze_dim == 1 else q_shape[1]
    cos, sin = (torch.randn(table or 1, *(() if table else (seq,)), rotary, dtype=torch.float64) for _ in "cs")
    position_ids = torch.randint(0, table, (q_shape[0], seq)) if table else None
    yq, yk = hf_rotary(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved)
    dq, dk = torch.randn_like(yq), torch.randn_like(yk)
    want = torch.autograd.grad((yq, yk), (q, k), (dq, dk))
    got = xrt.ops.rotary_embedding_backward(dq, dk, cos, sin, position_ids, unsqueeze_dim, interleaved)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
def test_backward_reference_is_the_forward_gradient(rng, interleaved):
    q, k = rng.standard_normal((1, 2, 3, 6)), rng.standard_normal((1, 1, 3, 6))
    cos, sin = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 4))
    dq, dk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    packed = backward_reference(dq, dk, cos, sin, None, 1, interleaved)
    upstream = np.concatenate([dq.ravel(), dk.ravel()])
    f = lambda q_, k_: reference(q_, k_, cos, sin, None, 1, interleaved)  # noqa: E731
    assert_gradient(packed[: q.size].reshape(q.shape), numerical_vjp(f, (q, k), 0, upstream), "grad_q")
    assert_gradient(packed[q.size :].reshape(k.shape), numerical_vjp(f, (q, k), 1, upstream), "grad_k")


def test_positions_outside_the_table_give_nan_rows(rng):
    q, k = rng.standard_normal((1, 2, 4, 8)).astype(np.float32), rng.standard_normal((1, 1, 4, 8)).astype(np.float32)
    table = rng.standard_normal((5, 8)).astype(np.float32)
    qe, ke = xrt.ops.rotary_embedding(q, k, table, table, np.array([[0, 5, -1, 4]]))
    assert np.isnan(qe[:, :, 1:3]).all() and np.isnan(ke[:, :, 1:3]).all()
    assert not np.isnan(qe[:, :, [0, 3]]).any()


def test_out_buffer_and_3d_inputs(rng):
    q, k = rng.standard_normal((4, 6, 8)).astype(np.float32), rng.standard_normal((2, 6, 8)).astype(np.float32)
    cos, sin = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((6, 8)).astype(np.float32)
    out = np.full(q.size + k.size, np.nan, np.float32)
    qe, ke = xrt.ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim=0, out=out)  # (S, D) -> (1, S, D)
    assert np.shares_memory(qe, out) and np.shares_memory(ke, out) and not np.isnan(out).any()
    want = reference(q, k, cos, sin, None, 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_errors(rng):
    q, k = np.ones((1, 2, 3, 8), np.float32), np.ones((1, 1, 3, 8), np.float32)
    cos = np.ones((1, 3, 8), np.float32)
    with pytest.raises(ShapeError, match="rotary_embedding: argument 'cos' expected an even last dimension"):
        xrt.ops.rotary_embedding(q, k, cos[..., :5], cos[..., :5])
    with pytest.raises(ShapeError, match="rotary_embedding: argument 'sin' expected shape"):
        xrt.ops.rotary_embedding(q, k, cos, cos[:, :2])
    with pytest.raises(ShapeError, match="rotary_embedding: argument 'k' expected q's shape"):
        xrt.ops.rotary_embedding(q, np.ones((1, 1, 4, 8), np.float32), cos[:, :1], cos[:, :1])
    with pytest.raises(ShapeError, match="rotary_embedding: argument 'q' expected leading dims that cos"):
        xrt.ops.rotary_embedding(q, k, np.ones((1, 5, 8), np.float32), np.ones((1, 5, 8), np.float32))
    with pytest.raises(ShapeError, match="rotary_embedding: argument 'unsqueeze_dim' expected a value in"):
        xrt.ops.rotary_embedding(q, k, cos, cos, unsqueeze_dim=-1)
    with pytest.raises(DTypeError, match="rotary_embedding: argument 'position_ids' expected an integer dtype"):
        xrt.ops.rotary_embedding(q, k, cos[0], cos[0], np.zeros((1, 3), np.float32))
    with pytest.raises(ShapeError, match="rotary_embedding: argument 'cos' expected a 2-d table"):
        xrt.ops.rotary_embedding(q, k, cos, cos, np.zeros((1, 3), np.int64))
    with pytest.raises(DTypeError, match="rotary_embedding: argument 'k' expected dtype float32"):
        xrt.ops.rotary_embedding(q, k.astype(np.float16), cos, cos)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64", "float16"]), interleaved=st.booleans())
def test_property(data, dtype, interleaved):
    """Random layouts of q, k, cos and sin (strided, reversed, transposed, broadcast...), head counts, partial
    rotary and both unsqueeze axes."""
    b, s, d = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 5)), 2 * data.draw(st.integers(1, 5))
    hq, hk = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    r = 2 * data.draw(st.integers(1, d // 2))
    bshd = data.draw(st.booleans(), label="(B, S, H, D)")
    q_shape, k_shape = ((b, s, hq, d), (b, s, hk, d)) if bshd else ((b, hq, s, d), (b, hk, s, d))
    q, k = (data.draw(views(shape, dtype, uniform(-2, 2))) for shape in (q_shape, k_shape))
    cos, sin = (data.draw(views((data.draw(st.sampled_from([1, b])), s, r), dtype, uniform(-1, 1))) for _ in "cs")
    if cos.shape != sin.shape:
        sin = np.broadcast_to(sin, cos.shape) if sin.shape[0] == 1 else sin[:1]
    unsqueeze = 2 if bshd else 1
    got = np.concatenate([g.ravel() for g in xrt.ops.rotary_embedding(q, k, cos, sin, None, unsqueeze, interleaved)])
    tol = {"float16": 4e-3, "float32": 1e-6, "float64": 1e-13}[dtype]
    np.testing.assert_allclose(got, reference(q, k, cos, sin, None, unsqueeze, interleaved), rtol=tol, atol=tol)
    grads = xrt.ops.rotary_embedding_backward(q, k, cos, sin, None, unsqueeze, interleaved)
    want = backward_reference(q, k, cos, sin, None, unsqueeze, interleaved)
    np.testing.assert_allclose(np.concatenate([g.ravel() for g in grads]), want, rtol=tol, atol=tol)
