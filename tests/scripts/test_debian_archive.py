"""scripts/debian-archive.sh: which Debian archive this machine's apt sources use (setup.sh takes pgvector's
source package from it). Each test writes sample sources -- one-line sources.list and deb822 *.sources --
into a temporary apt folder, with the Release files and empty indexes an `apt-get update` would have left,
and runs the script with apt pointed there."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "debian-archive.sh"

# what each sample repository's Release file says (Origin, Label)
RELEASES = {
    "http://mirror.example.org/debian/": ("Debian", "Debian"),
    "http://mirror.example.org/debian-security/": ("Debian", "Debian-Security"),
    "http://cache.example.org:3142/debian/": ("Debian", "Debian"),
    "http://backports.example.org/debian/": ("Debian Backports", "Debian Backports"),
    "https://apt.example.com/repo/": ("Example", "Example"),
    "http://archive.example.net/ubuntu/": ("Ubuntu", "Ubuntu"),
}

DEB822_MIRROR = """\
Types: deb deb-src
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.org/debian-security
Suites: bookworm-security
Components: main
"""


def debian_archive(tmp_path: Path, sources_list: str = "", parts: dict[str, str] | None = None):
    """Write the sample sources and what `apt-get update` would have fetched for them, run the script."""
    etc, lists = tmp_path / "etc", tmp_path / "lists"
    (etc / "sources.list.d").mkdir(parents=True)
    (lists / "partial").mkdir(parents=True)
    (etc / "sources.list").write_text(sources_list)
    for name, text in (parts or {}).items():
        (etc / "sources.list.d" / name).write_text(text)
    settings = {"Dir::Etc::SourceList": etc / "sources.list", "Dir::Etc::SourceParts": etc / "sources.list.d",
                "Dir::State::Lists": lists}  # fmt: skip
    apt = [arg for name, path in settings.items() for arg in ("-o", f"{name}={path}")]
    targets = subprocess.run(
        ["apt-get", *apt, "indextargets", "--no-release-info", "--format", "$(FILENAME) $(RELEASE) $(REPO_URI)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    for line in filter(None, targets):
        index, suite, repo = line.split()
        Path(index).touch()
        release = index[: index.index(f"_dists_{suite}_")] + f"_dists_{suite}_Release"
        origin, label = RELEASES[repo]
        Path(release).write_text(f"Origin: {origin}\nLabel: {label}\nSuite: {suite}\nComponents: main contrib\n")
    return subprocess.run(["bash", str(SCRIPT), *apt], capture_output=True, text=True, timeout=60)


def test_a_deb822_mirror_is_taken_over_a_third_party_repository_listed_before_it(tmp_path):
    found = debian_archive(
        tmp_path,
        "# third party, named after the release\ndeb [signed-by=/usr/share/keyrings/x.gpg] https://apt.example.com/repo"
        " bookworm main\n",
        {"debian.sources": DEB822_MIRROR},
    )
    assert (found.returncode, found.stdout) == (0, "http://mirror.example.org/debian\n"), found.stderr


def test_a_one_line_proxy_in_sources_list_is_taken(tmp_path):
    found = debian_archive(
        tmp_path,
        "deb http://backports.example.org/debian bookworm-backports main\n"
        "deb http://mirror.example.org/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://cache.example.org:3142/debian bookworm main non-free-firmware\n",
    )
    assert (found.returncode, found.stdout) == (0, "http://cache.example.org:3142/debian\n"), found.stderr


def test_a_disabled_entry_is_left_out(tmp_path):
    disabled = DEB822_MIRROR.replace("Types: deb deb-src\n", "Enabled: no\nTypes: deb deb-src\n", 1)
    found = debian_archive(
        tmp_path,
        parts={"debian.sources": disabled, "proxy.list": "deb http://cache.example.org:3142/debian bookworm main\n"},
    )
    assert (found.returncode, found.stdout) == (0, "http://cache.example.org:3142/debian\n"), found.stderr


@pytest.mark.parametrize(
    "sources",
    [
        "deb http://archive.example.net/ubuntu noble main universe\n",  # Ubuntu: its archive is not Debian's
        "deb http://mirror.example.org/debian-security bookworm-security main\n",  # only the security archive
    ],
)
def test_no_debian_archive_prints_nothing_and_fails(tmp_path, sources):
    found = debian_archive(tmp_path, sources)
    assert (found.returncode, found.stdout) == (1, "")
