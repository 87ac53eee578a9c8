#!/usr/bin/env bash
# scripts/setup.sh - install the system packages pgkb needs (called by `make setup`).
#
# Ensures, on Debian (12+) or Ubuntu:
#   0. python3 with venv support (python3, python3-venv), so that the Makefile can make .venv next
#      (scripts/venv.sh);
#   1. a PostgreSQL server >= 15 (the newest one installed, else the distro default),
#      including pg_trgm (contrib);
#   2. PL/Python 3 for that server (postgresql-plpython3-N), and numpy for the Python it runs
#      (python3-numpy: the BM25 leg scores posting blocks with it; without it the SQL leg serves);
#   3. pgvector >= 0.8 for that server: the distro package postgresql-N-pgvector
#      if apt offers a new enough one, otherwise built from Debian's pgvector
#      *source package* taken from a newer suite (sid / trixie), or a pinned
#      one fetched from Debian's pool by checksum (see PINNED_PGVECTOR_*).
#      Both come from the Debian archive this machine's apt sources already use
#      (its Debian mirror, or the organisation's mirror or proxy in front of one:
#      scripts/debian-archive.sh), through apt with this machine's apt settings.
#   4. with --dev (`make test`): chromium and chromium-driver, the headless browser the web page's test
#      drives (tests/web).
#
# Idempotent: every step checks first and only acts when something is missing,
# so on a machine that is already set up it runs in about a second and never
# touches the network (no apt-get update). It never starts or creates a
# PostgreSQL cluster (Debian's package may create/start a "main" cluster when
# the server is first installed; that is left alone).
#
# Runs as root (e.g. CI) or as a normal user, using sudo only for the commands
# that need it, and only when something actually has to be installed.
#
# Environment knobs (all optional):
#   PYTHON               the interpreter the venv is made with (default python3; only python3 is
#                        installed when missing)
#   PGKB_PG_VERSION      use this PostgreSQL major version instead of detecting it
#   PGKB_MIN_PGVECTOR    minimum acceptable pgvector version (default 0.8.0)
#   PGKB_PGVECTOR_SUITES Debian suites to look in for the pgvector source
#                        package (default "sid trixie"; the newest version wins)
#   PGKB_DEBIAN_MIRROR   the Debian archive to take that source package from
#                        (default: the one the apt sources use; set it where they
#                        name none, e.g. on Ubuntu, or where it lacks those suites)
set -euo pipefail

readonly MIN_PG_MAJOR=15
readonly MIN_PGVECTOR="${PGKB_MIN_PGVECTOR:-0.8.0}"
readonly PGVECTOR_SUITES="${PGKB_PGVECTOR_SUITES:-sid trixie}"
readonly DEBIAN_KEYRING="/usr/share/keyrings/debian-archive-keyring.gpg"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR

# A pgvector source package (>= 0.8.4, which has the HNSW vacuum fixes) that
# Debian's pool still serves although no suite's Sources index lists it any
# more (sid moved on to a newer upload whose files a mirror may not have yet).
# Its three files are fetched from the pool and checked against these SHA256
# sums (taken from a .dsc with a good signature of a Debian developer, checked
# against debian-keyring). It competes with the indexed candidates by version,
# so a newer one that downloads still wins.
readonly PINNED_PGVECTOR_VERSION="0.8.6-1"
readonly PINNED_PGVECTOR_FILES=(
    "pgvector_0.8.6-1.dsc d08de2aa48b7cb70319cc896aa3d95514690d1009f96579dbe6b23c59634f4e6"
    "pgvector_0.8.6.orig.tar.gz 25c9b78cfdaa43c66788d7490246ac24e4fe1c86f19c4b60c089b723f84a4a0d"
    "pgvector_0.8.6-1.debian.tar.xz 3bbb17a5352900ea6534363399f519967d8c8bb0907f31e29af9ce03d2ed95c4"
)

export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C

log() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: ERROR: %s\n' "$*" >&2
    exit 1
}

# ---------------------------------------------------------------------------
# Scratch space (apt logs, private apt lists, the pgvector build); removed on exit.
WORKDIR=""
cleanup() { if [[ -n "$WORKDIR" ]]; then rm -rf "$WORKDIR"; fi; }
trap cleanup EXIT
workdir() {
    if [[ -z "$WORKDIR" ]]; then
        WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/pgkb-setup.XXXXXX")"
        # apt drops privileges to the _apt user for downloads; let it in.
        chmod 755 "$WORKDIR"
    fi
}

