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


def test_the_whole_language_not_a_subset() -> None:
    """cel-python, not a hand-written subset: `in`, escapes, size, matches work."""
    assert evaluate("assertion.id in ['7', '8']", CLAIMS) is True
    assert evaluate("'a\\'b' == \"a'b\"", CLAIMS) is True
    assert evaluate("size(assertion.ref) == 15 && assertion.ref.matches('^refs/heads/')",
                    CLAIMS) is True


@pytest.mark.parametrize("text", [
    "assertion.id ==", "(assertion.id == '7'", "assertion.id.lowerAscii() == '7'",
    "myFunction(assertion.id)", "assertion.ref.split('/')[0] == 'refs'",
])
def test_what_google_refuses_is_refused(text: str) -> None:
    with pytest.raises(CelSyntaxError):
        evaluate(text, CLAIMS)


def test_a_type_mismatch_is_an_error_value() -> None:
    with pytest.raises(CelError):
        evaluate("assertion.id + 1 == 8", CLAIMS)


def test_the_iam_condition_functions() -> None:
    roles: list[str] = ["roles/logging.logWriter"]
    variables = {"resource": {"name": "projects/_/buckets/b-logs"}}
    attributes = {"m": roles}
    assert evaluate("api.getAttribute('m', []).hasOnly(['roles/logging.logWriter', 'x'])",
                    variables, attributes) is True
    roles.append("roles/owner")
    assert evaluate("api.getAttribute('m', []).hasOnly(['roles/logging.logWriter'])",
                    variables, {"m": roles}) is False
    assert evaluate("api.getAttribute('other', []).hasOnly([])", variables, attributes) is True
    assert evaluate("resource.name.startsWith('projects/_/buckets/b-') && "
                    "resource.name.endsWith('-logs')", variables) is True
    assert evaluate("resource.name.endsWith('-data') || resource.name == 'x'", variables) is False
