"""GPU workloads of the warm-start benchmark (§1 with ``--device cuda``).

A max-autotune MLP in two precisions, a
transformer block forward+backward with coordinate-descent tuning, and dynamic-shape graphs.
Sizes are kept small enough that a cold compile takes about a minute. Each workload returns
``{"ok": bool}`` (compiled output close to eager).

§12 (:mod:`benchmarks.s12_models`) adds GPT-2 small (``gpt2``: Hugging Face ``transformers``,
built from ``GPT2Config``, no weights) and the DDP training step its ranks run
(:func:`ddp_training`, :mod:`benchmarks._ddp_child`).
"""

from __future__ import annotations

from typing import Any

import torch  # imported by the warm-start child after torch (``--device cuda``)


def mlp_autotune(torch: Any) -> dict[str, Any]:
    """Two linear layers compiled with ``mode="max-autotune-no-cudagraphs"`` in bf16 and fp16:
    GEMM template autotuning (autotune timings), pointwise epilogues."""
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1024)
        ).to("cuda", dtype).eval()
        compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
        x = torch.randn(512, 1024, device="cuda", dtype=dtype)
        with torch.no_grad():
            ok &= bool(torch.allclose(compiled(x).float(), model(x).float(), atol=5e-2, rtol=5e-2))
    return {"ok": ok}


class Block(torch.nn.Module):
    """A pre-norm transformer block (attention via SDPA, GELU MLP). At module level: torch's
    caching precompile (§10) saves only modules whose class it can import by name."""

    def __init__(self, dim: int = 512, heads: int = 8) -> None:
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def transformer_block(torch: Any) -> dict[str, Any]:
    """Forward + backward of a transformer block in bf16 with
    ``coordinate_descent_tuning=True`` (runtime coordinate descent of pointwise/reduction
    kernels; best configs)."""
    from torch._inductor import config as inductor_config

    torch.manual_seed(0)
    block = Block().to("cuda", torch.bfloat16)
    x = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with inductor_config.patch(coordinate_descent_tuning=True):
        compiled = torch.compile(block)
        out = compiled(x)
        out.float().pow(2).mean().backward()
    ref = block(x)
    return {"ok": bool(torch.allclose(out.float(), ref.float(), atol=1e-1, rtol=1e-1)) and x.grad is not None}


def _softmax(x: Any) -> Any:
    y = (x - x.amax(-1, keepdim=True)).exp()
    return y / y.sum(-1, keepdim=True)


def _silu_mean(x: Any, w: Any) -> Any:
    return torch.nn.functional.silu(x * w + 1.0).square().mean(0)


def dynamic(torch: Any) -> dict[str, Any]:
    """Dynamic-shape graphs: a softmax-like reduction and a fused pointwise chain over three
    sizes (``dynamic=True``)."""
    f, g = _softmax, _silu_mean
    cf, cg = torch.compile(f, dynamic=True), torch.compile(g, dynamic=True)
    ok = True
    for rows in (256, 1000, 4096):
        x = torch.randn(rows, 768, device="cuda")
        w = torch.randn(768, device="cuda")
        ok &= bool(torch.allclose(cf(x), f(x), atol=1e-4, rtol=1e-3))
        ok &= bool(torch.allclose(cg(x, w), g(x, w), atol=1e-4, rtol=1e-3))
    return {"ok": ok}


def gpt2(torch: Any) -> dict[str, Any]:
    """GPT-2 small (``GPT2LMHeadModel(GPT2Config())``: 12 layers, 768 wide, random weights,
    dropout off) in bf16: a training step (forward with the LM loss, backward; AdamW outside
    the compiled graph), then inference at 128 and 512 tokens. Default ``torch.compile``
    settings, as most users start. Raises ImportError without ``transformers``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).to("cuda", torch.bfloat16)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 256), device="cuda")
    model.train()
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ok = bool(torch.isfinite(loss).item())
    model.eval()
    with torch.no_grad():
        for length in (128, 512):
            x = torch.randint(0, config.vocab_size, (4, length), device="cuda")
            got, ref = compiled(x).logits.float(), model(x).logits.float()
            ok &= bool((got - ref).abs().max().item() <= 0.1 * ref.abs().max().item())
    return {"ok": ok}


class TwoBlocks(torch.nn.Module):
    """Two :class:`Block` s: the model the DDP ranks train."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())

    def forward(self, x: Any) -> Any:
        return self.blocks(x)


def ddp_training(torch: Any, rank: int) -> dict[str, float | bool]:
    """What each rank of :mod:`benchmarks._ddp_child` compiles: a DDP-wrapped two-block
    transformer training step in bf16 with ``coordinate_descent_tuning=True`` (forward,
    backward with DDP's gradient all-reduce, an SGD step), then a max-autotune MLP in bf16.
    Returns the first calls in seconds (``ddp_step`` and ``mlp_autotune``; of the step,
    ``ddp_forward`` and ``ddp_backward``, each up to a ``torch.cuda.synchronize()``) and ``ok``."""
    import time

    from torch._inductor import config as inductor_config
    from torch.nn.parallel import DistributedDataParallel

    seconds: dict[str, float | bool] = {}
    torch.manual_seed(0)
    model = DistributedDataParallel(TwoBlocks().to("cuda", torch.bfloat16), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    x = torch.randn(8, 256, 512, device="cuda", dtype=torch.bfloat16)
    t = time.perf_counter()
    with inductor_config.patch(coordinate_descent_tuning=True):
        compiled = torch.compile(model)
        loss = compiled(x).float().pow(2).mean()
        torch.cuda.synchronize()
        seconds["ddp_forward"] = time.perf_counter() - t
        loss.backward()
        torch.cuda.synchronize()
        seconds["ddp_backward"] = time.perf_counter() - t - seconds["ddp_forward"]
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    seconds["ddp_step"] = time.perf_counter() - t
    ok = bool(torch.isfinite(loss).item())

    t = time.perf_counter()
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(),
                              torch.nn.Linear(2048, 1024)).to("cuda", torch.bfloat16).eval()
    cmlp = torch.compile(mlp, mode="max-autotune-no-cudagraphs")
    y = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out = cmlp(y)
        torch.cuda.synchronize()
        seconds["mlp_autotune"] = time.perf_counter() - t
        ok &= bool(torch.allclose(out.float(), mlp(y).float(), atol=5e-2, rtol=5e-2))
    seconds["ok"] = ok
    return seconds


WORKLOADS = {"mlp_autotune": mlp_autotune, "transformer": transformer_block, "dynamic_gpu": dynamic, "gpt2": gpt2}
