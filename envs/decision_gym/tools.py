"""The DECISION GYM tool catalogue: 7 core tools, 1 ask tool, 31 near-duplicates, 29 irrelevant
tools and ``finish`` (69 in all), each with a description and a JSON schema of parameters.

Parameters carry a *semantic type* beside their JSON type (``order_id``, ``customer_id``,
``product_id``, ``email``, ``address``, ``enum``, ``text``, ...). The type says where a value may
be copied from the conversation, which is what the parameter questions are built from.

The Shift variant renames every tool and rewords every description (``shift_name``,
``shift_description``); agents address tools by the names of the variant they play.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

CORE, ASK, NEAR, IRRELEVANT, FINISH = "core", "ask", "near_duplicate", "irrelevant", "finish"
KINDS = (CORE, ASK, NEAR, IRRELEVANT, FINISH)
# Semantic types whose values can be copied from the context (parameter questions use them).
COPYABLE = ("order_id", "customer_id", "customer_query", "product_id", "email", "address")
ASK_TOPICS = ("order_id", "item", "new_address", "new_email", "replacement", "product",
              "confirm_fee", "other")


@dataclasses.dataclass(frozen=True)
class Param:
    """One tool parameter: name, semantic type, required flag, enum values (for ``enum``)."""

    name: str
    sem: str  # order_id | customer_id | customer_query | product_id | email | address | text |
    #           number | integer | bool | enum | date | string
    required: bool = True
    values: tuple[str, ...] = ()
    description: str = ""

    @property
    def json_type(self) -> str:
        """The parameter's JSON Schema type (number, integer, boolean, else string)."""
        return {"number": "number", "integer": "integer", "bool": "boolean"}.get(self.sem, "string")

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON Schema (type, allowed values as an enum, description)."""
        s: dict[str, Any] = {"type": self.json_type}
        if self.values:
            s["enum"] = list(self.values)
        if self.description:
            s["description"] = self.description
        return s


@dataclasses.dataclass(frozen=True)
class Tool:
    """A tool as offered to the agent. ``writes`` marks data-changing tools (strict mode)."""

    name: str
    kind: str
    writes: bool
    description: str
    params: tuple[Param, ...]
    shift_name: str
    shift_description: str

    def display_name(self, shift: bool) -> str:
        """The tool's name as shown: its Shift-variant name under ``shift``."""
        return self.shift_name if shift else self.name

    def display_description(self, shift: bool) -> str:
        """The tool's description as shown (the Shift variant's under ``shift``)."""
        return self.shift_description if shift else self.description

    def param(self, name: str) -> Param | None:
        """The tool's parameter called ``name``, None when it has none."""
        for p in self.params:
            if p.name == name:
                return p
        return None

    def json_schema(self, shift: bool = False) -> dict[str, Any]:
        """The tool in the usual function-calling layout (name, description, parameters)."""
        return {
            "name": self.display_name(shift),
            "description": self.display_description(shift),
            "parameters": {
                "type": "object",
                "properties": {p.name: p.schema() for p in self.params},
                "required": [p.name for p in self.params if p.required],
            },
        }

    def signature(self, shift: bool = False) -> str:
        """"name(a, b?)": the shown name with its parameters, optional ones marked "?"."""
        args = ", ".join(p.name + ("" if p.required else "?") for p in self.params)
        return f"{self.display_name(shift)}({args})"


def _p(spec: str, description: str = "") -> Param:
    """Parse ``name:sem`` with a trailing ``?`` for optional and ``enum(a|b)`` for enums."""
    required = not spec.endswith("?")
    spec = spec.rstrip("?")
    name, sem = spec.split(":", 1)
    values: tuple[str, ...] = ()
    if sem.startswith("enum("):
        values = tuple(sem[5:-1].split("|"))
        sem = "enum"
    return Param(name, sem, required, values, description)


