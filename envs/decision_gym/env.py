"""DECISION GYM: a stateless customer-service environment whose actions are tool calls.

Action format (one per step), documented for agents and prompts::

    {"tool": "cancel_order", "args": {"order_id": "O-10423"}}

given as a JSON string or as a dict with the same keys; ``args`` may be omitted for tools
without required parameters. Tool names are the variant's names (Shift renames every tool).
Anything malformed (bad JSON, unknown tool, wrong or missing arguments) gets an ``Error: ...``
observation and never raises.

A step's observation is the tool's result (JSON text), the customer's reply to
``ask_customer``, or an error. ``render_context`` gives the whole conversation for decision
questions. Answer keys (``DecisionGym.answer_key``) are never part of an observation or of
``info``.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import json
import operator
import random
import zlib
from typing import Any, Mapping

import numpy as np

from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.decision_gym import plan as plan_lib
from jaxdm.envs.decision_gym.tools import FINISH, TOOLS, Tool, tool_named, validate_args
from jaxdm.envs.decision_gym.world import (BASE, CANCELLABLE, FEE_RATE, SHIFT, SPLIT_RANGES,
                                           VARIANTS, Customer, Order, Task, find,
                                           generate_task)


@dataclasses.dataclass(frozen=True)
class GymParams:
    """Episode settings: variant (base / shift / hard), strict mode, step budget, and the split
    whose seed range ``reset`` draws from (None: the key's int is the task seed itself)."""

    variant: str = BASE
    strict: bool = True
    max_steps: int = 30
    split: str | None = "train"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"GymParams.variant {self.variant!r} not in {list(VARIANTS)}")
        if self.split is not None:
            SPLIT_RANGES.validate(self.split, field="GymParams.split")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"GymParams.max_steps must be a positive int, got {self.max_steps!r}")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One exchange of the conversation: the agent's call (canonical JSON) and what came back."""

    action: str
    observation: str
    tool: str | None  # canonical tool name, None when the action was not understood


@dataclasses.dataclass(frozen=True)
class GymState:
    """Immutable episode state; the task is shared, the world's mutable parts are copied."""

    task: Task
    customers: tuple[Customer, ...]
    orders: tuple[Order, ...]
    stock: tuple[tuple[str, int], ...]
    known: frozenset[str]
    looked: frozenset[str] = frozenset()
    wrote: bool = False
    # Why the task can no longer succeed (non-strict mode after an unplanned write).
    broken: str | None = None
    extra_writes: tuple[str, ...] = ()
    history: tuple[Turn, ...] = ()
    t: int = 0
    done: bool = False
    won: bool = False
    irreversible_error: str | None = None
    truncated: bool = False

    def order(self, order_id: str) -> Order | None:
        """The order ``order_id`` as it stands in this state (after the episode's writes), None when
        there is none."""
        return find(self.orders, "order_id", order_id)

    def customer(self, customer_id: str) -> Customer | None:
        """The customer ``customer_id`` as it stands in this state, None when there is none."""
        return find(self.customers, "customer_id", customer_id)

    @property
    def solvable(self) -> bool:
        """Whether the task can still succeed: nothing broke it, no irreversible error, and it did
        not end unwon."""
        return self.broken is None and self.irreversible_error is None and not (
            self.done and not self.won)


def parse_action(action: Any) -> tuple[str | None, Any, str | None]:
    """(tool name, args, None) or (None, None, error text) from a JSON string or dict."""
    if isinstance(action, str):
        try:
            action = json.loads(action)
        except json.JSONDecodeError as e:
            return None, None, (f"could not parse the action as JSON ({e.msg}); expected "
                                '{"tool": "<name>", "args": {...}}')
    if not isinstance(action, Mapping):
        return None, None, (f"the action must be a JSON object, got {type(action).__name__}; "
                            'expected {"tool": "<name>", "args": {...}}')
    extra = set(action) - {"tool", "args"}
    if extra:
        return None, None, f"unknown key(s) {sorted(map(str, extra))} in the action"
    name = action.get("tool")
    if not isinstance(name, str) or not name:
        return None, None, 'the action has no "tool" name'
    return name, action.get("args", {}), None


