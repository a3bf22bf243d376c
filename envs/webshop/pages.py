"""WebShop pages as text, in the original text environment's ``simple`` observation mode.

Upstream renders HTML templates and flattens every visible text node, stripped, joined by
`` [SEP] ``. These functions produce the same strings directly from the page contents (text
nodes in template order), without HTML: e.g. the start page is
``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search``.
They also list each page's clickables in upstream's order (buttons, then product links,
then option values; later entries with the same text replace earlier ones).
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

SEP = " [SEP] "
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")


def _node(value: Any) -> list[str]:
    """The text node(s) a template ``{{ value }}`` yields once flattened (0 or 1 strings).

    HTML parsing keeps a whitespace-only node as a single newline (dropped by upstream) or a
    single space (kept as an empty string after stripping); ``None`` renders as "None".
    """
    text = "None" if value is None else str(value)
    if text == "":
        return []
    if text.strip() == "":
        return [] if "\n" in text else [""]
    return [text.strip()]


def _join(nodes: Iterable[str]) -> str:
    return SEP.join(nodes)


def _instruction(instruction: str) -> list[str]:
    return ["Instruction:", *_node(instruction)]


def _tojson(obj: Mapping) -> str:
    """Flask's ``tojson`` filter: sorted keys, ASCII escapes, HTML-safe characters."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("'", "\\u0027"))


def search_page(instruction: str) -> str:
    """The text of the search page under ``instruction``."""
    return _join(["WebShop", *_instruction(instruction), "Search"])


def results_page(instruction: str, page: int, total: int, products: Sequence[Mapping]) -> str:
    """The text of results page ``page`` of ``total`` results: the products' ids, names and prices,
    with back / previous / next buttons."""
    nodes = [*_instruction(instruction), BACK_TO_SEARCH, f"Page {page} (Total results: {total})"]
    if page > 1:
        nodes.append(PREV_PAGE)
    nodes.append(NEXT_PAGE)
    for p in products:
        nodes += [*_node(p["asin"]), *_node(p["Title"]), *_node(p["Price"])]
    return _join(nodes)


def item_page(instruction: str, product: Mapping, show_attrs: bool = False) -> str:
    """The text of a product's page: its options to choose, name, price, rating, the sub-page
    buttons (attributes with ``show_attrs``) and "Buy Now"."""
    nodes = [*_instruction(instruction), BACK_TO_SEARCH, PREV_PAGE]
    for option_name, values in product["options"].items():
        nodes += _node(option_name)
        for value in values:
            nodes += _node(value)
    nodes += _node(product["Title"])
    nodes += _node(f"Price: {product['Price']}")
    nodes += _node(f"Rating: {product['Rating']}")
    nodes += ["Description", "Features", "Reviews"]
    if show_attrs:
        nodes.append("Attributes")
    nodes.append(END_BUTTON)
    return _join(nodes)


def sub_page(instruction: str, product: Mapping, name: str) -> str:
    """The text of a product's Description, Features, Reviews or Attributes sub-page."""
    nodes = [*_instruction(instruction), BACK_TO_SEARCH, PREV_PAGE]
    if name == "Description":
        nodes += _node(product["Description"])
    elif name == "Features":
        for bullet in product["BulletPoints"]:
            nodes += _node(" " + ("None" if bullet is None else str(bullet)))
    elif name == "Reviews":
        for review in product.get("Reviews", []):
            nodes += _node(f'"{review["title"]}"')
            nodes += _node(review["score"])
            nodes += _node(review["body"])
    elif name == "Attributes":
        for attribute in product["Attributes"]:
            nodes += _node(" " + str(attribute))
        nodes += _node(product["category"]) + _node(product["query"])
        nodes += _node(product["product_category"])
    else:
        raise ValueError(f"unknown WebShop sub page {name!r}; expected one of {SUB_PAGES}")
    return _join(nodes)


def done_page(asin: str, options: Mapping[str, str], reward: float) -> str:
    """The purchase page (its hidden blocks are still text nodes in simple mode)."""
    nodes = [
        "Thank you for shopping with us!", "Your code:", "None",
        "(Paste it in your MTurk interface.)", "Purchased", "asin", *_node(asin),
        "options", _tojson(dict(options)), "attrs", "None", "category", "None", "query", "None",
        "product category", "None", "Target", "asin", "options", "attrs", "price upper",
        "instuction text", "category", "product category", "query", "Goal", "None", "Reward",
        "Your score (min 0.0, max 1.0)", str(reward), "Reward Details", "None",
    ]
    return _join(nodes)


# ---- clickables (what upstream's get_available_actions returns) ---------------------------
def search_clickables() -> dict[str, str]:
    """What can be clicked on the search page: the search button."""
    return {"search": "button"}


def results_clickables(page: int, products: Sequence[Mapping]) -> dict[str, str]:
    """What can be clicked on a results page: back to search, previous (past page 1), next, and each
    product's id."""
    out = {BACK_TO_SEARCH.lower(): "button"}
    if page > 1:
        out[PREV_PAGE.lower()] = "button"
    out[NEXT_PAGE.lower()] = "button"
    for p in products:
        out[p["asin"].lower()] = "product"
    return out


def item_clickables(product: Mapping, show_attrs: bool = False) -> dict[str, str]:
    """Text -> kind ("button", or "option:<name>" for an option radio)."""
    out = {BACK_TO_SEARCH.lower(): "button", PREV_PAGE.lower(): "button"}
    for name in ("description", "features", "reviews") + (("attributes",) if show_attrs else ()):
        out[name] = "button"
    out[END_BUTTON.lower()] = "button"
    for option_name, values in product["options"].items():
        for value in values:
            out[value] = f"option:{option_name}"
    return out


def sub_page_clickables() -> dict[str, str]:
    """What can be clicked on a sub-page: back to search and previous."""
    return {BACK_TO_SEARCH.lower(): "button", PREV_PAGE.lower(): "button"}
