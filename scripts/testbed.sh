#!/usr/bin/env bash
# The multi-node test bed: K "nodes" on one machine, each a network namespace with one veth
# into a bridge, so loom sees K nodes (its node identity includes the network namespace) and
# talks TCP between them over real (optionally rate-limited) links. See docs/testbed.md.
#
#   scripts/testbed.sh up K [--rate 1gbit]      build it
#   scripts/testbed.sh down                     remove everything it made (safe when nothing is)
#   scripts/testbed.sh run "M0 M1 ..." [--timeout S] [--logdir DIR] -- CMD ARGS...
#                                               Mi ranks in node i, torchrun's variables
#   scripts/testbed.sh mpirun "M0 M1 ..." [--timeout S] [--recovery] -- CMD ARGS...
#                                               an Open MPI job, Mi ranks in node i (docs/testbed.md)
#   scripts/testbed.sh grid [--perf PATH] [--algos "ring ..."] [--transport ucx|mpi]
#                           [--mpi-prog PATH]   the CI job (ends "N passed, N failed"); --transport
#                                               runs it over LOOM_TRANSPORT=ucx (with UCX_TLS=tcp
#                                               unless set: no shared memory across the nodes) or
#                                               mpi (each case an Open MPI job; --mpi-prog adds
#                                               tests/mpi_prog's grid, stalled and killed ranks)
#   scripts/testbed.sh bench [--perf PATH] [--algos "..."] [--rounds N] [--rate R]   markdown table
#
# Everything needs root and `ip netns`; without them it says so and exits 77 (skipped).
# Safety: the first thing `up` does is add a blackhole route for the test subnet in the root
# namespace, so a packet meant for the bed can never leave the machine. Addresses exist only
# inside namespaces this script made; the root namespace's interfaces are never touched.
set -euo pipefail
shopt -s inherit_errexit

readonly PREFIX=loomtb
readonly BR_NS=loomtb-br            # namespace holding the bridge
readonly BR_DEV=tbbr                # the bridge, inside BR_NS
readonly NODE_IF=veth0              # node-side veth, inside each node namespace
readonly IFNAME_PREFIX=veth         # LOOM_SOCKET_IFNAME: loom binds the veth address, not lo
readonly SUBNET=198.18.7.0/24       # RFC 2544 benchmarking range
readonly NET3=198.18.7              # node I is $NET3.(10+I)
readonly ADDR_BASE=10
readonly MAX_NODES=64
readonly TBF_BURST=256kb
readonly TBF_LATENCY=50ms

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly SELF ROOT_DIR

say() { echo "testbed: $*" >&2; }
die() {
    echo "testbed: error: $*" >&2
    exit 1
}
skip() {
    echo "testbed: SKIP: $*" >&2
    exit 77
}

usage() {
    sed -n '2,18p' "$SELF" | sed 's/^# \{0,1\}//'
}

