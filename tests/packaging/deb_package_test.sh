#!/usr/bin/env bash
# The hicached .debs, end to end without root: tools/build_deb packages the
# Bazel-built daemon and CLI (hicached) and the C++ client SDK
# (libhicache-client-dev); the test reads the packages with dpkg-deb -I/-c,
# unpacks them with dpkg -x into a temporary root, runs the
# daemon with the packaged flagfile and the packaged hicachectl against it,
# compiles and links a client program with the unpacked headers and library
# found through the packaged pkg-config file, and stops the daemon with
# SIGTERM (exit 0). lintian runs only where installed.
set -euo pipefail
# Sanitizer builds (BAZEL_CONFIG=asan|tsan|ubsan) instrument every binary:
# the package's SDK archive then needs the sanitizer's runtime to link.
if [[ -n "${HICACHE_SANITIZER:-}" ]]; then
  echo "SKIP: the .deb packages release binaries, not a ${HICACHE_SANITIZER} build"
  exit 0
fi

ws="${TEST_SRCDIR}/${TEST_WORKSPACE}"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
for tool in dpkg-deb dpkg dpkg-buildpackage dh pkg-config g++ help2man; do
  command -v "${tool}" >/dev/null || fail "${tool} is not installed (tools/dev deps)"
done

# Unix socket paths are short (108 bytes): not under TEST_TMPDIR.
tmp="$(mktemp -d /tmp/hicache-deb.XXXXXX)"
daemon_pid=""
cleanup() {
  if [[ -n "${daemon_pid}" ]] && kill -0 "${daemon_pid}" 2>/dev/null; then
    kill -KILL "${daemon_pid}" 2>/dev/null || true
  fi
  # Hot restart keeps the host pool after the daemon: this test's goes too.
  rm -f /dev/shm/hicache-debtest$$-* 2>/dev/null || true
  rm -rf "${tmp}"
}
trap cleanup EXIT

# --- Build ---------------------------------------------------------------------
mapfile -t debs < <("${ws}/tools/build_deb" \
  --hicached "${ws}/daemon/hicached" \
  --hicachectl "${ws}/client/hicachectl" \
  --client-lib "${ws}/packaging/libhicache_client.a" \
  --client-headers "${ws}/packaging/hicache_client_include.tar" \
  "${tmp}/dist")
[[ "${#debs[@]}" -eq 2 ]] || fail "build_deb printed ${#debs[@]} paths, not 2: ${debs[*]}"
deb="${debs[0]}" dev_deb="${debs[1]}"
for d in "${deb}" "${dev_deb}"; do
  [[ -f "${d}" ]] || fail "build_deb printed '${d}', not a file"
done
[[ "$(basename "${deb}")" == hicached_*.deb ]] || fail "first .deb: ${deb}"
[[ "$(basename "${dev_deb}")" == libhicache-client-dev_*.deb ]] || fail "second .deb: ${dev_deb}"
# Debian's policy checker finds no error (warnings are allowed: no manual
# pages yet, systemctl in the maintainer scripts).
if command -v lintian >/dev/null; then
  lintian --fail-on error "${deb}" "${dev_deb}" >&2 || fail "lintian reports errors on the .debs"
else
  echo "lintian not installed (tools/dev deps): policy check skipped" >&2
fi
echo "built ${deb} and ${dev_deb}"

# --- Control: name, version, dependencies, conffiles, scripts -------------------
field() { dpkg-deb -f "${deb}" "$1"; }
[[ "$(field Package)" == hicached ]] || fail "Package: $(field Package)"
daemon_version="$("${ws}/daemon/hicached" --version | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)"
[[ "$(field Version)" == "${daemon_version}-1" ]] ||
  fail "Version: $(field Version), the daemon reports ${daemon_version}"
[[ "$(field Architecture)" == "$(dpkg --print-architecture)" ]] || fail "Architecture: $(field Architecture)"
depends="$(field Depends)"
for lib in libgrpc++ libprotobuf libabsl libspdlog libsystemd0 libxxhash0 \
           libprometheus-cpp-core libprometheus-cpp-pull libc6; do
  grep -q "${lib}" <<<"${depends}" || fail "Depends: lacks ${lib}: ${depends}"
