"""The CEL subset the CI identity tests rely on behaves as the CEL spec says."""

from __future__ import annotations

import pytest

from policy.cel import CelError, CelSyntaxError, evaluate

CLAIMS = {"assertion": {"ref": "refs/heads/main", "id": "7"}}


def test_equality_conjunction_and_conditional() -> None:
    assert evaluate("assertion.id == '7' && assertion.ref == \"refs/heads/main\"", CLAIMS) is True
    assert evaluate("assertion.id != '7' || !(assertion.ref == 'x')", CLAIMS) is True
    assert evaluate("has(assertion.env) ? assertion.env : 'none'", CLAIMS) == "none"


def test_a_missing_claim_is_an_error_unless_the_other_side_decides() -> None:
    with pytest.raises(CelError):
        evaluate("assertion.env == 'prod'", CLAIMS)
    with pytest.raises(CelError):
        evaluate("assertion.id == '7' && assertion.env == 'prod'", CLAIMS)
    # CEL's && and || are commutative over errors (cel-spec langdef.md, "Logical Operators").
    assert evaluate("assertion.env == 'prod' && assertion.id == '8'", CLAIMS) is False
    assert evaluate("assertion.env == 'prod' || assertion.id == '7'", CLAIMS) is True
    # The conditional evaluates only the branch it takes.
    assert evaluate("has(assertion.env) && assertion.env == 'x' ? assertion.env : 'n'",
                    CLAIMS) == "n"


@pytest.mark.parametrize("text", [
    "assertion.id in ['7']", "assertion.id.matches('7')", "assertion.id == 7",
    "'a\\'b' == 'x'", "assertion.id ==", "(assertion.id == '7'",
])
def test_anything_outside_the_subset_is_refused(text: str) -> None:
    with pytest.raises((CelSyntaxError, CelError)):
        evaluate(text, CLAIMS)


def test_the_iam_condition_functions() -> None:
    roles: list[str] = ["roles/logging.logWriter"]
    variables = {"api": {"getAttribute": lambda name, default: roles if name == "m" else default},
                 "resource": {"name": "projects/_/buckets/b-logs"}}
    assert evaluate("api.getAttribute('m', []).hasOnly(['roles/logging.logWriter', 'x'])",
                    variables) is True
    roles.append("roles/owner")
    assert evaluate("api.getAttribute('m', []).hasOnly(['roles/logging.logWriter'])",
                    variables) is False
    assert evaluate("api.getAttribute('other', []).hasOnly([])", variables) is True
    assert evaluate("resource.name.startsWith('projects/_/buckets/b-') && "
                    "resource.name.endsWith('-logs')", variables) is True
    assert evaluate("resource.name.endsWith('-data') || resource.name == 'x'", variables) is False
