# bash completion for rsock(1) — written by hand from the CLI's usage texts
# (src/bin/rsock.rs, src/bin/rsock/run.rs, src/bin/rsock/stat.rs); keep them in step.
# Installed to $(PREFIX)/share/bash-completion/completions/rsock.

_rsock_run() {
    local cur=$1 prev=$2 i=$3
    # The first word after the options (or after --) is PROGRAM: from there on, complete
    # as for that command.
    local j=2 w
    while ((j < COMP_CWORD)); do
        w=${COMP_WORDS[j]}
        case $w in
            --) ((j++)); break ;;
            --log | --log-level | --exclude | --config | --spin-us) ((j += 2)); continue ;;
            -*) ((j++)); continue ;;
            *) break ;;
        esac
    done
    if ((j < COMP_CWORD)) || { ((j == COMP_CWORD)) && [[ ${COMP_WORDS[j-1]} == -- ]]; }; then
        if ((j < COMP_CWORD)) && declare -F _command_offset >/dev/null; then
            _command_offset "$j"
        elif ((j == COMP_CWORD)); then
            mapfile -t COMPREPLY < <(compgen -c -- "$cur")
        else
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
        return
    fi
    case $prev in
        --log | --config)
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
            return ;;
        --log-level)
            mapfile -t COMPREPLY < <(compgen -W 'off error warn info debug trace' -- "$cur")
            return ;;
        --exclude | --spin-us)
            return ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W '--log --log-level --exclude --config --spin-us
            --no-rdma --help -h --' -- "$cur")
    else
        mapfile -t COMPREPLY < <(compgen -c -- "$cur")
    fi
}

_rsock_stat() {
    local cur=$1 prev=$2
    case $prev in
        --dir)
            mapfile -t COMPREPLY < <(compgen -d -- "$cur")
            return ;;
        --watch | --count)
            [[ $cur == -* ]] || return ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W '--dir --all --json --openmetrics --gc --watch --count
            --help -h' -- "$cur")
    else
        # PIDs of this user's processes with a stats file.
        local d=${RSOCK_STATS_DIR:-/dev/shm/rsock-$(id -u)} f pids=()
        for f in "$d"/*.stats; do
            [[ -e $f ]] || continue
            f=${f##*/}
            pids+=("${f%.stats}")
        done
        mapfile -t COMPREPLY < <(compgen -W "${pids[*]}" -- "$cur")
    fi
}

_rsock() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    COMPREPLY=()
    if ((COMP_CWORD == 1)); then
        mapfile -t COMPREPLY < <(compgen -W 'run stat rules check help --help -h --version -V' -- "$cur")
        return
    fi
    case ${COMP_WORDS[1]} in
        run) _rsock_run "$cur" "$prev" ;;
        stat) _rsock_stat "$cur" "$prev" ;;
        rules)
            if [[ $cur == -* ]]; then
                mapfile -t COMPREPLY < <(compgen -W '--explain --prog --server --help -h' -- "$cur")
            elif [[ $prev == --explain || $prev == --prog ]]; then
                :
            else
                mapfile -t COMPREPLY < <(compgen -f -- "$cur")
            fi ;;
        check)
            [[ $cur == -* ]] && mapfile -t COMPREPLY < <(compgen -W '--help -h' -- "$cur") ;;
        help)
            ((COMP_CWORD == 2)) && mapfile -t COMPREPLY < <(compgen -W 'run stat rules check help' -- "$cur") ;;
    esac
}
complete -F _rsock rsock
