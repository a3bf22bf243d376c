"""jaxdm.secrets.redact: every form a URL carries a credential in, and text it leaves alone."""
import pytest

from jaxdm.secrets import RedactingStream, is_secret_key, redact


@pytest.mark.parametrize("text, want", [
    ("base_url=http://bob:sk-test-SECRET@127.0.0.1:8000/v1",
     "base_url=http://***@127.0.0.1:8000/v1"),
    ("https://ghp_TOKEN@github.com/x.git", "https://***@github.com/x.git"),
    ('{"u": "http://h/v1?api_key=SECRET&model=m"}', '{"u": "http://h/v1?api_key=***&model=m"}'),
    ("http://h/v1?model=m&key=SECRET#top", "http://h/v1?model=m&key=***#top"),
    ("http://h/v1?token=SECRET;x=1", "http://h/v1?token=***;x=1"),
    ("http://h/q?access_token=SECRET&sig=SECRET", "http://h/q?access_token=***&sig=***"),
    ("redis://:SECRET@cache:6379/0", "redis://***@cache:6379/0"),
])
def test_credentials_are_redacted(text, want):
    assert redact(text) == want
    assert redact(want) == want   # idempotent


@pytest.mark.parametrize("text", [
    "write to alice@example.com; a = b", "https://x.org/search?q=1&page=2&max_tokens=5",
    "ratio=0.5 with key_count=3", "plain", ""])
def test_text_without_credentials_is_unchanged(text):
    assert redact(text) == text


def test_stream_and_key_names(capsys):
    import sys
    s = RedactingStream(sys.stderr)
    s.write("calling http://u:SECRET@h/v1\n")
    s.flush()
    assert capsys.readouterr().err == "calling http://***@h/v1\n"
    assert is_secret_key("judge.api_key") and not is_secret_key("judge.api_key_env")
