@@{prologue}
# Worker allocation of a run session (after the common prologue above, which activated the
# run's environment). Its nodes join the run's Ray cluster as workers: the head named in
# <session dir>/ray_head (job_id, ray_address, host, written_at lines), and whichever head
# rewrites that file later. Files in <session dir>/jobs/<job id>/:
#   nodes      the allocation's hosts, one per line;
#   ray_nodes  '<host> <Ray node id> <head job id>' per joined node (rewritten atomically);
#   state      one line, atomically: waiting (no live head, or none of the nodes joined
#              yet), joined (every node joined the head), partial (some nodes are out or
#              restarting), draining, then 'released <reason>' (drained, no_head,
#              cancelled) at the end (both words are the library's: __dw_state_* below);
#   drain      written by the session before it sends the removal signal (see below):
#              'deadline=<epoch seconds>'.
#   host_head  written by an elector: 'term=<n>' asks the allocation to host the run's Ray
#              head, 'stop term=<n>' withdraws the request (looked at every second);
#   host_head_state  'starting|started|draining|failed|stopped|ended term=<n> ...'
#              (atomically).
#
# Hosting the head: 'ray start --head' with no CPUs and no GPUs (resource
# dagster_slurm_head) on the FIRST node, in a step of its own next to that node's worker
# and with a port block of its own (node index = the number of nodes), then the session's
# step server in the batch shell with RAY_ADDRESS set to it. The step server writes
# ray_head and jobs/<job id>/ready; this allocation's nodes then follow ray_head to the
# new head like every other worker allocation's and keep their CPUs and GPUs. A head that
# does not start within startup_timeout, or whose 'ray start' ends first, is reported
# 'failed'. While it hosts the head the allocation never releases itself for lack of one.
# When it drains while hosting, its step server drains too (see __dw_host_drain): the
# session then elects another head.
#
# A head is live while squeue lists its job RUNNING (or cannot answer) and its GCS port
# answers. Each node runs 'ray start --block' in an 'srun --overlap' step of its own. A node
# whose Ray ends while the same head is live starts again after a growing delay; after
# @@{max_restarts} restarts its next end keeps it out until the allocation joins another head.
# A rewritten ray_head moves every node to the new head. Without a live head for
# rejoin_timeout seconds the allocation releases itself (exit 0).
#
# Drain (the removal signal, or the pre-walltime signal): 'ray drain-node' for each joined
# node; Ray places nothing new there, running work goes on, and an idle drained node's
# raylet shuts down by itself (Ray 2.60; its 'ray start --block' stays, so it is stopped
# then). What still runs at the deadline (the drain file's, else the pre-walltime signal's
# lead minus the walltime margin from now) is stopped; then the script exits 0, so the job
# ends COMPLETED. No node starts again during a drain. TERM, INT or HUP that is not the
# drain signal stops every node at once and ends the script.

# Values shared with the library (dagster_slurm/protocol.py): the signal the session
# removes the allocation with, the seconds before the walltime by which a drain ends, and
# the state words the session reads ('released' is followed by the reason).
__dw_removal_signal=@@{protocol_removal_signal}
__dw_walltime_margin=@@{protocol_walltime_margin_seconds}
__dw_state_draining=@@{protocol_worker_draining}
__dw_state_released=@@{protocol_worker_released}
__dw_session_dir=@@{session_dir}
__dw_rejoin_timeout=@@{rejoin_timeout}
__dw_walltime_signal=@@{walltime_signal}
__dw_drain_lead=@@{drain_lead}
__dw_default_drain=@@{default_drain}
__dw_startup_timeout=@@{startup_timeout}
__dw_server_drain=@@{server_drain_signal}
__dw_stop_grace=@@{stop_grace}
__dw_restart_delays=(@@{restart_delays})
__dw_node_query=@@{node_query}
# The password stays in this script (readable by its owner only): each node gets it in its
# environment (__DS_RAY_REDIS_PASSWORD), never on srun's or bash's command line.
__dw_redis_password=@@{redis_password}
@@{ports}
@@{node}
# This allocation's own Ray settings: its GPUs, and ray start options after the launcher's
# (the launcher's, then its resources, then its ray_start_args: for ray start the last
# value of an option wins).
__ds_ray_num_gpus=@@{num_gpus}
__ds_ray_extra_args=(@@{ray_start_args})
# Hosting the run's head (after an election): the step server to start, and the options of
# the head-only 'ray start --head' (the launcher's, then no CPUs and no GPUs).
__dw_step_server=@@{step_server}
__dw_head_args=(@@{head_start_args})
# The pace: a round of the main loop every second (every 0.2 s while a node joins, a head
# starts here or the head is not live), the head's GCS port looked at every 5 s
# at most, the nodes' Ray ids asked every 2 s at most, a drain's round every 2 s. A real
# allocation keeps these; the unit tests shorten them (see the pace).
__dw_round=1
__dw_quick_round=0.2
__dw_live_every=5
__dw_ids_every=2
__dw_drain_round=2
@@include pace.sh
__ds_pace __dw_round "${__DS_DW_ROUND-}" decimal
__ds_pace __dw_quick_round "${__DS_DW_ROUND-}" decimal
__ds_pace __dw_live_every "${__DS_DW_LIVE_EVERY-}"
__ds_pace __dw_ids_every "${__DS_DW_IDS_EVERY-}"
__ds_pace __dw_drain_round "${__DS_DW_DRAIN_ROUND-}" decimal