# int_in VALUE MIN [MAX]: VALUE is a decimal integer within the bounds.
int_in() {
    [[ $1 =~ ^[0-9]{1,9}$ ]] || return 1
    ((10#$1 >= $2)) || return 1
    (($# < 3)) || ((10#$1 <= $3))
}

node_ns() { echo "$PREFIX-node$1"; }
node_addr() { echo "$NET3.$((ADDR_BASE + $1))"; }

# ---- prerequisites ------------------------------------------------------------------------

require_netns() {
    [[ $(id -u) -eq 0 ]] || skip "needs root (it creates network namespaces, veths and a bridge)"
    command -v ip >/dev/null 2>&1 || skip "needs 'ip' (Debian package iproute2)"
    ip netns list >/dev/null 2>&1 || skip "'ip netns' does not work here"
    # A throwaway namespace (gone when the command ends) proves that namespaces, veths and
    # bridges can be made, without leaving anything behind.
    if command -v unshare >/dev/null 2>&1; then
        unshare --net sh -c 'ip link add tbprobe0 type veth peer name tbprobe1 &&
                             ip link add tbprobebr type bridge' >/dev/null 2>&1 ||
            skip "cannot create a network namespace with a veth pair and a bridge here"
    fi
}

require_tc() {
    command -v tc >/dev/null 2>&1 || skip "needs 'tc' for --rate (Debian package iproute2)"
    if command -v unshare >/dev/null 2>&1; then
        unshare --net sh -c "ip link add tbprobe0 type veth peer name tbprobe1 &&
            tc qdisc add dev tbprobe0 root tbf rate 1gbit burst $TBF_BURST latency $TBF_LATENCY" \
            >/dev/null 2>&1 || skip "the tbf qdisc is not available on this kernel"
    fi
}

# ---- the bed ------------------------------------------------------------------------------

# Every namespace named loomtb-* (ours by name), one per line.
tb_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-" || true
}

# How many consecutive node namespaces exist (loomtb-node0, loomtb-node1, ...).
tb_nodes() {
    local all n=0
    all=$(tb_namespaces)
    while grep -qx "$(node_ns "$n")" <<<"$all"; do n=$((n + 1)); done
    echo "$n"
}

has_blackhole() {
    [[ -n $(ip -4 route show exact "$SUBNET" type blackhole 2>/dev/null) ]]
}

# The root namespace's only change: traffic for the test subnet goes nowhere.
add_blackhole() {
    has_blackhole && return 0
    if [[ -n $(ip -4 route show exact "$SUBNET") ]]; then
        die "the root namespace already has a route for $SUBNET that is not a blackhole:" \
            "$(ip -4 route show exact "$SUBNET"); refusing to go on"
    fi
    ip route add blackhole "$SUBNET"
    has_blackhole || die "could not add the blackhole route for $SUBNET"
}

# Runs a command inside a namespace we made; refuses any other namespace.
in_ns() {
    local ns=$1
    shift
    [[ $ns == "$PREFIX"-* ]] || die "internal: refusing to enter namespace '$ns'"
    ip netns exec "$ns" "$@"
}

ns_new() {
    local ns=$1
    ip netns add "$ns"
    if [[ -e /proc/sys/net/ipv6/conf/all/disable_ipv6 ]]; then
        # IPv4 only inside the bed: the veth's one address is the one loom can pick.
        in_ns "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 &&
                           echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6'
    fi
    ip -n "$ns" link set lo up
}

shape() { # ns dev rate
    tc -n "$1" qdisc add dev "$2" root tbf rate "$3" burst "$TBF_BURST" latency "$TBF_LATENCY"
}

bed_up() { # K [rate]
    local k=$1 rate=${2:-} i ns
    add_blackhole # first, before any namespace exists
    [[ -z $(tb_namespaces) ]] ||
        die "a test bed already exists ($(tb_namespaces | tr '\n' ' ')): run '$SELF down' first"
    ns_new "$BR_NS"
    ip -n "$BR_NS" link add "$BR_DEV" type bridge
    ip -n "$BR_NS" link set "$BR_DEV" up
    for ((i = 0; i < k; i++)); do
        ns=$(node_ns "$i")
        ns_new "$ns"
        # The pair is created inside the bridge namespace with its peer placed straight into
        # the node namespace: it never exists in the root namespace.
        ip -n "$BR_NS" link add "tbp$i" type veth peer name "$NODE_IF" netns "$ns"
        ip -n "$BR_NS" link set "tbp$i" master "$BR_DEV"
        ip -n "$BR_NS" link set "tbp$i" up
        ip -n "$ns" addr add "$(node_addr "$i")/24" dev "$NODE_IF"
        ip -n "$ns" link set "$NODE_IF" up
        if [[ -n $rate ]]; then
            shape "$ns" "$NODE_IF" "$rate"  # node -> bridge
            shape "$BR_NS" "tbp$i" "$rate" # bridge -> node
        fi
    done
    # Every node must reach node 0 (the rendezvous) before anyone uses the bed.
    for ((i = 1; i < k; i++)); do
        wait_reachable "$(node_ns "$i")" "$(node_addr 0)"
    done
}

# Waits (up to 10 s) until ns can open a TCP connection attempt to addr and get an answer
# (a refusal counts: it means the path works). Uses bash's /dev/tcp, so needs no ping.
wait_reachable() {
    local ns=$1 addr=$2 t out
    for ((t = 0; t < 100; t++)); do
        # Port 9 (discard) has no listener: a quick "connection refused" proves the path.
        out=$(in_ns "$ns" timeout 1 bash -c "exec 3<>/dev/tcp/$addr/9" 2>&1 || true)
        [[ ${out,,} == *refused* ]] && return 0
        sleep 0.1
    done
    die "$ns cannot reach $addr"
}

# kill_pids PID...: TERM, up to 3 s to go, then KILL.
kill_pids() {
    local pid left t
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((t = 0; t < 30; t++)); do
        left=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left=1; done
        ((left)) || break
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
}

# Kills what runs in our namespaces, removes them and the blackhole route.
teardown() {
    local ns all pid
    local -a pids=()
    all=$(tb_namespaces)
    for ns in $all; do
        while read -r pid; do
            [[ -n $pid ]] && pids+=("$pid")
        done < <(ip netns pids "$ns" 2>/dev/null || true)
    done
    if ((${#pids[@]} > 0)); then
        say "killing ${#pids[@]} process(es) still inside the test bed: ${pids[*]}"
        kill_pids "${pids[@]}"
    fi
    for ns in $all; do
        ip netns del "$ns" || say "could not delete namespace $ns"
    done
    if has_blackhole; then
        ip route del blackhole "$SUBNET" || say "could not delete the blackhole route $SUBNET"
    fi
    [[ -z $(tb_namespaces) ]] || die "namespaces left behind: $(tb_namespaces | tr '\n' ' ')"
}

cmd_up() {
    local k="" rate=""
    while (($#)); do
        case $1 in
        --rate) rate=${2:?--rate needs a value, e.g. 1gbit}; shift 2 ;;
        --rate=*) rate=${1#--rate=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) [[ -z $k ]] || die "up: unexpected argument '$1'"; k=$1; shift ;;
        esac
    done
    int_in "$k" 1 "$MAX_NODES" || die "up: K must be 1..$MAX_NODES"
    require_netns
    [[ -z $rate ]] || require_tc
    # Checked before the cleanup trap is set, so an existing bed is left alone.
    [[ -z $(tb_namespaces) ]] ||
        die "a test bed already exists ($(tb_namespaces | tr '\n' ' ')): run '$SELF down' first"
    trap 'say "up failed: removing what was made"; teardown' EXIT
    bed_up "$k" "$rate"
    trap - EXIT
    say "up: $k node(s) $NET3.$ADDR_BASE..$((ADDR_BASE + k - 1))${rate:+, every link shaped to $rate each way}"
}

cmd_down() {
    require_netns
    teardown
    say "down: no $PREFIX namespace, veth or route left"
}

# ---- run ----------------------------------------------------------------------------------

random_hex() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

# A free port in 20000-40000 inside node 0, outside its ephemeral range (so no listener that
# loom binds to port 0 can take it first).
pick_port() {
    local lo hi p try ns
    ns=$(node_ns 0)
    read -r lo hi < <(in_ns "$ns" cat /proc/sys/net/ipv4/ip_local_port_range)
    for ((try = 0; try < 200; try++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 20001))
        ((p >= lo && p <= hi)) && continue
        if command -v ss >/dev/null 2>&1 &&
            [[ -n $(in_ns "$ns" ss -Htan "( sport = :$p )" 2>/dev/null) ]]; then
            continue
        fi
        echo "$p"
        return 0
    done
    die "no free port in 20000-40000 outside node 0's ephemeral range $lo-$hi"
}

# parse_layout CMD "M0 M1 ...": LAYOUT (the counts) and LAYOUT_WORLD (their sum), checked
# against the nodes that are up.
declare -a LAYOUT=()
LAYOUT_WORLD=0
parse_layout() {
    local cmd=$1 layout=$2 m have
    read -ra LAYOUT <<<"$layout"
    ((${#LAYOUT[@]} >= 1)) || die "$cmd: empty layout"
    LAYOUT_WORLD=0
    for m in "${LAYOUT[@]}"; do
        int_in "$m" 1 || die "$cmd: layout '$layout': each entry must be a count >= 1"
        LAYOUT_WORLD=$((LAYOUT_WORLD + m))
    done
    have=$(tb_nodes)
    ((${#LAYOUT[@]} <= have)) ||
        die "$cmd: layout '$layout' needs ${#LAYOUT[@]} node(s), the bed has $have" \
            "(run '$SELF up ${#LAYOUT[@]}' first)"
}

# Process groups of the ranks still running (each rank is a session leader via setsid).
declare -a RUN_PIDS=()
RUN_TMP_LOGDIR="" # removed if the run is interrupted
kill_ranks() {
    local pid
    ((${#RUN_PIDS[@]})) || return 0
    for pid in "${RUN_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    sleep 1
    for pid in "${RUN_PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}

cmd_run() {
    local layout="" timeout=300 logdir="" keep=0
    while (($#)); do
        case $1 in
        --) shift; break ;;
        --timeout) timeout=${2:?}; shift 2 ;;
        --logdir) logdir=${2:?}; keep=1; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) [[ -z $layout ]] || die "run: unexpected argument '$1' (put the command after --)"
           layout=$1; shift ;;
        esac
    done
    (($#)) || die "run: no command (usage: run \"M0 M1 ...\" -- CMD ARGS...)"
    [[ -n $layout ]] || die "run: no layout (e.g. \"2 2\")"
    int_in "$timeout" 1 || die "run: --timeout wants seconds"
    require_netns

    parse_layout run "$layout"
    local -a per_node=("${LAYOUT[@]}")
    local nnodes=${#per_node[@]} world=$LAYOUT_WORLD i

    if [[ -z $logdir ]]; then logdir=$(mktemp -d /tmp/loomtb-run.XXXXXX); fi
    mkdir -p "$logdir"
    RUN_TMP_LOGDIR=""
    ((keep)) || RUN_TMP_LOGDIR=$logdir
    local port secret
    port=$(pick_port)
    secret=$(random_hex)

    trap 'kill_ranks; [[ -z $RUN_TMP_LOGDIR ]] || rm -rf "$RUN_TMP_LOGDIR"' EXIT
    trap 'say "interrupted: killing the ranks"; exit 130' INT
    trap 'exit 143' TERM

    local -a rank_node=() rank_local=()
    local rank=0 l ns
    for ((i = 0; i < nnodes; i++)); do
        ns=$(node_ns "$i")
        for ((l = 0; l < per_node[i]; l++)); do
            local -a env_args=(
                "RANK=$rank" "WORLD_SIZE=$world" "LOCAL_RANK=$l" "LOCAL_WORLD_SIZE=${per_node[i]}"
                "MASTER_ADDR=$(node_addr 0)" "MASTER_PORT=$port" "LOOM_JOB_SECRET=$secret"
                "LOOM_SOCKET_IFNAME=$IFNAME_PREFIX" "LOOM_TIMEOUT=${LOOM_TIMEOUT:-20}")
            # setsid: each rank leads its own process group, so a timeout kills all it started.
            # The other launch styles' variables are removed so torchrun's are the ones used.
            if ((rank == 0)); then
                setsid ip netns exec "$ns" env -u LOOM_RANK -u LOOM_WORLD_SIZE -u LOOM_ID_FILE \
                    -u LOOM_NODE_ID "${env_args[@]}" "$@" </dev/null 2>"$logdir/rank0.log" &
            else
                setsid ip netns exec "$ns" env -u LOOM_RANK -u LOOM_WORLD_SIZE -u LOOM_ID_FILE \
                    -u LOOM_NODE_ID "${env_args[@]}" "$@" </dev/null >"$logdir/rank$rank.log" 2>&1 &
            fi
            RUN_PIDS[rank]=$!
            rank_node[rank]=$i
            rank_local[rank]=$l
            rank=$((rank + 1))
        done
    done

    # Poll: `wait PID` on a finished rank gives its status. After the first failure the others
    # get LOOM_TIMEOUT + 10 s to fail by themselves (naming the dead peer), then are killed.
    local lt=${LOOM_TIMEOUT:-20}
    lt=${lt%%.*}
    [[ $lt =~ ^[0-9]+$ ]] || lt=20
    local deadline=$((SECONDS + timeout)) grace=$((lt + 10)) failed_any=-1 cut=0
    local timed_out=0 rc r
    local -a status=() live=()
    for ((r = 0; r < world; r++)); do live+=("$r"); done
    while ((${#live[@]})); do
        local -a still=()
        for r in "${live[@]}"; do
            if kill -0 "${RUN_PIDS[r]}" 2>/dev/null; then
                still+=("$r")
            else
                rc=0
                wait "${RUN_PIDS[r]}" || rc=$?
                status[r]=$rc
                if ((rc != 0 && failed_any < 0)); then
                    failed_any=$r
                    ((SECONDS + grace < deadline)) && deadline=$((SECONDS + grace)) && cut=1
                fi
            fi
        done
        live=("${still[@]}")
        ((${#live[@]})) || break
        if ((SECONDS >= deadline)); then
            timed_out=1
            break
        fi
        sleep 0.2
    done
    if ((timed_out)); then
        local -a stuck=()
        local pid
        for r in "${live[@]}"; do
            stuck+=("${RUN_PIDS[r]}")
            status[r]=timeout
        done
        RUN_PIDS=("${stuck[@]}")
        kill_ranks
        for pid in "${stuck[@]}"; do wait "$pid" 2>/dev/null || true; done
    fi
    RUN_PIDS=()
    trap - EXIT INT TERM

    local -a bad=()
    for ((r = 0; r < world; r++)); do
        [[ ${status[r]} == 0 ]] || bad+=("$r")
    done
    if ((${#bad[@]} == 0)); then
        ((keep)) || rm -rf "$logdir"
        return 0
    fi
    local why
    for r in "${bad[@]}"; do
        case ${status[r]} in
        timeout) if ((cut)); then why="still running ${grace}s after rank $failed_any failed: killed"
                 else why="still running at the overall timeout (${timeout}s): killed"; fi ;;
        *) if ((status[r] > 128)); then why="killed by signal $((status[r] - 128))"
           else why="exit code ${status[r]}"; fi ;;
        esac
        say "rank $r (node ${rank_node[r]}, local rank ${rank_local[r]}) failed: $why"
        tail -n 4 "$logdir/rank$r.log" 2>/dev/null | sed 's/^/    | /' >&2 || true
    done
    local list
    list=$(IFS=,; echo "${bad[*]}")
    say "FAILED: rank(s) $list of $world; logs in $logdir"
    exit 1
}

# ---- mpirun -------------------------------------------------------------------------------
# Open MPI's mpirun runs inside node 0. Its hostfile names the nodes by their bed addresses, and
# its rsh launcher's "remote shell" (plm_rsh_agent) is this script's ns-exec, which runs the
# daemon (orted) that ssh would have started inside the node's namespace. MPI's own traffic is
# held to the veths: ob1 with the tcp and self BTLs (no shared memory, no UCX, which would reach
# across the namespaces of one kernel), the BTL and the runtime's out-of-band channel on veth0.

# The node of a bed address ($NET3.(10+I) -> I), when that node is up.
addr_node() {
    local last i
    [[ $1 == "$NET3".* ]] || return 1
    last=${1#"$NET3".}
    [[ $last =~ ^[0-9]{1,3}$ ]] || return 1
    i=$((10#$last - ADDR_BASE))
    ((i >= 0 && i < $(tb_nodes))) || return 1
    echo "$i"
}

# ns-exec ADDRESS COMMAND...: the command line mpirun's launcher would hand to ssh, run by sh
# inside the namespace of the node with that address (and no other).
cmd_ns_exec() {
    (($# >= 2)) || die "ns-exec: usage: ns-exec NODE_ADDRESS COMMAND..."
    local host=$1 i ns
    shift
    i=$(addr_node "$host") || die "ns-exec: '$host' is not the address of a node of the test bed"
    ns=$(node_ns "$i")
    [[ $ns == "$PREFIX"-* ]] || die "internal: refusing to enter namespace '$ns'"
    # the node's own temporary directory for the daemon's session files (cmd_mpirun)
    if [[ -n ${LOOMTB_MPIRUN_DIR:-} && -d $LOOMTB_MPIRUN_DIR/node$i ]]; then
        export TMPDIR=$LOOMTB_MPIRUN_DIR/node$i
    fi
    exec ip netns exec "$ns" /bin/sh -c "$*"
}

# Open MPI's mpirun (Debian's alternatives may make `mpirun` MPICH's).
find_ompi_mpirun() {
    local m
    for m in mpirun.openmpi mpirun; do
        command -v "$m" >/dev/null 2>&1 || continue
        "$m" --version 2>/dev/null | grep -q 'Open MPI' || continue
        command -v "$m"
        return 0
    done
    return 1
}

# Every process of an mpirun job carries LOOMTB_MPIRUN=<its token> (mpirun has it, the daemons
# its launcher starts and the ranks they start inherit it): the ones still inside the bed.
job_pids() {
    local token=$1 i pid
    for ((i = 0; i < $(tb_nodes); i++)); do
        while read -r pid; do
            [[ -n $pid ]] || continue
            tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "LOOMTB_MPIRUN=$token" &&
                echo "$pid"
        done < <(ip netns pids "$(node_ns "$i")" 2>/dev/null || true)
    done
    return 0
}

cmd_mpirun() {
    local layout="" timeout=300 recovery=0
    while (($#)); do
        case $1 in
        --) shift; break ;;
        --timeout) timeout=${2:?}; shift 2 ;;
        --recovery) recovery=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) [[ -z $layout ]] || die "mpirun: unexpected argument '$1' (put the command after --)"
           layout=$1; shift ;;
        esac
    done
    (($#)) || die "mpirun: no command (usage: mpirun \"M0 M1 ...\" -- CMD ARGS...)"
    [[ -n $layout ]] || die "mpirun: no layout (e.g. \"2 2\")"
    int_in "$timeout" 1 || die "mpirun: --timeout wants seconds"
    require_netns
    local mpirun
    mpirun=$(find_ompi_mpirun) || skip "needs Open MPI's mpirun (Debian package openmpi-bin)"
    [[ $SELF != *[[:space:]]* ]] || die "mpirun: the path of this script has a blank: $SELF"
    parse_layout mpirun "$layout"
    local -a per_node=("${LAYOUT[@]}")
    local world=$LAYOUT_WORLD i dir token v
    dir=$(mktemp -d /tmp/loomtb-mpirun.XXXXXX)
    token=$(random_hex)
    for ((i = 0; i < ${#per_node[@]}; i++)); do
        echo "$(node_addr "$i") slots=${per_node[i]}"
        mkdir "$dir/node$i"
    done >"$dir/hostfile"

    # The ranks meet through the launcher (PMIx, or MPI): torchrun's and loom's own launch
    # variables would take precedence, so none of them passes.
    unset LOOM_RANK LOOM_WORLD_SIZE LOOM_ID_FILE LOOM_NODE_ID LOOM_JOB_SECRET RANK WORLD_SIZE \
        LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
    export LOOM_SOCKET_IFNAME=$IFNAME_PREFIX LOOM_TIMEOUT=${LOOM_TIMEOUT:-20}
    # --map-by slot: ranks numbered node by node, as `run` does
    local -a cmd=("$mpirun" --hostfile "$dir/hostfile" -np "$world" --map-by slot --bind-to none
        --mca plm_rsh_agent "$SELF ns-exec" --mca rtc_hwloc_vmhole none --mca pml ob1 --mca btl tcp,self
        --mca btl_tcp_if_include "$NODE_IF" --mca oob_tcp_if_include "$NODE_IF")
    ((recovery)) && cmd+=(--enable-recovery)
    # mpirun passes its environment only to the ranks of node 0: the variables for loom, UCX
    # and the test programs go to every rank.
    for v in $(compgen -e); do
        case $v in LOOM_* | UCX_* | MPI_PROG_*) cmd+=(-x "$v") ;; esac
    done

    local pid=""
    trap '[[ -z $pid ]] || kill -TERM "$pid" 2>/dev/null; kill_pids $(job_pids "$token"); rm -rf "$dir"' EXIT
    trap 'say "interrupted: killing the job"; exit 130' INT
    trap 'exit 143' TERM
    local rc=0 left
    # TMPDIR: each node's daemon keeps its session directory in the job's directory for that
    # node (ns-exec sets it for the others), removed after the job: the daemons share one host
    # name and one /tmp, and two starting at once raced to make the same directory ("mkdir ...
    # File exists", the daemon gone).
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LOOMTB_MPIRUN=$token \
        LOOMTB_MPIRUN_DIR=$dir TMPDIR=$dir/node0 \
        timeout -k 10 "$timeout" ip netns exec "$(node_ns 0)" "${cmd[@]}" "$@" </dev/null &
    pid=$!
    wait "$pid" || rc=$?
    pid=""
    ((rc != 124 && rc != 137)) || say "mpirun still running at the timeout (${timeout}s): killed"
    left=$(job_pids "$token")
    if [[ -n $left ]]; then
        say "killing $(wc -w <<<"$left") process(es) of the job left inside the bed: $(echo $left)"
        kill_pids $left
    fi
    trap - EXIT INT TERM
    rm -rf "$dir"
    return "$rc"
}

# ---- grid and bench -----------------------------------------------------------------------

take_lock() {
    local dir=/run
    [[ -d $dir && -w $dir ]] || dir=/tmp
    exec 9>"$dir/loomtb.lock"
    flock -n 9 || die "another testbed grid or bench is running (lock $dir/loomtb.lock)"
}

find_perf() {
    local perf=${1:-$ROOT_DIR/build/loom-perf}
    [[ -x $perf ]] || die "no loom-perf at $perf (build with 'ninja -C build', or pass --perf PATH)"
    (cd "$(dirname "$perf")" && echo "$PWD/$(basename "$perf")")
}

clean_leftovers() {
    if [[ -n $(tb_namespaces) ]] || has_blackhole; then
        say "removing a test bed left from an earlier run"
        teardown
    fi
}

GRID_PASS=0
GRID_FAIL=0
GRID_DIR=""
GRID_MPI=0 # --transport mpi: every case is an Open MPI job (`mpirun`)
MPI_PROG=""

# mpi_case LAYOUT LABEL WANT PATTERN [mpirun options] -- CMD ARGS...: one job started by
# `mpirun`; passes when it exits 0 and WANT lines of its output match the extended regular
# expression PATTERN.
mpi_case() {
    local layout=$1 label=$2 want=$3 pat=$4
    shift 4
    local dir rc=0 t0 t1 secs got
    dir=$GRID_DIR/case$((GRID_PASS + GRID_FAIL))
    mkdir -p "$dir"
    t0=$EPOCHREALTIME
    "$SELF" mpirun "$layout" --timeout 180 "$@" >"$dir/out" 2>&1 9>&- || rc=$?
    t1=$EPOCHREALTIME
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    got=$(grep -cE -- "$pat" "$dir/out" || true)
    if ((rc == 0)) && [[ $got == "$want" ]]; then
        GRID_PASS=$((GRID_PASS + 1))
        printf 'PASS  %-8s %-57s %6ss\n' "[$layout]" "$label" "$secs"
        rm -rf "$dir"
        return 0
    fi
    GRID_FAIL=$((GRID_FAIL + 1))
    printf 'FAIL  %-8s %-57s %6ss  (exit %d, %s of %s lines; logs: %s)\n' "[$layout]" "$label" \
        "$secs" "$rc" "$got" "$want" "$dir"
    grep -v -E -- "$pat" "$dir/out" | head -n 12 | cut -c1-240 | sed 's/^/      /'
    return 1
}

# Bytes node I's veth received.
veth_rx() {
    in_ns "$(node_ns "$1")" cat "/sys/class/net/$NODE_IF/statistics/rx_bytes"
}

# The mpi transport's own cases (grid --transport mpi --mpi-prog PATH) in the 2-node bed:
# tests/mpi_prog's collective grid bit for bit in each layout, the bytes that crossed node 1's
# veth, and a stopped and a killed rank named by the others.
mpi_prog_cases() {
    local layout np rx0 rx1 need
    for layout in "1 1" "2 2" "3 1"; do
        np=$((${layout// /+}))
        mpi_case "$layout" "mpi_prog grid (every collective, type, op)" "$np" \
            "^mpi_prog: rank [0-9]+ of $np: grid ok \\([0-9]+ checks\\)$" -- "$MPI_PROG" grid ||
            true
    done
    # MPI's messages go over the links, not through memory: 2 x (1 + 2) allreduces of 4 MiB
    # (out of place and in place, warm-up and timed) each bring node 1 at least 4 MiB.
    need=$((2 * 3 * 4194304))
    rx0=$(veth_rx 1)
    if mpi_case "1 1" "loom-perf 4 MiB: node 1's veth received >= $need B" 1 \
        '^# Out of bounds values : 0 OK' -- "$PERF" -b 4M -e 4M -n 2 -w 1 -c 1; then
        rx1=$(veth_rx 1)
        if ((rx1 - rx0 < need)); then
            GRID_PASS=$((GRID_PASS - 1))
            GRID_FAIL=$((GRID_FAIL + 1))
            echo "FAIL  [1 1]    node 1's veth received $((rx1 - rx0)) B during the job, less than $need B:" \
                "MPI's messages did not cross the link"
        else
            echo "      node 1's veth received $((rx1 - rx0)) B"
        fi
    fi
    # A stopped rank (SIGSTOP, in node 1 beside rank 2) and a killed one (SIGKILL, alone in
    # node 1): the others name it in the same words as over tcp. (The killed rank is alone in its
    # node because Open MPI 4.1's mpirun --enable-recovery never ends a job in which a rank
    # exits beside a killed one under another node's daemon, orted: every rank gone, it waits.)
    LOOM_TIMEOUT=2 mpi_case "2 2" "a stalled rank (SIGSTOP) is named; continued, it fails" 4 \
        "^mpi_prog: rank (3 of 4: stalled rank failed too: |[0-2] of 4: stall ok: .*allreduce seq 1 \\(count 65536, float32, sum\\): no progress from rank 3 \\(MPI rank 3 [^)]+\\) for [0-9.]+ s \\(LOOM_TIMEOUT=2\\) while (sending to|receiving from) it; the peer is stalled or dead)" \
        -- "$MPI_PROG" stall || true
    # PMIX_MCA_plog=stdfd: the ranks' MPI help messages ("peer hung up") are not handed up to
    # Open MPI's daemons, whose handler of them (pmix_server_log_fn) crashed mpirun here about
    # one job in five in this case, taking the survivors with it.
    PMIX_MCA_plog=stdfd LOOM_TIMEOUT=2 mpi_case "3 1" "a killed rank (SIGKILL) is named" 3 \
        "^mpi_prog: rank [0-2] of 4: kill ok: ((.*: )?rank 3 \\([^)]*pid [0-9]+\\) died during (allreduce seq 1 |the job, while this rank was outside calls)|.*allreduce seq 1 .*rank 3 \\()" \
        --recovery -- "$MPI_PROG" kill || true
}

# One grid combination: layout, algo ("auto" = LOOM_ALGO unset), label, loom-perf arguments.
grid_case() {
    local layout=$1 algo=$2 label=$3
    shift 3
    local dir rc=0 t0 t1 secs
    dir=$GRID_DIR/case$((GRID_PASS + GRID_FAIL))
    mkdir -p "$dir"
    # torchrun's way (`run`), or one Open MPI job (`mpirun`: the ranks' output in its own)
    local -a how=(run "$layout" --timeout 120 --logdir "$dir")
    ((GRID_MPI == 0)) || how=(mpirun "$layout" --timeout 120)
    t0=$EPOCHREALTIME
    if [[ $algo == auto ]]; then
        env -u LOOM_ALGO "$SELF" "${how[@]}" -- "$PERF" "$@" \
            >"$dir/stdout" 2>"$dir/stderr" 9>&- || rc=$?
    else
        LOOM_ALGO=$algo "$SELF" "${how[@]}" -- "$PERF" "$@" \
            >"$dir/stdout" 2>"$dir/stderr" 9>&- || rc=$?
    fi
    t1=$EPOCHREALTIME
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    if ((rc == 0)) && grep -q '^# Out of bounds values : 0 OK' "$dir/stdout"; then
        GRID_PASS=$((GRID_PASS + 1))
        printf 'PASS  %-8s LOOM_ALGO=%-12s %-34s %6ss\n' "[$layout]" "$algo" "$label" "$secs"
        rm -rf "$dir"
    else
        GRID_FAIL=$((GRID_FAIL + 1))
        printf 'FAIL  %-8s LOOM_ALGO=%-12s %-34s %6ss  (logs: %s)\n' "[$layout]" "$algo" \
            "$label" "$secs" "$dir"
        head -n 12 "$dir/stderr" | cut -c1-240 | sed 's/^/      /'
        grep -m1 '^# Out of bounds' "$dir/stdout" | sed 's/^/      /' || true
    fi
}

cmd_grid() {
    local perf="" algos="ring hier hier_leader ps auto" transport=""
    while (($#)); do
        case $1 in
        --perf) perf=${2:?}; shift 2 ;;
        --algos) algos=${2:?}; shift 2 ;;
        --transport) transport=${2:?}; shift 2 ;;
        --mpi-prog) MPI_PROG=${2:?}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "grid: unexpected argument '$1'" ;;
        esac
    done
    require_netns
    PERF=$(find_perf "$perf")
    if [[ -n $transport ]]; then
        export LOOM_TRANSPORT=$transport
        # The nodes share one kernel: UCX would reach across them through shared memory.
        [[ $transport != ucx ]] || export UCX_TLS=${UCX_TLS:-tcp}
    fi
    if [[ $transport == mpi ]]; then
        GRID_MPI=1
        find_ompi_mpirun >/dev/null ||
            die "grid: --transport mpi needs Open MPI's mpirun (Debian package openmpi-bin)"
    fi
    if [[ -n $MPI_PROG ]]; then
        ((GRID_MPI)) || die "grid: --mpi-prog goes with --transport mpi"
        [[ -x $MPI_PROG ]] || die "grid: no mpi_prog at $MPI_PROG"
        MPI_PROG=$(cd "$(dirname "$MPI_PROG")" && echo "$PWD/$(basename "$MPI_PROG")")
    fi
    take_lock
    clean_leftovers
    GRID_DIR=$(mktemp -d /tmp/loomtb-grid.XXXXXX)
    trap 'teardown' EXIT
    trap 'say "interrupted"; exit 130' INT
    trap 'exit 143' TERM

    local start=$SECONDS nnodes layout algo
    local -a layouts
    echo "# testbed grid: loom-perf allreduce, exact check; $PERF${transport:+; LOOM_TRANSPORT=$transport}${transport:+${UCX_TLS:+ UCX_TLS=$UCX_TLS}}"
    ((GRID_MPI == 0)) || echo "# every case one Open MPI job (mpirun in node 0, ob1 + tcp BTL on $NODE_IF)${MPI_PROG:+; mpi_prog: $MPI_PROG}"
    for nnodes in 2 3; do
        [[ -z $(tb_namespaces) ]] || teardown
        bed_up "$nnodes"
        echo "# $nnodes nodes up"
        if ((nnodes == 2)); then layouts=("1 1" "2 2" "3 1" "1 3"); else layouts=("2 1 2" "2 2 2"); fi
        for layout in "${layouts[@]}"; do
            for algo in $algos; do
                grid_case "$layout" "$algo" "float sum 8B..4M x8" \
                    -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
            done
            if [[ $layout == "2 1 2" ]]; then
                for algo in $algos; do
                    grid_case "$layout" "$algo" "1K every type x every op" \
                        -b 1K -e 1K -d all -o all -n 1 -w 1 -c 1
                done
            fi
        done
        if ((nnodes == 2)) && [[ -n $MPI_PROG ]]; then mpi_prog_cases; fi
    done
    teardown
    trap - EXIT
    if ((GRID_FAIL == 0)); then rm -rf "$GRID_DIR"; fi
    echo "# grid took $((SECONDS - start)) s"
    echo "$GRID_PASS passed, $GRID_FAIL failed"
    ((GRID_FAIL == 0))
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1;
    if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

cmd_bench() {
    local perf="" algos="hier ring hier_leader ps" rounds=3 rate=1gbit
    while (($#)); do
        case $1 in
        --perf) perf=${2:?}; shift 2 ;;
        --algos) algos=${2:?}; shift 2 ;;
        --rounds) rounds=${2:?}; shift 2 ;;
        --rate) rate=${2:?}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "bench: unexpected argument '$1'" ;;
        esac
    done
    int_in "$rounds" 1 || die "bench: --rounds wants a count >= 1"
    require_netns
    require_tc
    PERF=$(find_perf "$perf")
    take_lock
    clean_leftovers
    local dir
    dir=$(mktemp -d /tmp/loomtb-bench.XXXXXX)
    trap 'teardown' EXIT
    trap 'say "interrupted"; exit 130' INT
    trap 'exit 143' TERM
    bed_up 2 "$rate"

    local size=67108864 layout algo round t rc
    local -a layouts=("2 2" "4 4")
    declare -A med=()
    for layout in "${layouts[@]}"; do
        for algo in $algos; do
            local times=""
            for ((round = 1; round <= rounds; round++)); do
                rc=0
                LOOM_ALGO=$algo "$SELF" run "$layout" --timeout 600 -- "$PERF" \
                    -b 64M -e 64M -n 3 -w 1 -c 1 >"$dir/out" 2>"$dir/err" 9>&- || rc=$?
                t=""
                if ((rc == 0)); then
                    t=$(awk -v s="$size" '$1 == s { print $6; exit }' "$dir/out")
                fi
                if [[ -z $t ]]; then
                    say "[$layout] $algo round $round: FAILED"
                    sed 's/^/    /' "$dir/err" | head -n 6 >&2
                    times=""
                    break
                fi
                say "[$layout] $algo round $round: $t us"
                times+="$t"$'\n'
            done
            if [[ -n $times ]]; then
                med["$layout/$algo"]=$(printf '%s' "$times" | median)
            else
                med["$layout/$algo"]=failed
            fi
        done
    done
    teardown
    trap - EXIT
    rm -rf "$dir"

    # Markdown: one row per layout, median time per algorithm, and ring/hier.
    local hdr="| layout (nodes x ranks) |" sep="|---|" m v cell ratio
    for algo in $algos; do hdr+=" $algo |"; sep+="---:|"; done
    echo "Allreduce of 64 MiB float sum, $rate per link each way (tbf), 2 nodes as network" \
        "namespaces on one host ($(nproc) cores, kernel $(uname -r)); median over $rounds" \
        "rounds of loom-perf -n 3 -w 1 -c 1 (out-of-place time per iteration)."
    echo
    echo "$hdr ring/hier |"
    echo "$sep---:|"
    for layout in "${layouts[@]}"; do
        m=${layout%% *}
        local row="| 2x$m ($layout) |"
        for algo in $algos; do
            v=${med["$layout/$algo"]}
            if [[ $v == failed ]]; then
                cell="failed"
            else
                cell=$(awk -v t="$v" -v s="$size" -v p=$((2 * m)) 'BEGIN {
                    printf "%.1f ms (busbw %.3f GB/s)", t / 1000, s / t / 1000 * 2 * (p - 1) / p }')
            fi
            row+=" $cell |"
        done
        ratio="n/a"
        if [[ ${med["$layout/ring"]:-failed} != failed && ${med["$layout/hier"]:-failed} != failed ]]; then
            ratio=$(awk -v r="${med["$layout/ring"]}" -v h="${med["$layout/hier"]}" \
                'BEGIN { printf "%.2f", r / h }')
        fi
        echo "$row $ratio |"
    done
}

# ---- main ---------------------------------------------------------------------------------

main() {
    local cmd=${1:-}
    (($#)) && shift
    case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    run) cmd_run "$@" ;;
    mpirun) cmd_mpirun "$@" ;;
    ns-exec) cmd_ns_exec "$@" ;;
    grid) cmd_grid "$@" ;;
    bench) cmd_bench "$@" ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
    esac
}

main "$@"
