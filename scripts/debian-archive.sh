#!/usr/bin/env bash
# scripts/debian-archive.sh - print the Debian archive this machine's apt sources use: a Debian mirror, or
# the organisation's own mirror or caching proxy in front of one. scripts/setup.sh takes pgvector's source
# package from newer suites of that archive (Debian 12 has no pgvector package), so that setup reaches
# only what apt already reaches.
#
#   scripts/debian-archive.sh [APT-GET OPTION...]     (e.g. -o Dir::Etc::SourceList=…, as tests/scripts do)
#
# apt reads the sources itself -- /etc/apt/sources.list and, in /etc/apt/sources.list.d, the one-line
# *.list and the deb822 *.sources files (an entry with "Enabled: no" left out) -- together with the Release
# files of the last `apt-get update`. The archive is the first source whose Release says Origin: Debian
# and Label: Debian, with the main component: not debian-security (Label: Debian-Security), not backports
# (Debian Backports), not a third-party repository that names its suite after the release. Its URL is
# printed without the trailing slash. Exit status 1, printing nothing, when no source is Debian's archive
# (e.g. on Ubuntu) or `apt-get update` has not run yet.
set -euo pipefail

# shellcheck disable=SC2016 # $(REPO_URI) is apt's placeholder, not a command substitution
uri="$(apt-get "$@" indextargets --format '$(REPO_URI)' 'Origin: Debian' 'Label: Debian' 'Component: main' |
    awk 'NR == 1')"
[[ -n "$uri" ]] || exit 1
printf '%s\n' "${uri%/}"
