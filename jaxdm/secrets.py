"""What counts as a secret, and the one function that takes secrets out of text we write.

``is_secret_key``: a config or spec key whose value must never be shown (``api_key``,
``token``, ``password``, ...; ``api_key_env``, the *name* of an environment variable, is not).

``redact``: a copy of any text (a spec, a URL, a JSON line, a report, a log line) with the
credentials a URL can carry replaced by ``***``: the userinfo (``http://user:pass@host``,
``https://TOKEN@host``) and the values of secret-looking query parameters (``?api_key=``,
``&key=``, ``&token=``, ``&sig=``...). Every file writer of ``jaxdm.jsonl`` applies it, and the
``jaxdm`` command applies it to what it prints, so a run folder can be shared as it is.
"""
from __future__ import annotations

import re
from typing import TextIO

__all__ = ["is_secret_key", "redact", "REDACTED", "RedactingStream"]

REDACTED = "***"

# Key names whose values must never appear in a message (matched per dotted part).
# "token" and "auth" only as whole words of a snake_case name: max_tokens, author are fine.
_SECRET_KEY = re.compile(r"api[_-]?key|secret|passw(or)?d|passwd|credential|private[_-]?key|"
                         r"(^|[_-])(token|auth|bearer)($|[_-])", re.I)
# Query parameters that carry credentials although their names do not say so in words.
_SECRET_PARAMS = {"key", "sig", "signature", "access_token", "code", "x-amz-signature",
                  "x-goog-signature"}

# scheme://userinfo@ : userinfo is everything up to the last "@" before the host part ends.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/?#@\"'<>\\]+)@")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&#;\s\"'<>\\]*)")


def is_secret_key(key: str) -> bool:
    """True when any part of dotted ``key`` looks like it names a secret (api_key, token...).
    ``api_key_env`` (the *name* of an environment variable) is not a secret."""
    parts = re.split(r"[.\[\]]", str(key))
    return any(_SECRET_KEY.search(p) and not p.endswith("_env") for p in parts if p)


def _param(m: re.Match) -> str:
    name = m.group("name")
    if m.group("value") and (is_secret_key(name) or name.lower() in _SECRET_PARAMS):
        return m.group("lead") + REDACTED
    return m.group(0)


def redact(text: str) -> str:
    """``text`` with URL credentials (userinfo, secret query values) replaced by ``***``."""
    if "@" not in text and "=" not in text:  # the common case: nothing to look at
        return text
    text = _USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@", text)
    if "://" in text or "?" in text:
        text = _QUERY_PARAM.sub(_param, text)
    return text


class RedactingStream:
    """A text stream that writes ``redact(s)`` of everything written to it (stderr/stdout of
    the ``jaxdm`` command: error messages and progress lines quote specs and URLs)."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, s: str) -> int:
        """Write ``s`` with every credential redacted to the wrapped stream; returns len(s) (what
        the caller wrote)."""
        self._stream.write(redact(s))
        return len(s)

    def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)
