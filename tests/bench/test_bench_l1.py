"""L1 items built from bfcl-eval's BFCL v4 files: deterministic, exactly one correct option."""
import collections

from jaxdm.bench import l1


def _key(q):
    return (q.context, q.question, q.options, tuple(sorted(q.meta.items())))


def test_items_are_deterministic_and_have_exactly_one_correct_option():
    a, stats_a = l1.build_l1()
    b, stats_b = l1.build_l1()
    assert [_key(q) for q in a] == [_key(q) for q in b] and stats_a == stats_b
    kinds = collections.Counter(q.meta["kind"] for q in a)
    assert kinds["l1_tool"] == stats_a["tool/total"] > 1000
    assert kinds["l1_param"] == stats_a["param/total"] > 1000
    for q in a:
        (ans,) = q.meta["answer"]                       # exactly one acceptable option
        assert len(q.options) >= 2 and len(set(q.options)) == len(q.options)
        assert q.meta["oracle_answer"] == q.options[ans]
    # Tool items: the answer is the ground-truth function, no option text leaks the key.
    sample = [q for q in a if q.meta["kind"] == "l1_tool"][:50]
    for q in sample:
        assert "ground" not in q.context.lower()
    # Copyable values are written in the user's words.
    for q in a:
        if q.meta.get("sem") == "copy_string":
            assert q.options[q.meta["answer"][0]] in q.context
    subset, st = l1.build_l1(limit_tool=10, limit_param=5, seed=3)
    assert st["used/tool"] == 10 and st["used/param"] == 5 and len(subset) == 15
    assert [_key(q) for q in subset] == [_key(q) for q in l1.build_l1(10, 5, seed=3)[0]]
    assert "not available offline" in st["when2call"]
