@@{prologue}
# Ray launcher: start a Ray cluster (one node per host of the allocation in slurm mode,
# one local node in local mode), run the payload on the head with RAY_ADDRESS set, then
# stop every Ray node again, on success, failure, cancellation and drain alike.
#
# Exit status: the payload's (contract above); 123 when the cluster did not come up (a
# node failed or did not join within the startup timeout); 125 when working_dir is
# missing. Nodes are stopped through SIGTERM to their 'ray start' (see __ds_ray_stop_node),
# never with 'ray stop', which would stop every Ray cluster of the host.
__ds_ray_startup_timeout=@@{startup_timeout}
__ds_ray_stop_grace=@@{stop_grace}
__ds_ray_head_address=@@{head_node_address}
__ds_ray_working_dir=@@{working_dir}
__ds_ray_failed_status=@@{failed_status}
# The password stays in this script (readable by its owner only): each node gets it in its
# environment (__DS_RAY_REDIS_PASSWORD), never on srun's or bash's command line.
__ds_ray_redis_password=@@{redis_password}
@@{ports}
@@{node}
__ds_ray_hosts=()
__ds_ray_cpus=()
__ds_ray_pids=()
__ds_ray_logs=()
__ds_ray_ended=()
__ds_ray_blamed=()
__ds_ray_reasons=()
__ds_ray_stopping=""
__ds_ray_code=""
__ds_ray_job=""
__ds_ray_problem=""

__ds_ray_log() {
    printf 'dagster-slurm: ray: %s\n' "$*" >&2
}

# The hosts of the allocation (head first) and the CPUs Slurm gave each, in
# __ds_ray_hosts and __ds_ray_cpus.
__ds_ray_read_hosts() {
    local host entry count cpus index=0 head=""
    __ds_ray_cpus=()
    if [ "$__ds_ray_mode" = local ]; then
        __ds_ray_hosts=("$(hostname 2>/dev/null || printf localhost)")
        __ds_ray_cpus=("")
        return 0
    fi
    if [ -z "${SLURM_JOB_ID:-}" ] || [ -z "${SLURM_JOB_NODELIST:-}" ]; then
        __ds_ray_problem=" not inside a Slurm allocation (SLURM_JOB_ID or SLURM_JOB_NODELIST unset)"
        return 1
    fi
    while IFS= read -r host; do
        [ -n "$host" ] || continue
        __ds_ray_hosts+=("$host")
    done < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    if [ "${#__ds_ray_hosts[@]}" -eq 0 ]; then
        __ds_ray_problem=" 'scontrol show hostnames $SLURM_JOB_NODELIST' listed no host"
        return 1
    fi
    # SLURM_JOB_CPUS_PER_NODE reads like "4(x2),2": CPUs per node, in node list order.
    for entry in ${SLURM_JOB_CPUS_PER_NODE:+${SLURM_JOB_CPUS_PER_NODE//,/ }}; do
        cpus=${entry%%(*}
        count=1
        case $entry in
            *'(x'*')') count=${entry#*(x} && count=${count%)} ;;
        esac
        while [ "$count" -gt 0 ]; do
            __ds_ray_cpus+=("$cpus")
            count=$((count - 1))
        done
    done
    # The head is the host this script runs on, the allocation's first node.
    for host in "${__ds_ray_hosts[@]}"; do
        if [ "$host" = "${SLURMD_NODENAME:-}" ]; then
            head=$index
            break
        fi
        index=$((index + 1))
    done
    if [ -n "$head" ] && [ "$head" -ne 0 ]; then
        __ds_ray_hosts=("${__ds_ray_hosts[head]}" "${__ds_ray_hosts[@]:0:head}" \
            "${__ds_ray_hosts[@]:head+1}")
        __ds_ray_cpus=("${__ds_ray_cpus[head]-}" "${__ds_ray_cpus[@]:0:head}" \
            "${__ds_ray_cpus[@]:head+1}")
    fi
    return 0
}

# Copy node $1's output into its log file and, prefixed, to the job's stderr.
__ds_ray_relay() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >> "${__ds_ray_logs[$1]}"
        case $line in
            "$__ds_ray_marker "*) ;;
            *) printf '[ray %s] %s\n' "${__ds_ray_hosts[$1]}" "$line" >&2 ;;
        esac
    done
}

