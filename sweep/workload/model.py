"""The benchmark model: a Llama-style decoder (RMSNorm, RoPE, GQA attention through SDPA, SwiGLU).

The module tree uses torchtitan's names (tok_embeddings, layers.<i>.attention.wq, feed_forward.w1,
norm, output), so that tensor-parallel plans and pipeline splits address it the same way.
`layers` is a ModuleDict keyed by the global layer index: a pipeline stage deletes the layers it
does not own and keeps the others' names. A stage without the embedding takes hidden states in,
a stage without the output layer hands hidden states on.

Context parallelism on CPU uses the all-gather-K/V fallback in `Attention` (see
PyTorch-on-CPU measurements (torch 2.13): `context_parallel()` has no CPU SDPA sharding strategy).
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sweep.core.model import ModelShape

ROPE_THETA = 10000.0
INIT_STD = 0.02


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the compute dtype, as Llama does.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (len(positions), head_dim/2) for rotary embeddings."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                                  device=positions.device) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, seq, heads, head_dim) by position; pairs are (even, odd) channels."""
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    return rotated.type_as(x)


class ContextParallel:
    """Where this rank's sequence chunk sits, and the group that holds the other chunks."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        self.group, self.rank, self.size = group, rank, size


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.head_dim = shape.head_dim
        self.n_rep = shape.num_attention_heads // shape.num_kv_heads
        self.wq = nn.Linear(shape.hidden_size, shape.q_dim, bias=False)
        self.wk = nn.Linear(shape.hidden_size, shape.kv_dim, bias=False)
        self.wv = nn.Linear(shape.hidden_size, shape.kv_dim, bias=False)
        self.wo = nn.Linear(shape.q_dim, shape.hidden_size, bias=False)
        self.cp: ContextParallel | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Under sequence parallelism x arrives here gathered, so seq is the full (CP-local) length.
        offset = self.cp.rank * seq if self.cp is not None else 0
        cos, sin = rope_tables(self.head_dim, torch.arange(offset, offset + seq, device=x.device))
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = apply_rope(self.wq(x).view(batch, seq, -1, self.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(batch, seq, -1, self.head_dim), cos, sin)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = self._core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
        if self.cp is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self._context_parallel_core(q, k, v, self.cp)

    @staticmethod
    def _context_parallel_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cp: ContextParallel) -> torch.Tensor:
        """All-gather K/V over the cp group (Llama-3 style; not ring attention, no load balancing).

        Its backward sums the full K/V gradients over the group and keeps this rank's chunk.
        """
        k_full = _GatherSequence.apply(k, cp)
        v_full = _GatherSequence.apply(v, cp)
        local = q.shape[2]
        rows = torch.arange(local, device=q.device)[:, None] + cp.rank * local
        cols = torch.arange(k_full.shape[2], device=q.device)[None, :]
        return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=cols <= rows)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 (the sequence of a (batch, heads, seq, dim) tensor); gloo-friendly.

    gloo has no reduce-scatter, so the backward all-reduces and slices (fine at CP sizes).
    """

    @staticmethod
    def forward(ctx, chunk: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
        ctx.cp = cp
        if chunk.is_meta:  # pipeline stages infer shapes with meta tensors: nothing to send
            return torch.cat([chunk] * cp.size, dim=2)
        parts = [torch.empty_like(chunk) for _ in range(cp.size)]
        dist.all_gather(parts, chunk.contiguous(), group=cp.group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        cp: ContextParallel = ctx.cp
        grad = grad.contiguous()
        dist.all_reduce(grad, group=cp.group)
        return grad.chunk(cp.size, dim=2)[cp.rank].contiguous(), None


class FeedForward(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=False)
        self.w3 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(shape.ffn_hidden_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(shape.hidden_size)
        self.attention = Attention(shape)
        self.ffn_norm = RMSNorm(shape.hidden_size)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        if shape.is_moe:
            raise ValueError(f"model {shape.name!r}: the built-in workload trains dense models only "
                             f"(num_experts={shape.num_experts}); pick a dense model")
        self.shape = shape
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(shape) for i in range(shape.num_layers)})
        self.norm: RMSNorm | None = RMSNorm(shape.hidden_size)
        self.output: nn.Linear | None = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def layer_range(num_layers: int, stage: int, num_stages: int) -> range:
    """Contiguous layers of one pipeline stage; the first stages take one more when it does not
    divide."""
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def keep_stage(model: Transformer, stage: int, num_stages: int) -> Transformer:
    """Drop, in place, what pipeline stage `stage` of `num_stages` does not run (names unchanged)."""
    keep = {str(i) for i in layer_range(model.shape.num_layers, stage, num_stages)}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != num_stages - 1:
        model.norm = None
        model.output = None
    return model


def build(shape: ModelShape, seed: int, device: torch.device | str = "cpu", *, stage: int = 0,
          num_stages: int = 1) -> Transformer:
    """What pipeline stage `stage` of `num_stages` runs, made on `device` and initialised.

    Why not build the whole model and split it: every rank then made and drew every parameter of
    the model in host memory, 4 bytes per parameter per rank. On an H200 node that was 18.4 s of
    a 27.6 s start-up for a 1.2B model (benchmarks/cuda_workload.py), and a 70B model could not
    start at all. The module tree is built on the meta device instead (no memory, no default
    initialisation), the stage keeps its part, and only that part is materialised and drawn.
    """
    with torch.device("meta"):
        model = Transformer(shape)
    if num_stages > 1:
        keep_stage(model, stage, num_stages)
    model.to_empty(device=device)
    if shape.tie_word_embeddings and model.output is not None and model.tok_embeddings is not None:
        model.output.weight = model.tok_embeddings.weight  # to_empty makes a new tensor of each
    init_weights(model, seed)
    return model


def parameter_seed(seed: int, name: str) -> int:
    """The seed of one parameter's generator: from the run's seed and the parameter's name."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_weights(model: Transformer, seed: int) -> None:
    """Deterministic initialisation from `seed`, each parameter from its own generator.

    The generator is seeded by the parameter's name (`parameter_seed`), and names are global
    (layers keep their index on every stage), so every layout and every pipeline stage draws the
    same values for the same parameter, while a rank draws only what it holds. The values
    depend on the device type (CPU and CUDA generators differ), never on the layout.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            std = INIT_STD / math.sqrt(2 * model.shape.num_layers) if name.endswith(
                ("wo.weight", "w2.weight")) else INIT_STD
            generator = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
            param.normal_(0.0, std, generator=generator)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))
