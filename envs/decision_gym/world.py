"""Task generation for DECISION GYM: a small shop (customers, orders, products, policy) and one
customer request, all drawn deterministically from an int seed.

Everything here is immutable (frozen dataclasses and tuples) so env states can share a task
and be copied for free. Generation uses only ``random.Random`` and string templates: thousands
of tasks per second on one core.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Mapping

from jaxdm.registry import Registry

BASE, SHIFT, HARD = "base", "shift", "hard"
VARIANTS = (BASE, SHIFT, HARD)

BASE_REQUESTS = ("order_status", "cancel_order", "change_address", "return_item",
                 "refund_status", "exchange", "update_email", "product_availability")
SHIFT_ONLY_REQUESTS = ("gift_card_balance", "split_shipment")
REQUESTS = BASE_REQUESTS + SHIFT_ONLY_REQUESTS

# Disjoint seed ranges per split (training, threshold fitting, testing); a task's seed fixes
# everything about it. The ranges start far from 0 so a small int is never mistaken for a
# seed of some split: ``DecisionGym.reset`` reads small ints as task indices within a split.
SPLIT_RANGES: Registry[tuple[int, int]] = Registry("split")
SPLIT_RANGES.register("train", (1_000_000_000, 1_100_000_000))
SPLIT_RANGES.register("fit", (1_100_000_000, 1_200_000_000))
SPLIT_RANGES.register("test", (1_200_000_000, 1_300_000_000))
SPLITS = tuple(SPLIT_RANGES)

CANCELLABLE = ("pending", "processing")
STATUSES = ("pending", "processing", "shipped", "delivered", "cancelled")
RETURN_DAYS = 30
GOLD_RETURN_DAYS = 60
FEE_HOURS = 24
FEE_RATE = 0.10


def split_seed(split: str, index: int) -> int:
    """The seed of task ``index`` of ``split`` (train / fit / test)."""
    lo, hi = SPLIT_RANGES.get(split)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < hi - lo:
        raise ValueError(f"task index {index!r} outside [0, {hi - lo}) for split {split!r}")
    return lo + index


def split_of(seed: int) -> str:
    """Which split a task seed belongs to; ValueError outside every range."""
    for name, (lo, hi) in SPLIT_RANGES.items():
        if lo <= seed < hi:
            return name
    raise ValueError(f"seed {seed} is outside every split range {dict(SPLIT_RANGES.items())}")


def find(items, field: str, value):
    """The first of ``items`` whose ``field`` equals ``value``, None when there is none."""
    for item in items:
        if getattr(item, field) == value:
            return item
    return None


@dataclasses.dataclass(frozen=True)
class Customer:
    """A shop customer: id, name, email, phone, address, city, region, loyalty tier and gift
    cards."""
    customer_id: str
    name: str
    email: str
    phone: str
    address: str
    city: str
    region: str
    tier: str  # standard | silver | gold
    gift_cards: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class Product:
    """A catalogue product: id, name, price and units in stock."""
    product_id: str
    name: str
    price: float
    stock: int


@dataclasses.dataclass(frozen=True)
class Item:
    """A line of an order: product, quantity, unit price and which shipment (1 or 2) carries it."""
    product_id: str
    name: str
    qty: int
    price: float
    shipment: int = 1  # 1 or 2 (split shipments)
    status: str = "open"  # open | cancelled | returned


@dataclasses.dataclass(frozen=True)
class Order:
    """A customer's order: its items, status, age in hours, shipping address and the rest of its
    record."""
    order_id: str
    customer_id: str
    items: tuple[Item, ...]
    status: str
    placed_hours_ago: int
    delivered_days_ago: int | None
    shipping_method: str
    shipping_address: str
    payment: str
    # (item_id, resolution, status, refund_status, refund_amount)
    returns: tuple[tuple[str, str, str, str, float], ...] = ()
    second_shipment_status: str | None = None  # split shipments only

    @property
    def total(self) -> float:
        """The order's total price (quantity x price over its items, rounded to cents)."""
        return round(sum(i.qty * i.price for i in self.items), 2)

    def item(self, product_id: str) -> Item | None:
        """The order's line of ``product_id``, None when it has none."""
        for i in self.items:
            if i.product_id == product_id:
                return i
        return None


