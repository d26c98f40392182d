"""The vLLM adapter goes by capability (spec §10), tested without vLLM through
the stand-in of tests/fake_vllm.py: a manager without ``touch`` is still checked, no touch step
is ever drawn for it, and the report says what the adapter found missing."""

from __future__ import annotations

import re

import pytest

from kvgate.cli import main
from kvgate.impl.base import make_key
from kvgate.properties.adapters import Config, TargetError
from kvgate.properties.engines.vllm.adapter import resolve_vllm
from kvgate.properties.manager_machine import make_machine
from kvgate.properties.runner import run_machine
from kvgate.properties.targets import resolve_target

NO_TOUCH = "vllm=tests.fake_vllm:FakeManagerWithoutTouch"
WITH_TOUCH = "vllm=tests.fake_vllm:FakeManager"


def test_a_manager_without_touch_is_named_and_never_touched():
    target = resolve_vllm(NO_TOUCH)
    assert target.missing == frozenset({"touch"})
    assert "lacks touch (never drawn)" in target.note
    adapter = target.make(Config(num_chunks=2, store_threshold=2, max_tracker_size=4))
    assert adapter.missing == frozenset({"touch"})
    with pytest.raises(TargetError, match="has no touch"):
        adapter.touch([make_key(b"A")], adapter.new_context("r"))


def test_a_manager_with_touch_lacks_nothing():
    target = resolve_vllm(WITH_TOUCH)
    assert target.missing == frozenset()
    assert "has every optional call" in target.note


def test_events_with_newer_fields_read_as_plain_events():
    adapter = resolve_vllm(NO_TOUCH).make(
        Config(num_chunks=2, store_threshold=1, max_tracker_size=4)
    )
    ctx = adapter.new_context("r")
    key = make_key(b"A")
    out = adapter.prepare_store([key], ctx)
    adapter.complete_store(out[0], ctx)
    assert [tuple(e) for e in adapter.take_events()] == [((key,), False, False, True, ctx)]


def test_the_gate_checks_a_manager_without_touch_and_says_so(capsys):
    code = main(
        [
            "check",
            "--target",
            NO_TOUCH,
            "--machine",
            "all",
            "--profile",
            "ci",
            "--max-examples",
            "60",
            "--steps",
            "20",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"target {NO_TOUCH}: tests.fake_vllm.FakeManagerWithoutTouch;" in out
    assert "lacks touch (never drawn)" in out
    coverage = out.split("coverage (manager):")[1].split("\n")[0]
    assert re.search(r"(: |, )touch \d", coverage) is None, coverage  # no touch step drawn


def test_a_native_target_lacking_touch_is_checked_without_it(capsys):
    target = resolve_target("tests.fake_vllm:ImplWithoutTouch")
    assert target.missing == frozenset({"touch"}) and "lacks touch" in target.note
    code = main(
        [
            "check",
            "--target",
            "tests.fake_vllm:ImplWithoutTouch",
            "--profile",
            "ci",
            "--max-examples",
            "40",
            "--steps",
            "20",
        ]
    )
    assert code == 0, capsys.readouterr().out


def test_store_events_must_name_their_request_where_the_release_carries_one():
    """Events are compared with what they carry: a release whose events have ``req_context``
    must name the request whose store completed (the stand-in above passes with it)."""
    machine = make_machine(resolve_vllm("vllm=tests.fake_vllm:FakeStoreEventWithoutRequest"))
    result = run_machine(machine, "ci", max_examples=300, database=None)
    assert not result.passed
    assert "(event details differ)" in result.message, result.message
