"""best-config-changes names the real cause: the convention only when conventions disagree.

MFU = tokens/s/GPU × FLOPs per token ÷ peak. When every convention picks one run and tokens/s per
GPU another, the convention is not to blame: the runs divide by different peaks (CPU runs that
measured their own), or count different FLOPs per token.
"""

from __future__ import annotations

from analysis.flags import selection_flags


def test_conventions_that_agree_against_tokens_per_sec_blame_the_peak(run_row, make_runs) -> None:
    runs = make_runs([run_row("low-peak", 500.0, peak=1.0e11),          # MFU 60 %, slower
                      run_row("high-peak", 700.0, tp=2, peak=2.0e11)])  # MFU 42 %, faster
    for metric in ("mfu", "tokens_per_sec_per_gpu"):
        (flag,) = selection_flags(runs, metric, "full_attention")
        assert (flag.kind, flag.model, flag.nodes) == ("best-config-changes", "tiny-4l", 1)
        assert ("Cause: the peak FLOP/s, not the FLOPs convention: every FLOPs convention picks "
                "the same run") in flag.message, metric
        assert "DP2 TP1 PP1 GAS2 MBS2 ZeRO-0: 0.1 TFLOP/s, measured:matmul" in flag.message
        assert "Cause: the FLOPs convention" not in flag.message
    (flag,) = selection_flags(runs, "mfu", "full_attention")
    assert flag.message.startswith("MFU (full_attention), MFU (reported), MFU (megatron), MFU (6N) "
                                   "pick DP2 TP1 PP1 GAS2 MBS2 ZeRO-0; tokens/s per GPU picks "
                                   "DP1 TP2 PP1 GAS4 MBS2 ZeRO-0.")


def test_conventions_that_agree_against_tokens_per_sec_with_one_peak_blame_flops_per_token(
        run_row, make_runs) -> None:
    """A cell that mixes sequence lengths: the longer one counts more FLOPs per token."""
    longer = {f"flops_per_token_{c}": 2 * v for c, v in
              (("megatron", 1.0e8), ("full_attention", 1.2e8), ("6N", 0.9e8), ("reported", 1.2e8))}
    slow = run_row("long-seq", 500.0, seq_len=256, **longer)
    for column in ("megatron", "full_attention", "6N", "reported"):
        slow[f"mfu_{column}"] = 500.0 * longer[f"flops_per_token_{column}"] / 2.0e11
    runs = make_runs([slow, run_row("short-seq", 800.0, tp=2)])
    (flag,) = selection_flags(runs, "mfu", "full_attention")
    assert ("Cause: the FLOPs per token: under full_attention the first counts 0.24 GFLOP/token "
            "and the second 0.12") in flag.message
    assert "peak" not in flag.message and "Cause: the FLOPs convention" not in flag.message


def test_conventions_that_disagree_among_themselves_blame_the_convention(run_row, make_runs) -> None:
    """The reported MFU of one run counts 50 % more FLOPs per token (another basis)."""
    inflated = run_row("inflated", 1000.0, pp=2, mfu_reported=0.9, flops_per_token_reported=1.8e8)
    runs = make_runs([inflated, run_row("faster", 1100.0)])
    (flag,) = selection_flags(runs, "mfu", "reported")
    assert flag.message.startswith("MFU (reported) picks DP1 TP1 PP2 GAS4 MBS2 ZeRO-0; MFU "
                                   "(megatron), MFU (full_attention), MFU (6N), tokens/s per GPU "
                                   "pick DP2 TP1 PP1 GAS2 MBS2 ZeRO-0.")
    assert "Cause: the FLOPs convention. The reported MFU counts 0.18 GFLOP/token" in flag.message
    assert "not on one basis, so the faster run loses on reported MFU" in flag.message
    assert "peak" not in flag.message
    assert selection_flags(runs, "mfu", "full_attention")[0].message.count("Cause:") == 1


def test_one_peak_and_one_basis_raise_no_flag(run_row, make_runs) -> None:
    runs = make_runs([run_row("a", 500.0), run_row("b", 700.0, tp=2)])
    assert selection_flags(runs, "mfu", "reported") == []
    assert selection_flags(runs, "tokens_per_sec_per_gpu", "6N") == []
