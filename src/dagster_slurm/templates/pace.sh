# -- pace (templates/pace.sh, included) -------------------------------------------------------
# A script's fixed intervals stay as written on a real cluster. The unit tests, which run
# the scripts on one machine in real time, shorten them through environment variables that
# a real job never has (__DS_SS_* for the step server, __DS_DW_* for a worker allocation):
# '__ds_pace NAME VALUE' sets variable NAME to VALUE when VALUE is a whole number (no leading
# zero), and with a third argument 'decimal' also when it is a decimal number such as 0.2
# (for sleep); an empty or other VALUE leaves NAME as it is.
__ds_pace() {
    case $2 in
        '' | 0[0-9]* | *[!0-9.]* | *.*.* | .) return 0 ;;
        *.*) [ "${3-}" = decimal ] || return 0 ;;
    esac
    printf -v "$1" '%s' "$2"
}
# -- end of the pace --------------------------------------------------------------------------
