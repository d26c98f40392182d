"""Regenerate docs/upstream.md from real installs: kvgate's verdict on each vLLM release CI gates.

    python docs/make_upstream.py [--envs DIR] [--out FILE]

For each release of .ci/vllm-releases.txt whose environment exists (built by
``.ci/vllm-venv VERSION DIR/VERSION``; DIR defaults to .vllm), it runs in that environment
``kvgate check --target vllm --profile ci`` (the default gate: it stops at the first machine
that fails), the same through vLLM's own scheduler (``--machine vllm-scheduler``) and, for each
reproduction under docs/repro/, the plain-Python script; for 0.34.0 also the gate on the patched
manager of releases/vllm_mends.py under ``ci`` and ``thorough``, every machine. Every figure
in the page is read off those runs.
Exit 2 (one line) when no release environment exists.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from releases.vllm import PATCHED, built, gate_facts, releases, run_python  # noqa: E402 - needs ROOT on the path

# Why the gate is right where a release differs: the seed's claim each verdict rests on.
ARGUMENTS = {
    "0.33.0": "The seed's bug. The seed's claim: each key counts once per request, so a "
    "request's retry after `None` and its re-offer after a preemption must not count "
    "again. 0.33.0 counts every offer, so one request alone gets a key admitted. Its "
    "connector has one more defect, outside the rule, which vLLM's scheduler machine reaches "
    "on the hybrid (Mamba) layout: a second cache reset before the engine steps again, while "
    "jobs were in flight at the first, raises an AssertionError (`reset_cache` asserts that no "
    "flush is pending, and the first reset left its flush set for the next step), so the "
    "client's reset fails. 0.34.0's connector documents the case (a previous reset's flush set "
    "may still be pending; the new ids are merged into it), so upstream's own design says the "
    "second reset must succeed (`docs/repro/vllm_0_33_0_reset_twice.py` below). The mended "
    "0.33.0 target (releases/vllm_mends.py) carries that merge beside the counting fix, "
    "and the mends of the defects it shares with 0.34.0 (argued there): the window chunk "
    "stored with its first block unwritten, the recurrent group's hit counted a block short, "
    "the drafter's key offered twice in a step and a request's offload cap before its "
    "recurrent state's hand-off raising.",
    "0.34.0": "The seed's fix is in (`counted_keys` in the per-request record), and where our "
    "first spec guessed differently (a key the tracker dropped enters again with "
    "count 1, also for a request that counted it before) upstream's choice is safe, "
    "and [spec A2](spec.md#a2) now follows it. One place remains where the seed is on the gate's "
    'side: "stores_skipped counts a key\'s skip once per request". 0.34.0 dedups a '
    "skip by the keys the request has *counted*, so a request that had a key "
    "admitted (then its store failed or it was evicted, and the tracker dropped it) "
    "and later skips it never counts that skip: the metric undercounts ([spec A5](spec.md#a5), "
    "amended). Putting only that right makes every property hold (below), checked exactly: "
    "evictions and their order, chunk ids, the policy's order, every metric and interface "
    "answer, through kvgate's machines and through vLLM's own scheduler; so this is the "
    "manager's only disagreement with the rule that the gate finds. The connector beside it "
    "has one more, found by the bytes worker (spec [§7.2](spec.md#s7-2)) and shared with "
    "0.33.0: a cache reset that leaves a request running sends that request's next chunk to "
    "store back to 0, while the connector marks the block ids its sliding window freed as "
    "stale only from that index on, so the request then stores its first chunks from blocks "
    "that were handed to another request: the CPU tier holds other KV under their keys "
    "(`docs/repro/vllm_window_reset_store.py` below). The vLLM scheduler machine draws no "
    "such reset on a sliding-window layout, so that this defect does not hide the others."
    " A third, found by the bytes worker on a layout the machine does not yet draw (a window "
    "of 4 tokens keeping 2 below it, 2 blocks a chunk) and shared by 0.33.0 and 0.34.0: the "
    "connector widens a window's store mask by the kept tokens and stores a window chunk "
    "whose first block is the null block (a GPU prefix-cache hit left it out of the request's"
    " window), and a later request whose hit ends at that chunk loads the unwritten block "
    "into the window it attends to (`docs/repro/vllm_window_kept_tokens_load.py` below). "
    "Storing a window chunk whole or not at all puts it right, and the mended targets carry "
    "that mend (releases/vllm_mends.py, `whole_window_chunks`), so the machine now draws "
    "the layout. A fourth, found on the hybrid (Mamba) layout and shared by 0.33.0 and 0.34.0, "
    "is in the GPU block accounting the connector's hits feed: `allocate_slots` documents that "
    "it answers `None` when the free blocks do not cover a request, and a request admitted "
    "with tokens the connector loads, holding no block of the recurrent group yet, is counted "
    "one state block (the group's count reserves one block where the allocation takes one "
    "for the loaded state and one for the running state), so with the pool's free blocks "
    'exactly the count the step raises "Cannot get 1 free blocks from the pool" and the '
    "engine ends (`docs/repro/vllm_recurrent_hit_block_count.py` below). A pool that just "
    "holds its longest request is the usual sizing, so a long prompt's CPU hit meets it. The "
    "mended targets reserve the loaded state's block too (`external_state_counted`). A "
    "fifth, on a drafter's (EAGLE) group beside a recurrent group, shared too: the partial "
    "tail's store job keys the drafter's group at the boundary plus the drafter's proof "
    "margin, which can be the end of a whole chunk that the same step's whole-chunk store job "
    "names, so one request offers that key twice in one step "
    "(`docs/repro/vllm_drafter_tail_offered_twice.py` below). The seed's claim is that a "
    "request's own repeated offers must not count, and the connector's design skips "
    "aligned-boundary keys that a whole-chunk job stores; a manager that counts every offer "
    "(0.33.0's) counts the request twice. The mended targets leave out of a request's later "
    "offers in a step a key it had accepted earlier in that step (`one_offer_a_step`). A "
    "sixth, beside a recurrent group too and shared: a request may cap the tokens the "
    "connector offloads for it (`max_offload_tokens` in its `kv_transfer_params`, a "
    "non-negative int), and the whole-chunk stores honour the cap, but when the GPU prefix "
    "cache hands the request's recurrent state off at a boundary past the cap (a prefix "
    "another request computed), the partial-tail store path asserts that no boundary lies "
    "past the cap, and the AssertionError ends the engine "
    "(`docs/repro/vllm_offload_cap_below_tail.py` below); with a cap of 0 the same path reads "
    "the cap as unset and offers the tail. The cap is documented as experimental, but it is "
    "read from any client's request, so one request can end the engine for all. The mended "
    "targets leave a hand-off past the cap unstored, as the whole-chunk stores leave the "
    "chunks past it (`offload_cap_on_tails`); the vLLM scheduler machine draws no cap beside a "
    "recurrent group, so that this defect does not hide the others.",
}


def run(python: Path, *args: str) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = run_python(python, *args)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def check(python: Path, *args: str) -> tuple[int, str, float]:
    """``kvgate check ARGS`` in the release's environment."""
    return run(python, "-m", "kvgate", "check", *args)