# (name, kind, writes, description, params, shift name, shift description or "" to derive)
_TABLE: list[tuple[str, str, bool, str, tuple[str, ...], str, str]] = [
    # ---- core (7) ----------------------------------------------------------------------
    ("find_customer", CORE, False,
     "Look up a customer account by email address or customer id; returns the profile, tier, "
     "gift cards and order ids.", ("query:customer_query",),
     "account_lookup", "Retrieve the shopper's account (profile, membership level, gift cards, "
     "orders) given their e-mail or account number."),
    ("get_order", CORE, False,
     "Get the full details of one order: status, items, dates, shipping address, payment, "
     "returns and refunds.", ("order_id:order_id",),
     "order_details", "Show everything recorded for a single purchase: state, lines, timestamps, "
     "delivery address, payment, returns and refunds."),
    ("get_product", CORE, False,
     "Get a catalogue product: name, price and units in stock.", ("product_id:product_id",),
     "catalog_item", "Read one catalogue entry with its price and how many units can be sold."),
    ("cancel_order", CORE, True,
     "Cancel an order that has not shipped yet (or one unshipped item of it); the payment is "
     "released.", ("order_id:order_id", "item_id:product_id?", "reason:text?"),
     "order_void", "Call off a purchase (or a single line still waiting to ship) before it leaves "
     "the warehouse; the charge is released."),
    ("update_address", CORE, True,
     "Change the shipping address of an order that has not shipped yet.",
     ("order_id:order_id", "address:address"),
     "redirect_delivery", "Send a not-yet-shipped purchase to a different delivery address."),
    ("update_email", CORE, True,
     "Change the contact email address of a customer account.",
     ("customer_id:customer_id", "email:email"),
     "set_contact_mail", "Replace the e-mail address stored on a shopper's account."),
    ("create_return", CORE, True,
     "Open a return for one delivered item: refund to a payment method or exchange for another "
     "product.", ("order_id:order_id", "item_id:product_id", "resolution:enum(refund|exchange)",
                  "refund_method:enum(original_payment|store_credit|gift_card)?",
                  "replacement_product_id:product_id?"),
     "start_return", "Register the send-back of one delivered line, either for money back or for "
     "a swap to another catalogue item."),
    # ---- ask (1) -----------------------------------------------------------------------
    ("ask_customer", ASK, False,
     "Ask the customer a question and wait for the reply (for facts only the customer knows).",
     ("about:enum(" + "|".join(ASK_TOPICS) + ")", "question:text?"),
     "message_shopper", "Send the shopper a question and get their answer, for details only they "
     "can give."),
    # ---- finish (1) --------------------------------------------------------------------
    ("finish", FINISH, False,
     "End the conversation with a final reply to the customer.", ("message:text?",),
     "finish", "Close the case with a last message to the shopper."),
    # ---- near-duplicates (31): plausible, wrong semantics --------------------------------
    ("find_client_legacy", NEAR, False,
     "Search the legacy CRM (archived before the 2023 migration) for a client record.",
     ("query:customer_query",), "legacy_account_search", ""),
    ("lookup_customer_by_phone", NEAR, False,
     "Find a customer by phone number.", ("phone:string",), "account_by_phone", ""),
    ("get_order_summary_cached", NEAR, False,
     "Get a cached order summary (refreshed nightly; may be out of date).",
     ("order_id:order_id",), "order_snapshot", ""),
    ("get_invoice", NEAR, False,
     "Get the invoice PDF metadata of an order.", ("order_id:order_id",), "fetch_invoice", ""),
    ("get_shipment_tracking", NEAR, False,
     "Get the carrier's tracking events for a tracking number.", ("tracking_number:string",),
     "carrier_events", ""),
    ("get_product_reviews", NEAR, False,
     "List customer reviews of a product.", ("product_id:product_id",), "item_reviews", ""),
    ("check_warehouse_inventory", NEAR, False,
     "Count units physically in a warehouse bin (includes reserved and damaged units).",
     ("product_id:product_id", "warehouse:enum(north|south|east)?"), "bin_count", ""),
    ("list_subscriptions", NEAR, False,
     "List a customer's newsletter and membership subscriptions.",
     ("customer_id:customer_id",), "subscription_list", ""),
    ("get_return_label", NEAR, False,
     "Get the prepaid return shipping label of an existing return.", ("return_id:string",),
     "return_label", ""),
    ("get_payment_methods", NEAR, False,
     "List the saved payment methods of a customer.", ("customer_id:customer_id",),
     "saved_cards", ""),
    ("search_orders_archive", NEAR, False,
     "Search orders older than two years in the cold archive.",
     ("customer_id:customer_id",), "archive_order_search", ""),
    ("get_loyalty_points", NEAR, False,
     "Get a customer's loyalty points balance.", ("customer_id:customer_id",),
     "points_balance", ""),
    ("cancel_subscription", NEAR, True,
     "Cancel a customer's paid membership subscription.", ("customer_id:customer_id",),
     "end_membership", ""),
    ("void_invoice", NEAR, True,
     "Void the invoice of an order in accounting (the order itself is not changed).",
     ("order_id:order_id",), "invoice_void", ""),
    ("update_billing_address", NEAR, True,
     "Change the billing address stored with a customer's payment card.",
     ("customer_id:customer_id", "address:address"), "set_billing_location", ""),
    ("update_default_address", NEAR, True,
     "Change the default address on a customer's profile (used for future orders only).",
     ("customer_id:customer_id", "address:address"), "set_profile_location", ""),
    ("update_newsletter_email", NEAR, True,
     "Change the address that receives marketing newsletters.",
     ("customer_id:customer_id", "email:email"), "set_newsletter_mail", ""),
    ("update_login_email", NEAR, True,
     "Change the sign-in username of the web account (does not change the contact email).",
     ("customer_id:customer_id", "email:email"), "set_login_name", ""),
    ("refund_payment", NEAR, True,
     "Send money back to a card directly, outside the returns process.",
     ("order_id:order_id", "amount:number"), "payout_card", ""),
    ("issue_store_credit", NEAR, True,
     "Add goodwill store credit to a customer account.",
     ("customer_id:customer_id", "amount:number"), "grant_credit", ""),
    ("create_support_ticket", NEAR, True,
     "Escalate the case to the back-office team as a ticket.",
     ("customer_id:customer_id", "summary:text"), "escalate_case", ""),
    ("reship_order", NEAR, True,
     "Send a free replacement shipment of a whole order.", ("order_id:order_id",),
     "resend_package", ""),
    ("mark_order_delivered", NEAR, True,
     "Mark an order as delivered in the system.", ("order_id:order_id",),
     "flag_delivered", ""),
    ("hold_order", NEAR, True,
     "Put an order's fulfilment on hold for up to 7 days.", ("order_id:order_id",),
     "pause_fulfilment", ""),
    ("close_account", NEAR, True,
     "Close a customer account permanently.", ("customer_id:customer_id",),
     "delete_account", ""),
    ("merge_customer_accounts", NEAR, True,
     "Merge two customer accounts into one.",
     ("customer_id:customer_id", "other_customer_id:customer_id"), "combine_accounts", ""),
    ("apply_discount_code", NEAR, True,
     "Apply a discount code to an order that is still pending.",
     ("order_id:order_id", "code:string"), "add_coupon", ""),
    ("create_exchange_request_v0", NEAR, True,
     "Old exchange form (deprecated); files a request that the warehouse no longer reads.",
     ("order_id:order_id", "item_id:product_id", "replacement_product_id:product_id"),
     "legacy_swap_form", ""),
    ("cancel_shipment", NEAR, True,
     "Void the carrier label of a shipment (the order stays open and will be re-labelled).",
     ("order_id:order_id",), "void_label", ""),
    ("schedule_pickup", NEAR, True,
     "Book a courier pickup at the customer's address.", ("order_id:order_id", "date:date"),
     "book_courier", ""),
    ("send_password_reset", NEAR, True,
     "Email the customer a password-reset link.", ("customer_id:customer_id",),
     "mail_reset_link", ""),
    # ---- irrelevant (29) ---------------------------------------------------------------
    ("get_weather", IRRELEVANT, False, "Current weather for a city.", ("city:string",),
     "weather_now", ""),
    ("calculator", IRRELEVANT, False, "Evaluate an arithmetic expression.",
     ("expression:string",), "compute", ""),
    ("translate_text", IRRELEVANT, False, "Translate text into another language.",
     ("text:text", "target_language:string"), "translate", ""),
    ("convert_currency", IRRELEVANT, False, "Convert an amount between currencies.",
     ("amount:number", "from_currency:string", "to_currency:string"), "fx_convert", ""),
    ("get_time_in_timezone", IRRELEVANT, False, "Current time in a time zone.",
     ("timezone:string",), "clock", ""),
    ("search_web", IRRELEVANT, False, "Search the public web.", ("query:string",),
     "web_lookup", ""),
    ("get_news", IRRELEVANT, False, "Latest news headlines on a topic.", ("topic:string",),
     "headlines", ""),
    ("set_reminder", IRRELEVANT, False, "Set a personal reminder for the operator.",
     ("text:text", "minutes:integer"), "remind_me", ""),
    ("create_calendar_event", IRRELEVANT, False, "Add an event to the operator's calendar.",
     ("title:text", "date:date"), "calendar_add", ""),
    ("get_stock_quote", IRRELEVANT, False, "Latest share price for a ticker symbol.",
     ("symbol:string",), "share_price", ""),
    ("book_flight", IRRELEVANT, False, "Search flights between two airports.",
     ("origin:string", "destination:string", "date:date"), "flight_search", ""),
    ("find_restaurants", IRRELEVANT, False, "Restaurants near a location.",
     ("location:string",), "eat_nearby", ""),
    ("get_sports_scores", IRRELEVANT, False, "Latest scores of a sports league.",
     ("league:string",), "match_results", ""),
    ("spell_check", IRRELEVANT, False, "Check the spelling of a text.", ("text:text",),
     "proofread", ""),
    ("generate_password", IRRELEVANT, False, "Generate a random password.",
     ("length:integer",), "make_password", ""),
    ("unit_convert", IRRELEVANT, False, "Convert a value between units.",
     ("value:number", "from_unit:string", "to_unit:string"), "units", ""),
    ("play_music", IRRELEVANT, False, "Play a song on the office speaker.", ("song:string",),
     "speaker_play", ""),
    ("get_directions", IRRELEVANT, False, "Driving directions between two places.",
     ("origin:string", "destination:string"), "route_plan", ""),
    ("search_recipes", IRRELEVANT, False, "Find cooking recipes by ingredient.",
     ("ingredient:string",), "recipe_finder", ""),
    ("word_definition", IRRELEVANT, False, "Dictionary definition of a word.",
     ("word:string",), "dictionary", ""),
    ("random_number", IRRELEVANT, False, "A random integer in a range.",
     ("low:integer", "high:integer"), "dice", ""),
    ("get_horoscope", IRRELEVANT, False, "Daily horoscope for a star sign.", ("sign:string",),
     "stars_today", ""),
    ("summarize_text", IRRELEVANT, False, "Summarise a long text.", ("text:text",),
     "condense", ""),
    ("count_words", IRRELEVANT, False, "Count the words in a text.", ("text:text",),
     "word_tally", ""),
    ("get_movie_showtimes", IRRELEVANT, False, "Cinema showtimes in a city.",
     ("city:string",), "cinema_listings", ""),
    ("check_flight_status", IRRELEVANT, False, "Status of a flight by flight number.",
     ("flight_number:string",), "flight_tracker", ""),
    ("get_air_quality", IRRELEVANT, False, "Air quality index for a city.", ("city:string",),
     "aqi", ""),
    ("text_to_speech", IRRELEVANT, False, "Read a text aloud as audio.", ("text:text",),
     "speak_text", ""),
    ("get_public_holidays", IRRELEVANT, False, "Public holidays of a country and year.",
     ("country:string", "year:integer"), "holiday_list", ""),
]

