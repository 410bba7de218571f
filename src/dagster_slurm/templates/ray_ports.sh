# Ray port blocks: every Ray node takes a block of consecutive ports and derives all its
# ports from the block's first port (see dagster_slurm/launchers/ray_ports.py, which holds
# the same rules and the offsets). These functions run on the node itself.
__ds_ray_strategy=@@{strategy}
__ds_ray_range_start=@@{range_start}
__ds_ray_range_end=@@{range_end}
__ds_ray_block_size=@@{block_size}
__ds_ray_lock_dir=@@{lock_dir}
__ds_ray_ray_port=@@{ray_port}
__ds_ray_dashboard_port=@@{dashboard_port}
__ds_ray_offsets=(@@{offsets})
__ds_ray_port_base=""

# Number of whole blocks in the range.
__ds_ray_block_count() {
    printf '%s\n' $(( (__ds_ray_range_end - __ds_ray_range_start + 1) / __ds_ray_block_size ))
}

# 32-bit FNV-1a of the bytes of $1 (ASCII job ids give the same value as Python's).
__ds_ray_fnv1a() {
    local LC_ALL=C
    local text=$1 hash=2166136261 i byte
    for ((i = 0; i < ${#text}; i++)); do
        printf -v byte '%d' "'${text:i:1}"
        hash=$(( ((hash ^ (byte & 255)) * 16777619) & 4294967295 ))
    done
    printf '%s\n' "$hash"
}

# Base port of the block that hash_jobid gives node $2 of job $1: the job id's hash plus
# the node index, so the nodes of one job take consecutive blocks.
__ds_ray_hash_base() {
    local hash blocks
    hash=$(__ds_ray_fnv1a "$1")
    blocks=$(__ds_ray_block_count)
    printf '%s\n' $(( __ds_ray_range_start + ((hash + $2) % blocks) * __ds_ray_block_size ))
}

# The local ports of this host's listening TCP sockets, one per line (ss, else /proc).
__ds_ray_listening_ports() {
    local _a _b _c address _d state file
    if command -v ss >/dev/null 2>&1; then
        ss -ltn 2>/dev/null | while read -r _a _b _c address _d; do
            printf '%s\n' "${address##*:}"
        done
        return 0
    fi
    for file in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$file" ] || continue
        while read -r _a address _b state _c; do
            [ "$state" = 0A ] || continue
            printf '%d\n' "0x${address##*:}" 2>/dev/null
        done < "$file"
    done
}

# Status 0 when something listens on a port of the block starting at $1.
__ds_ray_block_in_use() {
    local base=$1 last=$(( $1 + __ds_ray_block_size - 1 )) port
    while read -r port; do
        case $port in
            '' | *[!0-9]*) continue ;;
        esac
        if [ "$port" -ge "$base" ] && [ "$port" -le "$last" ]; then
            return 0
        fi
    done < <(__ds_ray_listening_ports)
    return 1
}

# Lock the block starting at $1 on file descriptor 9. The descriptor stays open in this
# shell and in the 'ray start' it runs, so the lock lasts as long as the Ray node. Lock
# files are shared by all users (mode 0666) and opened read-only, which flock allows.
__ds_ray_lock_block() {
    local file="$__ds_ray_lock_dir/dagster-slurm-ray-port-$1.lock"
    if [ ! -e "$file" ]; then
        (umask 0 && : >> "$file") 2>/dev/null
    fi
    [ -r "$file" ] || return 1
    exec 9<"$file" || return 1
    if ! flock -n 9; then
        exec 9<&-
        return 1
    fi
    return 0
}

# Strategy 'random': from a random block on, the first block that can be locked and has
# no listener; sets __ds_ray_port_base (and keeps the lock). Status 1: none is free.
__ds_ray_pick_random_block() {
    local blocks first i base
    blocks=$(__ds_ray_block_count)
    first=$(( (RANDOM * 32768 + RANDOM) % blocks ))
    for ((i = 0; i < blocks; i++)); do
        base=$(( __ds_ray_range_start + ((first + i) % blocks) * __ds_ray_block_size ))
        __ds_ray_lock_block "$base" || continue
        if __ds_ray_block_in_use "$base"; then
            exec 9<&-
            continue
        fi
        __ds_ray_port_base=$base
        return 0
    done
    return 1
}

# Choose this node's block: $1 = node index, $2 = job id. Sets __ds_ray_port_base.
__ds_ray_choose_block() {
    local strategy=$__ds_ray_strategy blocks
    blocks=$(__ds_ray_block_count)
    if [ "$strategy" = random ] && ! command -v flock >/dev/null 2>&1; then
        __ds_ray_node_log "warning: flock not found; port_strategy 'random' falls back to" \
            "'hash_jobid' (the block is not checked, so concurrent Ray clusters on this host" \
            "may collide)"
        strategy=hash_jobid
    fi
    case $strategy in
        fixed)
            __ds_ray_port_base=$(( __ds_ray_range_start + ($1 % blocks) * __ds_ray_block_size ))
            ;;
        hash_jobid)
            __ds_ray_port_base=$(__ds_ray_hash_base "$2" "$1")
            ;;
        *)
            if ! __ds_ray_pick_random_block; then
                __ds_ray_node_log "no free port block in $__ds_ray_range_start-$__ds_ray_range_end" \
                    "($blocks blocks of $__ds_ray_block_size tried, under $__ds_ray_lock_dir)"
                return 1
            fi
            ;;
    esac
    return 0
}

# Port number $2 (a name below) of the block starting at $1.
__ds_ray_port() {
    local index
    case $2 in
        gcs) index=0 ;;
        node_manager) index=1 ;;
        object_manager) index=2 ;;
        dashboard) index=3 ;;
        dashboard_agent_listen) index=4 ;;
        dashboard_agent_grpc) index=5 ;;
        metrics_export) index=6 ;;
        runtime_env_agent) index=7 ;;
        client_server) index=8 ;;
        min_worker) index=9 ;;
        *) return 1 ;;
    esac
    printf '%s\n' $(( $1 + __ds_ray_offsets[index] ))
}
