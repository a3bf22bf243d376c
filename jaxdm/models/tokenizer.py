"""A checkpoint's tokenizer.json through the `tokenizers` library, without importing transformers.

Importing transformers and building its ``PreTrainedTokenizerFast`` took ~4 s of every
``jaxdm`` start (issue 17); ``tokenizers.Tokenizer.from_file`` takes ~0.5 s. ``FastTokenizer``
implements the part of the ``PreTrainedTokenizerFast`` interface jaxdm calls (``__call__``,
``encode``, ``decode``, ``apply_chat_template(..., tokenize=False)`` on plain text messages,
the special-token attributes, ``vocab_size``) with the same ids and text; anything else
(``tools=``, ``tokenize=True``, ``save_pretrained``, ...) goes to the transformers tokenizer,
loaded on first such use. ``FastTokenizer.supports(folder)`` says whether a folder's
``tokenizer_config.json`` only uses settings this class reproduces; ``load_tokenizer`` in
``jaxdm.models.loading`` uses transformers for the others.
"""
from __future__ import annotations

import json
import re
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

# Special-token attributes of transformers tokenizers (values: a string or {"content": ...}).
SPECIAL_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")
# tokenizer_config.json keys whose effect FastTokenizer reproduces (with these values).
_NEUTRAL = {"add_bos_token": (False, None), "add_eos_token": (False, None),
            "clean_up_tokenization_spaces": (False, None)}
_IGNORED = {"tokenizer_class", "model_max_length", "chat_template", "padding_side",
            "truncation_side", "model_input_names", "extra_special_tokens"} | set(SPECIAL_ATTRIBUTES)
_TOKENIZER_CLASSES = (None, "PreTrainedTokenizerFast")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_config(folder: Path) -> dict:
    path = folder / "tokenizer_config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    return config