def format_action(tool: str, args: Mapping[str, Any]) -> str:
    """An action as the env reads it: {"tool": name, "args": {...}} as JSON, arguments sorted by
    name."""
    return json.dumps({"tool": tool, "args": {k: args[k] for k in sorted(args)}})


def policy_text(task: Task) -> str:
    """The shop policy the agent is shown for ``task`` (verification, cancel and return rules, and
    the fee and regional rules where the task has them)."""
    lines = [
        "Shop policy:",
        "- Verify the customer's account (find it by email or customer id) before discussing "
        "or changing their orders.",
        "- Orders can be cancelled only before they ship (status pending or processing).",
        "- The shipping address can be changed only before the order ships.",
        "- Items can be returned within 30 days of delivery (gold members: 60 days); refunds go "
        "to the original payment method. Exchanges need the replacement in stock.",
        "- If the request is missing a detail only the customer knows, ask the customer.",
        "- Make no change the customer did not ask for; finish when the request is handled.",
    ]
    if task.fee_rule:
        lines.append(f"- Cancelling an order placed more than 24 hours ago costs a "
                     f"{int(FEE_RATE * 100)}% fee (gold members are exempt); the customer must "
                     "agree to the fee before you cancel.")
    if task.restricted_regions:
        lines.append("- We do not ship to these regions: " + ", ".join(task.restricted_regions)
                     + "; refuse address changes into them.")
    return "\n".join(lines)


def _stamp(task: Task, hours_ago: float) -> str:
    now = dt.datetime.strptime(task.now, "%Y-%m-%d %H:%M")
    return (now - dt.timedelta(hours=hours_ago)).strftime("%Y-%m-%d %H:%M")


def stable_digest(*parts: Any) -> int:
    """A process-independent hash (Python's ``hash`` of str is salted per process)."""
    return zlib.crc32("|".join(map(str, parts)).encode())


