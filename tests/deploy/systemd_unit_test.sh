#!/usr/bin/env bash
# deploy/systemd/hicached.service:
#  1. `systemd-analyze security --offline=yes --threshold=40` passes: the
#     exposure score is at most 4.0 (systemd 252: --threshold takes the
#     score x 10 and makes the command exit non-zero above it). Skipped when
#     systemd-analyze is absent.
#  2. The unit's system-call filter (@system-service minus @privileged) allows
#     every call a real CPU-backend hicached makes while serving health,
#     stats and a SIGTERM shutdown, traced with strace; and none of its
#     mappings is writable and executable at once (so MemoryDenyWriteExecute=
#     would be safe for the CPU backend). Skipped without strace or ptrace.
set -euo pipefail

ws="${TEST_SRCDIR}/${TEST_WORKSPACE}"
unit="${ws}/deploy/systemd/hicached.service"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze is not installed (apt-get install systemd)"
  exit 0
fi

# --- 1. Exposure score --------------------------------------------------------
# systemd-analyze looks the unit up by its file name.
tmp="$(mktemp -d /tmp/hicache-unit.XXXXXX)"
daemon_pid=""
cleanup() {
  if [[ -n "${daemon_pid}" ]] && kill -0 "${daemon_pid}" 2>/dev/null; then
    kill -KILL "${daemon_pid}" 2>/dev/null || true
  fi
  # Hot restart keeps the host pool after the daemon: this test's goes too.
  rm -f /dev/shm/hicache-unittest$$-* 2>/dev/null || true
  rm -rf "${tmp}"
}
trap cleanup EXIT
cp "${unit}" "${tmp}/hicached.service"
rc=0
report="$(systemd-analyze security --offline=yes --threshold=40 "${tmp}/hicached.service" 2>&1)" || rc=$?
score_line="$(grep -E 'Overall exposure level' <<<"${report}" || true)"
echo "${score_line}"
[[ -n "${score_line}" ]] || fail "no score in:"$'\n'"${report}"
score="$(grep -oE '[0-9]+\.[0-9]+' <<<"${score_line}" | head -n 1)"
[[ "${rc}" -eq 0 ]] || fail "systemd-analyze security --threshold=40 exited ${rc} (score ${score} > 4.0)"
awk -v s="${score}" 'BEGIN { exit !(s <= 4.0) }' || fail "score ${score} > 4.0"
# The threshold really is enforced: the same unit fails a threshold below it.
if systemd-analyze security --offline=yes --threshold=1 "${tmp}/hicached.service" >/dev/null 2>&1; then
  fail "--threshold=1 passed a unit scored ${score}: the threshold check proves nothing"
fi
for setting in 'CapabilityBoundingSet=$' 'UMask=0007' 'SystemCallFilter=@system-service' \
    'DevicePolicy=closed' 'DeviceAllow=char-nvidia\* rw' 'IPAddressDeny=any' \
    'ExecStart=/usr/bin/hicached --flagfile=/etc/hicached/hicached.flags'; do
  grep -qE "^${setting}" "${unit}" || fail "the unit lacks ${setting}"
done

# --- 2. System calls of a real daemon against the filter ------------------------
if [[ -n "${HICACHE_SANITIZER:-}" ]]; then
  # A sanitizer's runtime makes calls (and mappings) a release build does
  # not, and LeakSanitizer cannot run under ptrace.
  echo "SKIP (syscalls): a ${HICACHE_SANITIZER} build is not the shipped daemon"
  exit 0
fi
if ! command -v strace >/dev/null; then
  echo "SKIP (syscalls): strace is not installed"
  exit 0
fi
if ! strace -f -qq -o /dev/null true 2>/dev/null; then
  echo "SKIP (syscalls): ptrace is not permitted here"
  exit 0