# Systematic rewording for the Shift descriptions of non-core tools (word swaps + a new frame).
_SWAPS = (("customer", "shopper"), ("Customer", "Shopper"), ("order", "purchase"),
          ("Get ", "Fetch "), ("List ", "Enumerate "), ("Change ", "Modify "),
          ("Cancel ", "Terminate "), ("Search ", "Query "), ("address", "location"),
          ("email", "e-mail"), ("Find ", "Locate "), ("Send ", "Dispatch "))


def _reword(text: str) -> str:
    for a, b in _SWAPS:
        text = text.replace(a, b)
    return "Tool: " + text[0].lower() + text[1:]


def _build() -> tuple[Tool, ...]:
    tools = []
    for name, kind, writes, desc, params, sname, sdesc in _TABLE:
        tools.append(Tool(name, kind, writes, desc, tuple(_p(s) for s in params), sname,
                          sdesc or _reword(desc)))
    return tuple(tools)


TOOLS: tuple[Tool, ...] = _build()
TOOL_BY_NAME: Mapping[str, Tool] = {t.name: t for t in TOOLS}
SHIFT_TO_CANONICAL: Mapping[str, str] = {t.shift_name: t.name for t in TOOLS}
CORE_TOOLS = tuple(t.name for t in TOOLS if t.kind == CORE)
WRITE_TOOLS = frozenset(t.name for t in TOOLS if t.writes)
# The near-duplicate a careless agent confuses with each core/ask tool (used by noisy agents).
CONFUSIONS: Mapping[str, tuple[str, ...]] = {
    "find_customer": ("find_client_legacy", "lookup_customer_by_phone"),
    "get_order": ("get_order_summary_cached", "get_invoice", "search_orders_archive"),
    "get_product": ("check_warehouse_inventory", "get_product_reviews"),
    "cancel_order": ("cancel_subscription", "void_invoice", "cancel_shipment", "hold_order"),
    "update_address": ("update_billing_address", "update_default_address"),
    "update_email": ("update_login_email", "update_newsletter_email"),
    "create_return": ("create_exchange_request_v0", "refund_payment", "issue_store_credit"),
    "ask_customer": ("create_support_ticket",),
    "finish": ("create_support_ticket",),
}


