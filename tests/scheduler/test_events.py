"""The event stream's pure parts: positions, what counts as missed, node changes."""
import pytest

from corral.scheduler.events import BadCursor, Cursor, node_changes, parse_types


@pytest.mark.parametrize("text, windowed, cursor", [
    ("0", False, Cursor(id=0)),
    (" 42 ", False, Cursor(id=42)),
    ("7.9.120", True, Cursor(7, 9, 120, True)),
    ("9.9.0", True, Cursor(9, 9, 0, True)),
])
def test_positions_read_back_as_written(text, windowed, cursor):
    assert Cursor.parse(text, windowed) == cursor
    assert Cursor.parse(str(cursor), windowed) == cursor


@pytest.mark.parametrize("text, windowed", [
    ("", False), ("-1", False), ("1.2.3", False), ("x", False), ("١٢", False), ("1" * 20, False),
    ("42", True), ("1.2", True), ("9.7.1", True), ("1.2.3.4", True), ("a.b.c", True),
])
def test_anything_else_is_refused(text, windowed):
    with pytest.raises(BadCursor):
        Cursor.parse(text, windowed)


def test_missed_by_id_on_sqlite():
    assert not Cursor(id=10).missed_after(None)
    assert not Cursor(id=10).missed_after(Cursor(id=10))
    assert Cursor(id=10).missed_after(Cursor(id=11))


def test_missed_by_transaction_window_on_postgres():
    pruned = Cursor(50, 50, 900, True)
    assert not Cursor(60, 60, 0, True).missed_after(pruned)    # read everything below 60
    assert Cursor(50, 50, 0, True).missed_after(pruned)        # transaction 50 was not read yet
    assert not Cursor(45, 51, 3, True).missed_after(Cursor(44, 44, 9, True))
    assert Cursor(45, 51, 3, True).missed_after(pruned)        # inside the window: not sure, say so


def test_node_changes_between_two_lists():
    before = {"a": ("healthy", False), "b": ("healthy", False), "c": ("unhealthy", False), "d": ("healthy", False)}
    after = {"a": ("healthy", False), "b": ("drained", True), "c": ("healthy", False), "e": ("unhealthy", False)}
    assert node_changes(before, after) == [
        ("b", "drained", {"status": "drained"}),
        ("c", "healthy", {"status": "healthy"}),
        ("d", "deregistered", {}),
        ("e", "registered", {"status": "unhealthy", "drained": False}),
    ]
    assert node_changes(after, after) == []
    # Drained and dead at once: both are said.
    assert node_changes({"a": ("drained", True)}, {"a": ("unhealthy", False)}) == [
        ("a", "undrained", {"status": "unhealthy"}), ("a", "unhealthy", {"status": "unhealthy"})]


def test_types():
    assert parse_types([]) is None
    assert parse_types(["job,log", "node"]) == {"job", "log", "node"}
    with pytest.raises(ValueError, match="'jobs'"):
        parse_types(["jobs"])
