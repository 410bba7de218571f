"""The config schema of the library's resources is inferred once per class, and is the
schema Dagster infers."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._config.pythonic_config import resource as dagster_resource
from dagster._config.pythonic_config.config import infer_schema_from_config_class
from dagster._config.pythonic_config.conversion_utils import _curry_config_schema
from dagster._core.errors import DagsterInvalidConfigError

from dagster_slurm import ComputeResource, schema_cache
from dagster_slurm.config_errors import KnownFieldsOnly


class _Counted:
    def __init__(self) -> None:
        self.classes: list[type] = []

    def __call__(self, model_cls, description=None, fields_to_omit=None, default=None):
        self.classes.append(model_cls)
        return infer_schema_from_config_class(model_cls, description=description,
                                              fields_to_omit=fields_to_omit, default=default)


class _Plain(dg.ConfigurableResource):
    value: int = 1


class _Ours(dg.ConfigurableResource, KnownFieldsOnly):
    value: int = 1


def test_library_resources_install_the_cache() -> None:
    assert getattr(dagster_resource.infer_schema_from_config_class, "__wrapped__", None) \
        is infer_schema_from_config_class


def test_inferred_once_per_class_and_omitted_fields() -> None:
    counted = _Counted()
    infer = schema_cache.cached_schema(counted)
    schema_cache.clear()
    first = infer(_Ours, fields_to_omit=set())
    assert infer(_Ours, fields_to_omit=set()) is first
    assert infer(_Ours) is first  # None and an empty set omit the same fields
    assert counted.classes == [_Ours]
    other = infer(_Ours, fields_to_omit={"value"})
    assert other is not first and counted.classes == [_Ours, _Ours]
    schema_cache.clear()


def test_other_classes_and_calls_are_not_cached() -> None:
    counted = _Counted()
    infer = schema_cache.cached_schema(counted)
    infer(_Plain)
    infer(_Plain)
    infer(_Ours, description="described")
    infer(_Ours, description="described")
    assert counted.classes == [_Plain, _Plain, _Ours, _Ours]


def test_cached_schema_is_dagsters_schema() -> None:
    """The fields, defaults and descriptions users see are unchanged."""
    resource = ComputeResource(mode="local")
    again = ComputeResource(mode="local")
    assert resource._schema is again._schema  # noqa: SLF001 - the object under test
    fresh = infer_schema_from_config_class(ComputeResource)
    assert resource._schema.config_type.snapshot == fresh.config_type.snapshot  # noqa: SLF001


def test_configured_values_still_reach_the_resource(tmp_path) -> None:
    compute = ComputeResource(mode="local", pipes_poll_interval=0.5,
                              local_base_path=str(tmp_path))

    @dg.asset
    def seen(compute: ComputeResource) -> dict:
        return {"interval": compute.pipes_poll_interval, "base": compute.local_base_path}

    result = dg.materialize([seen], resources={"compute": compute})
    assert result.output_for_node("seen") == {"interval": 0.5, "base": str(tmp_path)}


def test_values_from_run_config_reach_the_resource(tmp_path) -> None:
    @dg.asset
    def seen(compute: ComputeResource) -> float:
        return compute.pipes_poll_interval

    result = dg.materialize(
        [seen], resources={"compute": ComputeResource.configure_at_launch()},
        run_config={"resources": {"compute": {"config": {"pipes_poll_interval": 0.75}}}})
    assert result.output_for_node("seen") == 0.75


class _CountedCurry:
    def __init__(self) -> None:
        self.calls: list[object] = []

    def __call__(self, schema_field, data):
        self.calls.append(data)
        return _curry_config_schema(schema_field, data)


@pytest.fixture
def curry():
    """A cached curry over Dagster's own, with a fresh cache, and the schema of ``_Ours``
    from the schema cache."""
    schema_cache.clear()
    counted = _CountedCurry()
    schema = schema_cache.cached_schema(infer_schema_from_config_class)(_Ours)
    yield schema_cache.cached_curry(counted), counted, schema
    schema_cache.clear()


def test_curried_once_per_schema_and_values(curry) -> None:
    curried, counted, schema = curry
    first = curried(schema, {"value": 2})
    assert curried(schema, {"value": 2}) is first
    assert curried(schema, {"value": 3}) is not first
    assert counted.calls == [{"value": 2}, {"value": 3}]
    assert first.as_field().default_value == {"value": 2}


def test_values_of_other_types_are_other_keys(curry) -> None:
    """``1 == True`` in Python; as config values they are not the same."""
    curried, counted, schema = curry
    curried(schema, {"value": 1})
    assert schema_cache._frozen({"value": 1}) != schema_cache._frozen({"value": True})  # noqa: SLF001
    assert schema_cache._frozen([1.0]) != schema_cache._frozen([1])  # noqa: SLF001
    assert counted.calls == [{"value": 1}]


def test_other_schemas_and_uncomparable_values_are_not_cached(curry) -> None:
    curried, counted, schema = curry
    other = infer_schema_from_config_class(_Ours)  # equal, but not the cached object
    curried(other, {"value": 2})
    curried(other, {"value": 2})
    assert schema_cache._frozen({"value": object()}) is None  # noqa: SLF001
    assert schema_cache._frozen({1: "a"}) is None  # noqa: SLF001
    assert counted.calls == [{"value": 2}, {"value": 2}]


def test_refused_values_raise_every_time(curry) -> None:
    curried, counted, schema = curry
    for _ in range(2):
        with pytest.raises(DagsterInvalidConfigError):
            curried(schema, {"value": "not a number"})
    assert len(counted.calls) == 2


def test_at_most_curried_max_are_kept(curry, monkeypatch) -> None:
    curried, counted, schema = curry
    monkeypatch.setattr(schema_cache, "CURRIED_MAX", 2)
    for value in (1, 2, 3):
        curried(schema, {"value": value})
    curried(schema, {"value": 3})  # kept
    curried(schema, {"value": 1})  # the oldest, dropped
    assert [call["value"] for call in counted.calls] == [1, 2, 3, 1]


def test_the_resources_constructor_uses_the_cached_curry() -> None:
    assert getattr(dagster_resource._curry_config_schema, "__wrapped__", None) is not None  # noqa: SLF001
    first = ComputeResource(mode="local")
    again = ComputeResource(mode="local")
    assert first._config_schema is again._config_schema  # noqa: SLF001 - the object under test
    other = ComputeResource(mode="local", pipes_poll_interval=0.5)
    assert other._config_schema is not first._config_schema  # noqa: SLF001
