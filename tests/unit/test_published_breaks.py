"""Smaller forms of the published dagster-slurm package: supported, or refused naming what
to use instead (RayLauncher's dashboard option, SparkLauncher.master_url, the published
SlurmAllocation constructor, the metric callback names)."""

from __future__ import annotations

import warnings

import pytest
from pydantic import ValidationError

from dagster_slurm import ConfigurationError, RayLauncher, SparkLauncher
from dagster_slurm.config_errors import RemovedFieldError
from dagster_slurm.session.core.allocation import SlurmAllocation


@pytest.mark.parametrize("args", [
    ["--include-dashboard=false"],
    ["--include-dashboard=False", "--log-style=record"],
    ["--include-dashboard", "0"],
])
def test_include_dashboard_in_ray_start_args_sets_the_field(args: list[str]) -> None:
    with pytest.warns(DeprecationWarning, match="use include_dashboard=False") as caught:
        launcher = RayLauncher(ray_start_args=args)
    assert launcher.include_dashboard is False
    assert not any("include-dashboard" in entry for entry in launcher.ray_start_args)
    assert caught[0].filename == __file__, "the warning points at the user's line"


def test_include_dashboard_agreeing_with_the_field_is_accepted() -> None:
    with pytest.warns(DeprecationWarning):
        launcher = RayLauncher(ray_start_args=["--include-dashboard=true"], include_dashboard=True)
    assert launcher.include_dashboard is True and launcher.ray_start_args == []


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"ray_start_args": ["--include-dashboard=false"], "include_dashboard": True},
     "contradicts include_dashboard=True"),
    ({"ray_start_args": ["--include-dashboard=maybe"]}, "takes true or false"),
    ({"ray_start_args": ["--include-dashboard=false", "--include-dashboard=true"]},
     "different values"),
    ({"ray_start_args": ["--include-dashboard"]}, "use include_dashboard"),
])
def test_include_dashboard_that_cannot_be_mapped_is_refused(kwargs, text: str) -> None:
    with warnings.catch_warnings(), pytest.raises(ValidationError, match=text):
        warnings.simplefilter("ignore", DeprecationWarning)
        RayLauncher(**kwargs)


def test_other_options_and_no_option_give_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RayLauncher(ray_start_args=["--log-style=record"]).include_dashboard is True


def test_spark_master_url_is_refused_naming_the_replacement() -> None:
    with pytest.raises(ValidationError) as caught:
        SparkLauncher(master_url="spark://master:7077")
    (error,) = [detail["ctx"]["error"] for detail in caught.value.errors()]
    assert isinstance(error, RemovedFieldError) and isinstance(error, ConfigurationError)
    assert (error.owner, error.field, error.value) == ("SparkLauncher", "master_url",
                                                       "spark://master:7077")
    assert "published dagster-slurm package" in str(error) and "BashLauncher()" in str(error)
    assert "master_url" not in SparkLauncher.model_fields


@pytest.mark.parametrize(("args", "kwargs", "field"), [
    ((), {"slurm_job_id": 4242, "nodes": ["c1"], "working_dir": "/w", "config": None},
     "config"),
    ((4242, ["c1"], "/w", None), {}, "slurm_job_id"),
    ((), {"slurm_job_id": 4242}, "slurm_job_id"),
])
def test_the_published_allocation_constructor_says_where_allocations_come_from(
        args: tuple, kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SlurmAllocation(*args, **kwargs)
    assert caught.value.field == field
    assert "get_run_allocation_session(context).allocation" in str(caught.value)
    assert ".job_id" in str(caught.value)


def test_todays_allocation_constructor_is_unchanged() -> None:
    allocation = SlurmAllocation(None, None, "dsr-run", "4242")  # type: ignore[arg-type]
    assert allocation.job_id == "4242"


def test_metric_callback_names_fail_to_import_with_the_replacement() -> None:
    with pytest.raises(ImportError, match="no metric callbacks.*published_metadata_keys=True"):
        from dagster_slurm import SlurmMetricsContext  # noqa: F401
    with pytest.raises(ImportError, match="SlurmMetricsCallback"):
        from dagster_slurm import SlurmMetricsCallback  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name 'NoSuchName'"):
        from dagster_slurm import NoSuchName  # noqa: F401


def test_the_mapped_dashboard_setting_survives_dagsters_rebuild_of_the_resource() -> None:
    import dagster as dg

    from dagster_slurm import ComputeResource

    with pytest.warns(DeprecationWarning):
        compute = ComputeResource(
            default_launcher=RayLauncher(ray_start_args=["--include-dashboard=false"]))
    with dg.build_resources({"compute": compute}) as resources:
        launcher = resources.compute.default_launcher
    assert launcher.include_dashboard is False and launcher.ray_start_args == []