__dw_job=${SLURM_JOB_ID:?a worker allocation runs inside a Slurm allocation}
__dw_job_dir="$__dw_session_dir/jobs/$__dw_job"
__dw_head_file="$__dw_session_dir/ray_head"
__dw_hosts=()
__dw_cpus=()
__dw_pids=()        # srun of each running node ('' when none)
__dw_logs=()
__dw_ids=()         # Ray node id once joined ('' before)
__dw_strikes=()     # ends while the same head was live
__dw_next=()        # SECONDS at which the node may start again
__dw_launched=()    # SECONDS at which it was started
__dw_out=()         # 1: stays out until another head
__dw_warned=()
__dw_head_job=""
__dw_head_address=""
__dw_head_seen=""   # the ray_head file's content the nodes follow
__dw_live=""
__dw_live_checked=-100
__dw_queue_checked=-100
__dw_head_ended=""
__dw_last_live=$SECONDS
__dw_said=""
__dw_said_at=0
__dw_state=""
__dw_joined_text=""
__dw_signal=""
__dw_drain=""
__dw_code=""
__dw_code_env=""
__dw_deadline=0
__dw_ids_asked=-100

__dw_log() {
    printf 'dagster-slurm: worker allocation %s: %s\n' "$__dw_job" "$*" >&2
}

__dw_write_state() {
    [ "$1" != "$__dw_state" ] || return 0
    __dw_state=$1
    __ds_write_atomic "$__dw_job_dir/state" "$1" || __dw_log "cannot write $__dw_job_dir/state"
}

# Say $* once, and again every minute while it holds (until something else was said).
__dw_say() {
    if [ "$*" = "$__dw_said" ] && [ $((SECONDS - __dw_said_at)) -lt 60 ]; then
        return 0
    fi
    [ "$*" = "$__dw_said" ] && __dw_log "still $*" || __dw_log "$*"
    __dw_said=$*
    __dw_said_at=$SECONDS
}

__dw_on_signal() {
    if [ "$1" = "$__dw_removal_signal" ] || [ "$1" = "$__dw_walltime_signal" ]; then
        [ -n "$__dw_drain" ] || __dw_drain=$1
    else
        [ -n "$__dw_signal" ] || __dw_signal=$1
    fi
}

# A nap that a trapped signal cuts short.
__dw_nap() {
    sleep "$1" &
    wait "$!" 2>/dev/null
}

# The hosts of the allocation and the CPUs Slurm gave each (SLURM_JOB_CPUS_PER_NODE reads
# like "4(x2),2"), in __dw_hosts and __dw_cpus.
__dw_read_hosts() {
    local host entry cpus count
    while IFS= read -r host; do
        [ -z "$host" ] || __dw_hosts+=("$host")
    done < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-${SLURMD_NODENAME:-}}")
    for entry in ${SLURM_JOB_CPUS_PER_NODE:+${SLURM_JOB_CPUS_PER_NODE//,/ }}; do
        cpus=${entry%%(*}
        count=1
        case $entry in
            *'(x'*')') count=${entry#*(x} && count=${count%)} ;;
        esac
        while [ "$count" -gt 0 ]; do
            __dw_cpus+=("$cpus")
            count=$((count - 1))
        done
    done
    [ "${#__dw_hosts[@]}" -gt 0 ]
}

# Copy node $1's output into its log file and, prefixed, to the job's stderr.
__dw_relay() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >> "${__dw_logs[$1]}"
        case $line in
            "$__ds_ray_marker "*) ;;
            *) printf '[ray %s] %s\n' "${__dw_hosts[$1]}" "$line" >&2 ;;
        esac
    done
}

@@include marker_field.sh

# Field $3 of the last marker line with state $2 in node $1's log (status 1: none yet).
__dw_field() {
    __ds_marker_value "${__dw_logs[$1]}" "$__ds_ray_marker node=$1 state=$2 " "$3"
}

