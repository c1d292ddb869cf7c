#!/usr/bin/env bash
# A SLURM cluster of this one host, with accounting, for trying and testing the cluster path (docs/guide/sweeps.md):
#   tools/slurm/local_cluster.sh up       install what is missing (Debian packages), configure, start, wait idle
#   tools/slurm/local_cluster.sh status   the daemons it started and sinfo's answer
#   tools/slurm/local_cluster.sh down     stop exactly the daemons it started, by their pid files
#   tools/slurm/local_cluster.sh env      the line to source so that sbatch, squeue and sacct find this cluster
# Debian 12's Slurm 22.05 (slurmctld, slurmd, slurmdbd), munge and MariaDB, each run with its own files under
# $TKVISION_SLURM_DIR (default /tmp/tkvision-slurm): configuration, pid files, logs, state, the database. Nothing
# under /etc is written, no system service is started or stopped. Clients read $SLURM_CONF (`eval "$(... env)"`).
# Two slurmd on this host (nodes `hostname -s` and localhost, ports 6818 and 6828) make a 2-node job real. Processes, not
# GPUs: each node also declares 8 GPUs whose device files are null devices, so a script's --gpus-per-node line is
# accepted; the jobs train on the CPU. Needs root (the daemons run as root: SlurmUser=root).
# Running `up` twice is harmless; a daemon that fails to start is named with its log.
set -euo pipefail

DIR=${TKVISION_SLURM_DIR:-/tmp/tkvision-slurm}
CLUSTER=tkvision
CTLD_PORT=${TKVISION_SLURM_PORT:-6817}
DBD_PORT=$((CTLD_PORT + 2))
DB_PORT=$((CTLD_PORT + 3))
HOST=$(hostname -s)
# two nodes of this host, each a name that resolves here (a job's first node is its rendezvous address)
NODES=("$HOST" localhost)
PACKAGES=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server)
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

say() { echo "local_cluster: $*"; }
fail() { echo "local_cluster: $*" >&2; exit 1; }

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing ${missing[*]}"
    # policy-rc.d keeps the packages' own services from starting: this script starts its own daemons
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    $SUDO rm -f /usr/sbin/policy-rc.d
}

write_config() {
    mkdir -p "$DIR"/{run,log,state,spool,munge,mysql}
    chmod 700 "$DIR/munge"
    local cpus mem
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))  # each node claims half: two share the host
    cat >"$DIR/slurm.conf" <<EOF
# Written by tools/slurm/local_cluster.sh for host $HOST: a one-host cluster of two nodes.
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
AuthType=auth/munge
# cred_expire: a requeued job waits this long before it may start again (slurm.conf(5); 120 s by default, most of a
# requeue test's time here); 30 s still covers a step's launch on two busy cores
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=30
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# no cgroup delegation in CI: processes are tracked by their parentage
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
JobRequeue=1
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# to slurmdbd, the munge socket is given here (AuthInfo is for the other daemons)
AccountingStoragePass=$DIR/munge/munge.socket
AccountingStorageTRES=gres/gpu
NodeName=${NODES[0]} NodeHostname=$HOST Port=$((CTLD_PORT + 1)) CPUs=$cpus RealMemory=$mem Gres=gpu:8 State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$HOST Port=$((CTLD_PORT + 11)) CPUs=$cpus RealMemory=$mem Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    # stand-in GPU devices: null character devices (mknod c 1 3), so slurmd counts 8; the jobs run on the CPU
    mkdir -p "$DIR/dev"
    for i in 0 1 2 3 4 5 6 7; do
        [ -c "$DIR/dev/gpu$i" ] || { rm -f "$DIR/dev/gpu$i"; mknod "$DIR/dev/gpu$i" c 1 3; }
    done
    cat >"$DIR/gres.conf" <<EOF
Name=gpu File=$DIR/dev/gpu[0-7]
EOF
    cat >"$DIR/slurmdbd.conf" <<EOF
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
EOF
    chmod 600 "$DIR/slurmdbd.conf"
    [ -f "$DIR/munge/munge.key" ] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 2>/dev/null; }
    chmod 400 "$DIR/munge/munge.key"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {  # start NAME PIDFILE LOG COMMAND...: a daemon, once; wait for its pid file
    local name=$1 pidfile=$2 log=$3
    shift 3
    if alive "$pidfile"; then say "$name is running (pid $(cat "$pidfile"))"; return 0; fi
    rm -f "$pidfile"
    "$@" >>"$log" 2>&1 || fail "$name did not start: see $log"
    for _ in $(seq 100); do alive "$pidfile" && { say "$name started (pid $(cat "$pidfile"))"; return 0; }; sleep 0.2; done
    fail "$name did not start: see $log"
}

