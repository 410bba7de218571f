# The value of key $3 in the last line of file $1 that starts with $2 (or holds ": $2", a
# line a logger prefixed), as 'key=value' words after $2; status 1 when there is none yet.
# Marker lines are how a node's own script reports its address, ports and state to the
# job script that started it.
__ds_marker_value() {
    local line found="" word
    local -a words
    while IFS= read -r line; do
        case $line in
            "$2"* | *": $2"*) found=${line#*"$2"} ;;
        esac
    done < "$1"
    [ -n "$found" ] || return 1
    read -r -a words <<< "$found"
    for word in "${words[@]}"; do
        case $word in
            "$3="*) printf '%s\n' "${word#*=}" && return 0 ;;
        esac
    done
    return 1
}
