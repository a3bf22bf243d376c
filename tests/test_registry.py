"""``jaxdm.registry.Registry`` (issue 39 §4): one type for every registry of the package, its
errors, config validation through it, and a scan that fails when a hand-written registry
(a module-level dict filled by a ``register*`` function) appears again."""
import ast
import dataclasses
import importlib
import re
import sys
import types
from pathlib import Path

import pytest

from jaxdm import config as cfgmod
from jaxdm.registry import DuplicateNameError, Registry, UnknownNameError

REPO = Path(__file__).resolve().parents[1]


def test_register_get_and_the_mapping_views():
    reg = Registry("gate")
    assert reg.register("pure", 1) == 1

    @reg.register("lvopd")
    def lvopd_gate():
        return "w"

    assert lvopd_gate() == "w" and reg.get("lvopd") is lvopd_gate and reg["pure"] == 1
    reg.register("alpha", 3)
    assert reg.names() == ["alpha", "lvopd", "pure"]            # sorted
    assert list(reg) == ["pure", "lvopd", "alpha"]              # registration order
    assert reg.items() == [("pure", 1), ("lvopd", lvopd_gate), ("alpha", 3)]
    assert len(reg) == 3 and "pure" in reg and "nope" not in reg and 3 not in reg
    assert set(reg) == {"pure", "lvopd", "alpha"}


def test_a_duplicate_name_is_a_named_error_unless_replaced():
    reg = Registry("estimator")
    reg.register("grpo", 1)
    with pytest.raises(DuplicateNameError, match=r"^estimator 'grpo' is already registered$"):
        reg.register("grpo", 2)
    with pytest.raises(ValueError, match="already registered"):  # callers catching ValueError
        reg.register("grpo")(lambda: None)
    assert reg.get("grpo") == 1
    assert reg.register("grpo", 2, replace=True) == 2 and reg.get("grpo") == 2 and len(reg) == 1
    for bad in ("", None, 3):
        with pytest.raises(TypeError, match="estimator names are non-empty strings"):
            reg.register(bad, 1)
    with pytest.raises(ValueError, match="what must be a non-empty string"):
        Registry("")


def test_an_unknown_name_lists_the_known_names_sorted():
    reg = Registry("loss term")
    for name in ("ppo", "value", "lvopd"):
        reg.register(name, name)
    with pytest.raises(UnknownNameError) as err:
        reg.get("nope")
    assert str(err.value) == "unknown loss term 'nope'; known: ['lvopd', 'ppo', 'value']"
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    with pytest.raises(KeyError):
        reg["nope"]
    with pytest.raises(UnknownNameError, match=re.escape(
            "algo.terms: unknown loss term 'x'; known: ['lvopd', 'ppo', 'value']")):
        reg.get("x", field="algo.terms")
    for bad in (None, 3, ["ppo"]):  # not a name: the same error, never a TypeError
        with pytest.raises(UnknownNameError, match=re.escape(f"unknown loss term {bad!r}")):
            reg.get(bad)
    hinted = Registry("env", hint="or give env.factory='module:callable'")
    hinted.register("toy", "m:f")
    with pytest.raises(UnknownNameError, match=re.escape(
            "env.name: unknown env 'web'; known: ['toy'] (or give env.factory="
            "'module:callable')")):
        hinted.get("web", field="env.name")
    with pytest.raises(UnknownNameError, match=re.escape("unknown thing 'a'; known: []")):
        Registry("thing").get("a")


def test_validate_names_the_field_and_every_accepted_name():
    reg = Registry("critic", hint="never shown with what=")
    reg.register("decoder", 1)
    reg.register("mlp", 2)
    assert reg.validate("mlp", field="critic.kind") is None
    assert reg.validate("none", field="critic.kind", also=("none",)) is None
    with pytest.raises(UnknownNameError, match=re.escape(
            "critic.kind: unknown critic 'x'; known: ['decoder', 'mlp', 'none'] (never shown")):
        reg.validate("x", field="critic.kind", also=("none",))
    with pytest.raises(UnknownNameError, match=re.escape(
            "teacher.kind: unknown teacher kind 'x'; known: ['decoder', 'mlp', 'none', "
            "'oracle']")) as err:
        reg.validate("x", field="teacher.kind", also=("none", "oracle"), what="teacher kind")
    assert "never shown" not in str(err.value)
    with pytest.raises(UnknownNameError, match=re.escape("critic.kind: unknown critic 7")):
        reg.validate(7, field="critic.kind")


