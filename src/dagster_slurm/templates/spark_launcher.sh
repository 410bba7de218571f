@@{prologue}
# Spark launcher: in slurm mode a standalone Spark cluster (the master on this node, one
# worker per node of the allocation, each kind in a job step of its own), the payload as
# its driver on this node, then the cluster stopped again, on success, failure,
# cancellation and drain alike. In local mode the payload runs against local[N] and no
# Spark process is started here.
#
# Exit status: the payload's (contract above); 123 when the cluster did not come up (a
# step ended early, or the master or a worker was not there within the startup timeout).
__ds_spark_mode=@@{mode}
__ds_spark_home=@@{spark_home}
__ds_spark_startup_timeout=@@{startup_timeout}
__ds_spark_stop_grace=@@{stop_grace}
__ds_spark_failed_status=@@{failed_status}
__ds_spark_local_master=@@{local_master}
__ds_spark_memory_margin=@@{memory_margin}
# spark-defaults.conf lines from the launcher's fields; the master and the driver's
# address and ports are added at run time.
__ds_spark_conf=(@@{conf})
@@{ports}
@@{node}
__ds_spark_names=(master workers)
__ds_spark_pids=()
__ds_spark_logs=("$__ds_job_dir/spark-master.log" "$__ds_job_dir/spark-workers.log")
__ds_spark_ended=("" "")
__ds_spark_stopping=""
__ds_spark_problem=""
__ds_spark_job=""
__ds_spark_code=""
__ds_spark_deadline=0

__ds_spark_log() {
    printf 'dagster-slurm: spark: %s\n' "$*" >&2
}

# Export SPARK_HOME: spark_home, else the directory of the environment's PySpark.
__ds_spark_find_home() {
    local home=$__ds_spark_home
    if [ -z "$home" ]; then
        if ! home=$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' \
            2>/dev/null) || [ -z "$home" ]; then
            __ds_spark_problem="spark_home is not set and 'python -c \"import pyspark\"' fails;"
            __ds_spark_problem="$__ds_spark_problem install pyspark in the job's environment"
            return 1
        fi
    fi
    if [ ! -x "$home/bin/spark-class" ]; then
        __ds_spark_problem="$home/bin/spark-class is missing or not executable (spark_home)"
        return 1
    fi
    export SPARK_HOME=$home
}

# Memory (MiB) a worker offers: what Slurm granted per node minus a quarter of it, at
# most memory_margin; nothing when Slurm says nothing (Spark's default then).
__ds_spark_worker_memory() {
    local granted="" margin
    if [ -n "${SLURM_MEM_PER_NODE:-}" ]; then
        granted=$SLURM_MEM_PER_NODE
    elif [ -n "${SLURM_MEM_PER_CPU:-}" ] && [ -n "${SLURM_CPUS_ON_NODE:-}" ]; then
        granted=$(( SLURM_MEM_PER_CPU * SLURM_CPUS_ON_NODE ))
    fi
    case $granted in
        '' | 0 | *[!0-9]*) return 0 ;;
    esac
    margin=$(( granted / 4 ))
    [ "$margin" -le "$__ds_spark_memory_margin" ] || margin=$__ds_spark_memory_margin
    printf '%s\n' $(( granted - margin ))
}

# The fewest CPUs Slurm granted on any node (SLURM_JOB_CPUS_PER_NODE reads "4(x2),2").
__ds_spark_min_cpus() {
    local entry cpus least=""
    for entry in ${SLURM_JOB_CPUS_PER_NODE:+${SLURM_JOB_CPUS_PER_NODE//,/ }}; do
        cpus=${entry%%(*}
        case $cpus in
            '' | *[!0-9]*) continue ;;
        esac
        [ -n "$least" ] && [ "$least" -le "$cpus" ] || least=$cpus
    done
    printf '%s\n' "$least"
}

# Copy step $1's output into its log file and, prefixed, to the job's stderr.
__ds_spark_relay() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >> "${__ds_spark_logs[$1]}"
        case $line in
            "$__ds_spark_marker "* | *": $__ds_spark_marker "*) ;;
            *) printf '[spark %s] %s\n' "${__ds_spark_names[$1]}" "$line" >&2 ;;
        esac
    done
}

