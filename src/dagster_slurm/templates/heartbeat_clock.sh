# -- heartbeat clock (templates/heartbeat_clock.sh, included) --------------------------------
# The monotonic clock and the heartbeat test of the dead-man's switches (the step server, a
# successor's standby, the asset-scope job watchdog). A supervisor's beat writes NEW CONTENT
# to the heartbeat file; only the content is compared. The file's mtime is never read: on a
# shared filesystem it may be cached for up to a minute, and it comes from another machine's
# clock.
#
#   __hb_now      seconds since boot, set by __hb_clock
#   __hb_seen     the heartbeat content seen last ("" before the first)
#   __hb_changed  __hb_now when that content was first seen (or when __hb_start ran)
#   __hb_age      seconds since then, set by __hb_stale
__hb_now=0
__hb_seen=""
__hb_changed=0
__hb_age=0

# Seconds since boot into __hb_now: a monotonic clock, unmoved by changes of the node's wall
# clock (bash's own SECONDS where /proc/uptime cannot be read). No subprocess.
__hb_clock() {
    local up=""
    { IFS=' ' read -r up _ < /proc/uptime; } 2>/dev/null || :
    up=${up%%.*}
    case $up in
        '' | *[!0-9]*) __hb_now=$SECONDS ;;
        *) __hb_now=$up ;;
    esac
}

# Start counting now, nothing seen yet.
__hb_start() {
    __hb_clock
    __hb_seen=""
    __hb_changed=$__hb_now
}

# Read the heartbeat file $1 once. Non-empty content other than the one seen last counts as
# a change (so does the first content read); a missing or empty file is no change. Succeeds
# (status 0) when the content has not changed for more than $2 seconds; __hb_age tells how
# long it has not.
__hb_stale() {
    local content=""
    __hb_clock
    { IFS= read -r content < "$1"; } 2>/dev/null || :
    if [ -n "$content" ] && [ "$content" != "$__hb_seen" ]; then
        __hb_seen=$content
        __hb_changed=$__hb_now
    fi
    __hb_age=$((__hb_now - __hb_changed))
    [ "$__hb_age" -gt "$2" ]
}
# -- end of the heartbeat clock ---------------------------------------------------------------