def test_config_validation_through_a_registry_is_a_config_error_naming_the_key():
    reg = Registry("gate")
    reg.register("pure", None)

    @dataclasses.dataclass(frozen=True)
    class Algo:
        gate: str = "pure"

        def __post_init__(self):
            reg.validate(self.gate, field="algo.gate")

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        algo: Algo = Algo()

    assert cfgmod.load_config(Cfg, None, ["algo.gate=pure"]).algo.gate == "pure"
    with pytest.raises(cfgmod.ConfigError, match=re.escape(
            "algo.gate: unknown gate 'soft'; known: ['pure']")):
        cfgmod.load_config(Cfg, None, ["algo.gate=soft"])


def test_providers_are_imported_on_a_miss_and_before_listing(tmp_path, monkeypatch):
    holder = types.ModuleType("registry_test_holder")
    holder.REG = Registry("signal", providers=("registry_test_provider",))
    holder.REG.register("early", 1)
    monkeypatch.setitem(sys.modules, "registry_test_holder", holder)
    (tmp_path / "registry_test_provider.py").write_text(
        "from registry_test_holder import REG\nREG.register('late', 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "registry_test_provider", raising=False)
    assert holder.REG.get("early") == 1 and "registry_test_provider" not in sys.modules  # a hit
    assert holder.REG.get("late") == 2 and "registry_test_provider" in sys.modules      # a miss
    assert holder.REG.names() == ["early", "late"]
    listing = Registry("signal", providers=("registry_test_provider2",))
    monkeypatch.setitem(sys.modules, "registry_test_holder", types.SimpleNamespace(REG=listing))
    (tmp_path / "registry_test_provider2.py").write_text(
        "from registry_test_holder import REG\nREG.register('late', 2)\n")
    assert len(listing) == 1 and listing.names() == ["late"]
    missing = Registry("critic", providers=("registry_test_no_such_module",))
    for _ in range(2):  # a provider that fails to import fails every lookup that misses
        with pytest.raises(ModuleNotFoundError, match="registry_test_no_such_module"):
            missing.get("mlp")


# ---- every registry of the package is a Registry ------------------------------------------
# (module, name) of each registry; the scan below fails when a new hand-written one appears.
REGISTRIES = [
    ("jaxdm.models.presets", "PRESETS"), ("jaxdm.models.sharding", "MESH_PRESETS"),
    ("jaxdm.rl.estimators", "ESTIMATORS"), ("jaxdm.rl.signals", "SIGNALS"),
    ("jaxdm.rl.terms", "LOSS_TERMS"), ("jaxdm.rl.critic", "CRITIC_KINDS"),
    ("jaxdm.rl.lvopd", "TEACHER_POLICIES"), ("jaxdm.rl.lvopd", "DISTILL_FORMS"),
    ("jaxdm.rl.distill", "GATES"), ("jaxdm.rl.jax_envs", "JAX_ENVS"),
    ("jaxdm.rl.collect", "ROLLOUT_KINDS"), ("jaxdm.rl.build", "POLICY_KINDS"),
    ("jaxdm.rl.env_factories", "ENV_FACTORIES"),
    ("jaxdm.rl.values.trainer_signal", "VALUE_MODELS"), ("jaxdm.rl.values.models", "ORACLE_VALUES"),
    ("jaxdm.rl.values.context", "SUMMARISERS"),
    ("jaxdm.envs.vector", "WORKER_BACKENDS"), ("jaxdm.envs.decision_gym.world", "SPLIT_RANGES"),
    ("jaxdm.envs.toy.tasks", "TASK_TYPES"), ("jaxdm.stats", "NONINFERIORITY_METHODS"),
    ("jaxdm.stats", "COST_METHODS"), ("jaxdm.decision", "BACKEND_KINDS"),
    ("jaxdm.harness.llm", "LLM_KINDS"), ("jaxdm.harness.llm", "PROFILES"),
    ("jaxdm.harness.modes", "MODE_RULES"), ("jaxdm.roles.judge", "QUESTION_BUILDERS"),
    ("jaxdm.harness.textenv", "ADAPTERS"), ("jaxdm.harness.dm", "DM_KINDS"),
    ("jaxdm.rl.losses", "AGGREGATIONS"), ("jaxdm.models.cpu.build", "KERNELS"),
    ("jaxdm.bench.run", "LEVELS"), ("jaxdm.bench.l3", "L3_ENVS"),
    ("jaxdm.screen.run", "EXPANSIONS"),
]
ROOTS = {"jaxdm": REPO / "jaxdm", "jaxdm.envs": REPO / "envs", "jaxdm.kernels": REPO / "kernels"}


def _sources() -> dict[str, ast.Module]:
    """module name (``jaxdm.rl.terms``) -> its parsed source, over jaxdm/, envs/, kernels/."""
    out = {}
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            parts = package.split(".") + list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = ast.parse(path.read_text("utf-8"))
    return out


def _module_dicts(tree: ast.Module) -> set[str]:
    """Public UPPERCASE module-level names bound to a dict display, comprehension or dict()
    call (a leading underscore marks a private memo cache, not a registry)."""
    out = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        is_dict = isinstance(value, (ast.Dict, ast.DictComp)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "dict")
        for t in targets:
            if is_dict and isinstance(t, ast.Name) and t.id.isupper() and t.id[0] != "_":
                out.add(t.id)
    return out


def hand_written_registries() -> list[str]:
    """What a ``Registry`` replaces, written by hand: a function writing entries into a public
    UPPERCASE module-level dict of the package (``NAME[key] = ...``, ``NAME.update(...)``,
    its own module's or an imported one), a module-level ``register_*`` function that writes
    into no ``Registry`` (no ``<x>.register(...)`` call), and a raised error listing such a
    dict's keys (``sorted(NAME)`` / ``list(NAME)`` in the message: a hand-written lookup)."""
    sources = _sources()
    own = {mod: _module_dicts(tree) for mod, tree in sources.items()}
    found = []
    for where, tree in sources.items():
        dicts = set(own[where])  # its own, and those it imports by name from the package
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module in own:
                dicts |= {a.asname or a.name for a in node.names if a.name in own[node.module]}
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for sub in ast.walk(node.exc):
                    if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and \
                            sub.func.id in ("sorted", "list") and sub.args and \
                            isinstance(sub.args[0], ast.Name) and sub.args[0].id in dicts:
                        found.append(f"{where}:{node.lineno}: an error lists "
                                     f"{sub.func.id}({sub.args[0].id})")
        for fn in tree.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls_register = False
            for node in ast.walk(fn):
                if isinstance(node, (ast.Assign, ast.AugAssign)):
                    for t in getattr(node, "targets", [getattr(node, "target", None)]):
                        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) \
                                and t.value.id in dicts:
                            found.append(f"{where}: {fn.name} writes {t.value.id}[...]")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    owner = node.func.value
                    if node.func.attr == "register":
                        calls_register = True
                    elif node.func.attr in ("update", "setdefault") and \
                            isinstance(owner, ast.Name) and owner.id in dicts:
                        found.append(f"{where}: {fn.name} calls {owner.id}.{node.func.attr}")
            if fn.name.startswith("register_") and not calls_register:
                found.append(f"{where}: {fn.name} registers into no Registry")
    return found