done
grep -qE '(^|, )adduser(,|$)' <<<"${depends}" || fail "Depends: lacks adduser: ${depends}"
dev_field() { dpkg-deb -f "${dev_deb}" "$1"; }
[[ "$(dev_field Package)" == libhicache-client-dev ]] || fail "Package: $(dev_field Package)"
[[ "$(dev_field Version)" == "${daemon_version}-1" ]] || fail "-dev Version: $(dev_field Version)"
[[ "$(dev_field Section)" == libdevel ]] || fail "-dev Section: $(dev_field Section)"
for dep in libgrpc++-dev libprotobuf-dev libabsl-dev pkg-config; do
  grep -q -- "${dep}" <<<"$(dev_field Depends)" || fail "-dev Depends: lacks ${dep}"
done

info="$(dpkg-deb -I "${deb}")"
for member in control conffiles postinst prerm postrm; do
  grep -qE "^ +[0-9]+ bytes, +[0-9]+ lines +\*? +${member}\b" <<<"${info}" ||
    fail "control archive lacks ${member}:"$'\n'"${info}"
done
ctl="${tmp}/control"
dpkg-deb -e "${deb}" "${ctl}"
[[ "$(cat "${ctl}/conffiles")" == $'/etc/default/hicached\n/etc/hicached/hicached.flags' ]] ||
  fail "conffiles: $(cat "${ctl}/conffiles")"
for script in postinst prerm postrm; do
  [[ -x "${ctl}/${script}" ]] || fail "${script} is not executable"
  sh -n "${ctl}/${script}" || fail "${script}: syntax error"
  # Never starts or enables the service by itself.
  if grep -vE '^[[:space:]]*#' "${ctl}/${script}" |
     grep -E 'systemctl +(start|enable|restart|reload-or-restart)'; then
    fail "${script} starts or enables hicached"
  fi
done
grep -q 'getent passwd hicache' "${ctl}/postinst" || fail "postinst creates no hicache user"
grep -q -- '--system' "${ctl}/postinst" || fail "postinst: the user is not a system user"
grep -q '/run/systemd/system' "${ctl}/postinst" || fail "postinst does not check that systemd runs"
grep -q 'install -d -o hicache -g hicache -m 0700 /var/lib/hicached' "${ctl}/postinst" ||
  fail "postinst does not make the hot-restart state directory"
grep -q 'rm -rf /var/lib/hicached' "${ctl}/postrm" || fail "purge keeps the state directory"
# debhelper's snippets are in (#DEBHELPER#), and none stops the daemon for an
# upgrade: the postinst try-restarts a running one (a hot restart).
grep -q 'Automatically added by dh_installsystemd' "${ctl}/postinst" ||
  fail "postinst lacks debhelper's systemd snippet"
grep -q 'systemd-tmpfiles .*--create hicached.conf' "${ctl}/postinst" ||
  fail "postinst does not apply the tmpfiles entry"
if [[ -f "${ctl}/preinst" ]] && grep -q 'stop' "${ctl}/preinst"; then
  fail "preinst stops hicached for an upgrade"
fi
grep -q 'systemctl try-restart hicached.service' "${ctl}/postinst" ||
  fail "postinst does not restart a running hicached after an upgrade"
# Unknown maintainer-script actions fail; known no-op ones succeed (run
# without root: they must not touch the system for these).
"${ctl}/postinst" abort-upgrade >/dev/null || fail "postinst abort-upgrade failed"
"${ctl}/prerm" upgrade 2.0 >/dev/null || fail "prerm upgrade failed"
"${ctl}/postrm" upgrade 2.0 >/dev/null || fail "postrm upgrade failed"
if "${ctl}/postinst" bogus 2>/dev/null; then fail "postinst accepted 'bogus'"; fi

# --- Contents ---------------------------------------------------------------------
contents="$(dpkg-deb -c "${deb}")"
echo "${contents}"
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"
for path in ./usr/bin/hicached ./usr/bin/hicachectl \
    ./lib/systemd/system/hicached.service ./etc/default/hicached \
    ./etc/hicached/hicached.flags \
    ./usr/share/hicached/kv-layouts/llama-3-8b.json \
    ./usr/share/doc/hicached/copyright \
    ./usr/lib/tmpfiles.d/hicached.conf \
    ./usr/share/doc/hicached/changelog.Debian.gz \
    ./usr/share/man/man1/hicached.1.gz ./usr/share/man/man1/hicachectl.1.gz \
    ./usr/lib/sysusers.d/hicached.conf; do
  grep -qE " ${path//./\\.}\$" <<<"${contents}" || fail "the package lacks ${path}"
done
# The runtime package holds no SDK: headers, archive and .pc are in -dev.
if grep -E '\./usr/include/|\.a$|\.pc$' <<<"${contents}"; then
  fail "hicached ships SDK files (they belong in libhicache-client-dev)"
