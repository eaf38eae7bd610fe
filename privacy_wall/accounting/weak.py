"""Where protection becomes weak: budgets and jobs above WEAK_EPSILON need an explicit confirmation (issue
55). Imports nothing, so the CLI's parser can name the threshold without loading the accountants.

Epsilon-DP bounds how much one record's presence can change the odds of any outcome: by a factor of at most
e^epsilon (plus delta). At epsilon 10 that factor is e^10, about 22,000: an observer's odds on a record's
presence may move from 1 : 1,000 to 22 : 1. Such a release protects little, so asking for one by a typo
(1000 for 1.0, or epsilon 500 to make a job fit) should not go through silently; the deployments of
differential privacy with published parameters mostly use epsilon below 10 per release or per day.
"""

from __future__ import annotations

#: Budgets and jobs on private data above this epsilon need weak_privacy_ok (API) / --weak-privacy-ok (CLI).
WEAK_EPSILON = 10.0
#: The field and flag that confirm it.
WEAK_FIELD = "weak_privacy_ok"
WEAK_FLAG = "--weak-privacy-ok"


def weak_privacy_problem(
    what: str, epsilon: float, confirmed: bool, how: str = f"{WEAK_FIELD} (the CLI's {WEAK_FLAG})"
) -> str | None:
    """Why `what` at `epsilon` needs the confirmation `how` (the API's field or the CLI's flag), or None."""
    if confirmed or not epsilon > WEAK_EPSILON:
        return None
    return (
        f"{what} of epsilon {epsilon:.4g} is above {WEAK_EPSILON:g}: it lets one record change the odds of "
        f"any outcome by a factor of up to e^{epsilon:.3g}, so it protects little; give {how} to confirm "
        "that this is meant (docs/design.md, 'Weak protection')"
    )
