"""Scripted plans and answer keys.

A task's plan is not a fixed list of steps: ``answer_key`` derives the acceptable next calls
from what the agent has learned so far (facts the customer stated, records it has looked up,
whether the plan's one data change is done). That makes every still-solvable state keyed,
including states after harmless detours (a needless lookup, an irrelevant tool, a repeated
question), and lets reads happen in any order.

The plan, per request (``O`` the order in question, ``I`` the item, ``R`` the replacement):

1. Ask first: any fact the request needs that the customer has not stated (which order, which
   item, the new address / email, the replacement) -> ``ask_customer(about=<fact>)``.
2. Look up (any order): the customer's account (``find_customer`` by email or id; not for
   product questions), ``get_order(O)``, ``get_product`` for the product / replacement.
3. Decide by the shop's policy (and the Hard rules), then make at most one data change:
   cancel (only before shipping; Hard: orders older than 24 h need the customer's consent to a
   10 % fee unless gold), change the address (only before shipping; Hard: not into restricted
   regions), return (delivered, within 30 days, 60 for gold; refund to the original payment),
   exchange (same, and the replacement in stock), update the email, cancel the unshipped part
   of a split shipment.
4. ``finish``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from jaxdm.envs.decision_gym.world import CANCELLABLE, FEE_HOURS, Order, Task

ORDER_REQUESTS = ("order_status", "cancel_order", "change_address", "return_item",
                  "refund_status", "exchange", "split_shipment")
# Facts the request needs from the customer before anything else.
NEEDED_FACTS: Mapping[str, tuple[str, ...]] = {
    "order_status": ("order_id",),
    "cancel_order": ("order_id",),
    "change_address": ("order_id", "new_address"),
    "return_item": ("order_id", "item"),
    "refund_status": ("order_id",),
    "exchange": ("order_id", "item", "replacement"),
    "update_email": ("new_email",),
    "product_availability": ("product",),
    "gift_card_balance": (),
    "split_shipment": ("order_id", "item"),
}
NONE = None  # in a key's value set: the optional parameter may be omitted


def normalize(value: Any) -> Any:
    """Canonical form for comparing parameter values (case, spacing)."""
    if isinstance(value, str):
        return re.sub(r"\s+", " ", value.strip()).casefold()
    return value


@dataclasses.dataclass(frozen=True)
class AnswerKey:
    """The acceptable next calls: per tool (canonical name), per constrained parameter, the
    acceptable values (``None`` inside a set: the parameter may be omitted). Parameters not
    listed are free (text such as a reason or a question)."""

    calls: tuple[tuple[str, tuple[tuple[str, frozenset], ...]], ...]

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools of the correct plan, in order."""
        return tuple(name for name, _ in self.calls)

    def params(self, tool: str) -> dict[str, frozenset]:
        """{parameter: the values it accepts} of ``tool``'s call in the plan (empty when the plan
        has no such call)."""
        for name, ps in self.calls:
            if name == tool:
                return dict(ps)
        raise KeyError(f"tool {tool!r} is not in the answer key {self.tools}")

    def accepts_tool(self, tool: str) -> bool:
        """Whether ``tool`` is one of the plan's tools."""
        return tool in self.tools

    def accepts_value(self, tool: str, param: str, value: Any) -> bool:
        """Whether ``value`` is an accepted value of ``param`` in ``tool``'s call (a parameter the
        plan does not constrain accepts anything)."""
        allowed = self.params(tool).get(param)
        if allowed is None:
            return True
        return normalize(value) in {normalize(v) for v in allowed}

    def accepts(self, tool: str, args: Mapping[str, Any]) -> bool:
        """Whether calling ``tool`` with ``args`` follows the plan."""
        if tool not in self.tools:
            return False
        for param, allowed in self.params(tool).items():
            if not self.accepts_value(tool, param, args.get(param)):
                return False
        return True

    def to_json(self) -> dict[str, dict[str, list]]:
        """The key as JSON: {tool: {parameter: sorted accepted values}}."""
        return {name: {p: sorted(vs, key=lambda v: (v is not None, str(v))) for p, vs in ps}
                for name, ps in self.calls}


def _key(calls: Mapping[str, Mapping[str, Any]]) -> AnswerKey:
    return AnswerKey(tuple((name, tuple(sorted((p, frozenset(v)) for p, v in ps.items())))
                           for name, ps in calls.items()))


def fee_applies(task: Task, order: Order) -> bool:
    """Hard rule: cancelling an order placed more than 24 h ago costs a fee (not for gold)."""
    return (task.fee_rule and order.placed_hours_ago > FEE_HOURS
            and task.requester.tier != "gold")