# Start Ray node $1 (role $2) in the background; $3 $4: the head's address and GCS port.
__ds_ray_launch() {
    local index=$1 host=${__ds_ray_hosts[$1]} cpus=${__ds_ray_cpus[$1]-}
    local -a launcher=()
    __ds_ray_logs[index]="$__ds_job_dir/ray-node-$index.log"
    : > "${__ds_ray_logs[index]}"
    if [ "$__ds_ray_mode" = slurm ]; then
        launcher=(srun --overlap --export=ALL --nodes=1 --ntasks=1 "--nodelist=$host" --mem=0
            "--job-name=ray-$2-$index")
        [ -z "$cpus" ] || launcher+=("--cpus-per-task=$cpus")
    fi
    __DS_RAY_REDIS_PASSWORD=$__ds_ray_redis_password \
        ${launcher[@]+"${launcher[@]}"} bash -c "$__ds_ray_code" dagster-slurm-ray-node \
        "$2" "$index" "$__ds_ray_job" "${3-}" "${4-}" \
        > >(__ds_ray_relay "$index") 2>&1 < /dev/null &
    __ds_ray_pids[index]=$!
    __ds_ray_ended[index]=""
}

@@include marker_field.sh

# Field $3 of the last marker line with state $2 in node $1's log (status 1: none yet).
__ds_ray_field() {
    __ds_marker_value "${__ds_ray_logs[$1]}" "$__ds_ray_marker node=$1 state=$2 " "$3"
}

# Status 0 when Ray reported node $1 as started (for a worker: registered with the head).
__ds_ray_started() {
    local line
    while IFS= read -r line; do
        case $line in
            *'Ray runtime started'*) return 0 ;;
        esac
    done < "${__ds_ray_logs[$1]}"
    return 1
}

# Status 0 when node $1's launcher (srun or the node's shell) has exited; records its status.
__ds_ray_node_gone() {
    [ -z "${__ds_ray_ended[$1]}" ] || return 0
    kill -0 "${__ds_ray_pids[$1]}" 2>/dev/null && return 1
    wait "${__ds_ray_pids[$1]}" 2>/dev/null
    __ds_ray_ended[$1]=$?
    return 0
}

# Status 0 when TCP port $2 of $1 accepts connections.
__ds_ray_port_open() {
    if command -v timeout >/dev/null 2>&1; then
        timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
    else
        bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
    fi
}

# Status 2 when a signal came (startup is abandoned), 1 after the deadline, else 0.
__ds_ray_tick() {
    [ -z "$__ds_cancelled$__ds_drained" ] || return 2
    [ "$SECONDS" -lt "$__ds_ray_deadline" ] || return 1
    sleep 0.2 2>/dev/null || sleep 1
    return 0
}

# Record node $1 as failed, because of $2.
__ds_ray_blame() {
    __ds_ray_blamed+=("$1")
    __ds_ray_reasons[$1]=$2
}

# The failure report (after teardown, so that the nodes' final words are in their logs):
# each failed node, why, and the last lines of its output.
__ds_ray_failure_report() {
    local index line report="${__ds_ray_problem}"
    for index in ${__ds_ray_blamed[@]+"${__ds_ray_blamed[@]}"}; do
        report="$report
node $index (${__ds_ray_hosts[index]}): ${__ds_ray_reasons[index]}"
        [ -s "${__ds_ray_logs[index]}" ] || continue
        report="$report; its last output lines:"
        while IFS= read -r line; do
            case $line in
                "$__ds_ray_marker "*) ;;
                *) report="$report
    $line" ;;
            esac
        done < <(tail -n 15 "${__ds_ray_logs[index]}")
    done
    printf '%s\n' "$report"
}

