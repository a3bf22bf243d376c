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


def test_a_huge_line_is_refused_before_it_is_held(tmp_path, monkeypatch):
    import jaxdm.jsonl as jsonl
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1000)
    p = tmp_path / "big.jsonl"
    p.write_text('{"a": 1}\n' + "x" * 5000 + "\n")
    with pytest.raises(ValueError, match=r"big\.jsonl:2: line longer than 1000 characters"):
        read_records(p)
    with open(p, encoding="utf-8") as f:   # the readers that iterate an open file
        with pytest.raises(ValueError, match=r"big\.jsonl:2: line longer"):
            list(parse_lines(f, p))
    p.write_text('{"a": "' + "y" * 991 + '"}\n')   # a line of exactly the bound is fine
    assert len(p.read_text()) == 1001 and len(read_records(p)) == 1


def test_a_sparse_1g_file_is_refused_in_bounded_memory(tmp_path):
    """The issue's repro (truncate -s 1G as --data / --trajectories): the error names the file
    and line, and the reading process stays far below the 2.3 GB it peaked at."""
    import subprocess
    import sys
    p = tmp_path / "sparse.jsonl"
    with open(p, "wb") as f:
        f.truncate(1 << 30)
    # VmHWM is the peak of this process's own memory map (a new one at exec); ru_maxrss is not:
    # Linux carries it across fork + exec from the (large) pytest process.
    code = ("import sys\n"
            "from jaxdm.trajectory import read_jsonl\n"
            "from jaxdm.train.data import read_states\n"
            "for read in (read_jsonl, read_states):\n"
            "    try:\n        read(sys.argv[1])\n    except ValueError as e:\n"
            "        print(e)\n"
            "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
            "print('rss_mb', int(hwm[0].split()[1]) // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(f"{p}:1: line longer than" in ln for ln in lines) == 2, out.stdout
    assert int(lines[-1].split()[1]) < 800, out.stdout   # one 64 MB bound, not the whole file


def test_failed_writes_leave_the_file_as_it_was(tmp_path, monkeypatch):
    import errno
    import os

    from jaxdm.jsonl import OutputError, append_records, write_atomic
    p = tmp_path / "r.jsonl"
    append_records(p, [{"a": 1}])
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match=r"cannot write .*r\.jsonl: no space left on device"):
        append_records(p, [{"b": 2}, {"c": 3}])
    with pytest.raises(OutputError, match="no space left"):
        write_atomic(p, "replaced\n")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert p.read_text() == '{"a": 1}\n'        # no partial line, no half rewrite
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.jsonl"]   # no temporary left
    with pytest.raises(OutputError, match="cannot write"):
        write_atomic(tmp_path / "no" / "such" / "dir.json", "{}")


def test_two_writers_never_share_a_temporary_file(tmp_path):
    """Each atomic rewrite has its own temporary: concurrent writers of one file leave it
    whole (one of their texts), never a mix or a missing file."""
    import threading

    from jaxdm.jsonl import write_atomic
    p = tmp_path / "s.json"
    texts = [f"{i}" * 20000 for i in range(8)]
    errors = []

    def writer(t):
        try:
            for _ in range(20):
                write_atomic(p, t)
        except Exception as e:   # pragma: no cover - the failure being tested
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and p.read_text() in texts
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.json"]


def test_writers_redact_url_credentials(tmp_path):
    from jaxdm.jsonl import append_records, write_json, write_records
    spec = "remote:base_url=http://bob:sk-test-SECRET@127.0.0.1:9/v1?api_key=SECRET2,model=m"
    append_records(tmp_path / "a.jsonl", [{"judge": spec}])
    write_records(tmp_path / "b.jsonl", [{"judge": spec}])
    write_json(tmp_path / "c.json", {"judges": [spec]})
    for name in ("a.jsonl", "b.jsonl", "c.json"):
        text = (tmp_path / name).read_text()
        assert "SECRET" not in text and "bob" not in text, (name, text)
        assert "http://***@127.0.0.1:9/v1?api_key=***" in text


def test_without_keys_drops_the_keys_at_any_depth_and_keeps_the_rest():
    from jaxdm.jsonl import without_keys
    value = {"seconds": 1.5, "a": [{"seconds": 2, "b": 1}, 3], "c": {"d": {"seconds": 0}}}
    assert without_keys(value, {"seconds"}) == {"a": [{"b": 1}, 3], "c": {"d": {}}}
    assert value["seconds"] == 1.5   # the input is left as it was
    assert without_keys([1, "x", None], {"x"}) == [1, "x", None]   # only dict keys go
