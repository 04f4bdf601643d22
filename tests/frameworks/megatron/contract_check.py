"""Run rendered pretrain_gpt.py argument lists through Megatron's own argument checks.

Usage (one process per megatron-core version, with that version first on PYTHONPATH):
    PYTHONPATH=.contract/megatron-0.19.2 python contract_check.py runs.json
`runs.json` is a list of {"id", "argv", "env"}: argv is launch/megatron.args without comments,
env the launcher's exports plus WORLD_SIZE and RANK as torchrun sets them (parse_args reads
both from the environment). For each run it calls, as pretrain_gpt.py does before it builds the
model: megatron.training.arguments.parse_args (sys.argv set, ignore_unknown_args=False), then
validate_args, then core_transformer_config_from_args (TransformerConfig.__post_init__ checks
the layout against the model). It prints one JSON list of {"id", "ok", "error", "resolved"} on
stdout, `resolved` being what Megatron made of the arguments (parallel sizes, recompute, dtype),
and `layers_per_stage` the decoder layers it builds on each pipeline rank.

This machine has no GPU, no Transformer Engine and no triton, so four things are stood in,
each only as far as the checks need (and parse_args gets a copy of a parser built once, for
speed):
- typing.override (Python 3.12; megatron-core >= 0.17 requires Python >= 3.12 and this test's
  interpreter is 3.11): a backport that returns the function unchanged, as 3.12's does.
- triton: megatron-core 0.19 imports its MoE paged-stash kernels
  (core/transformer/moe/ops/paged_stash.py, @triton.jit functions) at import time; torch's CUDA
  wheels bring triton, the CPU wheel does not. That one module is replaced by a stub whose
  kernels raise if called; argument checking never calls them.
- the GPU: validate_args asks torch.cuda for the compute capability (--moe-grouped-gemm) and the
  architecture (CUDA_DEVICE_MAX_CONNECTIONS before Blackwell). It is answered as an H100
  (9.0), the GPU the sweeps target.
- Transformer Engine's version: TransformerConfig checks TE versions for fp8 and MoE; the
  launcher requires TE (--transformer-impl transformer_engine), so the check answers as if
  TE ASSUMED_TE is installed, with its fused RoPE kernels present (stubs that raise if called).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Final

ASSUMED_TE: Final = "2.12.0"  # a Transformer Engine release of 2026 (megatron-core 0.19's time)
H100: Final = (9, 0)


def _backport_override() -> None:
    """typing.override is Python 3.12; CI's Python is 3.11 (a backport, not a behaviour change:
    3.12's override only sets __override__ and returns the function)."""
    if not hasattr(typing, "override"):
        def override(function: Any) -> Any:
            with contextlib.suppress(AttributeError, TypeError):
                function.__override__ = True
            return function
        typing.override = override  # type: ignore[attr-defined]


def _stub_triton_kernels() -> None:
    """Without triton, stand in for the one megatron-core module that needs it at import time."""
    if importlib.util.find_spec("triton") is not None:
        return
    name = "megatron.core.transformer.moe.ops.paged_stash"

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is a stub of llm-sweep's contract check (no triton here)")

    stub = types.ModuleType(name)
    stub.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]
    stub.paged_stash_copy_kernel = kernel  # type: ignore[attr-defined]
    stub.paged_stash_pop_kernel = kernel  # type: ignore[attr-defined]
    stub.__all__ = ["GLOBAL_BLOCK_SIZE", "paged_stash_copy_kernel",  # type: ignore[attr-defined]
                    "paged_stash_pop_kernel"]
    sys.modules[name] = stub


def _answer_as_h100() -> None:
    import torch

    def capability(device: Any = None) -> tuple[int, int]:
        return H100

    def properties(device: Any = None) -> Any:
        return types.SimpleNamespace(major=H100[0], minor=H100[1], name="NVIDIA H100 (stand-in)")

    torch.cuda.get_device_capability = capability  # type: ignore[assignment]
    torch.cuda.get_device_properties = properties  # type: ignore[assignment]


