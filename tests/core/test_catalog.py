"""The catalog: devices as drivers name them map to catalog entries, and a run on another GPU
type than its spec's is named, since its MFU would divide by the wrong peak."""

from __future__ import annotations

import pytest

from sweep.core.catalog import device_gpu, gpu_mismatch


@pytest.mark.parametrize(("device", "entry"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # nvidia-smi's and torch.cuda's name
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA RTX 9000 Unknown", None),
])
def test_a_device_name_finds_its_catalog_entry(device: str, entry: str | None) -> None:
    found = device_gpu(device)
    assert (found.name if found else None) == entry


def test_a_mismatch_names_both_types_and_the_fix() -> None:
    assert gpu_mismatch("h100-sxm", ["NVIDIA H100 80GB HBM3"] * 8) is None
    assert gpu_mismatch("h100-sxm", ["NVIDIA RTX 9000 Unknown"]) is None  # nothing to compare
    assert gpu_mismatch("not-in-catalog", ["NVIDIA H200"]) is None
    message = gpu_mismatch("h100-sxm", ["NVIDIA H200", "NVIDIA H200"])
    assert message is not None
    assert "the spec says h100-sxm, but this node has NVIDIA H200 (catalog h200)" in message
    assert "Set gpu to the node's type" in message