def fence(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"


def section(version: str, python: Path) -> tuple[str, str]:
    code, out, seconds = check(python, "--target", "vllm", "--profile", "ci")
    facts = gate_facts(out)
    verdict = {0: "passes", 1: "fails", 2: "cannot be checked"}.get(code, f"exit {code}")
    row = (
        f"| {version} | {verdict} (exit {code}) | {facts['steps'] or '-'} | {seconds:.1f} | "
        f"{facts['why'] or '-'} |"
    )
    parts = [f"## vLLM {version}", "", f"Adapter: `{facts['note']}`.", ""]
    if version in ARGUMENTS:
        parts += [ARGUMENTS[version], ""]
    parts += [
        f"`kvgate check --target vllm --profile ci`: exit {code} in {seconds:.1f} s"
        + (
            f", a counterexample of {facts['steps']} steps ({facts['why']})."
            if facts["steps"]
            else "."
        ),
        "",
    ]
    if facts["counterexample"]:
        parts += ["As kvgate prints it:", "", fence(facts["counterexample"]), ""]
    rc, text, secs = check(
        python,
        "--target",
        "vllm",
        "--machine",
        "vllm-scheduler",
        "--profile",
        "ci",
    )
    through = gate_facts(text)
    if through["steps"] and not through["why"]:
        # not a divergence but the release's own code raising (a defect below names it)
        first = through["counterexample"].splitlines()[1:2]
        through["why"] = first[0].split(" during ")[0] if first else ""
    parts += [
        f"Through vLLM's own scheduler and offloading connector (`--machine vllm-scheduler`): "
        f"exit {rc} in {secs:.1f} s"
        + (
            f", a counterexample of {through['steps']} steps ({through['why']}), printed as "
            "the engine events that lead to it:"
            if through["steps"]
            else "."
        ),
        "",
    ]
    if through["counterexample"]:
        parts += [fence(through["counterexample"]), ""]
    for script in sorted((ROOT / "docs" / "repro").glob("vllm_*.py")):
        rc, text, _ = run(python, str(script.relative_to(ROOT)))
        shown = "\n".join(ln for ln in text.splitlines() if "Warning" not in ln)
        parts += [
            f"Plain Python, `{script.relative_to(ROOT)}` against {version} (exit {rc}):",
            "",
            fence(shown),
            "",
        ]
    if version == "0.34.0":
        for profile in ("ci", "thorough"):
            rc, text, secs = check(
                python,
                "--target",
                PATCHED,
                "--machine",
                "all",
                "--profile",
                profile,
            )
            passes = re.findall(r"^(PASS|FAIL)  ([\w-]+) x ", text, re.MULTILINE)
            parts += [
                f"With the skip counted once (`{PATCHED}`), `--profile {profile} "
                f"--machine all`, both policies, checked exactly: exit {rc} in {secs:.1f} s "
                f"({', '.join(f'{m} {s}' for s, m in passes)}).",
                "",
            ]
    return row, "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--envs",
        type=Path,
        default=ROOT / ".vllm",
        help="folder holding one environment per release (default .vllm)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "upstream.md")
    args = p.parse_args(argv)
    found = built(releases(), args.envs)
    if not found:
        print(
            f"make_upstream: no release environment under {args.envs}; build one with "
            ".ci/vllm-venv VERSION DIR/VERSION",
            file=sys.stderr,
        )
        return 2
    rows, sections = [], []
    for version, python in found:
        row, text = section(version, python)
        rows.append(row)
        sections.append(text)
    page = "\n".join(
        [
            "# kvgate on the real upstream",
            "",
            f"Generated by `python docs/make_upstream.py` on {datetime.date.today()} from the "
            "release environments that `.ci/vllm-venv` builds; do not edit by hand. Each verdict "
            "is "
            "`kvgate check --target vllm --profile ci` (derandomized: the same run every time); "
            "seconds are the whole command's wall time, vLLM's import included.",
            "",
            "| release | verdict | steps | seconds | what differed |",
            "|---|---|---:|---:|---|",
            *rows,
            "",
            *sections,
        ]
    )
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(page.rstrip() + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({len(found)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
