@@{prologue}
# Standby of a successor allocation of a run session (after the common prologue above).
#
# A successor is queued while the session's current allocation still runs. Once Slurm starts
# it, this script waits (starting nothing: no Ray, no step server) until the session
# promotes it: promotion writes the allocation's start script and then the start file, whose
# one line names that script. This shell then becomes that script (exec of the payload
# words, "bash", with the script: the same process, so the batch shell's drain signal
# reaches the script's own traps). The start script is rendered by the launcher at
# promotion, so Ray starts with the launcher and environment chosen then.
#
# Signals while it waits, through the prologue's traps:
#   * the drain signal (the pre-walltime signal, or the same signal sent with
#     'scancel --signal=<signal> --batch <job id>') is recorded in the prologue's drain
#     file and in the allocation's <job dir>/drained, the file the step server writes on a
#     drain; this shell keeps standing by. Draining is
#     permanent: once promoted, the allocation's step server finds that file and answers
#     every step "drained, exit 0" without starting it (the promotion itself goes ahead);
#   * TERM, INT or HUP that is not the drain signal ends the standby, status 128+N (a
#     cancellation).
# Between the exec and the start script's own traps (a few milliseconds) a signal has its
# default effect.
#
# While it waits, a heartbeat limit acts as a dead-man's switch (see the heartbeat clock):
# once the CONTENT of the supervisors' heartbeat file has not changed for that many seconds
# (this shell's own monotonic clock; the file's mtime is never read), the allocation writes
# "heartbeat" to <job dir>/ended_by and cancels itself.
__sb_start_file=@@{start_file}
__sb_session_dir=@@{session_dir}
__sb_heartbeat_file=@@{heartbeat_file}
__sb_heartbeat_timeout=@@{heartbeat_timeout}
__sb_job=${SLURM_JOB_ID:?the standby runs inside a Slurm allocation}
__sb_job_dir="$__sb_session_dir/jobs/$__sb_job"
__sb_recorded=""

# A drain received so far is written to the allocation's drained file (once).
__sb_record_drain() {
    [ -n "$__ds_drained" ] && [ -z "$__sb_recorded" ] || return 0
    if mkdir -p -- "$__sb_job_dir" && __ds_write_atomic "$__sb_job_dir/drained" "$__ds_drained"
    then
        __sb_recorded=1
        __ds_log "successor allocation $__sb_job drained ($__ds_drained) before its promotion;" \
            "it keeps standing by, and once promoted it starts no step"
    else
        __ds_log "cannot write $__sb_job_dir/drained; trying again"
    fi
}

__hb_start
__ds_log "successor allocation $__sb_job started; waiting for its promotion"
while :; do
    if [ -n "$__ds_cancelled" ]; then
        __ds_log "successor allocation $__sb_job: signal $__ds_cancelled received before its" \
            "promotion; leaving"
        __ds_finish $((128 + $(kill -l "$__ds_cancelled")))
    fi
    __sb_record_drain
    __sb_script=""
    { IFS= read -r __sb_script < "$__sb_start_file"; } 2>/dev/null || :
    if [ -n "$__sb_script" ] && [ -r "$__sb_script" ]; then
        __sb_record_drain
        __ds_log "successor allocation $__sb_job promoted; starting $__sb_script"
        exec "${__ds_payload[@]}" "$__sb_script"
    fi
    if [ -n "$__sb_heartbeat_timeout" ] \
        && __hb_stale "$__sb_heartbeat_file" "$__sb_heartbeat_timeout"; then
        __ds_log "no supervisor heartbeat for $__hb_age s (the heartbeat file's content has" \
            "not changed; limit $__sb_heartbeat_timeout s); cancelling successor $__sb_job"
        mkdir -p -- "$__sb_job_dir" && __ds_write_atomic "$__sb_job_dir/ended_by" "heartbeat"
        scancel "$__sb_job" 2>/dev/null || :
        sleep 30
        __ds_finish 0
    fi
    sleep 0.5 2>/dev/null || sleep 1
done
