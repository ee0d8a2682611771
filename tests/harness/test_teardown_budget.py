"""The teardown margin's shares, pinned to the figures they had when they lived in six files."""

from __future__ import annotations

import pytest

from vast_harness.timings import TeardownBudget, Timings


@pytest.mark.parametrize("margin_s", [0.0, 2.0, 15.0, 40.0, 120.0, 200.0])
def test_every_share_of_the_margin_is_computed_from_it(margin_s):
    budget = TeardownBudget(margin_s=margin_s)
    assert budget.prelude_s == 0.5 * margin_s
    assert budget.guard_s == 0.25 * margin_s
    assert budget.pull_grace_s == min(30.0, 0.25 * margin_s)
    assert budget.sftp_stall_s == min(30.0, max(1.0, 0.25 * margin_s))
    assert budget.guard_s <= budget.prelude_s <= margin_s  # the guard fires after a teardown on time began


def test_the_fixed_floors_keep_their_values():
    assert (TeardownBudget.SIGNAL_PULL_MAX_S, TeardownBudget.SIGNAL_DELETE_WITHIN_S) == (0.5, 1.0)
    assert TeardownBudget.DELETE_ATTEMPT_MIN_S == 0.25
    assert TeardownBudget.PROOF_READ_MIN_S == 0.5
    assert TeardownBudget.CONNECT_ATTEMPT_MIN_S == 0.25


def test_the_timings_tables_hand_out_their_margins_budget():
    assert Timings.real().teardown_budget.prelude_s == 60.0
    assert Timings.sim().teardown_budget.guard_s == 3.75