# Run a command quietly; its output goes to a log that is shown only on failure.
quiet() {
    # Resolve root/sudo first, so that its messages are not swallowed by the log.
    if [[ "$1" == as_root ]]; then resolve_root; fi
    workdir
    local logfile="$WORKDIR/cmd.log"
    if ! "$@" >"$logfile" 2>&1; then
        printf 'setup: ERROR: command failed: %s\n' "$*" >&2
        printf 'setup: ---- last lines of its output ----\n' >&2
        tail -n 40 "$logfile" >&2
        exit 1
    fi
}

# ---------------------------------------------------------------------------
# Privileges: nothing; root; or sudo. Resolved lazily so that an already
# set-up machine needs neither.
SUDO_RESOLVED=0
SUDO=()
resolve_root() {
    if ((SUDO_RESOLVED == 0)); then
        if ((EUID == 0)); then
            SUDO=()
        elif command -v sudo >/dev/null 2>&1; then
            SUDO=(sudo)
            log "some packages are missing; using sudo to install them"
        else
            die "need root to install system packages: run this script as root, or install sudo (apt-get install sudo) and give this user sudo rights"
        fi
        SUDO_RESOLVED=1
    fi
}
as_root() {
    resolve_root
    # `env` so that DEBIAN_FRONTEND survives sudo's environment reset.
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"
}

# ---------------------------------------------------------------------------
# apt helpers.
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    die "this script supports Debian/Ubuntu (apt + dpkg) only"
fi

APT_OPTS=(-o DPkg::Lock::Timeout=300)
APT_UPDATED=0
apt_update_once() {
    if ((APT_UPDATED == 0)); then
        resolve_root
        log "running apt-get update"
        quiet as_root apt-get "${APT_OPTS[@]}" -q update
        APT_UPDATED=1
    fi
}

is_installed() { # is_installed PKG -> 0 if dpkg has it installed
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

candidate_version() { # candidate_version PKG -> apt's candidate version, or empty
    apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }'
}