# Status 0 when Ray reported node $1 as started (registered with the head's GCS).
__dw_started() {
    grep -q 'Ray runtime started' "${__dw_logs[$1]}" 2>/dev/null
}

# Start a Ray worker on node $1, joining the current head.
__dw_launch() {
    local index=$1 cpus=${__dw_cpus[$1]-}
    local -a launcher=(srun --overlap --export=ALL --nodes=1 --ntasks=1
        "--nodelist=${__dw_hosts[$1]}" --mem=0 "--job-name=ray-worker-$1")
    [ -z "$cpus" ] || launcher+=("--cpus-per-task=$cpus")
    __dw_logs[index]="$__dw_job_dir/ray-node-$index.log"
    : > "${__dw_logs[index]}"
    __DS_RAY_REDIS_PASSWORD=$__dw_redis_password \
        "${launcher[@]}" bash -c "$__dw_code" dagster-slurm-ray-worker \
        worker "$index" "$__dw_job" "${__dw_head_address%:*}" "${__dw_head_address##*:}" \
        > >(__dw_relay "$index") 2>&1 < /dev/null &
    __dw_pids[index]=$!
    __dw_ids[index]=""
    __dw_launched[index]=$SECONDS
    __dw_warned[index]=""
}

# Status 0 when node $1 runs no Ray (never started, or its step has ended; reaped here).
__dw_gone() {
    [ -n "${__dw_pids[$1]}" ] || return 0
    kill -0 "${__dw_pids[$1]}" 2>/dev/null && return 1
    wait "${__dw_pids[$1]}" 2>/dev/null
    __dw_pids[$1]=""
    __dw_ids[$1]=""
    return 0
}

# Ask node $1 to stop: SIGURG to the tasks of its step (its shell sends SIGTERM to 'ray
# start' alone, which shuts the node down in order; Ray's processes ignore SIGURG).
__dw_stop_node() {
    local step
    __dw_gone "$1" && return 0
    step=$(__dw_field "$1" starting step) || step=""
    case $step in
        *.?*) scancel --quiet "--signal=$(kill -l URG)" "$step" > /dev/null 2>&1 ;;
        *) kill -TERM "${__dw_pids[$1]}" 2>/dev/null ;;
    esac
}

# Stop the nodes given as arguments and wait up to $__dw_stop_grace s (then end their
# steps: SIGTERM to srun) and a few seconds more; with 'quick' as the first argument, ask
# them to stop and do not wait.
__dw_stop_nodes() {
    local i left deadline killed="" quick=""
    [ "${1-}" != quick ] || { quick=1 && shift; }
    for i in "$@"; do
        __dw_stop_node "$i"
    done
    [ -z "$quick" ] || return 0
    deadline=$((SECONDS + __dw_stop_grace))
    while :; do
        left=""
        for i in "$@"; do
            __dw_gone "$i" || left="$left $i"
        done
        [ -n "$left" ] || return 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            [ -z "$killed" ] || { __dw_log "Ray node(s)$left still running; they end with the job" && return 1; }
            __dw_log "Ray node(s)$left did not stop within $__dw_stop_grace s; ending their steps"
            for i in $left; do
                kill -TERM "${__dw_pids[i]}" 2>/dev/null
            done
            killed=1
            deadline=$((SECONDS + 5))
        fi
        sleep 0.2 2>/dev/null || sleep 1
    done
}

__dw_all_nodes() {
    local i
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        printf '%s\n' "$i"
    done
}

# The node query (python3 with the ray package): $1 = 'ids' or 'states', $2 = GCS address,
# then the items. Run in a subshell after pre_start_commands (a Ray auth token, modules).
__dw_query() {
    (
        set +u
        eval "$__ds_ray_pre_start" > /dev/null 2>&1
        timeout 30 python3 -c "$__dw_node_query" "$@"
    ) 2>/dev/null
}

# Status 0 while a node runs Ray but its join is not announced yet (no Ray node id).
__dw_joining() {
    local i
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        [ -z "${__dw_pids[i]}" ] || [ -n "${__dw_ids[i]}" ] || return 0
    done
    return 1
}