fi
expand_group() {
  # systemd-analyze syscall-filter GROUP: the group's calls, nested groups
  # expanded.
  local line
  systemd-analyze syscall-filter "$1" | tail -n +2 | sed 's/^ *//' |
    while read -r line; do
      case "${line}" in
        ''|'#'*) ;;
        @*) expand_group "${line}" ;;
        *) echo "${line}" ;;
      esac
    done
}
expand_group @system-service | sort -u >"${tmp}/service.txt"
expand_group @privileged | sort -u >"${tmp}/privileged.txt"
comm -23 "${tmp}/service.txt" "${tmp}/privileged.txt" >"${tmp}/allowed.txt"
[[ $(wc -l <"${tmp}/allowed.txt") -gt 100 ]] || fail "could not expand the syscall groups"

sock="${tmp}/s.sock"
mkfifo "${tmp}/bound"
/usr/bin/python3 "${ws}/tests/packaging/notify_listener.py" "${tmp}/notify.sock" "${tmp}/bound" 60 \
  >"${tmp}/notify.log" 2>&1 &
listener_pid=$!
read -r _ <"${tmp}/bound"
# The unit's UMask, and the defaults of deploy/hicached.flags (small pools,
# metrics on an ephemeral loopback port, memory locked as on a real host).
(umask 0007 && NOTIFY_SOCKET="${tmp}/notify.sock" exec strace -f -qq -o "${tmp}/trace.txt" \
  "${ws}/daemon/hicached" --flagfile="${ws}/deploy/hicached.flags" --socket="${sock}" \
  --instance="unittest$$" --metrics_address=127.0.0.1:0 --device_pages_per_rank=64 \
  --host_pages_per_rank=128 --lock_host_memory=true --state_dir="${tmp}/state") \
  >"${tmp}/daemon.log" 2>&1 &
daemon_pid=$!
wait "${listener_pid}" || { cat "${tmp}/daemon.log" >&2; fail "no READY=1 from hicached"; }
"${ws}/client/hicachectl" --socket="${sock}" --timeout=10 health | grep -qx SERVING ||
  fail "health is not SERVING"
"${ws}/client/hicachectl" --socket="${sock}" stats >/dev/null || fail "stats failed"
"${ws}/client/hicachectl" --socket="${sock}" cache-stats >/dev/null || fail "cache-stats failed"
[[ "$(stat -c %a "${sock}")" == 660 ]] || fail "socket mode $(stat -c %a "${sock}")"
# strace (the parent) forwards nothing: signal the daemon itself.
hicached_pid="$(awk '$2 ~ /^execve\(/ && /hicached/ { print $1; exit }' "${tmp}/trace.txt")"
[[ -n "${hicached_pid}" ]] || fail "no hicached execve in the trace"
kill -TERM "${hicached_pid}"
rc=0
wait "${daemon_pid}" || rc=$?
daemon_pid=""
[[ "${rc}" -eq 0 ]] || { cat "${tmp}/daemon.log" >&2; fail "hicached under strace exited ${rc}"; }

sed -E 's/^[0-9]+ +//; s/^<\.\.\. ([a-z0-9_]+) resumed>.*/\1/; s/^([a-z0-9_]+)\(.*/\1/' \
  "${tmp}/trace.txt" | grep -E '^[a-z0-9_]+$' | sort -u >"${tmp}/used.txt"
# execve is strace starting the daemon (systemd does that before the filter).
blocked="$(comm -23 "${tmp}/used.txt" "${tmp}/allowed.txt" | grep -vx execve || true)"
echo "hicached made $(wc -l <"${tmp}/used.txt") distinct system calls"
[[ -z "${blocked}" ]] || fail "calls the unit's SystemCallFilter refuses: ${blocked}"
if grep -E 'PROT_WRITE\|PROT_EXEC|PROT_EXEC\|PROT_WRITE|PROT_READ\|PROT_WRITE\|PROT_EXEC' \
    "${tmp}/trace.txt"; then
  fail "writable+executable mappings: MemoryDenyWriteExecute= would break the CPU backend"
fi
echo "PASS"