# Start step $1 (0: the master, 1: the workers) with the srun options in the array named
# by $2, running __ds_spark_node_main with the remaining arguments.
__ds_spark_launch() {
    local slot=$1
    local -n options=$2
    shift 2
    : > "${__ds_spark_logs[slot]}"
    srun --overlap --export=ALL --mem=0 "--job-name=spark-${__ds_spark_names[slot]}" \
        "${options[@]}" bash -c "$__ds_spark_code" dagster-slurm-spark-node "$@" \
        > >(__ds_spark_relay "$slot") 2>&1 < /dev/null &
    __ds_spark_pids[slot]=$!
    __ds_spark_ended[slot]=""
}

@@include marker_field.sh

# Field $2 of the last marker line in step $1's log (status 1: none yet).
__ds_spark_field() {
    __ds_marker_value "${__ds_spark_logs[$1]}" "$__ds_spark_marker " "$2"
}

# How many lines of step $1's log contain $2.
__ds_spark_count() {
    local line count=0
    while IFS= read -r line; do
        case $line in
            *"$2"*) count=$((count + 1)) ;;
        esac
    done < "${__ds_spark_logs[$1]}"
    printf '%s\n' "$count"
}

# Status 0 when step $1's srun has exited; records its status.
__ds_spark_gone() {
    [ -n "${__ds_spark_pids[$1]-}" ] || return 0
    [ -z "${__ds_spark_ended[$1]}" ] || return 0
    kill -0 "${__ds_spark_pids[$1]}" 2>/dev/null && return 1
    wait "${__ds_spark_pids[$1]}" 2>/dev/null
    __ds_spark_ended[$1]=$?
    return 0
}

# Status 2 when a signal came (startup is abandoned), 1 after the deadline, else 0.
__ds_spark_tick() {
    [ -z "$__ds_cancelled$__ds_drained" ] || return 2
    [ "$SECONDS" -lt "$__ds_spark_deadline" ] || return 1
    sleep 0.2 2>/dev/null || sleep 1
    return 0
}

# Wait until step $1's log has $3 lines containing $2 (what: $4). Status as the tick's;
# a step that ended first is status 1 as well.
__ds_spark_await() {
    local tick slot
    until [ "$(__ds_spark_count "$1" "$2")" -ge "$3" ]; do
        for slot in 0 1; do
            [ -n "${__ds_spark_pids[slot]-}" ] || continue
            if __ds_spark_gone "$slot"; then
                __ds_spark_problem="the ${__ds_spark_names[slot]} step ended (status"
                __ds_spark_problem="$__ds_spark_problem ${__ds_spark_ended[slot]}) before $4"
                return 1
            fi
        done
        __ds_spark_tick
        tick=$?
        if [ "$tick" -eq 1 ]; then
            __ds_spark_problem="$4 did not happen within $__ds_spark_startup_timeout s"
        fi
        [ "$tick" -eq 0 ] || return "$tick"
    done
}

# Start the master, wait until it is alive, start the workers, wait until all registered.
# Status 0: ready; 1: failed (__ds_spark_problem says why); 2: a signal came.
__ds_spark_start_cluster() {
    local nodes=${SLURM_JOB_NUM_NODES:-1} memory cpus status
    local -a master_options worker_options
    __ds_spark_deadline=$((SECONDS + __ds_spark_startup_timeout))
    master_options=(--nodes=1 --ntasks=1 "--nodelist=${SLURMD_NODENAME:-$(hostname)}")
    __ds_spark_launch 0 master_options master "$__ds_spark_job"
    __ds_spark_pids[1]=""
    __ds_spark_await 0 "I have been elected leader" 1 "the master was alive"
    status=$?
    [ "$status" -eq 0 ] || return "$status"
    __ds_spark_address=$(__ds_spark_field 0 address)
    __ds_spark_port=$(__ds_spark_field 0 port)
    __ds_spark_ui=$(__ds_spark_field 0 ui)
    __ds_spark_block=$(__ds_spark_field 0 block)
    __ds_spark_url="spark://$__ds_spark_address:$__ds_spark_port"
    memory=$(__ds_spark_worker_memory)
    cpus=$(__ds_spark_min_cpus)
    worker_options=("--nodes=$nodes" "--ntasks=$nodes" --ntasks-per-node=1
        --kill-on-bad-exit=1 --label)
    [ -z "$cpus" ] || worker_options+=("--cpus-per-task=$cpus")
    __ds_spark_launch 1 worker_options worker "$__ds_spark_job" "$__ds_spark_url" \
        "$memory" "$__ds_job_dir/spark-work"
    __ds_spark_await 0 "Registering worker" "$nodes" "all $nodes worker(s) registered"
}