# Rewrite ray_nodes (and the state) from the nodes joined now.
__dw_publish() {
    local i text="" joined=0 out=""
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        [ -z "${__dw_out[i]}" ] || out=1
        [ -n "${__dw_ids[i]}" ] || continue
        text="$text${__dw_hosts[i]} ${__dw_ids[i]} $__dw_head_job
"
        joined=$((joined + 1))
    done
    if [ "$text" != "$__dw_joined_text" ]; then
        __dw_joined_text=$text
        printf '%s' "$text" > "$__dw_job_dir/ray_nodes.tmp.$$" \
            && mv -f -- "$__dw_job_dir/ray_nodes.tmp.$$" "$__dw_job_dir/ray_nodes" \
            || __dw_log "cannot write $__dw_job_dir/ray_nodes"
    fi
    [ -z "$__dw_drain" ] || return 0
    if [ "$joined" -eq 0 ] && [ -z "$out" ]; then
        __dw_write_state waiting
    elif [ "$joined" -eq "${#__dw_hosts[@]}" ]; then
        __dw_write_state joined
    else
        __dw_write_state partial
    fi
}

# Learn the Ray node id of every started node without one (matched in the GCS by its
# address and node manager port).
__dw_learn_ids() {
    local i k address base item id
    local -a items=() wanted=()
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        [ -n "${__dw_pids[i]}" ] && [ -z "${__dw_ids[i]}" ] && __dw_started "$i" || continue
        address=$(__dw_field "$i" starting address) && base=$(__dw_field "$i" starting block) \
            || continue
        items+=("$address:$(__ds_ray_port "$base" node_manager)")
        wanted+=("$i")
        if [ $((SECONDS - __dw_launched[i])) -ge 60 ] && [ -z "${__dw_warned[i]-}" ]; then
            __dw_warned[i]=1
            __dw_log "Ray started on node ${__dw_hosts[i]}, but the head's GCS lists no live" \
                "node at ${items[-1]} yet (node query: python3 with the ray package)"
        fi
    done
    [ "${#items[@]}" -gt 0 ] && [ $((SECONDS - __dw_ids_asked)) -ge "$__dw_ids_every" ] \
        || return 0
    __dw_ids_asked=$SECONDS
    while read -r item id; do
        for k in "${!items[@]}"; do
            [ "${items[k]}" = "$item" ] || continue
            i=${wanted[k]}
            __dw_ids[i]=$id
            __dw_log "node ${__dw_hosts[i]} joined head $__dw_head_job as Ray node $id"
        done
    done < <(__dw_query ids "$__dw_head_address" "${items[@]}")
}

# Read ray_head; status 0 when it names a head (__dw_new_job, __dw_new_address, __dw_new_text).
__dw_read_head() {
    local line
    __dw_new_job="" __dw_new_address="" __dw_new_text=""
    [ -r "$__dw_head_file" ] || return 1
    while IFS= read -r line; do
        __dw_new_text="$__dw_new_text$line;"
        case $line in
            job_id=*) __dw_new_job=${line#job_id=} ;;
            ray_address=*) __dw_new_address=${line#ray_address=} ;;
        esac
    done < "$__dw_head_file"
    [ -n "$__dw_new_job" ] && [ -n "$__dw_new_address" ]
}