fi
dev_contents="$(dpkg-deb -c "${dev_deb}")"
echo "${dev_contents}"
for path in "./usr/lib/${multiarch}/libhicache_client.a" \
    "./usr/lib/${multiarch}/pkgconfig/hicache-client.pc" \
    ./usr/share/doc/libhicache-client-dev/copyright \
    ./usr/share/doc/libhicache-client-dev/changelog.Debian.gz \
    ./usr/include/hicache/client/cpp/hicache_client.h \
    ./usr/include/hicache/client/cpp/hicache_session.h \
    ./usr/include/hicache/hicache/v1/hicache.pb.h \
    ./usr/include/hicache/hicache/v1/hicache.grpc.pb.h \
    ./usr/include/hicache/grpc/health/v1/health.grpc.pb.h; do
  grep -qE " ${path//./\\.}\$" <<<"${dev_contents}" || fail "libhicache-client-dev lacks ${path}"
done
if grep -E '\./usr/bin/|\./etc/' <<<"${dev_contents}"; then
  fail "libhicache-client-dev ships files of the daemon's package"
fi
if awk '{print $2}' <<<"${contents}" | grep -v '^root/root$'; then
  fail "files not owned by root/root"
fi
grep -qE '^-rwxr-xr-x .* \./usr/bin/hicached$' <<<"${contents}" || fail "hicached is not 0755"

# --- Unpack -------------------------------------------------------------------------
root="${tmp}/root"
dpkg -x "${deb}" "${root}"
dpkg -x "${dev_deb}" "${root}"
# The manual pages are the programs' own --help: every flag hicached lists.
for name in hicached hicachectl; do
  page="$(zcat "${root}/usr/share/man/man1/${name}.1.gz")"
  grep -q "^\.TH ${name^^} \"1\"" <<<"${page}" || fail "${name}.1 has no .TH header"
  grep -q "${daemon_version}" <<<"${page}" || fail "${name}.1 does not name version ${daemon_version}"
done
for flag in socket state_dir kv_layout_file write_policy; do
  zcat "${root}/usr/share/man/man1/hicached.1.gz" | grep -q -- "-${flag}" ||
    fail "hicached.1 does not describe --${flag}"
done
# No build-machine RUNPATH (lintian: custom-library-search-path).
for binary in hicached hicachectl; do
  dynamic="$(readelf -d "${root}/usr/bin/${binary}")"
  if [[ "${dynamic}" == *RUNPATH* || "${dynamic}" == *"(RPATH)"* ]]; then
    fail "/usr/bin/${binary} carries a RUNPATH: ${dynamic}"
  fi
done
cmp "${root}/lib/systemd/system/hicached.service" "${ws}/deploy/systemd/hicached.service" ||
  fail "the packaged unit differs from deploy/systemd/hicached.service"
cmp "${root}/etc/hicached/hicached.flags" "${ws}/deploy/hicached.flags" ||
  fail "the packaged flagfile differs from deploy/hicached.flags"
grep -q '^ExecStart=/usr/bin/hicached --flagfile=/etc/hicached/hicached.flags' \
  "${root}/lib/systemd/system/hicached.service" || fail "the unit does not run the packaged flagfile"

# --- Run the daemon and the CLI from the unpacked root ---------------------------------
sock="${tmp}/s.sock"
# Started as systemd would (Type=notify): the daemon is ready when it sends
# READY=1 to NOTIFY_SOCKET; the listener blocks until then (no polling).
notify="${tmp}/notify.sock"
mkfifo "${tmp}/bound"
/usr/bin/python3 "${ws}/tests/packaging/notify_listener.py" "${notify}" "${tmp}/bound" 60 \
  >"${tmp}/notify.log" 2>&1 &
listener_pid=$!
read -r _ <"${tmp}/bound"
# The packaged flagfile, with the socket, pool sizes, metrics port and state
# directory moved out of the way (later flags win).
NOTIFY_SOCKET="${notify}" "${root}/usr/bin/hicached" \
  --flagfile="${root}/etc/hicached/hicached.flags" \
  --socket="${sock}" --instance="debtest$$" --metrics_address=127.0.0.1:0 \
  --device_pages_per_rank=64 --host_pages_per_rank=128 \
  --state_dir="${tmp}/state" \
  >"${tmp}/daemon.log" 2>&1 &
