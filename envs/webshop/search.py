"""BM25 product search for WebShop (``bm25s``), standing in for upstream's Lucene index.

Each product is indexed as upstream's ``convert_product_file_format.py`` builds its Lucene
documents: ``title + description + first bullet point + "name: v1, v2, and name: ..."``,
lower-cased. Scoring is Lucene's BM25 with pyserini's defaults (k1 = 0.9, b = 0.4), English
stop words removed and a minimal plural stemmer; hits are documents sharing at least one
query term, best first, ties in catalogue order, at most ``SEARCH_RETURN_N``. Lucene's
Porter stemmer is not reproduced, so rankings can differ from upstream on real data.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
_TOKEN = re.compile(r"(?u)\b\w+\b")
# Lucene's English stop-word set (the analyzer default).
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with".split()
)


def minimal_stem(word: str) -> str:
    """Strip a plural ``s`` (``shoes`` -> ``shoe``, ``batteries`` -> ``battery``)."""
    n = len(word)
    if n < 3 or word[-1] != "s" or word[-2] in "us":
        return word
    if word[-2] == "e":
        if n > 3 and word[-3] == "i" and word[-4] not in "ae":
            return word[:-3] + "y"
        if word[-3] in "iaoe":
            return word
    return word[:-1]


def analyze(text: str) -> list[str]:
    """Lower-case, split on non-word characters, drop stop words, strip plurals."""
    return [minimal_stem(t) for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


def document_text(product: Mapping) -> str:
    """The text a product is indexed by: title, description, first bullet point and its option
    values."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in product["options"].items()]
    bullets = product["BulletPoints"]
    return " ".join([
        product["Title"],
        product["Description"],
        bullets[0] if bullets else "",
        ", and ".join(option_texts),
    ]).lower()


class ProductSearch:
    """BM25 index over a catalogue; ``search(query)`` returns asins best first."""

    def __init__(self, products: Sequence[Mapping], k1: float = 0.9, b: float = 0.4):
        import bm25s

        self.asins = [p["asin"] for p in products]
        corpus = [analyze(document_text(p)) for p in products]
        self._retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        tokenized = bm25s.tokenization.Tokenized(*self._ids(corpus))
        self._retriever.index(tokenized, show_progress=False)

    def _ids(self, corpus: list[list[str]]):
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(t, len(vocab)) for t in doc] for doc in corpus]
        self.vocab = vocab
        return ids, vocab

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every product for ``query`` (float32 [P], zeros when no query term is in
        the vocabulary)."""
        terms = [t for t in analyze(query) if t in self.vocab]
        if not terms:
            return np.zeros(len(self.asins), np.float32)
        return np.asarray(self._retriever.get_scores([self.vocab[t] for t in terms]))

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The ids of the (at most ``k``) products with a positive score, best first, ties in
        catalogue order."""
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        # Best score first; ties keep catalogue order (Lucene breaks ties by doc id).
        order = hits[np.lexsort((hits, -scores[hits]))]
        return [self.asins[i] for i in order[:k]]