# Ask step $1 to stop: TERM to every process of the step (the JVMs run their shutdown
# hooks; a worker ends its executors, each step's shell removes its scratch directory);
# without a known step, TERM to its srun, which ends the step at once. scancel's
# complaints are only reported (22.05 reports "Invalid job id" for a step that ended
# while it was being signalled): TERM to srun would end the step before its shells clean
# up, and the grace period ends a step that keeps running anyway.
__ds_spark_stop_step() {
    local step out
    step=$(__ds_spark_field "$1" step) || step=""
    case $step in
        *.?*)
            out=$(scancel "--signal=TERM" "$step" 2>&1) \
                || __ds_spark_log "scancel --signal=TERM $step: $out"
            ;;
        *) kill -TERM "${__ds_spark_pids[$1]}" 2>/dev/null ;;
    esac
}

# Stop step $1 and wait stop_grace seconds; then end it (TERM to srun: Slurm kills what
# is left of the step) and wait a few more seconds.
__ds_spark_stop_and_wait() {
    local deadline=$((SECONDS + __ds_spark_stop_grace)) killed=""
    __ds_spark_gone "$1" && return 0
    __ds_spark_stop_step "$1"
    until __ds_spark_gone "$1"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            if [ -n "$killed" ]; then
                __ds_spark_log "the ${__ds_spark_names[$1]} step is still running; it ends with the job"
                return 1
            fi
            __ds_spark_log "the ${__ds_spark_names[$1]} step did not stop within" \
                "$__ds_spark_stop_grace s; ending it"
            kill -TERM "${__ds_spark_pids[$1]}" 2>/dev/null
            killed=1
            deadline=$((SECONDS + 10))
        fi
        sleep 0.2 2>/dev/null || sleep 1
    done
}

# Stop the workers, then the master; safe to call more than once. After a cancellation
# or drain the steps are only asked to stop (Slurm ends what is left with the job), so
# that the status file is written before that.
__ds_spark_teardown() {
    local slot
    [ -z "$__ds_spark_stopping" ] || return 0
    __ds_spark_stopping=1
    if [ -n "$__ds_cancelled$__ds_drained" ]; then
        for slot in 1 0; do
            __ds_spark_gone "$slot" || __ds_spark_stop_step "$slot"
        done
        return 0
    fi
    __ds_spark_stop_and_wait 1
    __ds_spark_stop_and_wait 0
    return 0
}

# The failure report: why, then the last lines of the master's and the workers' logs.
__ds_spark_failure_report() {
    local slot line
    printf '%s\n' " $__ds_spark_problem"
    for slot in 0 1; do
        [ -s "${__ds_spark_logs[slot]}" ] || continue
        printf '%s\n' "last lines of the ${__ds_spark_names[slot]} step's output:"
        while IFS= read -r line; do
            printf '    %s\n' "$line"
        done < <(tail -n 15 "${__ds_spark_logs[slot]}")
    done
}

