"""The options' help is written once, in the library's option table (``gpuheap::options::OPTIONS``): the
docstring of each command's wrapper prints the help of every row the command takes, and each keyword of
the wrapper is a row (or the snapshot and, for ``explain``, ``tune``, the negation of ``no_tune``)."""

import inspect

import gpuheap
from gpuheap import _gpuheap

WRAPPERS = {"replay": gpuheap.replay, "compare": gpuheap.compare, "explain": gpuheap.explain, "tune": gpuheap.tune}
# Keywords that are not a row under their own name: the input, and explain's positive form of --no-tune.
NOT_ROWS = {"snapshot", "tune"}


def test_each_wrappers_docstring_prints_the_help_of_its_rows():
    table = _gpuheap.option_table()
    assert len(table) >= 12
    for command, f in WRAPPERS.items():
        rows = [r for r in table if command in r[4]]
        assert rows, command
        for key, help_text, _value, _repeated, _commands in rows:
            # compare documents its shared rows by reference to replay's docstring.
            doc = f.__doc__ if command != "compare" or key in ("device_heap_limit", "verbose") else gpuheap.replay.__doc__
            assert help_text in doc, (command, key)
        assert "{" not in f.__doc__, (command, "an unfilled field")


def test_each_keyword_of_a_wrapper_is_a_row_the_command_takes():
    table = _gpuheap.option_table()
    for command, f in WRAPPERS.items():
        keys = {r[0] for r in table if command in r[4]}
        params = set(inspect.signature(f).parameters) - NOT_ROWS
        if command == "explain":
            assert "no_tune" in keys
            keys.discard("no_tune")
        assert params == keys, (command, params ^ keys)
