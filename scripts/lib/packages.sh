# scripts/lib/packages.sh: installing the Debian packages a script needs. Sourced, not run:
# the sourcing script defines `die` and `log`.
#
#   not_installed PKG...   prints those of PKG that dpkg does not have installed
#   apt_install PKG...     installs PKG with apt-get (after an update), or dies naming them

not_installed() {
	local pkg
	for pkg in "$@"; do
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
			printf '%s\n' "$pkg"
	done
}

apt_install() {
	(($#)) || return 0
	command -v apt-get >/dev/null || die "missing $*, and no apt-get to install them"
	log "apt-get install $*"
	apt-get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
		die "apt-get install $* failed"
}
