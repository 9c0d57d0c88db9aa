# Sourced: a private apt configuration (its own sources list for trixie, sid and experimental,
# its own lists and cache under $cache/apt; the host's /etc/apt is only read, for its mirror),
# so packages of newer Debian suites can be downloaded and `dpkg-deb -x`ed without installing
# anything on the host. Used by fetch_rocm.sh (HIP) and python/tools/fetch_auditwheel.sh.
#   cache=DIR; . tests/rocm/private_apt.sh   then   apt-get "${apt_opts[@]}" update / download
private_apt_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mirror=$("$private_apt_here/debian_mirror.sh")
apt_dir=$cache/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
cat >"$apt_dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror experimental main
SRC
apt_opts=(-o APT::Sandbox::User="$(id -un)" -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o Dir::Etc::Preferences=/dev/null
  -o Dir::Etc::PreferencesParts=/dev/null -o APT::Default-Release= -q)
# deb_extract PACKAGE/SUITE DEST: downloads the package into $apt_dir/debs and unpacks it in DEST
deb_extract() {
  local p=${1%/*}
  (cd "$apt_dir/debs" && rm -f "${p}"_*.deb && apt-get "${apt_opts[@]}" download "$1" >&2)
  dpkg-deb -x "$apt_dir/debs/${p}"_*.deb "$2"
  dpkg-deb -f "$apt_dir/debs/${p}"_*.deb Package Version | tr '\n' ' ' >>"$2/.ferry-packages"
  echo >>"$2/.ferry-packages"
}
