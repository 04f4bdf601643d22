"""The built-in benchmark workload: a Llama-style trainer on PyTorch's own parallelism APIs.

`python -m sweep.workload --run-dir DIR [--attempt-dir DIR]` reads DIR/run.json and trains the
configured layout (dp, tp+sp, pp, cp, ZeRO 0-3, grad accumulation, recomputation) with gloo on CPU
or NCCL on GPUs, writing metrics.jsonl on rank 0. Modules: model (the decoder), data (synthetic
batches), parallel (mesh, TP, ZeRO), pipeline (PP), train (the loop), metrics (records),
memory_tracking (per-rank memory and the cap), peak (dense peak FLOP/s).
"""