start_database() {
    local data=$DIR/mysql/data
    if [ ! -d "$data/mysql" ]; then
        mariadb-install-db --no-defaults --datadir="$data" --user=root --auth-root-authentication-method=socket \
            >>"$DIR/log/mariadb.log" 2>&1 || fail "MariaDB's database could not be created: see $DIR/log/mariadb.log"
    fi
    if ! alive "$DIR/run/mariadb.pid"; then
        rm -f "$DIR/run/mariadb.pid"
        mariadbd --no-defaults --datadir="$data" --user=root --bind-address=127.0.0.1 --port="$DB_PORT" \
            --socket="$DIR/mysql/mysql.sock" --pid-file="$DIR/run/mariadb.pid" --log-error="$DIR/log/mariadb.log" \
            --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
    fi
    for _ in $(seq 150); do
        mariadb --no-defaults --socket="$DIR/mysql/mysql.sock" -e 'SELECT 1' >/dev/null 2>&1 && break
        sleep 0.2
    done
    alive "$DIR/run/mariadb.pid" || fail "MariaDB did not start: see $DIR/log/mariadb.log"
    mariadb --no-defaults --socket="$DIR/mysql/mysql.sock" -e "
        CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || fail "MariaDB refused the slurm user: see $DIR/log/mariadb.log"
    say "MariaDB started (pid $(cat "$DIR/run/mariadb.pid"), port $DB_PORT)"
}

up() {
    [ "$(id -u)" = 0 ] || fail "run as root: the daemons run as root here (SlurmUser=root)"
    install_packages
    write_config
    export SLURM_CONF=$DIR/slurm.conf
    start munged "$DIR/run/munged.pid" "$DIR/log/munged.log" munged --force --key-file="$DIR/munge/munge.key" \
        --socket="$DIR/munge/munge.socket" --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munge.seed"
    start_database
    start slurmdbd "$DIR/run/slurmdbd.pid" "$DIR/log/slurmdbd.log" slurmdbd
    for _ in $(seq 50); do timeout 10 sacctmgr -i -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
    timeout 10 sacctmgr -i -n list cluster format=cluster -P 2>/dev/null | grep -qx "$CLUSTER" ||
        timeout 10 sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail "sacctmgr could not register $CLUSTER: see $DIR/log/slurmdbd.log"
    start slurmctld "$DIR/run/slurmctld.pid" "$DIR/log/slurmctld.log" slurmctld
    for node in "${NODES[@]}"; do
        start "slurmd $node" "$DIR/run/slurmd-$node.pid" "$DIR/log/slurmd-$node.log" slurmd -N "$node"
    done
    wait_idle
    say "up: export SLURM_CONF=$SLURM_CONF (or: eval \"\$($0 env)\")"
}

wait_idle() {  # every node up and answering: idle, or running jobs (a restarted controller finds some busy)
    for _ in $(seq 300); do
        local states
        states=$(sinfo -h -N -o '%t' 2>/dev/null | sort -u)
        [ -n "$states" ] && ! grep -qvxE 'idle|alloc|mix|comp' <<< "$states" && return 0
        if echo "$states" | grep -q 'down\|drain'; then scontrol update nodename="$(IFS=,; echo "${NODES[*]}")" \
            state=resume >/dev/null 2>&1 || true; fi
        sleep 0.2
    done
    fail "the nodes are not up (idle, alloc or mix) after 60 s (sinfo: $(sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ')): see $DIR/log/slurmd-*.log"
}

stop() {  # stop NAME PIDFILE: TERM, then KILL after 20 s
    local name=$1 pidfile=$2 pid
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || { say "$name stopped"; rm -f "$pidfile"; return 0; }; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
    say "$name killed (it did not stop within 20 s)"
}

down() {
    for pidfile in "$DIR"/run/slurmd-*.pid; do  # every slurmd it started, whatever the nodes were named then
        [ -e "$pidfile" ] || continue
        name=$(basename "$pidfile" .pid)
        stop "slurmd ${name#slurmd-}" "$pidfile"
    done
    stop slurmctld "$DIR/run/slurmctld.pid"
    stop slurmdbd "$DIR/run/slurmdbd.pid"
    stop MariaDB "$DIR/run/mariadb.pid"
    stop munged "$DIR/run/munged.pid"
}

status() {
    for d in munged mariadb slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
        if alive "$DIR/run/$d.pid"; then echo "$d running (pid $(cat "$DIR/run/$d.pid"))"; else echo "$d stopped"; fi
    done
    SLURM_CONF=$DIR/slurm.conf sinfo -N 2>&1 || true
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
    *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