# Status 0 when TCP port $2 of $1 accepts connections.
__dw_port_open() {
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# Whether the current head is live (__dw_live: 1 or ''): its GCS port, looked at every 5 s
# at most (__dw_live_every), and squeue, asked every 30 s at most (and at once for a new
# head).
__dw_check_live() {
    local state rc
    [ $((SECONDS - __dw_live_checked)) -ge "$__dw_live_every" ] || return 0
    __dw_live_checked=$SECONDS
    __dw_live=""
    [ -n "$__dw_head_job" ] || return 0
    if [ $((SECONDS - __dw_queue_checked)) -ge 30 ]; then
        __dw_queue_checked=$SECONDS
        state=$(squeue -h -j "$__dw_head_job" -o %T 2>/dev/null)
        rc=$?
        # squeue that does not answer is no verdict: the GCS port decides alone then.
        __dw_head_ended=""
        [ "$rc" -ne 0 ] || [ "$state" = RUNNING ] || __dw_head_ended=1
    fi
    [ -z "$__dw_head_ended" ] || return 0
    __dw_port_open "${__dw_head_address%:*}" "${__dw_head_address##*:}" || return 0
    __dw_live=1
}

# Follow ray_head: a new head (another job or address) makes every node leave the old one.
__dw_follow_head() {
    local i
    __dw_read_head || return 0
    [ "$__dw_new_text" != "$__dw_head_seen" ] || return 0
    __dw_head_seen=$__dw_new_text
    if [ "$__dw_new_job" = "$__dw_head_job" ] && [ "$__dw_new_address" = "$__dw_head_address" ]
    then
        return 0
    fi
    if [ "$__dw_host_phase" = started ] && [ "$__dw_new_job" != "$__dw_job" ]; then
        __dw_log "the run's Ray head moved to job $__dw_new_job; this allocation stops hosting" \
            "it (term $__dw_host_term) and stays a worker"
        __dw_host_stop
        __dw_host_report "ended term=$__dw_host_term moved to job $__dw_new_job"
    fi
    if [ -n "$__dw_head_job" ]; then
        __dw_log "the run's Ray head is now job $__dw_new_job at $__dw_new_address (was" \
            "$__dw_head_job); moving every node to it"
        __dw_stop_nodes $(__dw_all_nodes)
    fi
    __dw_head_job=$__dw_new_job
    __dw_head_address=$__dw_new_address
    __dw_live_checked=-100
    __dw_queue_checked=-100
    __dw_head_ended=""
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        __dw_strikes[i]=0
        __dw_next[i]=0
        __dw_out[i]=""
    done
}

# One round with a live head: start what should run, notice what ended.
__dw_tend_nodes() {
    local i delay
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        if [ -n "${__dw_pids[i]}" ]; then
            if __dw_gone "$i"; then
                __dw_strikes[i]=$(( __dw_strikes[i] + 1 ))
                if [ "${__dw_strikes[i]}" -gt "${#__dw_restart_delays[@]}" ]; then
                    __dw_out[i]=1
                    __dw_log "Ray on node ${__dw_hosts[i]} ended again (${__dw_strikes[i]} times" \
                        "with head $__dw_head_job); it stays out until the allocation joins" \
                        "another head"
                else
                    delay=${__dw_restart_delays[__dw_strikes[i] - 1]}
                    __dw_next[i]=$((SECONDS + delay))
                    __dw_log "Ray on node ${__dw_hosts[i]} ended while head $__dw_head_job is" \
                        "live; starting it again in $delay s (restart ${__dw_strikes[i]} of" \
                        "${#__dw_restart_delays[@]})"
                fi
            elif [ -z "${__dw_ids[i]}" ] && ! __dw_started "$i" \
                && [ $((SECONDS - __dw_launched[i])) -ge "$__dw_startup_timeout" ]; then
                __dw_log "Ray on node ${__dw_hosts[i]} did not join within" \
                    "$__dw_startup_timeout s; stopping it"
                __dw_stop_node "$i"
            fi
        elif [ -z "${__dw_out[i]}" ] && [ "$SECONDS" -ge "${__dw_next[i]}" ]; then
            __dw_log "starting Ray on node ${__dw_hosts[i]}, joining head $__dw_head_job at" \
                "$__dw_head_address"
            __dw_launch "$i"
        fi
    done
    __dw_learn_ids
}

# Leave: nodes asked to stop (quick) or stopped (waiting), state '$__dw_state_released $1', exit $2.
__dw_release() {
    local i
    if [ "$1" = cancelled ]; then
        __dw_stop_nodes quick $(__dw_all_nodes)
    else
        __dw_stop_nodes $(__dw_all_nodes)
    fi
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        __dw_ids[i]=""
    done
    __dw_publish
    __dw_state=""
    __dw_write_state "$__dw_state_released $1"
    __ds_finish "$2"
}

# The drain deadline (epoch seconds): the drain file's, else the pre-walltime signal's
# lead minus the walltime margin from now, else the default drain time from now.
__dw_drain_deadline() {
    local line now
    now=$(date +%s)
    while IFS= read -r line; do
        case $line in
            deadline=*[0-9]*) line=${line#deadline=} && printf '%s\n' "${line%%.*}" && return 0 ;;
        esac
    done < "$__dw_job_dir/drain" 2>/dev/null
    if [ "$__dw_drain" = "$__dw_walltime_signal" ] && [ -n "$__dw_drain_lead" ]; then
        printf '%s\n' $(( now + (__dw_drain_lead > __dw_walltime_margin
                               ? __dw_drain_lead - __dw_walltime_margin : 0) ))
    else
        printf '%s\n' $(( now + __dw_default_drain ))
    fi
}

# Ask Ray to drain node $1 (its Ray node id is known); status 0 when Ray accepted.
__dw_drain_node() {
    local now
    now=$(date +%s)
    (
        set +u
        eval "$__ds_ray_pre_start" > /dev/null 2>&1
        timeout 60 ray drain-node --address "$__dw_head_address" --node-id "${__dw_ids[$1]}" \
            --reason DRAIN_NODE_REASON_PREEMPTION \
            --reason-message "worker allocation $__dw_job is released" \
            --deadline-remaining-seconds "$(( __dw_deadline > now ? __dw_deadline - now : 0 ))"
    ) > /dev/null 2>&1
}

# The drain: see the header. Never returns.
__dw_drain_all() {
    local left i now item state reported=$SECONDS
    local -a ids=() asked=()
    __dw_state=""
    __dw_write_state "$__dw_state_draining"
    __dw_deadline=$(__dw_drain_deadline)
    __dw_host_drain
    now=$(date +%s)
    __dw_log "drain ($__dw_drain): draining every node through Ray; each node leaves once" \
        "idle, what still runs in $((__dw_deadline - now)) s (the deadline) is stopped"
    for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
        __dw_gone "$i" && continue
        if [ -n "${__dw_ids[i]}" ] && [ -n "$__dw_live" ] && __dw_drain_node "$i"; then
            ids[i]=${__dw_ids[i]}
            __dw_log "node ${__dw_hosts[i]} (Ray node ${__dw_ids[i]}) is draining"
        else
            __dw_log "node ${__dw_hosts[i]} cannot be drained through Ray (not joined, no" \
                "live head, or 'ray drain-node' failed); stopping it"
            __dw_stop_node "$i"
        fi
    done
    while :; do
        [ -z "$__dw_signal" ] || __dw_release cancelled $((128 + $(kill -l "$__dw_signal")))
        left=""
        for ((i = 0; i < ${#__dw_hosts[@]}; i++)); do
            __dw_gone "$i" || left="$left $i"
        done
        __dw_publish
        [ -n "$left" ] || break
        now=$(date +%s)
        if [ "$now" -ge "$__dw_deadline" ]; then
            __dw_log "drain deadline reached; stopping the node(s) still busy:$left"
            __dw_stop_nodes $left
            break
        fi
        __dw_check_live
        if [ -z "$__dw_live" ]; then
            __dw_log "head $__dw_head_job is not live any more; stopping the node(s) still" \
                "draining:$left"
            __dw_stop_nodes $left
            break
        fi
        # A drained node's raylet ends once the node is idle, its 'ray start' stays: stop it.
        asked=()
        for i in $left; do
            [ -z "${ids[i]-}" ] || asked+=("${ids[i]}")
        done
        if [ "${#asked[@]}" -gt 0 ]; then
            while read -r item state; do
                [ "$state" = gone ] || continue
                for i in $left; do
                    [ "${ids[i]-}" = "$item" ] || continue
                    __dw_log "node ${__dw_hosts[i]} is idle and left the Ray cluster; stopping" \
                        "its Ray processes"
                    __dw_stop_node "$i"
                    ids[i]=""
                done
            done < <(__dw_query states "$__dw_head_address" "${asked[@]}")
        fi
        if [ $((SECONDS - reported)) -ge 30 ]; then
            reported=$SECONDS
            __dw_log "draining: node(s)$left still busy; $((__dw_deadline - now)) s to the deadline"
        fi
        __dw_nap "$__dw_drain_round"
    done
    __dw_release drained 0
}

# -- hosting the run's Ray head (see the header) --------------------------------------------
__dw_host_term=""     # the term asked for in host_head ('' before any request)
__dw_host_phase=""    # starting | started ('' when not hosting)
__dw_host_pid=""      # srun of the head node
__dw_server_pid=""    # the step server
__dw_host_since=0

__dw_host_report() {
    __ds_write_atomic "$__dw_job_dir/host_head_state" "$*" \
        || __dw_log "cannot write $__dw_job_dir/host_head_state"
}

# Stop the step server this allocation runs for the head: HUP makes it leave (TERM may be
# its drain signal, after which it would stay; INT is ignored by background shells), KILL
# after 6 s should it still run. It must not outlive the batch shell: once orphaned, a
# proctrack plugin that follows parents (linuxproc) no longer ends it with the job.
__dw_server_stop() {
    local pid=$__dw_server_pid waited=0
    [ -n "$pid" ] || return 0
    kill -HUP "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 30 ]; do
        sleep 0.2
        waited=$((waited + 1))
    done
    kill -KILL "$pid" 2>/dev/null || :
}

# Stop the head node and the step server this allocation runs (nothing when none).
__dw_host_stop() {
    local step n=${#__dw_hosts[@]}
    __dw_server_stop
    if [ -n "$__dw_host_pid" ] && kill -0 "$__dw_host_pid" 2>/dev/null; then
        step=$(__dw_field "$n" starting step) || step=""
        case $step in
            *.?*) scancel --quiet "--signal=$(kill -l URG)" "$step" > /dev/null 2>&1 ;;
            *) kill -TERM "$__dw_host_pid" 2>/dev/null ;;
        esac
    fi
    __dw_host_pid="" __dw_server_pid="" __dw_host_phase=""
    # A ready file of an earlier term must not pass for the next one's.
    rm -f -- "$__dw_job_dir/ready"
}

# The allocation drains while it hosts the run's head: the step server gets its drain
# signal (it records it in <job dir>/drained, passes it to the running payload steps and
# starts no new one), so the session elects another head; the head itself stays up until
# the drain ends, for the work still draining here.
__dw_host_drain() {
    [ "$__dw_host_phase" = started ] && [ -n "$__dw_server_pid" ] || return 0
    __dw_log "this allocation hosts the run's Ray head (term $__dw_host_term): draining its" \
        "step server ($__dw_server_drain); the session elects another head"
    kill "-$__dw_server_drain" "$__dw_server_pid" 2>/dev/null \
        || __dw_log "the step server of the head (pid $__dw_server_pid) is gone"
    __dw_host_report "draining term=$__dw_host_term"
}

__dw_host_fail() {
    __dw_log "cannot host the run's Ray head (term $__dw_host_term): $*"
    if [ -r "${__dw_logs[${#__dw_hosts[@]}]}" ]; then
        tail -n 20 "${__dw_logs[${#__dw_hosts[@]}]}" | sed 's/^/[ray head] /' >&2
    fi
    __dw_host_stop
    __dw_host_report "failed term=$__dw_host_term $*"
}

# Start the head-only Ray node on the first node (its output in ray-head.log).
__dw_host_start() {
    local n=${#__dw_hosts[@]}
    __dw_logs[n]="$__dw_job_dir/ray-head.log"
    : > "${__dw_logs[n]}"
    __dw_host_report "starting term=$__dw_host_term"
    __dw_log "asked to host the run's Ray head (term $__dw_host_term); starting a head-only" \
        "Ray node on ${__dw_hosts[0]}"
    __DS_RAY_REDIS_PASSWORD=$__dw_redis_password \
        srun --overlap --export=ALL --nodes=1 --ntasks=1 "--nodelist=${__dw_hosts[0]}" \
        --mem=0 --job-name=ray-head bash -c "$__dw_head_code" dagster-slurm-ray-head \
        head "$n" "$__dw_job" > "${__dw_logs[n]}" 2>&1 < /dev/null &
    __dw_host_pid=$!
    __dw_host_phase=starting
    __dw_host_since=$SECONDS
}

# One round: follow host_head, bring the head up, notice when it ends.
__dw_host_tend() {
    local text="" n=${#__dw_hosts[@]} address gcs
    [ ! -r "$__dw_job_dir/host_head" ] || IFS= read -r text < "$__dw_job_dir/host_head"
    case $text in
        "stop term=$__dw_host_term")
            if [ -n "$__dw_host_phase" ]; then
                __dw_log "the request to host the head (term $__dw_host_term) was withdrawn"
                __dw_host_stop
                __dw_host_report "stopped term=$__dw_host_term"
            fi ;;
        term=*[0-9])
            if [ "${text#term=}" != "$__dw_host_term" ]; then
                __dw_host_stop
                __dw_host_term=${text#term=}
                __dw_host_start
            fi ;;
    esac
    case $__dw_host_phase in
        starting)
            if grep -q 'Ray runtime started' "${__dw_logs[n]}" 2>/dev/null; then
                address=$(__dw_field "$n" starting address) \
                    && gcs=$(__dw_field "$n" starting gcs) \
                    || { __dw_host_fail "the head's address is not in its log" && return 0; }
                __dw_log "the head-only Ray node runs at $address:$gcs; starting the step server"
                RAY_ADDRESS="$address:$gcs" bash "$__dw_step_server" < /dev/null >&2 &
                __dw_server_pid=$!
                __dw_host_phase=started
                __dw_host_report "started term=$__dw_host_term ray_address=$address:$gcs"
            elif ! kill -0 "$__dw_host_pid" 2>/dev/null; then
                __dw_host_fail "'ray start --head' ended before the head started"
            elif [ $((SECONDS - __dw_host_since)) -ge "$__dw_startup_timeout" ]; then
                __dw_host_fail "the head did not start within $__dw_startup_timeout s"
            fi ;;
        started)
            if ! kill -0 "$__dw_host_pid" 2>/dev/null; then
                __dw_log "the head-only Ray node ended; the session elects another head"
                __dw_host_stop
                __dw_host_report "ended term=$__dw_host_term"
            elif ! kill -0 "$__dw_server_pid" 2>/dev/null; then
                __dw_log "the step server of the head ended; stopping the head"
                __dw_host_stop
                __dw_host_report "ended term=$__dw_host_term"
            fi ;;
    esac
}

__dw_on_exit() {
    local code=$?
    __dw_host_stop
    __dw_stop_nodes quick $(__dw_all_nodes)
    (exit "$code")
    __ds_on_exit
}

# -- main ---------------------------------------------------------------------------------
# The prologue's traps recorded what came during the activation: its drain signal is the
# removal signal, the pre-walltime signal (when it is TERM, INT or HUP) counts as a drain
# here.
for __dw_sig in TERM INT HUP "$__dw_removal_signal" $__dw_walltime_signal; do
    trap "__dw_on_signal $__dw_sig" "$__dw_sig"
done
trap __dw_on_exit EXIT
[ -z "$__ds_drained" ] || __dw_drain=$__dw_removal_signal
if [ -n "$__ds_cancelled" ]; then
    __dw_on_signal "$__ds_cancelled"
fi
mkdir -p -- "$__dw_job_dir" || __ds_finish 125
if ! __dw_read_hosts; then
    __dw_log "'scontrol show hostnames' listed no host of this allocation"
    __ds_finish 1
fi
printf '%s\n' "${__dw_hosts[@]}" > "$__dw_job_dir/nodes.tmp.$$" \
    && mv -f -- "$__dw_job_dir/nodes.tmp.$$" "$__dw_job_dir/nodes"
for ((__dw_i = 0; __dw_i < ${#__dw_hosts[@]}; __dw_i++)); do
    __dw_pids[__dw_i]="" __dw_ids[__dw_i]="" __dw_strikes[__dw_i]=0 __dw_next[__dw_i]=0
    __dw_out[__dw_i]="" __dw_launched[__dw_i]=0 __dw_logs[__dw_i]=/dev/null
done
__dw_publish
# Every node's shell gets the node functions and settings (ray_node.sh, ray_ports.sh).
__dw_code_env="set -u
$(declare -p $(compgen -v __ds_ray_))
$(declare -f $(compgen -A function __ds_ray_))"
__dw_code="$__dw_code_env
__ds_ray_node_main \"\$@\""
# The head-only node: the same functions, no CPUs or GPUs, the launcher's options only.
__dw_head_code="$__dw_code_env
$(declare -p __dw_head_args)
__ds_ray_num_cpus=0
__ds_ray_num_gpus=0
__ds_ray_extra_args=(\"\${__dw_head_args[@]}\")
__ds_ray_node_main \"\$@\""
__dw_log "started on ${#__dw_hosts[@]} node(s): ${__dw_hosts[*]}; joining the run's Ray head" \
    "named in $__dw_head_file"

while :; do
    if [ -n "$__dw_signal" ]; then
        __dw_log "signal $__dw_signal received; stopping every node"
        __dw_release cancelled $((128 + $(kill -l "$__dw_signal")))
    fi
    if [ -n "$__dw_drain" ]; then
        __dw_check_live
        __dw_drain_all
    fi
    __dw_host_tend
    __dw_follow_head
    __dw_check_live
    if [ -n "$__dw_live" ]; then
        __dw_last_live=$SECONDS
        __dw_tend_nodes
        __dw_said=""
    else
        __dw_any=""
        for __dw_i in $(__dw_all_nodes); do
            __dw_gone "$__dw_i" || __dw_any=1
        done
        if [ -n "$__dw_any" ]; then
            __dw_log "head $__dw_head_job at $__dw_head_address is not live; stopping the nodes" \
                "until a live head is named in $__dw_head_file"
            __dw_stop_nodes $(__dw_all_nodes)
        fi
        __dw_wait=$((SECONDS - __dw_last_live))
        if [ "$__dw_wait" -ge "$__dw_rejoin_timeout" ] && [ -z "$__dw_host_phase" ]; then
            __dw_log "no live Ray head for $__dw_wait s (rejoin_timeout $__dw_rejoin_timeout s);" \
                "releasing the allocation"
            __dw_release no_head 0
        fi
        if [ -z "$__dw_head_job" ]; then
            __dw_say "waiting for the run's Ray head (no head named in $__dw_head_file yet;" \
                "released after $__dw_rejoin_timeout s without one)"
        else
            __dw_say "waiting for a live Ray head (head $__dw_head_job at $__dw_head_address does" \
                "not answer; released after $__dw_rejoin_timeout s without one)"
        fi
    fi
    __dw_publish
    # A round a second while steady; five while a node joins, a head starts here or the head
    # is not live (a join to announce, a host_head request or a new head is then expected
    # within seconds, and each is acted on a fifth of a second after it happened, not up to
    # a second).
    if [ "$__dw_host_phase" = starting ] || __dw_joining \
        || { [ -z "$__dw_live" ] && [ -n "$__dw_head_job" ]; }; then
        __dw_nap "$__dw_quick_round"
    else
        __dw_nap "$__dw_round"
    fi
done