class FastTokenizer:
    """tokenizer.json via `tokenizers`, with transformers' ``PreTrainedTokenizerFast`` results."""

    def __init__(self, folder: str | Path, chat_template: str | None = None):
        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{self.folder}: missing tokenizer.json")
        config = _read_config(self.folder)
        reason = self.unsupported(config)
        if reason:
            raise ValueError(f"{self.folder}/tokenizer_config.json: {reason}; load it with "
                             "jaxdm.models.loading.load_tokenizer (transformers)")
        self._tok = Tokenizer.from_file(str(path))
        self._special: dict[str, str] = {}
        for attr in SPECIAL_ATTRIBUTES:
            text = _token_text(config.get(attr))
            if text is not None:
                self._special[attr] = text
        # transformers registers the configured special tokens with the backend tokenizer (so
        # they split out of text and decode(skip_special_tokens=True) drops them).
        known = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        new = [AddedToken(t, special=True, normalized=False)
               for t in dict.fromkeys(self._special.values()) if t not in known]
        if new:
            self._tok.add_special_tokens(new)
        self.chat_template = chat_template
        self._full_tokenizer = None

    @staticmethod
    def unsupported(config: dict) -> str | None:
        """Why a tokenizer_config.json needs transformers (None: FastTokenizer reproduces it)."""
        if config.get("tokenizer_class") not in _TOKENIZER_CLASSES:
            return f"tokenizer_class {config.get('tokenizer_class')!r}"
        for key, value in config.items():
            if key in _NEUTRAL:
                if value not in _NEUTRAL[key]:
                    return f"{key}={value!r}"
            elif key not in _IGNORED:
                return f"setting {key!r}"
        extra = config.get("extra_special_tokens")
        if extra not in (None, {}, []):
            return "extra_special_tokens"
        return None

    @classmethod
    def supports(cls, folder: str | Path) -> bool:
        """Whether ``folder`` can be read without transformers: it has a tokenizer.json and its
        tokenizer_config.json asks for nothing unsupported() refuses."""
        folder = Path(folder)
        return (folder / "tokenizer.json").exists() and cls.unsupported(
            _read_config(folder)) is None

    # -- special tokens ------------------------------------------------------------------
    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The special tokens by role ('bos_token', 'eos_token', 'pad_token', ...) as transformers
        names them."""
        return dict(self._special)

    def _special_id(self, attr: str) -> int | None:
        text = self._special.get(attr)
        return None if text is None else self._tok.token_to_id(text)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in SPECIAL_ATTRIBUTES:
            return self._special.get(name)
        if name.endswith("_token_id") and name[:-3] in SPECIAL_ATTRIBUTES:
            return self._special_id(name[:-3])
        return getattr(self.full(), name)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary's size, added tokens not counted (as transformers' vocab_size)."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """``tokenizers.Tokenizer``'s name for it (adapters probe for it; answering here keeps
        the probe from loading transformers)."""
        return self._tok.get_vocab_size(with_added_tokens=with_added_tokens)

    def convert_tokens_to_ids(self, tokens):
        """The id of one token string, or the list of ids of a list of them (None for an unknown
        token)."""
        if isinstance(tokens, str):
            return self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        """The token string of one id, or the list of strings of a sequence of ids."""
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(int(i)) for i in ids]

    # -- text <-> ids --------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True, **kwargs) -> list[int]:
        """The token ids of ``text`` (with the template's special tokens unless add_special_tokens
        is False); any other keyword (truncation, pairs, tensors) goes to transformers' tokenizer.
        """
        if kwargs:  # truncation, pairs, tensors, ...: transformers' own
            return self.full().encode(text, add_special_tokens=add_special_tokens, **kwargs)
        if not isinstance(text, str):
            raise TypeError(f"FastTokenizer.encode takes a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text, add_special_tokens: bool = True, **kwargs) -> dict:
        if kwargs:
            return self.full()(text, add_special_tokens=add_special_tokens, **kwargs)
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        if isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            encs = self._tok.encode_batch(list(text), add_special_tokens=add_special_tokens)
            return {"input_ids": [e.ids for e in encs]}
        raise TypeError(f"FastTokenizer takes a str or a list of str, got {type(text).__name__}")

    def decode(self, ids, skip_special_tokens: bool = False, **kwargs) -> str:
        """The text of ``ids`` (an int, a list or an array), special tokens dropped with
        skip_special_tokens; other keywords go to transformers' tokenizer."""
        if kwargs:
            return self.full().decode(ids, skip_special_tokens=skip_special_tokens, **kwargs)
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        """decode() of each row of ``rows``."""
        return [self.decode(r, skip_special_tokens) for r in rows]

    # -- chat template -------------------------------------------------------------------
    def apply_chat_template(self, conversation, tools=None, documents=None,
                            chat_template=None, add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs):
        """transformers' rendering for plain ``{"role": str, "content": str}`` messages with
        ``tokenize=False`` and no tools or documents; everything else goes to transformers."""
        plain = (not tokenize and tools is None and documents is None and not kwargs
                 and isinstance(conversation, (list, tuple))
                 and all(isinstance(m, dict) and set(m) <= {"role", "content"}
                         and all(type(v) is str for v in m.values()) for m in conversation))
        template = chat_template or self.chat_template
        compiled = _compiled(template) if plain and template is not None else None
        if compiled is None:
            return self.full().apply_chat_template(
                conversation, tools=tools, documents=documents, chat_template=chat_template,
                add_generation_prompt=add_generation_prompt, tokenize=tokenize, **kwargs)
        messages = [dict(m) for m in conversation]
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **self._special)

    # -- the transformers tokenizer, for everything else ---------------------------------
    def full(self):
        """The transformers ``PreTrainedTokenizerFast`` of the same folder (loaded once)."""
        if self._full_tokenizer is None:
            from transformers import PreTrainedTokenizerFast  # why: ~0.5 s, rarely needed

            tok = PreTrainedTokenizerFast.from_pretrained(str(self.folder))
            if self.chat_template is not None and not getattr(tok, "chat_template", None):
                tok.chat_template = self.chat_template
            self._full_tokenizer = tok
        return self._full_tokenizer

    @property
    def transformers_loaded(self) -> bool:
        """Whether a call so far needed the transformers tokenizer."""
        return self._full_tokenizer is not None

    def save_pretrained(self, *args, **kwargs):
        """Save the tokenizer files as transformers does (through the full transformers tokenizer).
        """
        return self.full().save_pretrained(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FastTokenizer({str(self.folder)!r}, vocab_size={self.vocab_size})"


_TEMPLATES: dict[str, Any] = {}


def _compiled(template: str):
    """The template compiled in a sandbox set up as transformers sets up its own (trim_blocks,
    lstrip_blocks, loop controls, ``tojson`` without HTML escaping, ``raise_exception``,
    ``strftime_now``); None for a template this setup cannot parse (transformers' own
    extensions, such as ``{% generation %}``): transformers renders those."""
    if template not in _TEMPLATES:
        import jinja2.ext, jinja2.sandbox  # noqa: E401  why: ~15 ms, only chat templates need it

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            _TEMPLATES[template] = env.from_string(template)
        except jinja2.TemplateSyntaxError:
            _TEMPLATES[template] = None
    return _TEMPLATES[template]


# -- untrusted text: special-token strings as text, template markers as ids ---------------
# Contexts, observations, options and tool results come from trajectories, environments and
# users. A fast tokenizer splits its special tokens (``<|im_start|>``, ``<|im_end|>``, ...) out
# of any text by default, so such a string inside an observation would become the real
# control token and could forge a chat turn. Only a chat template's own markers may become
# special tokens: ``text_ids`` tokenises untrusted text with special-token splitting off and
# ``chat_ids`` renders a conversation with its contents kept as text.

def _backend(tokenizer: Any):
    """The ``tokenizers.Tokenizer`` under a FastTokenizer, a transformers fast tokenizer or
    itself; None when there is none (a slow tokenizer)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, FastTokenizer):
        return tokenizer._tok
    return getattr(tokenizer, "backend_tokenizer", None)


def _text_backend(tokenizer: Any):
    """A copy of the backend tokenizer that encodes special-token strings as ordinary text
    (``encode_special_tokens``), built once per tokenizer."""
    cached = getattr(tokenizer, "_jaxdm_text_backend", None)
    if cached is not None:
        return cached
    backend = _backend(tokenizer)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} has no fast (tokenizers) backend: cannot "
                        "tokenise untrusted text with special-token parsing off")
    copy = Tokenizer.from_str(backend.to_str())
    copy.encode_special_tokens = True
    try:
        object.__setattr__(tokenizer, "_jaxdm_text_backend", copy)
    except (AttributeError, TypeError):
        pass  # a tokenizer that takes no attributes: rebuilt per call (slower, same ids)
    return copy


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The strings the tokenizer turns into special tokens when it parses them in text."""
    backend = _backend(tokenizer)
    if backend is None:
        return tuple(getattr(tokenizer, "all_special_tokens", ()))
    return tuple(sorted({t.content for t in backend.get_added_tokens_decoder().values()
                         if t.special}, key=len, reverse=True))


def text_ids(tokenizer: Any, texts: "str | list[str]") -> "list[int] | list[list[int]]":
    """Token ids of untrusted text, no BOS/EOS added, every special-token string in it
    tokenised as ordinary text. Equal to ``tokenizer(text, add_special_tokens=False)`` for
    text without such strings. A str gives one list, a list of str a list of lists."""
    one = isinstance(texts, str)
    batch = [texts] if one else list(texts)
    if not all(isinstance(t, str) for t in batch):
        raise TypeError("text_ids takes a str or a list of str")
    specials = special_texts(tokenizer)
    if any(s in t for t in batch for s in specials):
        out = [list(e.ids) for e in
               _text_backend(tokenizer).encode_batch(batch, add_special_tokens=False)]
    elif _backend(tokenizer) is tokenizer:   # a bare tokenizers.Tokenizer
        out = [list(e.ids) for e in tokenizer.encode_batch(batch, add_special_tokens=False)]
    else:
        out = [list(ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]]
    return out[0] if one else out


def chat_ids(tokenizer: Any, conversations: "list[list[dict]]", *,
             add_generation_prompt: bool = True, tools: "list | None" = None
             ) -> list[list[int]]:
    """Token ids of each conversation under the tokenizer's chat template, as an API server
    builds them (template applied as text, no extra BOS/EOS), except that a special-token
    string inside a message's content (or a tool definition) stays text: only the template's
    own markers become special tokens. Conversations without such strings take the server's
    exact path (one batched encode of the rendered text).

    How: each special-token string found in untrusted text is swapped for a random ASCII
    slot before rendering; the rendered text is cut at the slots, its pieces encoded with
    special tokens parsed (the template's markers) and each slot as the string's text ids."""
    specials = special_texts(tokenizer)

    def render(conv, tls):
        kw = {} if tls is None else {"tools": tls}
        return tokenizer.apply_chat_template(list(conv), tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **kw)

    tools_hostile = tools is not None and any(s in json.dumps(tools, ensure_ascii=False)
                                              for s in specials)
    hostile = [tools_hostile or any(s in str(m.get("content", "")) for m in conv
                                    for s in specials) for conv in conversations]
    out: list[list[int] | None] = [None] * len(conversations)
    plain = [i for i, h in enumerate(hostile) if not h]
    if plain:
        texts = [render(conversations[i], tools) for i in plain]
        for i, ids in zip(plain, tokenizer(texts, add_special_tokens=False)["input_ids"]):
            out[i] = list(ids)
    if not any(hostile):
        return out  # type: ignore[return-value]
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    for i, conv in enumerate(conversations):
        if not hostile[i]:
            continue
        nonce = secrets.token_hex(6)
        found: list[str] = []

        def slot(match):
            found.append(match.group(0))
            return f"@@{nonce}:{len(found) - 1}@@"

        def swap(x):
            if isinstance(x, str):
                return pattern.sub(slot, x)
            if isinstance(x, dict):
                return {k: swap(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [swap(v) for v in x]
            return x

        conv2 = [dict(m, content=swap(m["content"])) if isinstance(m.get("content"), str)
                 else dict(m) for m in conv]
        tools2 = swap(tools) if tools is not None else None
        rendered = render(conv2, tools2)
        parts = re.split(f"@@{nonce}:(\\d+)@@", rendered)
        used = [int(p) for p in parts[1::2]]
        if sorted(set(used)) != list(range(len(found))):
            raise ValueError("the chat template altered the untrusted text it renders (a "
                             "special-token string in a message could not be kept as text)")
        ids: list[int] = []
        for k, piece in enumerate(parts):
            if k % 2 == 0:
                if piece:
                    ids += list(tokenizer(piece, add_special_tokens=False)["input_ids"])
            else:
                ids += text_ids(tokenizer, found[int(piece)])
        out[i] = ids
    return out  # type: ignore[return-value]
