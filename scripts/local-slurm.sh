#!/usr/bin/env bash
# A real Slurm cluster on this machine, for the tests and the demo.
#
#   scripts/local-slurm.sh start            install (Debian packages) and start munge, MariaDB,
#                                           slurmdbd, slurmctld and N slurmd "nodes"; wait until idle
#   scripts/local-slurm.sh stop             cancel jobs, stop only the daemons this script started
#   scripts/local-slurm.sh status           sinfo of the nodes, and the daemons this script owns
#   scripts/local-slurm.sh kill-node NAME   SIGKILL one slurmd (a node failure, for tests)
#   scripts/local-slurm.sh restart-node NAME
#   scripts/local-slurm.sh throttle-node NAME PERCENT
#                                           a simulation of a slow link: the node's slurmd, and
#                                           every job step it starts from now on, get PERCENT %
#                                           of one CPU (a cgroup v1 cpu quota with a 1 ms slice)
#   scripts/local-slurm.sh unthrottle-node NAME   undo it (its processes back, the cgroup gone)
#
# Nodes are `node1..nodeN`, each its own slurmd (Debian builds Slurm with MULTIPLE_SLURMD) on
# 127.0.0.1 with its own port. Nothing in the product depends on this cluster; it is a stand-in
# for a real one. Knobs (environment):
#   SLURM_LOCAL_NODES=4  SLURM_LOCAL_CPUS=4  SLURM_LOCAL_MEM_MB=4096  SLURM_LOCAL_DBD=1
#   SLURM_LOCAL_CGROUP=auto|yes|no  SLURM_LOCAL_WAIT=90  SLURM_LOCAL_PURGE_STATE=0 (stop)
# Must run as root (it installs packages and starts slurmd). It never uses pkill or killall.
set -euo pipefail

NODES=${SLURM_LOCAL_NODES:-4}
CPUS=${SLURM_LOCAL_CPUS:-4}
MEM_MB=${SLURM_LOCAL_MEM_MB:-4096}
USE_DBD=${SLURM_LOCAL_DBD:-1}
CGROUP=${SLURM_LOCAL_CGROUP:-auto}
WAIT_S=${SLURM_LOCAL_WAIT:-90}
CLUSTER=${SLURM_LOCAL_CLUSTER:-local}
CONF_DIR=/etc/slurm
STATE_DIR=/var/spool/local-slurm
LOG_DIR=/var/log/local-slurm
RUN_DIR=/run/local-slurm
OWNED=$RUN_DIR/owned
BASE_PORT=17000
THROTTLE_ROOT=/sys/fs/cgroup/cpu  # cgroup v1's cpu controller, for throttle-node
HOSTS_BEGIN="# BEGIN local-slurm"
HOSTS_END="# END local-slurm"

log() { printf 'local-slurm: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

require_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts slurmd); run it as root: bash $0 $*"
}

install_packages() {
  local wanted=(slurmctld slurmd slurm-client munge)
  [[ $USE_DBD == 1 ]] && wanted+=(slurmdbd mariadb-server)
  local missing=()
  for package in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  log "installing ${missing[*]}"
  local temporary_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then  # keep postinst from starting the packaged services
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    temporary_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [[ $temporary_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d
  return 0
}

# "pidfile comm" of each daemon this script started, so stop touches nothing else.
own() { mkdir -p "$OWNED"; printf '%s %s\n' "$2" "$3" >"$OWNED/$1"; }

pid_alive() {  # a zombie counts as dead: PID 1 here reaps late
  local pid=$1 state
  [[ -r /proc/$pid/stat ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]]
}

pidfile_alive() {
  local pidfile=$1 pid
  [[ -s $pidfile ]] || return 1
  pid=$(<"$pidfile")
  pid_alive "$pid"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what"
    sleep 0.2
  done
}

cgroup_mode() {
  case $CGROUP in
    yes) echo yes ;;
    no) echo no ;;
    auto)
      local probe=/sys/fs/cgroup/memory/local-slurm-probe.$$
      if mkdir "$probe" 2>/dev/null; then rmdir "$probe"; echo yes; else echo no; fi ;;
    *) die "SLURM_LOCAL_CGROUP must be auto, yes or no (got '$CGROUP')" ;;
  esac
}

