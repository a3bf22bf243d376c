"""CodeAct tasks: a seeded world, an instruction, a reference solution and a validation suite.

Three task types, shaped like AppWorld's (credentials from the supervisor, an app login, data
retrieval, a state change or an answer, then ``complete_task``):

- ``disable_alarms``: disable every alarm before a time, delete none (deleting instead of
  disabling is the seed's G.1 pitfall: the calls succeed, the task fails);
- ``count_notes``: answer how many notes carry a tag;
- ``pay_back``: send a contact an exact amount with an exact note.

``make_task(seed, split)`` is deterministic. ``validate(task, start, end)`` compares the
world at the start and at the end (the answer given at ``complete_task`` included) and
returns (requirement, passed) pairs, as AppWorld's evaluation does. ``solution`` holds the
reference code, one single-line cell per step; ``menu`` adds plausible wrong cells (the
admissible actions of a small option-scoring policy). Standard library only (runs inside
the sandbox).
"""
from __future__ import annotations

import dataclasses
import random

__all__ = ["TASK_TYPES", "Task", "make_task", "validate", "SPLITS"]

TASK_TYPES = ("disable_alarms", "count_notes", "pay_back")
_NAMES = ("ada", "alan", "grace", "edsger", "barbara", "donald", "frances", "ken", "radia",
          "tim", "margaret", "john")
_HELD_OUT = 4  # the last names are test-only: held-out supervisors and contacts
SPLITS = ("train", "test")
_TAGS = ("work", "home", "travel", "ideas", "books")


@dataclasses.dataclass(frozen=True)
class Task:
    """One CodeAct task: its seed and type, the instruction, the apps' starting world, and what the
    validation checks."""
    seed: int
    task_type: str
    instruction: str
    world: dict
    expected: dict       # what the validation checks (task-type specific)
    solution: tuple[str, ...]
    menu: tuple[str, ...]


