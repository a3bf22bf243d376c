"""WebShop data: the original file formats, a loader, goals and splits.

Files (the names the WebShop repository uses; any path works):

* products, e.g. ``items_shuffle_1000.json``: a JSON list of scraped products, each with
  ``asin``, ``name``, ``full_description``, ``small_description`` (list or str), ``pricing``
  (a string such as ``"$12.99"`` or ``"$10.00$15.00"``, or empty), ``customization_options``
  (``{option name: [{"value": ..., "image": ...}, ...]}`` or null), ``images``, ``category``,
  ``query`` and ``product_category`` (``"A › B › C"``).
* attributes, e.g. ``items_ins_v2_1000.json``: ``{asin: {"attributes": [...],
  "instruction": str, "instruction_attributes": [...]}}`` (synthetic instructions).
* human instructions, ``items_human_ins.json``: ``{asin: [{"instruction": str,
  "instruction_attributes": [...], "instruction_options": [...]}, ...]}``.

Loading follows the original ``load_products``: duplicate or malformed asins are skipped,
option names and values are lower-cased (``/`` becomes `` | ``), prices parsed from the
``$`` string, missing attributes become ``["DUMMY_ATTR"]``. Goals follow ``get_human_goals``
/ ``get_synthetic_goals``; the original draws product prices and goal price limits from the
unseeded global ``random`` module, so the exact limits of a given upstream run cannot be
reproduced; here they come from ``random.Random(price_seed)`` drawn in the same order, and
goals are shuffled with ``random.Random(233)`` exactly as upstream.

Splits (over the shuffled goal list, as the WebShop / verl-agent code slices it):
``test`` = goals[:500], ``eval`` = goals[500:1500], ``train`` = goals[1500:],
``verl_train`` = goals[500:] (verl-agent trains on everything after the test goals),
``all``. The boundaries are configurable for small catalogues.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
GOAL_SHUFFLE_SEED = 233
SPLITS = ("all", "test", "eval", "train", "verl_train")
PRODUCT_KEYS = (
    "asin", "name", "full_description", "small_description", "pricing",
    "customization_options", "category", "query", "product_category",
)


class WebShopDataError(ValueError):
    """A WebShop data file is missing, malformed, or has a bad record."""


def _read_json(path: str, what: str) -> Any:
    if not os.path.isfile(path):
        raise WebShopDataError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise WebShopDataError(
            f"{what} file {path}: invalid JSON ({e.msg}, line {e.lineno})") from None


def parse_pricing(pricing: Any, where: str) -> tuple[list[float], str]:
    """``(pricing list, price tag)`` from the scraped ``pricing`` string, as upstream."""
    if pricing is None or not pricing:
        return [100.0], "$100.0"
    if not isinstance(pricing, str):
        raise WebShopDataError(f"{where}: 'pricing' must be a string, got {type(pricing).__name__}")
    try:
        values = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
    except InvalidOperation:
        raise WebShopDataError(f"{where}: cannot parse pricing {pricing!r}") from None
    if not values:
        raise WebShopDataError(f"{where}: pricing {pricing!r} has no '$' amount")
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def _product_record(p: Any, i: int, path: str, attributes: Mapping, human: Mapping | None):
    where = f"products file {path}, record {i}"
    if not isinstance(p, Mapping):
        raise WebShopDataError(f"{where}: expected an object, got {type(p).__name__}")
    missing = [k for k in PRODUCT_KEYS if k not in p]
    if missing:
        raise WebShopDataError(f"{where} (asin {p.get('asin', '?')}): missing key(s) {missing}")
    asin = p["asin"]
    where = f"{where} (asin {asin})"
    for key in ("name", "full_description", "category", "query", "product_category"):
        if not isinstance(p[key], str):
            raise WebShopDataError(
                f"{where}: {key!r} must be a string, got {type(p[key]).__name__}")
    pricing, price_tag = parse_pricing(p["pricing"], where)
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    custom = p["customization_options"]
    if custom:
        if not isinstance(custom, Mapping):
            raise WebShopDataError(f"{where}: 'customization_options' must be an object")
        for option_name, contents in custom.items():
            if contents is None:
                continue
            if not isinstance(contents, list):
                raise WebShopDataError(f"{where}: option {option_name!r} must be a list")
            values = []
            for j, content in enumerate(contents):
                if not isinstance(content, Mapping) or not isinstance(content.get("value"), str):
                    raise WebShopDataError(
                        f"{where}: option {option_name!r} entry {j} needs a string 'value'"
                    )
                value = content["value"].strip().replace("/", " | ").lower()
                values.append(value)
                option_to_image[value] = content.get("image")
            options[option_name.lower()] = values
    bullets = p["small_description"]
    bullets = list(bullets) if isinstance(bullets, list) else [bullets]
    attr_entry = attributes.get(asin)
    if isinstance(attr_entry, Mapping) and "attributes" in attr_entry:
        product_attrs = list(attr_entry["attributes"])
    else:
        product_attrs = ["DUMMY_ATTR"]
    images = p.get("images") or [None]
    record = {
        "asin": asin,
        "name": p["name"],
        "Title": p["name"],
        "Description": p["full_description"],
        "BulletPoints": bullets,
        "pricing": pricing,
        "Price": price_tag,
        "options": options,
        "option_to_image": option_to_image,
        "Attributes": product_attrs,
        "category": p["category"],
        "query": p["query"].lower().strip(),
        "product_category": p["product_category"],
        "Reviews": [],
        "Rating": "N.A.",
        "MainImage": images[0],
    }
    if human is not None:
        if asin in human:
            record["instructions"] = human[asin]
    elif isinstance(attr_entry, Mapping):
        record["instruction_text"] = attr_entry.get("instruction")
        record["instruction_attributes"] = attr_entry.get("instruction_attributes")
    return record


def load_products(
    products_path: str,
    attributes_path: str,
    human_instructions_path: str | None = None,
    num_products: int | None = None,
) -> list[dict]:
    """Load products as upstream ``load_products`` does (human goals if the file is given)."""
    raw = _read_json(products_path, "products")
    attributes = _read_json(attributes_path, "attributes")
    human = None
    if human_instructions_path is not None:
        human = _read_json(human_instructions_path, "human instructions")
    return build_products(raw, attributes, human, num_products=num_products,
                          products_name=str(products_path), attributes_name=str(attributes_path),
                          human_name=str(human_instructions_path))


def build_products(
    raw: Any,
    attributes: Any,
    human: Any = None,
    *,
    num_products: int | None = None,
    products_name: str = "<products>",
    attributes_name: str = "<attributes>",
    human_name: str = "<human instructions>",
) -> list[dict]:
    """Normalise parsed file contents into product records (see ``load_products``)."""
    if not isinstance(raw, list):
        raise WebShopDataError(f"products file {products_name}: expected a JSON list of products")
    if not isinstance(attributes, Mapping):
        raise WebShopDataError(
            f"attributes file {attributes_name}: expected an object keyed by asin")
    if human is not None and not isinstance(human, Mapping):
        raise WebShopDataError(
            f"human instructions file {human_name}: expected an object keyed by asin")
    if human is not None:
        for asin, entries in human.items():
            if not isinstance(entries, list):
                raise WebShopDataError(
                    f"human instructions file {human_name}: asin {asin} must map to a list")
            for j, ins in enumerate(entries):
                for key in ("instruction", "instruction_attributes", "instruction_options"):
                    if not isinstance(ins, Mapping) or key not in ins:
                        raise WebShopDataError(
                            f"human instructions file {human_name}: asin {asin} "
                            f"instruction {j} is missing {key!r}")
    if num_products is not None:
        raw = raw[:num_products]
    seen: set[str] = set()
    products = []
    for i, p in enumerate(raw):
        asin = p.get("asin") if isinstance(p, Mapping) else None
        if not isinstance(asin, str):
            raise WebShopDataError(f"products file {products_name}, record {i}: "
                                   "'asin' must be a string")
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        products.append(_product_record(p, i, products_name, attributes, human))
    if not products:
        raise WebShopDataError(f"products file {products_name}: no valid products")
    return products


def product_prices(products: Sequence[Mapping], rng: random.Random) -> dict[str, float]:
    """One price per product: the single price, or uniform in a price range (upstream)."""
    prices = {}
    for p in products:
        pricing = p["pricing"]
        if not pricing:
            price = 100.0
        elif len(pricing) == 1:
            price = pricing[0]
        else:
            price = rng.uniform(*pricing[:2])
        prices[p["asin"]] = price
    return prices


def _price_limit(price: float, rng: random.Random) -> tuple[float, str]:
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000, ""


def human_goals(products: Sequence[Mapping], prices: Mapping[str, float], rng: random.Random,
                where: str = "human instructions") -> list[dict]:
    """WebShop goals from the products' human-written instructions: per instruction (with at
    least one attribute) its text plus a price bound drawn with ``rng``, its attributes and
    options, and the product it came from; an instruction missing a key is a
    WebShopDataError naming the product."""
    goals = []
    for item in products:
        if "instructions" not in item:
            continue
        for j, ins in enumerate(item["instructions"]):
            for key in ("instruction", "instruction_attributes", "instruction_options"):
                if not isinstance(ins, Mapping) or key not in ins:
                    raise WebShopDataError(
                        f"{where}: asin {item['asin']} instruction {j} is missing {key!r}"
                    )
            attributes = ins["instruction_attributes"]
            if len(attributes) == 0:
                continue
            upper, price_text = _price_limit(prices[item["asin"]], rng)
            goals.append({
                "asin": item["asin"],
                "category": item["category"],
                "query": item["query"],
                "name": item["name"],
                "product_category": item["product_category"],
                "instruction_text": ins["instruction"].strip(".") + price_text,
                "attributes": list(attributes),
                "price_upper": upper,
                "goal_options": list(ins["instruction_options"]),
                "weight": 1,
            })
    return goals


def synthetic_goals(products: Sequence[Mapping], prices: Mapping[str, float],
                    rng: random.Random) -> list[dict]:
    """WebShop goals generated from each product's instruction text: one per combination of its
    option values (named in the instruction), with a price bound drawn with ``rng``; a product
    with an instruction but no instruction_attributes is a WebShopDataError."""
    goals = []
    counts: dict[str, int] = {}
    for product in products:
        if product.get("instruction_text") is None:
            continue
        attributes = product["instruction_attributes"]
        if not attributes:
            raise WebShopDataError(f"attributes: asin {product['asin']} has an instruction "
                                   "but no instruction_attributes")
        upper, price_text = _price_limit(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combo in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"],
                "category": product["category"],
                "query": product["query"],
                "name": product["Title"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": list(attributes),
                "price_upper": upper,
                "goal_options": goal_options,
            })
            for att in attributes:
                counts[att] = counts.get(att, 0) + 1
    for goal in goals:
        goal["weight"] = sum(1.0 / counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


@dataclasses.dataclass(frozen=True)
class WebShopCatalog:
    """Loaded products, prices and shuffled goals (read-only data shared by all episodes)."""

    products: tuple[dict, ...]
    prices: Mapping[str, float]
    goals: tuple[dict, ...]
    split_bounds: tuple[int, int] = (500, 1500)

    def __post_init__(self):
        lo, hi = self.split_bounds
        if not (0 <= lo <= hi):
            raise ValueError(
                f"split_bounds must satisfy 0 <= test_end <= eval_end, got {self.split_bounds}")
        object.__setattr__(self, "_by_asin", {p["asin"].upper(): p for p in self.products})

    def product(self, asin: str) -> dict:
        """The product with id ``asin`` (case-insensitive); a KeyError when there is none."""
        return self._by_asin[asin.upper()]

    def has_product(self, asin: str) -> bool:
        """Whether the catalogue holds product ``asin`` (case-insensitive)."""
        return asin.upper() in self._by_asin

    def split_indices(self, split: str) -> range:
        """Indices into ``goals`` of a split (see module docstring)."""
        lo, hi = self.split_bounds
        n = len(self.goals)
        spans = {"all": (0, n), "test": (0, lo), "eval": (lo, hi), "train": (hi, n),
                 "verl_train": (lo, n)}
        if split not in spans:
            raise ValueError(f"unknown WebShop split {split!r}; expected one of {SPLITS}")
        a, b = spans[split]
        return range(min(a, n), min(b, n))

    @classmethod
    def from_records(cls, products: Sequence[Mapping], *, human: bool = True, price_seed: int = 0,
                     split_bounds: tuple[int, int] = (500, 1500)) -> "WebShopCatalog":
        """A catalogue from parsed product records: prices drawn with ``price_seed``, goals from
        human instructions (or synthetic ones), shuffled in a fixed order, split at ``split_bounds``
        into test / eval / train."""
        rng = random.Random(price_seed)
        prices = product_prices(products, rng)
        make_goals = human_goals if human else synthetic_goals
        goals = make_goals(products, prices, rng)
        random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
        return cls(tuple(products), prices, tuple(goals), tuple(split_bounds))

    @classmethod
    def load(cls, products_path: str, attributes_path: str,
             human_instructions_path: str | None = None, *, num_products: int | None = None,
             price_seed: int = 0, split_bounds: tuple[int, int] = (500, 1500)) -> "WebShopCatalog":
        """Load the original files; human goals when ``human_instructions_path`` is given,
        else the synthetic goals of the attributes file."""
        products = load_products(products_path, attributes_path, human_instructions_path,
                                 num_products)
        catalog = cls.from_records(products, human=human_instructions_path is not None,
                                   price_seed=price_seed, split_bounds=split_bounds)
        if not catalog.goals:
            src = human_instructions_path or attributes_path
            raise WebShopDataError(f"no goals could be built from {src}")
        return catalog
