"""jaxdm.jsonl: the one JSON Lines reader (errors name file and line; torn tails on resume)."""
import pytest

from jaxdm.jsonl import parse_lines, read_records


def test_parse_lines_counts_blank_lines_and_names_the_bad_one():
    lines = ['{"a": 1}\n', "\n", "[2, 3]\n", '{"b": \n']
    got = parse_lines(lines, "f.jsonl")
    assert next(got) == ("f.jsonl:1", {"a": 1})
    assert next(got) == ("f.jsonl:3", [2, 3])
    with pytest.raises(ValueError, match=r"^f\.jsonl:4: invalid JSON \(Expecting value at "
                                         r"column 7\)$"):
        next(got)


def test_read_records_drops_only_an_unterminated_bad_last_line(tmp_path, capsys):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2, "lo')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: invalid JSON"):
        read_records(p)
    assert read_records(p, drop_torn_tail=True) == [(f"{p}:1", {"step": 1})]
    assert "m.jsonl:2: dropping a torn last line" in capsys.readouterr().err
    # a complete last record without its newline is kept, not dropped
    p.write_text('{"step": 1}\n{"step": 2}')
    assert [r for _, r in read_records(p, drop_torn_tail=True)] == [{"step": 1}, {"step": 2}]
    # a bad line that has its newline was written whole: corruption, never dropped
    p.write_text('{"step": 1}\n{"step": 2, "lo\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: invalid JSON"):
        read_records(p, drop_torn_tail=True)
    # a bad line before the last is an error even when the tail is torn
    p.write_text('{"step": 1}\nnot json\n{"step": 3, "lo')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: invalid JSON"):
        read_records(p, drop_torn_tail=True)
    assert "dropping" not in capsys.readouterr().err


def test_appended_records_read_back_and_a_rewrite_is_whole(tmp_path):
    from jaxdm.jsonl import append_records, write_atomic, write_records
    p = tmp_path / "r.jsonl"
    append_records(p, [{"a": 1}, [2]])
    append_records(p, [])
    append_records(p, ["three"])
    assert [v for _, v in read_records(p)] == [{"a": 1}, [2], "three"]
    write_atomic(p, '{"b": 2}\n')
    assert [v for _, v in read_records(p)] == [{"b": 2}]
    assert write_records(p, iter([{"c": 3}, None])) == 2
    assert [v for _, v in read_records(p)] == [{"c": 3}, None]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.jsonl"]   # no temporary left
