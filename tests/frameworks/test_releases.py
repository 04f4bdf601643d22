"""The support matrix's freshness table: what it records, and how releases are ordered."""

from __future__ import annotations

import pytest

from sweep.frameworks import all_adapters
from sweep.frameworks.matrix import freshness_table
from sweep.frameworks.releases import RELEASES_CHECKED, is_newer, release_key


def test_every_framework_has_the_newest_release_it_was_checked_against() -> None:
    assert sorted(check.framework for check in RELEASES_CHECKED) == sorted(
        adapter.name for adapter in all_adapters())


def test_each_newest_checked_release_is_contract_tested_or_refused_by_name() -> None:
    """A newer release may not sit in the table unexamined: it is tested, or the job refuses it
    and the table says so (nanotron's PyPI release); the built-in workload's torch is the
    package index's newest torch, recorded, whatever the tests run on."""
    adapters = {adapter.name: adapter for adapter in all_adapters()}
    for check in RELEASES_CHECKED:
        if check.framework == "builtin":
            continue
        tested = {version.split()[-1] for supported in adapters[check.framework].versions
                  for version in supported.tested_with}  # "megatron-core 0.19.2": its number
        assert check.newest in tested or check.newest in check.refused, check


def test_no_tested_release_is_newer_than_the_newest_one_checked() -> None:
    adapters = {adapter.name: adapter for adapter in all_adapters()}
    for check in RELEASES_CHECKED:
        for supported in adapters[check.framework].versions:
            for tested in supported.tested_with:
                version = tested.split()[-1]
                if "." in version:  # a release, not a commit hash
                    assert not is_newer(version, check.newest), (check, tested)


def test_dates_are_iso_days_and_a_check_is_not_older_than_the_release() -> None:
    for check in RELEASES_CHECKED:
        assert len(check.released_on) == len(check.checked_on) == 10
        assert check.released_on <= check.checked_on


@pytest.mark.parametrize(("newer", "older"), [("0.20.0", "0.19.2"), ("0.19.10", "0.19.2"),
                                              ("1.0", "0.99.9"), ("0.4.1", "0.4"),
                                              ("2.15.0", "2.14.1")])
def test_releases_are_ordered_by_number_not_by_text(newer: str, older: str) -> None:
    assert is_newer(newer, older)
    assert not is_newer(older, newer)


def test_trailing_zeros_do_not_make_a_release_newer() -> None:
    assert release_key("0.4") == release_key("0.4.0")
    assert not is_newer("0.4.0", "0.4")


def test_a_version_that_is_not_a_number_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a release number"):
        release_key("main")


def test_the_freshness_table_has_a_row_per_framework_with_its_dates() -> None:
    table = freshness_table().splitlines()
    assert len(table) == 2 + len(RELEASES_CHECKED)
    for check in RELEASES_CHECKED:
        assert any(f"| {check.framework} | `{check.package}` | {check.newest} | "
                   f"{check.released_on} | {check.checked_on} |" in row for row in table)