def tool_schemas(shift: bool = False) -> list[dict[str, Any]]:
    """All 69 tools in the function-calling layout (for agents with native tool calling)."""
    return [t.json_schema(shift) for t in TOOLS]


def tool_named(name: str, shift: bool) -> Tool | None:
    """The tool an agent means by ``name`` in the given variant (None when unknown)."""
    if shift:
        canonical = SHIFT_TO_CANONICAL.get(name)
        return None if canonical is None else TOOL_BY_NAME[canonical]
    return TOOL_BY_NAME.get(name)


def _check_catalogue() -> None:
    counts = {k: sum(t.kind == k for t in TOOLS) for k in KINDS}
    expected = {CORE: 7, ASK: 1, NEAR: 31, IRRELEVANT: 29, FINISH: 1}
    if counts != expected:
        raise AssertionError(f"tool catalogue composition {counts} != {expected}")
    names = [t.name for t in TOOLS] + [t.shift_name for t in TOOLS if t.kind != FINISH]
    if len(set(names)) != len(names):
        raise AssertionError("tool names (base and shift) must be unique")
    for a, bs in CONFUSIONS.items():
        for b in bs:
            if b not in TOOL_BY_NAME:
                raise AssertionError(f"confusion {a} -> {b}: unknown tool")


_check_catalogue()