# apt_install PKG... : install whichever of PKG... are not installed yet.
apt_install() {
    local pkg missing=()
    for pkg in "$@"; do
        if is_installed "$pkg"; then
            log "$pkg already installed"
        else
            missing+=("$pkg")
        fi
    done
    ((${#missing[@]} > 0)) || return 0
    resolve_root
    apt_update_once
    log "installing ${missing[*]} (apt)"
    quiet as_root apt-get "${APT_OPTS[@]}" -q -y --no-install-recommends install "${missing[@]}"
    for pkg in "${missing[@]}"; do
        log "installed $pkg $(dpkg-query -W -f='${Version}' "$pkg")"
    done
}

version_ge() { dpkg --compare-versions "$1" ge "$2"; }

# ---------------------------------------------------------------------------
# 0. Python 3 with venv support (Debian splits ensurepip into python3-venv), before the Makefile makes
#    .venv. Checked by running the interpreter, so a python3 from elsewhere (pyenv, a venv) that has
#    ensurepip is used as it is.
PYTHON="${PYTHON:-python3}"
if "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    log "$PYTHON with venv support already present ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
elif [[ "$PYTHON" != python3 ]] && command -v "$PYTHON" >/dev/null 2>&1; then
    die "$PYTHON has no venv/ensurepip module: install its venv package (e.g. ${PYTHON##*/}-venv) or use PYTHON=python3"
elif [[ "$PYTHON" != python3 ]]; then
    die "PYTHON=$PYTHON not found: install it or use the default python3"
else
    apt_install python3 python3-venv
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 ||
        die "python3 still has no venv support after installing python3-venv ($(command -v python3 || echo 'python3 not on PATH'))"
fi

# ---------------------------------------------------------------------------
# 1. PostgreSQL server >= 15.

newest_installed_pg() { # prints the newest installed server major version, or nothing
    local bin v best=""
    for bin in /usr/lib/postgresql/*/bin/postgres; do
        [[ -x "$bin" ]] || continue
        v="${bin#/usr/lib/postgresql/}"
        v="${v%%/*}"
        [[ "$v" =~ ^[0-9]+$ ]] || continue
        if [[ -z "$best" ]] || ((v > best)); then best="$v"; fi
    done
    printf '%s' "$best"
}

distro_default_pg() { # the N in the distro's `postgresql` -> `postgresql-N` dependency
    apt-cache depends postgresql 2>/dev/null |
        sed -n 's/^ *Depends: postgresql-\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 1
}

if [[ -n "${PGKB_PG_VERSION:-}" ]]; then
    PG_MAJOR="$PGKB_PG_VERSION"
    [[ "$PG_MAJOR" =~ ^[0-9]+$ ]] || die "PGKB_PG_VERSION must be a major version number, got '$PG_MAJOR'"
    ((PG_MAJOR >= MIN_PG_MAJOR)) || die "PGKB_PG_VERSION=$PG_MAJOR is older than the required $MIN_PG_MAJOR"
else
    PG_MAJOR="$(newest_installed_pg)"
    if [[ -z "$PG_MAJOR" ]] || ((PG_MAJOR < MIN_PG_MAJOR)); then
        [[ -n "$PG_MAJOR" ]] && log "installed PostgreSQL $PG_MAJOR is older than $MIN_PG_MAJOR; looking at the distro default"
        apt_update_once
        PG_MAJOR="$(distro_default_pg)"
        [[ -n "$PG_MAJOR" ]] || die "cannot find the distro's PostgreSQL version (apt-cache depends postgresql); install PostgreSQL >= $MIN_PG_MAJOR and re-run"
        ((PG_MAJOR >= MIN_PG_MAJOR)) ||
            die "the distro's PostgreSQL is $PG_MAJOR, but pgkb needs >= $MIN_PG_MAJOR: install postgresql-$MIN_PG_MAJOR or newer (e.g. from apt.postgresql.org) and re-run"
    fi
fi

PG_BINDIR="/usr/lib/postgresql/$PG_MAJOR/bin"
if [[ -x "$PG_BINDIR/postgres" ]]; then
    log "postgresql-$PG_MAJOR already installed ($("$PG_BINDIR/postgres" --version))"
else
    apt_install "postgresql-$PG_MAJOR"
    [[ -x "$PG_BINDIR/postgres" ]] || die "postgresql-$PG_MAJOR installed but $PG_BINDIR/postgres is missing"
fi

# Where this server's extensions live (pg_config of that exact version, which
# Debian ships in postgresql-client-N; fall back to the Debian layout).
PG_CONFIG="$PG_BINDIR/pg_config"
if [[ -x "$PG_CONFIG" ]]; then
    PG_SHAREDIR="$("$PG_CONFIG" --sharedir)"
    PG_PKGLIBDIR="$("$PG_CONFIG" --pkglibdir)"
else
    PG_SHAREDIR="/usr/share/postgresql/$PG_MAJOR"
    PG_PKGLIBDIR="/usr/lib/postgresql/$PG_MAJOR/lib"
fi
EXTDIR="$PG_SHAREDIR/extension"

# pg_trgm: part of the server package on current Debian/Ubuntu; older
# layouts had it in postgresql-contrib(-N).
if [[ -f "$EXTDIR/pg_trgm.control" ]]; then
    log "pg_trgm already present"
else
    apt_update_once
    if [[ -n "$(candidate_version "postgresql-contrib-$PG_MAJOR")" ]]; then
        apt_install "postgresql-contrib-$PG_MAJOR"
    else
        apt_install postgresql-contrib
    fi
    [[ -f "$EXTDIR/pg_trgm.control" ]] || die "pg_trgm still missing after installing contrib ($EXTDIR/pg_trgm.control)"
fi

# ---------------------------------------------------------------------------
# 2. PL/Python 3.
if [[ -f "$EXTDIR/plpython3u.control" ]]; then
    log "plpython3u already present (postgresql-plpython3-$PG_MAJOR)"
else
    apt_install "postgresql-plpython3-$PG_MAJOR"
    [[ -f "$EXTDIR/plpython3u.control" ]] || die "plpython3u still missing after installing postgresql-plpython3-$PG_MAJOR"
fi
# numpy for the system python3 that plpython3u embeds (not the venv's): Debian's package
apt_install python3-numpy

# ---------------------------------------------------------------------------
# 3. pgvector >= MIN_PGVECTOR.

installed_pgvector() { # default_version from vector.control, if the library is there too
    [[ -f "$EXTDIR/vector.control" && -f "$PG_PKGLIBDIR/vector.so" ]] || return 0
    sed -n "s/^ *default_version *= *'\([^']*\)'.*/\1/p" "$EXTDIR/vector.control"
}

# Private apt invocation that sees only our deb-src list: the machine's own
# sources, lists and caches are neither used nor modified.
private_apt() {
    local tool="$1"
    shift
    "$tool" \
        -o Dir::Etc::SourceList="$WORKDIR/apt/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$WORKDIR/apt/lists" \
        -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= \
        -o Acquire::Languages=none \
        -o Acquire::GzipIndexes=false \
        -o APT::Sandbox::User="$(id -un)" \
        "$@"
}

# The Debian archive pgvector's source comes from: PGKB_DEBIAN_MIRROR, else the one this machine's apt
# sources use (read after apt-get update, which has run by now).
debian_archive() {
    if [[ -n "${PGKB_DEBIAN_MIRROR:-}" ]]; then
        printf '%s' "${PGKB_DEBIAN_MIRROR%/}"
    elif ! bash "$SCRIPT_DIR/debian-archive.sh"; then
        die "none of this machine's apt sources is a Debian archive (a Debian mirror, or a proxy of one), where pgvector's source package would come from: set PGKB_DEBIAN_MIRROR to a Debian mirror this machine may reach (http://…/debian), or install pgvector >= $MIN_PGVECTOR for PostgreSQL $PG_MAJOR yourself (e.g. postgresql-$PG_MAJOR-pgvector from apt.postgresql.org) and re-run"
    fi
}

# The reason apt gave in log file $1 for a failed download or index, in a few words (e.g. "404 Not Found").
download_problem() {
    [[ -f "$1" ]] || return 0
    local reason
    reason="$(awk '/^Err:/ { getline; sub(/^ +/, ""); sub(/ *\[IP:.*/, ""); print; exit }' "$1" | tr -s ' ')"
    [[ -n "$reason" ]] || reason="$(grep -m1 '^E: ' "$1" | cut -c4- || true)"
    printf '%s' "${reason:-$(tail -n 1 "$1")}"
}

# Build and install pgvector from Debian's source package, newest of $PGVECTOR_SUITES.
build_pgvector_from_debian_source() {
    workdir
    mkdir -p "$WORKDIR/apt/lists/partial" "$WORKDIR/build"
    local archive
    archive="$(debian_archive)" || exit 1

    # The private list is verified against Debian's archive keyring (standard
    # on Debian; Ubuntu has it as the debian-archive-keyring package).
    [[ -f "$DEBIAN_KEYRING" ]] || apt_install debian-archive-keyring
    [[ -f "$DEBIAN_KEYRING" ]] || die "missing $DEBIAN_KEYRING (package debian-archive-keyring)"

    local suite
    : >"$WORKDIR/apt/sources.list"
    for suite in $PGVECTOR_SUITES; do
        printf 'deb-src [signed-by=%s] %s %s main\n' "$DEBIAN_KEYRING" "$archive" "$suite" >>"$WORKDIR/apt/sources.list"
    done
    log "looking for pgvector's source package in Debian $PGVECTOR_SUITES at $archive"
    # Runs unprivileged when we are not root: it only writes into $WORKDIR. A suite the archive lacks is
    # left out (the others may have pgvector).
    if ! private_apt apt-get -q update >"$WORKDIR/update.log" 2>&1; then
        log "  not every suite could be read there ($(download_problem "$WORKDIR/update.log")): going on with the others"
    fi

    # Every pgvector source version the suites offer, as "VERSION SUITE" lines,
    # newest first (sort -V orders plain Debian versions like 0.8.7-1 correctly).
    local f suite_of_file candidates
    candidates="$(
        {
            for f in "$WORKDIR"/apt/lists/*_source_Sources; do
                [[ -f "$f" ]] || continue
                suite_of_file="${f##*_dists_}"
                suite_of_file="${suite_of_file%%_*}"
                awk -v s="$suite_of_file" '/^Package: /{p = ($2 == "pgvector")} p && /^Version: /{print $2, s}' "$f"
            done
            printf '%s pool\n' "$PINNED_PGVECTOR_VERSION"
        } | sort -u -k1,1 -V -r
    )"
    [[ -n "$candidates" ]] || die "no pgvector source package found in Debian $PGVECTOR_SUITES at $archive"

    # Download the newest one that actually downloads (a mirror may not have
    # the pool files of a very recent upload yet; fall back to the next one).
    local ver src_suite got_ver="" got_suite="" upstream why=""
    while read -r ver src_suite; do
        upstream="${ver#*:}"
        upstream="${upstream%-*}"
        if ! version_ge "$upstream" "$MIN_PGVECTOR"; then
            log "skipping pgvector $ver ($src_suite): older than $MIN_PGVECTOR"
            continue
        fi
        rm -rf "$WORKDIR/build" && mkdir -p "$WORKDIR/build"
        if [[ "$src_suite" == pool ]]; then
            # The pinned one, straight from the pool (apt-helper checks each SHA256).
            local entry dl_args=()
            for entry in "${PINNED_PGVECTOR_FILES[@]}"; do
                dl_args+=("$archive/pool/main/p/pgvector/${entry% *}" "$WORKDIR/build/${entry% *}" "SHA256:${entry#* }")
            done
            if private_apt /usr/lib/apt/apt-helper download-file "${dl_args[@]}" >"$WORKDIR/download.log" 2>&1; then
                got_ver="$ver"
                got_suite="pool, pinned"
                break
            fi
        elif (cd "$WORKDIR/build" && private_apt apt-get -q source --download-only "pgvector=$ver" >"$WORKDIR/download.log" 2>&1); then
            got_ver="$ver"
            got_suite="$src_suite"
            break
        fi
        why="$(download_problem "$WORKDIR/download.log")"
        if [[ "$src_suite" == pool ]]; then
            log "the pinned pgvector $ver did not download from $archive ($why); trying the next newest version"
        else
            log "pgvector $ver is listed in Debian $src_suite, but its files did not download from $archive ($why)."
            log "  That is expected for a very recent upload (mirrors take a while to get its files): setup uses the next newest version instead."
        fi
    done <<<"$candidates"
    [[ -n "$got_ver" ]] || die "could not download any pgvector >= $MIN_PGVECTOR source package from Debian $PGVECTOR_SUITES at $archive${why:+ ($why)}"
    upstream="${got_ver#*:}"
    upstream="${upstream%-*}"
    log "downloaded pgvector source $got_ver ($got_suite) from $archive"
    if ! version_ge "$upstream" 0.8.4; then
        log "note: pgvector $upstream is older than the recommended 0.8.4 (HNSW vacuum fixes), the newest this mirror could serve; later runs keep it (it satisfies >= $MIN_PGVECTOR)"
    fi

    # Build dependencies: compiler toolchain, dpkg-source, PGXS headers for this server.
    # (postgresql-server-dev-N may pull in a newer minor of postgresql-N; that's expected.)
    apt_install build-essential dpkg-dev "postgresql-server-dev-$PG_MAJOR"

    (
        cd "$WORKDIR/build"
        # --no-check: the .dsc signature is not checkable without Debian's
        # developer keyrings, and apt has already verified every downloaded
        # file against the checksums in the signed Sources index (or, for the
        # pinned one, apt-helper against PINNED_PGVECTOR_FILES).
        quiet dpkg-source --no-check -x ./pgvector_"${got_ver#*:}".dsc src
        cd src
        # OPTFLAGS="": upstream defaults to -march=native, which would make the
        # library specific to this CPU.
        quiet make -j"$(nproc)" OPTFLAGS="" PG_CONFIG="$PG_CONFIG"
        quiet as_root make install OPTFLAGS="" PG_CONFIG="$PG_CONFIG"
    )
    log "built pgvector $upstream from Debian source package ($got_suite, $got_ver) and installed it for PostgreSQL $PG_MAJOR"
}

have="$(installed_pgvector)"
if [[ -n "$have" ]] && version_ge "$have" "$MIN_PGVECTOR"; then
    log "pgvector $have already installed for PostgreSQL $PG_MAJOR"
else
    if [[ -n "$have" ]]; then
        log "pgvector $have is older than $MIN_PGVECTOR; upgrading"
    fi
    apt_update_once
    pkg="postgresql-$PG_MAJOR-pgvector"
    cand="$(candidate_version "$pkg")"
    if [[ -n "$cand" ]] && version_ge "$cand" "$MIN_PGVECTOR"; then
        log "distro offers $pkg $cand"
        if is_installed "$pkg"; then
            log "upgrading $pkg (apt)"
            quiet as_root apt-get "${APT_OPTS[@]}" -q -y --no-install-recommends install "$pkg"
        else
            apt_install "$pkg"
        fi
    else
        log "apt offers no $pkg >= $MIN_PGVECTOR here (candidate: ${cand:-none}), so pgvector is built from Debian's source package (a few minutes)"
        build_pgvector_from_debian_source
    fi
    have="$(installed_pgvector)"
    if [[ -z "$have" ]] || ! version_ge "$have" "$MIN_PGVECTOR"; then
        die "pgvector still missing or older than $MIN_PGVECTOR after install (found: '${have:-none}')"
    fi
    log "pgvector $have ready for PostgreSQL $PG_MAJOR"
fi

if [[ "${1:-}" == "--dev" ]]; then
    apt_install chromium chromium-driver
fi

log "done in ${SECONDS} s (PostgreSQL $PG_MAJOR, binaries in $PG_BINDIR)"