class DecisionGym(Environment[GymState, GymParams]):
    """The customer-service environment (see the module docstring for the action format)."""

    name = "decision_gym"

    @property
    def default_params(self) -> GymParams:
        """GymParams() (the base variant's defaults)."""
        return GymParams()

    # ---- episodes --------------------------------------------------------------------
    def task_seed(self, key: Any, params: GymParams) -> int:
        """The task seed ``reset`` plays for ``key``.

        With ``params.split`` set: an int that is a seed of that split is used as is; an int
        that is a seed of another split is an error (it would silently leak across splits);
        any other int is a task index, and a JAX key's bits are mapped, into the split's range.
        With ``params.split`` None the int (or the key's bits) is the task seed itself.
        """
        seed = seed_of(key)
        if seed < 0:
            raise ValueError(f"task seed must be non-negative, got {seed}")
        if params.split is None:
            return seed
        lo, hi = SPLIT_RANGES[params.split]
        if isinstance(key, (int, np.integer)):
            for name, (a, b) in SPLIT_RANGES.items():
                if a <= seed < b:
                    if name != params.split:
                        raise ValueError(f"seed {seed} belongs to split {name!r} but "
                                         f"GymParams.split is {params.split!r}")
                    return seed
        return lo + seed % (hi - lo)

    def reset_env(self, key: Any, params: GymParams) -> tuple[str, GymState]:
        """A new episode of the task generated from ``key``'s task seed in the params' variant and
        split."""
        return self.reset_to_task(generate_task(self.task_seed(key, params), params.variant))

    def reset_to_task(self, task: Task) -> tuple[str, GymState]:
        """An episode of the given ``task`` (its first observation, its initial state)."""
        state = GymState(task=task, customers=task.customers, orders=task.orders,
                         stock=tuple((p.product_id, p.stock) for p in task.products),
                         known=task.given)
        return self.first_observation(task), state

    def reset_info(self, state: GymState, params: GymParams | None = None) -> dict[str, Any]:
        """Episode facts for trajectories and prompts (read by ``VectorEnv`` at reset)."""
        params = self.default_params if params is None else params
        return {"goal": state.task.message, "task_type": state.task.request,
                "budget": params.max_steps, "env": self.name, "task_id": state.task.task_id,
                "admissible_actions": list(self.tool_names(state, params, shuffled=True))}

    def first_observation(self, task: Task) -> str:
        """What the agent sees first: time, policy, catalogue, (Hard) the customer queue, and
        the customer's message; later observations are tool results and replies."""
        return render_context(GymState(task=task, customers=task.customers, orders=task.orders,
                                       stock=(), known=task.given))

    def answer_key(self, state: GymState) -> plan_lib.AnswerKey | None:
        """The acceptable next calls, or None when the task can no longer succeed / is over."""
        if state.done or not state.solvable:
            return None
        oid = state.task.fact("order_id")
        return plan_lib.answer_key(state.task, known=state.known, looked=state.looked,
                                   wrote=state.wrote, order=state.order(oid) if oid else None,
                                   stock=dict(state.stock))

    # ---- stepping --------------------------------------------------------------------
    def step_env(self, key: Any, state: GymState, action: Any, params: GymParams):
        """One JSON tool call: read tools return the looked-up record, write tools change the
        shop's state (a write the plan does not make ends the episode as an irreversible error
        with params.strict, else leaves the task unsolvable), finish ends the episode (reward 1
        when finishing was the plan's next step); a call that does not parse or fails its
        argument check is invalid (a no-op turn); max_steps truncates."""
        del key  # the environment is deterministic given the state
        task = state.task
        shift = params.variant == SHIFT or task.variant == SHIFT
        info: dict[str, Any] = {"goal": task.message, "task_type": task.request,
                                "task_id": task.task_id, "irreversible_error": False,
                                "truncated": False}
        if state.done:
            info.update(self._flags(valid=False, won=state.won, milestone=False, no_op=True,
                                    params=params, state=state))
            return "The conversation has ended.", state, 0.0, True, info

        name, args, error = parse_action(action)
        tool = None if name is None else tool_named(name, shift)
        if error is None and tool is None:
            error = f"unknown tool {name!r}; call one of the tools in the tool list"
        clean = None
        if error is None:
            clean, error = validate_args(tool, args if args is not None else {})
        if error is not None:
            obs = f"Error: {error}"
            text = action if isinstance(action, str) else json.dumps(action, default=str)
            new = self._advance(state, Turn(text, obs, None), params)
            info.update(self._flags(valid=False, won=False, milestone=False, no_op=True,
                                    params=params, state=new))
            return obs, new, 0.0, new.done, info

        key_before = self.answer_key(state)
        in_plan = key_before is not None and key_before.accepts(tool.name, clean)
        call = format_action(tool.display_name(shift), clean)
        reward = 0.0
        changes: dict[str, Any] = {}
        if tool.kind == FINISH:
            won = in_plan
            obs = ("Conversation closed: the request was handled." if won else
                   "Conversation closed before the request was handled.")
            changes.update(done=True, won=won)
            reward = 1.0 if won else 0.0
            ok = True
        else:
            obs, changes, ok = self._execute(state, tool, clean)
            if tool.writes and ok and not in_plan:
                # A data change the plan does not make: irreversible.
                if params.strict:
                    changes.update(done=True,
                                   irreversible_error=f"unplanned {tool.name} call {call}")
                    obs += "\n[The change was applied and cannot be undone.]"
                    info["irreversible_error"] = True
                else:
                    changes["broken"] = f"unplanned {tool.name} call {call}"
            elif tool.writes and ok and in_plan and tool.kind != FINISH:
                changes["wrote"] = True
        new = dataclasses.replace(state, **changes)
        no_op = (not ok) or all(getattr(new, f) == getattr(state, f) for f in
                                ("known", "looked", "wrote", "orders", "customers", "stock",
                                 "broken", "extra_writes", "done"))
        no_op = no_op or any(t.action == call for t in state.history)
        new = self._advance(new, Turn(call, obs, tool.name), params)
        info.update(self._flags(valid=ok, won=new.won, milestone=in_plan and ok, no_op=no_op,
                                params=params, state=new))
        return obs, new, reward, new.done, info

    def _advance(self, state: GymState, turn: Turn, params: GymParams) -> GymState:
        t = state.t + 1
        truncated = not state.done and t >= params.max_steps
        done = state.done or truncated
        return dataclasses.replace(state, history=state.history + (turn,), t=t, done=done,
                                   truncated=truncated and not state.won)

    def _flags(self, *, valid, won, milestone, no_op, params, state) -> dict[str, Any]:
        shift = params.variant == SHIFT or state.task.variant == SHIFT
        return {"admissible_actions": self.tool_names(state, params, shuffled=True),
                "valid": bool(valid), "won": bool(won), "milestone": bool(milestone),
                "no_op": bool(no_op), "solvable": state.solvable, "shift": shift,
                "truncated": state.truncated,
                "irreversible_error": state.irreversible_error is not None}

    def tool_names(self, state: GymState, params: GymParams, shuffled: bool = True,
                   salt: str = "tools") -> tuple[str, ...]:
        """The 69 tool names of the variant, shuffled per (task, step, salt)."""
        shift = params.variant == SHIFT or state.task.variant == SHIFT
        tools = list(TOOLS)
        if shuffled:
            random.Random(stable_digest(state.task.task_id, state.t, salt)).shuffle(tools)
        return tuple(t.display_name(shift) for t in tools)

    # ---- tools -----------------------------------------------------------------------
    def _execute(self, state: GymState, tool: Tool, args: dict[str, Any]
                 ) -> tuple[str, dict[str, Any], bool]:
        """Run one (validated, non-finish) call: (observation, state changes, ok)."""
        fn = getattr(self, f"_tool_{tool.name}", None)
        if fn is not None:
            return fn(state, **args)
        if tool.kind == "near_duplicate":
            return self._near_duplicate(state, tool, args)
        return self._irrelevant(state, tool, args), {}, True

    @staticmethod
    def _err(text: str) -> tuple[str, dict, bool]:
        return f"Error: {text}", {}, False

    @staticmethod
    def _ok(payload: Any, changes: dict | None = None) -> tuple[str, dict, bool]:
        return json.dumps(payload), changes or {}, True

    def _find(self, state: GymState, query: str) -> Customer | None:
        q = plan_lib.normalize(query)
        for c in state.customers:
            if q in (plan_lib.normalize(c.customer_id), plan_lib.normalize(c.email)):
                return c
        return None

    def _orders_of(self, state: GymState, customer_id: str) -> list[str]:
        return [o.order_id for o in state.orders if o.customer_id == customer_id]

    def _tool_find_customer(self, state, query):
        c = self._find(state, query)
        if c is None:
            return self._err(f"no customer account matches {query!r}; search by email address "
                             "or customer id")
        return self._ok({"customer_id": c.customer_id, "name": c.name, "email": c.email,
                         "phone": c.phone, "address": c.address, "tier": c.tier,
                         "gift_cards": [{"code": g, "balance": b} for g, b in c.gift_cards],
                         "orders": self._orders_of(state, c.customer_id)},
                        {"looked": state.looked | {f"customer:{c.customer_id}"}})

    def _order_view(self, state: GymState, o: Order) -> dict[str, Any]:
        task = state.task
        view: dict[str, Any] = {
            "order_id": o.order_id, "customer_id": o.customer_id, "status": o.status,
            "placed_at": _stamp(task, o.placed_hours_ago),
            "delivered_at": (None if o.delivered_days_ago is None
                             else _stamp(task, 24 * o.delivered_days_ago)),
            "shipping_method": o.shipping_method, "shipping_address": o.shipping_address,
            "payment": o.payment, "total": o.total,
            "items": [{"product_id": i.product_id, "name": i.name, "qty": i.qty,
                       "price": i.price, "status": i.status}
                      | ({"shipment": i.shipment} if o.second_shipment_status else {})
                      for i in o.items],
            "returns": [{"item_id": r[0], "resolution": r[1], "status": r[2], "refund": r[3],
                         "amount": r[4]} for r in o.returns],
        }
        if o.second_shipment_status:
            view["shipments"] = [{"shipment": 1, "status": o.status},
                                 {"shipment": 2, "status": o.second_shipment_status}]
        return view

    def _tool_get_order(self, state, order_id):
        o = state.order(order_id)
        if o is None:
            return self._err(f"order {order_id!r} not found")
        return self._ok(self._order_view(state, o),
                        {"looked": state.looked | {f"order:{o.order_id}"}})

    def _tool_get_product(self, state, product_id):
        p = state.task.product(product_id)
        if p is None:
            return self._err(f"product {product_id!r} not found")
        stock = dict(state.stock)[p.product_id]
        return self._ok({"product_id": p.product_id, "name": p.name, "price": p.price,
                         "in_stock": stock, "available": stock > 0},
                        {"looked": state.looked | {f"product:{p.product_id}"}})

    def _replace_order(self, state: GymState, order: Order) -> tuple[Order, ...]:
        return tuple(order if o.order_id == order.order_id else o for o in state.orders)

    def _tool_cancel_order(self, state, order_id, item_id=None, reason=None):
        o = state.order(order_id)
        if o is None:
            return self._err(f"order {order_id!r} not found")
        if item_id is not None:
            line = o.item(item_id)
            if line is None:
                return self._err(f"order {order_id} has no item {item_id!r}")
            shipped = (o.status if line.shipment == 1 or o.second_shipment_status is None
                       else o.second_shipment_status)
            if line.status != "open" or shipped not in CANCELLABLE:
                now = line.status if line.status != "open" else shipped
                return self._err(f"item {item_id} of order {order_id} is {now} and cannot be "
                                 "cancelled")
            items = tuple(dataclasses.replace(i, status="cancelled") if i.product_id == item_id
                          else i for i in o.items)
            new = dataclasses.replace(o, items=items)
            return self._ok({"order_id": order_id, "cancelled_item": item_id,
                             "refund_amount": round(line.price * line.qty, 2),
                             "refund_to": o.payment},
                            {"orders": self._replace_order(state, new)})
        if o.status not in CANCELLABLE:
            return self._err(f"order {order_id} is {o.status} and can no longer be cancelled")
        fee = round(o.total * FEE_RATE, 2) if plan_lib.fee_applies(state.task, o) else 0.0
        new = dataclasses.replace(o, status="cancelled",
                                  items=tuple(dataclasses.replace(i, status="cancelled")
                                              for i in o.items))
        return self._ok({"order_id": order_id, "status": "cancelled", "cancellation_fee": fee,
                         "refund_amount": round(o.total - fee, 2), "refund_to": o.payment},
                        {"orders": self._replace_order(state, new)})

    def _tool_update_address(self, state, order_id, address):
        o = state.order(order_id)
        if o is None:
            return self._err(f"order {order_id!r} not found")
        if o.status not in CANCELLABLE:
            return self._err(f"order {order_id} is {o.status}; its address can no longer change")
        if not plan_lib.region_of(address):
            return self._err(f"address {address!r} is not a full postal address "
                             "('<number> <street>, <city>, <ST> <zip>')")
        new = dataclasses.replace(o, shipping_address=address)
        return self._ok({"order_id": order_id, "shipping_address": address, "status": o.status},
                        {"orders": self._replace_order(state, new)})

    def _tool_update_email(self, state, customer_id, email):
        c = state.customer(customer_id)
        if c is None:
            return self._err(f"customer {customer_id!r} not found")
        if "@" not in email or " " in email:
            return self._err(f"{email!r} is not an email address")
        new = dataclasses.replace(c, email=email)
        customers = tuple(new if x.customer_id == customer_id else x for x in state.customers)
        return self._ok({"customer_id": customer_id, "email": email}, {"customers": customers})

    def _tool_create_return(self, state, order_id, item_id, resolution, refund_method=None,
                            replacement_product_id=None):
        o = state.order(order_id)
        if o is None:
            return self._err(f"order {order_id!r} not found")
        if o.status != "delivered":
            return self._err(f"order {order_id} is {o.status}; only delivered items can be "
                             "returned")
        line = o.item(item_id)
        if line is None or line.status != "open" or any(r[0] == item_id for r in o.returns):
            return self._err(f"order {order_id} has no returnable item {item_id!r}")
        stock = dict(state.stock)
        changes: dict[str, Any] = {}
        if resolution == "exchange":
            if replacement_product_id is None:
                return self._err("an exchange needs replacement_product_id")
            if state.task.product(replacement_product_id) is None:
                return self._err(f"product {replacement_product_id!r} not found")
            if stock[replacement_product_id] <= 0:
                return self._err(f"product {replacement_product_id} is out of stock")
            stock[replacement_product_id] -= 1
            changes["stock"] = tuple(stock.items())
        elif replacement_product_id is not None:
            return self._err("replacement_product_id is only valid for an exchange")
        amount = round(line.price * line.qty, 2) if resolution == "refund" else 0.0
        rid = f"R-{stable_digest(order_id, item_id) % 90000 + 10000}"
        new = dataclasses.replace(o, returns=o.returns + (
            (item_id, resolution, "label_sent", "none" if amount == 0 else "awaiting_item",
             amount),))
        changes["orders"] = self._replace_order(state, new)
        return self._ok({"return_id": rid, "order_id": order_id, "item_id": item_id,
                         "resolution": resolution,
                         "refund_to": (refund_method or "original_payment")
                         if resolution == "refund" else None,
                         "replacement_product_id": replacement_product_id,
                         "label": f"https://shop.example/returns/{rid}.pdf"}, changes)

    def _tool_ask_customer(self, state, about, question=None):
        task = state.task
        topic = about
        if topic == "other":
            topic = _topic_from_text(question or "")
        relevant = set(plan_lib.NEEDED_FACTS[task.request])
        if task.fact("confirm_fee") is not None:
            relevant.add("confirm_fee")
        value = task.fact(topic) if topic in relevant else None
        if topic is None or value is None:
            return ("Customer: Sorry, I don't know what you mean - I can't help with that.",
                    {}, True)
        names = {p.product_id: p.name for p in task.products}
        if topic == "order_id":
            reply = f"It's order {value}."
        elif topic in ("item", "replacement", "product"):
            reply = f"The {names.get(value, value)}."
        elif topic == "new_address":
            reply = f"Please use {value}."
        elif topic == "new_email":
            reply = f"My new email is {value}."
        else:  # confirm_fee
            reply = ("Yes, cancel it anyway - the fee is fine." if value else
                     "No, in that case please keep the order.")
        return f"Customer: {reply}", {"known": state.known | {topic}}, True

    def _near_duplicate(self, state: GymState, tool: Tool, args: dict[str, Any]):
        """Realistic answers of the look-alike tools; writes succeed when their ids exist."""
        for p in tool.params:
            v = args.get(p.name)
            if v is None:
                continue
            if p.sem == "order_id" and state.order(v) is None:
                return self._err(f"order {v!r} not found")
            if p.sem == "customer_id" and state.customer(v) is None:
                return self._err(f"customer {v!r} not found")
            if p.sem == "product_id" and state.task.product(v) is None:
                return self._err(f"product {v!r} not found")
        n = tool.name
        if n == "find_client_legacy":
            return self._err("the legacy CRM holds no record migrated after 2023 for "
                             f"{args['query']!r}")
        if n == "lookup_customer_by_phone":
            for c in state.customers:
                if c.phone == args["phone"]:
                    return self._ok({"customer_id": c.customer_id, "name": c.name})
            return self._err(f"no customer with phone {args['phone']!r}")
        if n == "get_order_summary_cached":
            o = state.order(args["order_id"])
            return self._ok({"order_id": o.order_id, "status": "processing",
                             "cached_at": _stamp(state.task, 20), "note": "nightly snapshot"})
        if n == "get_invoice":
            o = state.order(args["order_id"])
            return self._ok({"invoice_id": f"INV-{o.order_id[2:]}", "amount": o.total,
                             "issued": _stamp(state.task, o.placed_hours_ago)})
        if n == "get_shipment_tracking":
            return self._err(f"no carrier events for tracking number {args['tracking_number']!r}")
        if n == "get_product_reviews":
            return self._ok({"product_id": args["product_id"], "average_rating": 4.2,
                             "reviews": ["Does the job.", "Good value for the price."]})
        if n == "check_warehouse_inventory":
            stock = dict(state.stock)[args["product_id"]]
            return self._ok({"product_id": args["product_id"], "bin_units": stock + 7,
                             "note": "includes reserved and damaged units"})
        if n in ("list_subscriptions", "search_orders_archive", "get_payment_methods",
                 "get_loyalty_points"):
            cid = args["customer_id"]
            cards = [o.payment for o in state.orders if o.customer_id == cid][:2]
            return self._ok({"list_subscriptions": {"subscriptions": []},
                             "search_orders_archive": {"archived_orders": []},
                             "get_payment_methods": {"cards": cards},
                             "get_loyalty_points": {"points": stable_digest(cid) % 2000}}[n])
        if n == "get_return_label":
            return self._err(f"no return {args['return_id']!r}")
        if not tool.writes:
            return self._ok({"result": "ok"})
        # A write that targets existing records succeeds and changes data.
        shown = ", ".join(f"{k}={v}" for k, v in sorted(args.items()))
        return (json.dumps({"status": "done", "action": n, "detail": shown}),
                {"extra_writes": state.extra_writes + (n,)}, True)

    def _irrelevant(self, state: GymState, tool: Tool, args: dict[str, Any]) -> str:
        n = tool.name
        h = stable_digest(n, sorted(args.items()))
        if n == "calculator":
            try:
                return json.dumps({"result": _safe_eval(args["expression"])})
            except (ValueError, SyntaxError, ZeroDivisionError) as e:
                return f"Error: cannot evaluate {args['expression']!r} ({e})"
        if n == "get_weather":
            return json.dumps({"city": args["city"], "temperature_c": h % 30 - 5,
                               "conditions": ("sunny", "cloudy", "rain", "windy")[h % 4]})
        if n == "random_number":
            lo, hi = args["low"], args["high"]
            if hi < lo:
                return "Error: high must be >= low"
            return json.dumps({"value": lo + h % (hi - lo + 1)})
        if n == "count_words":
            return json.dumps({"words": len(args["text"].split())})
        return json.dumps({"tool": tool.name, "result": f"ok (ref {h % 100000:05d})"})


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _safe_eval(expr: str) -> float:
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / are supported")
    if len(expr) > 200:
        raise ValueError("expression too long")
    return ev(ast.parse(expr, mode="eval"))