def test_the_scan_finds_a_hand_written_registry(tmp_path, monkeypatch):
    (tmp_path / "old.py").write_text(
        "THINGS = {}\n\ndef register_thing(name, fn):\n    THINGS[name] = fn\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOTS", {"jaxdm": tmp_path})
    (tmp_path / "lookup.py").write_text(
        "from jaxdm.old import THINGS\n\ndef thing(name):\n    if name not in THINGS:\n"
        "        raise ValueError(f'unknown {name}; known: {sorted(THINGS)}')\n")
    assert hand_written_registries() == [
        "jaxdm.lookup:5: an error lists sorted(THINGS)",
        "jaxdm.old: register_thing writes THINGS[...]",
        "jaxdm.old: register_thing registers into no Registry"]


# What the scan still finds, each with why it stays; an entry that no longer matches fails too,
# so the table only shrinks.
NOT_CONVERTED = {
    "jaxdm.decision.oracle:49: an error lists sorted(DEFAULT_LEVELS)":
        "the default value of the Oracle's levels option (settings keys), not a registry",
    "jaxdm.models.lora:57: an error lists list(TARGETS)":
        "LoRA target -> weight axis: data of the adapter format, not a table of choices",
}


def test_every_registry_of_the_package_is_a_registry():
    for module, name in REGISTRIES:
        reg = getattr(importlib.import_module(module), name)
        assert isinstance(reg, Registry), f"{module}.{name} is a {type(reg).__name__}"
        assert len(reg) >= 1 and reg.names() == sorted(reg)
    found = hand_written_registries()
    new = [f for f in found if f not in NOT_CONVERTED]
    assert not new, "hand-written registries (use jaxdm.registry.Registry): " + "; ".join(new)
    stale = sorted(set(NOT_CONVERTED) - set(found))
    assert not stale, f"converted or moved: remove from NOT_CONVERTED: {stale}"
