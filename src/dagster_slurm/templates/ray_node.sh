# One Ray node. The functions and variables below run on each node of the cluster, in a
# shell of their own ('bash -c' inside an srun step, or in the background in local mode);
# the job script ships them there with 'declare -p' and 'declare -f'.
#
# A node reports to the job script through lines on its stdout that start with the
# marker ("state=starting" once its address and ports are known, "state=launched" with
# the pid of 'ray start'), then Ray's own "Ray runtime started." once the node is up
# (Ray prints it after the node is registered with the head's GCS).
__ds_ray_marker='dagster-slurm-ray:'
__ds_ray_mode=@@{mode}
__ds_ray_num_cpus=@@{num_cpus}
__ds_ray_num_gpus=@@{num_gpus}
__ds_ray_object_store_memory=@@{object_store_memory}
__ds_ray_include_dashboard=@@{include_dashboard}
__ds_ray_dashboard_host=@@{dashboard_host}
__ds_ray_temp_dir=@@{temp_dir}
__ds_ray_temp_dir_max=@@{temp_dir_max}
__ds_ray_interface=@@{network_interface}
__ds_ray_ip_command=@@{node_ip_address_command}
__ds_ray_pre_start=@@{pre_start}
__ds_ray_extra_args=(@@{ray_start_args})

__ds_ray_node_label=""
__ds_ray_node_pid=""
__ds_ray_node_group=""
__ds_ray_node_stopped=""

__ds_ray_node_log() {
    printf 'dagster-slurm: ray node %s: %s\n' "$__ds_ray_node_label" "$*" >&2
}

# Status 0 when $1 looks like an IPv4 or IPv6 address.
__ds_ray_is_ip() {
    case $1 in
        '' | *[!0-9A-Fa-f.:]*) return 1 ;;
        *[.:]*) return 0 ;;
    esac
    return 1
}

