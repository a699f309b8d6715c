"""What a request may ask for, and how a profile holds it: network entries in the contract,
in the profiles' `network_allow` and `network_approval`. Above the sandbox (no run starts)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import execbox
from execbox.errors import UsageError
from execbox.policy import load_profiles
from execbox.request import make_request


@pytest.fixture(scope="module")
def fake() -> Iterator[execbox.Executor]:
    from execbox.testing import FakeSandbox
    from tests.fakes import literal_handler

    profiles = load_profiles()
    profiles["apis"] = profiles["data"].model_copy(
        update={"name": "apis", "network_allow": ["*.example.com", "10.0.0.0/8:8080"]}
    )
    with execbox.Executor(
        backend=FakeSandbox(literal_handler), cache=False, profiles=profiles
    ) as ex:
        yield ex


@pytest.mark.parametrize(
    "network",
    [[], ["127.1"], ["api.test:0"], ["api.test:http"], ["*.com"], ["a b"], ["10.0.0.0/33"], ["*"]],
)
def test_malformed_network_entries_are_usage_errors(network: list[str]) -> None:
    with pytest.raises(UsageError, match="network"):
        make_request("print(1)", network=network)


def test_network_none_is_the_default_and_entries_are_kept() -> None:
    assert make_request("print(1)").network == "none"
    asked = ["API.example.com", "[::1]:8080", "10.0.0.0/8"]
    assert make_request("print(1)", network=asked).network == [
        "api.example.com",
        "[::1]:8080",
        "10.0.0.0/8",
    ]


def test_a_profile_without_network_allow_denies_any_network(fake: execbox.Executor) -> None:
    result = fake.run("print(1)", network=["api.example.com"])
    assert result.status == "policy_denied"
    assert result.error is not None and result.error.rule == "network.not_allowed"
    # the advice names a profile that would take it
    assert "'extended'" in result.error.message


@pytest.mark.parametrize(
    ("network", "rule"),
    [
        (["api.example.com"], None),
        (["*.api.example.com"], None),
        (["10.1.2.3:8080"], None),
        (["api.example.org"], "network.entry"),
        (["example.com"], "network.entry"),  # a wildcard covers the names under it only
        (["api.example.com:8443"], "network.entry"),  # the pattern's ports are 80 and 443
        (["10.1.2.3"], "network.entry"),  # ports 80 and 443 are not 8080
        (["11.0.0.1:8080"], "network.entry"),
        (["api.example.com", "evil.test"], "network.entry"),
    ],
)
def test_request_entries_must_fall_within_the_profile(
    fake: execbox.Executor, network: list[str], rule: str | None
) -> None:
    result = fake.run("print(1)", network=network, profile="apis")
    if rule is None:
        assert result.status == "ok", result
    else:
        assert result.status == "policy_denied"
        assert result.error is not None and result.error.rule == rule


def test_network_approval_holds_network_runs_only(fake: execbox.Executor) -> None:
    held = fake.run("print(1)", network=["api.example.com"], profile="extended")
    assert held.status == "needs_approval"
    assert held.error is not None and held.error.rule == "network.approval"
    assert fake.run("print(1)", profile="extended").status == "ok"
    released = fake.approve(held.run_id)
    assert released.status == "ok"
    record = fake.store.get(released.run_id)
    assert record is not None and record.network == ["api.example.com"]


def test_denied_code_stays_denied_under_network_approval(fake: execbox.Executor) -> None:
    profiles = load_profiles()
    strict = profiles["minimal"].model_copy(
        update={"name": "strict", "network_allow": ["*"], "network_approval": True}
    )
    from execbox.policy.checker import check

    request = make_request("import socket", network=["api.example.com"], profile="strict")
    verdict = check(request, {"strict": strict})
    assert (verdict.decision, verdict.rule) == ("deny", "import.deny")


def test_profile_network_patterns_are_checked_when_loaded(tmp_path: object) -> None:
    profiles = load_profiles()
    with pytest.raises(ValueError, match="network entry"):
        type(profiles["data"]).model_validate(
            {**profiles["data"].model_dump(), "network_allow": ["not a host"]}
        )