@dataclasses.dataclass(frozen=True)
class Task:
    """One customer-service case: the shop's data, the request, and the hidden facts.

    ``facts`` maps a fact name (``order_id``, ``item``, ``new_address``, ``new_email``,
    ``replacement``, ``product``, ``confirm_fee``) to its true value; ``given`` lists the facts
    the first message already states. ``directory`` is the customer list shown in the context
    (Hard: 10 or 12 customers; otherwise empty).
    """

    seed: int
    variant: str
    request: str
    customer_id: str
    message: str
    facts: tuple[tuple[str, object], ...]
    given: frozenset[str]
    customers: tuple[Customer, ...]
    orders: tuple[Order, ...]
    products: tuple[Product, ...]
    now: str
    directory: tuple[str, ...] = ()
    fee_rule: bool = False
    restricted_regions: tuple[str, ...] = ()

    @property
    def task_id(self) -> str:
        """"<variant>-<seed>", the task's name in results."""
        return f"{self.variant}-{self.seed}"

    def fact(self, name: str):
        """The true value of hidden fact ``name`` (None when the task has no such fact)."""
        for k, v in self.facts:
            if k == name:
                return v
        return None

    def customer(self, customer_id: str) -> Customer | None:
        """The customer with ``customer_id``, None when there is none."""
        return find(self.customers, "customer_id", customer_id)

    def product(self, product_id: str) -> Product | None:
        """The product with ``product_id``, None when there is none."""
        return find(self.products, "product_id", product_id)

    @property
    def requester(self) -> Customer:
        """The customer who wrote the request."""
        c = self.customer(self.customer_id)
        assert c is not None
        return c

    def return_days(self, customer: Customer) -> int:
        """How many days ``customer`` has to return an item (longer for gold tier)."""
        return GOLD_RETURN_DAYS if customer.tier == "gold" else RETURN_DAYS


# ---- vocabulary ------------------------------------------------------------------------
_FIRST = ("Maria", "James", "Aisha", "Chen", "Lucas", "Sofia", "Omar", "Emma", "Noah", "Priya",
          "Diego", "Hannah", "Kenji", "Fatima", "Liam", "Zoe", "Ivan", "Grace", "Mateo", "Leila")
_LAST = ("Lopez", "Smith", "Khan", "Wang", "Martin", "Rossi", "Haddad", "Brown", "Garcia",
         "Patel", "Silva", "Mueller", "Tanaka", "Ali", "Walsh", "Novak", "Kim", "Okafor")
_STREETS = ("Oak Street", "Maple Avenue", "Cedar Lane", "Pine Road", "Elm Court", "Birch Way",
            "Harbor Drive", "Mill Road", "Park Place", "Lake Street", "Hill Crescent")
# (city, region code); the Hard rule restricts a few regions.
_CITIES = (("Portland", "OR"), ("Austin", "TX"), ("Denver", "CO"), ("Madison", "WI"),
           ("Tucson", "AZ"), ("Raleigh", "NC"), ("Boise", "ID"), ("Albany", "NY"),
           ("Anchorage", "AK"), ("Honolulu", "HI"), ("Juneau", "AK"), ("Hilo", "HI"),
           ("San Juan", "PR"), ("Fresno", "CA"))
_RESTRICTED = ("AK", "HI", "PR")
_PRODUCTS = ("Trail Running Shoes", "Wool Beanie", "Rain Jacket", "Canvas Backpack",
             "Ceramic Mug Set", "Desk Lamp", "Yoga Mat", "Bluetooth Speaker", "Linen Shirt",
             "Water Bottle", "Cotton Hoodie", "Leather Wallet", "Travel Pillow", "Chef Knife",
             "Denim Jacket", "Sunglasses")
_COLOURS = ("Black", "Blue", "Green", "Red", "Grey", "Sand")
_METHODS = ("standard", "express", "two-day")
_CARDS = ("Visa", "Mastercard", "Amex", "PayPal")


def _address(rng: random.Random, city: str, region: str) -> str:
    number, street, zip_code = rng.randint(2, 998), rng.choice(_STREETS), rng.randint(10000, 99899)
    return f"{number} {street}, {city}, {region} {zip_code}"