_TOPIC_WORDS = (("confirm_fee", ("fee", "charge")), ("new_email", ("email", "e-mail")),
                ("new_address", ("address", "ship to", "deliver to")),
                ("replacement", ("instead", "replacement", "exchange", "colour", "color")),
                ("order_id", ("order number", "which order", "order id", "purchase")),
                ("item", ("which item", "item", "product")))


def _topic_from_text(text: str) -> str | None:
    low = text.lower()
    for topic, words in _TOPIC_WORDS:
        if any(w in low for w in words):
            return topic
    return None


def render_context(state: GymState) -> str:
    """The decision context: policy, catalogue, (Hard) customer directory, conversation."""
    task = state.task
    parts = [f"Current time: {task.now}", policy_text(task), "Catalogue:"]
    parts += [f"- {p.product_id} {p.name}, ${p.price:.2f}" for p in task.products]
    if task.directory:
        parts.append("Customers in this support queue:")
        for cid in task.directory:
            c = task.customer(cid)
            parts.append(f"- {c.customer_id} {c.name}, {c.email}, {c.city}")
    parts.append("Conversation:")
    parts.append(f"Customer: {task.message}")
    for turn in state.history:
        parts.append(f"Agent: {turn.action}")
        parts.append(turn.observation if turn.observation.startswith("Customer:")
                     else f"Result: {turn.observation}")
    return "\n".join(parts)


__all__ = ["DecisionGym", "GymParams", "GymState", "Turn", "parse_action", "format_action",
           "policy_text", "render_context"]
