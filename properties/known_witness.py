"""Judging declared known defects (properties/known.py) by their witnesses: each witness runs
through the lockstep oracle against the model, its defect declared, and says whether the defect
is still there, gone, or diverges otherwise."""

from __future__ import annotations

from .adapters import Config, Target, TargetError, harness_error, model_for, raised_at
from .known import KnownDefect, KnownDefectGone, KnownDefects, Script, Witnessed, with_known
from .oracle import Divergence, LockstepManager, build


def run_witness(defect: KnownDefect, target: Target) -> Witnessed:
    """Run ``defect``'s witness on ``target`` through the oracle, the defect declared (so its
    difference is counted, any other raised): present, gone, diverged otherwise, or not run."""
    if "get_stats" in target.missing:
        return Witnessed(None, f"{target.spec} has no get_stats(), so no metric can be read")
    mine = KnownDefects((defect.name,))
    config = Config(
        num_chunks=4,
        store_threshold=defect.threshold,
        max_tracker_size=defect.tracker,
        cache_policy=target.policies[0],
        recency=target.recencies[0],
    )
    model = model_for(config, feed=target.feed)
    try:
        oracle = LockstepManager(
            build(with_known(target, mine), config, model), model, foreign=target.foreign
        )
        defect.witness(Script(oracle, target.feed))
    except Divergence as exc:
        return Witnessed(False, str(exc).splitlines()[0], other=exc)
    except TargetError:
        raise
    if mine.seen[defect.name]:
        return Witnessed(True, first=mine.first[defect.name])
    return Witnessed(False)


def judge(known: KnownDefects, target: Target) -> KnownDefectGone | None:
    """Run every declared defect's witness on ``target``; the failure of a run whose declared
    defect is gone or diverged otherwise, else None. ``TargetError`` (no verdict) where a
    witness cannot run there, or kvgate's own code failed in it."""
    for d in known.defects:
        try:
            known.witnessed[d.name] = w = run_witness(d, target)
        except TargetError:
            raise
        except Exception as exc:
            where, harness = raised_at(exc)
            if not harness:
                raise
            raise harness_error(
                exc, where, f"the witness of known defect {d.name}", target.release or target.spec
            ) from exc
        if w.present is None:
            raise TargetError(f"known defect {d.name} cannot be judged on {target.spec}: {w.line}")
    failed = [
        line for d, line in zip(known.defects, known.lines()) if not known.witnessed[d.name].present
    ]
    if not failed:
        return None
    return KnownDefectGone("; ".join(failed) + " (a declaration cannot outlive its defect)")
