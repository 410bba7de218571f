"""The config schema of the library's resources is inferred once per class, and is the
schema Dagster infers."""

from __future__ import annotations

import dagster as dg
from dagster._config.pythonic_config import resource as dagster_resource
from dagster._config.pythonic_config.config import infer_schema_from_config_class

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
