"""Scheduler output used as test input.

Texts marked "measured" are verbatim outputs of Slurm 22.05.8 recorded on the project's test
sandbox (shared notes, sections 3 to 5). Texts marked "composed" put measured values into the
column layout the library requests, which the sandbox notes did not record verbatim.
"""

from __future__ import annotations

# measured: squeue --name=busy,waiter -o '%i|%j|%T|%t|%r|%R|%L|%l|%M|%N|%D|%b|%k|%P|%S|%e|%C|%m'
SQUEUE_WITH_HEADER = """\
JOBID|NAME|STATE|ST|REASON|NODELIST(REASON)|TIME_LEFT|TIME_LIMIT|TIME|NODELIST|NODES|TRES_PER_NODE|COMMENT|PARTITION|START_TIME|END_TIME|CPUS|MIN_MEMORY
14|waiter|PENDING|PD|Resources|(Resources)|1:00|1:00|0:00||1|N/A|tok-xyz|cpu|N/A|N/A|1|1000M
10|busy|RUNNING|R|None|c[1-2]|2:58|3:00|0:02|c[1-2]|2|N/A|tok-abc123|cpu|2026-11-30T05:32:53|2026-11-30T05:35:53|4|1000M
"""

# composed: the two measured rows above in SQUEUE_FORMAT order
# (%i|%j|%T|%r|%L|%l|%S|%e|%N|%D|%b|%P|%C|%m|%M|%k), no header.
SQUEUE_DEFAULT_LAYOUT = """\
14|waiter|PENDING|Resources|1:00|1:00|N/A|N/A||1|N/A|cpu|1|1000M|0:00|tok-xyz
10|busy|RUNNING|None|2:58|3:00|2026-11-30T05:32:53|2026-11-30T05:35:53|c[1-2]|2|N/A|cpu|4|1000M|0:02|tok-abc123
"""

# composed: a GPU job (measured %b value for --gres=gpu:2) whose comment contains '|',
# and a job that overran its limit after `scontrol update` (measured %L value INVALID).
SQUEUE_EDGE_ROWS = """\
21|gpujob|RUNNING|None|9:58|10:00|2026-11-30T05:40:00|2026-11-30T05:50:00|g1|1|gres:gpu:2|gpu|1|1000M|0:02|tok|with|pipes
22|over|RUNNING|None|INVALID|1:00|2026-11-30T05:40:00|2026-11-30T05:41:00|c1|1|N/A|cpu|1|1000M|1:27|(null)
23|unl|RUNNING|None|UNLIMITED|UNLIMITED|2026-11-30T05:40:00|N/A|c2|1|N/A|cpu|1|1000M|0:05|
"""

# measured: squeue -o '%L|%l|%M' before and after scontrol update TimeLimit=...
SQUEUE_TIME_UPDATES = ["9:58|10:00|0:02", "4:58|5:00|0:02", "7:58|8:00", "6:58|7:00"]

# measured: squeue -j <purged id>, on stderr with a non-zero exit code
SQUEUE_PURGED = "slurm_load_jobs error: Invalid job id specified\n"

# measured: sbatch --test-only, stderr (exit code 0)
TEST_ONLY_RUNNABLE = [
    (
        "sbatch: Job 3 to start at 2026-11-30T05:32:49 using 2 processors on nodes c[1-2] "
        "in partition cpu",
        ("3", "2026-11-30T05:32:49", 2, ("c1", "c2"), "cpu"),
    ),
    (
        "sbatch: Job 4 to start at 2026-11-30T05:32:49 using 1 processors on nodes g1 "
        "in partition gpu",
        ("4", "2026-11-30T05:32:49", 1, ("g1",), "gpu"),
    ),
    (
        "sbatch: Job 11 to start at 2026-11-30T05:35:53 using 1 processors on nodes c1 "
        "in partition cpu",
        ("11", "2026-11-30T05:35:53", 1, ("c1",), "cpu"),
    ),
]

# measured: sbatch --test-only, stderr (exit code 1)
TEST_ONLY_NO_RESOURCES = "allocation failure: Requested node configuration is not available\n"
TEST_ONLY_BAD_PARTITION = (
    "sbatch: error: invalid partition specified: nosuch\n"
    "allocation failure: Invalid partition name specified\n"
)

# measured: sacct -j 4 --format=JobID,State,Elapsed,MaxRSS,TotalCPU -P (the header printed
# AveRSS as a sixth column)
SACCT_MEASURED = """\
JobID|State|Elapsed|MaxRSS|TotalCPU|AveRSS
4|COMPLETED|00:00:07||00:00.963|
4.batch|COMPLETED|00:00:07|322336K|00:00.557|322336K
4.0|COMPLETED|00:00:03|218292K|00:00.405|218292K
"""

# measured: sacct -c (jobcomp/filetxt) line, fields JobID,State,Elapsed,MaxRSS,TotalCPU
SACCT_JOBCOMP_LINE = "15|TIMEOUT|00:02:07||"

# measured: sacct without slurmdbd
SACCT_DISABLED = "Slurm accounting storage is disabled\n"

# composed: SACCT_FIELDS order
# (JobID,JobName,State,ExitCode,Elapsed,ElapsedRaw,MaxRSS,TotalCPU,NNodes,NodeList,AllocCPUS,Start,End)
# job 4 with the measured values above; job 16 timed out (measured 00:01:27 / TIMEOUT);
# job 17 cancelled by root (measured state text); job 18 still pending.
SACCT_DEFAULT_LAYOUT = """\
4|py-job|COMPLETED|0:0|00:00:07|7||00:00.963|1|c1|2|2026-11-30T05:40:01|2026-11-30T05:40:08
4.batch|batch|COMPLETED|0:0|00:00:07|7|322336K|00:00.557|1|c1|2|2026-11-30T05:40:01|2026-11-30T05:40:08
4.extern|extern|COMPLETED|0:0|00:00:07|7|0|00:00.001|1|c1|2|2026-11-30T05:40:01|2026-11-30T05:40:08
4.0|python3|COMPLETED|0:0|00:00:03|3|218292K|00:00.405|1|c1|2|2026-11-30T05:40:04|2026-11-30T05:40:07
16|trap|TIMEOUT|0:15|00:01:27|87||00:00.120|2|c[1-2]|4|2026-11-30T05:33:13|2026-11-30T05:34:40
16.batch|batch|CANCELLED|0:15|00:01:28|88|10704K|00:00.120|1|c1|2|2026-11-30T05:33:13|2026-11-30T05:34:41
17|victim|CANCELLED by 0|0:0|00:00:05|5||00:00.010|1|g1|1|2026-11-30T05:36:24|2026-11-30T05:36:29
17.batch|batch|CANCELLED|0:15|00:00:06|6|1.5G|00:00.010|1|g1|1|2026-11-30T05:36:24|2026-11-30T05:36:30
18|waiting|PENDING|0:0|00:00:00|0||00:00:00|1|None assigned|1|Unknown|Unknown
"""

# composed: scontrol show config excerpt (22.05 layout: key padded to 24 columns, '= ')
SCONTROL_CONFIG = """\
Configuration data as of 2026-11-30T05:30:00
AccountingStorageType   = accounting_storage/slurmdbd
ClusterName             = lab2
KillWait                = 5 sec
MinJobAge               = 60 sec
OverTimeLimit           = 0 min
SchedulerParameters     = bf_interval=30,bf_window=1440
SlurmctldHost[0]        = localhost(10.77.0.1)

Cgroup Support Configuration:
AllowedRAMSpace         = 100.0%

Slurmctld(primary) at localhost is UP
"""