def _names(split: str) -> tuple[str, ...]:
    if split == "train":
        return _NAMES[:-_HELD_OUT]
    if split == "test":
        return _NAMES[-_HELD_OUT:]
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def make_task(seed: int, split: str = "train", task_types: tuple[str, ...] = TASK_TYPES) -> Task:
    """The task of ``seed`` (see module docstring)."""
    for t in task_types:
        if t not in TASK_TYPES:
            raise ValueError(f"unknown task type {t!r}; known: {list(TASK_TYPES)}")
    if not task_types:
        raise ValueError("task_types must not be empty")
    rng = random.Random(f"codeact-{split}-{int(seed)}")
    names = _names(split)
    me = rng.choice(names)
    email = f"{me}@example.com"
    passwords = {app: f"{app[:3]}-{rng.randrange(10**5, 10**6)}"
                 for app in ("clock", "notes", "wallet")}
    alarms = [{"id": i + 1, "label": rng.choice(("wake up", "gym", "meeting", "pills")),
               "time": f"{rng.randrange(5, 12):02d}:{rng.choice((0, 15, 30, 45)):02d}",
               "enabled": True} for i in range(rng.randrange(3, 6))]
    notes = [{"id": i + 1, "title": f"note {i + 1}", "tags": rng.sample(_TAGS, 2)}
             for i in range(rng.randrange(3, 7))]
    others = [n for n in names if n != me]
    contacts = [{"name": n, "email": f"{n}@example.com"} for n in rng.sample(others, 3)]
    world = {"users": {"name": me, "email": email, "passwords": passwords}, "clock": alarms,
             "notes": notes, "wallet": {"balance": 200.0, "contacts": contacts,
                                        "transactions": []}}
    task_type = rng.choice(task_types)
    creds = ("pw = {p['account_name']: p['password'] for p in "
             "apis.supervisor.show_account_passwords()}")
    done = "apis.supervisor.complete_task()"
    if task_type == "disable_alarms":
        cutoff = rng.choice(("07:00", "08:00", "09:00"))
        instruction = f"Disable all my alarms set before {cutoff}; keep the others as they are."
        expected = {"cutoff": cutoff}
        login = f"tok = apis.clock.login(username='{email}', password=pw['clock'])['access_token']"
        look = "alarms = apis.clock.show_alarms(access_token=tok); print(alarms)"
        act = (f"[apis.clock.update_alarm(access_token=tok, alarm_id=a['id'], enabled=False) "
               f"for a in alarms if a['time'] < '{cutoff}']")
        wrong = (f"[apis.clock.delete_alarm(access_token=tok, alarm_id=a['id']) "
                 f"for a in alarms if a['time'] < '{cutoff}']")
        solution, distractors = (creds, login, look, act, done), (wrong,)
    elif task_type == "count_notes":
        tag = rng.choice(_TAGS)
        instruction = f"How many of my notes are tagged '{tag}'? Answer with the number."
        expected = {"answer": sum(tag in n["tags"] for n in notes)}
        login = f"tok = apis.notes.login(username='{email}', password=pw['notes'])['access_token']"
        look = f"found = apis.notes.search_notes(access_token=tok, tag='{tag}'); print(found)"
        solution = (creds, login, look, "apis.supervisor.complete_task(answer=len(found))")
        distractors = ("apis.supervisor.complete_task(answer=len(apis.notes.search_notes("
                       "access_token=tok)))",)
    else:
        friend = rng.choice(contacts)
        amount = float(rng.choice((12, 25, 40, 18.5)))
        what = rng.choice(("dinner", "tickets", "taxi"))
        instruction = (f"Pay {friend['name']} back ${amount:g} for {what}, with the note "
                       f"'{what}'.")
        expected = {"to": friend["email"], "amount": amount, "note": what}
        login = (f"tok = apis.wallet.login(username='{email}', password=pw['wallet'])"
                 f"['access_token']")
        look = "print(apis.wallet.show_contacts(access_token=tok))"
        act = (f"apis.wallet.send_money(access_token=tok, email='{friend['email']}', "
               f"amount={amount:g}, note='{what}')")
        wrong = (f"apis.wallet.send_money(access_token=tok, email='{friend['email']}', "
                 f"amount={amount:g}, note='{what}.')")
        solution, distractors = (creds, login, look, act, done), (wrong,)
    extra = ("print(apis.api_docs.show_app_descriptions())", done)
    menu = list(dict.fromkeys(solution + distractors + extra))
    rng.shuffle(menu)
    return Task(seed=int(seed), task_type=task_type, instruction=instruction, world=world,
                expected=expected, solution=solution, menu=tuple(menu))


def validate(task: Task, start: dict, end: dict) -> list[tuple[str, bool]]:
    """The task's requirements on the start and end worlds: (requirement, passed) pairs."""
    out = [("the task is marked complete", end["task"]["status"] == "complete")]
    e = task.expected
    if task.task_type == "disable_alarms":
        before = {a["id"]: a for a in start["clock"]}
        after = {a["id"]: a for a in end["clock"]}
        out.append(("no alarm was deleted", set(after) == set(before)))
        out.append((f"every alarm before {e['cutoff']} is disabled",
                    all(not after[i]["enabled"] for i, a in before.items()
                        if a["time"] < e["cutoff"] and i in after)))
        out.append(("every other alarm is unchanged",
                    all(after.get(i) == a for i, a in before.items()
                        if a["time"] >= e["cutoff"])))
    elif task.task_type == "count_notes":
        out.append(("the answer is right", end["task"]["answer"] == e["answer"]))
        out.append(("no note was changed", end["notes"] == start["notes"]))
    else:
        txs = end["wallet"]["transactions"]
        out.append(("exactly one payment was made", len(txs) == 1))
        out.append(("the payment has the right contact, amount and note",
                    len(txs) == 1 and txs[0] == {"to": e["to"], "amount": e["amount"],
                                                 "note": e["note"]}))
    return out
