"""Simulated apps of the CodeAct environment: a clock, notes, a wallet and the supervisor.

Shaped like AppWorld's apps: the agent reaches each app through ``apis.<app>.<api>(...)``,
logs in with a password found through ``apis.supervisor.show_account_passwords()``, passes
the access token to every call, discovers the APIs with ``apis.api_docs``, and ends the
task with ``apis.supervisor.complete_task(answer=...)``. Every API returns fresh plain
data (dicts, lists, numbers), never a reference into the world, so code can only change
the world through the APIs. Standard library only: this module runs inside the sandbox.
"""
from __future__ import annotations

import copy
import inspect
from typing import Any

__all__ = ["ApiError", "World", "AppApis", "ApiCollection", "APP_NAMES"]


class ApiError(Exception):
    """An API call the app refuses (bad token, unknown id, ...): shown to the agent."""


class World:
    """All apps' data for one task: ``users`` (app -> credentials), ``clock`` alarms,
    ``notes``, ``wallet`` (balance, contacts, transactions) and the supervisor's task."""

    def __init__(self, data: dict):
        self.data = copy.deepcopy(data)
        self.data.setdefault("task", {"status": "active", "answer": None})

    def snapshot(self) -> dict:
        """A deep copy of the world's data (what an evaluation compares against)."""
        return copy.deepcopy(self.data)


class AppApis:
    """One app's APIs (public methods); the base checks access tokens."""

    app_name = ""
    description = ""

    def __init__(self, world: World):
        self._world = world

    def _check_token(self, access_token: str) -> None:
        if access_token != f"token-{self.app_name}-{self._world.data['users']['email']}":
            raise ApiError(f"{self.app_name}: invalid access token; log in first")

    def login(self, username: str, password: str) -> dict:
        """Log in; returns {"access_token": ...} to pass to the other APIs."""
        users = self._world.data["users"]
        if username != users["email"] or password != users["passwords"].get(self.app_name):
            raise ApiError(f"{self.app_name}: wrong username or password")
        return {"access_token": f"token-{self.app_name}-{username}"}


class ClockApis(AppApis):
    """The clock app: list, create, update and delete alarms."""
    app_name = "clock"
    description = "Alarms: list, create, update (time, label, enabled) and delete them."

    def _alarm(self, alarm_id: int) -> dict:
        for a in self._world.data["clock"]:
            if a["id"] == alarm_id:
                return a
        raise ApiError(f"clock: no alarm with id {alarm_id}")

    def show_alarms(self, access_token: str) -> list:
        """Every alarm: [{"id", "label", "time" ("HH:MM"), "enabled"}]."""
        self._check_token(access_token)
        return copy.deepcopy(self._world.data["clock"])

    def update_alarm(self, access_token: str, alarm_id: int, enabled: bool | None = None,
                     time: str | None = None, label: str | None = None) -> dict:
        """Change an alarm's enabled flag, time or label; returns the alarm."""
        self._check_token(access_token)
        alarm = self._alarm(alarm_id)
        for k, v in (("enabled", enabled), ("time", time), ("label", label)):
            if v is not None:
                alarm[k] = v
        return copy.deepcopy(alarm)

    def delete_alarm(self, access_token: str, alarm_id: int) -> dict:
        """Delete an alarm for good."""
        self._check_token(access_token)
        self._world.data["clock"].remove(self._alarm(alarm_id))
        return {"message": f"alarm {alarm_id} deleted"}


class NotesApis(AppApis):
    """The notes app: search notes by tag, create and delete them."""
    app_name = "notes"
    description = "Notes with tags: search, create and delete them."

    def search_notes(self, access_token: str, tag: str | None = None) -> list:
        """Notes [{"id", "title", "tags"}], only those with ``tag`` if given."""
        self._check_token(access_token)
        return [copy.deepcopy(n) for n in self._world.data["notes"]
                if tag is None or tag in n["tags"]]

    def create_note(self, access_token: str, title: str, tags: list | None = None) -> dict:
        """Create a note; returns it."""
        self._check_token(access_token)
        notes = self._world.data["notes"]
        note = {"id": max([n["id"] for n in notes], default=0) + 1, "title": str(title),
                "tags": list(tags or [])}
        notes.append(note)
        return copy.deepcopy(note)


