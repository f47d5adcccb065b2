"""scripts/fit_cost_model.py replays the plan's cost model (src/cuda/backend.c) with the same
constants by name; a constant changed in one and not the other would make every later fit
and replay rank paths with a model the library does not run. This reads both and checks
that they agree (no GPU needed)."""

import importlib.util
import os
import re

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load_script():
    spec = importlib.util.spec_from_file_location(
        "fit_cost_model", os.path.join(ROOT, "scripts", "fit_cost_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def backend_constants():
    """Every `#define NAME number` and `static const double NAME[n] = {...}` of backend.c."""
    with open(os.path.join(ROOT, "src", "cuda", "backend.c")) as f:
        src = f.read()
    consts = {}
    for name, val in re.findall(r"^#define ([A-Z0-9_]+) ([-0-9.e]+)\b", src, re.M):
        consts[name] = float(val)
    for name, body in re.findall(
            r"^static const double ([A-Z0-9_]+)\[\d+\] = \{([^}]*)\};", src, re.M):
        consts[name] = [float(v) for v in body.split(",")]
    return consts


# The script's names that backend.c spells another way: (C name, index or None).
RENAMED = {
    "SM90_TILE_US": ("SM90_TILE_COMPUTE_US", None),
    "SM90S_TILE_US_8": ("SM90S_TILE_US", 0),
    "SM90S_TILE_US_16": ("SM90S_TILE_US", 1),
    "SM90S_TILE_US_32": ("SM90S_TILE_US", 2),
    "GEN_TILE_US_1": ("TILE_COMPUTE_US", 1),
    "GEN_TILE_US_2": ("TILE_COMPUTE_US", 2),
    "GEN_TILE_US_4": ("TILE_COMPUTE_US", 4),
    "SM90S_BLOCK_FIXED_US_8": ("SM90S_BLOCK_FIXED_US", 0),
    "SM90S_BLOCK_FIXED_US_16": ("SM90S_BLOCK_FIXED_US", 1),
    "SM90S_BLOCK_FIXED_US_32": ("SM90S_BLOCK_FIXED_US", 2),
}
# The script's terms the C model does not have (they fit times, never change a choice).
SCRIPT_ONLY = {"FORWARD_FIXED_US"}


def test_script_constants_match_backend():
    script = load_script()
    consts = backend_constants()
    checked = 0
    for name, value in script.DEFAULT.items():
        if name in SCRIPT_ONLY:
            continue
        cname, idx = RENAMED.get(name, (name, None))
        assert cname in consts, "backend.c has no constant %s (the script's %s)" % (cname, name)
        c = consts[cname] if idx is None else consts[cname][idx]
        assert abs(c - value) <= 1e-9 * max(1.0, abs(c)), (
            "%s: backend.c %r, scripts/fit_cost_model.py %r" % (name, c, value))
        checked += 1
    assert checked >= 20
    for name in ("FEW_ROWS_MAX", "FEW_ROWS_LINKS"):
        assert consts[name] == getattr(script, name), name
