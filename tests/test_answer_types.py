"""The declared-type check of the connector's answers (properties/engines/vllm/answer_types.py):
what conforms to the annotations vLLM's connectors declare, and a wrapped method that answers
off its declaration failing the checks. Runs without vLLM."""

from typing import Any

from kvgate.properties.engines.vllm.answer_types import conforms, watch_answers
from kvgate.properties.engines.vllm.checks import Checks


def test_the_types_connectors_declare():
    hit = tuple[int | None, bool]
    assert conforms((3, False), hit) and conforms((None, True), hit)
    assert not conforms((3, None), hit)  # None where a bool is declared
    assert not conforms([3, False], hit) and not conforms((3,), hit)
    assert conforms(False, bool) and not conforms(None, bool) and not conforms(0, bool)
    assert conforms(True, int) and conforms(2, float)  # PEP 484's numeric tower
    assert not conforms(2.5, int) and not conforms("2", int)
    held = tuple[bool, dict[str, Any] | None]
    assert conforms((False, None), held) and conforms((True, {"a": 1}), held)
    assert not conforms(None, held) and not conforms((False, {1: 1}), held)
    assert conforms({"a": 1}, dict[str, int]) and not conforms({"a": "1"}, dict[str, int])
    assert conforms([1, 2], list[int]) and not conforms([1, None], list[int])
    assert conforms((1, 2, 3), tuple[int, ...]) and not conforms((1, "2"), tuple[int, ...])
    assert conforms(None, None) and not conforms(0, type(None))
    assert conforms(ValueError(), Exception) and not conforms(1, Exception)


class _Connector:
    def has_pending_push_work(self) -> bool:
        return self.answer

    def get_num_new_matched_tokens(self, request, num_computed) -> tuple[int | None, bool]:
        return (num_computed, False)

    def _private(self) -> bool:
        return None  # type: ignore[return-value]  # private methods are not watched


def test_an_answer_off_its_declaration_fails_the_checks():
    conn = _Connector()
    conn.answer = False
    checks = Checks(2, lambda key: False, lambda key: key.hex())
    watch_answers(conn, checks)
    assert conn.has_pending_push_work() is False and conn.get_num_new_matched_tokens(0, 4)
    assert conn._private() is None and not checks.failure
    conn.answer = None
    assert conn.has_pending_push_work() is None  # the answer goes back as it was
    assert checks.failure == (
        "the connector's has_pending_push_work() answered None, not the bool it declares"
    )