# The address Ray uses on this node, on stdout: node_ip_address_command, else the IPv4
# address of network_interface, else the first IPv4 address 'hostname -i' gives.
__ds_ray_node_ip() {
    local out word address="" words
    if [ -n "$__ds_ray_ip_command" ]; then
        if ! out=$(eval "$__ds_ray_ip_command"); then
            __ds_ray_node_log "node_ip_address_command failed: $__ds_ray_ip_command"
            return 1
        fi
        read -r -a words <<< "$out"
        if [ "${#words[@]}" -ne 1 ] || ! __ds_ray_is_ip "${words[0]}"; then
            __ds_ray_node_log "node_ip_address_command must print one IP address, printed: $out"
            return 1
        fi
        printf '%s\n' "${words[0]}"
        return 0
    fi
    if [ -n "$__ds_ray_interface" ]; then
        if ! out=$(ip -4 -o addr show dev "$__ds_ray_interface" 2>&1); then
            __ds_ray_node_log "cannot read network_interface $__ds_ray_interface: $out"
            return 1
        fi
        read -r -a words <<< "$out"
        for ((word = 0; word + 1 < ${#words[@]}; word++)); do
            if [ "${words[word]}" = inet ]; then
                address=${words[word + 1]%%/*}
                break
            fi
        done
        if ! __ds_ray_is_ip "$address"; then
            __ds_ray_node_log "network_interface $__ds_ray_interface has no IPv4 address"
            return 1
        fi
        printf '%s\n' "$address"
        return 0
    fi
    if [ "$__ds_ray_mode" = local ]; then
        printf '%s\n' 127.0.0.1
        return 0
    fi
    out=$(hostname -i 2>/dev/null)
    read -r -a words <<< "$out"
    for word in ${words[@]+"${words[@]}"}; do
        case $word in
            *.*.*.*) address=$word && break ;;
        esac
    done
    [ -n "$address" ] || address=${words[0]-}
    if ! __ds_ray_is_ip "$address"; then
        __ds_ray_node_log "'hostname -i' gave no address ($out); set network_interface or" \
            "node_ip_address_command"
        return 1
    fi
    printf '%s\n' "$address"
}

# CPUs Ray offers on this node: num_cpus_per_node, else what Slurm granted here, else the
# CPUs of the machine.
__ds_ray_node_cpus() {
    if [ -n "$__ds_ray_num_cpus" ]; then
        printf '%s\n' "$__ds_ray_num_cpus"
    elif [ "$__ds_ray_mode" = slurm ] && [ -n "${SLURM_CPUS_ON_NODE:-}" ]; then
        printf '%s\n' "$SLURM_CPUS_ON_NODE"
    else
        getconf _NPROCESSORS_ONLN 2>/dev/null || nproc
    fi
}

# Object store size: object_store_memory, else 30% of the memory Slurm granted on this
# node (Ray's own default sizes it from the whole machine), else Ray's default.
__ds_ray_node_object_store() {
    local granted=""
    if [ -n "$__ds_ray_object_store_memory" ]; then
        printf '%s\n' "$__ds_ray_object_store_memory"
        return 0
    fi
    [ "$__ds_ray_mode" = slurm ] || return 0
    if [ -n "${SLURM_MEM_PER_NODE:-}" ]; then
        granted=$SLURM_MEM_PER_NODE
    elif [ -n "${SLURM_MEM_PER_CPU:-}" ] && [ -n "${SLURM_CPUS_ON_NODE:-}" ]; then
        granted=$(( SLURM_MEM_PER_CPU * SLURM_CPUS_ON_NODE ))
    fi
    case $granted in
        '' | 0 | *[!0-9]*) return 0 ;;
    esac
    granted=$(( granted * 1048576 * 3 / 10 ))
    [ "$granted" -ge 78643200 ] || granted=78643200
    printf '%s\n' "$granted"
}

# The last lines of this node's Ray logs, for a node that failed or never came up.
__ds_ray_node_dump_logs() {
    local dir="$1/session_latest/logs" name
    [ -d "$dir" ] || return 0
    for name in gcs_server.err gcs_server.out raylet.err raylet.out; do
        [ -s "$dir/$name" ] || continue
        printf '%s\n' "--- last lines of $dir/$name:"
        tail -n 15 "$dir/$name"
    done
}

# A stop request. SIGURG (stop) and SIGWINCH (stop, then show Ray's log tails: the job
# script found this node failing) come from the job script; Ray's own processes ignore
# both, so 'ray start' alone gets SIGTERM from here. TERM and HUP (a cancelled job) are
# passed on as they are.
__ds_ray_node_on_signal() {
    __ds_ray_node_stopped=$1
    [ -z "$__ds_ray_node_pid" ] || kill -s "$2" "$__ds_ray_node_pid" 2>/dev/null
}

# Once 'ray start' has ended: SIGKILL to whatever is left of its process group (every Ray
# process of the node is in it; a process that outlived its 'ray start', or one that a HUP
# did not end, would keep writing to the temp dir), then remove the temp dir $1 when this
# node created it ($2 non-empty). A process killed an instant ago may still be closing
# its files, so a removal that fails is tried again for up to a second.
__ds_ray_node_cleanup() {
    local tries=0
    [ -z "$__ds_ray_node_group" ] || kill -KILL -- "-$__ds_ray_node_group" 2>/dev/null
    [ -n "$2" ] || return 0
    until rm -rf -- "$1" 2>/dev/null; do
        tries=$((tries + 1))
        if [ "$tries" -ge 10 ]; then
            __ds_ray_node_log "cannot remove the Ray temp dir $1"
            return 0
        fi
        sleep 0.1 2>/dev/null || sleep 1
    done
}

# Start Ray on this node and stay until it ends. Arguments: role (head|worker), node
# index, job id, head address and GCS port (workers only).
__ds_ray_node_main() {
    local role=$1 index=$2 job=$3 head_address=${4-} head_port=${5-}
    local address cpus store temp_dir own_temp="" status gcs dashboard base
    # The Ray password arrives in the environment (see __ds_ray_launch), not as an argument.
    local password=${__DS_RAY_REDIS_PASSWORD-}
    unset __DS_RAY_REDIS_PASSWORD
    local -a args
    __ds_ray_node_label="$index ($(hostname 2>/dev/null || printf unknown))"
    trap '__ds_ray_node_on_signal URG TERM' URG
    trap '__ds_ray_node_on_signal WINCH TERM' WINCH
    trap '__ds_ray_node_on_signal TERM TERM' TERM
    trap '__ds_ray_node_on_signal HUP HUP' HUP
    set +u
    eval "$__ds_ray_pre_start"
    set -u
    [ -z "$__ds_ray_node_stopped" ] || return 0
    if ! command -v ray > /dev/null 2>&1; then
        __ds_ray_node_log "the 'ray' command is not on PATH; install ray[default] in the" \
            "job's environment"
        return 127
    fi
    address=$(__ds_ray_node_ip) || return 1
    __ds_ray_choose_block "$index" "$job" || return 1
    base=$__ds_ray_port_base
    temp_dir=$__ds_ray_temp_dir
    if [ -z "$temp_dir" ]; then
        temp_dir="/tmp/dsray-$job-$index"
        own_temp=1
    fi
    if [ "${#temp_dir}" -gt "$__ds_ray_temp_dir_max" ]; then
        __ds_ray_node_log "Ray temp dir $temp_dir is ${#temp_dir} bytes long; Ray's Unix" \
            "socket paths allow at most $__ds_ray_temp_dir_max (set temp_dir to a shorter path)"
        return 1
    fi
    # Ray keeps its sockets and session files there: only the job's user may enter it.
    if ! mkdir -p -m 700 -- "$temp_dir"; then
        __ds_ray_node_log "cannot create the Ray temp dir $temp_dir"
        return 1
    fi
    cpus=$(__ds_ray_node_cpus)
    store=$(__ds_ray_node_object_store)
    if [ "$__ds_ray_mode" = slurm ] && [ "$__ds_ray_num_gpus" -gt "${SLURM_GPUS_ON_NODE:-0}" ]; then
        __ds_ray_node_log "warning: num_gpus_per_node=$__ds_ray_num_gpus but Slurm granted" \
            "${SLURM_GPUS_ON_NODE:-0} GPU(s) on this node (request them, e.g. gpus_per_node)"
    fi
    gcs=$(__ds_ray_port "$base" gcs)
    dashboard=$(__ds_ray_port "$base" dashboard)
    [ -z "$__ds_ray_ray_port" ] || gcs=$__ds_ray_ray_port
    [ -z "$__ds_ray_dashboard_port" ] || dashboard=$__ds_ray_dashboard_port
    args=(ray start --block --disable-usage-stats --log-color=false
        "--node-ip-address=$address"
        "--temp-dir=$temp_dir"
        "--num-cpus=$cpus"
        "--num-gpus=$__ds_ray_num_gpus"
        "--node-manager-port=$(__ds_ray_port "$base" node_manager)"
        "--object-manager-port=$(__ds_ray_port "$base" object_manager)"
        "--dashboard-agent-listen-port=$(__ds_ray_port "$base" dashboard_agent_listen)"
        "--dashboard-agent-grpc-port=$(__ds_ray_port "$base" dashboard_agent_grpc)"
        "--metrics-export-port=$(__ds_ray_port "$base" metrics_export)"
        "--runtime-env-agent-port=$(__ds_ray_port "$base" runtime_env_agent)"
        "--min-worker-port=$(__ds_ray_port "$base" min_worker)"
        "--max-worker-port=$(( base + __ds_ray_block_size - 1 ))"
        # Workers too: ray start checks its default (10001) against the other ports even
        # where no client server runs, which fails when the block starts at 10000.
        "--ray-client-server-port=$(__ds_ray_port "$base" client_server)")
    if [ "$role" = head ]; then
        args+=(--head "--port=$gcs"
            '--resources={"dagster_slurm_head": 1}')
        if [ -n "$__ds_ray_include_dashboard" ]; then
            args+=(--include-dashboard=true "--dashboard-host=${__ds_ray_dashboard_host:-$address}"
                "--dashboard-port=$dashboard")
        else
            args+=(--include-dashboard=false)
        fi
    else
        args+=("--address=$head_address:$head_port" '--resources={"dagster_slurm_worker": 1}')
    fi
    [ -z "$store" ] || args+=("--object-store-memory=$store")
    # Ray 2.60's 'ray start' takes the password only as an option (no variable, no file).
    [ -z "$password" ] || args+=("--redis-password=$password")
    args+=(${__ds_ray_extra_args[@]+"${__ds_ray_extra_args[@]}"})
    printf '%s node=%s state=starting address=%s gcs=%s dashboard=%s block=%s step=%s\n' \
        "$__ds_ray_marker" "$index" "$address" "$gcs" "$dashboard" "$base" \
        "${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-}"
    if [ -n "$__ds_ray_node_stopped" ]; then
        __ds_ray_node_cleanup "$temp_dir" "$own_temp"
        return 0
    fi
    unset RAY_ADDRESS
    # On SIGTERM, Ray 2.5x first asks the head to drain the node, for up to 30 s by
    # default (for Ray Serve replicas); a batch job has nothing to drain, and every second
    # here keeps the allocation's nodes from the next job (Slurm's KillWait ends it with
    # SIGKILL anyway), so Ray stops at once unless the variable is set.
    export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
    # In a process group of its own (setsid replaces itself with 'ray start', whose pid is
    # then the group's id), which every process Ray starts on this node stays in; unless
    # 'ray' is a shell function or alias of the pre-start commands, which only this shell
    # can run.
    if [ "$(type -t ray)" = file ] && command -v setsid > /dev/null 2>&1; then
        PYTHONUNBUFFERED=1 setsid "${args[@]}" 2>&1 &
        __ds_ray_node_group=$!
    else
        PYTHONUNBUFFERED=1 "${args[@]}" 2>&1 &
    fi
    __ds_ray_node_pid=$!
    printf '%s node=%s state=launched pid=%s\n' "$__ds_ray_marker" "$index" "$__ds_ray_node_pid"
    [ -z "$__ds_ray_node_stopped" ] || kill -s TERM "$__ds_ray_node_pid"
    while :; do
        wait "$__ds_ray_node_pid"
        status=$?
        kill -0 "$__ds_ray_node_pid" 2>/dev/null || break
    done
    if [ -z "$__ds_ray_node_stopped" ]; then
        [ "$status" -ne 0 ] || status=1
        __ds_ray_node_log "'ray start' ended on its own (status $status)"
        __ds_ray_node_dump_logs "$temp_dir"
    else
        [ "$__ds_ray_node_stopped" != WINCH ] || __ds_ray_node_dump_logs "$temp_dir"
        status=0
    fi
    __ds_ray_node_cleanup "$temp_dir" "$own_temp"
    return "$status"
}