# Write the payload's spark-defaults.conf and export SPARK_CONF_DIR and SPARK_MASTER_URL.
__ds_spark_write_conf() {
    local master=$1 dir="$__ds_job_dir/spark-conf" line
    local -a lines=("spark.master $master")
    if [ "$__ds_spark_mode" = slurm ]; then
        lines+=("spark.driver.host $__ds_spark_address"
            "spark.driver.bindAddress $__ds_spark_address"
            "spark.driver.port $(( __ds_spark_block + __ds_spark_offset_driver ))"
            "spark.driver.blockManager.port $(( __ds_spark_block + __ds_spark_offset_driver_block_manager ))"
            "spark.ui.port $(( __ds_spark_block + __ds_spark_offset_driver_ui ))")
    fi
    lines+=("spark.pyspark.python ${PYSPARK_PYTHON:-$(command -v python || printf python3)}")
    mkdir -p -- "$dir" || return 1
    for line in "${lines[@]}" ${__ds_spark_conf[@]+"${__ds_spark_conf[@]}"}; do
        printf '%s\n' "$line"
    done > "$dir/spark-defaults.conf" || return 1
    export SPARK_CONF_DIR=$dir SPARK_MASTER_URL=$master
    export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v python || printf python3)}
}

__ds_spark_on_exit() {
    local code=$?
    __ds_spark_teardown
    (exit "$code")
    __ds_on_exit
}
trap __ds_spark_on_exit EXIT

__ds_skip_if_signalled
if [ "$__ds_spark_mode" = slurm ]; then
    __ds_spark_job=${SLURM_JOB_ID:-}
else
    __ds_spark_job="local-$$"
fi
__ds_spark_code="set -u
$(declare -p __ds_spark_marker __ds_spark_offset_master __ds_spark_offset_master_ui \
    __ds_spark_offset_worker __ds_spark_offset_worker_ui __ds_spark_node_label \
    __ds_spark_java_pid __ds_spark_stopped __ds_ray_strategy __ds_ray_range_start \
    __ds_ray_range_end __ds_ray_block_size __ds_ray_lock_dir __ds_ray_ray_port \
    __ds_ray_dashboard_port __ds_ray_offsets __ds_ray_port_base)
$(declare -f __ds_ray_node_log __ds_spark_node_ip __ds_spark_node_on_signal \
    __ds_spark_node_main __ds_ray_block_count __ds_ray_fnv1a __ds_ray_hash_base \
    __ds_ray_listening_ports __ds_ray_block_in_use __ds_ray_lock_block \
    __ds_ray_pick_random_block __ds_ray_choose_block)
__ds_spark_node_main \"\$@\""

__ds_spark_status=0
__ds_spark_started_at=$SECONDS
if ! __ds_spark_find_home; then
    __ds_spark_status=1
elif [ "$__ds_spark_mode" = slurm ]; then
    if [ -z "${SLURM_JOB_ID:-}" ]; then
        __ds_spark_problem="not inside a Slurm allocation (SLURM_JOB_ID unset)"
        __ds_spark_status=1
    else
        __ds_spark_log "starting Spark on ${SLURM_JOB_NUM_NODES:-1} node(s):" \
            "${SLURM_JOB_NODELIST:-}"
        __ds_spark_start_cluster
        __ds_spark_status=$?
    fi
fi
if [ "$__ds_spark_status" -eq 2 ]; then
    __ds_spark_teardown
    __ds_skip_if_signalled
fi
if [ "$__ds_spark_status" -ne 0 ]; then
    __ds_spark_teardown
    __ds_spark_log "the Spark cluster did not start:$(__ds_spark_failure_report)"
    __ds_finish "$__ds_spark_failed_status"
fi
if [ "$__ds_spark_mode" = slurm ]; then
    __ds_spark_log "all ${SLURM_JOB_NUM_NODES:-1} Spark worker(s) registered after" \
        "$((SECONDS - __ds_spark_started_at)) s; master at $__ds_spark_url"
    printf @@{ui_line} "$__ds_spark_address" "$__ds_spark_ui"
    printf @@{tunnel_line} "$__ds_spark_address" "$__ds_spark_ui" "http://127.0.0.1:8080"
    __ds_spark_write_conf "$__ds_spark_url"
else
    __ds_spark_write_conf "$__ds_spark_local_master"
fi
__ds_spark_conf_status=$?
if [ "$__ds_spark_conf_status" -ne 0 ]; then
    __ds_spark_log "cannot write $__ds_job_dir/spark-conf/spark-defaults.conf"
    __ds_spark_teardown
    __ds_finish "$__ds_spark_failed_status"
fi

__ds_skip_if_signalled
__ds_run_payload "${__ds_payload[@]}"
__ds_spark_teardown
__ds_finish "$__ds_rc"