def region_of(address: str) -> str:
    """The two-letter region of a US-style address ("..., CA 94110"), "" when there is none."""
    m = re.search(r",\s*([A-Z]{2})\s+\d{5}\s*$", address)
    return m.group(1) if m else ""


def return_eligible(task: Task, order: Order, item_id: str) -> bool:
    """Whether ``item_id`` of ``order`` can be returned: delivered, the item open and not already
    returned, within the requester's return window."""
    item = order.item(item_id)
    if order.status != "delivered" or item is None or item.status != "open":
        return False
    if any(r[0] == item_id for r in order.returns):
        return False
    return order.delivered_days_ago is not None and (
        order.delivered_days_ago <= task.return_days(task.requester))


def planned_write(task: Task, order: Order | None, known: frozenset[str],
                  stock: Mapping[str, int], email: str | None = None) -> tuple[Any, ...]:
    """What the plan does once every lookup is done: ("ask", fact), ("write", tool, params)
    or ("finish",)."""
    r = task.request
    cid = task.customer_id
    if r == "cancel_order":
        assert order is not None
        if order.status not in CANCELLABLE:
            return ("finish",)
        if fee_applies(task, order):
            if "confirm_fee" not in known:
                return ("ask", "confirm_fee")
            if not task.fact("confirm_fee"):
                return ("finish",)
        return ("write", "cancel_order", {"order_id": {order.order_id}, "item_id": {NONE}})
    if r == "change_address":
        assert order is not None
        new = task.fact("new_address")
        if order.status not in CANCELLABLE or region_of(new) in task.restricted_regions:
            return ("finish",)
        return ("write", "update_address", {"order_id": {order.order_id}, "address": {new}})
    if r == "return_item":
        assert order is not None
        item = task.fact("item")
        if not return_eligible(task, order, item):
            return ("finish",)
        return ("write", "create_return", {
            "order_id": {order.order_id}, "item_id": {item}, "resolution": {"refund"},
            "refund_method": {"original_payment", NONE}, "replacement_product_id": {NONE}})
    if r == "exchange":
        assert order is not None
        item, repl = task.fact("item"), task.fact("replacement")
        if not return_eligible(task, order, item) or stock.get(repl, 0) <= 0:
            return ("finish",)
        return ("write", "create_return", {
            "order_id": {order.order_id}, "item_id": {item}, "resolution": {"exchange"},
            "refund_method": {NONE}, "replacement_product_id": {repl}})
    if r == "update_email":
        return ("write", "update_email", {"customer_id": {cid}, "email": {task.fact("new_email")}})
    if r == "split_shipment":
        assert order is not None
        item = task.fact("item")
        line = order.item(item)
        if (line is None or line.shipment != 2 or line.status != "open"
                or order.second_shipment_status not in CANCELLABLE):
            return ("finish",)
        return ("write", "cancel_order", {"order_id": {order.order_id}, "item_id": {item}})
    return ("finish",)


def answer_key(task: Task, *, known: frozenset[str], looked: frozenset[str], wrote: bool,
               order: Order | None, stock: Mapping[str, int]) -> AnswerKey:
    """The answer key of a still-solvable state (see the module docstring for the plan).

    ``order`` is the current record of the order in question, ``stock`` the catalogue's
    current stock, ``known`` the facts the agent has been told, ``looked`` the records it has
    looked up (``customer:<id>``, ``order:<id>``, ``product:<id>``), ``wrote`` whether the
    plan's data change is done.
    """
    if wrote:
        return _key({"finish": {}})
    missing = [f for f in NEEDED_FACTS[task.request] if f not in known]
    if missing:
        return _key({"ask_customer": {"about": set(missing)}})
    me = task.requester
    reads: dict[str, dict[str, set]] = {}
    if task.request != "product_availability" and f"customer:{me.customer_id}" not in looked:
        reads["find_customer"] = {"query": {me.email, me.customer_id}}
    oid = task.fact("order_id")
    if task.request in ORDER_REQUESTS and f"order:{oid}" not in looked:
        reads["get_order"] = {"order_id": {oid}}
    pid = None
    if task.request == "product_availability":
        pid = task.fact("product")
    elif task.request == "exchange":
        order_ok = f"order:{oid}" not in looked or (
            order is not None and return_eligible(task, order, task.fact("item")))
        pid = task.fact("replacement") if order_ok else None
    if pid is not None and f"product:{pid}" not in looked:
        reads["get_product"] = {"product_id": {pid}}
    if reads:
        return _key(reads)
    step = planned_write(task, order, known, stock)
    if step[0] == "ask":
        return _key({"ask_customer": {"about": {step[1]}}})
    if step[0] == "write":
        return _key({step[1]: step[2]})
    return _key({"finish": {}})
