"""Write docs/releases.md: kvgate's verdict on every vLLM release with a store threshold.

    python docs/make_releases.py --build [VERSION ...]   # build the environments (network)
    python docs/make_releases.py [--out FILE] [VERSION ...]  # run the default gate, write the page

The releases are every minor release of vLLM whose wheel holds the offloading manager
(``vllm/v1/kv_offload``), each at its last patch release (``releases.vllm_build.SWEEP``); their
environments are built by ``releases.vllm_build`` (``--build`` here is the same).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from releases.vllm import built, gate_facts, run_python  # noqa: E402 - needs ROOT on the path
from releases.vllm_build import SWEEP, build  # noqa: E402 - needs ROOT on the path

# --- the page ---------------------------------------------------------------------------------

# What a counterexample's reason says about the rule broken, and why the gate is right there:
# (defect, the rule, the argument). Read off the reason, the target's answer and where the
# release's tracker counts (its note line), never off the version.
DEFECTS = {
    "counts every lookup": (
        "[A2](spec.md#a2), [§3.2](spec.md#s3-2): each key counts once per request",
        "The tracker is fed at `lookup()` (a release's choice, learnt by the probe), but every "
        "lookup counts: one request that looks a key up twice (as a waiting request does at each "
        "scheduling attempt) takes it to 2 on its own, where the seed's claim allows 1.",
    ),
    "counts every offer": (
        "[A2](spec.md#a2): each key counts once per request",
        "The seed's bug: every offer counts, so a request's retry after `None`, or its re-offer "
        "after a preemption, counts again and one request alone gets a key admitted.",
    ),
    "skip undercount": (
        "[A5](spec.md#a5): a skip counts once per request and generation, at the first offer "
        "that skips the key",
        "The skip metric is deduplicated by the keys the request has *counted*, so a request "
        "that had the key admitted (then lost it) and later skips it never counts that skip.",
    ),
    "skip overcount": (
        "[A5](spec.md#a5): a skip counts once per request and generation",
        "Every offer's skipped keys are added to the metric again, where the seed counts a "
        "key's skip once per request: one request offering a cold key twice reads 2.",
    ),
}


# Each defect's witness: the smallest scripted case of the rule it breaks, run through kvgate's
# oracle in the release's environment (so by its adapter, with what the adapter learnt: where
# the tracker counts, which calls exist). A divergence means the release has the defect; the
# gate's counterexample shows only the first one its search met, the witnesses each one. A
# "count" is a lookup where the tracker is fed at lookups, else an offer (spec §3.2).
WITNESSES = r"""
import json
from kvgate.impl.base import make_key
from kvgate.model.cache import Model
from kvgate.properties.adapters import Config, TargetError
from kvgate.properties.oracle import Divergence, LockstepManager
from kvgate.properties.targets import resolve_target

try:
    target = resolve_target("vllm")
except TargetError as exc:
    print(json.dumps({"error": str(exc)}))
    raise SystemExit(0)
A, B = make_key(b"A"), make_key(b"B")


def run(script, threshold, tracker=64000, stats=False):
    if stats and "get_stats" in target.missing:
        return None  # the metric cannot be read: not judged
    config = Config(num_chunks=4, store_threshold=threshold, max_tracker_size=tracker)
    model = Model(
        4,
        store_threshold=threshold,
        max_tracker_size=tracker,
        recency=target.recencies[0],
        feed=target.feed,
    )
    o = LockstepManager(target.make(config), model, foreign=target.foreign)
    ctx = [o.new_context(f"r{i}") for i in range(3)]

    def count(key, c):
        if target.feed == "lookup":
            o.lookup(key, c)
            return None
        return o.prepare_store([key], c)

    try:
        script(o, ctx, count)
    except Divergence as d:
        return str(d).splitlines()[0]
    return False


def counts_twice(o, ctx, count):  # spec A2: one request, the same key, twice
    count(A, ctx[0])
    count(A, ctx[0])
    o.check_state()
    o.prepare_store([A], ctx[1])


def skips_twice(o, ctx, count):  # spec A5: one request skipped twice on one key
    o.prepare_store([A], ctx[0])
    o.prepare_store([A], ctx[0])
    o.get_stats()


