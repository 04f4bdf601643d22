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


def test_on_cpu_conventions_that_agree_against_tokens_per_sec_blame_the_wait_for_a_core(
        run_row, make_runs) -> None:
    """Two runs with one peak and one FLOPs count: the slower one waited for a core for half of
    each step, so over its on-core time it used the cores better, and MFU ranks it first."""
    def waited(run_id: str, wall_rate: float, step_s: float, wait_s: float, **extra) -> dict:
        on_core = wall_rate * step_s / (step_s - wait_s)
        row = run_row(run_id, on_core, step_time_mean_s=step_s, cpu_wait_mean_s=wait_s, **extra)
        return {**row, "tokens_per_sec_per_gpu": wall_rate}

    runs = make_runs([waited("crowded", 500.0, 0.4, 0.2), waited("alone", 700.0, 0.3, 0.0, tp=2)])
    (flag,) = selection_flags(runs, "mfu", "full_attention")
    assert ("Cause: the wait for a core, not the FLOPs convention: every FLOPs convention picks "
            "the same run") in flag.message
    assert "DP2 TP1 PP1 GAS2 MBS2 ZeRO-0 waited 50 % of its step time" in flag.message
    assert "peak" not in flag.message.split("Cause:")[1]


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


def test_a_cell_with_a_straggler_run_is_flagged_with_the_run_and_its_node(run_row, make_runs) -> None:
    from analysis.flags import straggler_flags

    runs = make_runs([
        run_row("slow", 900.0, nodes=2, straggler_node="node2", straggler_ratio=1.45,
                straggler_factor=1.2),
        run_row("fine", 800.0, nodes=2, tp=2, straggler_ratio=1.02, straggler_factor=1.2),
        run_row("one-node", 700.0)])
    flags = straggler_flags(runs)
    assert [(f.kind, f.model, f.nodes) for f in flags] == [("straggler", "tiny-4l", 2)]
    assert "slow#1" in flags[0].message and "node node2 took 1.45×" in flags[0].message
    assert "fine#1" not in flags[0].message and "factor 1.2" in flags[0].message


def test_the_report_marks_a_cell_whose_best_run_had_a_straggler_node(run_row, make_runs, tmp_path,
                                                                   svg_words) -> None:
    from analysis.heatmap import STRAGGLER_MARK
    from analysis.report import write_report

    runs = make_runs([
        run_row("slow", 900.0, nodes=2, straggler_node="node2", straggler_ratio=1.45,
                straggler_factor=1.2),
        run_row("fine", 800.0, nodes=2, tp=2, straggler_ratio=1.02, straggler_factor=1.2),
        run_row("one-node", 700.0)])
    report = write_report(runs, tmp_path / "report")
    figure = svg_words(tmp_path / "report" / "heatmap_best.svg")
    assert f"{STRAGGLER_MARK} slow node: node2" in figure  # the 2-node cell's winner, "slow"
    assert figure.count(f"{STRAGGLER_MARK} slow node: node") == 1  # the 1-node cell is not marked
    assert f"{STRAGGLER_MARK} slow node: the cell's best run had a straggler node" in figure
    assert any(f.kind == "straggler" for f in report.flags)
    assert "straggler" in (tmp_path / "report" / "flags.md").read_text()
    assert "node node2 took 1.45×" in (tmp_path / "report" / "index.html").read_text()
