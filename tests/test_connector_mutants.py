"""The connector suite's sampler (bench/connector_mutants.py): one mutant per function, drawn
the same way every time, each a file that compiles and differs from the original where it says."""

from __future__ import annotations

import ast
import textwrap

from bench.connector_mutants import mutate, points, sample

SOURCE = textwrap.dedent(
    '''
    import logging

    logger = logging.getLogger(__name__)
    LIMIT = 3


    def hits(keys, ready):
        """How many keys, from the first, are ready."""
        n = 0
        for key in keys:
            if key not in ready:
                break
            n += 1
        return n


    class Conn:
        def offer(self, keys, done):
            logger.debug("offering %d", len(keys))
            new = [k for k in keys if k not in done and len(k) > 0]
            done.update(new)
            return new

        def reset(self):
            self.jobs = {}
    '''
)


def test_one_mutant_per_function_the_same_every_time():
    drawn = sample(SOURCE)
    assert [m.function for m in drawn] == ["hits", "Conn.offer", "Conn.reset"]
    assert drawn == sample(SOURCE)
    assert sample(SOURCE, seed=1) != drawn or len(points(SOURCE)) == len(drawn)


def test_no_point_in_logging_calls_docstrings_or_module_code():
    found = points(SOURCE)
    assert found and all(m.function in ("hits", "Conn.offer", "Conn.reset") for m in found)
    lines = SOURCE.splitlines()
    for m in found:
        assert "logger." not in lines[m.line - 1], m
        assert '"""' not in lines[m.line - 1], m


def test_each_mutant_compiles_and_changes_its_function_only():
    original = ast.dump(ast.parse(SOURCE))
    for m in points(SOURCE):
        text = mutate(SOURCE, m)
        compile(text, "mutant", "exec")
        assert ast.dump(ast.parse(text)) != original, m
        changed = {
            n.name
            for n, o in zip(ast.walk(ast.parse(text)), ast.walk(ast.parse(SOURCE)))
            if isinstance(n, ast.FunctionDef) and ast.dump(n) != ast.dump(o)
        }
        assert changed <= {m.function.split(".")[-1]}, (m, changed)