write_if_changed() {  # write_if_changed PATH MODE OWNER < content; returns 0 when it changed
  local path=$1 mode=$2 owner=$3 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then rm -f "$tmp"; return 1; fi
  if [[ -f $path && ! -f $path.orig-local-slurm ]] && ! grep -q 'written by local-slurm.sh' "$path"; then
    cp -p "$path" "$path.orig-local-slurm"
  fi
  install -m "$mode" -o "$owner" "$tmp" "$path"
  rm -f "$tmp"
  return 0
}

slurm_conf() {
  local cgroups=$1 accounting host
  host=$(hostname)
  if [[ $USE_DBD == 1 ]]; then
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoreFlags=job_comment
JobAcctGatherFrequency=5"
  else
    accounting="AccountingStorageType=accounting_storage/none"
  fi
  cat <<EOF
# written by local-slurm.sh: a test cluster on one machine
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
SlurmctldPort=6817
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
$( [[ $cgroups == yes ]] && printf 'ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\nJobAcctGatherType=jobacct_gather/cgroup' \
   || printf 'ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/linux\nJobAcctGatherParams=OverMemoryKill' )
$accounting
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.txt
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=300
JobRequeue=0
MaxArraySize=5001
MaxJobCount=20000
EnforcePartLimits=ALL
MailProg=/bin/true
$(for ((i = 1; i <= NODES; i++)); do
    echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((BASE_PORT + i)) CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  done)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

cgroup_conf() {
  cat <<'EOF'
# written by local-slurm.sh
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
ConstrainCores=no
EOF
}

slurmdbd_conf() {
  cat <<EOF
# written by local-slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=slurm
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StorageUser=slurm
StoragePass=$1
StorageLoc=slurm_acct_db
EOF
}

hosts_block() {
  local tmp
  tmp=$(mktemp)
  sed "/^$HOSTS_BEGIN\$/,/^$HOSTS_END\$/d" /etc/hosts >"$tmp"
  if [[ ${1:-add} == add ]]; then
    {
      echo "$HOSTS_BEGIN"
      for ((i = 1; i <= NODES; i++)); do echo "127.0.0.1 node$i"; done
      echo "$HOSTS_END"
    } >>"$tmp"
  fi
  cat "$tmp" >/etc/hosts  # in place: /etc/hosts can be a bind mount
  rm -f "$tmp"
}

start_munge() {
  if [[ -S /run/munge/munge.socket.2 ]] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    return 0  # reuse a running munged; it is not ours to stop
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge
  [[ -s /etc/munge/munge.key ]] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  runuser -u munge -- munged --force
  own munged /run/munge/munged.pid munged
  wait_for 10 munged bash -c 'munge -n </dev/null | unmunge'
}

start_mariadb() {
  if mariadb-admin ping >/dev/null 2>&1; then return 0; fi
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if [[ ! -d /var/lib/mysql/mysql ]]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  fi
  setsid mariadbd --user=mysql --bind-address=127.0.0.1 --innodb-lock-wait-timeout=900 \
    --pid-file=/run/mysqld/mysqld.pid >>"$LOG_DIR/mariadb.log" 2>&1 </dev/null &
  own mariadbd /run/mysqld/mysqld.pid mariadbd
  wait_for 30 mariadb mariadb-admin ping
}

db_password() {
  local file=$CONF_DIR/.local-slurm-dbpass
  if [[ ! -s $file ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$file")
  fi
  cat "$file"
}

start_slurmdbd() {
  local password
  password=$(db_password)
  mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$password';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$password';
    ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$password';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$password';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  slurmdbd_conf "$password" | write_if_changed "$CONF_DIR/slurmdbd.conf" 600 slurm || true
  if pidfile_alive "$RUN_DIR/slurmdbd.pid"; then return 0; fi
  slurmdbd
  own slurmdbd "$RUN_DIR/slurmdbd.pid" slurmdbd
  wait_for 30 slurmdbd sacctmgr -i show cluster
  if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
}

start_slurmctld() {
  if pidfile_alive "$RUN_DIR/slurmctld.pid"; then return 0; fi
  slurmctld
  own slurmctld "$RUN_DIR/slurmctld.pid" slurmctld
  wait_for 30 slurmctld scontrol ping
}

start_slurmd() {
  local node=$1
  if pidfile_alive "$RUN_DIR/slurmd-$node.pid"; then return 0; fi
  mkdir -p "$STATE_DIR/d/$node"
  slurmd -N "$node"
  own "slurmd-$node" "$RUN_DIR/slurmd-$node.pid" slurmd
}

stop_owned() {  # stop_owned NAME: TERM, wait up to 30 s, then KILL; only if comm still matches
  local name=$1 record pidfile comm pid
  record=$OWNED/$name
  [[ -f $record ]] || return 0
  read -r pidfile comm <"$record"
  if [[ -s $pidfile ]]; then
    pid=$(<"$pidfile")
    if pid_alive "$pid" && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      local deadline=$((SECONDS + 30))
      while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
      if pid_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
  fi
  rm -f "$record"
}

wait_idle() {
  local deadline=$((SECONDS + WAIT_S)) states
  while :; do
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
    if [[ $(grep -c ' idle$' <<<"$states" || true) -ge $NODES ]]; then return 0; fi
    if grep -Eq ' (down|drain|drng|fail)' <<<"$states"; then
      scontrol update nodename="node[1-$NODES]" state=resume >/dev/null 2>&1 || true
    fi
    if ((SECONDS >= deadline)); then
      sinfo -N -l >&2 || true
      die "nodes not idle after ${WAIT_S}s (logs: $LOG_DIR)"
    fi
    sleep 0.3
  done
}

cmd_start() {
  require_root start
  install_packages
  mkdir -p "$CONF_DIR" "$STATE_DIR/ctld" "$STATE_DIR/d" "$LOG_DIR" "$RUN_DIR"
  chown slurm:slurm "$STATE_DIR/ctld" "$LOG_DIR" "$RUN_DIR"
  hosts_block add
  local cgroups changed=0
  cgroups=$(cgroup_mode)
  slurm_conf "$cgroups" | write_if_changed "$CONF_DIR/slurm.conf" 644 root && changed=1
  cgroup_conf | write_if_changed "$CONF_DIR/cgroup.conf" 644 root || true
  start_munge
  if [[ $USE_DBD == 1 ]]; then start_mariadb; start_slurmdbd; fi
  if [[ $changed == 1 ]]; then  # a new config needs fresh daemons, MaxArraySize included
    for ((i = 1; i <= 64; i++)); do stop_owned "slurmd-node$i"; done
    stop_owned slurmctld
  fi
  start_slurmctld
  for ((i = 1; i <= NODES; i++)); do start_slurmd "node$i"; done
  sleep 0.5
  local dead=()
  for ((i = 1; i <= NODES; i++)); do pidfile_alive "$RUN_DIR/slurmd-node$i.pid" || dead+=("node$i"); done
  if [[ ${#dead[@]} -gt 0 && $cgroups == yes && $CGROUP == auto ]]; then
    log "slurmd failed in cgroup mode (${dead[*]}); retrying without cgroups"
    for ((i = 1; i <= NODES; i++)); do stop_owned "slurmd-node$i"; done
    stop_owned slurmctld
    slurm_conf no | write_if_changed "$CONF_DIR/slurm.conf" 644 root || true
    start_slurmctld
    for ((i = 1; i <= NODES; i++)); do start_slurmd "node$i"; done
  fi
  wait_idle
  log "up: $NODES nodes × $CPUS CPUs × ${MEM_MB} MB, cgroups=$(grep -q proctrack/cgroup "$CONF_DIR/slurm.conf" && echo yes || echo no), accounting=$([[ $USE_DBD == 1 ]] && echo slurmdbd || echo none)"
}

cmd_stop() {
  require_root stop
  if [[ ${SLURM_LOCAL_KEEP_JOBS:-0} != 1 ]] && scontrol ping >/dev/null 2>&1; then
    scancel --user=root --full >/dev/null 2>&1 || true
    local users
    users=$(squeue -h -o '%u' 2>/dev/null | sort -u || true)
    for user in $users; do scancel --user="$user" --full >/dev/null 2>&1 || true; done
  fi
  if [[ -d $OWNED ]]; then
    for record in "$OWNED"/slurmd-*; do [[ -e $record ]] && stop_owned "$(basename "$record")"; done
    stop_owned slurmctld
    stop_owned slurmdbd
    stop_owned mariadbd
    stop_owned munged
  fi
  for dir in /sys/fs/cgroup/*/slurm_node*; do
    if [[ -d $dir ]]; then rmdir "$dir" 2>/dev/null || true; fi
  done
  for dir in "$THROTTLE_ROOT"/local-slurm-throttle-*; do
    [[ -d $dir ]] && cmd_unthrottle_node "${dir##*-}"
  done
  hosts_block remove
  if [[ ${SLURM_LOCAL_PURGE_STATE:-0} == 1 ]]; then rm -rf "$STATE_DIR" "$LOG_DIR"; fi
  log "stopped"
}

cmd_status() {
  if ! command -v sinfo >/dev/null; then echo "not installed"; return 3; fi
  if ! scontrol ping >/dev/null 2>&1; then echo "slurmctld not answering"; return 3; fi
  sinfo -N -o '%N %t %c %m'
  [[ -d $OWNED ]] && for record in "$OWNED"/*; do [[ -e $record ]] && echo "owned: $(basename "$record")"; done
  return 0
}

node_arg() {
  [[ ${1:-} =~ ^node[0-9]+$ ]] || die "expected a node name like node2, got '${1:-}'"
  echo "$1"
}

cmd_kill_node() {
  require_root kill-node
  local node pid
  node=$(node_arg "${1:-}")
  [[ -s $RUN_DIR/slurmd-$node.pid ]] || die "no slurmd running for $node"
  pid=$(<"$RUN_DIR/slurmd-$node.pid")
  pid_alive "$pid" && kill -KILL "$pid"
  log "killed slurmd of $node (pid $pid)"
}

throttle_dir() { echo "$THROTTLE_ROOT/local-slurm-throttle-$1"; }

cmd_throttle_node() {  # a simulation of a slow link: a CPU quota on one node's slurmd and its jobs
  require_root throttle-node
  local node percent dir pid
  node=$(node_arg "${1:-}")
  percent=${2:-}
  [[ $percent =~ ^[0-9]+$ ]] && ((percent >= 1 && percent <= 99)) \
    || die "throttle-node $node PERCENT: PERCENT is the share of one CPU left to the node, 1 to 99 (got '$percent')"
  [[ -f $THROTTLE_ROOT/cpu.cfs_quota_us ]] || die "no cgroup v1 cpu controller at $THROTTLE_ROOT: throttle-node needs one"
  [[ -s $RUN_DIR/slurmd-$node.pid ]] || die "no slurmd running for $node"
  pid=$(<"$RUN_DIR/slurmd-$node.pid")
  pid_alive "$pid" || die "the slurmd of $node (pid $pid) is not running"
  dir=$(throttle_dir "$node")
  mkdir -p "$dir"
  # 1 ms of CPU per period (the kernel's smallest quota), the period sized to the share: the
  # node runs in slices of 1 ms, so even a 10 ms all-reduce is slowed, not only long bursts.
  echo $((100000 / percent)) >"$dir/cpu.cfs_period_us"
  echo 1000 >"$dir/cpu.cfs_quota_us"
  echo "$pid" >"$dir/cgroup.procs"
  log "throttled $node to $percent % of one CPU (a simulation of a slow link; undo: $0 unthrottle-node $node)"
}

cmd_unthrottle_node() {
  require_root unthrottle-node
  local node dir pid
  node=$(node_arg "${1:-}")
  dir=$(throttle_dir "$node")
  [[ -d $dir ]] || return 0
  while read -r pid; do  # the slurmd and whatever it started meanwhile
    [[ -n $pid ]] && { echo "$pid" >"$THROTTLE_ROOT/cgroup.procs"; } 2>/dev/null || true
  done <"$dir/cgroup.procs"
  rmdir "$dir" 2>/dev/null || die "could not remove $dir (processes left in it: $(tr '\n' ' ' <"$dir/cgroup.procs"))"
  log "unthrottled $node"
}

cmd_restart_node() {
  require_root restart-node
  local node
  node=$(node_arg "${1:-}")
  start_slurmd "$node"
  scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  kill-node) cmd_kill_node "${2:-}" ;;
  restart-node) cmd_restart_node "${2:-}" ;;
  throttle-node) cmd_throttle_node "${2:-}" "${3:-}" ;;
  unthrottle-node) cmd_unthrottle_node "${2:-}" ;;
  *) echo "usage: $0 start|stop|status|kill-node NODE|restart-node NODE|throttle-node NODE PERCENT|unthrottle-node NODE" >&2; exit 2 ;;
esac