daemon_pid=$!
wait "${listener_pid}" || {
  cat "${tmp}/notify.log" "${tmp}/daemon.log" >&2
  fail "hicached sent no READY=1"
}
health="$("${root}/usr/bin/hicachectl" --socket="${sock}" --timeout=10 health)" || {
  cat "${tmp}/daemon.log" >&2
  fail "hicachectl health failed"
}
[[ "${health}" == SERVING ]] || fail "health printed '${health}'"
# Read whole, then searched (`stats | grep -q` under pipefail can fail when
# grep exits at its match and hicachectl, still writing, gets SIGPIPE).
stats="$("${root}/usr/bin/hicachectl" --socket="${sock}" stats)" ||
  fail "hicachectl stats failed"
[[ "${stats}" == *"${daemon_version}"* ]] ||
  fail "stats does not show version ${daemon_version}"
mode="$(stat -c %a "${sock}")"
[[ "${mode}" == 660 ]] || fail "socket mode ${mode}, want 660"
# The pools the daemon exports are 0660 (docs/security.md).
pools=(/dev/shm/hicache-debtest$$-*)
[[ -e "${pools[0]}" ]] || fail "no pool segments /dev/shm/hicache-debtest$$-*"
for pool in "${pools[@]}"; do
  [[ "$(stat -c %a "${pool}")" == 660 ]] || fail "${pool} has mode $(stat -c %a "${pool}")"
done

# --- The C++ client SDK through pkg-config --------------------------------------------
export PKG_CONFIG_SYSROOT_DIR="${root}"
export PKG_CONFIG_PATH="${root}/usr/lib/${multiarch}/pkgconfig"
pkg-config --exists --print-errors hicache-client || fail "pkg-config cannot resolve hicache-client"
[[ "$(pkg-config --modversion hicache-client)" == "${daemon_version}" ]] ||
  fail "hicache-client.pc version $(pkg-config --modversion hicache-client)"
read -r -a cflags <<<"$(pkg-config --cflags hicache-client)"
read -r -a libs <<<"$(pkg-config --libs hicache-client)"
grep -q -- "-I${root}/usr/include/hicache" <<<"${cflags[*]}" ||
  fail "cflags do not point into the unpacked root: ${cflags[*]}"
# Every installed header compiles on its own with only these flags.
while IFS= read -r header; do
  rel="${header#"${root}/usr/include/hicache/"}"
  printf '#include "%s"\n' "${rel}" >"${tmp}/one_header.cc"
  g++ -std=c++20 -fsyntax-only "${cflags[@]}" "${tmp}/one_header.cc" ||
    fail "installed header ${rel} does not compile alone"
done < <(find "${root}/usr/include/hicache" -name '*.h' | sort)
g++ -std=c++20 -O1 -o "${tmp}/client_smoke" "${ws}/tests/packaging/client_smoke.cc" \
  "${cflags[@]}" "${libs[@]}" || fail "linking against the packaged SDK failed"
smoke="$("${tmp}/client_smoke" "${sock}")" || fail "client_smoke failed"
[[ "${smoke}" == "SERVING ${daemon_version}" ]] || fail "client_smoke printed '${smoke}'"

# --- SIGTERM: exit 0, socket removed -----------------------------------------------------
kill -TERM "${daemon_pid}"
rc=0
wait "${daemon_pid}" || rc=$?
daemon_pid=""
[[ "${rc}" -eq 0 ]] || { cat "${tmp}/daemon.log" >&2; fail "hicached exited ${rc} after SIGTERM"; }
[[ ! -e "${sock}" ]] || fail "the socket outlived the daemon"
# The packaged flagfile turns hot restart on: the host pool and its page keys
# (named after their geometry) and the journal stay for the next daemon;
# everything else goes.
host_pools=(/dev/shm/hicache-debtest$$-host-r0-g*)
[[ -e "${host_pools[0]}" ]] || fail "the host pool did not outlive the daemon (--state_dir)"
page_keys=(/dev/shm/hicache-debtest$$-keys-r0-g*)
[[ -e "${page_keys[0]}" ]] || fail "the page keys did not outlive the daemon (--state_dir)"
[[ -s "${tmp}/state/journal" ]] || fail "no journal in the state directory"
rm -f "${host_pools[@]}" "${page_keys[@]}"
if compgen -G "/dev/shm/hicache-debtest$$-*" >/dev/null; then
  fail "pool segments outlived the daemon"
fi

# --- lintian (optional) -----------------------------------------------------------------
if command -v lintian >/dev/null; then
  echo "lintian (informational):"
  lintian --no-tag-display-limit "${deb}" "${dev_deb}" || true
else
  echo "lintian is not installed: skipped"
fi
echo "PASS"