# Start the head, wait until its GCS answers, start the workers, wait until every node
# is up. Status 0: ready; 1: failed (see __ds_ray_failure_report); 2: a signal came.
__ds_ray_start_cluster() {
    local i count head_ip gcs waiting tick
    count=${#__ds_ray_hosts[@]}
    __ds_ray_deadline=$((SECONDS + __ds_ray_startup_timeout))
    __ds_ray_launch 0 head
    until head_ip=$(__ds_ray_field 0 starting address) && gcs=$(__ds_ray_field 0 starting gcs) \
        && __ds_ray_port_open "$head_ip" "$gcs"; do
        if __ds_ray_node_gone 0; then
            __ds_ray_blame 0 "exited with status ${__ds_ray_ended[0]} before its GCS answered"
            return 1
        fi
        __ds_ray_tick
        tick=$?
        if [ "$tick" -eq 1 ]; then
            __ds_ray_blame 0 "its GCS did not answer within ${__ds_ray_startup_timeout} s"
        fi
        [ "$tick" -eq 0 ] || return "$tick"
    done
    __ds_ray_head_ip=$head_ip
    __ds_ray_gcs_port=$gcs
    __ds_ray_dashboard=$(__ds_ray_field 0 starting dashboard)
    __ds_ray_address=${__ds_ray_head_address:-$head_ip}
    if [ "$count" -gt 1 ] && [ -z "$__ds_ray_head_address" ]; then
        case $__ds_ray_address in
            127.* | ::1) __ds_ray_log "warning: the head's address $__ds_ray_address is a" \
                "loopback address; if workers cannot join, set network_interface" ;;
        esac
    fi
    for ((i = 1; i < count; i++)); do
        __ds_ray_launch "$i" worker "$__ds_ray_address" "$gcs"
    done
    while :; do
        waiting=""
        for ((i = 0; i < count; i++)); do
            __ds_ray_started "$i" && continue
            if __ds_ray_node_gone "$i"; then
                __ds_ray_blame "$i" "exited with status ${__ds_ray_ended[i]} before joining"
            fi
            waiting="$waiting $i"
        done
        [ -n "$waiting" ] || break
        [ "${#__ds_ray_blamed[@]}" -eq 0 ] || return 1
        __ds_ray_tick
        tick=$?
        if [ "$tick" -eq 1 ]; then
            for i in $waiting; do
                __ds_ray_blame "$i" "did not join within ${__ds_ray_startup_timeout} s"
            done
        fi
        [ "$tick" -eq 0 ] || return "$tick"
    done
    return 0
}

# Ask node $1 to stop: SIGURG to its shell, or SIGWINCH for a node that failed (its shell
# then also shows the tails of Ray's logs). In an srun step every process gets what
# scancel sends; Ray's processes ignore both signals, and the node's shell sends SIGTERM
# to 'ray start' alone, which shuts its node down in order.
__ds_ray_stop_node() {
    local step sig=URG
    [ -z "${__ds_ray_reasons[$1]-}" ] || sig=WINCH
    if [ "$__ds_ray_mode" = slurm ]; then
        step=$(__ds_ray_field "$1" starting step) || step=""
        # By number: scancel does not know every signal by name (22.05 lacks WINCH).
        case $step in
            *.?*) scancel --quiet "--signal=$(kill -l "$sig")" "$step" > /dev/null 2>&1 ;;
            *) kill -TERM "${__ds_ray_pids[$1]}" 2>/dev/null ;;
        esac
    else
        kill -s "$sig" "${__ds_ray_pids[$1]}" 2>/dev/null
    fi
}

# Last resort for node $1: SIGTERM to srun ends its step at once (Slurm kills what is
# left); locally, SIGKILL to 'ray start' (its children die with it) and the node's shell.
__ds_ray_kill_node() {
    local pid
    kill -TERM "${__ds_ray_pids[$1]}" 2>/dev/null
    if [ "$__ds_ray_mode" = local ] && pid=$(__ds_ray_field "$1" launched pid); then
        kill -KILL "$pid" 2>/dev/null
        kill -KILL "${__ds_ray_pids[$1]}" 2>/dev/null
    fi
}

# Stop the nodes given as arguments and wait for them: stop_grace seconds, then a kill
# and a few more seconds.
__ds_ray_stop_nodes() {
    local i left deadline killed=""
    for i in "$@"; do
        __ds_ray_node_gone "$i" || __ds_ray_stop_node "$i"
    done
    deadline=$((SECONDS + __ds_ray_stop_grace))
    while :; do
        left=""
        for i in "$@"; do
            __ds_ray_node_gone "$i" || left="$left $i"
        done
        [ -n "$left" ] || return 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            if [ -n "$killed" ]; then
                __ds_ray_log "Ray node(s)$left still running; they end with the job"
                return 1
            fi
            __ds_ray_log "Ray node(s)$left did not stop within $__ds_ray_stop_grace s; killing them"
            for i in $left; do
                __ds_ray_kill_node "$i"
            done
            killed=1
            deadline=$((SECONDS + 5))
        fi
        sleep 0.2 2>/dev/null || sleep 1
    done
}

