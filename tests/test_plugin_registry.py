"""The one plug-in mechanism (incontext/registry.py): name -> entry, one-line errors, --help's listing."""

import pytest

from incontext.registry import Registry


def test_an_unknown_name_lists_the_registered_ones():
    shapes = Registry("shape")
    shapes.register("square", 4)
    shapes.register("triangle", 3)
    with pytest.raises(KeyError) as error:
        shapes.get("circle")
    assert error.value.args[0] == "unknown shape 'circle'; registered: square, triangle"
    assert shapes.get("square") == 4 and shapes.find("circle") is None and shapes.find(None) is None
    tasks = Registry("task", known="tasks with episodes")
    with pytest.raises(KeyError, match="unknown task 'x'; tasks with episodes: "):
        tasks.get("x")


def test_a_name_registers_once():
    shapes = Registry("shape")

    @shapes.register("square")
    class Square:
        pass

    assert shapes.register("square", Square) is Square  # the same entry again: nothing happens
    with pytest.raises(ValueError, match="shape 'square' is already registered to .*Square"):
        shapes.register("square", object())
    with pytest.raises(ValueError, match="non-empty name"):
        shapes.register("", 1)
    assert shapes.get("square") is Square


def test_names_listing_and_scopes():
    shapes = Registry("shape")
    for name, sides in (("triangle", 3), ("square", 4), ("line", 2)):
        shapes.register(name, sides)
    assert shapes.names() == ["line", "square", "triangle"] and list(shapes) == ["triangle", "square", "line"]
    assert "line" in shapes and "circle" not in shapes and len(shapes) == 3
    assert shapes.listing(lambda sides: {"sides": sides}, first=("square",)) == {
        "square": {"sides": 4}, "line": {"sides": 2}, "triangle": {"sides": 3}}
    with shapes.scoped():
        shapes.register("circle", 0)
        shapes.unregister("line")
        assert shapes.names() == ["circle", "square", "triangle"]
    assert shapes.names() == ["line", "square", "triangle"]


def test_load_runs_before_a_look_up():
    loads = []
    lazy = Registry("experiment", load=lambda: loads.append(1) or lazy.register("late", 1))
    assert lazy.get("late") == 1 and loads
