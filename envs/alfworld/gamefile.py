"""Reading the official ALFWorld game files (``game.tw-pddl`` + ``traj_data.json``).

``alfworld-download`` gives users a tree ``json_2.1.1/{train,valid_seen,valid_unseen}/
<task folder>/trial_*/`` whose leaves hold ``traj_data.json`` and ``game.tw-pddl``: a JSON object
with the PDDL domain (``pddl_domain``), the TextWorld grammar with the task sentence filled in
(``grammar``), the PDDL problem (``pddl_problem``) and, once checked, ``solvable`` and
``walkthrough``. ``load_game`` turns one into a ``Game`` for the native engine; ``find_games``
lists a split the way the official loader does (skipping movable-receptacle and sliced tasks,
unsolvable games and task types not asked for).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Sequence

from jaxdm.envs.alfworld.pddl import GameFileError, parse_problem
from jaxdm.envs.alfworld.world import (TASK_TYPES, Game, GrammarVariant, TaskInfo,
                                       infer_task, task_text_from_grammar)

REQUIRED_KEYS = ("pddl_domain", "grammar", "pddl_problem")


def read_game_data(path: str) -> dict:
    """The JSON object of a ``game.tw-pddl`` file, checked for the required keys."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise GameFileError(f"{path}: no such game file") from None
    except json.JSONDecodeError as e:
        raise GameFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise GameFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise GameFileError(f"{path}: missing key(s) {missing} (a game.tw-pddl file has "
                            f"{list(REQUIRED_KEYS)})")
    for k in REQUIRED_KEYS:
        if not isinstance(data[k], str):
            raise GameFileError(f"{path}: {k!r} must be a string, got {type(data[k]).__name__}")
    return data


def _task_from_traj(traj: dict, where: str) -> TaskInfo | None:
    try:
        kind = traj["task_type"]
        p = traj["pddl_params"]
    except (KeyError, TypeError):
        raise GameFileError(f"{where}: traj_data.json lacks 'task_type' / 'pddl_params'") from None
    if kind not in TASK_TYPES:
        return None

    def t(key):
        v = p.get(key) or ""
        return (v + "Type").lower() if v else None

    return TaskInfo(kind, t("object_target"), t("parent_target"), t("toggle_target"))


def load_game_data(data: dict, *, where: str = "game", traj_data: dict | None = None) -> Game:
    """A ``Game`` from the content of a ``game.tw-pddl`` file (and optionally its traj_data)."""
    problem = parse_problem(data["pddl_problem"], where=f"{where} [pddl_problem]")
    variant = GrammarVariant.from_texts(data["grammar"], data["pddl_domain"], where=where)
    task_sentence = task_text_from_grammar(data["grammar"], where=where)
    if "UNKNOWN GOAL" in task_sentence:
        raise GameFileError(f"{where}: the grammar's task sentence was never filled in "
                            "('UNKNOWN GOAL'); use alfworld-generate or pass traj_data")
    task = None
    if traj_data is not None:
        task = _task_from_traj(traj_data, where)
    if task is None:
        task = infer_task(problem.goal, where=where)
    meta = {"path": where, "walkthrough": data.get("walkthrough"), "solvable": data.get("solvable")}
    return Game(problem, task_sentence, variant=variant, task=task, where=where, meta=meta)


def load_game(path: str) -> Game:
    """Load a ``game.tw-pddl`` file (and the ``traj_data.json`` beside it, when present)."""
    data = read_game_data(path)
    traj_path = os.path.join(os.path.dirname(path), "traj_data.json")
    traj = None
    if os.path.exists(traj_path):
        try:
            with open(traj_path, encoding="utf-8") as f:
                traj = json.load(f)
        except json.JSONDecodeError as e:
            raise GameFileError(
                f"{traj_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    game = load_game_data(data, where=path, traj_data=traj)
    game.ref, game.rebuild = ("file", os.path.abspath(path)), _game_from_file
    return game


@functools.lru_cache(maxsize=512)
def _game_from_file(path: str) -> Game:
    """A game file loaded once per process (how a pickled file game is rebuilt)."""
    return load_game(path)


def find_games(root: str, split: str | None = None, *,
               task_types: Sequence[str] = TASK_TYPES, solvable_only: bool = True) -> list[str]:
    """Paths of the playable ``game.tw-pddl`` files under ``root`` (or ``root/split``), sorted."""
    base = os.path.join(root, split) if split else root
    if not os.path.isdir(base):
        raise FileNotFoundError(f"{base}: no such directory (expected the official json_2.1.1 "
                                "layout: <root>/<split>/<task>/<trial>/game.tw-pddl)")
    out = []
    for dirpath, _dirs, files in os.walk(base):
        if "game.tw-pddl" not in files or "traj_data.json" not in files:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        with open(os.path.join(dirpath, "traj_data.json"), encoding="utf-8") as f:
            try:
                kind = json.load(f).get("task_type")
            except json.JSONDecodeError:
                continue
        if kind not in task_types:
            continue
        path = os.path.join(dirpath, "game.tw-pddl")
        if solvable_only:
            with open(path, encoding="utf-8") as f:
                try:
                    if not json.load(f).get("solvable"):
                        continue
                except json.JSONDecodeError:
                    continue
        out.append(path)
    return sorted(out)


def load_split(root: str, split: str, **kw) -> tuple[Game, ...]:
    """Every game of ``split`` under the ALFWorld data ``root`` (find_games' options in ``kw``),
    loaded."""
    return tuple(load_game(p) for p in find_games(root, split, **kw))


__all__ = ["GameFileError", "find_games", "load_game", "load_game_data", "load_split",
           "read_game_data"]