def skip_after_admit(o, ctx, count):  # spec A5: a later offer's first skip, after an admission
    count(A, ctx[1])
    out = count(A, ctx[0])  # a second request: A reaches 2
    if target.feed == "lookup":
        out = o.prepare_store([A], ctx[0])
    if out and out[0]:  # admitted, and its store fails: A leaves the cache
        o.complete_store(out[0], ctx[0], success=False)
    count(B, ctx[2])  # a tracker of one key lets A go
    o.prepare_store([A], ctx[0])
    o.get_stats()


other = "offer" if target.feed == "lookup" else "lookup"
print(json.dumps({
    "counts every " + target.feed: run(counts_twice, 2),
    "counts every " + other: False,  # the tracker does not count there at all
    "skip overcount": run(skips_twice, 3, stats=True),
    "skip undercount": run(skip_after_admit, 2, tracker=1, stats=True),
}))
"""


def witnesses(python: Path) -> dict:
    """Which defects the release has, by witness: defect -> True, False or None (not judged)."""
    done = run_python(python, "-c", WITNESSES)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{python}: the witnesses failed: {done.stderr[-2000:]}")
    found = json.loads(lines[-1])
    if "error" in found:
        return {}
    return {
        defect: None if got is None else bool(got)
        for defect, got in found.items()
        if defect in DEFECTS or defect.startswith("counts every")
    }


def defect_of(facts: dict, note: str) -> str:
    """Which defect a counterexample shows ("" for a pass or an unclassified one)."""
    why = facts["why"]
    fed_at_lookups = "tracker fed at lookups" in note
    if "a count exceeds" in why or why == "admitted keys differ":
        return "counts every lookup" if fed_at_lookups else "counts every offer"
    if "stores_skipped differs" in why:
        got = re.search(r"target answered: \S*=(\d+)", facts["counterexample"])
        want = re.search(r"model answered:\s+\S*=(\d+)", facts["counterexample"])
        if got and want:
            return "skip undercount" if int(got[1]) < int(want[1]) else "skip overcount"
    return ""


def gate(version: str, python: Path) -> dict:
    """The default gate in the release's environment, and what it printed."""
    start = time.perf_counter()
    done = run_python(python, "-m", "kvgate", "check", "--target", "vllm", "--profile", "ci")
    seconds = time.perf_counter() - start
    out = "\n".join(
        line
        for line in (done.stdout + done.stderr).splitlines()
        if not line.startswith(("INFO", "WARN"))
    )
    facts = gate_facts(out)
    one_line = re.search(r"^kvgate: (.*)$", out, re.MULTILINE)
    error = re.search(r"^ERROR +\S+ x \S+: (.*)$", out, re.MULTILINE)
    unchecked = re.search(r"^not checked for \S+: (.*)$", out, re.MULTILINE)
    runs = re.findall(r"^(PASS|FAIL|ERROR) +([\w-]+) x ", out, re.MULTILINE)
    return dict(
        facts,
        has=witnesses(python),
        version=version,
        code=done.returncode,
        seconds=seconds,
        line=(one_line or error)[1] if (one_line or error) else "",
        unchecked=unchecked[1] if unchecked else "",
        runs=runs,
        defect=defect_of(facts, facts["note"]),
    )


def manager_of(note: str) -> str:
    name = note.split(";")[0].split(": ", 1)[-1] if note else ""
    return f"`{name.rsplit('.', 1)[-1]}`" if name else "-"


def found_of(note: str) -> str:
    """The capabilities the adapter found, from its note line (version and class left out)."""
    parts = [p.strip() for p in note.split(";")[2:]] if note else []
    return code("; ".join(parts)) if parts else "-"


def code(text: str) -> str:
    """kvgate's own output quoted as it printed it (a code span: its citations are Python's)."""
    return f"`{text}`" if text else ""


