"""Cost figures of a job or task, the run's summary and the efficiency warning."""

from dagster_slurm.jobs.cost import cost_figures, efficiency_warning, run_summary


def test_hours_and_efficiencies_of_one_task():
    figures = cost_figures(elapsed_seconds=1800, cpus=4, gpus=2, max_rss_bytes=256 * 2**20,
                           requested_mem_bytes=1024 * 2**20, cpu_efficiency=0.25,
                           queue_wait_seconds=12.5)
    assert figures["dagster_slurm/cpu_hours"] == 2.0
    assert figures["dagster_slurm/gpu_hours"] == 1.0
    assert figures["dagster_slurm/memory_efficiency"] == 0.25
    assert figures["dagster_slurm/queue_wait_seconds"] == 12.5


def test_unknown_figures_stay_none_never_zero():
    figures = cost_figures(elapsed_seconds=None, cpus=None, gpus=None, max_rss_bytes=None,
                           requested_mem_bytes=None, cpu_efficiency=None, queue_wait_seconds=None)
    assert all(value is None for value in figures.values())


def test_the_summary_sums_hours_and_averages_what_is_known():
    rows = [{"dagster_slurm/cpu_hours": 1.0, "dagster_slurm/cpu_efficiency": 0.2},
            {"dagster_slurm/cpu_hours": 2.0, "dagster_slurm/cpu_efficiency": None},
            {"dagster_slurm/cpu_hours": None, "dagster_slurm/cpu_efficiency": 0.4}]
    summary = run_summary(rows)
    assert summary["dagster_slurm/run_cpu_hours"] == 3.0
    assert summary["dagster_slurm/run_mean_cpu_efficiency"] == 0.3
    assert summary["dagster_slurm/run_gpu_hours"] is None


def test_the_warning_names_the_request_to_lower():
    summary = {"dagster_slurm/run_mean_cpu_efficiency": 0.1,
               "dagster_slurm/run_mean_memory_efficiency": 0.2}
    text = efficiency_warning(summary, 0.5, cpus=8, mem="4G")
    assert "fewer CPUs" in text and "less memory" in text and "4G" in text
    assert efficiency_warning(summary, None, cpus=8, mem="4G") is None
    one_cpu = efficiency_warning({"dagster_slurm/run_mean_cpu_efficiency": 0.1}, 0.5, cpus=1,
                                 mem=None)
    assert one_cpu is None  # one CPU per task: nothing to lower
    assert efficiency_warning({"dagster_slurm/run_mean_cpu_efficiency": 0.9}, 0.5, cpus=8,
                              mem=None) is None
