@@{prologue}
# Bash launcher: the setup lines, then the payload, once, on this host.
__ds_pre_start=@@{pre_start}
set +u
eval "$__ds_pre_start"
set -u

__ds_skip_if_signalled
__ds_run_payload "${__ds_payload[@]}"
__ds_finish "$__ds_rc"