def validate_args(tool: Tool, args: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Check ``args`` against the tool's schema: (clean args, None) or (None, error text)."""
    if not isinstance(args, Mapping):
        return None, f"arguments of {tool.name} must be a JSON object, got {type(args).__name__}"
    clean: dict[str, Any] = {}
    for key in args:
        if not isinstance(key, str) or tool.param(key) is None:
            known = ", ".join(p.name for p in tool.params) or "none"
            return None, f"unknown argument {key!r} (accepted: {known})"
    for p in tool.params:
        if p.name not in args or args[p.name] is None:
            if p.required:
                return None, f"missing required argument {p.name!r}"
            continue
        v = args[p.name]
        if p.json_type == "string":
            if not isinstance(v, str) or not v.strip():
                return None, f"argument {p.name!r} must be a non-empty string"
            v = v.strip()
            if p.values and v not in p.values:
                return None, f"argument {p.name!r} must be one of {list(p.values)}, got {v!r}"
        elif p.json_type == "boolean":
            if not isinstance(v, bool):
                return None, f"argument {p.name!r} must be true or false"
        elif p.json_type == "integer":
            if isinstance(v, bool) or not isinstance(v, int):
                return None, f"argument {p.name!r} must be an integer"
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return None, f"argument {p.name!r} must be a number"
        clean[p.name] = v
    return clean, None