def _email(rng: random.Random, first: str, last: str, taken: set[str]) -> str:
    while True:
        domain = rng.choice(("mail.com", "inbox.net", "post.org"))
        e = f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@{domain}"
        if e not in taken:
            taken.add(e)
            return e


def _ids(rng: random.Random, prefix: str, n: int, lo: int, hi: int) -> list[str]:
    return [f"{prefix}-{v}" for v in rng.sample(range(lo, hi), n)]


def _customer(rng: random.Random, cid: str, first: str, last: str, taken: set[str],
              city_choices=_CITIES) -> Customer:
    city, region = rng.choice(city_choices)
    cards = ()
    if rng.random() < 0.6:
        cards = tuple((f"GC-{rng.randint(1000, 9999)}", round(rng.uniform(5, 150), 2))
                      for _ in range(rng.randint(1, 2)))
    return Customer(cid, f"{first} {last}", _email(rng, first, last, taken),
                    f"+1-555-{rng.randint(1000, 9999)}", _address(rng, city, region), city,
                    region, rng.choice(("standard", "standard", "silver", "gold")), cards)


def _new_order(rng: random.Random, oid: str, customer: Customer, products: list[Product],
               status: str, n_items: int | None = None) -> Order:
    n_items = n_items or rng.choice((1, 1, 2, 3))
    items = tuple(Item(p.product_id, p.name, rng.choice((1, 1, 2)), p.price)
                  for p in rng.sample(products, n_items))
    hours = {"pending": rng.randint(1, 60), "processing": rng.randint(2, 90)}.get(
        status, rng.randint(100, 2400))
    delivered = None
    if status == "delivered":
        delivered = rng.randint(1, max(2, hours // 24 - 2))
    return Order(oid, customer.customer_id, items, status, hours, delivered,
                 rng.choice(_METHODS), customer.address,
                 f"{rng.choice(_CARDS)} ending {rng.randint(1000, 9999)}")


# ---- request wording (base / shift) -------------------------------------------------------
_WORDING: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "order_status": (("Hi, where is my order{order}? I haven't heard anything in a while.",
                      "Could you tell me the status of my order{order}?"),
                     ("Any news on the parcel{order}? Keen to know when it turns up.",
                      "Checking in about my purchase{order} - what stage is it at?")),
    "cancel_order": (("Please cancel my order{order}. I don't need it anymore.",
                      "I want to cancel order{order}, I ordered by mistake."),
                     ("Changed my mind - kindly call off the purchase{order}.",
                      "Can you stop my purchase{order} from going through? No longer needed.")),
    "change_address": (("I moved! Please ship order{order} to my new address{address}.",
                        "Can you change the shipping address of order{order}{address}?"),
                       ("I'd like the package{order} delivered somewhere else{address}.",
                        "Please redirect my purchase{order}{address} - I won't be home.")),
    "return_item": (("I want to return {item}from order{order}.",
                     "I'd like to send back {item}from my order{order} for a refund."),
                    ("Not happy with {item}from purchase{order}; I'd like my money back.",
                     "Hoping to give back {item}bought in purchase{order}.")),
    "refund_status": (("I sent back an item from order{order} - where is my refund?",
                       "Has my refund for order{order} been processed?"),
                      ("Still waiting on money back for purchase{order}. Any update?",
                       "What's happening with the reimbursement for purchase{order}?")),
    "exchange": (("Can I exchange {item}from order{order}{replacement}?",
                  "I'd like to swap {item}in order{order}{replacement}."),
                 ("Could I trade {item}from purchase{order}{replacement}?",
                  "Wrong fit: I want to switch {item}of purchase{order}{replacement}.")),
    "update_email": (("Please update the email on my account{email}.",
                      "I have a new email address{email}, can you change it?"),
                     ("My inbox changed - kindly put a new contact e-mail on file{email}.",
                      "Need my account e-mail replaced{email}.")),
    "product_availability": (("Is the {product} in stock?",
                              "Do you have the {product} available right now?"),
                             ("Can I still buy the {product}, or is it sold out?",
                              "Wondering whether the {product} can be ordered today.")),
    "gift_card_balance": ((), ("How much is left on my gift card(s)?",
                               "Could you check my gift card balance please?")),
    "split_shipment": ((), ("Part of purchase{order} arrived but {item}is still missing - "
                            "please cancel that part.",
                            "Only half of purchase{order} came; drop {item}that hasn't "
                            "shipped, please.")),
}


def generate_task(seed: int, variant: str = BASE) -> Task:
    """The task of ``seed`` in ``variant`` (base / shift / hard); deterministic."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {list(VARIANTS)}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"task seed must be a non-negative int, got {seed!r}")
    rng = random.Random(f"decision_gym/{variant}/{seed}")
    requests = REQUESTS if variant == SHIFT else BASE_REQUESTS
    request = rng.choice(requests)
    now = dt.datetime(2026, 1, 5, 10, 0) + dt.timedelta(days=rng.randint(0, 300))

    # Catalogue: 8 products (distinct base names), with a colour variant of each for exchanges.
    bases = rng.sample(_PRODUCTS, 8)
    pids = _ids(rng, "P", 16, 100, 999)
    products: list[Product] = []
    for k, b in enumerate(bases):
        c1, c2 = rng.sample(_COLOURS, 2)
        price = round(rng.uniform(9, 180), 2)
        products.append(Product(pids[2 * k], f"{b} ({c1})", price, rng.choice((0, 3, 12, 40))))
        products.append(Product(pids[2 * k + 1], f"{b} ({c2})", price, rng.choice((0, 5, 20))))

    # Customers: the requester, plus a directory of 10/12 with colliding names in Hard.
    taken: set[str] = set()
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    directory: tuple[str, ...] = ()
    if variant == HARD:
        n_dir = rng.choice((10, 12))
        cids = _ids(rng, "C", n_dir, 1000, 9999)
        customers = [_customer(rng, cids[0], first, last, taken)]
        # At least two namesakes in other cities, so the name alone does not identify anyone.
        for k in range(1, n_dir):
            f2, l2 = first, last
            while k > 2 and (f2, l2) == (first, last):
                f2, l2 = rng.choice(_FIRST), rng.choice(_LAST)
            others = [c for c in _CITIES if c[0] != customers[0].city]
            customers.append(_customer(rng, cids[k], f2, l2, taken, others if k <= 2 else _CITIES))
        order_perm = list(range(n_dir))
        rng.shuffle(order_perm)
        directory = tuple(customers[i].customer_id for i in order_perm)
    else:
        customers = [_customer(rng, _ids(rng, "C", 1, 1000, 9999)[0], first, last, taken)]
    me = customers[0]

    # The requester's orders: 2-4, the target one shaped by the request's branch.
    n_orders = rng.randint(2, 4)
    oids = _ids(rng, "O", n_orders + len(customers), 10000, 99999)
    target_status = _target_status(rng, request)
    orders: list[Order] = []
    sellable = [p for p in products]
    target = _new_order(rng, oids[0], me, sellable, target_status,
                        2 if request in ("split_shipment",) else None)
    facts: dict[str, object] = {"order_id": target.order_id}
    item = target.items[rng.randrange(len(target.items))]
    if request in ("return_item", "exchange", "refund_status"):
        target = _shape_return_window(rng, target, me, request)
    if request == "refund_status":
        refund_state = rng.choice(("issued", "pending", "not_received"))
        ret_status = "in_transit" if refund_state == "not_received" else "received"
        ref_status = {"issued": "issued", "pending": "pending",
                      "not_received": "none"}[refund_state]
        amount = round(item.price * item.qty, 2)
        target = dataclasses.replace(
            target, returns=((item.product_id, "refund", ret_status, ref_status, amount),))
    if request == "split_shipment":
        items = list(target.items)
        items[1] = dataclasses.replace(items[1], shipment=2)
        second = rng.choice(("processing", "processing", "processing", "shipped"))
        target = dataclasses.replace(target, items=tuple(items), status="shipped",
                                     second_shipment_status=second)
        item = target.items[1]
    orders.append(target)
    for k in range(1, n_orders):
        orders.append(_new_order(rng, oids[k], me, sellable, rng.choice(STATUSES)))
    for k, c in enumerate(customers[1:]):
        orders.append(_new_order(rng, oids[n_orders + k], c, sellable, rng.choice(STATUSES)))

    facts["item"] = item.product_id
    given = {"item"} if len(target.items) == 1 else set()
    if request == "exchange":
        alt = _colour_variant(products, item.product_id)
        if rng.random() < 0.25:
            alt = dataclasses.replace(alt, stock=0)
        elif alt.stock == 0:
            alt = dataclasses.replace(alt, stock=rng.choice((2, 9)))
        products = [alt if p.product_id == alt.product_id else p for p in products]
        facts["replacement"] = alt.product_id
    if request == "product_availability":
        facts["product"] = rng.choice(products).product_id
        given.add("product")
    if request == "change_address":
        if variant == HARD and rng.random() < 0.35:
            city, region = rng.choice([c for c in _CITIES if c[1] in _RESTRICTED])
        else:
            city, region = rng.choice([c for c in _CITIES if c[1] not in _RESTRICTED])
        facts["new_address"] = _address(rng, city, region)
    if request == "update_email":
        facts["new_email"] = _email(rng, first, last + "x", taken)
    if variant == HARD and request == "cancel_order":
        facts["confirm_fee"] = rng.random() < 0.6

    # Which facts the first message states (the rest must be asked for).
    omit = rng.random() < 0.45
    if request in ("order_status", "cancel_order", "change_address", "return_item",
                   "refund_status", "exchange", "split_shipment") and not omit:
        given.add("order_id")
    if request == "change_address" and rng.random() < 0.55:
        given.add("new_address")
    if request == "update_email" and rng.random() < 0.55:
        given.add("new_email")
    if request in ("return_item", "exchange", "split_shipment") and rng.random() < 0.5:
        given.add("item")
    if request == "exchange" and rng.random() < 0.65:
        given.add("replacement")

    message = _message(rng, variant, request, facts, given, products, me)
    return Task(seed=seed, variant=variant, request=request, customer_id=me.customer_id,
                message=message, facts=tuple(sorted(facts.items())), given=frozenset(given),
                customers=tuple(customers), orders=tuple(orders), products=tuple(products),
                now=now.strftime("%Y-%m-%d %H:%M"), directory=directory,
                fee_rule=variant == HARD, restricted_regions=_RESTRICTED if variant == HARD else ())


def _target_status(rng: random.Random, request: str) -> str:
    r = rng.random()
    if request in ("cancel_order", "change_address"):
        if r < 0.75:
            return "pending" if r < 0.4 else "processing"
        return rng.choice(("shipped", "delivered"))
    if request in ("return_item", "exchange", "refund_status"):
        return "delivered" if r < 0.85 or request == "refund_status" else "shipped"
    if request == "order_status":
        return rng.choice(STATUSES)
    return rng.choice(STATUSES)


def _shape_return_window(rng: random.Random, order: Order, me: Customer, request: str) -> Order:
    if order.status != "delivered":
        return order
    window = GOLD_RETURN_DAYS if me.tier == "gold" else RETURN_DAYS
    inside = request == "refund_status" or rng.random() < 0.8
    days = rng.randint(1, window - 1) if inside else rng.randint(window + 1, window + 60)
    return dataclasses.replace(order, delivered_days_ago=days,
                               placed_hours_ago=max(order.placed_hours_ago, 24 * (days + 3)))


def _colour_variant(products: list[Product], product_id: str) -> Product:
    k = next(i for i, p in enumerate(products) if p.product_id == product_id)
    return products[k ^ 1]


def _message(rng: random.Random, variant: str, request: str, facts: dict, given: set,
             products: list[Product], me: Customer) -> str:
    base, shifted = _WORDING[request]
    template = rng.choice(shifted if variant == SHIFT else base)
    names = {p.product_id: p.name for p in products}
    fill = {
        "order": f" {facts['order_id']}" if "order_id" in given else "",
        "address": f": {facts['new_address']}" if "new_address" in given else "",
        "email": f": {facts['new_email']}" if "new_email" in given else "",
        "item": f"the {names[facts['item']]} " if "item" in given else "an item ",
        "replacement": (f" for the {names[facts['replacement']]}" if "replacement" in given
                        else " for another colour"),
        "product": names.get(facts.get("product", ""), ""),
    }
    text = template.format(**fill)
    if variant == HARD:
        return f"{text}\n- {me.name}, {me.city}"
    return f"{text}\n- {me.name} ({me.email})"