class WalletApis(AppApis):
    """The wallet app: balance, contacts, transactions and sending money to a contact."""
    app_name = "wallet"
    description = "Money: balance, contacts, transactions and sending money to a contact."

    def show_balance(self, access_token: str) -> float:
        """The account balance in dollars."""
        self._check_token(access_token)
        return self._world.data["wallet"]["balance"]

    def show_contacts(self, access_token: str) -> list:
        """Contacts [{"name", "email"}]."""
        self._check_token(access_token)
        return copy.deepcopy(self._world.data["wallet"]["contacts"])

    def send_money(self, access_token: str, email: str, amount: float, note: str = "") -> dict:
        """Send ``amount`` dollars to the contact with ``email``, with a note."""
        self._check_token(access_token)
        wallet = self._world.data["wallet"]
        if email not in [c["email"] for c in wallet["contacts"]]:
            raise ApiError(f"wallet: {email!r} is not a contact")
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount <= 0:
            raise ApiError("wallet: amount must be a positive number")
        if amount > wallet["balance"]:
            raise ApiError("wallet: insufficient balance")
        wallet["balance"] = round(wallet["balance"] - amount, 2)
        tx = {"to": email, "amount": amount, "note": str(note)}
        wallet["transactions"].append(tx)
        return copy.deepcopy(tx)


class SupervisorApis:
    """The task owner's facts (account passwords, profile) and the task's completion."""

    app_name = "supervisor"
    description = "Your supervisor: profile, account passwords, and completing the task."

    def __init__(self, world: World):
        self._world = world

    def show_profile(self) -> dict:
        """The supervisor's name and email (the username of every app)."""
        u = self._world.data["users"]
        return {"name": u["name"], "email": u["email"]}

    def show_account_passwords(self) -> list:
        """[{"account_name", "password"}] for every app."""
        return [{"account_name": k, "password": v}
                for k, v in sorted(self._world.data["users"]["passwords"].items())]

    def complete_task(self, answer: Any = None) -> dict:
        """Mark the task complete, with the answer if the task asks a question."""
        task = self._world.data["task"]
        if task["status"] != "active":
            raise ApiError("supervisor: the task is already complete")
        task.update(status="complete", answer=copy.deepcopy(answer))
        return {"message": "Marked the active task complete."}


_APPS = (ClockApis, NotesApis, WalletApis, SupervisorApis)
APP_NAMES = tuple(cls.app_name for cls in _APPS)


def _public_methods(obj: Any) -> dict:
    return {n: m for n, m in inspect.getmembers(obj, inspect.ismethod) if not n.startswith("_")}


class ApiDocsApis:
    """API discovery, as AppWorld's ``api_docs`` app."""

    app_name = "api_docs"

    def __init__(self, apps: dict):
        self._apps = apps

    def show_app_descriptions(self) -> list:
        """[{"name", "description"}] of every app."""
        return [{"name": n, "description": a.description} for n, a in self._apps.items()]

    def show_api_descriptions(self, app_name: str) -> list:
        """[{"name", "description"}] of an app's APIs."""
        app = self._apps.get(app_name)
        if app is None:
            raise ApiError(f"api_docs: no app named {app_name!r}")
        return [{"name": n, "description": (m.__doc__ or "").strip()}
                for n, m in _public_methods(app).items()]

    def show_api_doc(self, app_name: str, api_name: str) -> dict:
        """One API's signature and description."""
        method = _public_methods(self._apps.get(app_name)).get(api_name) \
            if app_name in self._apps else None
        if method is None:
            raise ApiError(f"api_docs: no API {app_name}.{api_name}")
        return {"name": api_name, "signature": f"{api_name}{inspect.signature(method)}",
                "description": (method.__doc__ or "").strip()}


class ApiCollection:
    """``apis``: one attribute per app, plus ``api_docs``."""

    def __init__(self, world: World):
        apps = {cls.app_name: cls(world) for cls in _APPS}
        for name, app in apps.items():
            setattr(self, name, app)
        self.api_docs = ApiDocsApis(apps)
