"""The chaos suite's upload and step-end kinds (issue 43, vast_harness/chaos/upload.py): a key file and credential
files in the workdir (none of their bytes on the simulated host's sandbox, each named as left out), and a
command that leaves a process running in the background (the step ends on its exit status, the run within its
caps).

Every scenario runs the real CLI in its own process against the simulator and is judged by the simulator's record
and the host's own files. The default suite checks the registration and the judge's reading; each (kind, variant)
is one slow test (`-m slow -k 'daemon and setup'`), and the whole family runs in the full chaos suite.
"""

from __future__ import annotations

import pytest

from vast_harness import chaos
from vast_harness.chaos.account import VARIANTS, AccountPlan
from vast_harness.chaos.suite import ACCOUNT_OFFSET

CASES = [(kind, variant) for kind in chaos.UPLOAD_SCENARIOS for variant in VARIANTS[kind]]


def test_the_upload_kinds_are_account_kinds_drawn_by_the_suite_with_every_variant():
    assert set(chaos.UPLOAD_SCENARIOS) <= set(chaos.ACCOUNT_KINDS)
    assert {"secret_on_host", "not_named", "step_held"} <= set(chaos.VIOLATION_KINDS)
    drawn = {(p.kind, p.variant) for p in (chaos.draw_account(s) for s in range(400))}
    assert set(CASES) <= drawn, set(CASES) - drawn
    suite = [chaos.draw_account(chaos.scenario_seed(1, ACCOUNT_OFFSET + k)) for k in range(len(chaos.ACCOUNT_KINDS))]
    assert set(chaos.UPLOAD_SCENARIOS) <= {p.kind for p in suite}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("kind", "variant"), CASES)
def test_upload_scenario_holds_every_invariant(kind: str, variant: str):
    outcome = chaos.run_account(AccountPlan(seed=43, kind=kind, variant=variant))  # type: ignore[arg-type]
    assert not outcome.violations, (outcome.summary(), [v.detail[:500] for v in outcome.violations],
                                    outcome.log[-3000:])
    assert outcome.exit_codes == [0] and outcome.instances == 1