# Stop every Ray node, the workers before the head; safe to call more than once.
__ds_ray_teardown() {
    local i count=${#__ds_ray_pids[@]}
    local -a workers=()
    [ -z "$__ds_ray_stopping" ] || return 0
    __ds_ray_stopping=1
    [ "$count" -gt 0 ] || return 0
    # After a cancellation or drain, Slurm (or the local caller) is about to kill what is
    # left: ask every node to stop but do not wait, so that the status file is written
    # before that kill (the nodes are inside the job's steps, or end on their own).
    if [ -n "$__ds_cancelled$__ds_drained" ]; then
        for ((i = 0; i < count; i++)); do
            __ds_ray_node_gone "$i" || __ds_ray_stop_node "$i"
        done
        return 0
    fi
    for ((i = 0; i < count; i++)); do
        if __ds_ray_node_gone "$i"; then
            __ds_ray_log "Ray node $i (${__ds_ray_hosts[i]}) had already ended" \
                "(status ${__ds_ray_ended[i]})"
        fi
        [ "$i" -eq 0 ] || workers+=("$i")
    done
    [ "${#workers[@]}" -eq 0 ] || __ds_ray_stop_nodes "${workers[@]}"
    __ds_ray_stop_nodes 0
    return 0
}

__ds_ray_on_exit() {
    local code=$?
    __ds_ray_teardown
    (exit "$code")
    __ds_on_exit
}
trap __ds_ray_on_exit EXIT

__ds_skip_if_signalled
if [ "$__ds_ray_mode" = slurm ]; then
    __ds_ray_job=${SLURM_JOB_ID:-}
else
    __ds_ray_job="local-$$"
fi
__ds_ray_code="set -u
$(declare -p __ds_ray_marker __ds_ray_mode __ds_ray_num_cpus __ds_ray_num_gpus \
    __ds_ray_object_store_memory __ds_ray_include_dashboard __ds_ray_dashboard_host \
    __ds_ray_temp_dir __ds_ray_temp_dir_max __ds_ray_interface __ds_ray_ip_command \
    __ds_ray_pre_start __ds_ray_extra_args __ds_ray_node_label __ds_ray_node_pid \
    __ds_ray_node_group __ds_ray_node_stopped __ds_ray_strategy __ds_ray_range_start \
    __ds_ray_range_end __ds_ray_block_size __ds_ray_lock_dir __ds_ray_ray_port \
    __ds_ray_dashboard_port __ds_ray_offsets __ds_ray_port_base)
$(declare -f __ds_ray_node_log __ds_ray_is_ip __ds_ray_node_ip __ds_ray_node_cpus \
    __ds_ray_node_object_store __ds_ray_node_dump_logs __ds_ray_node_cleanup \
    __ds_ray_node_on_signal __ds_ray_node_main __ds_ray_block_count __ds_ray_fnv1a \
    __ds_ray_hash_base __ds_ray_listening_ports __ds_ray_block_in_use __ds_ray_lock_block \
    __ds_ray_pick_random_block __ds_ray_choose_block __ds_ray_port)
__ds_ray_node_main \"\$@\""

__ds_ray_started_at=$SECONDS
__ds_ray_status=0
if ! __ds_ray_read_hosts; then
    __ds_ray_status=1
else
    __ds_ray_log "starting Ray on ${#__ds_ray_hosts[@]} node(s): ${__ds_ray_hosts[*]}"
    __ds_ray_start_cluster
    __ds_ray_status=$?
fi
if [ "$__ds_ray_status" -eq 2 ]; then
    __ds_ray_teardown
    __ds_skip_if_signalled
fi
if [ "$__ds_ray_status" -ne 0 ]; then
    __ds_ray_teardown
    __ds_ray_log "the Ray cluster did not start:$(__ds_ray_failure_report)"
    __ds_finish "$__ds_ray_failed_status"
fi
__ds_ray_log "all ${#__ds_ray_hosts[@]} Ray node(s) joined after" \
    "$((SECONDS - __ds_ray_started_at)) s; head at $__ds_ray_address:$__ds_ray_gcs_port"
if [ -n "$__ds_ray_include_dashboard" ]; then
    printf @@{dashboard_line} "$__ds_ray_address" "$__ds_ray_dashboard"
    if [ "$__ds_ray_mode" = slurm ]; then
        printf @@{tunnel_line} \
            "$__ds_ray_address" "$__ds_ray_dashboard" "http://127.0.0.1:8265"
    fi
fi
export RAY_ADDRESS="$__ds_ray_address:$__ds_ray_gcs_port"

if [ -n "$__ds_ray_working_dir" ] && ! cd -- "$__ds_ray_working_dir"; then
    __ds_ray_log "cannot enter working_dir $__ds_ray_working_dir"
    __ds_ray_teardown
    __ds_finish 125
fi

__ds_skip_if_signalled
__ds_run_payload "${__ds_payload[@]}"
__ds_ray_teardown
__ds_finish "$__ds_rc"
