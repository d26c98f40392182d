"""The private vLLM names the harness touches (properties/engines/vllm/private_names.py) and the
planted faults that replace some of them (properties/engines/vllm/faults.py).

- in every release CI builds, each listed name is where the harness expects it, and absent
  exactly where the list says the release lacks it (a rename in a new release fails here,
  naming the name, before a check or a fault silently does nothing);
- the list holds every private name of the adapter's internals, and every name constant the
  module declares;
- a fault whose target the release lacks raises, naming it; no check module names a fault.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvgate.properties.engines.vllm import faults, private_names
from kvgate.properties.engines.vllm.adapter import INTERNALS, OLDER_NAMES
from releases.vllm import all_releases, probe

HARNESS = Path(__file__).resolve().parents[1] / "properties" / "engines" / "vllm"
CHECK_MODULES = (
    "checks.py",
    "exact.py",
    "front.py",
    "bytes_worker.py",
    "event_payload.py",
    "error_log.py",
    "load_tiers.py",
    "lookup_metrics.py",
)
PROBE = """
import json
from kvgate.properties.engines.vllm import private_names
print(json.dumps(private_names.check({version!r})))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", all_releases())
def test_every_private_name_is_where_the_harness_expects_it(version):
    got = probe(version, PROBE.format(version=version))
    assert not got["missing"], f"vLLM {version} lacks: " + "; ".join(got["missing"])
    assert not got["stale"], (
        f"vLLM {version} has what private_names.py lists as absent there: "
        + "; ".join(got["stale"])
    )


def test_a_missing_or_stale_name_is_named(monkeypatch):
    """``check`` names a name the release lacks, and one the list says it lacks but it has."""

    class Connector:
        _jobs: dict = {}

    class Manager:
        _num_blocks = 4  # listed as absent in 0.33.0 and 0.34.0

    classes = {private_names.CONNECTOR: Connector, private_names.MANAGER: Manager}
    monkeypatch.setattr(private_names, "owner_class", classes.get)
    got = private_names.check("0.34.0")
    assert any(
        m.startswith("OffloadingConnectorScheduler._req_status (used by ") for m in got["missing"]
    )
    assert not any("._jobs " in m for m in got["missing"]), got
    assert got["stale"] == [
        "CPUOffloadingManager._num_blocks (used by adapter.py OLDER_NAMES (the tier's size))"
    ]
    # a name whose owner the release lacks altogether, where the list expects it
    assert any(m.startswith("LRUCachePolicy._ranks ") for m in got["missing"]), got


def test_the_list_holds_every_name_the_harness_declares():
    listed = {p.name for p in private_names.NAMES}
    adapter = {
        n
        for pair in list(INTERNALS.items()) + list(OLDER_NAMES.items())
        for n in pair
        if n.startswith("_")
    }
    assert adapter - listed == set(), "adapter.py internals not in private_names.py"
    declared = {v for k, v in vars(private_names).items() if k.isupper() and isinstance(v, str)}
    assert {n for n in declared if n.startswith("_")} - listed == set()
    for p in private_names.NAMES:
        assert p.owner in private_names.OWNERS and p.used_by, p


def test_a_fault_whose_target_is_missing_raises_naming_it():
    """Every fault of the connector refuses a connector without what it replaces."""

    class Bare:
        pass

    for name, fault in faults.FAULTS.items():
        if fault.part != faults.CONNECTOR:
            continue
        with pytest.raises(faults.FaultTargetMissing, match=f"fault '{name}' .* Bare"):
            faults.plant_on_connector(name, Bare(), None)
    with pytest.raises(faults.FaultTargetMissing, match="replaces _reset_cache on Bare"):
        faults.plant_on_connector("reset_lost", Bare(), None)


def test_no_check_module_names_a_fault():
    for module in CHECK_MODULES:
        text = (HARNESS / module).read_text()
        named = [f for f in faults.FAULTS if re.search(rf"\b{f}\b", text)]
        assert named == [], f"{module} names planted fault(s) {named}: they live in faults.py"
