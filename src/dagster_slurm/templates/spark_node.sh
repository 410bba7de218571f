# One Spark process, the master or a worker, in a job step (srun --overlap) of its own.
# The job script ships the functions and variables below there with 'declare -p' and
# 'declare -f'; SPARK_HOME arrives in the environment.
#
# A step reports through lines on its stdout: one marker line ("state=starting") with its
# address, ports and step once they are known, then Spark's own log. The job script reads
# the master's "I have been elected leader" (alive) and its "Registering worker" lines
# (one per worker that joined) from that log.
__ds_spark_marker='dagster-slurm-spark:'
__ds_spark_offset_master=@@{offset_master}
__ds_spark_offset_master_ui=@@{offset_master_ui}
__ds_spark_offset_worker=@@{offset_worker}
__ds_spark_offset_worker_ui=@@{offset_worker_ui}
__ds_spark_offset_driver=@@{offset_driver}
__ds_spark_offset_driver_block_manager=@@{offset_driver_block_manager}
__ds_spark_offset_driver_ui=@@{offset_driver_ui}

__ds_spark_node_label=""
__ds_spark_java_pid=""
__ds_spark_stopped=""

# The port-block functions (ray_ports.sh) log through this name.
__ds_ray_node_log() {
    printf 'dagster-slurm: spark %s: %s\n' "$__ds_spark_node_label" "$*" >&2
}

# The address Spark binds on this node: the first IPv4 address 'hostname -i' gives.
__ds_spark_node_ip() {
    local out word address=""
    local -a words
    out=$(hostname -i 2>/dev/null)
    read -r -a words <<< "$out"
    for word in ${words[@]+"${words[@]}"}; do
        case $word in
            *.*.*.*) address=$word && break ;;
        esac
    done
    [ -n "$address" ] || address=${words[0]-}
    if [ -z "$address" ]; then
        __ds_ray_node_log "'hostname -i' gave no address"
        return 1
    fi
    printf '%s\n' "$address"
}

# TERM and HUP (the job script stopping this step, or Slurm ending the job) reach every
# process of the step, the JVM too; passing them on covers a JVM that was just starting.
__ds_spark_node_on_signal() {
    __ds_spark_stopped=$1
    [ -z "$__ds_spark_java_pid" ] || kill -s "$1" "$__ds_spark_java_pid" 2>/dev/null
}

# Run the master or a worker on this node and stay until it ends. Arguments: role
# (master|worker), job id, and for a worker the master's URL, the memory it offers in MiB
# ("": Spark's default) and the directory under which its work directory goes.
__ds_spark_node_main() {
    local role=$1 job=$2 master=${3-} memory=${4-} work_root=${5-}
    local index=0 address base port ui local_dir status cores
    local -a args
    [ "$role" = master ] || index=$(( ${SLURM_NODEID:-0} + 1 ))
    __ds_spark_node_label="$role $index ($(hostname 2>/dev/null || printf unknown))"
    trap '__ds_spark_node_on_signal TERM' TERM
    trap '__ds_spark_node_on_signal HUP' HUP
    address=$(__ds_spark_node_ip) || return 1
    __ds_ray_choose_block "$index" "$job" || return 1
    base=$__ds_ray_port_base
    local_dir="/tmp/dsspark-$job-$index"
    if ! mkdir -p -m 700 -- "$local_dir"; then
        __ds_ray_node_log "cannot create the scratch directory $local_dir"
        return 1
    fi
    if [ "$role" = master ]; then
        port=$(( base + __ds_spark_offset_master ))
        ui=$(( base + __ds_spark_offset_master_ui ))
        args=(org.apache.spark.deploy.master.Master --host "$address" --port "$port"
            --webui-port "$ui")
    else
        port=$(( base + __ds_spark_offset_worker ))
        ui=$(( base + __ds_spark_offset_worker_ui ))
        cores=${SLURM_CPUS_ON_NODE:-$(getconf _NPROCESSORS_ONLN)}
        mkdir -p -- "$work_root/$index"
        args=(org.apache.spark.deploy.worker.Worker --host "$address" --port "$port"
            --webui-port "$ui" --cores "$cores" --work-dir "$work_root/$index")
        [ -z "$memory" ] || args+=(--memory "${memory}m")
        args+=("$master")
    fi
    printf '%s node=%s role=%s state=starting address=%s port=%s ui=%s block=%s step=%s\n' \
        "$__ds_spark_marker" "$index" "$role" "$address" "$port" "$ui" "$base" \
        "${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-}"
    if [ -n "$__ds_spark_stopped" ]; then
        rm -rf -- "$local_dir"
        return 0
    fi
    # The tag in the JVM's arguments lets an operator find this job's Spark daemons.
    SPARK_LOCAL_DIRS=$local_dir SPARK_LOCAL_IP=$address SPARK_NO_DAEMONIZE=1 \
        SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:-} -Ddagster_slurm.job=$job" \
        "$SPARK_HOME/bin/spark-class" "${args[@]}" 2>&1 &
    __ds_spark_java_pid=$!
    [ -z "$__ds_spark_stopped" ] || kill -s TERM "$__ds_spark_java_pid"
    while :; do
        wait "$__ds_spark_java_pid"
        status=$?
        kill -0 "$__ds_spark_java_pid" 2>/dev/null || break
    done
    rm -rf -- "$local_dir"
    if [ -n "$__ds_spark_stopped" ]; then
        return 0
    fi
    [ "$status" -ne 0 ] || status=1
    __ds_ray_node_log "the Spark $role ended on its own (status $status)"
    return "$status"
}