def _assume_transformer_engine() -> None:
    """TE's version, and its fused RoPE kernels that TransformerConfig asks for (apply_rope_fusion
    is on by default: "apply_rope_fusion is not available. Please install TE >= 1.4.")."""
    import megatron.core.utils as core_utils
    from megatron.core.models.common.embeddings import rope_utils
    from packaging.version import Version

    core_utils._te_version = Version(ASSUMED_TE)  # get_te_version() caches the version here

    def te_kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a stand-in of Transformer Engine's kernel (llm-sweep contract check)")

    for name in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        if getattr(rope_utils, name, None) is None:
            setattr(rope_utils, name, te_kernel)


def _build_parser_once(arguments: Any) -> None:
    """parse_args builds Megatron's whole parser (~0.5 s, most of the check's time) on every call:
    build it once and hand parse_args a copy each time. parse_args itself runs unchanged."""
    import copy

    built = arguments.add_megatron_arguments(
        argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False))

    def add_megatron_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return copy.deepcopy(built)

    arguments.add_megatron_arguments = add_megatron_arguments


def resolved(args: Any) -> dict[str, Any]:
    """What Megatron made of the arguments, for the test to compare with the run's label."""
    return {
        "tp": args.tensor_model_parallel_size, "pp": args.pipeline_model_parallel_size,
        "cp": args.context_parallel_size, "ep": args.expert_model_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "vpp": args.virtual_pipeline_model_parallel_size or 1,
        "sp": bool(args.sequence_parallel),
        "distributed_optimizer": bool(args.use_distributed_optimizer),
        "recompute": args.recompute_granularity or "none",
        "micro_batches": args.global_batch_size // (args.micro_batch_size
                                                    * args.data_parallel_size),
        "params_dtype": str(args.params_dtype).removeprefix("torch."),
        "fp8": args.fp8,
        "overlap_grad_reduce": bool(args.overlap_grad_reduce),
        "overlap_param_gather": bool(args.overlap_param_gather),
        "tp_comm_overlap": bool(args.tp_comm_overlap),
        "num_experts": args.num_experts or 0,
        "untied": bool(args.untie_embeddings_and_output_weights),
    }


def check(run: dict[str, Any], checks: Any) -> dict[str, Any]:
    """Megatron's verdict on one argument list: ok, or the error it raised."""
    parse_args, validate_args, config_from_args = checks
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update({k: str(v) for k, v in run["env"].items()})
    sys.argv = ["pretrain_gpt.py", *run["argv"]]
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            args = parse_args(None, ignore_unknown_args=False)
            validate_args(args, {})
            config = config_from_args(args)
            seen = resolved(args)
            layers = layers_per_stage(config, args)
    except SystemExit as error:  # argparse: an unknown or malformed argument
        lines = [line for line in output.getvalue().splitlines() if "error" in line]
        return {"id": run["id"], "ok": False,
                "error": f"argparse exit {error.code}: {' '.join(lines[-1:]) or output.getvalue()[-500:]}"}
    except Exception as error:  # noqa: BLE001 - every rejection is reported, not raised
        return {"id": run["id"], "ok": False, "error": f"{type(error).__name__}: {error}"}
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
    return {"id": run["id"], "ok": True, "error": None, "resolved": seen,
            "layers_per_stage": layers}


def layers_per_stage(config: Any, args: Any) -> list[int]:
    """The decoder layers Megatron builds on each pipeline rank (get_num_layers_to_build, which
    applies --account-for-embedding/loss-in-pipeline-split), over all its virtual stages."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    chunks = args.virtual_pipeline_model_parallel_size
    return [sum(get_num_layers_to_build(config, vp_stage=chunk, pp_rank=rank)
                for chunk in (range(chunks) if chunks else [None]))
            for rank in range(args.pipeline_model_parallel_size)]


def main(path: str) -> int:
    _backport_override()
    _stub_triton_kernels()
    _answer_as_h100()
    import warnings

    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        # 0.17 defines core_transformer_config_from_args here; 0.19 re-exports it here.
        from megatron.training import arguments
        from megatron.training.arguments import (
            core_transformer_config_from_args,
            parse_args,
            validate_args,
        )
    _assume_transformer_engine()
    _build_parser_once(arguments)
    runs = json.loads(Path(path).read_text())
    results = [check(run, (parse_args, validate_args, core_transformer_config_from_args))
               for run in runs]
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
