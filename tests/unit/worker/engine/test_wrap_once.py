"""wrap_once: each marker wraps an attribute once, different markers stack, and an
outer wrapper keeps the inner one's markers visible."""

import functools

from pdspec.worker.engine.wrap_once import is_wrapped, markers, wrap_once


def tagging(tag: str):
    def wrap(original):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            return [tag, *original(*args, **kwargs)]

        return wrapper

    return wrap


def fresh_class():
    class Runner:
        def step(self):
            return ["vllm"]

        @staticmethod
        def topology():
            return ["vllm"]

    return Runner


def test_one_marker_wraps_once():
    cls = fresh_class()
    assert wrap_once(cls, "step", "a", tagging("a"))
    assert not wrap_once(cls, "step", "a", tagging("a"))
    assert cls().step() == ["a", "vllm"]


def test_different_markers_stack_and_stay_visible():
    cls = fresh_class()
    wrap_once(cls, "step", "inner", tagging("inner"))
    wrap_once(cls, "step", "outer", tagging("outer"))
    assert cls().step() == ["outer", "inner", "vllm"]
    assert markers(cls.step) == {"inner", "outer"}
    # Installing the inner hook again (a second engine in one process) is a no-op.
    assert not wrap_once(cls, "step", "inner", tagging("inner"))
    assert cls().step() == ["outer", "inner", "vllm"]


def test_static_functions_stay_static():
    cls = fresh_class()
    assert wrap_once(cls, "topology", "t", tagging("t"), static=True)
    assert cls.topology() == ["t", "vllm"] and cls().topology() == ["t", "vllm"]
    assert is_wrapped(cls.topology, "t")


def test_instances_and_missing_attributes():
    cls = fresh_class()
    obj = cls()
    assert wrap_once(obj, "step", "instance", tagging("i"))
    assert obj.step() == ["i", "vllm"] and cls().step() == ["vllm"]
    assert not wrap_once(cls, "absent", "x", tagging("x"))
    assert not hasattr(cls, "absent")
    assert not is_wrapped(cls.step, "instance")