def page(results: list[dict]) -> str:
    rows = []
    for r in results:
        verdict = {0: "passes", 1: "fails", 2: "not judged"}.get(r["code"], f"exit {r['code']}")
        rule = DEFECTS[r["defect"]][0] if r["defect"] else code(r["why"] or r["line"]) or "-"
        also = ", ".join(d for d, yes in r["has"].items() if yes) or "-"
        rows.append(
            f"| {r['version']} | {manager_of(r['note'])} | {found_of(r['note'])} | "
            f"{verdict} (exit {r['code']}) | {rule} | {r['steps'] or '-'} | {r['seconds']:.1f} "
            f"| {also} |"
        )
    gone = []
    for defect in DEFECTS:
        having = [r["version"] for r in results if r["has"].get(defect)]
        if not having:
            continue
        last = having[-1]
        later = [r for r in results if _key(r["version"]) > _key(last)]
        fixed = next((r["version"] for r in later if r["has"].get(defect) is False), None)
        unjudged = [r["version"] for r in results if r["has"] and r["has"].get(defect) is None]
        gone.append(
            f"| {defect} | {DEFECTS[defect][0]} | {', '.join(having)} | "
            f"{fixed or 'not gone yet'} |"
            + (f" not judged on {', '.join(unjudged)} (no get_stats) |" if unjudged else " |")
        )
    sections = []
    for r in results:
        parts = [f"## vLLM {r['version']}", ""]
        if r["note"]:
            parts += [f"Adapter: `{r['note']}`.", ""]
        parts.append(
            f"`kvgate check --target vllm --profile ci`: exit {r['code']} in {r['seconds']:.1f} s"
            + (f", a counterexample of {r['steps']} steps ({r['why']})." if r["steps"] else ".")
        )
        parts.append("")
        if r["line"]:
            parts += [f"It says: {code(r['line'])}", ""]
        if r["defect"]:
            parts += [f"Rule broken: {DEFECTS[r['defect']][0]}. {DEFECTS[r['defect']][1]}", ""]
        if r["unchecked"]:
            parts += [f"Not checked: {code(r['unchecked'])}.", ""]
        if r["counterexample"]:
            parts += ["```", r["counterexample"], "```", ""]
        sections.append("\n".join(parts))
    return "\n".join(
        [
            "# kvgate on every vLLM release with an offloading manager",
            "",
            f"Generated by `python docs/make_releases.py` on {datetime.date.today()}; do not edit "
            "by hand. `python docs/make_releases.py --build` builds one environment per release "
            "(the CPU build of torch shared by all of them, each wheel with `--no-deps`); each "
            "verdict is the default gate, `kvgate check --target vllm --profile ci` "
            "(derandomized, one hash seed), in that release's environment. Seconds are the whole "
            "command's wall time, vLLM's import included. The adapter learns each release's "
            "choices from what the release offers (spec [§3.2](spec.md#s3-2), "
            "[§10](spec.md#s10)); the rules it holds every release to are the seed's.",
            "",
            "| release | manager | what the adapter found | verdict | rule broken | steps | "
            "seconds | defects (witnesses) |",
            "|---|---|---|---|---|---:|---:|---|",
            *rows,
            "",
            "Each defect, the releases that have it, and the first release in which it is gone. "
            "The gate stops at its first counterexample, so a release can have more defects than "
            "its row shows; these columns come from each defect's *witness*, the smallest "
            "scripted case of the rule it breaks, run through the same adapter and oracle in "
            "each release's environment (`WITNESSES` in docs/make_releases.py):",
            "",
            "| defect | rule | releases whose witness diverges | gone in | |",
            "|---|---|---|---|---|",
            *gone,
            "",
            *sections,
        ]
    )


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def write(versions: list[str], envs: Path, out: Path, results_file: Path | None = None) -> int:
    found = built(versions, envs)
    if not found:
        print(
            f"make_releases: no release environment under {envs}; build them with "
            "python docs/make_releases.py --build",
            file=sys.stderr,
        )
        return 2
    results = []
    for version, python in found:
        result = gate(version, python)
        print(
            f"vLLM {version}: exit {result['code']} in {result['seconds']:.1f} s "
            f"{result['why'] or result['line'][:80]}",
            flush=True,
        )
        results.append(result)
    if results_file is not None:  # to render the page again without running anything
        results_file.write_text(json.dumps(results, indent=1))
    return render(results, out)


def render(results: list[dict], out: Path) -> int:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(page(results).rstrip() + "\n")
    os.replace(tmp, out)
    print(f"wrote {out} ({len(results)} releases)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("versions", nargs="*", default=SWEEP)
    p.add_argument("--build", action="store_true", help="build the environments (no page)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "releases.md")
    p.add_argument("--results", type=Path, help="also write what each run found, as JSON")
    p.add_argument("--render", type=Path, help="write the page from such a JSON; run nothing")
    p.add_argument(
        "--envs", type=Path, default=Path(os.environ.get("KVGATE_VLLM_ENVS", ROOT / ".vllm"))
    )
    args = p.parse_args(argv)
    if args.build:
        return build(args.versions, args.envs)
    if args.render is not None:
        return render(json.loads(args.render.read_text()), args.out)
    return write(args.versions, args.envs, args.out, args.results)


if __name__ == "__main__":
    sys.exit(main())
